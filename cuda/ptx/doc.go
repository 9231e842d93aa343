// Package ptx holds goccl's CUDA kernels, the device counterparts of
// internal/kernels: element-wise reduction (sum, product, min, max, and
// Avg's final division), division by the number of contributions, and
// copy. They are CUDA C in reduce.cu, compiled to PTX with Debian's
// clang-16 (no CUDA SDK) and embedded: reduce_sm70.ptx for compute
// capability 7.x and 8.x, reduce_sm90.ptx for 9.0 and later. Package cuda
// loads the module For returns and launches the kernels by name.
//
// The package has no cgo and does not touch a GPU; it is data plus names.
//
// # ABI
//
// Every kernel is extern "C"; T is the element type, named i8, u8, i32,
// u32, i64, u64, f16, f32, f64 and bf16 in the entry points (the order of
// kernels.Type). Parameters are the kernel's, in order; count is in
// elements, nbytes in bytes, and pointers are device (or mapped host)
// addresses:
//
//	goccl_reduce_<T>_<op>(T *dst, T *dst2, const T *a, const T *b,
//	                      u64 count, u32 div)    op: sum, prod, min, max
//	goccl_post_<T>(T *dst, const T *src, u64 count, u32 div)
//	goccl_copy(u8 *dst, u8 *dst2, const u8 *src, u64 nbytes)
//
// They compute:
//
//   - reduce: dst[i] = a[i] op b[i], and the same into dst2 unless dst2 is
//     NULL. With div > 1 the sum kernels compute (a[i]+b[i])/div instead
//     (Avg's final step, kernels.ReduceFinal(t, Avg, div)); the other ops
//     ignore div, as ReduceFinal ignores n for them. ReduceName maps Avg
//     to the sum kernel.
//   - post: dst[i] = src[i]/div (kernels.Post(t, Avg, div)); div <= 1
//     copies.
//   - copy: dst = src, and dst2 = src unless dst2 is NULL.
//
// # Obligations
//
//  1. Any grid and block size is correct (grid-stride loops); launch with
//     Grid(nbytes) blocks of BlockThreads threads for speed.
//  2. A kernel reads and writes only [p, p+count elements) of each of its
//     buffers. dst may be exactly a or b (post: exactly src); dst2 must
//     not overlap the others; other overlaps give unspecified results.
//  3. Buffers need no alignment: when all of them agree modulo 16 bytes
//     the body is 16-byte ld.global.nc.v4 / st.global.v4 (four per thread
//     in flight), with single elements for the unaligned head and the
//     tail; when they agree modulo 4 only, 4-byte units for elements
//     narrower than that; otherwise single elements; and a buffer that is
//     not aligned to its element size (a float32 at an odd address) is
//     handled a byte at a time rather than faulting.
//  4. Arithmetic is internal/kernels' contract (its doc.go, rules 3-6) bit
//     for bit, with its two freedoms only (which NaN; which zero from Min
//     or Max of -0 and +0): integers wrap; integer Avg truncates toward
//     zero in int64/uint64; float32 and float64 use add.rn, mul.rn and
//     div.rn (never a contracted fma, never a multiplication by 1/div, no
//     flush to zero); Min and Max return NaN if either operand is NaN.
//     16-bit NaN results are quiet.
//  5. Kernels keep no state between launches and may run concurrently on
//     disjoint outputs.
//
// # float16 and bfloat16: native or through float32
//
// internal/kernels widens 16-bit operands to float32 exactly, computes in
// float32 (rounding there) and rounds back once. A native 16-bit
// instruction rounds the exact result once. reduce.cu uses a native
// instruction only where the two provably agree, and says why at struct
// F16 and BF16:
//
//	             sm_70 module           sm_90 module
//	f16  sum     add.rn.f16             add.rn.f16
//	f16  prod    mul.rn.f16             mul.rn.f16
//	f16  min/max float32 compare        min.NaN/max.NaN.f16
//	bf16 sum     float32                add.rn.bf16
//	bf16 prod    float32                mul.rn.bf16
//	bf16 min/max float32 compare        min.NaN/max.NaN.bf16
//	avg, post    float32 (add.rn, div.rn, one rounding), both formats
//
// Products are exact in float32 (and bfloat16 products too small for it
// round to zero both ways), so the host rounds once. Sums are not always
// exact in float32, but double rounding through float32 is innocuous for
// 11- and 8-bit formats (Figueroa 1995: precision 24 >= 2p+2), and sums in
// the subnormal range are exact. Min and max are exact. add.rn.bf16 and
// mul.rn.bf16 exist from sm_90, min.NaN from sm_80, hence the two modules.
// Nothing else differs between them.
//
// # Regenerating and testing
//
// `go generate ./cuda/ptx/` (gen.go) runs clang-16 -x cuda
// --cuda-device-only -nocudainc -nocudalib -O3 -S for sm_70 and sm_90;
// the output is deterministic, and CI (.ci/run) regenerates it and fails
// if the committed files differ. ptxas is not available there, so the PTX
// is validated only by the JIT of a real driver (package cuda's GPU
// tests).
//
// Without a GPU, ptx_test.go compiles reduce.cu as host C++
// (testdata/host.h stands in for the PTX primitives, each written from the
// instruction's definition; testdata/harness.cc runs the grid's threads in
// turn) and compares every kernel with internal/kernels bit for bit, for
// both modules' choices, over random and special inputs, many sizes and
// every alignment; the host build also checks every load and store for
// alignment and bounds. TestExhaustive16 (GOCCL_PTX_EXHAUSTIVE=1) checks
// the native 16-bit sums and products against the float32 path for all
// 2^32 operand pairs.
package ptx
