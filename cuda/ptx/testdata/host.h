// host.h: the primitives of reduce.cu for its host build, the one
// ptx_test.go runs (reduce.cu includes this file when __CUDA_ARCH__ is not
// defined). Each stands for one PTX instruction, and is written from that
// instruction's definition, not from reduce.cu's float32 paths:
//
//   - loads and stores check their alignment and that they stay inside the
//     buffers of the running kernel (host_check), which the GPU would
//     report as a fault or not at all;
//   - the native binary16/bfloat16 operations round the exact result once
//     (computed in double, or as a double plus the sign of its error), so
//     the test compares "one correct rounding", what the instruction does,
//     with internal/kernels' widen-combine-round-twice reference;
//   - NaN results of the 16-bit instructions are the canonical 0x7fff.
//
// The harness compiles with -DGOCCL_ARCH=700 or 900 to choose the paths
// each PTX module takes, and with -ffp-contract=off on x86-64 (SSE), so
// float and double operations are IEEE operations rounded to nearest even,
// like add.rn/mul.rn/div.rn.

#include <math.h>
#include <string.h>

#ifndef GOCCL_ARCH
#error "compile with -DGOCCL_ARCH=700 or -DGOCCL_ARCH=900"
#endif

#define GOCCL_GLOBAL extern "C"
#define GOCCL_DEVICE inline

typedef u32 u32x4 __attribute__((vector_size(16)));

// The emulated grid: harness.cc sets these before each call of a kernel,
// which it makes once per (block, thread), one after the other.
extern u32 host_tid, host_ntid, host_ctaid, host_nctaid;

GOCCL_DEVICE u64 thread_index() { return (u64)host_ctaid * host_ntid + host_tid; }
GOCCL_DEVICE u64 thread_count() { return (u64)host_nctaid * host_ntid; }

// host_check records an access of n bytes at p that is misaligned (bit 1)
// or outside the kernel's input (bit 2) or output (bit 3) buffers, which
// harness.cc sets per job: [lo, hi) ranges.
struct HostRange { uptr lo, hi; };
extern HostRange host_in[2], host_out[2];
extern u32 host_fault;

GOCCL_DEVICE void host_check(const void* p, int n, const HostRange* r, u32 bit) {
	uptr a = (uptr)p;
	if (a % n) host_fault |= 1;
	for (int i = 0; i < 2; i++)
		if (r[i].lo <= a && a + n <= r[i].hi) return;
	host_fault |= bit;
}

GOCCL_DEVICE u32x4 ldg16(const void* p) { host_check(p, 16, host_in, 2); u32x4 v; memcpy(&v, p, 16); return v; }
GOCCL_DEVICE u64 ldg8(const void* p) { host_check(p, 8, host_in, 2); u64 v; memcpy(&v, p, 8); return v; }
GOCCL_DEVICE u32 ldg4(const void* p) { host_check(p, 4, host_in, 2); u32 v; memcpy(&v, p, 4); return v; }
GOCCL_DEVICE u16 ldg2(const void* p) { host_check(p, 2, host_in, 2); u16 v; memcpy(&v, p, 2); return v; }
GOCCL_DEVICE u8 ldg1(const void* p) { host_check(p, 1, host_in, 2); return *(const u8*)p; }
GOCCL_DEVICE void st16(void* p, u32x4 v) { host_check(p, 16, host_out, 4); memcpy(p, &v, 16); }
GOCCL_DEVICE void st8(void* p, u64 v) { host_check(p, 8, host_out, 4); memcpy(p, &v, 8); }
GOCCL_DEVICE void st4(void* p, u32 v) { host_check(p, 4, host_out, 4); memcpy(p, &v, 4); }
GOCCL_DEVICE void st2(void* p, u16 v) { host_check(p, 2, host_out, 4); memcpy(p, &v, 2); }
GOCCL_DEVICE void st1(void* p, u8 v) { host_check(p, 1, host_out, 4); *(u8*)p = v; }

// add.rn, mul.rn, div.rn in float and double.
GOCCL_DEVICE float fadd(float a, float b) { return a + b; }
GOCCL_DEVICE float fmul(float a, float b) { return a * b; }
GOCCL_DEVICE float fdiv(float a, float b) { return a / b; }
GOCCL_DEVICE double dadd(double a, double b) { return a + b; }
GOCCL_DEVICE double dmul(double a, double b) { return a * b; }
GOCCL_DEVICE double ddiv(double a, double b) { return a / b; }

// host_round returns the 16-bit pattern nearest to x + t (ties to even)
// in a format with m fraction bits and e exponent bits (binary16: 10, 5;
// bfloat16: 7, 8), where x is a finite double and t is an amount too small
// to matter except to break a tie, of sign tail (-1, 0 or 1). Values that
// round past the largest finite one give Inf.
static inline u16 host_round(double x, int tail, int m, int e) {
	u16 sign = signbit(x) ? 0x8000 : 0;
	double ax = fabs(x);
	if (sign) tail = -tail;
	const int bias = (1 << (e - 1)) - 1, emin = 1 - bias;
	const u32 inf = ((1u << e) - 1) << m;
	int ex = emin;
	if (ax != 0) {
		int fe;
		frexp(ax, &fe); // ax = f * 2^fe, f in [0.5, 1)
		if (fe - 1 > ex) ex = fe - 1;
	}
	// ax in units of the format's quantum at ax's binade (exact: a power
	// of two, far from double's limits).
	double n = ldexp(ax, m - ex), fl = floor(n), frac = n - fl;
	if (frac > 0.5 || (frac == 0.5 && (tail > 0 || (tail == 0 && fmod(fl, 2) == 1))))
		fl += 1;
	// fl is in [2^m, 2^(m+1)] (or below 2^m for a subnormal); encoding
	// (ex-emin) << m plus fl lets a carry into 2^(m+1) bump the exponent.
	double bits = ldexp((double)(ex - emin), m) + fl;
	if (bits >= inf) return sign | inf;
	return sign | (u16)bits;
}

static inline double host_f16(u16 h) { // exact value of a binary16
	int em = h & 0x7fff;
	double v = em < 0x400 ? ldexp(em, -24) : ldexp((em & 0x3ff) | 0x400, (em >> 10) - 25);
	if (em >= 0x7c00) v = (em == 0x7c00) ? INFINITY : NAN;
	return (h & 0x8000) ? -v : v;
}
static inline double host_bf16(u16 h) { // exact value of a bfloat16
	u32 u = (u32)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

// Result of a 16-bit instruction for an exact value x (a NaN: the
// canonical NaN; ±Inf as it is).
static inline u16 host_result(double x, int tail, int m, int e) {
	if (x != x) return 0x7fff;
	if (isinf(x)) return (signbit(x) ? 0x8000 : 0) | (((1u << e) - 1) << m);
	return host_round(x, tail, m, e);
}

// cvt.f32.f16 (exact) and cvt.rn.f16.f32.
GOCCL_DEVICE float h2f(u16 h) {
	if ((h & 0x7fff) > 0x7c00) { // NaN: keep sign and payload
		u32 u = (u32)(h & 0x8000) << 16 | 0x7f800000 | (u32)(h & 0x3ff) << 13;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	return (float)host_f16(h);
}
GOCCL_DEVICE u16 f2h(float f) { return host_result(f, 0, 10, 5); }

// add.rn.f16, mul.rn.f16: the exact sum (at most 41 bits) and product (22
// bits) of two binary16 values are doubles, rounded once.
GOCCL_DEVICE u16 hadd(u16 a, u16 b) { return host_result(host_f16(a) + host_f16(b), 0, 10, 5); }
GOCCL_DEVICE u16 hmul(u16 a, u16 b) { return host_result(host_f16(a) * host_f16(b), 0, 10, 5); }

#if GOCCL_ARCH >= 800
// min.NaN / max.NaN .f16 and .bf16.
template <class V>
static inline u16 host_minmax(u16 a, u16 b, V val, bool max) {
	double x = val(a), y = val(b);
	if (x != x || y != y) return 0x7fff;
	if (max) return x < y ? b : a;
	return y < x ? b : a;
}
GOCCL_DEVICE u16 hmin(u16 a, u16 b) { return host_minmax(a, b, host_f16, false); }
GOCCL_DEVICE u16 hmax(u16 a, u16 b) { return host_minmax(a, b, host_f16, true); }
GOCCL_DEVICE u16 bmin(u16 a, u16 b) { return host_minmax(a, b, host_bf16, false); }
GOCCL_DEVICE u16 bmax(u16 a, u16 b) { return host_minmax(a, b, host_bf16, true); }
#endif

#if GOCCL_ARCH >= 900
// add.rn.bf16: the exact sum of two bfloat16 values may not fit a double
// (exponents 2^-133 to 2^127), so take the rounded sum s and its exact
// error (Knuth's TwoSum): s + err is the exact sum. No double, so no
// bfloat16 midpoint, lies strictly between s and the exact sum, so only
// err's sign can matter, when s is itself a midpoint. (For two bfloat16
// operands that does not happen: err is nonzero only when their exponents
// are more than 45 apart, and then s is within 2^-45 of the larger operand
// (relatively), a bfloat16 value, far from any midpoint. The tie-break
// makes the emulation an exact rounding without relying on that.)
GOCCL_DEVICE u16 badd(u16 a, u16 b) {
	double x = host_bf16(a), y = host_bf16(b);
	double s = x + y;
	if (s != s || isinf(s)) return host_result(s, 0, 7, 8);
	double bb = s - x, err = (x - (s - bb)) + (y - bb);
	return host_result(s, (err > 0) - (err < 0), 7, 8);
}
// mul.rn.bf16: the exact product (16 bits, 2^-266 and up) is a double.
GOCCL_DEVICE u16 bmul(u16 a, u16 b) { return host_result(host_bf16(a) * host_bf16(b), 0, 7, 8); }
#endif
