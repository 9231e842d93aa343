package collective_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/flight"
)

func TestDebugDumpRecordsOperations(t *testing.T) {
	comms := newGroup(t, 2)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		buf := make([]float32, 1000)
		for i := 0; i < 3; i++ {
			if err := collective.AllReduce(context.Background(), c, buf, buf, collective.Max); err != nil {
				return err
			}
		}
		return collective.Broadcast(context.Background(), c, buf[:10], buf[:10], 1)
	})
	noErrors(t, errs)
	var b bytes.Buffer
	require.NoError(t, comms[0].DebugDump(&b))
	var d flight.Dump
	require.NoError(t, json.Unmarshal(b.Bytes(), &d))
	require.Equal(t, 0, d.Rank)
	require.Equal(t, 2, d.Size)
	require.Len(t, d.Ops, 4)
	for i, e := range d.Ops[:3] {
		require.Equal(t, uint64(i), e.Seq)
		require.Equal(t, "allreduce(float32×1000, max)", e.What())
		require.Equal(t, flight.Done, e.State)
		require.Equal(t, int64(4000), e.Bytes)
		require.NotEmpty(t, e.Algo)
		require.GreaterOrEqual(t, e.FinishedUs, e.StartedUs)
		// A blocking operation's end is stamped no later than the next
		// one's issue (finishUnseen).
		require.LessOrEqual(t, e.FinishedUs, d.Ops[i+1].IssuedUs)
	}
	require.Equal(t, "broadcast(float32×10, root 1)", d.Ops[3].What())
	// The last one's, by the dump that looked at it.
	require.Equal(t, flight.Done, d.Ops[3].State)
	require.GreaterOrEqual(t, d.Ops[3].FinishedUs, d.Ops[3].StartedUs)
	require.Positive(t, d.Ops[3].FinishedUs)
}

// TestTimeoutDumpsAndNamesWhereItWaited: rank 1 never joins; rank 0 times
// out, its error says which step and peer it waited on, and the ranks'
// flight recorders land in the dump directory (rank 1's too: the local
// group's diagnosis aborts every rank, as the root's does), from which
// the analyzer names rank 1 as the one that never arrived.
func TestTimeoutDumpsAndNamesWhereItWaited(t *testing.T) {
	dir := t.TempDir()
	comms, _ := newNet(t, 2, collective.WithTimeout(300*time.Millisecond), collective.WithDebugDump(dir))
	buf := make([]float32, 64)
	err := collective.AllReduce(context.Background(), comms[0], buf, buf, collective.Sum)
	require.ErrorIs(t, err, collective.ErrTimeout)
	require.Contains(t, err.Error(), "allreduce#0 (256 bytes in host memory) ran past the 300ms timeout")
	require.Contains(t, err.Error(), "with rank 1")
	require.Contains(t, err.Error(), "the chain of waits ends at rank 1, which has not called allreduce#0")
	// Rank 1's dump is written as it aborts, a moment after rank 0's
	// error.
	var dumps []*flight.Dump
	require.Eventually(t, func() bool {
		dumps, err = flight.ReadDir(dir)
		return err == nil && len(dumps) == 2
	}, 5*time.Second, 10*time.Millisecond)
	for _, d := range dumps {
		require.Equal(t, "timeout", d.Reason, "rank %d", d.Rank)
		if d.Rank == 1 {
			require.Empty(t, d.Ops, "rank 1 issued nothing")
			continue
		}
		require.Len(t, d.Ops, 1)
		require.Equal(t, flight.Running, d.Ops[0].State)
		require.NotEmpty(t, d.Ops[0].Progress)
		require.Equal(t, 1, d.Ops[0].Progress[0].Peer)
	}
	finding := flight.Analyze(dumps)
	require.Equal(t, "missing", finding.Kind)
	require.Equal(t, []int{1}, finding.Ranks)
	t.Log(finding.Summary)
}

// TestMismatchIsNamedFromTheDumps: two ranks call all-reduce, the third a
// broadcast; the operation fails, every rank dumps on the abort, and the
// analyzer names rank 2 and both calls.
func TestMismatchIsNamedFromTheDumps(t *testing.T) {
	dir := t.TempDir()
	comms, _ := newNet(t, 3, collective.WithDebugDump(dir))
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		buf := make([]float32, 256)
		if r == 2 {
			return collective.Broadcast(context.Background(), c, buf, buf, 0)
		}
		return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
	}
	dumps, err := flight.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, dumps, 3)
	f := flight.Analyze(dumps)
	require.Equal(t, "diverge", f.Kind)
	require.Equal(t, []int{2}, f.Ranks)
	require.Contains(t, f.Summary, "ranks [0 1] called allreduce(float32×256, sum)")
	require.Contains(t, f.Summary, "ranks [2] called broadcast(float32×256, root 0)")
}

func TestSIGUSR1Dumps(t *testing.T) {
	dir := t.TempDir()
	comms, _ := newNet(t, 2, collective.WithDebugDump(dir))
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		return c.Barrier(context.Background())
	})
	noErrors(t, errs)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	require.Eventually(t, func() bool {
		d, err := flight.ReadDir(dir)
		return err == nil && len(d) == 2 && d[0].Reason == "signal" && len(d[0].Ops) == 1
	}, 5*time.Second, 10*time.Millisecond)
}

// TestBlockingCallsDoNotAllocate: once the flight recorder is full, a loop
// of blocking calls reuses its Requests (1 rank, so only goccl's own code
// runs).
func TestBlockingCallsDoNotAllocate(t *testing.T) {
	comms := newGroup(t, 1)
	buf := make([]float32, 8)
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		require.NoError(t, collective.AllReduce(ctx, comms[0], buf, buf, collective.Sum))
	}
	n := testing.AllocsPerRun(1000, func() { collective.AllReduce(ctx, comms[0], buf, buf, collective.Sum) })
	require.Zero(t, n, "allocations per blocking all-reduce")
	// The recorder still shows the last operations, in order.
	var b bytes.Buffer
	require.NoError(t, comms[0].DebugDump(&b))
	var d flight.Dump
	require.NoError(t, json.Unmarshal(b.Bytes(), &d))
	require.Len(t, d.Ops, 256)
	for i := 1; i < len(d.Ops); i++ {
		require.Equal(t, d.Ops[i-1].Seq+1, d.Ops[i].Seq)
	}
}

// TestMismatchErrorNamesBothCalls: the slice header (tag signature)
// encodes collective, type, operator, algorithm and channels, so the rank
// that receives a slice of another operation names the sender's call and
// its own.
func TestMismatchErrorNamesBothCalls(t *testing.T) {
	for _, c := range []struct {
		name string
		odd  func(c *collective.Comm, buf []float32) error
		want string
	}{
		{"collective", func(c *collective.Comm, buf []float32) error {
			return collective.Broadcast(context.Background(), c, buf, buf, 0)
		}, "the ranks called different operations: it called "},
		{"operator", func(c *collective.Comm, buf []float32) error {
			return collective.AllReduce(context.Background(), c, buf, buf, collective.Max)
		}, "called allreduce(float32, "},
		{"count", func(c *collective.Comm, buf []float32) error {
			return collective.AllReduce(context.Background(), c, buf[:100], buf[:100], collective.Sum)
		}, "both called allreduce(float32, sum), with a different count, root or slot setting"},
	} {
		t.Run(c.name, func(t *testing.T) {
			comms, _ := newNet(t, 2, collective.WithAlgorithm(algorithms.Ring))
			errs := runRanks(t, comms, func(r int, cm *collective.Comm) error {
				buf := make([]float32, 1000)
				if r == 1 {
					return c.odd(cm, buf)
				}
				return collective.AllReduce(context.Background(), cm, buf, buf, collective.Sum)
			})
			found := false
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				found = found || bytes.Contains([]byte(err.Error()), []byte(c.want))
				t.Logf("rank %d: %v", r, err)
			}
			require.True(t, found, "no rank's error says %q", c.want)
		})
	}
}
