package kernels

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/goccl/goccl/internal/half"
	"github.com/stretchr/testify/require"
)

var seedFlag = flag.Uint64("seed", 0, "seed for random inputs (0: time-based)")

// newRand returns a seeded source and arranges for the seed to be printed if
// the test fails, so that a failure can be replayed with -seed.
func newRand(t testing.TB) *rand.Rand {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed: %d (rerun with -seed=%d)", seed, seed)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

var allTypes = []Type{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, BFloat16, Float8E4M3, Float8E5M2}
var allOps = []Op{Sum, Prod, Min, Max, Avg}

// path selects the assembly or the portable kernels for the rest of the
// test; both run in the same `go test`.
type path struct {
	name     string
	portable bool
	avx2     bool // the AVX2 streaming kernels even where AVX-512 ones exist
}

func paths() []path {
	return []path{{"asm", false, false}, {"avx2", false, true}, {"portable", true, false}}
}

// eachKernel runs body as a subtest for every code path, every type of
// types and every op of ops.
func eachKernel(t *testing.T, types []Type, ops []Op, body func(t *testing.T, tp Type, op Op)) {
	for _, p := range paths() {
		for _, tp := range types {
			for _, op := range ops {
				t.Run(fmt.Sprintf("path=%s/type=%v/op=%v", p.name, tp, op), func(t *testing.T) {
					usePath(t, p)
					body(t, tp, op)
				})
			}
		}
	}
}

func usePath(t *testing.T, p path) {
	old, oldAVX2 := forcePortable, forceAVX2
	forcePortable, forceAVX2 = p.portable, p.avx2
	t.Cleanup(func() { forcePortable, forceAVX2 = old, oldAVX2 })
}

// --- element encoding, independent of the package's unsafe views ---

func get(t Type, b []byte, i int) uint64 {
	switch t.Size() {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	default:
		return binary.LittleEndian.Uint64(b[8*i:])
	}
}

func put(t Type, b []byte, i int, v uint64) {
	switch t.Size() {
	case 1:
		b[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
}

func isFloat(t Type) bool {
	return t == Float16 || t == Float32 || t == Float64 || t == BFloat16 || t == Float8E4M3 || t == Float8E5M2
}

func isSigned(t Type) bool { return t == Int8 || t == Int32 || t == Int64 }

// toF64 decodes a float element; exact for every float type.
func toF64(t Type, v uint64) float64 {
	switch t {
	case Float16:
		return float64(half.F16ToF32(uint16(v)))
	case BFloat16:
		return float64(half.BF16ToF32(uint16(v)))
	case Float8E4M3:
		return float64(half.E4M3ToF32(uint8(v)))
	case Float8E5M2:
		return float64(half.E5M2ToF32(uint8(v)))
	case Float32:
		return float64(math.Float32frombits(uint32(v)))
	default:
		return math.Float64frombits(v)
	}
}

// fromF32 encodes a float32 result for the 32-bit-or-narrower float types.
func fromF32(t Type, f float32) uint64 {
	switch t {
	case Float16:
		return uint64(half.F32ToF16(f))
	case BFloat16:
		return uint64(half.F32ToBF16(f))
	case Float8E4M3:
		return uint64(half.F32ToE4M3(f))
	case Float8E5M2:
		return uint64(half.F32ToE5M2(f))
	default:
		return uint64(math.Float32bits(f))
	}
}

// signExtend interprets the low bits of v as a value of t.
func signExtend(t Type, v uint64) int64 {
	bits := 8 * t.Size()
	return int64(v<<(64-bits)) >> (64 - bits)
}

func mask(t Type) uint64 {
	if t.Size() == 8 {
		return math.MaxUint64
	}
	return 1<<(8*t.Size()) - 1
}

// ref is the straightforward reference: one element, written from the
// contract rather than from the implementation. post: 0 means no division.
func ref(t Type, op Op, post int, a, b uint64) uint64 {
	if !isFloat(t) {
		var r uint64
		switch op {
		case Sum, Avg:
			r = a + b // wraps mod 2^64, then truncated below
		case Prod:
			r = a * b
		case Min, Max:
			less := a < b
			if isSigned(t) {
				less = signExtend(t, a) < signExtend(t, b)
			}
			if less == (op == Min) {
				r = a
			} else {
				r = b
			}
		}
		r &= mask(t)
		if post > 0 {
			if isSigned(t) {
				r = uint64(signExtend(t, r) / int64(post))
			} else {
				r /= uint64(post)
			}
		}
		return r & mask(t)
	}
	if t == Float64 {
		x, y := math.Float64frombits(a), math.Float64frombits(b)
		var r float64
		switch op {
		case Sum, Avg:
			r = x + y
		case Prod:
			r = x * y
		case Min:
			r = refMin(x, y)
		case Max:
			r = -refMin(-x, -y)
		}
		if post > 0 {
			r /= float64(post)
		}
		return math.Float64bits(r)
	}
	x, y := float32(toF64(t, a)), float32(toF64(t, b))
	var r float32
	switch op {
	case Sum, Avg:
		r = x + y
	case Prod:
		r = x * y
	case Min:
		r = float32(refMin(float64(x), float64(y)))
	case Max:
		r = float32(-refMin(-float64(x), -float64(y)))
	}
	if post > 0 {
		r /= float32(post)
	}
	return fromF32(t, r)
}

func refMin(x, y float64) float64 {
	switch {
	case x != x || y != y:
		return math.NaN()
	case x < y:
		return x
	default:
		return y
	}
}

// refPost is the reference for Post: one element divided by n.
func refPost(t Type, n int, v uint64) uint64 {
	switch t {
	case Float64:
		return math.Float64bits(math.Float64frombits(v) / float64(n))
	case Float32, Float16, BFloat16, Float8E4M3, Float8E5M2:
		return fromF32(t, float32(toF64(t, v))/float32(n))
	}
	if isSigned(t) {
		return uint64(signExtend(t, v)/int64(n)) & mask(t)
	}
	return v / uint64(n)
}

// same reports whether got is an acceptable result when want is the
// reference: NaN matches any NaN, and Min/Max of equal operands (-0, +0)
// may return either operand.
func same(t Type, op Op, a, b, got, want uint64) bool {
	if got == want {
		return true
	}
	if !isFloat(t) {
		return false
	}
	g, w := toF64(t, got), toF64(t, want)
	if g != g && w != w {
		return true
	}
	if (op == Min || op == Max) && toF64(t, a) == toF64(t, b) {
		return got == a || got == b
	}
	return false
}

// --- random inputs ---

var specialsCache = func() (m [numTypes][]uint64) {
	for _, t := range allTypes {
		m[t] = makeSpecials(t)
	}
	return m
}()

func makeSpecials(t Type) []uint64 {
	switch t {
	case Float16:
		return []uint64{0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x3c00, 0xbc00}
	case BFloat16:
		return []uint64{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f, 0x3f80, 0xbf80}
	case Float32:
		return []uint64{0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffc0_0000, 0x7f80_0001, 0x7f7f_ffff, 0xff7f_ffff, 1, 0x8000_0001, 0x3f80_0000}
	case Float8E4M3: // ±0, NaN, ±448, smallest subnormal, 1
		return []uint64{0x00, 0x80, 0x7f, 0xff, 0x7e, 0xfe, 0x01, 0x81, 0x38, 0xb8}
	case Float8E5M2: // ±0, ±Inf, NaN, ±57344, smallest subnormal, 1
		return []uint64{0x00, 0x80, 0x7c, 0xfc, 0x7e, 0xfe, 0x7b, 0xfb, 0x01, 0x81, 0x3c, 0xbc}
	case Float64:
		return []uint64{0, 1 << 63, 0x7ff0 << 48, 0xfff0 << 48, 0x7ff8 << 48, 0xfff8 << 48, 0x7ff0<<48 | 1, math.Float64bits(math.MaxFloat64), 1, math.Float64bits(-1)}
	}
	m := mask(t)
	return []uint64{0, 1, m, m >> 1, m>>1 + 1, 2, m - 1}
}

// randElem returns a random element of t: for floats a mix of ordinary
// values, arbitrary bit patterns (subnormals, huge, NaN payloads) and
// specials (±0, ±Inf, NaN); for integers random bits and extremes (so that
// sums and products overflow and wrap).
func randElem(r *rand.Rand, t Type) uint64 {
	sp := specialsCache[t]
	switch p := r.IntN(100); {
	case p < 10:
		return sp[r.IntN(len(sp))]
	case p < 30 || !isFloat(t):
		return r.Uint64() & mask(t)
	}
	v := r.NormFloat64() * math.Ldexp(1, r.IntN(21)-10)
	switch t {
	case Float64:
		return math.Float64bits(v)
	default:
		return fromF32(t, float32(v))
	}
}

func fill(r *rand.Rand, t Type, b []byte) {
	for i := range len(b) / t.Size() {
		put(t, b, i, randElem(r, t))
	}
}

// buffers returns three unaligned buffers of n elements (at random byte
// offsets inside larger allocations) with a guard area after each.
type buf struct {
	whole []byte
	off   int
	n     int // bytes
}

const guard = 40

func newBuf(r *rand.Rand, nbytes int) buf {
	off := r.IntN(8)
	w := make([]byte, off+nbytes+guard)
	for i := range w {
		w[i] = 0xa5
	}
	return buf{whole: w, off: off, n: nbytes}
}

func (b buf) bytes() []byte { return b.whole[b.off : b.off+b.n : b.off+b.n] }

func (b buf) checkGuard(t *testing.T, what string) {
	t.Helper()
	for i, c := range b.whole {
		if (i < b.off || i >= b.off+b.n) && c != 0xa5 {
			require.Failf(t, "guard overwritten", "%s: byte %d of the guard area (buffer at %d..%d) is %#x",
				what, i, b.off, b.off+b.n, c)
		}
	}
}

// smallLengths covers every way a length splits into unrolled blocks,
// single vectors and a scalar tail, for every element size.
func smallLengths() []int {
	var ls []int
	for n := 0; n <= 130; n++ {
		ls = append(ls, n)
	}
	return ls
}

// testLengths adds a few large ones, which run the unrolled loop many times.
func testLengths() []int {
	return append(smallLengths(), 255, 1000, 4099, 1<<14+3)
}

// alias is how dst relates to the inputs.
type alias int

const (
	outOfPlace alias = iota
	dstIsA
	dstIsB
)

func (a alias) String() string { return [...]string{"out-of-place", "dst=a", "dst=b"}[a] }

// checkBinary runs f on random inputs of every test length and every
// aliasing, comparing each element with ref(t, op, post, ...).
func checkBinary(t *testing.T, r *rand.Rand, tp Type, op Op, post int, f Func, lengths []int) {
	checkBinaryRef(t, r, tp, op, f, lengths, func(a, b uint64) uint64 { return ref(tp, op, post, a, b) })
}

// checkBinaryRef is checkBinary against the reference want; op only says
// which results same accepts.
func checkBinaryRef(t *testing.T, r *rand.Rand, tp Type, op Op, f Func, lengths []int, wantOf func(a, b uint64) uint64) {
	sz := tp.Size()
	for _, n := range lengths {
		for _, al := range []alias{outOfPlace, dstIsA, dstIsB} {
			ab, bb, db := newBuf(r, n*sz), newBuf(r, n*sz), newBuf(r, n*sz)
			a, b := ab.bytes(), bb.bytes()
			fill(r, tp, a)
			fill(r, tp, b)
			want := make([]uint64, n)
			for i := range want {
				want[i] = wantOf(get(tp, a, i), get(tp, b, i))
			}
			a0 := append([]byte(nil), a...)
			b0 := append([]byte(nil), b...)
			dst := db.bytes()
			switch al {
			case dstIsA:
				dst = a
			case dstIsB:
				dst = b
			}
			f(dst, a, b)
			for i := range n {
				x, y, got := get(tp, a0, i), get(tp, b0, i), get(tp, dst, i)
				if !same(tp, op, x, y, got, want[i]) {
					require.Failf(t, "wrong element",
						"n=%d %v element %d: %s(%#x, %#x) = %#x, want %#x (%g op %g = %g, want %g)",
						n, al, i, op, x, y, got, want[i], toF64Any(tp, x), toF64Any(tp, y), toF64Any(tp, got), toF64Any(tp, want[i]))
				}
			}
			ab.checkGuard(t, "a")
			bb.checkGuard(t, "b")
			db.checkGuard(t, "dst")
			if al != dstIsA {
				require.Truef(t, bytes.Equal(a0, a), "a modified")
			}
			if al != dstIsB {
				require.Truef(t, bytes.Equal(b0, b), "b modified")
			}
		}
	}
}

// checkUnary runs f (dst = g(src)) on random inputs of every test
// length, in place and not, comparing each element with want; op only
// says which results same accepts.
func checkUnary(t *testing.T, r *rand.Rand, tp Type, op Op, f func(dst, src []byte), want func(v uint64) uint64) {
	sz := tp.Size()
	for _, l := range testLengths() {
		for _, inPlace := range []bool{false, true} {
			sb, db := newBuf(r, l*sz), newBuf(r, l*sz)
			src := sb.bytes()
			fill(r, tp, src)
			src0 := append([]byte(nil), src...)
			dst := db.bytes()
			if inPlace {
				dst = src
			}
			f(dst, src)
			for i := range l {
				v, got := get(tp, src0, i), get(tp, dst, i)
				if w := want(v); !same(tp, op, v, v, got, w) {
					require.Failf(t, "wrong element", "len %d in-place %v element %d: f(%#x) = %#x, want %#x", l, inPlace, i, v, got, w)
				}
			}
			sb.checkGuard(t, "src")
			db.checkGuard(t, "dst")
		}
	}
}

func toF64Any(t Type, v uint64) float64 {
	if isFloat(t) {
		return toF64(t, v)
	}
	if isSigned(t) {
		return float64(signExtend(t, v))
	}
	return float64(v)
}

func TestReduce(t *testing.T) {
	eachKernel(t, allTypes, allOps, func(t *testing.T, tp Type, op Op) {
		r := newRand(t)
		checkBinary(t, r, tp, op, 0, Reduce(tp, op), testLengths())
	})
}

func TestReduceFinal(t *testing.T) {
	for _, p := range paths() {
		for _, tp := range allTypes {
			for _, op := range allOps {
				for _, n := range []int{1, 2, 3, 7} {
					if op != Avg && n != 3 {
						continue // n is ignored; one value is enough
					}
					t.Run(fmt.Sprintf("path=%s/type=%v/op=%v/n=%d", p.name, tp, op, n), func(t *testing.T) {
						usePath(t, p)
						r := newRand(t)
						if op != Avg {
							// ReduceFinal is Reduce, tested above.
							checkBinary(t, r, tp, op, 0, ReduceFinal(tp, op, n), smallLengths())
							return
						}
						checkBinary(t, r, tp, op, n, ReduceFinal(tp, op, n), testLengths())
					})
				}
			}
		}
	}
}

func TestPost(t *testing.T) {
	for _, p := range paths() {
		for _, tp := range allTypes {
			for _, n := range []int{1, 2, 3, 7, 1000} {
				t.Run(fmt.Sprintf("path=%s/type=%v/n=%d", p.name, tp, n), func(t *testing.T) {
					usePath(t, p)
					r := newRand(t)
					for _, op := range []Op{Sum, Prod, Min, Max} {
						require.Nil(t, Post(tp, op, n), "Post(%v, %v, %d) must be the identity", tp, op, n)
					}
					f := Post(tp, Avg, n)
					if n == 1 {
						require.Nil(t, f)
						return
					}
					require.NotNil(t, f)
					checkUnary(t, r, tp, Avg, f, func(v uint64) uint64 { return refPost(tp, n, v) })
				})
			}
		}
	}
}

// TestNaNBitsMatchHalf checks, for all 65536 inputs, that the 16-bit
// kernels narrow exactly like package half, NaN payloads included: max(x,
// -Inf) and min(x, +Inf) return x itself (or x quieted if NaN), so this is
// a round trip through the kernel's widening and narrowing. For the
// assembly this ties F16C's VCVTPS2PH NaN handling to half.F32ToF16's
// documented contract.
func TestNaNBitsMatchHalf(t *testing.T) {
	for _, p := range paths() {
		for _, tp := range []Type{Float16, BFloat16} {
			t.Run(fmt.Sprintf("path=%s/type=%v", p.name, tp), func(t *testing.T) {
				usePath(t, p)
				a := make([]byte, 2<<16)
				negInf, posInf := make([]byte, len(a)), make([]byte, len(a))
				inf := uint64(0x7c00)
				if tp == BFloat16 {
					inf = 0x7f80
				}
				for i := range 1 << 16 {
					put(tp, a, i, uint64(i))
					put(tp, negInf, i, inf|0x8000)
					put(tp, posInf, i, inf)
				}
				for _, c := range []struct {
					op  Op
					inf []byte
				}{{Max, negInf}, {Min, posInf}} {
					dst := make([]byte, len(a))
					Reduce(tp, c.op)(dst, a, c.inf)
					for i := range 1 << 16 {
						// Identity, except that NaNs come back quieted.
						want := fromF32(tp, float32(toF64(tp, uint64(i))))
						require.Equalf(t, want, get(tp, dst, i), "%v(%#04x, Inf)", c.op, i)
					}
				}
			})
		}
	}
}

// TestMinMaxNaNEitherSide pins the NaN rule at every position of a vector
// block and in the tail: NaN in a, in b, in both.
func TestMinMaxNaNEitherSide(t *testing.T) {
	nan := map[Type]uint64{Float16: 0x7e00, BFloat16: 0x7fc0, Float32: 0x7fc0_0000, Float64: 0x7ff8 << 48}
	one := map[Type]uint64{Float16: 0x3c00, BFloat16: 0x3f80, Float32: 0x3f80_0000, Float64: math.Float64bits(1)}
	eachKernel(t, []Type{Float16, Float32, Float64, BFloat16}, []Op{Min, Max}, func(t *testing.T, tp Type, op Op) {
		f := Reduce(tp, op)
		const n = 67 // 2 blocks of 32 bytes for every type, plus a tail
		for pos := range n {
			for side := range 3 {
				a, b, dst := make([]byte, n*tp.Size()), make([]byte, n*tp.Size()), make([]byte, n*tp.Size())
				for i := range n {
					put(tp, a, i, one[tp])
					put(tp, b, i, one[tp])
				}
				if side != 1 {
					put(tp, a, pos, nan[tp])
				}
				if side != 0 {
					put(tp, b, pos, nan[tp])
				}
				f(dst, a, b)
				for i := range n {
					v := toF64(tp, get(tp, dst, i))
					if i == pos {
						require.Truef(t, math.IsNaN(v), "pos %d side %d: got %g, want NaN", pos, side, v)
					} else {
						require.Equalf(t, 1.0, v, "pos %d side %d, element %d", pos, side, i)
					}
				}
			}
		}
	})
}

// TestAsmAvailable makes sure the "asm" subtests above really ran the
// assembly on machines that have it.
func TestAsmAvailable(t *testing.T) {
	for _, tp := range allTypes {
		for _, op := range []Op{Sum, Min, Max} {
			f := archReduce(tp, op)
			if tp == Float8E4M3 || tp == Float8E5M2 {
				// The float8 types run the portable kernels (a table
				// lookup to widen, one rounding back): not vectorised yet.
				require.Nil(t, f)
				continue
			}
			if hasAsm() {
				require.NotNilf(t, f, "no assembly for %v %v", tp, op)
			} else {
				require.Nil(t, f)
			}
		}
	}
}

func TestIntegerWrap(t *testing.T) {
	for _, p := range paths() {
		t.Run("path="+p.name, func(t *testing.T) {
			usePath(t, p)
			a := []int8{127, -128, 100, -100, 127}
			b := []int8{1, -1, 100, -100, 127}
			d := make([]int8, len(a))
			Reduce(Int8, Sum)(bytesOf(d), bytesOf(a), bytesOf(b))
			require.Equal(t, []int8{-128, 127, -56, 56, -2}, d)
			Reduce(Int8, Prod)(bytesOf(d), bytesOf(a), bytesOf(b))
			require.Equal(t, []int8{127, -128, 16, 16, 1}, d)
			ReduceFinal(Int8, Avg, 3)(bytesOf(d), bytesOf(a), bytesOf(b))
			require.Equal(t, []int8{-42, 42, -18, 18, 0}, d) // -128/3 truncates toward zero

			u := []uint64{math.MaxUint64, 1 << 63, 3}
			v := []uint64{1, 1 << 63, math.MaxUint64}
			e := make([]uint64, len(u))
			Reduce(Uint64, Sum)(bytesOf(e), bytesOf(u), bytesOf(v))
			require.Equal(t, []uint64{0, 0, 2}, e)
			Reduce(Uint64, Prod)(bytesOf(e), bytesOf(u), bytesOf(v))
			require.Equal(t, []uint64{math.MaxUint64, 0, math.MaxUint64 - 2}, e)
			Reduce(Uint64, Min)(bytesOf(e), bytesOf(u), bytesOf(v))
			require.Equal(t, []uint64{1, 1 << 63, 3}, e)

			i := []int64{math.MinInt64, -7, math.MaxInt64}
			j := []int64{-1, 0, 1}
			k := make([]int64, len(i))
			ReduceFinal(Int64, Avg, 2)(bytesOf(k), bytesOf(i), bytesOf(j))
			require.Equal(t, []int64{math.MaxInt64 / 2, -3, math.MinInt64 / 2}, k)
		})
	}
}

func bytesOf[T any](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func TestTypeOpNames(t *testing.T) {
	sizes := []int{1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}
	names := []string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"}
	for i, tp := range allTypes {
		require.True(t, tp.Valid())
		require.Equal(t, sizes[i], tp.Size())
		require.Equal(t, names[i], tp.String())
	}
	require.False(t, Type(12).Valid())
	require.Equal(t, 0, Type(12).Size())
	require.Equal(t, "Type(12)", Type(12).String())
	for i, op := range allOps {
		require.True(t, op.Valid())
		require.Equal(t, []string{"sum", "prod", "min", "max", "avg"}[i], op.String())
	}
	require.False(t, Op(5).Valid())
	require.Equal(t, "Op(5)", Op(5).String())
}

func TestPanics(t *testing.T) {
	require.Panics(t, func() { Reduce(Type(12), Sum) })
	require.Panics(t, func() { Reduce(Float32, Op(5)) })
	require.Panics(t, func() { ReduceFinal(Float32, Avg, 0) })
	require.Panics(t, func() { Post(Int32, Avg, -1) })
	require.NotPanics(t, func() { ReduceFinal(Float32, Sum, 0) }) // n ignored
}

func TestNoAllocs(t *testing.T) {
	a := make([]byte, 4096)
	d := make([]byte, 4096)
	for _, p := range paths() {
		t.Run("path="+p.name, func(t *testing.T) {
			usePath(t, p)
			for _, tp := range allTypes {
				for _, op := range allOps {
					f := ReduceFinal(tp, op, 3)
					require.Zerof(t, testing.AllocsPerRun(10, func() { f(d, a, a) }), "%v %v", tp, op)
				}
				post := Post(tp, Avg, 3)
				require.Zero(t, testing.AllocsPerRun(10, func() { post(d, a) }))
			}
		})
	}
}

// TestMisuseStaysInBounds breaks the length contract (short inputs, a length
// that is not a multiple of the element size) and checks that no kernel
// writes outside dst: it may panic or process a prefix, nothing worse.
func TestMisuseStaysInBounds(t *testing.T) {
	eachKernel(t, allTypes, allOps, func(t *testing.T, tp Type, op Op) {
		r := newRand(t)
		f := ReduceFinal(tp, op, 3)
		sz := tp.Size()
		for _, c := range []struct{ d, a, b int }{
			{40*sz + sz - 1, 40*sz + sz - 1, 40*sz + sz - 1}, // ragged
			{40 * sz, 13 * sz, 40 * sz},                      // short a
			{40 * sz, 40 * sz, 7*sz + 1},                     // short, ragged b
			{1, 1, 1},
		} {
			db := newBuf(r, c.d)
			ab, bb := newBuf(r, c.a), newBuf(r, c.b)
			func() {
				defer func() { _ = recover() }()
				f(db.bytes(), ab.bytes(), bb.bytes())
			}()
			db.checkGuard(t, "dst")
			ab.checkGuard(t, "a")
			bb.checkGuard(t, "b")
		}
	})
}

// streamLengths reach the streaming path (destinations of at least
// minStream bytes) with ragged heads and tails. -short (the race run)
// drops the longest, which costs most under the race detector and adds
// only more whole blocks.
func streamLengths() []int {
	if testing.Short() {
		return []int{0, 1, 33, 1500, 4099, 1<<12 + 1027}
	}
	return []int{0, 1, 33, 1500, 4099, 1<<14 + 3, 1<<16 + 7}
}

func TestReduceStream(t *testing.T) {
	eachKernel(t, allTypes, allOps, func(t *testing.T, tp Type, op Op) {
		r := newRand(t)
		checkBinary(t, r, tp, op, 0, ReduceStream(tp, op), streamLengths())
		if op == Avg {
			checkBinary(t, r, tp, op, 3, ReduceFinalStream(tp, op, 3), streamLengths())
		}
		// The two-destination forms, seen through dst: dst2 must match.
		for _, final := range []bool{false, true} {
			g, post := ReduceStream2(tp, op), 0
			if final {
				if op != Avg {
					continue
				}
				g, post = ReduceFinalStream2(tp, op, 3), 3
			}
			checkBinary(t, r, tp, op, post, viaDst(t, r, g), streamLengths())
		}
	})
}

// viaDst makes a Func of a two-destination kernel, to check it through
// dst: it fails the test where dst2 differs from dst or g wrote outside
// dst2.
func viaDst(t *testing.T, r *rand.Rand, g Func2) Func {
	return func(dst, a, b []byte) {
		d2 := newBuf(r, len(dst))
		g(dst, d2.bytes(), a, b)
		d2.checkGuard(t, "dst2")
		if !bytes.Equal(dst, d2.bytes()) {
			t.Fatalf("dst2 differs from dst (%d bytes)", len(dst))
		}
	}
}

func TestCopyStream(t *testing.T) {
	for _, p := range paths() {
		t.Run("path="+p.name, func(t *testing.T) {
			usePath(t, p)
			r := newRand(t)
			for _, n := range []int{0, 5, 4095, 4096, 4097, 100_003, 1 << 20} {
				src, dst := newBuf(r, n), newBuf(r, n)
				fill(r, Uint8, src.bytes())
				require.Equal(t, n, CopyStream(dst.bytes(), src.bytes()))
				require.True(t, bytes.Equal(src.bytes(), dst.bytes()), "%d bytes", n)
				dst.checkGuard(t, "dst")
			}
		})
	}
}
