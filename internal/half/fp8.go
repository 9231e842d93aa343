package half

import "math"

// The two 8-bit floating-point formats of the OCP 8-bit Floating Point
// Specification (OFP8, rev. 1.0, 2023), as NCCL 2.24's ncclFloat8e4m3 and
// ncclFloat8e5m2 and CUDA's __nv_fp8_e4m3 and __nv_fp8_e5m2 have them:
//
//   - E4M3: 1 sign bit, 4 exponent bits (bias 7), 3 fraction bits. No
//     infinities: S.1111.111 is NaN, so the largest finite value is
//     S.1111.110 = 448; smallest normal 2^-6, smallest subnormal 2^-9.
//     Conversion saturates (CUDA's __NV_SATFINITE): a finite value beyond
//     448, and an infinity, become ±448.
//   - E5M2: 1 sign bit, 5 exponent bits (bias 15), 2 fraction bits, IEEE
//     754 style: S.11111.00 is infinity, other S.11111.xx are NaN; largest
//     finite 57344, smallest normal 2^-14, smallest subnormal 2^-16. A
//     finite value that rounds beyond 57344 becomes ±Inf, as float16's
//     conversion does.
//
// Both round to nearest, ties to even. A NaN becomes the format's NaN
// with the sign kept (E4M3 0x7f, E5M2 0x7e, quiet); its payload is lost
// (there is no room for it).

var e4m3ToF32, e5m2ToF32 [256]float32

func init() {
	for b := range 256 {
		e4m3ToF32[b] = decode8(uint8(b), 3, 7, false)
		e5m2ToF32[b] = decode8(uint8(b), 2, 15, true)
	}
}

// decode8 is the value of the 8-bit float b with m fraction bits and
// exponent bias bias; ieee says whether the top exponent is infinity and
// NaN (E5M2) or an ordinary one whose all-ones fraction is NaN (E4M3).
func decode8(b uint8, m, bias int, ieee bool) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e := int(b&0x7f) >> m
	f := int(b) & (1<<m - 1)
	top := 1<<(7-m) - 1
	switch {
	case ieee && e == top && f == 0:
		return sign * float32(math.Inf(1))
	case ieee && e == top, !ieee && e == top && f == 1<<m-1:
		return float32(math.Copysign(math.NaN(), float64(sign)))
	case e == 0:
		return sign * float32(math.Ldexp(float64(f), 1-bias-m))
	}
	return sign * float32(math.Ldexp(float64(1<<m+f), e-bias-m))
}

// E4M3Table and E5M2Table return the decoding tables (bit pattern to
// value), for kernels that look values up in a loop; do not change them.
func E4M3Table() *[256]float32 { return &e4m3ToF32 }
func E5M2Table() *[256]float32 { return &e5m2ToF32 }

// E4M3ToF32 returns the value of the E4M3 number with bit pattern b
// (exact).
func E4M3ToF32(b uint8) float32 { return e4m3ToF32[b] }

// E5M2ToF32 returns the value of the E5M2 number with bit pattern b
// (exact).
func E5M2ToF32(b uint8) float32 { return e5m2ToF32[b] }

// F32ToE4M3 rounds f to the nearest E4M3 (ties to even), saturating at
// ±448.
func F32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b >> 24 & 0x80)
	if b&0x7fff_ffff > f32ExpMask {
		return sign | 0x7f // NaN
	}
	code := round8(b&0x7fff_ffff, 3, 7)
	if code > 0x7e {
		code = 0x7e // 448, for anything larger and for Inf
	}
	return sign | code
}

// F32ToE5M2 rounds f to the nearest E5M2 (ties to even); beyond 57344 it
// becomes ±Inf.
func F32ToE5M2(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b >> 24 & 0x80)
	if b&0x7fff_ffff > f32ExpMask {
		return sign | 0x7e // NaN
	}
	code := round8(b&0x7fff_ffff, 2, 15)
	if code > 0x7c {
		code = 0x7c // Inf
	}
	return sign | code
}

// round8 rounds the non-negative, non-NaN binary32 with bits a to the
// 8-bit format with m fraction bits and exponent bias bias, ties to even,
// and returns the magnitude's code; a code beyond the format's top
// exponent (out of range, or an infinity) comes back larger than any
// finite one, for the caller to saturate or make infinite.
func round8(a uint32, m, bias int) uint8 {
	if a >= f32ExpMask {
		return 0xff // Inf
	}
	e := int(a>>23) - 127 // a's exponent (-127 for zero and subnormals)
	minExp := 1 - bias    // the format's smallest normal exponent
	var q uint32          // the rounded value in units of the format's ulp at its exponent
	var shift int         // bits of a's 24-bit significand dropped
	sig := a&0x7f_ffff | 0x80_0000
	if e < -126 {
		sig = a & 0x7f_ffff // a binary32 subnormal: far below any 8-bit format
		e = -126
	}
	if e < minExp {
		// A subnormal of the format: units of 2^(minExp-m).
		shift = 23 - m + (minExp - e)
	} else {
		shift = 23 - m
	}
	if shift > 31 {
		return 0 // far below half the smallest subnormal
	}
	q = sig >> shift
	rem := sig & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	if e < minExp {
		// q counts subnormal units; 1<<m of them is the smallest normal,
		// whose code is the same number.
		return uint8(q)
	}
	// q is 1<<m + fraction, possibly 2<<m after rounding up.
	exp := e + bias
	if q == 2<<m {
		q >>= 1
		exp++
	}
	code := exp<<m | int(q&(1<<m-1))
	if code > 0xff {
		return 0xff
	}
	return uint8(code)
}
