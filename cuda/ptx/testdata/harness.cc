// harness.cc runs reduce.cu's kernels on the host for ptx_test.go.
//
// Built as: c++ -std=c++17 -O2 -ffp-contract=off -DGOCCL_ARCH=700|900
// testdata/harness.cc (it includes ../reduce.cu, which includes host.h).
//
// Mode "jobs" (the default) reads jobs from stdin until a zero word and
// writes one result per job to stdout, all little-endian:
//
//	job:    u32 magic 0x424f4a47 ("GJOB"), u8 kind (0 reduce, 1 post,
//	        2 copy), u8 type (internal/kernels' Type), u8 op (Sum, Prod,
//	        Min, Max), u8 flags (1: dst2 present, 2: dst is a, 4: dst is b),
//	        u32 div, u64 count (elements; bytes for copy), u8 offset[4]
//	        (of dst, dst2, a, b from a 64-byte-aligned address), u32 grid,
//	        u32 block, then a's bytes and (reduce only) b's bytes.
//	result: u32 faults (host.h's host_fault bits 1, 2, 4; 8: a byte next
//	        to an output changed; 16: an input that is not the output
//	        changed), then dst's bytes and, if present, dst2's.
//
// Mode "exhaustive lo hi" checks the native 16-bit sums and products
// against the float32 path for all pairs of operands, the first in
// [lo, hi) (TestExhaustive16).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reduce.cu"

u32 host_tid, host_ntid, host_ctaid, host_nctaid;
HostRange host_in[2], host_out[2];
u32 host_fault;

typedef void (*ReduceFn)(void*, void*, const void*, const void*, u64, u32);
typedef void (*PostFn)(void*, const void*, u64, u32);

#define RF(t, A, op)                                                                     \
	[](void* d, void* d2, const void* a, const void* b, u64 n, u32 div) {                \
		goccl_reduce_##t##_##op((A::type*)d, (A::type*)d2, (const A::type*)a,           \
		                        (const A::type*)b, n, div);                             \
	}
#define REDUCE_ROW(t, A) {RF(t, A, sum), RF(t, A, prod), RF(t, A, min), RF(t, A, max)},
static const ReduceFn reduce_fns[][4] = {GOCCL_TYPES(REDUCE_ROW)};

#define POST_ENTRY(t, A)                                                              \
	[](void* d, const void* s, u64 n, u32 div) {                                      \
		goccl_post_##t((A::type*)d, (const A::type*)s, n, div);                       \
	},
static const PostFn post_fns[] = {GOCCL_TYPES(POST_ENTRY)};

#define SIZE_ENTRY(t, A) (int)sizeof(A::type),
static const int type_size[] = {GOCCL_TYPES(SIZE_ENTRY)};
static const int ntypes = sizeof(type_size) / sizeof(type_size[0]);

static void die(const char* msg) {
	fprintf(stderr, "harness: %s\n", msg);
	exit(2);
}

static void readfull(void* p, size_t n) {
	if (n && fread(p, 1, n, stdin) != n) die("short read");
}
static void writefull(const void* p, size_t n) {
	if (n && fwrite(p, 1, n, stdout) != n) die("short write");
}

// A buffer with 64 guard bytes on each side of [p, p+n).
struct Buf {
	u8* base;
	u8* p;
	size_t n, total;
};
static const u8 canary = 0xa5;
static const size_t guard = 64;

static Buf alloc(size_t n, int off) {
	Buf b;
	b.total = guard + off + n + guard;
	if (posix_memalign((void**)&b.base, 64, b.total)) die("out of memory");
	memset(b.base, canary, b.total);
	b.p = b.base + guard + off;
	b.n = n;
	return b;
}

static bool guards_intact(const Buf& b) {
	for (u8* q = b.base; q < b.p; q++)
		if (*q != canary) return false;
	for (u8* q = b.p + b.n; q < b.base + b.total; q++)
		if (*q != canary) return false;
	return true;
}

template <class F>
static void launch(u32 grid, u32 block, F f) {
	host_nctaid = grid;
	host_ntid = block;
	for (u32 c = 0; c < grid; c++)
		for (u32 t = 0; t < block; t++) {
			host_ctaid = c;
			host_tid = t;
			f();
		}
}

static int jobs() {
	for (;;) {
		u32 magic;
		readfull(&magic, 4);
		if (magic == 0) break;
		if (magic != 0x424f4a47) die("bad magic");
		u8 hdr[4], off[4];
		u32 div, grid, block;
		u64 count;
		readfull(hdr, 4);
		readfull(&div, 4);
		readfull(&count, 8);
		readfull(off, 4);
		readfull(&grid, 4);
		readfull(&block, 4);
		int kind = hdr[0], type = hdr[1], op = hdr[2], flags = hdr[3];
		if (kind > 2 || type >= ntypes || op > 3 || grid == 0 || block == 0) die("bad job");
		size_t n = kind == 2 ? count : count * type_size[type];
		bool two = kind == 0, has2 = flags & 1, isa = flags & 2, isb = flags & 4;

		Buf a = alloc(n, off[2]), b = alloc(two ? n : 0, off[3]);
		readfull(a.p, n);
		if (two) readfull(b.p, n);
		Buf ac = alloc(n, 0), bc = alloc(two ? n : 0, 0);
		memcpy(ac.p, a.p, n);
		if (two) memcpy(bc.p, b.p, n);
		Buf d = isa ? a : isb ? b : alloc(n, off[0]);
		Buf d2 = alloc(has2 ? n : 0, off[1]);

		host_fault = 0;
		host_in[0] = {(uptr)a.p, (uptr)a.p + n};
		host_in[1] = two ? HostRange{(uptr)b.p, (uptr)b.p + n} : HostRange{0, 0};
		host_out[0] = {(uptr)d.p, (uptr)d.p + n};
		host_out[1] = has2 ? HostRange{(uptr)d2.p, (uptr)d2.p + n} : HostRange{0, 0};
		void* d2p = has2 ? d2.p : 0;
		if (kind == 0) {
			ReduceFn f = reduce_fns[type][op];
			launch(grid, block, [&] { f(d.p, d2p, a.p, b.p, count, div); });
		} else if (kind == 1) {
			PostFn f = post_fns[type];
			launch(grid, block, [&] { f(d.p, a.p, count, div); });
		} else {
			launch(grid, block, [&] { goccl_copy(d.p, (u8*)d2p, a.p, count); });
		}

		u32 faults = host_fault;
		if (!guards_intact(d) || (has2 && !guards_intact(d2))) faults |= 8;
		if (!isa && (memcmp(a.p, ac.p, n) || !guards_intact(a))) faults |= 16;
		if (two && !isb && (memcmp(b.p, bc.p, n) || !guards_intact(b))) faults |= 16;
		writefull(&faults, 4);
		writefull(d.p, n);
		if (has2) writefull(d2.p, n);
		// The test sends the next job only after it has this result.
		fflush(stdout);

		free(a.base);
		free(b.base);
		free(ac.base);
		free(bc.base);
		if (!isa && !isb) free(d.base);
		free(d2.base);
	}
	fflush(stdout);
	return 0;
}

// exhaustive compares, for every pair of 16-bit operands, the sum and the
// product each PTX module computes (F16::sum, BF16::sum, ...: native where
// GOCCL_ARCH has the instruction) with the float32 path of internal/kernels'
// reference (widen, combine in float32, round). Round-to-nearest-even is
// symmetric in sign and both operations commute, so it takes first
// operands a in [lo, hi) with the sign bit clear and second operands b
// from a up, with either sign; a caller splits [0, 0x8000) among processes.
static bool same16(u16 x, u16 y, u16 quiet, u16 expmask) {
	bool xn = (x & 0x7fff) > expmask, yn = (y & 0x7fff) > expmask;
	if (xn || yn) return xn && yn && (x & quiet);
	return x == y;
}

static int exhaustive(u32 lo, u32 hi) {
	long bad = 0;
	for (u32 a = lo; a < hi && a < 0x8000; a++) {
		for (u32 bm = a; bm < 0x8000; bm++) {
			for (u32 s = 0; s < 2; s++) {
				u16 x = (u16)a, y = (u16)(bm | s << 15);
				u16 hs = F16::sum(x, y), hp = F16::prod(x, y);
				u16 bs = BF16::sum(x, y), bp = BF16::prod(x, y);
				u16 rhs = f2h(fadd(h2f(x), h2f(y))), rhp = f2h(fmul(h2f(x), h2f(y)));
				u16 rbs = f2b(fadd(b2f(x), b2f(y))), rbp = f2b(fmul(b2f(x), b2f(y)));
				bool ok = same16(hs, rhs, 0x0200, 0x7c00) && same16(hp, rhp, 0x0200, 0x7c00) &&
				          same16(bs, rbs, 0x0040, 0x7f80) && same16(bp, rbp, 0x0040, 0x7f80);
				if (!ok && bad++ < 10)
					printf("mismatch %04x %04x: f16 sum %04x/%04x prod %04x/%04x, "
					       "bf16 sum %04x/%04x prod %04x/%04x\n",
					       x, y, hs, rhs, hp, rhp, bs, rbs, bp, rbp);
			}
		}
	}
	printf("sm_%d, first operands [%#x, %#x): %ld mismatches\n", GOCCL_ARCH / 10, lo, hi, bad);
	return bad != 0;
}

int main(int argc, char** argv) {
	if (argc == 4 && strcmp(argv[1], "exhaustive") == 0)
		return exhaustive((u32)strtoul(argv[2], 0, 0), (u32)strtoul(argv[3], 0, 0));
	if (argc != 1) die("usage: harness [exhaustive lo hi] (jobs on stdin)");
	return jobs();
}
