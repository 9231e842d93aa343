package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// TestPreMulSumIsScaleThenSum: a pre-multiplied sum, its scaling fused
// into the steps that read the input, gives the bits a plain sum gives on
// inputs scaled first, for every algorithm of the three reductions, in
// place and not, on 32-bit and narrow floats and on integers that wrap.
// On the narrow floats that is what keeps the ranks' bits equal: in
// recursive doubling and the one-shot exchange each rank adds the other's
// term, scaled into the slot, to its own, scaled as it is added.
func TestPreMulSumIsScaleThenSum(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	var cases []devCase
	for _, typ := range []kernels.Type{kernels.Float32, kernels.Float16, kernels.BFloat16, kernels.Float8E4M3, kernels.Int32, kernels.Uint8} {
		for _, inPlace := range []bool{false, true} {
			for _, count := range []int{7, 3001} {
				for _, a := range []algorithms.Algorithm{algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot} {
					cases = append(cases, devCase{coll: algorithms.CollAllReduce, algo: a, typ: typ, count: count, inPlace: inPlace})
				}
				cases = append(cases, devCase{coll: algorithms.CollReduceScatter, algo: algorithms.Ring, typ: typ, count: count, inPlace: inPlace},
					devCase{coll: algorithms.CollReduce, algo: algorithms.Ring, typ: typ, count: count, inPlace: inPlace, root: 1})
			}
		}
	}
	for _, n := range []int{1, 2, 3, 5} {
		scales := make([]float64, n)
		for r := range scales {
			scales[r] = []float64{1.0 / 3, -2.5, 0.7, 3, 1e-3}[r]
		}
		for _, c := range cases {
			c.root = min(c.root, n-1)
			t.Run(fmt.Sprintf("nranks=%d/%v", n, c), func(t *testing.T) {
				ins := c.inputs(n, rng)
				if s := c.typ.Size(); s <= 2 && c.typ != kernels.Uint8 {
					for _, in := range ins {
						for i := s - 1; i < len(in); i += s {
							in[i] &= 0xbf // the exponent's top bit clear: no Inf or NaN
						}
					}
				}
				cfg := Config{Algo: c.algo, Channels: 2}
				scaled := make([][]byte, n)
				for r, in := range ins {
					scaled[r] = make([]byte, len(in))
					kernels.Scale(c.typ, scales[r])(scaled[r], in)
				}
				want := runCase(t, hostEngines(t, n, cfg), c, scaled, nil)
				c.scales = scales
				got := runCase(t, hostEngines(t, n, cfg), c, ins, nil)
				for r := range want {
					require.Equal(t, want[r], got[r], "%v: rank %d's pre-multiplied sum differs from the sum of its scaled inputs", c, r)
				}
			})
		}
	}
}

// TestPreMulSumRefused: the engine takes a pre-multiplied sum only as a
// host reduction with Red Sum.
func TestPreMulSumRefused(t *testing.T) {
	es := hostEngines(t, 1, Config{})
	b := make([]byte, 8)
	for _, op := range []*Op{
		{Coll: algorithms.CollAllReduce, Type: kernels.Float32, Red: kernels.Max, Count: 2, PreMul: true, Scale: 2},
		{Coll: algorithms.CollBroadcast, Type: kernels.Float32, Count: 2, PreMul: true, Scale: 2},
	} {
		op.In, op.Out = memory.HostBuffer(b), memory.HostBuffer(b)
		_, err := es[0].Run(t.Context(), op)
		require.ErrorContains(t, err, "pre-multiplied sum is a host reduction with Red Sum")
	}
}
