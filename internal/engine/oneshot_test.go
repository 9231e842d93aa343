package engine

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport/mem"
)

// TestOneShotRunsAsOneExchange checks the direct OneShot path (oneShot):
// it is the one small all-reduces take, and every rank ends with the
// contributions reduced in rank order, in place or not, for several
// repetitions in a row.
func TestOneShotRunsAsOneExchange(t *testing.T) {
	for _, n := range []int{2, 3, 4, 6} {
		for _, red := range []kernels.Op{kernels.Sum, kernels.Avg, kernels.Max} {
			es, _ := engines(t, n, Config{Algo: algorithms.OneShot}, mem.Options{Slots: 4, SlotSize: 4096})
			for count := 1; count <= 9; count += 4 {
				op := func(r int, in, out []byte) *Op {
					return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: red, Count: count,
						In: memory.HostBuffer(in), Out: memory.HostBuffer(out)}
				}
				pl, err := es[0].Plan(op(0, make([]byte, 4*count), make([]byte, 4*count)))
				require.NoError(t, err)
				require.True(t, isOneShot(op(0, nil, nil), &pl), "n=%d count=%d: %+v", n, count, pl.Plan)
				for rep, inPlace := range []bool{false, true, false} {
					val := func(r, i int) float32 { return float32(r*10+i+rep) + 0.1*float32(r) }
					ins := make([][]byte, n)
					outs := make([][]byte, n)
					for r := range n {
						v := make([]float32, count)
						for i := range v {
							v[i] = val(r, i)
						}
						ins[r] = f32s(v)
						outs[r] = make([]byte, 4*count)
						if inPlace {
							outs[r] = ins[r]
						}
					}
					for _, err := range runAll(t, es, func(r int) *Op { return op(r, ins[r], outs[r]) }) {
						require.NoError(t, err)
					}
					for i := range count {
						want := val(0, i)
						for r := 1; r < n; r++ {
							switch red {
							case kernels.Max:
								want = max(want, val(r, i))
							default:
								want += val(r, i)
							}
						}
						if red == kernels.Avg {
							want /= float32(n)
						}
						for r := range n {
							got := f32at(outs[r], i)
							require.Equal(t, math.Float32bits(want), math.Float32bits(got),
								"n=%d %v count=%d rep=%d in-place=%v rank %d element %d: %v, want %v", n, red, count, rep, inPlace, r, i, got, want)
						}
					}
				}
			}
		}
	}
}

// TestOneShotMismatch: ranks that disagree on the count fail on both
// sides with the mismatch, through the direct path too.
func TestOneShotMismatch(t *testing.T) {
	es, _ := engines(t, 3, Config{Algo: algorithms.OneShot}, mem.Options{Slots: 4, SlotSize: 4096})
	errs := runAll(t, es, func(r int) *Op {
		count := 4
		if r == 2 {
			count = 5
		}
		return &Op{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Sum, Count: count,
			In: memory.HostBuffer(make([]byte, 4*count)), Out: memory.HostBuffer(make([]byte, 4*count))}
	})
	for r, err := range errs {
		var me *MismatchError
		require.ErrorAs(t, err, &me, "rank %d", r)
	}
}
