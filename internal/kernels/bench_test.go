package kernels

import (
	"fmt"
	"strings"
	"testing"

	"github.com/goccl/goccl/internal/half"
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/gonum/floats"
)

// BenchmarkReduce measures Sum for every type, out of place (dst = a + b,
// three distinct buffers, as in a collective's recvReduceCopy step), beside
// baselines in the same run:
//
//	impl=kernel      Reduce(t, Sum): what the library uses
//	impl=portable    the portable Go kernel (forced)
//	impl=loop        a plain Go loop over typed slices
//	impl=copy        copy(dst, a): moves 2/3 of the bytes the others move
//	impl=gonum       float64: floats.AddTo(dst, a, b) (out of place);
//	                 float32: blas32.Axpy(1, a, dst) (in place, dst += a)
//	impl=kernel-inplace  float32/float64: Reduce(t, Sum)(dst, a, dst), the
//	                 same memory traffic as gonum's in-place Axpy
//
// Throughput (b.SetBytes) counts len(dst) once per call. Compare with
// `benchstat -col /impl`.
//
// Out of place, 1 MiB buffers make a 3 MiB working set, which does not fit
// a 2 MiB-per-core L2: those runs measure L3, where every implementation is
// close. On a 2-core VM the impl that runs first after the buffers are
// allocated (kernel) measured up to 10% slower there than the same code run
// alone; compare impls run in separate processes before reading much into
// small differences.
func BenchmarkReduce(b *testing.B) {
	sizes := []struct {
		name  string
		bytes int
	}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}, {"256MiB", 256 << 20}}
	for _, tp := range allTypes {
		for _, sz := range sizes {
			if sz.bytes > 1<<20 && testing.Short() {
				continue
			}
			var bufs *[3][]byte // allocated by the first sub-benchmark that runs
			for _, impl := range benchImpls(tp) {
				b.Run(fmt.Sprintf("type=%v/op=sum/bytes=%s/impl=%s", tp, sz.name, impl.name), func(b *testing.B) {
					if bufs == nil {
						bb := newBenchBufs(tp, sz.bytes)
						bufs = &bb
					}
					f := impl.make()
					d, x, y := bufs[0], bufs[1], bufs[2]
					b.SetBytes(int64(len(d)))
					for b.Loop() {
						f(d, x, y)
					}
				})
			}
		}
	}
}

// newBenchBufs returns dst, a, b filled with small ordinary values (ones),
// so that no float path meets a denormal, NaN or overflow.
func newBenchBufs(tp Type, n int) [3][]byte {
	var bufs [3][]byte
	var one uint64
	switch tp {
	case Float16:
		one = uint64(half.F32ToF16(1))
	case BFloat16:
		one = uint64(half.F32ToBF16(1))
	case Float32:
		one = 0x3f80_0000
	case Float64:
		one = 0x3ff0 << 48
	default:
		one = 1
	}
	for i := range bufs {
		buf := make([]byte, n)
		put(tp, buf, 0, one)
		for k := tp.Size(); k < n; k *= 2 {
			copy(buf[k:], buf[:k])
		}
		bufs[i] = buf
	}
	return bufs
}

type benchImpl struct {
	name string
	make func() Func
}

func benchImpls(tp Type) []benchImpl {
	impls := []benchImpl{
		{"kernel", func() Func { return Reduce(tp, Sum) }},
		{"portable", func() Func {
			forcePortable = true
			defer func() { forcePortable = false }()
			return Reduce(tp, Sum)
		}},
		{"loop", func() Func { return plainLoop(tp) }},
		{"copy", func() Func { return func(d, a, _ []byte) { copy(d, a) } }},
	}
	switch tp {
	case Float64:
		impls = append(impls,
			benchImpl{"gonum", func() Func {
				return func(d, a, b []byte) { floats.AddTo(view[float64](d), view[float64](a), view[float64](b)) }
			}},
			benchImpl{"kernel-inplace", func() Func {
				f := Reduce(tp, Sum)
				return func(d, a, _ []byte) { f(d, a, d) }
			}})
	case Float32:
		impls = append(impls,
			benchImpl{"gonum", func() Func {
				return func(d, a, _ []byte) {
					x := view[float32](a)
					blas32.Axpy(1, blas32.Vector{N: len(x), Inc: 1, Data: x}, blas32.Vector{N: len(x), Inc: 1, Data: view[float32](d)})
				}
			}},
			benchImpl{"kernel-inplace", func() Func {
				f := Reduce(tp, Sum)
				return func(d, a, _ []byte) { f(d, a, d) }
			}})
	}
	return impls
}

// plainLoop is the naive baseline: `for i := range d { d[i] = a[i] + b[i] }`
// over typed slices (for the 16-bit floats, through package half).
func plainLoop(tp Type) Func {
	switch tp {
	case Int8:
		return loopOf[int8]
	case Uint8:
		return loopOf[uint8]
	case Int32:
		return loopOf[int32]
	case Uint32:
		return loopOf[uint32]
	case Int64:
		return loopOf[int64]
	case Uint64:
		return loopOf[uint64]
	case Float32:
		return loopOf[float32]
	case Float64:
		return loopOf[float64]
	case Float16:
		return func(dst, a, b []byte) {
			d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
			for i := range d {
				d[i] = half.F32ToF16(half.F16ToF32(x[i]) + half.F16ToF32(y[i]))
			}
		}
	case BFloat16:
		return func(dst, a, b []byte) {
			d, x, y := view[uint16](dst), view[uint16](a), view[uint16](b)
			for i := range d {
				d[i] = half.F32ToBF16(half.BF16ToF32(x[i]) + half.BF16ToF32(y[i]))
			}
		}
	}
	panic("unreachable")
}

func loopOf[T number](dst, a, b []byte) {
	d, x, y := view[T](dst), view[T](a), view[T](b)
	for i := range d {
		d[i] = x[i] + y[i]
	}
}

// BenchmarkSmall measures the per-call cost on tiny buffers (an 8-byte
// all-reduce).
func BenchmarkSmall(b *testing.B) {
	for _, p := range paths() {
		if p.avx2 {
			continue // the same kernels as asm at this size
		}
		for _, tp := range []Type{Float32, Float64, Int32, Float16} {
			b.Run(fmt.Sprintf("path=%s/type=%v/bytes=8", p.name, tp), func(b *testing.B) {
				forcePortable = p.portable
				f := Reduce(tp, Sum)
				forcePortable = false
				bufs := newBenchBufs(tp, 8)
				b.SetBytes(8)
				for b.Loop() {
					f(bufs[0], bufs[1], bufs[2])
				}
			})
		}
	}
}

// BenchmarkOps measures every op at 1 MiB for the float types, where the
// ops differ most (Min/Max NaN handling, Avg's division).
func BenchmarkOps(b *testing.B) {
	for _, tp := range []Type{Float16, Float32, Float64, BFloat16, Int32, Int64} {
		bufs := newBenchBufs(tp, 1<<20)
		for _, op := range allOps {
			for _, p := range paths() {
				if p.avx2 {
					continue // the same kernels as asm: these do not stream
				}
				b.Run(fmt.Sprintf("type=%v/op=%v/bytes=1MiB/path=%s", tp, op, p.name), func(b *testing.B) {
					forcePortable = p.portable
					f := ReduceFinal(tp, op, 3)
					forcePortable = false
					b.SetBytes(1 << 20)
					for b.Loop() {
						f(bufs[0], bufs[1], bufs[2])
					}
				})
			}
		}
	}
}

// BenchmarkStream compares ordinary and streaming stores on buffers far
// larger than the caches (64 MiB), where streaming saves reading each
// destination line before writing it:
//
//	go test ./internal/kernels -run XXX -bench Stream -count 5
func BenchmarkStream(b *testing.B) {
	const n = 64 << 20
	d, x, y := make([]byte, n), make([]byte, n), make([]byte, n)
	for i := range n { // real pages, not the shared zero page
		d[i], x[i], y[i] = byte(i), byte(i>>8), byte(i>>16)
	}
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"reduce/float32/plain", func() { Reduce(Float32, Sum)(d, x, y) }},
		{"reduce/float32/stream", func() { ReduceStream(Float32, Sum)(d, x, y) }},
		{"copy/plain", func() { copy(d, x) }},
		{"copy/stream", func() { CopyStream(d, x) }},
	} {
		for _, avx2 := range []bool{false, true} {
			name := c.name
			if avx2 {
				if !strings.Contains(name, "stream") {
					continue
				}
				name += "/avx2"
			}
			b.Run(name, func(b *testing.B) {
				forceAVX2 = avx2
				defer func() { forceAVX2 = false }()
				b.SetBytes(n)
				for b.Loop() {
					c.f()
				}
			})
		}
	}
}
