package kernels

import (
	"sync"
	"unsafe"

	"github.com/goccl/goccl/internal/half"
)

// Portable Go kernels: used on every architecture without assembly, under
// the purego build tag, and on amd64 for the combinations the assembly does
// not cover (8-bit products, integer Avg) or CPUs without AVX2.
//
// The loops are unrolled by four by hand (the Go compiler does not unroll)
// and written so that the compiler can drop the bounds checks; generic
// functions are instantiated once per distinct element type (GC shape), so
// each gets its own machine code.

type integer interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64
}

type number interface {
	integer | ~float32 | ~float64
}

// view reinterprets b as a slice of T. The caller's buffers come from typed
// slices of T, and unaligned access is fine on the architectures goccl
// supports.
func view[T any](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))/unsafe.Sizeof(z))
}

// portable is indexed by Type and Op (Sum, Prod, Min, Max; Avg maps to Sum).
var portable = [numTypes][Avg]Func{
	Int8:     {sumGo[int8], prodGo[int8], minGo[int8], maxGo[int8]},
	Uint8:    {sumGo[uint8], prodGo[uint8], minGo[uint8], maxGo[uint8]},
	Int32:    {sumGo[int32], prodGo[int32], minGo[int32], maxGo[int32]},
	Uint32:   {sumGo[uint32], prodGo[uint32], minGo[uint32], maxGo[uint32]},
	Int64:    {sumGo[int64], prodGo[int64], minGo[int64], maxGo[int64]},
	Uint64:   {sumGo[uint64], prodGo[uint64], minGo[uint64], maxGo[uint64]},
	Float16:  {sumF16Go, prodF16Go, minF16Go, maxF16Go},
	Float32:  {sumGo[float32], prodGo[float32], minGo[float32], maxGo[float32]},
	Float64:  {sumGo[float64], prodGo[float64], minGo[float64], maxGo[float64]},
	BFloat16: {sumBF16Go, prodBF16Go, minBF16Go, maxBF16Go},
	Float8E4M3: {fp8Op(e4m3, func(a, b float32) float32 { return a + b }), fp8Op(e4m3, func(a, b float32) float32 { return a * b }),
		fp8Op(e4m3, func(a, b float32) float32 { return min(a, b) }), fp8Op(e4m3, func(a, b float32) float32 { return max(a, b) })},
	Float8E5M2: {fp8Op(e5m2, func(a, b float32) float32 { return a + b }), fp8Op(e5m2, func(a, b float32) float32 { return a * b }),
		fp8Op(e5m2, func(a, b float32) float32 { return min(a, b) }), fp8Op(e5m2, func(a, b float32) float32 { return max(a, b) })},
}

// fp8 is one 8-bit float format's conversions.
type fp8 struct {
	to   func(float32) uint8
	from *[256]float32
}

var (
	e4m3 = fp8{half.F32ToE4M3, half.E4M3Table()}
	e5m2 = fp8{half.F32ToE5M2, half.E5M2Table()}
)

// fp8Op is a kernel on 8-bit floats: each result is the float8 nearest to
// the float32 operation on the two operands widened, as on a GPU that
// widens (NCCL does). With 256 values per operand the whole operation is
// a table of 65536 results, made on first use (64 KiB per type and
// operator): one load per element. Computing each element (widen, combine,
// round back through round8's branches) measured 17 ns per element, a
// tenth of float16's speed; the table is as fast as int8's sum.
func fp8Op(f fp8, op func(a, b float32) float32) Func {
	table := sync.OnceValue(func() *[1 << 16]uint8 {
		var t [1 << 16]uint8
		for i := range t {
			t[i] = f.to(op(f.from[i>>8], f.from[i&0xff]))
		}
		return &t
	})
	return func(dst, a, b []byte) {
		t := table()
		a, b = a[:len(dst)], b[:len(dst)]
		for i := range dst {
			dst[i] = t[uint16(a[i])<<8|uint16(b[i])]
		}
	}
}

// fp8Tables caches Avg's tables by format and n (a communicator's size):
// ReduceFinal and Post are asked for them at every operation.
var fp8Tables sync.Map // fp8Key → *[1 << 16]uint8 (Avg) or *[256]uint8 (Post)

type fp8Key struct {
	format *[256]float32 // by its decoding table
	n      int
	post   bool
}

func avgFP8(f fp8, n int) Func {
	k := fp8Key{f.from, n, false}
	v, ok := fp8Tables.Load(k)
	if !ok {
		div := float32(n)
		var t [1 << 16]uint8
		for i := range t {
			t[i] = f.to((f.from[i>>8] + f.from[i&0xff]) / div)
		}
		v, _ = fp8Tables.LoadOrStore(k, &t)
	}
	t := v.(*[1 << 16]uint8)
	return func(dst, a, b []byte) {
		a, b = a[:len(dst)], b[:len(dst)]
		for i := range dst {
			dst[i] = t[uint16(a[i])<<8|uint16(b[i])]
		}
	}
}

func postFP8(f fp8, n int) func(dst, src []byte) {
	k := fp8Key{f.from, n, true}
	v, ok := fp8Tables.Load(k)
	if !ok {
		div := float32(n)
		var t [256]uint8
		for i := range t {
			t[i] = f.to(f.from[i] / div)
		}
		v, _ = fp8Tables.LoadOrStore(k, &t)
	}
	t := v.(*[256]uint8)
	return func(dst, src []byte) {
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = t[src[i]]
		}
	}
}

func sumGo[T number](dst, a, b []byte) {
	d, x, y := view[T](dst), view[T](a), view[T](b)
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d[i] = x[i] + y[i]
		d[i+1] = x[i+1] + y[i+1]
		d[i+2] = x[i+2] + y[i+2]
		d[i+3] = x[i+3] + y[i+3]
	}
	for ; i < len(d); i++ {
		d[i] = x[i] + y[i]
	}
}

func prodGo[T number](dst, a, b []byte) {
	d, x, y := view[T](dst), view[T](a), view[T](b)
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d[i] = x[i] * y[i]
		d[i+1] = x[i+1] * y[i+1]
		d[i+2] = x[i+2] * y[i+2]
		d[i+3] = x[i+3] * y[i+3]
	}
	for ; i < len(d); i++ {
		d[i] = x[i] * y[i]
	}
}

// minGo and maxGo use the built-in min and max, which for floating-point
// operands return NaN if either is NaN (Go specification, "Min and max"):
// exactly the contract, and what the assembly does.
func minGo[T number](dst, a, b []byte) {
	d, x, y := view[T](dst), view[T](a), view[T](b)
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d[i] = min(x[i], y[i])
		d[i+1] = min(x[i+1], y[i+1])
		d[i+2] = min(x[i+2], y[i+2])
		d[i+3] = min(x[i+3], y[i+3])
	}
	for ; i < len(d); i++ {
		d[i] = min(x[i], y[i])
	}
}

func maxGo[T number](dst, a, b []byte) {
	d, x, y := view[T](dst), view[T](a), view[T](b)
	x, y = x[:len(d)], y[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d[i] = max(x[i], y[i])
		d[i+1] = max(x[i+1], y[i+1])
		d[i+2] = max(x[i+2], y[i+2])
		d[i+3] = max(x[i+3], y[i+3])
	}
	for ; i < len(d); i++ {
		d[i] = max(x[i], y[i])
	}
}

// 16-bit floating point: widen to float32, operate, round back once.

func sumF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToF16(half.F16ToF32(x[i]) + half.F16ToF32(y[i]))
	}
}

func prodF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToF16(half.F16ToF32(x[i]) * half.F16ToF32(y[i]))
	}
}

func minF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToF16(min(half.F16ToF32(x[i]), half.F16ToF32(y[i])))
	}
}

func maxF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToF16(max(half.F16ToF32(x[i]), half.F16ToF32(y[i])))
	}
}

func sumBF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToBF16(half.BF16ToF32(x[i]) + half.BF16ToF32(y[i]))
	}
}

func prodBF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToBF16(half.BF16ToF32(x[i]) * half.BF16ToF32(y[i]))
	}
}

func minBF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToBF16(min(half.BF16ToF32(x[i]), half.BF16ToF32(y[i])))
	}
}

func maxBF16Go(dst, a, b []byte) {
	d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
	x, y = x[:len(d)], y[:len(d)]
	for i := range d {
		d[i] = half.F32ToBF16(max(half.BF16ToF32(x[i]), half.BF16ToF32(y[i])))
	}
}

// Avg. Integers: wrapped sum in the type, then division in a type wide
// enough for n (int64 or uint64), truncating toward zero like Go's / and
// NCCL's FuncSumPostDiv (src/device/reduce_kernel.h). The quotient's
// magnitude is at most the sum's, so converting back to T is exact.

func avgSigned[T ~int8 | ~int32 | ~int64](n int) Func {
	div := int64(n)
	return func(dst, a, b []byte) {
		d, x, y := view[T](dst), view[T](a), view[T](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = T(int64(x[i]+y[i]) / div)
		}
	}
}

func avgUnsigned[T ~uint8 | ~uint32 | ~uint64](n int) Func {
	div := uint64(n)
	return func(dst, a, b []byte) {
		d, x, y := view[T](dst), view[T](a), view[T](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = T(uint64(x[i]+y[i]) / div)
		}
	}
}

func avgFloat[T ~float32 | ~float64](n int) Func {
	div := T(n)
	return func(dst, a, b []byte) {
		d, x, y := view[T](dst), view[T](a), view[T](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			// Go rounds each float32 operation to float32, and the
			// specification allows fusing only x*y+z, so this is the
			// two roundings the contract asks for.
			d[i] = (x[i] + y[i]) / div
		}
	}
}

func avgF16(n int) Func {
	div := float32(n)
	return func(dst, a, b []byte) {
		d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = half.F32ToF16((half.F16ToF32(x[i]) + half.F16ToF32(y[i])) / div)
		}
	}
}

func avgBF16(n int) Func {
	div := float32(n)
	return func(dst, a, b []byte) {
		d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = half.F32ToBF16((half.BF16ToF32(x[i]) + half.BF16ToF32(y[i])) / div)
		}
	}
}

func portableAvg(t Type, n int) Func {
	switch t {
	case Int8:
		return avgSigned[int8](n)
	case Uint8:
		return avgUnsigned[uint8](n)
	case Int32:
		return avgSigned[int32](n)
	case Uint32:
		return avgUnsigned[uint32](n)
	case Int64:
		return avgSigned[int64](n)
	case Uint64:
		return avgUnsigned[uint64](n)
	case Float16:
		return avgF16(n)
	case Float32:
		return avgFloat[float32](n)
	case Float64:
		return avgFloat[float64](n)
	case BFloat16:
		return avgBF16(n)
	case Float8E4M3:
		return avgFP8(e4m3, n)
	case Float8E5M2:
		return avgFP8(e5m2, n)
	}
	panic("unreachable")
}

// Post (dst = src / n).

func postSigned[T ~int8 | ~int32 | ~int64](n int) func(dst, src []byte) {
	div := int64(n)
	return func(dst, src []byte) {
		d, s := view[T](dst), view[T](src)
		s = s[:len(d)]
		for i := range d {
			d[i] = T(int64(s[i]) / div)
		}
	}
}

func postUnsigned[T ~uint8 | ~uint32 | ~uint64](n int) func(dst, src []byte) {
	div := uint64(n)
	return func(dst, src []byte) {
		d, s := view[T](dst), view[T](src)
		s = s[:len(d)]
		for i := range d {
			d[i] = T(uint64(s[i]) / div)
		}
	}
}

func postFloat[T ~float32 | ~float64](n int) func(dst, src []byte) {
	div := T(n)
	return func(dst, src []byte) {
		d, s := view[T](dst), view[T](src)
		s = s[:len(d)]
		for i := range d {
			d[i] = s[i] / div
		}
	}
}

func postF16(n int) func(dst, src []byte) {
	div := float32(n)
	return func(dst, src []byte) {
		d, s := view[uint16](dst), view[uint16](src)
		s = s[:len(d)]
		for i := range d {
			d[i] = half.F32ToF16(half.F16ToF32(s[i]) / div)
		}
	}
}

func postBF16(n int) func(dst, src []byte) {
	div := float32(n)
	return func(dst, src []byte) {
		d, s := view[uint16](dst), view[uint16](src)
		s = s[:len(d)]
		for i := range d {
			d[i] = half.F32ToBF16(half.BF16ToF32(s[i]) / div)
		}
	}
}

func portablePost(t Type, n int) func(dst, src []byte) {
	switch t {
	case Int8:
		return postSigned[int8](n)
	case Uint8:
		return postUnsigned[uint8](n)
	case Int32:
		return postSigned[int32](n)
	case Uint32:
		return postUnsigned[uint32](n)
	case Int64:
		return postSigned[int64](n)
	case Uint64:
		return postUnsigned[uint64](n)
	case Float16:
		return postF16(n)
	case Float32:
		return postFloat[float32](n)
	case Float64:
		return postFloat[float64](n)
	case BFloat16:
		return postBF16(n)
	case Float8E4M3:
		return postFP8(e4m3, n)
	case Float8E5M2:
		return postFP8(e5m2, n)
	}
	panic("unreachable")
}
