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

// Ranks that placed one operation's buffers differently (host memory on
// one, device memory on the others) diverge: the dumps say which.
func TestAnalyzeFindsMisplacedBuffers(t *testing.T) {
	dev := ar(1, 8, Running)
	dev.Device = true
	dumps := []*Dump{
		{Rank: 0, Ops: []Entry{ar(0, 4, Done), ar(1, 8, Running)}},
		{Rank: 1, Ops: []Entry{ar(0, 4, Done), dev}},
		{Rank: 2, Ops: []Entry{ar(0, 4, Done), dev}},
	}
	f := Analyze(dumps)
	require.Equal(t, "diverge", f.Kind)
	require.Equal(t, uint64(1), f.Seq)
	require.Equal(t, []int{0}, f.Ranks)
	require.Contains(t, f.Summary, "ranks [1 2] called allreduce(float32×8, sum, device memory)")
	require.Contains(t, f.Summary, "ranks [0] called allreduce(float32×8, sum)")
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

// running is an entry running at seq whose channel 0 waits on peer.
func running(seq uint64, peer int) Entry {
	e := ar(seq, 4, Running)
	e.Progress = []Progress{{Channel: 0, Step: 1, Kind: "recvReduceSend", Peer: peer}}
	return e
}

func TestAnalyzeFollowsTheChainOfWaits(t *testing.T) {
	// A 4-rank ring where rank 3 never called #1: 0 waits on 3, 1 on 0,
	// 2 on 1.
	dumps := []*Dump{
		{Rank: 0, Size: 4, Ops: []Entry{ar(0, 4, Done), running(1, 3)}},
		{Rank: 1, Size: 4, Ops: []Entry{ar(0, 4, Done), running(1, 0)}},
		{Rank: 2, Size: 4, Ops: []Entry{ar(0, 4, Done), running(1, 1)}},
		{Rank: 3, Size: 4, Ops: []Entry{ar(0, 4, Done)}},
	}
	f := Analyze(dumps)
	require.Equal(t, "missing", f.Kind)
	require.Equal(t, []int{3}, f.Ranks)
	require.Equal(t, []int{2, 1, 0, 3}, f.Chain)
	require.Contains(t, f.Summary, "the chain of waits: 2 → 1 → 0 → 3")

	// Rank 1 was stopped: it wrote nothing, and the others wait on it,
	// one of them through a finished channel's neighbour.
	dumps = []*Dump{
		{Rank: 0, Size: 3, Ops: []Entry{ar(0, 4, Done), running(1, 2)}},
		{Rank: 2, Size: 3, Ops: []Entry{ar(0, 4, Done), running(1, 1)}},
	}
	dumps[0].Ops[1].Progress = append([]Progress{{Channel: 0, Step: -1, Peer: -1, Done: true}}, Progress{Channel: 1, Step: 2, Peer: 2})
	f = Analyze(dumps)
	require.Equal(t, "silent", f.Kind)
	require.Equal(t, []int{1}, f.Ranks)
	require.Equal(t, []int{0, 2, 1}, f.Chain)
	require.Contains(t, f.Summary, "wait on rank 1, which left no flight recorder")

	// Rank 2 was stopped in #1, which rank 3 is still running, waiting
	// on it, while ranks 0 and 1 have gone on to #2: rank 3 is not the
	// cause for never arriving at #2; rank 2, which wrote nothing, is.
	dumps = []*Dump{
		{Rank: 0, Size: 4, Ops: []Entry{ar(0, 4, Done), ar(1, 4, Done), running(2, 3)}},
		{Rank: 1, Size: 4, Ops: []Entry{ar(0, 4, Done), ar(1, 4, Done), running(2, 0)}},
		{Rank: 3, Size: 4, Ops: []Entry{ar(0, 4, Done), running(1, 2)}},
	}
	f = Analyze(dumps)
	require.Equal(t, "silent", f.Kind, f.Summary)
	require.Equal(t, []int{2}, f.Ranks)
	require.Equal(t, []int{1, 0, 3, 2}, f.Chain)
	require.Contains(t, f.Summary, "rank(s) [3] never arrived at operation #2")
	require.Contains(t, f.Summary, "rank 3's last was #1 allreduce(float32×4, sum) (running)")
	require.Contains(t, f.Summary, "wait on rank 2, which left no flight recorder")

	// A cycle: each waits on the other.
	f = Analyze([]*Dump{{Rank: 0, Size: 2, Ops: []Entry{running(0, 1)}}, {Rank: 1, Size: 2, Ops: []Entry{running(0, 0)}}})
	require.Equal(t, "stuck", f.Kind)
	require.Contains(t, f.Summary, "in a cycle: 0 → 1 → 0")
}

// A send/recv deadlock: both ranks send first, with messages too large to
// be buffered; the analyzer no longer takes the unfinished sends for
// nothing (issue 15).
func TestAnalyzeSendRecvDeadlock(t *testing.T) {
	send := func(seq uint64, peer int) Entry {
		return Entry{Seq: seq, Op: "send", P2P: "send", Type: "float32", Count: 1 << 20, Root: peer, State: Running}
	}
	f := Analyze([]*Dump{
		{Rank: 0, Ops: []Entry{ar(0, 4, Done), send(1, 1)}},
		{Rank: 1, Ops: []Entry{ar(0, 4, Done), send(1, 0)}},
	})
	require.Equal(t, "p2p", f.Kind)
	require.Contains(t, f.Summary, "rank 0's send #1 to rank 1")
	require.Contains(t, f.Summary, "a send/recv deadlock")
	// Named after what the caller called, still point-to-point.
	e := send(1, 1)
	e.Op = "alltoallv"
	r := Entry{Seq: 1, Op: "alltoallv", P2P: "recv", Type: "float32", Count: 4, Root: 0, State: Done}
	f = Analyze([]*Dump{{Rank: 0, Ops: []Entry{ar(0, 4, Done), e}}, {Rank: 1, Ops: []Entry{ar(0, 4, Done), r}}})
	require.Equal(t, "p2p", f.Kind, "not compared as collectives #1: %s", f.Summary)
	require.Contains(t, f.Summary, "rank 0's alltoallv #1 to rank 1")
}

func TestChain(t *testing.T) {
	next := map[int]int{0: 3, 1: 0, 2: 1, 3: -1}
	c, cyc := Chain(2, func(r int) int { return next[r] })
	require.Equal(t, []int{2, 1, 0, 3}, c)
	require.False(t, cyc)
	next[3] = 1
	c, cyc = Chain(2, func(r int) int { return next[r] })
	require.Equal(t, []int{2, 1, 0, 3, 1}, c)
	require.True(t, cyc)
	require.Equal(t, "2 → 1", Arrows([]int{2, 1}))
	require.Equal(t, []int{1, 0, 3, 1}, Cycle(c), "the tail before the cycle is left out")
	require.Equal(t, []int{2, 1}, Cycle([]int{2, 1}))
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
