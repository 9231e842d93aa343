//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testTimeout bounds every wait in these tests. Ranks that should be
// stopped sleep for an hour.
const testTimeout = 30 * time.Second

// asMainEnv makes the test binary run main() instead of the tests, so that
// the tests can run goccl-run as a process without building it.
const asMainEnv = "GOCCL_RUN_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// gocclRun returns a command that runs goccl-run with args.
func gocclRun(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("these tests run `sh -c` ranks, and sh is not in PATH")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	// A race-enabled goccl-run sleeps a second at exit unless told otherwise.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), asMainEnv+"=1", "GORACE="+gorace)
	return cmd
}

// result runs cmd to completion within testTimeout and returns its exit
// status and outputs.
func result(t *testing.T, cmd *exec.Cmd) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	return wait(t, cmd), stdout.String(), stderr.String()
}

// wait waits within testTimeout for a started cmd and returns its exit
// status.
func wait(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		require.NoError(t, err)
		return 0
	case <-time.After(testTimeout):
		_ = cmd.Process.Kill()
		<-done
		require.FailNow(t, "goccl-run did not exit", "waited %v", testTimeout)
		return -1
	}
}

func TestAllRanksSucceed(t *testing.T) {
	code, stdout, stderr := result(t, gocclRun(t, "-np", "2", "--", "sh", "-c", `echo hi $GOCCL_RANK of $GOCCL_WORLD_SIZE; echo err $GOCCL_RANK >&2`))
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	require.ElementsMatch(t, []string{"[0] hi 0 of 2", "[1] hi 1 of 2"}, strings.Split(strings.TrimSpace(stdout), "\n"))
	require.ElementsMatch(t, []string{"[0] err 0", "[1] err 1"}, strings.Split(strings.TrimSpace(stderr), "\n"))
}

func TestFailingRankSetsExitStatus(t *testing.T) {
	start := time.Now()
	code, _, stderr := result(t, gocclRun(t, "-np", "3", "sh", "-c",
		`if [ "$GOCCL_RANK" = 1 ]; then echo bye >&2; exit 3; fi; exec sleep 3600`))
	require.Equal(t, 3, code)
	require.Contains(t, stderr, "[1] bye\n")
	require.Contains(t, stderr, "goccl-run: rank 1 of 3 (sh) exited with status 3; stopped the other ranks\n")
	require.Less(t, time.Since(start), testTimeout, "the other ranks were not stopped")
}

func TestRankKilledBySignal(t *testing.T) {
	code, _, stderr := result(t, gocclRun(t, "-np", "2", "sh", "-c", `[ "$GOCCL_RANK" = 0 ] && kill -9 $$; exec sleep 3600`))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "goccl-run: rank 0 of 2 (sh) was killed by signal 9")
}

func TestProgramNotFound(t *testing.T) {
	code, _, stderr := result(t, gocclRun(t, "-np", "2", "/nonexistent/goccl-run-test"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "goccl-run: starting rank 0 of 2")
	require.Contains(t, stderr, "/nonexistent/goccl-run-test")
}

func TestSignalStopsRanks(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{
		{syscall.SIGINT, 130},
		{syscall.SIGTERM, 143},
	} {
		t.Run("signal="+tc.sig.String(), func(t *testing.T) {
			cmd := gocclRun(t, "-np", "2", "sh", "-c", `echo ready; exec sleep 3600`)
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())

			// Wait until both ranks run, then signal goccl-run.
			ready := make(chan struct{})
			go func() {
				defer close(ready)
				sc := bufio.NewScanner(out)
				for n := 0; n < 2 && sc.Scan(); {
					if strings.HasSuffix(sc.Text(), "] ready") {
						n++
					}
				}
			}()
			select {
			case <-ready:
			case <-time.After(testTimeout):
				_ = cmd.Process.Kill()
				require.FailNow(t, "ranks did not start", "waited %v", testTimeout)
			}
			require.NoError(t, cmd.Process.Signal(tc.sig))
			require.Equal(t, tc.code, wait(t, cmd), "stderr:\n%s", stderr.String())
			require.Contains(t, stderr.String(), "goccl-run: stopped the 2 ranks: "+tc.sig.String()+" signal received")
		})
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"-h"}, 0, "Examples:\n  goccl-run -np 4 ./train"},
		{"no-args", nil, 2, "-np is 0: expected the number of ranks, at least 1"},
		{"np-zero", []string{"-np", "0", "true"}, 2, "-np is 0"},
		{"np-negative", []string{"-np=-2", "true"}, 2, "-np is -2"},
		{"np-not-number", []string{"-np", "four", "true"}, 2, `invalid value "four" for flag -np`},
		{"no-program", []string{"-np", "2"}, 2, "no program given: expected goccl-run -np 2 PROGRAM [ARGS...]"},
		{"bad-grace", []string{"-np", "2", "-grace", "0s", "true"}, 2, "-grace is 0s: expected a positive duration"},
		{"unknown-flag", []string{"-n", "2", "true"}, 2, "flag provided but not defined: -n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := result(t, gocclRun(t, tc.args...))
			require.Equal(t, tc.code, code)
			require.Contains(t, stderr, tc.want)
		})
	}
}

// TestBuiltBinary builds goccl-run with the go command and runs it once.
func TestBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command; skipped with -short")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not in PATH")
	}
	bin := filepath.Join(t.TempDir(), "goccl-run")
	ctx, cancel := context.WithTimeout(context.Background(), 5*testTimeout)
	defer cancel()
	build := exec.CommandContext(ctx, gobin, "build", "-o", bin, ".")
	buildOut, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", buildOut)

	cmd := exec.Command(bin, "-np", "2", "sh", "-c", `echo hi; exit 3`)
	code, stdout, stderr := result(t, cmd)
	require.Equal(t, 3, code)
	require.Contains(t, stderr, "exited with status 3")
	// The first rank to fail stops the other, possibly before it printed.
	require.Contains(t, stdout, "] hi\n")
}

// flightJob builds testdata/flightjob, a goccl job that goes wrong on
// purpose, into the test's temporary directory.
func flightJob(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a goccl program; skipped in -short mode")
	}
	job := filepath.Join(t.TempDir(), "flightjob")
	out, err := exec.Command("go", "build", "-o", job, "./testdata/flightjob").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return job
}

// TestFlightRecordersNameTheCulprit runs a real goccl job whose rank 1
// hangs or calls the wrong collective; goccl-run gathers every rank's
// flight recorder and its analysis names rank 1.
func TestFlightRecordersNameTheCulprit(t *testing.T) {
	job := flightJob(t)
	for _, c := range []struct {
		mode, want string
		dumps      int
	}{
		{"hang", "rank(s) [1] never arrived at operation #1 allreduce(float32×1024, sum)", 3},
		// A stopped process writes nothing.
		{"stop", "ranks [0 2] did not finish operation #1 allreduce(float32×1024, sum) and wait on rank 1, which left no flight recorder", 2},
		{"mismatch", "ranks [0 2] called allreduce(float32×1024, sum); ranks [1] called broadcast(float32×1024, root 0)", 3},
	} {
		t.Run(c.mode, func(t *testing.T) {
			dir := t.TempDir()
			code, _, stderr := result(t, gocclRun(t, "-np", "3", "-dump", dir, job, c.mode))
			require.NotEqual(t, 0, code)
			require.Contains(t, stderr, fmt.Sprintf("flight recorders of %d ranks in %s", c.dumps, dir), stderr)
			require.Contains(t, stderr, c.want, stderr)
			code, stdout, _ := result(t, gocclRun(t, "-analyze", dir))
			require.Equal(t, 3, code)
			require.Contains(t, stdout, c.want)
		})
	}
}

// Ctrl-C on a hung job: goccl-run still gathers the recorders and says
// what they show (issue 15).
func TestInterruptedJobIsAnalyzed(t *testing.T) {
	job := flightJob(t)
	dir := t.TempDir()
	cmd := gocclRun(t, "-np", "3", "-dump", dir, job, "hangforever")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	time.Sleep(2 * time.Second) // ranks 0 and 2 wait in the all-reduce
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	code := wait(t, cmd)
	require.Equal(t, 130, code, stderr.String())
	require.Contains(t, stderr.String(), "flight recorders of 3 ranks in "+dir, stderr.String())
	require.Contains(t, stderr.String(), "rank(s) [1] never arrived at operation #1", stderr.String())
}

// -keep-going: a rank dies, the others Shrink and finish (issue 15).
func TestKeepGoingLetsTheSurvivorsShrink(t *testing.T) {
	job := flightJob(t)
	code, stdout, stderr := result(t, gocclRun(t, "-np", "3", "-keep-going", job, "shrink"))
	require.Equal(t, 7, code, stderr)
	require.Contains(t, stderr, "rank 1 of 3")
	for _, r := range []int{0, 2} {
		require.Contains(t, stdout, fmt.Sprintf("rank %d: went on as rank %d of 2 (sum 2)", r, r/2), stdout+stderr)
	}
}
