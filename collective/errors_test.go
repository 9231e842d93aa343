package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/transport/mem"
)

// prompt is how long ranks may take to report a failure that is not a
// timeout. The operation timeout in these tests is far longer, so passing
// proves the failure propagated rather than timed out.
const prompt = 10 * time.Second

func newNet(t *testing.T, n int, opts ...collective.Option) ([]*collective.Comm, *mem.Network) {
	t.Helper()
	opts = append([]collective.Option{collective.WithEnv(nil), collective.WithTimeout(time.Hour)}, opts...)
	comms, nw, err := collective.NewLocalGroupNet(n, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms, nw
}

func TestBadArgumentsLeaveTheCommunicatorUsable(t *testing.T) {
	ctx := context.Background()
	comms := newGroup(t, 3)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		a := make([]float32, 12)
		b := make([]float32, 12)
		bad := []struct {
			name string
			err  error
			want string
		}{
			{"allreduce lengths", collective.AllReduce(ctx, c, a, b[:5], collective.Sum), "len(send) = 12 but len(recv) = 5"},
			{"allreduce op", collective.AllReduce(ctx, c, a, b, collective.Op(9)), "reduction operator"},
			{"allreduce overlap", collective.AllReduce(ctx, c, a[:8], a[4:], collective.Sum), "overlap"},
			{"reducescatter lengths", collective.ReduceScatter(ctx, c, a, b[:5], collective.Sum), "want Size()*len(recv) = 3*5 = 15"},
			{"reducescatter in place elsewhere", collective.ReduceScatter(ctx, c, a, a[(r+1)%3*4:(r+1)%3*4+4], collective.Sum), "not send[rank*len(recv)"},
			{"allgather lengths", collective.AllGather(ctx, c, a[:5], b), "want Size()*len(send)"},
			{"broadcast root", collective.Broadcast(ctx, c, a, b, 3), "root 3 out of range [0,3)"},
			{"broadcast negative root", collective.Broadcast(ctx, c, a, b, -1), "root -1 out of range"},
			{"reduce root", collective.Reduce(ctx, c, a, b, collective.Sum, 7), "root 7 out of range"},
			{"alltoall lengths", collective.AllToAll(ctx, c, a[:10], b[:10]), "Size()*block"},
			{"alltoall overlap", collective.AllToAll(ctx, c, a, a), "no in-place form"},
			{"send to self", collective.Send(ctx, c, a, r), "is this rank itself"},
			{"send to nobody", collective.Send(ctx, c, a, 3), "peer 3 out of range"},
			{"recv from nobody", collective.Recv(ctx, c, a, -2), "peer -2 out of range"},
			{"nil context", collective.AllReduce(nil, c, a, b, collective.Sum), "nil context"}, //nolint:staticcheck // testing the check
		}
		for _, tc := range bad {
			if !errors.Is(tc.err, collective.ErrInvalidArgument) {
				return fmt.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, tc.err)
			}
			var ae *collective.ArgError
			if !errors.As(tc.err, &ae) || ae.Rank != r || !strings.Contains(tc.err.Error(), tc.want) {
				return fmt.Errorf("%s: error %q does not name rank %d and %q", tc.name, tc.err, r, tc.want)
			}
		}
		// Still usable: a real operation after all that.
		for i := range a {
			a[i] = float32(r)
		}
		if err := collective.AllReduce(ctx, c, a, b, collective.Sum); err != nil {
			return err
		}
		if b[0] != 3 {
			return fmt.Errorf("sum after argument errors = %v, want 3", b[0])
		}
		return nil
	})
	noErrors(t, errs)
}

func TestNilComm(t *testing.T) {
	err := collective.AllReduce(context.Background(), nil, []int32{1}, []int32{1}, collective.Sum)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	require.ErrorIs(t, err, collective.ErrNilComm)
	require.ErrorContains(t, err, "nil communicator")
	for _, err := range []error{(*collective.Comm)(nil).Barrier(context.Background()), (*collective.Comm)(nil).Close()} {
		require.ErrorIs(t, err, collective.ErrNilComm)
		require.ErrorIs(t, err, collective.ErrInvalidArgument)
	}
}

func TestOutOfRangeEnumsAreInvalid(t *testing.T) {
	require.False(t, collective.Op(259).Valid(), "no truncation to uint8")
	require.False(t, collective.DataType(256).Valid())
	comms := newGroup(t, 1)
	err := collective.AllReduce(context.Background(), comms[0], []int32{1}, []int32{1}, collective.Op(259))
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
}

func TestAbortReachesOperationsWithCancellableContexts(t *testing.T) {
	for i := 0; i < 20; i++ {
		comms, _ := newNet(t, 2)
		cause := errors.New("operator pressed stop")
		ctx, cancel := context.WithCancel(context.Background())
		buf := make([]float32, 1000)
		req, err := collective.StartAllReduce(ctx, comms[0], buf, buf, collective.Sum) // rank 1 never joins
		require.NoError(t, err)
		comms[0].Abort(cause)
		err = req.Wait(context.Background())
		cancel()
		require.ErrorIs(t, err, collective.ErrAborted)
		require.ErrorIs(t, err, cause)
	}
}

func TestWatchdogDoesNotOutliveClose(t *testing.T) {
	// goleak (TestMain) fails the run if a watchdog goroutine survives.
	for i := 0; i < 50; i++ {
		comms, err := collective.NewLocalGroup(2, collective.WithEnv(nil), collective.WithTimeout(time.Microsecond))
		require.NoError(t, err)
		for _, c := range comms {
			require.NoError(t, c.Close())
		}
	}
}

func TestUseAfterClose(t *testing.T) {
	comms, err := collective.NewLocalGroup(2, collective.WithEnv(nil))
	require.NoError(t, err)
	for _, c := range comms {
		require.NoError(t, c.Close())
		require.NoError(t, c.Close(), "Close is idempotent")
		err := collective.AllReduce(context.Background(), c, []float64{1}, []float64{1}, collective.Sum)
		require.ErrorIs(t, err, collective.ErrClosed)
		require.ErrorIs(t, err, collective.ErrInvalidArgument)
		require.ErrorIs(t, context.Cause(c.Context()), collective.ErrClosed)
	}
}

// assertAllFail checks that every rank failed with an *OpError for op that
// satisfies check.
func assertAllFail(t *testing.T, errs []error, op string, check func(r int, e *collective.OpError)) {
	t.Helper()
	for r, err := range errs {
		var oe *collective.OpError
		require.ErrorAs(t, err, &oe, "rank %d", r)
		require.Equal(t, r, oe.Rank)
		require.Equal(t, op, oe.Op)
		require.Contains(t, err.Error(), fmt.Sprintf("rank %d: %s#", r, op))
		if check != nil {
			check(r, oe)
		}
		t.Logf("rank %d: %v", r, err)
	}
}

func TestContextCancelledMidOperation(t *testing.T) {
	comms, _ := newNet(t, 3)
	start := time.Now()
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		if r == 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
		}
		if r == 2 {
			// Rank 2 is late: it joins after rank 0 has given up.
			time.Sleep(time.Second)
		}
		buf := make([]float32, 1<<20)
		return collective.AllReduce(ctx, c, buf, buf, collective.Sum)
	})
	require.Less(t, time.Since(start), prompt)
	assertAllFail(t, errs, "allreduce", func(r int, e *collective.OpError) {
		if r == 0 {
			require.ErrorIs(t, e, context.DeadlineExceeded)
			require.GreaterOrEqual(t, e.Peer, 0, "rank 0 must say which peer it waited for")
		} else {
			require.Contains(t, e.Error(), "rank 0 aborted", "rank %d must name the rank that gave up", r)
		}
	})
	for _, c := range comms {
		require.Error(t, context.Cause(c.Context()), "every communicator is aborted")
	}
}

func TestPeerAbortMidOperation(t *testing.T) {
	comms, _ := newNet(t, 4)
	cause := errors.New("rank 3 lost its GPU")
	start := time.Now()
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		buf := make([]float64, 1<<20)
		if r == 3 {
			// Join, then abort while the others wait on this rank. (The
			// same operation as the others': a mismatched one could fail
			// with the mismatch before the abort, which then changes
			// nothing.)
			req, err := collective.StartAllReduce(context.Background(), c, buf, buf, collective.Sum)
			if err != nil {
				return err
			}
			c.Abort(cause)
			return req.Wait(context.Background())
		}
		return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
	})
	require.Less(t, time.Since(start), prompt)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		if r != 3 {
			require.ErrorIs(t, err, cause, "rank %d must carry the cause", r)
		}
		t.Logf("rank %d: %v", r, err)
	}
	// Later operations fail at once with the cause.
	err := collective.AllReduce(context.Background(), comms[3], []int8{1}, []int8{1}, collective.Sum)
	require.ErrorIs(t, err, collective.ErrAborted)
	require.ErrorIs(t, err, cause)
	require.ErrorIs(t, context.Cause(comms[3].Context()), cause)
}

func TestKilledPeer(t *testing.T) {
	for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
		t.Run("algo="+a.String(), func(t *testing.T) {
			comms, nw := newNet(t, 4, collective.WithAlgorithm(a), collective.WithSlots(4, 4096))
			var posts atomic.Int64
			nw.SetFault(func(ev mem.Event) error {
				// Rank 2 dies after it has sent 10 slices.
				if ev.Kind == mem.EventPost && ev.From == 2 && posts.Add(1) == 10 {
					nw.Kill(2, nil)
				}
				return nil
			})
			start := time.Now()
			errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
				buf := make([]int32, 1<<16)
				return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
			})
			require.Less(t, time.Since(start), prompt)
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				if r != 2 {
					require.Contains(t, err.Error(), "rank 2", "rank %d must name the dead rank", r)
				}
			}
			t.Logf("rank 0: %v", errs[0])
		})
	}
}

func TestInjectedSendFailureAndDelay(t *testing.T) {
	comms, nw := newNet(t, 3)
	// Delays alone slow things down but keep results exact.
	nw.SetFault(func(ev mem.Event) error {
		if ev.Kind == mem.EventPost && ev.From == 1 {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	check[float32](t, comms, caseSpec{coll: algorithms.CollAllReduce, op: collective.Sum, count: 5000, seed: 9})

	boom := errors.New("injected send failure")
	nw.SetFault(func(ev mem.Event) error {
		if ev.Kind == mem.EventPost && ev.From == 1 && ev.To == 2 {
			return boom
		}
		return nil
	})
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		buf := make([]float32, 5000)
		return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
	})
	require.ErrorIs(t, errs[1], boom)
	var oe *collective.OpError
	require.ErrorAs(t, errs[1], &oe)
	require.Equal(t, 2, oe.Peer)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
	}
}

func TestRankThatNeverJoinsTimesOut(t *testing.T) {
	comms, _ := newNet(t, 3, collective.WithTimeout(300*time.Millisecond))
	errs := runRanks(t, comms[:2], func(r int, c *collective.Comm) error {
		buf := make([]uint64, 64)
		return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, collective.ErrTimeout, "rank %d", r)
		require.Contains(t, err.Error(), "timeout")
		var oe *collective.OpError
		require.ErrorAs(t, err, &oe)
		t.Logf("rank %d: %v", r, err)
	}
	// At least one of them was waiting for rank 2 itself.
	var waited []int
	for _, err := range errs {
		var oe *collective.OpError
		errors.As(err, &oe)
		waited = append(waited, oe.Peer)
	}
	require.Contains(t, waited, 2)
}

func TestMismatchedOperationsFailInsteadOfMixingData(t *testing.T) {
	for name, f := range map[string]func(r int, c *collective.Comm) error{
		"count": func(r int, c *collective.Comm) error {
			buf := make([]float32, 1000+1000*r)
			return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
		},
		"operator": func(r int, c *collective.Comm) error {
			buf := make([]float32, 500)
			return collective.AllReduce(context.Background(), c, buf, buf, []collective.Op{collective.Sum, collective.Max}[r])
		},
		"root": func(r int, c *collective.Comm) error {
			// Each rank thinks it is the root: nobody receives, so nothing
			// can be checked in this operation; the data left in the
			// connections makes the next operation fail instead of being
			// taken for its own.
			buf := make([]int32, 500)
			if err := collective.Broadcast(context.Background(), c, buf, buf, r); err != nil {
				return err
			}
			return c.Barrier(context.Background())
		},
		"same size, other type": func(r int, c *collective.Comm) error {
			if r == 0 {
				buf := make([]int32, 4)
				return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
			}
			buf := make([]float32, 4)
			return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
		},
		"type": func(r int, c *collective.Comm) error {
			if r == 0 {
				buf := make([]float64, 500)
				return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
			}
			buf := make([]float32, 500)
			return collective.AllReduce(context.Background(), c, buf, buf, collective.Sum)
		},
	} {
		t.Run(name, func(t *testing.T) {
			comms, _ := newNet(t, 2, collective.WithAlgorithm(algorithms.Ring))
			start := time.Now()
			errs := runRanks(t, comms, f)
			require.Less(t, time.Since(start), prompt)
			mismatch := false
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				mismatch = mismatch || errors.Is(err, collective.ErrMismatch)
				t.Logf("rank %d: %v", r, err)
			}
			require.True(t, mismatch, "some rank must report the mismatch")
		})
	}
}

func TestCloseWaitsForPendingOperations(t *testing.T) {
	comms := newGroup(t, 2)
	done := make([]bool, 2)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		buf := make([]float32, 1<<18)
		req, err := collective.StartAllReduce(context.Background(), c, buf, buf, collective.Sum)
		if err != nil {
			return err
		}
		if err := c.Close(); err != nil {
			return err
		}
		select {
		case <-req.Done():
			done[r] = true
		default:
		}
		return req.Err()
	})
	noErrors(t, errs)
	require.Equal(t, []bool{true, true}, done)
}

// Barrier names itself in errors, not as the all-reduce it runs.
func TestBarrierNamesItself(t *testing.T) {
	comms, _ := newNet(t, 2, collective.WithTimeout(200*time.Millisecond))
	err := comms[0].Barrier(context.Background()) // rank 1 never arrives
	require.ErrorIs(t, err, collective.ErrTimeout)
	var oe *collective.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "barrier", oe.Op)
	require.Contains(t, err.Error(), "barrier#0")
}
