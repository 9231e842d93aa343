package half

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The decoded values, against the OFP8 specification's table 1 and 2.
func TestFP8Values(t *testing.T) {
	for _, c := range []struct {
		b    uint8
		e4m3 float32
		e5m2 float32
	}{
		{0x00, 0, 0},
		{0x01, 0x1p-9, 0x1p-16}, // smallest subnormals
		{0x08, 0x1p-6, 0x1p-14}, // E4M3's smallest normal; E5M2's 0x08 is 2^-13
		{0x38, 1, 0.5},
		{0x7e, 448, float32(math.NaN())},
		{0x7b, 0x1.6p8, 57344}, // E4M3 1.375×2^8 = 352; E5M2's largest finite
		{0x7c, 0x1.8p8, float32(math.Inf(1))},
		{0x80, float32(math.Copysign(0, -1)), float32(math.Copysign(0, -1))},
		{0xfe, -448, float32(math.NaN())},
	} {
		check := func(got, want float32, name string) {
			if math.IsNaN(float64(want)) {
				require.True(t, math.IsNaN(float64(got)), "%s(%#x) = %v, want NaN", name, c.b, got)
				return
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(got), "%s(%#x) = %v, want %v", name, c.b, got, want)
		}
		check(E4M3ToF32(c.b), c.e4m3, "E4M3")
		if c.b != 0x08 {
			check(E5M2ToF32(c.b), c.e5m2, "E5M2")
		}
	}
	require.Equal(t, float32(0x1p-13), E5M2ToF32(0x08))
	require.True(t, math.IsNaN(float64(E4M3ToF32(0x7f))))
	require.True(t, math.IsNaN(float64(E5M2ToF32(0x7d))))
}

// nearest is the reference: the finite code nearest to f by exhaustive
// search, ties to the even code.
func nearest(f float32, decode func(uint8) float32) uint8 {
	best, bestD := -1, math.Inf(1)
	for b := range 256 {
		v := float64(decode(uint8(b)))
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Signbit(v) != math.Signbit(float64(f)) {
			continue
		}
		d := math.Abs(v - float64(f))
		if d < bestD || d == bestD && b&1 == 0 {
			best, bestD = b, d
		}
	}
	return uint8(best)
}

func TestFP8RoundTripsAndRounding(t *testing.T) {
	// Every finite value converts back to itself.
	for b := range 256 {
		if v := E4M3ToF32(uint8(b)); !math.IsNaN(float64(v)) {
			require.Equal(t, uint8(b), F32ToE4M3(v), "E4M3 %#x (%v)", b, v)
		}
		if v := E5M2ToF32(uint8(b)); !math.IsNaN(float64(v)) {
			require.Equal(t, uint8(b), F32ToE5M2(v), "E5M2 %#x (%v)", b, v)
		}
	}
	// Midpoints between neighbours go to the even code; just off them, to
	// the nearer one; random values in range, to the nearest.
	r := rand.New(rand.NewPCG(1, 2))
	for _, f := range []struct {
		to     func(float32) uint8
		from   func(uint8) float32
		maxFin float64
	}{{F32ToE4M3, E4M3ToF32, 448}, {F32ToE5M2, E5M2ToF32, 57344}} {
		for b := 0; b < 0x7f; b++ {
			lo, hi := float64(f.from(uint8(b))), float64(f.from(uint8(b+1)))
			if math.IsNaN(hi) || math.IsInf(hi, 0) {
				continue
			}
			mid := float32((lo + hi) / 2)
			require.Equal(t, nearest(mid, f.from), f.to(mid), "midpoint of %#x and %#x", b, b+1)
			for _, x := range []float32{math.Nextafter32(mid, float32(lo)), math.Nextafter32(mid, float32(hi)), -mid} {
				require.Equal(t, nearest(x, f.from), f.to(x), "%v", x)
			}
		}
		for range 20000 {
			x := float32((r.Float64()*2 - 1) * f.maxFin * math.Pow(2, -r.Float64()*20))
			require.Equal(t, nearest(x, f.from), f.to(x), "%v", x)
		}
	}
	// Saturation, infinities, NaN, tiny values.
	require.Equal(t, uint8(0x7e), F32ToE4M3(449))
	require.Equal(t, uint8(0x7e), F32ToE4M3(1e30))
	require.Equal(t, uint8(0xfe), F32ToE4M3(float32(math.Inf(-1))))
	require.Equal(t, uint8(0x7c), F32ToE5M2(61440), "the midpoint of 57344 and 65536 rounds to even: Inf")
	require.Equal(t, uint8(0x7b), F32ToE5M2(61439))
	require.Equal(t, uint8(0xfc), F32ToE5M2(float32(math.Inf(-1))))
	require.Equal(t, uint8(0x7f), F32ToE4M3(float32(math.NaN())))
	require.Equal(t, uint8(0xfe), F32ToE5M2(float32(math.Copysign(math.NaN(), -1))))
	require.Equal(t, uint8(0), F32ToE4M3(0x1p-11), "below half the smallest subnormal")
	require.Equal(t, uint8(1), F32ToE4M3(0x1.01p-10), "just above half of it")
	require.Equal(t, uint8(0), F32ToE4M3(0x1p-10), "exactly half of it: ties to even (0)")
	require.Equal(t, uint8(0x80), F32ToE5M2(-0x1p-140), "a binary32 subnormal")
}
