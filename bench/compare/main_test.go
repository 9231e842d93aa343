package main

import (
	"testing"

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
	require.Equal(t, "256 MiB", sizeName(256<<20))
	require.Equal(t, "8 B", sizeName(8))
	require.Equal(t, []string{"a", "b"}, split(" a, ,b "))
}
