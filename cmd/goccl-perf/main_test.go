package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/bench"
)

// The test binary doubles as goccl-perf (and as its ranks, which -np
// starts from os.Executable) when this variable is set.
const asMainEnv = "GOCCL_PERF_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// perf runs goccl-perf with args and returns its stdout, stderr and exit
// status.
func perf(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	require.NoError(t, cmd.Start())
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("goccl-perf %v did not finish in 3 minutes\nstdout:\n%s\nstderr:\n%s", args, &out, &errb)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// rows returns the table rows of out, each split on blanks.
func rows(out string) [][]string {
	var rs [][]string
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		rs = append(rs, strings.Fields(l))
	}
	return rs
}

// TestEveryTypeAndOperatorOnThreeRanks is the acceptance run:
// three rank processes, every type and operator, every result checked.
func TestEveryTypeAndOperatorOnThreeRanks(t *testing.T) {
	out, errs, code := perf(t, "-np", "3", "-b", "8", "-e", "4M", "-f", "16", "-d", "all", "-o", "all", "-c", "1")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	rs := rows(out)
	// 12 types × 5 operators × 5 sizes (8 B ... 512 KiB).
	require.Len(t, rs, 300, out)
	for _, f := range rs {
		require.Len(t, f, 13, "row %v", f)
		require.Equal(t, "0", f[8], "out-of-place #wrong in %v", f)
		require.Equal(t, "0", f[12], "in-place #wrong in %v", f)
	}
	require.Contains(t, out, "# Out of bounds values : 0 OK")
	require.Equal(t, 3, strings.Count(out, "#  Rank "), out)
}

func TestJSONPlotAndOverlay(t *testing.T) {
	dir := t.TempDir()
	js, pngPath := filepath.Join(dir, "run.json"), filepath.Join(dir, "run.png")
	out, errs, code := perf(t, "broadcast", "-np", "2", "-b", "1K", "-e", "1M", "-f", "4", "-r", "all", "-J", js, "--plot", pngPath)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	var rep bench.Report
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, bench.Broadcast, rep.Collective)
	require.Equal(t, 2, rep.NRanks)
	require.Len(t, rep.Rows, 12) // 6 sizes × 2 roots
	require.Len(t, rep.Ranks, 2)
	// Every row carries the plan the tuner chose for its size, as the
	// lines under the table say: from 1 KiB, past the board, the chain
	// ("ring").
	for _, r := range rep.Rows {
		require.Regexp(t, `^ring/[0-9]+ch$`, r.Pick, "%d bytes", r.Bytes)
		require.Regexp(t, fmt.Sprintf(`(?m)^#\s+%d\s+float\s+%s$`, r.Bytes, regexp.QuoteMeta(r.Pick)), out)
	}
	for _, p := range []string{pngPath} {
		f, err := os.Open(p)
		require.NoError(t, err)
		_, err = png.Decode(f)
		f.Close()
		require.NoError(t, err, p)
	}
	// Overlay the JSON with the text table of the same run.
	txt := filepath.Join(dir, "run.txt")
	require.NoError(t, os.WriteFile(txt, []byte(out), 0o644))
	cmp := filepath.Join(dir, "cmp.png")
	pout, perrs, code := perf(t, "plot", js, txt, "-o", cmp) // flags after the files, as the README shows
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", pout, perrs)
	f, err := os.Open(cmp)
	require.NoError(t, err)
	defer f.Close()
	_, err = png.Decode(f)
	require.NoError(t, err)
}

func TestTransportAndAlgorithmFlags(t *testing.T) {
	out, errs, code := perf(t, "-np", "2", "-b", "8", "-e", "64K", "-f", "64", "--transport", "tcp", "--algo", "ring", "--channels", "2", "--chunk", "16K", "-z", "0", "-a", "3", "-T", "60")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Contains(t, out, "transport tcp")
	require.Contains(t, out, "forced: transport tcp algo ring channels 2 chunk 16384")
	require.Contains(t, out, "blocking: 0 aggregation: max")
	require.Len(t, rows(out), 3)
	// Under the table, the plan of each size: the forced algorithm on
	// the forced channels.
	require.Contains(t, out, "# Algorithm per size")
	require.Regexp(t, `(?m)^#\s+8\s+float\s+ring/2ch$`, out)
	require.Regexp(t, `(?m)^#\s+32768\s+float\s+ring/2ch$`, out)
}

// TestSharedBuffers: -R 1 runs every collective on collective.MemAlloc
// buffers, which the ranks map over shared memory, and -R 2 on Go buffers
// registered with collective.Register, with every result checked, and
// says so in the header.
func TestSharedBuffers(t *testing.T) {
	for _, c := range []struct{ coll, r, says string }{
		{"all_gather", "1", "collective.MemAlloc"},
		{"broadcast", "1", "collective.MemAlloc"},
		{"all_reduce", "1", "collective.MemAlloc"},
		{"all_gather", "2", "Go memory registered with collective.Register"},
		{"reduce", "2", "Go memory registered with collective.Register"},
	} {
		coll := c.coll
		out, errs, code := perf(t, coll, "-np", "3", "--transport", "shm", "-R", c.r, "-b", "3K", "-e", "3M", "-f", "32", "-c", "1", "-T", "60")
		require.Equal(t, 0, code, "%s: stdout:\n%s\nstderr:\n%s", coll, out, errs)
		require.Contains(t, out, "# buffers: "+c.says, coll)
		rs := rows(out)
		require.Len(t, rs, 3, "%s: 3 KiB, 96 KiB, 3 MiB:\n%s", coll, out)
		for _, f := range rs {
			require.Equal(t, "0", f[len(f)-1], "%s: #wrong in %v", coll, f)
		}
	}
}

func TestBadArgumentsSayWhatIsWrong(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "2", "-d", "quad"}, `unknown data type "quad"`},
		{[]string{"-np", "2", "-o", "xor"}, `unknown reduction "xor"`},
		{[]string{"gather", "-np", "2"}, `unknown collective "gather"`},
		{[]string{"-np", "2", "-b", "1Q"}, "-b"},
		{[]string{"-np", "2", "-z", "7"}, "-z 7"},
		{[]string{"-np", "2", "--transport", "carrier-pigeon"}, "carrier-pigeon"},
		{[]string{"plot"}, "usage: goccl-perf plot"},
		{[]string{"-np", "2", "-R", "3"}, "-R 3: want 0, 1 or 2"},
		{[]string{"-np", "2", "-R", "1", "--device", "gpu"}, "-R 1 shares host buffers"},
	} {
		out, errs, code := perf(t, c.args...)
		require.NotEqual(t, 0, code, "%v: stdout:\n%s", c.args, out)
		require.Contains(t, errs, c.want, "%v", c.args)
	}
}

func TestDeviceGPUWithoutCUDASaysSo(t *testing.T) {
	for _, args := range [][]string{{"-np", "2", "-local", "--device", "gpu"}, {"-np", "2", "--device", "gpu"}} {
		cmd := exec.Command(os.Args[0], args...)
		// A library path that cannot load, wherever the test runs.
		cmd.Env = append(os.Environ(), asMainEnv+"=1", "GOCCL_CUDA_LIBRARY="+filepath.Join(t.TempDir(), "libcuda.so.1"))
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		require.Error(t, err, "%v", args)
		require.Contains(t, stderr.String(), "--device gpu: cuda:", "%v", args)
		require.Contains(t, stderr.String(), "libcuda.so.1", "%v", args)
		require.Empty(t, stdout.String(), "nothing runs without the GPU")
	}
	_, errs, code := perf(t, "--device", "tpu")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, `--device "tpu": want host or gpu`)
}
