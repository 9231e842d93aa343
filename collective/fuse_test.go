package collective_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// Small all-reduces in a Group run fused: the three float32 sums as one
// operation, the two int64 maxima as another, the last float32 sum alone
// (it follows another kind); results as if each had run by itself; a
// broadcast issued in the group lets what is held go first.
func TestGroupFusesSmallAllReduces(t *testing.T) {
	collectivetest.Run(t, 3, func(ctx context.Context, c *collective.Comm) error {
		r := c.Rank()
		f := [][]float32{make([]float32, 5), make([]float32, 100), make([]float32, 1)}
		g := [][]int64{{int64(r), int64(-r)}, {int64(10 * r)}}
		last := []float32{float32(r)}
		for i, v := range f {
			for j := range v {
				v[j] = float32(r + i + j)
			}
		}
		b := []int32{int32(r)}
		var reqs []*collective.Request
		start := func(q *collective.Request, err error) error {
			reqs = append(reqs, q)
			return err
		}
		err := collective.Group(ctx, c, func() error {
			for _, v := range f {
				if err := start(collective.StartAllReduce(ctx, c, v, v, collective.Sum)); err != nil {
					return err
				}
			}
			for _, v := range g {
				if err := start(collective.StartAllReduce(ctx, c, v, v, collective.Max)); err != nil {
					return err
				}
			}
			if err := start(collective.StartAllReduce(ctx, c, last, last, collective.Sum)); err != nil {
				return err
			}
			return start(collective.StartBroadcast(ctx, c, b, b, 1))
		})
		if err != nil {
			return err
		}
		for _, q := range reqs {
			if err := q.Wait(ctx); err != nil {
				return err
			}
		}
		for i, v := range f {
			for j := range v {
				if want := float32(3*(i+j) + 3); v[j] != want {
					return fmt.Errorf("rank %d: sum %d element %d is %v, want %v", r, i, j, v[j], want)
				}
			}
		}
		if g[0][0] != 2 || g[0][1] != 0 || g[1][0] != 20 || last[0] != 3 || b[0] != 1 {
			return fmt.Errorf("rank %d: %v %v %v %v", r, g, last, b, f[2])
		}
		// Three all-reduces and the broadcast were issued, not seven.
		return recordedOps(c, 4, "3 fused all-reduces and a broadcast")
	})
}

// Small broadcasts from one root in a Group run as one broadcast of their
// bytes, whatever their types (DDP's coalesced broadcast of the initial
// parameters), in place or not, with no send buffer off the root; one
// from another root is another operation.
func TestGroupFusesSmallBroadcasts(t *testing.T) {
	collectivetest.Run(t, 3, func(ctx context.Context, c *collective.Comm) error {
		r := c.Rank()
		f := make([]float32, 300)
		g := make([]int64, 7)
		h := make([]uint8, 5) // an odd byte count between the others
		src := make([]float32, 2)
		other := []int32{int32(r)}
		for i := range f {
			f[i] = float32(r*1000 + i)
		}
		for i := range g {
			g[i] = int64(-r * i)
		}
		for i := range h {
			h[i] = uint8(r + i)
		}
		for i := range src {
			src[i] = float32(r) + 0.5
		}
		out := make([]float32, 2)
		if r != 1 {
			src = nil // only the root's is read
		}
		var reqs []*collective.Request
		start := func(q *collective.Request, err error) error {
			reqs = append(reqs, q)
			return err
		}
		err := collective.Group(ctx, c, func() error {
			return errors.Join(
				start(collective.StartBroadcast(ctx, c, f, f, 1)),
				start(collective.StartBroadcast(ctx, c, g, g, 1)),
				start(collective.StartBroadcast(ctx, c, h, h, 1)),
				start(collective.StartBroadcast(ctx, c, src, out, 1)),
				start(collective.StartBroadcast(ctx, c, other, other, 0)))
		})
		if err != nil {
			return err
		}
		for _, q := range reqs {
			if err := q.Wait(ctx); err != nil {
				return err
			}
		}
		for i := range f {
			if f[i] != float32(1000+i) {
				return fmt.Errorf("rank %d: float32 element %d is %v, want %v", r, i, f[i], 1000+i)
			}
		}
		for i := range g {
			if g[i] != int64(-i) {
				return fmt.Errorf("rank %d: int64 element %d is %v, want %v", r, i, g[i], -i)
			}
		}
		for i := range h {
			if h[i] != uint8(1+i) {
				return fmt.Errorf("rank %d: uint8 element %d is %v, want %v", r, i, h[i], 1+i)
			}
		}
		if out[0] != 1.5 || out[1] != 1.5 || other[0] != 0 {
			return fmt.Errorf("rank %d: out of place %v, from root 0 %v", r, out, other)
		}
		return recordedOps(c, 2, "the fused broadcast from rank 1 and the one from rank 0")
	})
}

// recordedOps checks that c's flight recorder holds want operations.
func recordedOps(c *collective.Comm, want int, what string) error {
	var buf bytes.Buffer
	if err := c.DebugDump(&buf); err != nil {
		return err
	}
	var d struct{ Ops []struct{ Op string } }
	if err := json.Unmarshal(buf.Bytes(), &d); err != nil {
		return err
	}
	if len(d.Ops) != want {
		return fmt.Errorf("rank %d: %d operations recorded, want %s: %+v", c.Rank(), len(d.Ops), what, d.Ops)
	}
	return nil
}
