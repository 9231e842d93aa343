package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/bench"
	"github.com/goccl/goccl/collective"
)

// synthetic returns the points a machine that behaves exactly as model m
// would give, for every algorithm the tuner weighs, 2-4 ranks, 64 B-16
// MiB, on transport tr (one channel each), up to maxBytes.
func synthetic(tr string, m algorithms.LinkModel, maxBytes int64) []point {
	var pts []point
	for np := 2; np <= 4; np++ {
		for c, algos := range weighed {
			for _, a := range algos {
				for b := int64(64); b <= maxBytes; b *= 4 {
					p := point{transport: tr, np: np, coll: c, algo: a, channels: 1, bytes: b, runs: 1}
					if t := predicted(p, m); !math.IsInf(t, 1) {
						p.us = t
						pts = append(pts, p)
					}
				}
			}
		}
	}
	return pts
}

// TestFitRecoversAModel: times made by a model other than the code's are
// fitted back to that model's four numbers, starting from the code's.
func TestFitRecoversAModel(t *testing.T) {
	for _, tr := range []string{collective.TransportShm, collective.TransportTCP} {
		cur, ok := collective.TunerLink(tr, false)
		require.True(t, ok)
		truth := params{latency: cur.Latency * 2.5, bandwidth: cur.Bandwidth / 2, reduceRate: cur.ReduceRate * 3, postCost: 0.4}.apply(cur)
		pts := synthetic(tr, truth, 16<<20)
		require.NotEmpty(t, pts)
		require.Greater(t, logError(pts, cur), 0.01, "%s: the code's model should not already predict the truth", tr)
		got, err := fitModel(pts, cur)
		require.NoError(t, err)
		want, have := paramsOf(truth), paramsOf(got)
		for _, f := range [][3]any{{"latency", want.latency, have.latency}, {"bandwidth", want.bandwidth, have.bandwidth},
			{"reduce rate", want.reduceRate, have.reduceRate}, {"post cost", want.postCost, have.postCost}} {
			require.InEpsilon(t, f[1], f[2], 0.02, "%s: %s", tr, f[0])
		}
		require.Less(t, logError(pts, got), 1e-6, tr)
	}
}

// TestFitPicksFindsTheCrossovers: on times made by a model whose hops
// cost 8 times the code's, the code's model picks a slower algorithm
// somewhere, and the picks fitted pick the fastest everywhere.
func TestFitPicksFindsTheCrossovers(t *testing.T) {
	cur, _ := collective.TunerLink(collective.TransportShm, false)
	truth := cur
	truth.Latency *= 8
	// Up to 4 MiB: one channel at every size (ChannelBytes), as the
	// points are.
	qs := questions(synthetic(collective.TransportShm, truth, 4<<20), cur)
	require.Greater(t, scoreOf(qs, cur).geo, 1.01)
	got := fitPicks(qs, cur, [4]bool{true, true, true, true})
	s := scoreOf(qs, got)
	require.InDelta(t, 1, s.geo, 1e-9, "fitted %+v", paramsOf(got))
	require.Equal(t, s.of, s.within)
}

// TestPicksAreScoredAgainstTheFastest: the score counts a pick within 10%
// of the fastest algorithm the model weighs, leaves out what the board
// serves and collectives with one algorithm, and rates a pick by its
// time over the fastest's.
func TestPicksAreScoredAgainstTheFastest(t *testing.T) {
	m, _ := collective.TunerLink(collective.TransportTCP, false)
	at := func(bytes int64) algorithms.Algorithm {
		return algorithms.Tune(problem(point{np: 2, coll: bench.AllReduce, bytes: bytes}, m), algorithms.AlgoAuto, 0, 0).Algo
	}
	const big = 16 << 20
	pick := at(big)
	var pts []point
	for _, a := range weighed[bench.AllReduce] {
		// The pick is 1.5 times slower than the fastest at 16 MiB, and
		// the fastest at 1 KiB.
		us := 100.0
		if a == pick {
			us = 150
		}
		pts = append(pts, point{transport: "tcp", np: 2, coll: bench.AllReduce, algo: a, channels: 1, bytes: big, us: us})
		us = 10
		if a != at(1024) {
			us = 20
		}
		pts = append(pts, point{transport: "tcp", np: 2, coll: bench.AllReduce, algo: a, channels: 1, bytes: 1024, us: us})
	}
	pts = append(pts, point{transport: "tcp", np: 2, coll: bench.Broadcast, algo: algorithms.Ring, channels: 1, bytes: 1024, us: 5})
	qs := questions(pts, m)
	require.Len(t, qs, 3)
	s := scoreOf(qs, m)
	require.Equal(t, 2, s.of, "the broadcast has no choice to score")
	require.Equal(t, 1, s.within)
	require.InDelta(t, math.Sqrt(1.5), s.geo, 1e-9)

	require.True(t, onBoard("shm", 4, bench.AllReduce, 240))
	require.False(t, onBoard("shm", 4, bench.AllReduce, 256))
	require.True(t, onBoard("shm", 4, bench.AllGather, 960), "an all-gather posts its block")
	require.False(t, onBoard("tcp", 4, bench.AllReduce, 8))
}

func TestRunNames(t *testing.T) {
	tr, np, al, err := parseName("shm_np3_all_reduce_recdoubling_2.json")
	require.NoError(t, err)
	require.Equal(t, "shm", tr)
	require.Equal(t, 3, np)
	require.Equal(t, algorithms.RecDoubling, al)
	_, _, _, err = parseName("notes.json")
	require.Error(t, err)
	require.Equal(t, 2, channelsOf("ring/2ch"))
	require.Equal(t, 1, channelsOf("board"))
}

// TestMeasureAndFit runs the whole tool on one small sweep: goccl-perf
// built, each all-reduce algorithm forced over shared memory, the report
// with both models.
func TestMeasureAndFit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs goccl-perf (-short)")
	}
	dir := t.TempDir()
	var out bytes.Buffer
	err := run([]string{"-transports", "shm", "-np", "2", "-cpus", "2", "-colls", "all_reduce", "-b", "1K", "-e", "64K", "-f", "8",
		"-reps", "1", "-T", "0.02", "-out", dir, "-run-timeout", (2 * time.Minute).String()}, &out)
	require.NoError(t, err, out.String())
	files, _ := filepath.Glob(filepath.Join(dir, "shm_np2_all_reduce_*_0.json"))
	require.Len(t, files, len(weighed[bench.AllReduce]))
	s := out.String()
	require.Contains(t, s, "## shm, a CPU per rank: 15 medians")
	require.Regexp(t, `(?m)^code\s+[0-9.]+\s+[0-9.]+`, s)
	require.Regexp(t, `(?m)^times\s+`, s)
	require.Regexp(t, `(?m)^picks\s+`, s)
	require.Regexp(t, `(?m)^\s+64 KiB(\s+[0-9.]+\*?){5}\s+\w+ [0-9.]+\s+\w+ [0-9.]+\s*$`, s)
	_, err = os.Stat(filepath.Join(dir, "runs.log"))
	require.NoError(t, err)
	// Measuring into it again would mix the runs: refused before any run.
	err = run([]string{"-transports", "shm", "-np", "2", "-colls", "all_reduce", "-out", dir}, &out)
	require.ErrorContains(t, err, "already holds 5 runs")
	require.ErrorContains(t, run([]string{"-vary", "hops", "-from", dir}, &out), `-vary "hops"`)
}
