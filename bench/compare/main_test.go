package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/bench"
)

func TestMedianRowsRecomputesBandwidthFromTheMedianTime(t *testing.T) {
	s := setting{np: 2, transport: "shm", coll: bench.AllReduce}
	row := func(size int64, us float64) bench.Row {
		return bench.Row{Bytes: size, OutOfPlace: bench.Measure{TimeUs: us, BusBW: 123}}
	}
	runs := [][]bench.Row{
		{row(8, 0.9), row(1<<20, 300)},
		{row(8, 0.5), row(1<<20, 100)},
		{row(8, 0.7), row(1<<20, 200)},
	}
	m := medianRows(runs, s)
	require.Len(t, m, 2)
	require.Equal(t, int64(8), m[0].Bytes)
	require.InDelta(t, 0.7, m[0].OutOfPlace.TimeUs, 1e-12)
	require.InDelta(t, 8/0.7/1e3, m[0].OutOfPlace.BusBW, 1e-12) // factor 1 for 2 ranks
	require.InDelta(t, 200, m[1].OutOfPlace.TimeUs, 1e-12)
	// An even count takes the mean of the middle two.
	m = medianRows(runs[:2], s)
	require.InDelta(t, 0.7, m[0].OutOfPlace.TimeUs, 1e-12)
	// 4 ranks: nccl-tests' factor 2(n-1)/n.
	s.np = 4
	m = medianRows(runs[:1], s)
	require.InDelta(t, float64(1<<20)/300/1e3*1.5, m[1].OutOfPlace.BusBW, 1e-12)
}

func TestNearestMatchesRoundedSizes(t *testing.T) {
	rows := []bench.Row{{Bytes: 8}, {Bytes: 1048572}, {Bytes: 64 << 20}}
	r, ok := nearest(rows, 1<<20)
	require.True(t, ok)
	require.Equal(t, int64(1048572), r.Bytes)
	_, ok = nearest(rows, 2<<20)
	require.False(t, ok)
	require.Equal(t, "256 MiB", bench.SizeName(256<<20))
	require.Equal(t, "8 B", bench.SizeName(8))
	require.Equal(t, []string{"a", "b"}, bench.SplitList(" a, ,b "))
}

// The verdict marks where goccl is behind the fastest peer and counts
// where it is ahead.
func TestVerdict(t *testing.T) {
	var b strings.Builder
	s := setting{coll: bench.AllReduce, np: 2, transport: "tcp"}
	printVerdict(&b, []verdictRow{
		{s: s, bytes: 8, ratio: 1.2, peer: "mpich", gUs: 6, peerUs: 5, gRange: [2]float64{5.5, 7}, peerRange: [2]float64{4, 5.2}},
		{s: s, bytes: 64 << 10, ratio: 1.1, peer: "ompi", gUs: 33, peerUs: 30, gRange: [2]float64{11, 40}, peerRange: [2]float64{28, 31}},
		{s: s, bytes: 64 << 20, ratio: 0.4, peer: "ompi", gUs: 20000, peerUs: 50000, gRange: [2]float64{19000, 21000}, peerRange: [2]float64{48000, 52000}},
	})
	out := b.String()
	require.Contains(t, out, "goccl ahead of every peer at 1 of 3 settings and sizes; behind in every run at 1")
	require.Regexp(t, `8 B +1\.20 .* mpich +apart +<- behind`, out)
	require.Regexp(t, `64 KiB +1\.10 .* ompi +overlap +<- behind`, out)
	row64M := out[strings.Index(out, "64 MiB"):]
	require.NotContains(t, row64M[:strings.Index(row64M, "\n")], "behind")
	require.Regexp(t, `64 MiB +0\.40 .* ompi +apart`, out)
	// A size no peer measured (its runs failed) is said, not counted.
	b.Reset()
	printVerdict(&b, []verdictRow{
		{s: s, bytes: 8, ratio: 0.5, peer: "ompi", gUs: 5, peerUs: 10},
		{s: s, bytes: 1 << 20, gUs: 80},
	})
	out = b.String()
	require.Contains(t, out, "goccl ahead of every peer at 1 of 1 settings and sizes")
	require.Regexp(t, `1 MiB +- +80\.00 +- +no peer result`, out)
	require.Contains(t, out, "no peer result at 1: all_reduce, 2 ranks, tcp 1 MiB")
	runs := [][]bench.Row{{{Bytes: 8, OutOfPlace: bench.Measure{TimeUs: 3}}}, {{Bytes: 8, OutOfPlace: bench.Measure{TimeUs: 1}}, {Bytes: 16}}, {{Bytes: 8, OutOfPlace: bench.Measure{TimeUs: 2}}}}
	require.Equal(t, [2]float64{1, 3}, spread(runs, 8))
}

// goccl's broadcast is compared in place, as MPI_Bcast and Gloo's
// broadcast run; every other collective out of place, as the peers do.
func TestBroadcastIsComparedInPlace(t *testing.T) {
	require.Nil(t, placement(bench.Broadcast), "both placements measured")
	require.Equal(t, []string{"-out-of-place-only"}, placement(bench.AllGather))
	rows := []bench.Row{{Bytes: 8, OutOfPlace: bench.Measure{TimeUs: 2}, InPlace: &bench.Measure{TimeUs: 1}}}
	got, err := comparable(bench.Broadcast, rows)
	require.NoError(t, err)
	require.Equal(t, 1.0, got[0].OutOfPlace.TimeUs)
	require.Nil(t, got[0].InPlace)
	rows = []bench.Row{{Bytes: 8, OutOfPlace: bench.Measure{TimeUs: 2}}}
	got, err = comparable(bench.AllReduce, rows)
	require.NoError(t, err)
	require.Equal(t, 2.0, got[0].OutOfPlace.TimeUs)
	_, err = comparable(bench.Broadcast, rows)
	require.ErrorContains(t, err, "no in-place broadcast at 8 bytes")
}

// A run past -run-timeout is killed with its children (a launcher's
// ranks) and reported, not waited for.
func TestRunToolKillsAHungRunAndItsRanks(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	_, err := runTool(context.Background(), io.Discard, []string{"sh", "-c", "sleep 60 & echo $! > " + pidFile + "; wait"}, nil, 300*time.Millisecond)
	require.ErrorContains(t, err, "killed after -run-timeout 300ms")
	require.Less(t, time.Since(start), 10*time.Second)
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return dead(pid) }, 5*time.Second, 20*time.Millisecond, "the child sleep %d outlived its run", pid)
}

// dead: no such process, or a zombie (killed; whether it is reaped is up
// to the machine's init).
func dead(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// Below one float per rank a reduce-scatter or all-gather has no cell:
// it is skipped, saying why, instead of failing in every tool.
func TestTinyGatheringSizesAreSkipped(t *testing.T) {
	one := func(sz string) []string { return []string{"-b", sz, "-e", sz, "-f", "2"} }
	require.Equal(t, "8 bytes is less than one float per rank for 4 ranks", noCell(setting{np: 4, coll: bench.ReduceScatter}, one("8")))
	require.NotEmpty(t, noCell(setting{np: 4, coll: bench.AllGather}, one("8")))
	require.Empty(t, noCell(setting{np: 2, coll: bench.AllGather}, one("8")))
	require.Empty(t, noCell(setting{np: 4, coll: bench.AllGather}, one("16")))
	require.Empty(t, noCell(setting{np: 4, coll: bench.AllReduce}, one("8")))
	require.Empty(t, noCell(setting{np: 4, coll: bench.AllGather}, []string{"-b", "8", "-e", "1M", "-f", "8"}), "a range keeps its larger sizes")
}

// A peer whose run was killed at -run-timeout is left out of that
// setting from that size up, and nowhere else.
func TestTimedOutPeersAreLeftOutOfLargerSizes(t *testing.T) {
	one := func(sz string) []string { return []string{"-b", sz, "-e", sz, "-f", "2"} }
	require.EqualValues(t, 64<<10, sweepFrom(one("64K")))
	require.EqualValues(t, 8, sweepFrom([]string{"-b", "8", "-e", "64M", "-f", "2"}))
	require.Zero(t, sweepFrom(nil))

	tcp4 := setting{np: 4, transport: "tcp", coll: bench.AllReduce}
	shm4 := setting{np: 4, transport: "shm", coll: bench.AllReduce}
	g := giveUps{}
	require.False(t, g.skip(tcp4, "mpich", 8))
	g.note(tcp4, "mpich", 64<<10)
	require.False(t, g.skip(tcp4, "mpich", 8), "smaller sizes still run")
	require.True(t, g.skip(tcp4, "mpich", 64<<10))
	require.True(t, g.skip(tcp4, "mpich", 64<<20), "and larger ones are left out")
	require.False(t, g.skip(tcp4, "ompi", 64<<20), "other peers run")
	require.False(t, g.skip(shm4, "mpich", 64<<20), "other settings run")
	g.note(tcp4, "mpich", 16<<20)
	require.True(t, g.skip(tcp4, "mpich", 64<<10), "a later, larger time-out keeps the smallest")
	g.note(tcp4, "mpich", 8)
	require.True(t, g.skip(tcp4, "mpich", 8))
}
