package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// unevenCounts is how many elements rank i sends rank j: uneven, some
// blocks empty.
func unevenCounts(i, j int) int { return (i*7 + j*3) % 5 * 100 }

func TestAllToAllvUnevenBlocks(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			// With the package users test their own code with.
			collectivetest.Run(t, n, func(ctx context.Context, c *collective.Comm) error {
				// Blocks of a few elements, then of up to 400 000 (many
				// slots, pieces and channels); some are empty.
				for _, scale := range []int{1, 1000} {
					if err := checkAllToAllv(ctx, c, scale); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// checkAllToAllv runs an AllToAllv of blocks of unevenCounts × scale
// elements, each element naming its sender, receiver and place, and
// checks every block, and that recv's room to spare is left alone.
func checkAllToAllv(ctx context.Context, c *collective.Comm, scale int) error {
	n, r := c.Size(), c.Rank()
	sc, rc := make([]int, n), make([]int, n)
	var send []int32
	for j := range n {
		sc[j], rc[j] = unevenCounts(r, j)*scale, unevenCounts(j, r)*scale
		for k := range sc[j] {
			send = append(send, int32(r*100_000_000+j*1_000_000+k))
		}
	}
	total := 0
	for _, k := range rc {
		total += k
	}
	recv := make([]int32, total+3) // room to spare is allowed
	for i := total; i < len(recv); i++ {
		recv[i] = -7
	}
	if err := collective.AllToAllv(ctx, c, send, sc, recv, rc); err != nil {
		return err
	}
	off := 0
	for i := range n {
		for k := range rc[i] {
			if want := int32(i*100_000_000 + r*1_000_000 + k); recv[off+k] != want {
				return fmt.Errorf("rank %d, scale %d: element %d of the block from %d is %d, want %d", r, scale, k, i, recv[off+k], want)
			}
		}
		off += rc[i]
	}
	for i := total; i < len(recv); i++ {
		if recv[i] != -7 {
			return fmt.Errorf("rank %d, scale %d: element %d past the blocks was written (%d)", r, scale, i, recv[i])
		}
	}
	return nil
}

// Counts that disagree between the ends of a block are an error on every
// rank, naming them, before any data moves; the communicator stays usable.
func TestAllToAllvCountsThatDisagree(t *testing.T) {
	comms := newGroup(t, 3)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		sc, rc := []int{2, 2, 2}, []int{2, 2, 2}
		if r == 1 {
			rc[2] = 3 // rank 1 expects 3 from rank 2, which sends 2
		}
		err := collective.AllToAllv(context.Background(), c, make([]float64, 6), sc, make([]float64, 7), rc)
		if err == nil {
			return fmt.Errorf("rank %d: no error", r)
		}
		if !errors.Is(err, collective.ErrMismatch) {
			return fmt.Errorf("rank %d: not a mismatch: %v", r, err)
		}
		if want := "rank 2 sends 2 elements to rank 1, which expects 3"; !strings.Contains(err.Error(), want) {
			return fmt.Errorf("rank %d: %q lacks %q", r, err, want)
		}
		v := []int64{1}
		return collective.AllReduce(context.Background(), c, v, v, collective.Sum)
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

func TestAllToAllvBadArguments(t *testing.T) {
	comms := newGroup(t, 2)
	c := comms[0]
	ctx := context.Background()
	buf := make([]float32, 8)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{collective.AllToAllv(ctx, c, buf, []int{1}, buf, []int{1, 1}), "1 send counts and 2 receive counts for 2 ranks"},
		{collective.AllToAllv(ctx, c, buf, []int{1, -1}, make([]float32, 2), []int{1, 1}), "send count for rank 1 is -1"},
		{collective.AllToAllv(ctx, c, buf, []int{5, 5}, make([]float32, 10), []int{5, 5}), "send counts add up to more than the buffer's 8 elements (at rank 1's, 5)"},
		{collective.AllToAllv(ctx, c, buf, []int{math.MaxInt, 2}, make([]float32, 10), []int{5, 5}), "more than the buffer's 8 elements"},
		{collective.AllToAllv(ctx, c, buf, []int{2, 2}, buf[2:], []int{2, 2}), "overlap"},
	} {
		require.ErrorIs(t, tc.err, collective.ErrInvalidArgument)
		require.ErrorContains(t, tc.err, tc.want)
	}
}

func TestGatherAndScatter(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		for root := range n {
			t.Run(fmt.Sprintf("n=%d/root=%d", n, root), func(t *testing.T) {
				comms := newGroup(t, n)
				const m = 3000
				errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
					ctx := context.Background()
					send := make([]float32, m)
					for k := range send {
						send[k] = float32(r*m + k)
					}
					var all []float32
					if r == root {
						all = make([]float32, n*m)
					}
					if err := collective.Gather(ctx, c, send, all, root); err != nil {
						return err
					}
					if r == root {
						for k, v := range all {
							if v != float32(k) {
								return fmt.Errorf("gather: element %d is %v", k, v)
							}
						}
						for k := range all {
							all[k] = -float32(k)
						}
					}
					back := make([]float32, m)
					if err := collective.Scatter(ctx, c, all, back, root); err != nil {
						return err
					}
					for k, v := range back {
						if v != -float32(r*m+k) {
							return fmt.Errorf("scatter: rank %d element %d is %v", r, k, v)
						}
					}
					return nil
				})
				for r, err := range errs {
					require.NoError(t, err, "rank %d", r)
				}
			})
		}
	}
}

// A rank whose block has another length than the root expects fails the
// gather on the root (the message says so), not a hang.
func TestGatherOfUnequalBlocks(t *testing.T) {
	comms, _ := newNet(t, 3, collective.WithTimeout(time.Minute))
	start := time.Now()
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		m := 4
		if r == 2 {
			m = 0 // nothing to send: still a message
		}
		var recv []int64
		if r == 0 {
			recv = make([]int64, 12)
		}
		return collective.Gather(context.Background(), c, make([]int64, m), recv, 0)
	})
	require.Less(t, time.Since(start), 10*time.Second)
	require.ErrorIs(t, errs[0], collective.ErrMismatch)
	require.ErrorContains(t, errs[0], "rank 2 sent 0 bytes")
}

// Group: an all-to-all written as sends and receives in whatever order,
// inside a group.
func TestGroupedExchange(t *testing.T) {
	const n, m = 4, 1 << 18 // 1 MiB blocks: more than a connection holds
	comms := newGroup(t, n)
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		ctx := context.Background()
		out := make([][]float32, n)
		in := make([][]float32, n)
		var reqs []*collective.Request
		err := collective.Group(ctx, c, func() error {
			// Receives first, from every peer in rank order: without lanes
			// every rank would wait on rank 0's first receive.
			for p := range n {
				if p == r {
					continue
				}
				in[p] = make([]float32, m)
				q, err := collective.StartRecv(ctx, c, in[p], p)
				if err != nil {
					return err
				}
				reqs = append(reqs, q)
			}
			for p := range n {
				if p == r {
					continue
				}
				out[p] = make([]float32, m)
				for k := range out[p] {
					out[p][k] = float32(r*10 + p)
				}
				q, err := collective.StartSend(ctx, c, out[p], p)
				if err != nil {
					return err
				}
				reqs = append(reqs, q)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, q := range reqs {
			if err := q.Wait(ctx); err != nil {
				return err
			}
		}
		for p := range n {
			if p != r && (in[p][0] != float32(p*10+r) || in[p][m-1] != float32(p*10+r)) {
				return fmt.Errorf("rank %d: from %d got %v", r, p, in[p][0])
			}
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	require.ErrorIs(t, collective.Group(context.Background(), nil, func() error { return nil }), collective.ErrNilComm)
	require.ErrorIs(t, collective.Group(context.Background(), comms[0], nil), collective.ErrInvalidArgument)
}
