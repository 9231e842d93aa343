package half

import "math"

// Bit-layout constants for binary32 and binary16 (IEEE 754-2008, section 3.4
// and table 3.5).
const (
	f32SignMask = 0x8000_0000
	f32ExpMask  = 0x7f80_0000 // also the bit pattern of +Inf

	f16ExpMask  = 0x7c00 // also the bit pattern of +Inf
	f16FracMask = 0x03ff
	f16Quiet    = 0x0200

	bf16Quiet = 0x0040

	// f32ToF16Bias rebiases a binary32 exponent (bias 127) to binary16
	// (bias 15): (127-15) << 23.
	f32ToF16Bias = (127 - 15) << 23

	// f32F16MinNormal is 2^-14, the smallest normal binary16, as binary32.
	f32F16MinNormal = 0x3880_0000
)

// F16ToF32 returns the float32 whose value is the binary16 number with bit
// pattern h. It is exact; a NaN keeps its sign and payload (see the package
// documentation).
//
// It is kept small enough for the compiler to inline it into callers' loops
// (the portable kernels of package kernels).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	em := uint32(h & 0x7fff) // exponent and fraction
	switch {
	case em >= f16ExpMask:
		// Inf or NaN: widen the payload, keep every bit.
		return math.Float32frombits(sign | f32ExpMask | em<<13)
	case em >= 0x0400:
		// Normal: rebias the exponent, widen the fraction.
		return math.Float32frombits(sign | (em<<13 + f32ToF16Bias))
	}
	// Zero or subnormal: the value is em * 2^-24, which float32 represents
	// exactly (em < 2^10). Multiplying by a power of two is exact, so the
	// hardware normalises for us.
	return math.Float32frombits(math.Float32bits(float32(em)*(1.0/(1<<24))) | sign)
}

// F32ToF16 returns the binary16 bit pattern nearest to f, ties to even.
// Values too large become ±Inf, NaNs stay (quiet) NaNs; see the package
// documentation for the full contract.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	a := b &^ f32SignMask
	var h uint32
	switch {
	case a < f32F16MinNormal:
		// Zero or subnormal result, in units of 2^-24. Adding 0.5, whose
		// unit in the last place is 2^-24, makes the float32 adder round
		// |f| to a multiple of 2^-24, to nearest even; the difference of
		// the bit patterns is then the multiple. A result of 2^-14
		// correctly reads as 0x400, the smallest normal. (The same
		// trick handles denormals in F. Giesen's float_to_half_fast3,
		// "float->half variants", https://gist.github.com/rygorous/2156668.)
		h = math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f00_0000
	case a <= f32ExpMask:
		// Normal result, or overflow to Inf. Clamp at 2^16, whose
		// rebiased pattern is exactly Inf's; then rebias, and round the
		// 13 dropped bits to nearest even by adding 0x0fff plus the
		// lowest kept bit. A carry out of the fraction correctly bumps
		// the exponent, up to Inf for |f| >= 65520 (65504 plus half a
		// unit in the last place).
		a = min(a, 0x4780_0000) - f32ToF16Bias
		h = (a + 0x0fff + (a>>13)&1) >> 13
	default:
		// NaN: set the quiet bit so that a payload whose top 10 bits are
		// zero does not turn into Inf, keep the top 10 payload bits.
		h = f16ExpMask | f16Quiet | a>>13&f16FracMask
	}
	return uint16(h | b>>16&0x8000)
}

// BF16ToF32 returns the float32 whose value is the bfloat16 number with bit
// pattern h. It is exact; a NaN keeps its sign and payload.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 returns the bfloat16 bit pattern nearest to f, ties to even.
// Values that round past the largest finite bfloat16 become ±Inf, NaNs stay
// (quiet) NaNs.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&^f32SignMask > f32ExpMask {
		// NaN: keep sign and top 7 payload bits, force quiet so that the
		// truncated payload cannot become zero (which would read as Inf).
		return uint16(b>>16) | bf16Quiet
	}
	// bfloat16 is the top half of binary32, so rounding is adding just
	// under half a unit (0x7fff) plus the lowest kept bit (ties to even);
	// the carry runs into the exponent and, past the largest finite value,
	// into Inf, as it should.
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
