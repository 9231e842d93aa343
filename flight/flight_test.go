package flight

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func ar(seq uint64, count int, state string) Entry {
	return Entry{Seq: seq, Op: "allreduce", Type: "float32", Count: count, Root: -1, RedOp: "sum", State: state}
}

func TestAnalyzeFindsDivergence(t *testing.T) {
	dumps := []*Dump{
		{Rank: 0, Ops: []Entry{ar(0, 4, Done), ar(1, 8, Running)}},
		{Rank: 1, Ops: []Entry{ar(0, 4, Done), ar(1, 8, Running)}},
		{Rank: 2, Ops: []Entry{ar(0, 4, Done), {Seq: 1, Op: "broadcast", Type: "float32", Count: 8, Root: 0, State: Running}}},
	}
	f := Analyze(dumps)
	require.Equal(t, "diverge", f.Kind)
	require.Equal(t, uint64(1), f.Seq)
	require.Equal(t, []int{2}, f.Ranks)
	require.Contains(t, f.Summary, "ranks [0 1] called allreduce(float32×8, sum)")
	require.Contains(t, f.Summary, "ranks [2] called broadcast(float32×8, root 0)")
}

func TestAnalyzeFindsTheRankThatNeverArrived(t *testing.T) {
	dumps := []*Dump{
		{Rank: 0, Ops: []Entry{ar(0, 4, Done), ar(1, 4, Done), ar(2, 4, Running)}},
		{Rank: 1, Ops: []Entry{ar(0, 4, Done), ar(1, 4, Done)}},
		{Rank: 2, Ops: []Entry{ar(0, 4, Done), ar(1, 4, Done), ar(2, 4, Running)}},
	}
	f := Analyze(dumps)
	require.Equal(t, "missing", f.Kind)
	require.Equal(t, uint64(2), f.Seq)
	require.Equal(t, []int{1}, f.Ranks)
	require.Contains(t, f.Summary, "rank 1's last was #1")
}

func TestAnalyzeStuckAndClean(t *testing.T) {
	f := Analyze([]*Dump{{Rank: 0, Ops: []Entry{ar(0, 4, Running)}}, {Rank: 1, Ops: []Entry{ar(0, 4, Done)}}})
	require.Equal(t, "stuck", f.Kind)
	require.Equal(t, []int{0}, f.Ranks)
	f = Analyze([]*Dump{{Rank: 0, Ops: []Entry{ar(0, 4, Done)}}, {Rank: 1, Ops: []Entry{ar(0, 4, Done)}}})
	require.Equal(t, "none", f.Kind)
	require.Equal(t, "none", Analyze(nil).Kind)
}

func TestFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	d := &Dump{Rank: 3, Size: 4, PID: 77, Reason: "request", Ops: []Entry{ar(5, 4, Done)}}
	p, err := d.WriteFile(dir)
	require.NoError(t, err)
	require.Contains(t, p, "goccl-flight-rank3-pid77.json")
	got, err := ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, d, got[0])
}
