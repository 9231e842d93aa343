package half

import (
	"flag"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var seedFlag = flag.Uint64("seed", 0, "seed for random inputs (0: time-based)")

// newRand returns a seeded source and arranges for the seed to be printed if
// the test fails, so that a failure can be replayed with -seed.
func newRand(t testing.TB) *rand.Rand {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed: %d (rerun with -seed=%d)", seed, seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// f16Value returns the value of the non-negative binary16 pattern i
// (0 <= i <= 0x7c00) straight from the definition in IEEE 754-2008 section
// 3.4, computed in float64 (exact: at most 11 significant bits). For
// i == 0x7c00 the formula gives 65536, the value the next pattern would have
// if the exponent range were unbounded; section 4.3.1 rounds against it.
func f16Value(i int) float64 {
	if i < 0x400 {
		return math.Ldexp(float64(i), -24)
	}
	return math.Ldexp(float64(0x400+i&0x3ff), i>>10-25)
}

var f16Table = func() []float64 {
	v := make([]float64, 0x7c01)
	for i := range v {
		v[i] = f16Value(i)
	}
	return v
}()

// refF32ToF16 is a slow reference for F32ToF16 on non-NaN input: find the two
// neighbouring binary16 values by binary search and compare against their
// midpoint, all exact in float64.
func refF32ToF16(f float32) uint16 {
	sign := uint16(0)
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	x := math.Abs(float64(f))
	i := sort.SearchFloat64s(f16Table, x) // first index with table[i] >= x
	if i < len(f16Table) && f16Table[i] == x {
		return sign | uint16(i)
	}
	if i == len(f16Table) {
		return sign | 0x7c00
	}
	lo, hi := i-1, i
	mid := (f16Table[lo] + f16Table[hi]) / 2
	r := lo
	switch {
	case x > mid:
		r = hi
	case x == mid && lo&1 == 1:
		r = hi
	}
	return sign | uint16(r)
}

// refF32ToBF16 is the same for bfloat16: the two neighbours of f are the
// float32 patterns with the low 16 bits cleared and the next one up.
func refF32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	b &^= 0x8000_0000
	x := float64(math.Float32frombits(b))
	loBits := b &^ 0xffff
	lo := float64(math.Float32frombits(loBits))
	if lo == x {
		return sign | uint16(loBits>>16)
	}
	var hi float64
	if loBits+0x10000 == 0x7f80_0000 {
		hi = math.Ldexp(1, 128) // next value with unbounded exponent
	} else {
		hi = float64(math.Float32frombits(loBits + 0x10000))
	}
	mid := (lo + hi) / 2
	r := loBits >> 16
	switch {
	case x > mid:
		r++
	case x == mid && r&1 == 1:
		r++
	}
	return sign | uint16(r)
}

func isNaN16(h uint16) bool   { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
func isNaNBF16(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }

// checkF16 compares F32ToF16 with the reference (or, for NaN, the NaN
// contract) and fails the test with the input's bit pattern.
func checkF16(t *testing.T, f float32) {
	got := F32ToF16(f)
	b := math.Float32bits(f)
	if f != f {
		want := uint16(b>>16)&0x8000 | 0x7e00 | uint16(b>>13)&0x3ff
		if got != want {
			require.Failf(t, "F32ToF16 NaN", "in %#08x: got %#04x, want %#04x", b, got, want)
		}
		return
	}
	if want := refF32ToF16(f); got != want {
		require.Failf(t, "F32ToF16", "in %#08x (%g): got %#04x, want %#04x", b, f, got, want)
	}
}

func checkBF16(t *testing.T, f float32) {
	got := F32ToBF16(f)
	b := math.Float32bits(f)
	if f != f {
		want := uint16(b>>16) | 0x40
		if got != want || !isNaNBF16(got) {
			require.Failf(t, "F32ToBF16 NaN", "in %#08x: got %#04x, want %#04x", b, got, want)
		}
		return
	}
	if want := refF32ToBF16(f); got != want {
		require.Failf(t, "F32ToBF16", "in %#08x (%g): got %#04x, want %#04x", b, f, got, want)
	}
}

func TestF16ToF32AllValues(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := F16ToF32(h)
		neg := h&0x8000 != 0
		require.Equalf(t, neg, math.Signbit(float64(got)), "sign of %#04x", h)
		mag := int(h & 0x7fff)
		switch {
		case mag < 0x7c00:
			require.Equalf(t, f16Value(mag), math.Abs(float64(got)), "value of %#04x", h)
		case mag == 0x7c00:
			require.Truef(t, math.IsInf(float64(got), 0), "%#04x should be Inf, got %g", h, got)
		default:
			require.Truef(t, got != got, "%#04x should be NaN, got %g", h, got)
			// Payload moves to the top of the float32 fraction unchanged.
			require.Equalf(t, uint32(mag&0x3ff)<<13, math.Float32bits(got)&0x7f_ffff, "payload of %#04x", h)
		}
	}
}

func TestF16RoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := F32ToF16(F16ToF32(h))
		if isNaN16(h) {
			require.Truef(t, isNaN16(got), "NaN %#04x came back as %#04x", h, got)
			require.Equalf(t, h|0x200, got, "NaN %#04x: sign/payload lost, quiet bit not set", h)
			continue
		}
		require.Equalf(t, h, got, "round trip of %#04x", h)
	}
}

func TestBF16RoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := BF16ToF32(h)
		require.Equalf(t, uint32(h)<<16, math.Float32bits(f), "widening %#04x", h)
		got := F32ToBF16(f)
		if isNaNBF16(h) {
			require.Equalf(t, h|0x40, got, "NaN %#04x", h)
			continue
		}
		require.Equalf(t, h, got, "round trip of %#04x", h)
	}
}

// TestF32ToF16Boundaries checks every value, midpoint and the float32
// neighbours of each, for both signs: these are where rounding can go wrong.
func TestF32ToF16Boundaries(t *testing.T) {
	for i := range 0x7c00 {
		for _, x := range []float64{f16Table[i], (f16Table[i] + f16Table[i+1]) / 2} {
			f := float32(x) // exact: at most 12 significant bits, in range
			require.Equal(t, x, float64(f))
			for _, g := range []float32{f, math.Nextafter32(f, 0), math.Nextafter32(f, math.MaxFloat32)} {
				checkF16(t, g)
				checkF16(t, -g)
			}
		}
	}
}

func TestF32ToF16Specials(t *testing.T) {
	specials := []uint32{
		0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, // ±0, ±Inf
		0x7f80_0001, 0xff80_0001, 0x7f80_1fff, 0x7fc0_0000, 0xffc0_0000, 0x7fff_ffff, 0x7fa0_0000, // NaNs
		0x477f_efff, 0x477f_f000, 0x477f_f001, 0x477f_e000, 0x7f7f_ffff, // around 65504 / 65520, max float32
		0x3300_0000, 0x3300_0001, 0x32ff_ffff, 0x3380_0000, 0x33c0_0000, // around 2^-25, 2^-24, 1.5*2^-24
		0x387f_e000, 0x387f_f000, 0x387f_ffff, 0x3880_0000, // top of subnormals to 2^-14
		0x0000_0001, 0x007f_ffff, // float32 subnormals
	}
	for _, b := range specials {
		checkF16(t, math.Float32frombits(b))
		checkF16(t, math.Float32frombits(b^0x8000_0000))
		checkBF16(t, math.Float32frombits(b))
		checkBF16(t, math.Float32frombits(b^0x8000_0000))
	}
	require.Equal(t, uint16(0x7c00), F32ToF16(65520))
	require.Equal(t, uint16(0x7bff), F32ToF16(65519.996))
	require.Equal(t, uint16(0x0001), F32ToF16(math.Float32frombits(0x3300_0001)))
	require.Equal(t, uint16(0x0000), F32ToF16(math.Float32frombits(0x3300_0000)))
	require.Equal(t, uint16(0x3c00), F32ToF16(1))
	require.Equal(t, uint16(0xc000), F32ToF16(-2))
	require.Equal(t, uint16(0x3f80), F32ToBF16(1))
	require.Equal(t, uint16(0x7f80), F32ToBF16(math.MaxFloat32))
}

func TestF32ToF16Random(t *testing.T) {
	r := newRand(t)
	n := 1 << 20
	if testing.Short() {
		n = 1 << 16
	}
	for range n {
		b := r.Uint32()
		checkF16(t, math.Float32frombits(b))
		// Bias towards the binary16 range: exponents 2^-27 .. 2^17.
		b = b&0x807f_ffff | (100+r.Uint32N(45))<<23
		checkF16(t, math.Float32frombits(b))
	}
}

func TestF32ToBF16Boundaries(t *testing.T) {
	// Every bfloat16 pattern, the midpoint above it and their neighbours.
	for i := range 1 << 16 {
		for _, b := range []uint32{uint32(i) << 16, uint32(i)<<16 | 0x8000} {
			checkBF16(t, math.Float32frombits(b))
			checkBF16(t, math.Float32frombits(b+1))
			checkBF16(t, math.Float32frombits(b-1))
		}
	}
}

func TestF32ToBF16Random(t *testing.T) {
	r := newRand(t)
	for range 1 << 18 {
		checkBF16(t, math.Float32frombits(r.Uint32()))
	}
}

var sinkU16 uint16
var sinkF32 float32

func BenchmarkF32ToF16(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	in := make([]float32, 4096)
	for i := range in {
		in[i] = float32(r.NormFloat64() * 100)
	}
	for i := 0; b.Loop(); i++ {
		sinkU16 += F32ToF16(in[i&4095])
	}
}

func BenchmarkF16ToF32(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		sinkF32 += F16ToF32(uint16(i) & 0x7bff)
	}
}
