package kernels

import "fmt"

//go:generate go run asmgen.go -s zkernels_amd64.s -go zkernels_amd64.go

// Type is the element type of a buffer.
type Type uint8

// The element types. The numbering is goccl's own; it is not NCCL's
// ncclDataType_t.
const (
	Int8 Type = iota
	Uint8
	Int32
	Uint32
	Int64
	Uint64
	Float16 // IEEE 754 binary16
	Float32
	Float64
	BFloat16
	Float8E4M3 // OCP FP8 E4M3 (saturating, no infinities)
	Float8E5M2 // OCP FP8 E5M2
	numTypes
)

// NumTypes and NumOps count the element types and operators, for
// encodings that must hold them (checked at compile time there).
const (
	NumTypes = int(numTypes)
	NumOps   = int(numOps)
)

var typeSizes = [numTypes]int{1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}

var typeNames = [numTypes]string{
	"int8", "uint8", "int32", "uint32", "int64", "uint64",
	"float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2",
}

// Size returns the size of one element in bytes, or 0 if t is not Valid.
func (t Type) Size() int {
	if !t.Valid() {
		return 0
	}
	return typeSizes[t]
}

// Valid reports whether t is one of the declared types.
func (t Type) Valid() bool { return t < numTypes }

// String returns the lower-case name of t ("float32"), or "Type(N)" if t is
// not Valid.
func (t Type) String() string {
	if !t.Valid() {
		return fmt.Sprintf("Type(%d)", uint8(t))
	}
	return typeNames[t]
}

// Op is a reduction operation.
type Op uint8

// The reduction operations.
const (
	Sum  Op = iota
	Prod    // product
	Min
	Max
	Avg // sum, then divided by the number of contributions (see ReduceFinal)
	numOps
)

var opNames = [numOps]string{"sum", "prod", "min", "max", "avg"}

// Valid reports whether o is one of the declared operations.
func (o Op) Valid() bool { return o < numOps }

// String returns the lower-case name of o ("sum"), or "Op(N)" if o is not
// Valid.
func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("Op(%d)", uint8(o))
	}
	return opNames[o]
}

// Func computes dst[i] = a[i] op b[i] for every element i of the buffers,
// which hold elements of the Type the Func was made for. For Avg it
// computes the sum; the division is done by a ReduceFinal or Post function.
//
// The caller guarantees len(dst) == len(a) == len(b), a multiple of the
// type's Size. dst may be exactly a or exactly b (same first byte, same
// length); any other overlap gives unspecified results. The buffers need
// not be aligned. A Func does not allocate, keeps no reference to the
// buffers after it returns, and may be called concurrently on different
// buffers.
type Func func(dst, a, b []byte)

// forcePortable makes Reduce, ReduceFinal and Post return the portable Go
// kernels even where assembly ones exist. Only tests set it, to check both
// paths in one run; it is read when a kernel is chosen, not when it runs.
var forcePortable bool

// forceAVX2 makes the streaming kernels use AVX2 where AVX-512 ones
// exist, so that tests on AVX-512 machines check both.
var forceAVX2 bool

func mustValid(t Type, op Op) {
	if !t.Valid() {
		panic(fmt.Sprintf("kernels: invalid type %v", t))
	}
	if !op.Valid() {
		panic(fmt.Sprintf("kernels: invalid op %v", op))
	}
}

// Reduce returns the kernel computing dst[i] = a[i] op b[i] for elements of
// type t (for Avg: the sum). The choice between assembly and portable code
// is made here, once, so the returned Func does no dispatch per call.
//
// Integer types wrap around. Float16, BFloat16 and the float8 types are
// widened to float32, combined, and rounded back to nearest even (E4M3
// saturating at ±448). Min and Max on floating-point
// types return NaN when either element is NaN; for elements that compare
// equal (-0 and +0) either may be returned.
//
// Reduce panics if t or op is not Valid: that is a programming error, not an
// input error.
func Reduce(t Type, op Op) Func {
	mustValid(t, op)
	if op == Avg {
		op = Sum
	}
	if !forcePortable {
		if f := archReduce(t, op); f != nil {
			return f
		}
	}
	return portable[t][op]
}

// ReduceFinal returns the kernel computing dst[i] = post(a[i] op b[i]), the
// last reduction step of a collective. post divides by n for Avg and is the
// identity for every other op (n is then ignored), so for those ReduceFinal
// is Reduce.
//
// Avg on integer types is the wrapped-around sum in the type, then Go
// integer division by n (truncating toward zero), as NCCL does. On float32
// and float64 it is (a+b)/n with each operation rounded in the type (a
// division, not a multiplication by 1/n). On Float16 and BFloat16 it is
// (a+b)/n in float32, rounded once to the 16-bit type at the end. n is
// converted to the arithmetic type first (float32 for the 16-bit types), so
// beyond 2^24 (float32) it is itself rounded.
//
// ReduceFinal panics if t or op is not Valid, or if op is Avg and n < 1.
// Buffer rules are those of Func.
func ReduceFinal(t Type, op Op, n int) Func {
	mustValid(t, op)
	if op != Avg || n == 1 {
		return Reduce(t, op)
	}
	mustN(n)
	if !forcePortable {
		if f := archAvg(t, n); f != nil {
			return f
		}
	}
	return portableAvg(t, n)
}

// Post returns a function computing dst[i] = post(src[i]) (for Avg:
// src[i]/n, with the rounding rules of ReduceFinal), or nil when post is the
// identity: for every op but Avg, and for Avg with n == 1.
//
// The returned function requires len(dst) == len(src), a multiple of
// t.Size(); dst may be exactly src. It does not allocate and is safe for
// concurrent use on different buffers.
//
// Post panics if t or op is not Valid, or if op is Avg and n < 1.
func Post(t Type, op Op, n int) func(dst, src []byte) {
	mustValid(t, op)
	if op != Avg || n == 1 {
		return nil
	}
	mustN(n)
	if !forcePortable {
		if f := archPost(t, n); f != nil {
			return f
		}
	}
	return portablePost(t, n)
}

func mustN(n int) {
	if n < 1 {
		panic(fmt.Sprintf("kernels: Avg over n = %d contributions", n))
	}
}
