package kernels

import (
	"math"
	"sync"

	"github.com/goccl/goccl/internal/half"
)

// Scaled kernels make a pre-multiplied sum (NCCL's
// ncclRedOpCreatePreMulSum): every rank's input multiplied by its own
// scalar s, then summed. The engine folds the multiplication into the
// steps that read the input, so the input is read once and no scaled copy
// of it is written: ScaledSum where a step adds the input to a received
// value, Scale where it copies the input on (the first contribution of a
// ring or a tree leaf).
//
// Rounding is exactly what scaling the input first and summing it then
// gives, on every type: the product b·s is rounded to the type, then the
// sum is. So two ranks that each add the other's scaled term to their own
// (recursive doubling, the one-shot exchange) get the same bits, one
// having scaled its term into the slot it sent and the other as it adds.
//
//   - Float32 and Float64: never a fused multiply-add (the assembly uses
//     separate multiply and add instructions; the Go code converts the
//     product to its type, which the specification says rounds it).
//   - Float16, BFloat16 and the float8 types: b is widened to float32 and
//     multiplied there, the product rounded to the type (and widened
//     back, exactly), then added in float32 and rounded once more.
//   - Integers: s is converted to the type (through int64, truncating
//     toward zero), and the product and the sum wrap around.
//
// Buffer rules are those of Func (and, for Scale, Post). The functions
// returned do not allocate and are safe for concurrent use on disjoint
// destinations.

// ScaledSum returns the kernel computing dst[i] = a[i] + b[i]·s.
func ScaledSum(t Type, s float64) Func {
	mustValid(t, Sum)
	if !forcePortable {
		if f := archScaledSum(t, s); f != nil {
			return f
		}
	}
	return portableScaledSum(t, s)
}

// ScaledSumStream is ScaledSum writing dst with streaming stores.
func ScaledSumStream(t Type, s float64) Func {
	plain := ScaledSum(t, s)
	if !forcePortable {
		if nt := archScaledSumStream(t, s); nt != nil {
			return streamed(nt, plain, t.Size())
		}
	}
	return plain
}

// ScaledSumStream2 is ScaledSum writing dst with streaming stores and
// dst2, in the same pass, with ordinary ones.
func ScaledSumStream2(t Type, s float64) Func2 {
	plain := ScaledSum(t, s)
	if !forcePortable {
		if nt := archScaledSumStream2(t, s); nt != nil {
			return streamed2(nt, plain, t.Size())
		}
	}
	return copied(plain)
}

// Scale returns a function computing dst[i] = src[i]·s; dst may be
// exactly src.
func Scale(t Type, s float64) func(dst, src []byte) {
	mustValid(t, Sum)
	if !forcePortable {
		if f := archScale(t, s); f != nil {
			return f
		}
	}
	return portableScale(t, s)
}

func portableScaledSum(t Type, s float64) Func {
	switch t {
	case Int8:
		return scaledSumInt[int8](s)
	case Uint8:
		return scaledSumInt[uint8](s)
	case Int32:
		return scaledSumInt[int32](s)
	case Uint32:
		return scaledSumInt[uint32](s)
	case Int64:
		return scaledSumInt[int64](s)
	case Uint64:
		return scaledSumInt[uint64](s)
	case Float32:
		return scaledSumFloat(float32(s))
	case Float64:
		return scaledSumFloat(s)
	case Float16:
		return scaledSum16(half.F16ToF32, half.F32ToF16, float32(s))
	case BFloat16:
		return scaledSum16(half.BF16ToF32, half.F32ToBF16, float32(s))
	case Float8E4M3:
		return scaledFP8(e4m3, float32(s))
	case Float8E5M2:
		return scaledFP8(e5m2, float32(s))
	}
	panic("unreachable")
}

func portableScale(t Type, s float64) func(dst, src []byte) {
	switch t {
	case Int8:
		return scaleInt[int8](s)
	case Uint8:
		return scaleInt[uint8](s)
	case Int32:
		return scaleInt[int32](s)
	case Uint32:
		return scaleInt[uint32](s)
	case Int64:
		return scaleInt[int64](s)
	case Uint64:
		return scaleInt[uint64](s)
	case Float32:
		return scaleFloat(float32(s))
	case Float64:
		return scaleFloat(s)
	case Float16:
		return scale16(half.F16ToF32, half.F32ToF16, float32(s))
	case BFloat16:
		return scale16(half.BF16ToF32, half.F32ToBF16, float32(s))
	case Float8E4M3:
		return scaleFP8(e4m3, float32(s))
	case Float8E5M2:
		return scaleFP8(e5m2, float32(s))
	}
	panic("unreachable")
}

// intScalar is s in the integer type T: truncated toward zero to int64,
// then its low bits (a negative scalar wraps in an unsigned type).
func intScalar[T integer](s float64) T { return T(int64(s)) }

func scaledSumInt[T integer](s float64) Func {
	m := intScalar[T](s)
	return func(dst, a, b []byte) {
		d, x, y := view[T](dst), view[T](a), view[T](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = x[i] + y[i]*m
		}
	}
}

func scaleInt[T integer](s float64) func(dst, src []byte) {
	m := intScalar[T](s)
	return func(dst, src []byte) {
		d, x := view[T](dst), view[T](src)
		x = x[:len(d)]
		for i := range d {
			d[i] = x[i] * m
		}
	}
}

func scaledSumFloat[T ~float32 | ~float64](m T) Func {
	return func(dst, a, b []byte) {
		d, x, y := view[T](dst), view[T](a), view[T](b)
		x, y = x[:len(d)], y[:len(d)]
		i := 0
		// T(...) rounds the product before the addition: without it the
		// compiler may fuse the two into one multiply-add.
		for ; i+4 <= len(d); i += 4 {
			d[i] = x[i] + T(y[i]*m)
			d[i+1] = x[i+1] + T(y[i+1]*m)
			d[i+2] = x[i+2] + T(y[i+2]*m)
			d[i+3] = x[i+3] + T(y[i+3]*m)
		}
		for ; i < len(d); i++ {
			d[i] = x[i] + T(y[i]*m)
		}
	}
}

func scaleFloat[T ~float32 | ~float64](m T) func(dst, src []byte) {
	return func(dst, src []byte) {
		d, x := view[T](dst), view[T](src)
		x = x[:len(d)]
		for i := range d {
			d[i] = x[i] * m
		}
	}
}

func scaledSum16(widen func(uint16) float32, narrow func(float32) uint16, m float32) Func {
	return func(dst, a, b []byte) {
		d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = narrow(widen(x[i]) + widen(narrow(widen(y[i])*m)))
		}
	}
}

func scale16(widen func(uint16) float32, narrow func(float32) uint16, m float32) func(dst, src []byte) {
	return func(dst, src []byte) {
		d, x := view[uint16](dst), view[uint16](src)
		x = x[:len(d)]
		for i := range d {
			d[i] = narrow(widen(x[i]) * m)
		}
	}
}

// scaledTables caches the 8-bit floats' tables by format and scalar (the
// engine asks for them again whenever the scalar changes), up to
// maxScaledTables of them: a job that makes a PreMulSum per step with a
// new factor must not grow it without bound.
var scaledTables struct {
	mu sync.Mutex
	m  map[scaledKey]any // *[1 << 16]uint8 (ScaledSum) or *[256]uint8 (Scale)
}

const maxScaledTables = 16

// scaledTable returns the cached table for k, making it with build.
func scaledTable(k scaledKey, build func() any) any {
	scaledTables.mu.Lock()
	defer scaledTables.mu.Unlock()
	if t, ok := scaledTables.m[k]; ok {
		return t
	}
	if scaledTables.m == nil || len(scaledTables.m) >= maxScaledTables {
		scaledTables.m = map[scaledKey]any{}
	}
	t := build()
	scaledTables.m[k] = t
	return t
}

type scaledKey struct {
	format *[256]float32
	bits   uint32 // the float32 scalar's bits
	unary  bool
}

// scaledFP8 is ScaledSum on an 8-bit float: as its other kernels, a table
// of the 65536 results.
func scaledFP8(f fp8, m float32) Func {
	t := scaledTable(scaledKey{f.from, math.Float32bits(m), false}, func() any {
		var t [1 << 16]uint8
		for i := range t {
			t[i] = f.to(f.from[i>>8] + f.from[f.to(f.from[i&0xff]*m)])
		}
		return &t
	}).(*[1 << 16]uint8)
	return func(dst, a, b []byte) {
		a, b = a[:len(dst)], b[:len(dst)]
		for i := range dst {
			dst[i] = t[uint16(a[i])<<8|uint16(b[i])]
		}
	}
}

func scaleFP8(f fp8, m float32) func(dst, src []byte) {
	t := scaledTable(scaledKey{f.from, math.Float32bits(m), true}, func() any {
		var t [256]uint8
		for i := range t {
			t[i] = f.to(f.from[i] * m)
		}
		return &t
	}).(*[256]uint8)
	return func(dst, src []byte) {
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = t[src[i]]
		}
	}
}
