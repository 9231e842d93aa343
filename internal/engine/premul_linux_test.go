package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// TestPreMulSumOnTheBoard: small pre-multiplied sums on the shared board
// post and fold each rank's input scaled once, in place and not, and a
// new scale on the same shape takes effect. Whole numbers and scales that
// are powers of two keep every sum exact, whatever the order.
func TestPreMulSumOnTheBoard(t *testing.T) {
	const n = 3
	es := shmEngines(t, n, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round, scales := range [][]float64{{0.5, 2, -1}, {4, 0.25, 1}} {
		for _, coll := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter} {
			for _, inPlace := range []bool{false, true} {
				const count = 5
				inLen := count
				if coll == algorithms.CollReduceScatter {
					inLen = n * count
				}
				ops := make([]*Op, n)
				for r := range n {
					v := make([]float32, inLen)
					for i := range v {
						v[i] = float32((r + 1) * (i + 1))
					}
					in := memory.HostBuffer(f32Bytes(v))
					out := memory.HostBuffer(make([]byte, 4*count))
					if inPlace {
						out = in.Slice(0, 4*count)
						if coll == algorithms.CollReduceScatter {
							out = in.Slice(4*r*count, 4*(r+1)*count)
						}
					}
					ops[r] = &Op{Coll: coll, Type: kernels.Float32, Red: kernels.Sum, Count: count, In: in, Out: out, PreMul: true, Scale: scales[r]}
				}
				pls, errs := runPlans(es, ctx, func(r int) *Op { return ops[r] })
				require.NoError(t, errors.Join(errs...))
				for r := range n {
					require.True(t, pls[r].OnBoard(), "on the board")
					for i := range count {
						g := i + 1 // the element's index in its input, plus one
						if coll == algorithms.CollReduceScatter {
							g += r * count
						}
						want := float32(0)
						for q := range n {
							want += float32(scales[q] * float64((q+1)*g))
						}
						require.Equal(t, want, f32at(ops[r].Out.Bytes(), i), "round %d %v in place %v rank %d element %d", round, coll, inPlace, r, i)
					}
				}
			}
		}
	}
}
