// Package half converts between float32 and the two 16-bit floating-point
// formats used by collectives: IEEE 754-2008 binary16 ("float16", "half")
// and bfloat16 ("brain float").
//
// Values of both 16-bit formats are carried as their raw bit patterns in a
// uint16, exactly as they are laid out in memory (little-endian on the
// platforms goccl supports), so a []byte buffer of halves can be viewed as a
// []uint16 and passed through these functions.
//
// # Formats
//
//   - binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits.
//     Largest finite value 65504, smallest normal 2^-14, smallest subnormal
//     2^-24 (IEEE 754-2008, section 3.6, table 3.5).
//   - bfloat16: the upper 16 bits of a binary32: 1 sign bit, 8 exponent bits
//     (bias 127), 7 fraction bits. Same range as float32, 8 bits of
//     precision.
//
// # Contract
//
//  1. Widening (F16ToF32, BF16ToF32) is exact: every 16-bit value, including
//     subnormals, ±0 and ±Inf, maps to the float32 of the same value. A NaN
//     maps to a NaN with the same sign whose payload is the 16-bit payload
//     shifted to the top of the float32 fraction; the quiet/signalling bit
//     is kept as it is, so widening never changes a bit that narrowing can
//     give back.
//  2. Narrowing (F32ToF16, F32ToBF16) rounds to nearest, ties to even
//     (IEEE 754-2008, section 4.3.1, roundTiesToEven). Magnitudes that round
//     past the largest finite value become ±Inf (for binary16: |f| >= 65520,
//     which is 65504 plus half a unit in the last place, per section 4.3.1's
//     rule that rounding acts as if the exponent range were unbounded).
//     Results in the subnormal range are rounded correctly, not flushed to
//     zero; the sign of zero is kept.
//  3. Narrowing a NaN always gives a NaN, never an Inf: the result is a quiet
//     NaN (most significant fraction bit set) with the same sign and the top
//     fraction bits of the input payload (10 for binary16, 7 for bfloat16).
//     This matches what x86 F16C VCVTPS2PH does, so the scalar and vector
//     paths of package kernels agree.
//  4. For every non-NaN h, F32ToF16(F16ToF32(h)) == h and
//     F32ToBF16(BF16ToF32(h)) == h; for quiet NaNs too.
//
// Narrowing to binary16 uses the float32 adder for subnormal results, so
// like all Go floating-point code it assumes the default floating-point
// environment (round to nearest even, no flush-to-zero), which Go never
// changes.
//
// The functions are pure: no allocation, no global state, safe for
// concurrent use.
package half
