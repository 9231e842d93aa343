package collective_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

// In one process the ranks of a local group compare where they wait as
// a root would have them do: an all-reduce that rank 0 calls on host
// memory and rank 1 on device memory fails on both, a second or two into
// the wait, with a MisplacedError (the timeout is a minute).
func TestLocalGroupMisplaced(t *testing.T) {
	comms, drs := devGroup(t, 2, 3, collective.WithTimeout(time.Minute))
	ctx := context.Background()
	start := time.Now()
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		if r == 0 {
			in := make([]float32, 1000)
			return collective.AllReduce(ctx, c, in, in, collective.Sum)
		}
		b, err := drs[r].alloc(4000)
		if err != nil {
			return err
		}
		req, err := collective.AllReduceDevice(ctx, c, b, b, collective.Float32, collective.Sum, drs[r].s)
		if err != nil {
			return err
		}
		return req.Wait(ctx)
	})
	took := time.Since(start)
	t.Logf("after %v", took)
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		var me *collective.MisplacedError
		require.ErrorAs(t, err, &me, "rank %d", r)
		require.Equal(t, []int{0}, me.Host)
		require.Equal(t, []int{1}, me.Device)
		require.ErrorIs(t, err, collective.ErrMismatch)
	}
	require.Less(t, took, 10*time.Second, "found by the watchdog's probes, not the timeout")
}

// A local group's timeout ends in the diagnosis a root would give: rank 2
// never calls the all-reduce, and ranks 0 and 1 fail with a StallError
// naming it as the end of the chain of waits; rank 2, idle, learns from
// its communicator's context.
func TestLocalGroupChainOfWaits(t *testing.T) {
	const timeout = time.Second
	comms := newGroup(t, 3, collective.WithTimeout(timeout), collective.WithAlgorithm(algorithms.Ring))
	ctx := context.Background()
	buf := func() []float32 { return make([]float32, 64<<10) }
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		if r == 2 {
			select {
			case <-c.Context().Done():
				return context.Cause(c.Context())
			case <-time.After(timeout + 10*time.Second):
				return errors.New("not aborted")
			}
		}
		b := buf()
		return collective.AllReduce(ctx, c, b, b, collective.Sum)
	})
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		var se *collective.StallError
		require.ErrorAs(t, err, &se, "rank %d", r)
		require.ErrorIs(t, err, collective.ErrTimeout)
		require.Equal(t, 2, se.End, "rank %d", r)
		require.Contains(t, err.Error(), "which has not called allreduce#0: it has issued no operation yet", "rank %d", r)
	}
}
