// reduce.cu: goccl's device reduction, division and copy kernels.
//
// This file is compiled twice:
//
//   - to PTX by clang-16 (`go generate ./cuda/ptx/`, see gen.go), once for
//     sm_70 and once for sm_90; __CUDA_ARCH__ is then defined and the
//     primitives below are PTX instructions;
//   - as host C++ by ptx_test.go, with testdata/host.h standing in for
//     those primitives and testdata/harness.cc running every (block,
//     thread) pair of a small grid in turn, so that the index arithmetic,
//     the alignment paths and the choice of native or float32 arithmetic
//     are the very code that runs on the GPU.
//
// Everything outside the "Primitives" section is shared by both builds.
// The ABI and the arithmetic contract are described in doc.go; the rules
// are those of internal/kernels (its doc.go, rules 3 to 6), which the
// device kernels must match bit for bit.

// ---------------------------------------------------------------------------
// Primitives: the only code that differs between the device and the host
// build. Each is one PTX instruction (or a clang builtin that becomes one).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef int i32;
typedef long long i64;
typedef unsigned long long uptr;

#ifdef __CUDA_ARCH__

#define GOCCL_ARCH __CUDA_ARCH__
#define GOCCL_GLOBAL extern "C" __attribute__((global))
#define GOCCL_DEVICE __attribute__((device, always_inline)) inline

typedef u32 u32x4 __attribute__((ext_vector_type(4)));

GOCCL_DEVICE u64 thread_index() {
	return (u64)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() +
	       __nvvm_read_ptx_sreg_tid_x();
}
GOCCL_DEVICE u64 thread_count() {
	return (u64)__nvvm_read_ptx_sreg_nctaid_x() * __nvvm_read_ptx_sreg_ntid_x();
}

// Loads through the non-coherent (read-only) path, ld.global.nc. An input
// may be the output too (dst == a or dst == b), which the read-only path
// allows here: every element is read once, by the thread that then writes
// it, so no load can see a value this kernel wrote (a cached line holds
// other threads' elements only as they were before the kernel).
GOCCL_DEVICE u32x4 ldg16(const void* p) { return __nvvm_ldg_ui4((const u32x4*)p); }
GOCCL_DEVICE u64 ldg8(const void* p) { return __nvvm_ldg_ull((const u64*)p); }
GOCCL_DEVICE u32 ldg4(const void* p) { return __nvvm_ldg_ui((const u32*)p); }
GOCCL_DEVICE u16 ldg2(const void* p) { return __nvvm_ldg_us((const u16*)p); }
GOCCL_DEVICE u8 ldg1(const void* p) { return __nvvm_ldg_uc((const u8*)p); }

// Stores, st.global of 16, 8, 4, 2 and 1 bytes. (Like the loads they are
// primitives so that the host build can check every address.)
GOCCL_DEVICE void st16(void* p, u32x4 v) { *(u32x4*)p = v; }
GOCCL_DEVICE void st8(void* p, u64 v) { *(u64*)p = v; }
GOCCL_DEVICE void st4(void* p, u32 v) { *(u32*)p = v; }
GOCCL_DEVICE void st2(void* p, u16 v) { *(u16*)p = v; }
GOCCL_DEVICE void st1(void* p, u8 v) { *(u8*)p = v; }

// IEEE operations with an explicit rounding mode (add.rn, mul.rn, div.rn):
// ptxas may fuse a mul and an add that have no rounding modifier into an
// fma, and never one that has one. Subnormals are kept (no .ftz).
GOCCL_DEVICE float fadd(float a, float b) { return __nvvm_add_rn_f(a, b); }
GOCCL_DEVICE float fmul(float a, float b) { return __nvvm_mul_rn_f(a, b); }
GOCCL_DEVICE float fdiv(float a, float b) { return __nvvm_div_rn_f(a, b); }
GOCCL_DEVICE double dadd(double a, double b) { return __nvvm_add_rn_d(a, b); }
GOCCL_DEVICE double dmul(double a, double b) { return __nvvm_mul_rn_d(a, b); }
GOCCL_DEVICE double ddiv(double a, double b) { return __nvvm_div_rn_d(a, b); }

// binary16 <-> binary32: widening is exact; narrowing rounds to nearest
// even, keeps subnormals, gives Inf past 65504 and a quiet NaN for a NaN.
GOCCL_DEVICE float h2f(u16 h) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}
GOCCL_DEVICE u16 f2h(float f) {
	u16 h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
}

// Native binary16 arithmetic (sm_53 and later), one correctly rounded
// operation each; why that equals the host's float32 path is argued at
// struct F16 below.
GOCCL_DEVICE u16 hadd(u16 a, u16 b) {
	u16 r;
	asm("add.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
GOCCL_DEVICE u16 hmul(u16 a, u16 b) {
	u16 r;
	asm("mul.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}

#if GOCCL_ARCH >= 800
// min.NaN and max.NaN (sm_80 and later): the canonical (quiet) NaN if
// either operand is NaN, otherwise the smaller or larger operand, exactly.
GOCCL_DEVICE u16 hmin(u16 a, u16 b) {
	u16 r;
	asm("min.NaN.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
GOCCL_DEVICE u16 hmax(u16 a, u16 b) {
	u16 r;
	asm("max.NaN.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
GOCCL_DEVICE u16 bmin(u16 a, u16 b) {
	u16 r;
	asm("min.NaN.bf16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
GOCCL_DEVICE u16 bmax(u16 a, u16 b) {
	u16 r;
	asm("max.NaN.bf16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
#endif

#if GOCCL_ARCH >= 900
// Native bfloat16 arithmetic (sm_90 and later), one correctly rounded
// operation each; see struct BF16 for why that equals the host's path.
GOCCL_DEVICE u16 badd(u16 a, u16 b) {
	u16 r;
	asm("add.rn.bf16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
GOCCL_DEVICE u16 bmul(u16 a, u16 b) {
	u16 r;
	asm("mul.rn.bf16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
	return r;
}
#endif

#else // !__CUDA_ARCH__: the host build of ptx_test.go.

// Defines GOCCL_ARCH (from the compiler's command line), GOCCL_GLOBAL,
// GOCCL_DEVICE, u32x4 and every primitive above, as host C++.
#include "testdata/host.h"

#endif

// ---------------------------------------------------------------------------
// Bit casts and the 16-bit helpers written in plain C (shared by both
// builds, so tested as they run).

GOCCL_DEVICE u32 fbits(float f) {
	u32 u;
	__builtin_memcpy(&u, &f, 4);
	return u;
}
GOCCL_DEVICE float bitsf(u32 u) {
	float f;
	__builtin_memcpy(&f, &u, 4);
	return f;
}

// bfloat16 is the top half of a binary32, so widening is a shift.
GOCCL_DEVICE float b2f(u16 h) { return bitsf((u32)h << 16); }

// f2b rounds a float32 to the nearest bfloat16, ties to even, in integer
// code: cvt.rn.bf16.f32 needs sm_80, and this is what internal/half's
// F32ToBF16 does, step for step. A NaN stays a NaN with its sign and top
// payload bits, made quiet so that the cut payload cannot read as Inf;
// adding just under half a unit plus the kept lowest bit rounds to nearest
// even, and a carry runs into the exponent and, past the largest finite
// value, into Inf.
GOCCL_DEVICE u16 f2b(float f) {
	u32 b = fbits(f);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (u16)(b >> 16) | 0x0040;
	b += 0x7fffu + ((b >> 16) & 1);
	return (u16)(b >> 16);
}

// Min and max that return a NaN when either operand is NaN (internal/kernels
// rule 6; C's fmin/fmax and PTX's plain min/max return the other operand).
// For operands that compare equal (-0 and +0) either may come out.
template <class F>
GOCCL_DEVICE F nanmin(F a, F b) {
	if (a != a) return a;
	if (b != b) return b;
	return b < a ? b : a;
}
template <class F>
GOCCL_DEVICE F nanmax(F a, F b) {
	if (a != a) return a;
	if (b != b) return b;
	return a < b ? b : a;
}

// The same for 16-bit formats below sm_80: compare the exactly widened
// values, return an operand's own bits (exact, so no rounding), and make a
// NaN quiet, as narrowing through float32 would (rule 6: 16-bit NaN results
// are quiet).
template <class F16T>
GOCCL_DEVICE u16 min16(u16 a, u16 b) {
	float x = F16T::widen(a), y = F16T::widen(b);
	if (x != x) return a | F16T::quiet;
	if (y != y) return b | F16T::quiet;
	return y < x ? b : a;
}
template <class F16T>
GOCCL_DEVICE u16 max16(u16 a, u16 b) {
	float x = F16T::widen(a), y = F16T::widen(b);
	if (x != x) return a | F16T::quiet;
	if (y != y) return b | F16T::quiet;
	return x < y ? b : a;
}

// ---------------------------------------------------------------------------
// Arithmetic per element type: T is the storage type; sum, prod, min, max
// combine two elements; avg is (a+b)/div and post is a/div, for div >= 2
// (Avg's final step, and Avg of a single contribution).

// Integers wrap (rule 3): sum and product in the unsigned type of the same
// width (signed overflow is undefined in C++; this is the two's complement
// result). Avg is the wrapped sum, then division in int64 or uint64 (W),
// truncating toward zero like internal/kernels' avgSigned/avgUnsigned; the
// quotient's magnitude is at most the dividend's, so it fits T again.
template <class T, class U, class W>
struct Int {
	typedef T type;
	typedef W divisor;
	static GOCCL_DEVICE T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
	static GOCCL_DEVICE T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
	static GOCCL_DEVICE T min(T a, T b) { return b < a ? b : a; }
	static GOCCL_DEVICE T max(T a, T b) { return a < b ? b : a; }
	static GOCCL_DEVICE T avg(T a, T b, W d) { return (T)((W)sum(a, b) / d); }
	static GOCCL_DEVICE T post(T a, W d) { return (T)((W)a / d); }
};
typedef Int<i8, u8, i64> I8;
typedef Int<u8, u8, u64> U8;
typedef Int<i32, u32, i64> I32;
typedef Int<u32, u32, u64> U32;
typedef Int<i64, u64, i64> I64;
typedef Int<u64, u64, u64> U64;

// float32 and float64: IEEE arithmetic in the type, rounded to nearest
// even (rule 4); Avg divides (div.rn), it does not multiply by 1/div. The
// divisor is converted once, rounding to nearest like Go's float32(n).
struct F32 {
	typedef float type;
	typedef float divisor;
	static GOCCL_DEVICE float sum(float a, float b) { return fadd(a, b); }
	static GOCCL_DEVICE float prod(float a, float b) { return fmul(a, b); }
	static GOCCL_DEVICE float min(float a, float b) { return nanmin(a, b); }
	static GOCCL_DEVICE float max(float a, float b) { return nanmax(a, b); }
	static GOCCL_DEVICE float avg(float a, float b, float d) { return fdiv(fadd(a, b), d); }
	static GOCCL_DEVICE float post(float a, float d) { return fdiv(a, d); }
};
struct F64 {
	typedef double type;
	typedef double divisor;
	static GOCCL_DEVICE double sum(double a, double b) { return dadd(a, b); }
	static GOCCL_DEVICE double prod(double a, double b) { return dmul(a, b); }
	static GOCCL_DEVICE double min(double a, double b) { return nanmin(a, b); }
	static GOCCL_DEVICE double max(double a, double b) { return nanmax(a, b); }
	static GOCCL_DEVICE double avg(double a, double b, double d) { return ddiv(dadd(a, b), d); }
	static GOCCL_DEVICE double post(double a, double d) { return ddiv(a, d); }
};

// binary16. The host reference (rule 5) widens both operands to float32,
// combines them there (rounding to float32) and rounds the result to
// binary16: two roundings. A native instruction rounds the exact result
// once. They agree:
//
//   - prod: the exact product of two binary16 numbers has at most 22
//     significant bits and a magnitude in [2^-48, 2^32), so float32 holds it
//     exactly and the host rounds only once too.
//   - sum: the exact sum can need 41 bits (65504 + 2^-24), so float32 does
//     round it. But rounding to nearest in precision p' and then in p is the
//     same as rounding once in p whenever p' >= 2p + 2 (S. A. Figueroa,
//     "When is double rounding innocuous?", SIGNUM Newsletter 30(3), 1995;
//     for + - * / and sqrt): here p' = 24 and p = 11, and 24 >= 24. The
//     theorem is for results in the normal range; a sum below 2^-14 (the
//     smallest normal binary16) is a multiple of 2^-24 below 2^-14, exact
//     in binary16 and in float32, so neither path rounds. Overflow agrees
//     too: float32 has the range to hold every sum, and the final rounding
//     to Inf sees the same value both ways.
//   - min, max: exact, no rounding; native min.NaN/max.NaN need sm_80, so
//     sm_70 compares the widened values (min16/max16).
//   - avg, post: a float32 division between the two roundings has no native
//     counterpart, so they run in float32 on every architecture.
//
// The test TestExhaustive16 checks sum and prod for all 2^32 operand
// pairs (GOCCL_PTX_EXHAUSTIVE=1).
struct F16 {
	typedef u16 type;
	typedef float divisor;
	static const u16 quiet = 0x0200;
	static GOCCL_DEVICE float widen(u16 h) { return h2f(h); }
	static GOCCL_DEVICE u16 sum(u16 a, u16 b) { return hadd(a, b); }
	static GOCCL_DEVICE u16 prod(u16 a, u16 b) { return hmul(a, b); }
#if GOCCL_ARCH >= 800
	static GOCCL_DEVICE u16 min(u16 a, u16 b) { return hmin(a, b); }
	static GOCCL_DEVICE u16 max(u16 a, u16 b) { return hmax(a, b); }
#else
	static GOCCL_DEVICE u16 min(u16 a, u16 b) { return min16<F16>(a, b); }
	static GOCCL_DEVICE u16 max(u16 a, u16 b) { return max16<F16>(a, b); }
#endif
	static GOCCL_DEVICE u16 avg(u16 a, u16 b, float d) { return f2h(fdiv(fadd(h2f(a), h2f(b)), d)); }
	static GOCCL_DEVICE u16 post(u16 a, float d) { return f2h(fdiv(h2f(a), d)); }
};

// bfloat16, same reference (widen, float32, round once more):
//
//   - sum: p = 8, and 24 >= 2*8 + 2, so by Figueroa's theorem the float32
//     rounding followed by the bfloat16 one equals one correct rounding for
//     results in the normal range. bfloat16 has float32's exponent range, so
//     the subnormal range needs its own look: a sum below 2^-126 is a
//     multiple of 2^-133 (the bfloat16 subnormal unit) below 2^-126, exact in
//     bfloat16, so neither path rounds. A sum that overflows float32
//     (>= 2^128 - 2^103) overflows bfloat16 too (its threshold is lower).
//   - prod: the exact product has at most 16 significant bits. If it is at
//     least 2^-134 (half the smallest bfloat16 subnormal) its lowest bit is
//     at least 2^-149, float32's unit, so float32 holds it exactly (or
//     overflows, past bfloat16's own threshold) and the host rounds once.
//     Below 2^-134 both paths give zero of the product's sign: float32
//     rounds it to at most 2^-134, a tie that goes to even, zero.
//   - add.rn.bf16 and mul.rn.bf16 need sm_90; sm_70 goes through float32,
//     rounding with f2b. min.NaN/max.NaN.bf16 need sm_80.
//   - avg, post: through float32, as for binary16.
struct BF16 {
	typedef u16 type;
	typedef float divisor;
	static const u16 quiet = 0x0040;
	static GOCCL_DEVICE float widen(u16 h) { return b2f(h); }
#if GOCCL_ARCH >= 900
	static GOCCL_DEVICE u16 sum(u16 a, u16 b) { return badd(a, b); }
	static GOCCL_DEVICE u16 prod(u16 a, u16 b) { return bmul(a, b); }
#else
	static GOCCL_DEVICE u16 sum(u16 a, u16 b) { return f2b(fadd(b2f(a), b2f(b))); }
	static GOCCL_DEVICE u16 prod(u16 a, u16 b) { return f2b(fmul(b2f(a), b2f(b))); }
#endif
#if GOCCL_ARCH >= 800
	static GOCCL_DEVICE u16 min(u16 a, u16 b) { return bmin(a, b); }
	static GOCCL_DEVICE u16 max(u16 a, u16 b) { return bmax(a, b); }
#else
	static GOCCL_DEVICE u16 min(u16 a, u16 b) { return min16<BF16>(a, b); }
	static GOCCL_DEVICE u16 max(u16 a, u16 b) { return max16<BF16>(a, b); }
#endif
	static GOCCL_DEVICE u16 avg(u16 a, u16 b, float d) { return f2b(fdiv(fadd(b2f(a), b2f(b)), d)); }
	static GOCCL_DEVICE u16 post(u16 a, float d) { return f2b(fdiv(b2f(a), d)); }
};

// Element functors: what one kernel does to one element (x from a, y from
// b; post and copy have no b).
template <class A> struct Sum  { GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type y) const { return A::sum(x, y); } };
template <class A> struct Prod { GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type y) const { return A::prod(x, y); } };
template <class A> struct Min  { GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type y) const { return A::min(x, y); } };
template <class A> struct Max  { GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type y) const { return A::max(x, y); } };
template <class A> struct Avg {
	typename A::divisor d;
	GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type y) const { return A::avg(x, y, d); }
};
template <class A> struct Div {
	typename A::divisor d;
	GOCCL_DEVICE typename A::type f(typename A::type x, typename A::type) const { return A::post(x, d); }
};
template <class T> struct Ident { GOCCL_DEVICE T f(T x, T) const { return x; } };

// ---------------------------------------------------------------------------
// The element-wise loop.
//
// Every thread of the grid takes elements (or W-byte units) tid, tid+n,
// tid+2n, ... (n = threads in the grid), so any grid and block size covers
// every element exactly once, and neighbouring threads touch neighbouring
// memory (coalesced). No thread reads or writes outside [p, p+count).

// Unit<W> is W bytes of each buffer, held as 32-bit words (a 1- or 2-byte
// unit in the low bits of one word): one ld.global.nc and one st.global of
// W bytes (v4.u32 for 16). Elements are taken out and put back with shifts
// on constant positions, which the compiler keeps in registers; a union of
// the vector and an array of bytes or halves would go through local memory.
// Both the GPU and the test's host are little-endian.
template <int W> struct Unit { u32 w[W >= 4 ? W / 4 : 1]; };

template <int W>
GOCCL_DEVICE Unit<W> load(const void* p) {
	Unit<W> u;
	if (W == 16) {
		u32x4 v = ldg16(p);
		u.w[0] = v[0], u.w[1] = v[1], u.w[2] = v[2], u.w[3] = v[3];
	} else if (W == 8) {
		u64 v = ldg8(p);
		u.w[0] = (u32)v, u.w[W >= 8 ? 1 : 0] = (u32)(v >> 32);
	} else if (W == 4) {
		u.w[0] = ldg4(p);
	} else if (W == 2) {
		u.w[0] = ldg2(p);
	} else {
		u.w[0] = ldg1(p);
	}
	return u;
}

template <int W>
GOCCL_DEVICE void store(void* p, const Unit<W>& u) {
	if (W == 16) {
		u32x4 v = {u.w[0], u.w[1], u.w[2], u.w[3]};
		st16(p, v);
	} else if (W == 8) {
		st8(p, (u64)u.w[0] | (u64)u.w[W >= 8 ? 1 : 0] << 32);
	} else if (W == 4) {
		st4(p, u.w[0]);
	} else if (W == 2) {
		st2(p, (u16)u.w[0]);
	} else {
		st1(p, (u8)u.w[0]);
	}
}

// get and put move element k (of E = W/sizeof(T)) out of and into a unit.
template <class T, int W>
GOCCL_DEVICE T get(const Unit<W>& u, int k) {
	T t;
	if (sizeof(T) == 8) {
		u64 v = (u64)u.w[2 * k] | (u64)u.w[2 * k + 1] << 32;
		__builtin_memcpy(&t, &v, sizeof(T));
	} else if (sizeof(T) == 4) {
		__builtin_memcpy(&t, &u.w[k], sizeof(T));
	} else if (sizeof(T) == 2) {
		u16 v = (u16)(u.w[k / 2] >> (16 * (k % 2)));
		__builtin_memcpy(&t, &v, sizeof(T));
	} else {
		u8 v = (u8)(u.w[k / 4] >> (8 * (k % 4)));
		__builtin_memcpy(&t, &v, sizeof(T));
	}
	return t;
}

template <class T, int W>
GOCCL_DEVICE void put(Unit<W>& u, int k, T t) {
	if (sizeof(T) == 8) {
		u64 v;
		__builtin_memcpy(&v, &t, sizeof(T));
		u.w[2 * k] = (u32)v, u.w[2 * k + 1] = (u32)(v >> 32);
	} else if (sizeof(T) == 4) {
		__builtin_memcpy(&u.w[k], &t, sizeof(T));
	} else if (sizeof(T) == 2) {
		u16 v;
		__builtin_memcpy(&v, &t, sizeof(T));
		if (k % 2 == 0) u.w[k / 2] = v;
		else u.w[k / 2] |= (u32)v << 16;
	} else {
		u8 v;
		__builtin_memcpy(&v, &t, sizeof(T));
		if (k % 4 == 0) u.w[k / 4] = v;
		else u.w[k / 4] |= (u32)v << (8 * (k % 4));
	}
}

// apply combines one unit of each input into r.
template <class T, int W, int NIN, class Op>
GOCCL_DEVICE void apply(Unit<W>& r, const Unit<W>& x, const Unit<W>& y, const Op& op) {
#pragma unroll
	for (int k = 0; k < W / (int)sizeof(T); k++) {
		T e = get<T>(x, k);
		put<T>(r, k, op.f(e, NIN == 2 ? get<T>(y, k) : e));
	}
}

// unit does one unit at element index i.
template <class T, int W, int NIN, class Op>
GOCCL_DEVICE void unit(T* d, T* d2, const T* a, const T* b, u64 i, const Op& op) {
	Unit<W> x, y, r;
	x = load<W>(a + i);
	if (NIN == 2) y = load<W>(b + i);
	apply<T, W, NIN>(r, x, y, op);
	store<W>(d + i, r);
	if (d2) store<W>(d2 + i, r);
}

// stripe handles buffers whose addresses agree modulo W (and are aligned to
// their element size): a head of single elements up to the first W-aligned
// one, a body of W-byte units, a tail of single elements. With W == 16 the
// body is ld.global.nc.v4 / st.global.v4, and each thread issues UNROLL
// units' loads before it stores, so that enough bytes are in flight to
// cover memory latency (NCCL's reduce copy unrolls likewise).
template <class T, int W, int NIN, class Op>
GOCCL_DEVICE void stripe(T* d, T* d2, const T* a, const T* b, u64 n, const Op& op) {
	const int E = W / (int)sizeof(T);
	const int UNROLL = W == 16 ? 4 : 1;
	const u64 tid = thread_index(), nth = thread_count();
	u64 head = ((W - ((uptr)d & (W - 1))) & (W - 1)) / sizeof(T);
	if (head > n) head = n;
	for (u64 i = tid; i < head; i += nth)
		unit<T, sizeof(T), NIN>(d, d2, a, b, i, op);
	const u64 units = (n - head) / E;
	u64 v = tid;
	if (UNROLL > 1) {
		for (; v + (UNROLL - 1) * nth < units; v += UNROLL * nth) {
			Unit<W> x[UNROLL], y[UNROLL], r[UNROLL];
#pragma unroll
			for (int j = 0; j < UNROLL; j++) {
				x[j] = load<W>(a + head + (v + j * nth) * E);
				if (NIN == 2) y[j] = load<W>(b + head + (v + j * nth) * E);
			}
#pragma unroll
			for (int j = 0; j < UNROLL; j++)
				apply<T, W, NIN>(r[j], x[j], y[j], op);
#pragma unroll
			for (int j = 0; j < UNROLL; j++) {
				store<W>(d + head + (v + j * nth) * E, r[j]);
				if (d2) store<W>(d2 + head + (v + j * nth) * E, r[j]);
			}
		}
	}
	for (; v < units; v += nth)
		unit<T, W, NIN>(d, d2, a, b, head + v * E, op);
	for (u64 i = head + units * E + tid; i < n; i += nth)
		unit<T, sizeof(T), NIN>(d, d2, a, b, i, op);
}

// bytewise handles element-misaligned buffers (a float32 buffer at an odd
// address, say): every element is read and written a byte at a time, as
// the GPU faults on a misaligned load. Slow, correct, and not expected of
// goccl's own buffers.
template <class T, int NIN, class Op>
GOCCL_DEVICE void bytewise(T* d, T* d2, const T* a, const T* b, u64 n, const Op& op) {
	const u64 tid = thread_index(), nth = thread_count();
	for (u64 i = tid; i < n; i += nth) {
		u8 xb[sizeof(T)], yb[sizeof(T)], rb[sizeof(T)];
#pragma unroll
		for (int k = 0; k < (int)sizeof(T); k++) {
			xb[k] = ldg1((const u8*)(a + i) + k);
			if (NIN == 2) yb[k] = ldg1((const u8*)(b + i) + k);
		}
		T x, y, r;
		__builtin_memcpy(&x, xb, sizeof(T));
		__builtin_memcpy(&y, NIN == 2 ? yb : xb, sizeof(T));
		r = op.f(x, y);
		__builtin_memcpy(rb, &r, sizeof(T));
#pragma unroll
		for (int k = 0; k < (int)sizeof(T); k++) {
			st1((u8*)(d + i) + k, rb[k]);
			if (d2) st1((u8*)(d2 + i) + k, rb[k]);
		}
	}
}

// elementwise picks the widest unit at which all the buffers agree: 16
// bytes, else 4 (for elements narrower than that), else single elements,
// else bytes. The choice depends only on the addresses, so it is the same
// in every thread.
template <class T, int NIN, class Op>
GOCCL_DEVICE void elementwise(T* d, T* d2, const T* a, const T* b, u64 n, const Op& op) {
	uptr diff = ((uptr)d ^ (uptr)a);
	if (NIN == 2) diff |= (uptr)d ^ (uptr)b;
	if (d2) diff |= (uptr)d ^ (uptr)d2;
	if (((uptr)d | diff) & (sizeof(T) - 1))
		bytewise<T, NIN>(d, d2, a, b, n, op);
	else if ((diff & 15) == 0)
		stripe<T, 16, NIN>(d, d2, a, b, n, op);
	else if (sizeof(T) < 4 && (diff & 3) == 0)
		stripe<T, (sizeof(T) < 4 ? 4 : sizeof(T)), NIN>(d, d2, a, b, n, op);
	else
		stripe<T, sizeof(T), NIN>(d, d2, a, b, n, op);
}

// ---------------------------------------------------------------------------
// Entry points (doc.go lists the ABI). div <= 1 means no division; div is
// used only by the sum kernels (Avg's final step), as internal/kernels'
// ReduceFinal ignores n for every op but Avg.

#define GOCCL_REDUCE(t, A, op)                                                                  \
	GOCCL_GLOBAL void goccl_reduce_##t##_##op(A::type* dst, A::type* dst2, const A::type* a,  \
	                                            const A::type* b, u64 count, u32 div) {         \
		op##_kernel<A>(dst, dst2, a, b, count, div);                                         \
	}

template <class A>
GOCCL_DEVICE void sum_kernel(typename A::type* d, typename A::type* d2, const typename A::type* a,
                             const typename A::type* b, u64 n, u32 div) {
	if (div > 1) {
		Avg<A> op = {(typename A::divisor)div};
		elementwise<typename A::type, 2>(d, d2, a, b, n, op);
	} else {
		elementwise<typename A::type, 2>(d, d2, a, b, n, Sum<A>());
	}
}
template <class A>
GOCCL_DEVICE void prod_kernel(typename A::type* d, typename A::type* d2, const typename A::type* a,
                              const typename A::type* b, u64 n, u32) {
	elementwise<typename A::type, 2>(d, d2, a, b, n, Prod<A>());
}
template <class A>
GOCCL_DEVICE void min_kernel(typename A::type* d, typename A::type* d2, const typename A::type* a,
                             const typename A::type* b, u64 n, u32) {
	elementwise<typename A::type, 2>(d, d2, a, b, n, Min<A>());
}
template <class A>
GOCCL_DEVICE void max_kernel(typename A::type* d, typename A::type* d2, const typename A::type* a,
                             const typename A::type* b, u64 n, u32) {
	elementwise<typename A::type, 2>(d, d2, a, b, n, Max<A>());
}

#define GOCCL_POST(t, A)                                                                        \
	GOCCL_GLOBAL void goccl_post_##t(A::type* dst, const A::type* src, u64 count, u32 div) {  \
		if (div > 1) {                                                                        \
			Div<A> op = {(A::divisor)div};                                                    \
			elementwise<A::type, 1>(dst, (A::type*)0, src, (const A::type*)0, count, op);     \
		} else if (dst != src) {                                                              \
			elementwise<A::type, 1>(dst, (A::type*)0, src, (const A::type*)0, count,          \
			                        Ident<A::type>());                                        \
		}                                                                                     \
	}

// The element types in internal/kernels' Type order, with the names the
// entry points use.
#define GOCCL_TYPES(X) \
	X(i8, I8)          \
	X(u8, U8)          \
	X(i32, I32)        \
	X(u32, U32)        \
	X(i64, I64)        \
	X(u64, U64)        \
	X(f16, F16)        \
	X(f32, F32)        \
	X(f64, F64)        \
	X(bf16, BF16)

#define GOCCL_TYPE_KERNELS(t, A) \
	GOCCL_REDUCE(t, A, sum)      \
	GOCCL_REDUCE(t, A, prod)     \
	GOCCL_REDUCE(t, A, min)      \
	GOCCL_REDUCE(t, A, max)      \
	GOCCL_POST(t, A)

GOCCL_TYPES(GOCCL_TYPE_KERNELS)

GOCCL_GLOBAL void goccl_copy(u8* dst, u8* dst2, const u8* src, u64 nbytes) {
	elementwise<u8, 1>(dst, dst2, src, (const u8*)0, nbytes, Ident<u8>());
}
