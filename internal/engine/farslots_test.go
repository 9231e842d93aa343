package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/mem"
)

// slotsOnly hands out its endpoint's connections with nothing but the
// slots (no direct sends or receives), far or not as it says.
type slotsOnly struct {
	transport.Endpoint
	far bool
}

func (s slotsOnly) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	c, err := s.Endpoint.Connect(ctx, peer, ch)
	if err != nil {
		return nil, err
	}
	return slotConn{c, s.far}, nil
}

type slotConn struct {
	transport.Conn
	far bool
}

func (c slotConn) SlotsFar() bool { return c.far }

// TestFarSlotsGiveTheSameBits: slots written with streaming stores
// (transport.FarSlots, the default on mem's connections) give the bits
// plain stores give, every slice through the slots (slotsOnly), for every step kind that writes a slot (send,
// copySend, recvReduceSend, recvReduceCopySend, recvCopySend, the
// exchanges and the one-shot posts), with Avg's final step, a
// pre-multiplied sum, outputs above streamBytes (where the fused
// reduction writes both destinations) and slices whose slots are not
// aligned the way the input is (odd counts of 2-byte elements).
func TestFarSlotsGiveTheSameBits(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	var cases []devCase
	for _, count := range []int{3001, 100_003} {
		for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
			cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: a, typ: kernels.Float32, red: kernels.Avg, count: count})
		}
		for _, inPlace := range []bool{false, true} {
			cases = append(cases,
				devCase{coll: algorithms.CollAllReduce, algo: algorithms.Ring, typ: kernels.BFloat16, red: kernels.Sum, count: count, inPlace: inPlace},
				devCase{coll: algorithms.CollReduceScatter, algo: algorithms.Ring, typ: kernels.Float32, red: kernels.Sum, count: count, inPlace: inPlace},
				devCase{coll: algorithms.CollAllGather, algo: algorithms.Ring, typ: kernels.Uint8, count: count, inPlace: inPlace},
				devCase{coll: algorithms.CollBroadcast, algo: algorithms.Ring, typ: kernels.Float32, count: count, inPlace: inPlace, root: 1},
				devCase{coll: algorithms.CollReduce, algo: algorithms.Ring, typ: kernels.Float32, red: kernels.Max, count: count, inPlace: inPlace, root: 1})
		}
		cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: algorithms.Ring, typ: kernels.Float32, red: kernels.Sum, count: count, scales: []float64{0.25, -3, 7}})
	}
	// Above streamBytes: the ring's recvReduceCopySend writes the slot and
	// the output in one pass, both by streaming stores when far.
	cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: algorithms.Ring, typ: kernels.Float32, red: kernels.Avg, count: (streamBytes / 4) + 4099})
	for _, n := range []int{2, 3} {
		for _, c := range cases {
			if c.scales != nil {
				c.scales = c.scales[:n]
			}
			t.Run(fmt.Sprintf("nranks=%d/%v", n, c), func(t *testing.T) {
				if testing.Short() && c.count > 1<<20 {
					t.Skip("-short: the case above streamBytes runs in the full suite only")
				}
				ins := c.inputs(n, rng)
				cfg := Config{Algo: c.algo, Channels: 2, MaxChannels: 2, Link: testLink}
				run := func(noStream bool) [][]byte {
					nw, err := mem.NewNetwork(n, mem.Options{Slots: 4, SlotSize: 64 << 10, NoStreamSlots: noStream})
					require.NoError(t, err)
					t.Cleanup(func() {
						for r := range n {
							nw.Endpoint(r).Close(nil)
						}
					})
					conn, err := nw.Endpoint(0).Connect(t.Context(), 1, 0)
					require.NoError(t, err)
					require.Equal(t, !noStream, farSlots(conn), "mem's connections say whether their slots are far")
					es := make([]*Engine, n)
					for r := range es {
						es[r], err = New(r, n, slotsOnly{nw.Endpoint(r), !noStream}, cfg)
						require.NoError(t, err)
					}
					return runCase(t, es, c, ins, nil)
				}
				want, got := run(true), run(false)
				for r := range want {
					require.Equal(t, want[r], got[r], "%v: rank %d's output with streaming stores into the slots differs from plain stores'", c, r)
				}
			})
		}
	}
}
