package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// scalars covers the ones DDP uses (1/n), a negative, one that rounds in
// every float type, zero, and one that makes integers wrap.
var scalars = []float64{0.5, 1.0 / 3, -2, 0, 1e6 + 0.75}

// refScaled is a pre-multiplied sum's step from the contract in
// scaled.go: a + b·s, the product rounded to the type, then the sum;
// wrapping for integers.
func refScaled(t Type, s float64, a, b uint64) uint64 {
	switch {
	case t == Float64:
		x, y := math.Float64frombits(a), math.Float64frombits(b)
		return math.Float64bits(x + float64(y*s)) // the conversion forbids a fused multiply-add
	case isFloat(t):
		x, y := float32(toF64(t, a)), float32(toF64(t, b))
		p := float32(toF64(t, fromF32(t, y*float32(s)))) // the product, rounded to the type
		return fromF32(t, x+p)
	}
	return (a + b*uint64(int64(s))) & mask(t)
}

// refScale is Scale's element: v·s, rounded once.
func refScale(t Type, s float64, v uint64) uint64 {
	switch {
	case t == Float64:
		return math.Float64bits(math.Float64frombits(v) * s)
	case isFloat(t):
		return fromF32(t, float32(toF64(t, v))*float32(s))
	}
	return (v * uint64(int64(s))) & mask(t)
}

func TestScaledSum(t *testing.T) {
	eachScalar(t, func(t *testing.T, r *rand.Rand, tp Type, s float64) {
		want := func(a, b uint64) uint64 { return refScaled(tp, s, a, b) }
		checkBinaryRef(t, r, tp, Sum, ScaledSum(tp, s), testLengths(), want)
		checkBinaryRef(t, r, tp, Sum, ScaledSumStream(tp, s), streamLengths(), want)
		checkBinaryRef(t, r, tp, Sum, viaDst(t, r, ScaledSumStream2(tp, s)), streamLengths(), want)
	})
}

func TestScale(t *testing.T) {
	eachScalar(t, func(t *testing.T, r *rand.Rand, tp Type, s float64) {
		checkUnary(t, r, tp, Sum, Scale(tp, s), func(v uint64) uint64 { return refScale(tp, s, v) })
	})
}

// eachScalar runs body as a subtest for every code path, type and scalar.
func eachScalar(t *testing.T, body func(t *testing.T, r *rand.Rand, tp Type, s float64)) {
	for _, p := range paths() {
		for _, tp := range allTypes {
			for _, s := range scalars {
				t.Run(fmt.Sprintf("path=%s/type=%v/s=%g", p.name, tp, s), func(t *testing.T) {
					usePath(t, p)
					body(t, newRand(t), tp, s)
				})
			}
		}
	}
}

// A scaled sum is exactly a scale then a sum, on every type: what
// pre-scaling the input gave before the engine fused it.
func TestScaledSumIsScaleThenSum(t *testing.T) {
	r := newRand(t)
	for _, tp := range allTypes {
		for _, s := range scalars {
			n := 1000
			a, b := make([]byte, n*tp.Size()), make([]byte, n*tp.Size())
			fill(r, tp, a)
			fill(r, tp, b)
			fused, twice := make([]byte, len(a)), make([]byte, len(a))
			ScaledSum(tp, s)(fused, a, b)
			Scale(tp, s)(twice, b)
			Reduce(tp, Sum)(twice, a, twice)
			for i := range n {
				x, y := get(tp, fused, i), get(tp, twice, i)
				require.True(t, same(tp, Sum, 0, 0, x, y), "%v s=%g element %d: fused %#x, scale then sum %#x", tp, s, i, x, y)
			}
		}
	}
}
