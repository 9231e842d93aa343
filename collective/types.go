package collective

import (
	"fmt"
	"unsafe"

	"github.com/goccl/goccl/internal/half"
	"github.com/goccl/goccl/internal/kernels"
)

// DataType is the element type of a buffer.
type DataType int

// Element types. Their numbering is goccl's own.
const (
	Int8 DataType = iota
	Uint8
	Int32
	Uint32
	Int64
	Uint64
	Float16Type
	Float32
	Float64
	BFloat16Type
	// Float8E4M3Type and Float8E5M2Type are the OCP 8-bit floats
	// (NCCL 2.24's ncclFloat8e4m3 and ncclFloat8e5m2).
	Float8E4M3Type
	Float8E5M2Type
)

// The 16- and 8-bit float types are named Float16Type and so on because
// Float16, BFloat16, Float8E4M3 and Float8E5M2 are the element types
// themselves.

func (t DataType) kernel() kernels.Type { return kernels.Type(t) }

// Valid reports whether t is one of the twelve element types.
func (t DataType) Valid() bool { return t >= Int8 && t <= Float8E5M2Type }

// Size returns the size of one element in bytes (0 if t is not Valid).
func (t DataType) Size() int {
	if !t.Valid() {
		return 0
	}
	return kernels.Type(t).Size()
}

func (t DataType) String() string {
	if !t.Valid() {
		return fmt.Sprintf("DataType(%d)", int(t))
	}
	return kernels.Type(t).String()
}

// Op is a reduction operator.
type Op int

// Reduction operators. Avg is the sum divided by the number of ranks; on
// integer types the wrapped sum is divided with truncation toward zero, as
// in NCCL. Integer Sum and Prod wrap around. Min and Max on floating-point
// types return NaN when any contribution is NaN.
const (
	Sum Op = iota
	Prod
	Min
	Max
	Avg
)

// Valid reports whether o is one of the five operators.
func (o Op) Valid() bool { return o >= Sum && o <= Avg }

func (o Op) String() string {
	if o >= premulOpBase {
		return fmt.Sprintf("premulsum#%d", int(o-premulOpBase))
	}
	if !o.Valid() {
		return fmt.Sprintf("Op(%d)", int(o))
	}
	return kernels.Op(o).String()
}

// Float16 is an IEEE 754 binary16 value, held as its bits.
type Float16 uint16

// Float16From rounds f to the nearest Float16 (ties to even; overflow gives
// ±Inf; NaN stays NaN).
func Float16From(f float32) Float16 { return Float16(half.F32ToF16(f)) }

// Float32 returns h as a float32 (exactly).
func (h Float16) Float32() float32 { return half.F16ToF32(uint16(h)) }

func (h Float16) String() string { return fmt.Sprint(h.Float32()) }

// BFloat16 is a bfloat16 value (the upper half of a float32), held as its
// bits.
type BFloat16 uint16

// BFloat16From rounds f to the nearest BFloat16 (ties to even; NaN stays
// NaN).
func BFloat16From(f float32) BFloat16 { return BFloat16(half.F32ToBF16(f)) }

// Float32 returns b as a float32 (exactly).
func (b BFloat16) Float32() float32 { return half.BF16ToF32(uint16(b)) }

func (b BFloat16) String() string { return fmt.Sprint(b.Float32()) }

// Float8E4M3 is an OCP FP8 E4M3 value (1 sign, 4 exponent and 3 fraction
// bits), held as its bits. It has no infinities: its range is ±448, and
// conversions saturate there.
type Float8E4M3 uint8

// Float8E4M3From rounds f to the nearest Float8E4M3 (ties to even); a
// value beyond ±448, and an infinity, becomes ±448; NaN stays NaN.
func Float8E4M3From(f float32) Float8E4M3 { return Float8E4M3(half.F32ToE4M3(f)) }

// Float32 returns x as a float32 (exactly).
func (x Float8E4M3) Float32() float32 { return half.E4M3ToF32(uint8(x)) }

func (x Float8E4M3) String() string { return fmt.Sprint(x.Float32()) }

// Float8E5M2 is an OCP FP8 E5M2 value (1 sign, 5 exponent and 2 fraction
// bits, with infinities), held as its bits; its range is ±57344.
type Float8E5M2 uint8

// Float8E5M2From rounds f to the nearest Float8E5M2 (ties to even);
// beyond ±57344 it becomes ±Inf; NaN stays NaN.
func Float8E5M2From(f float32) Float8E5M2 { return Float8E5M2(half.F32ToE5M2(f)) }

// Float32 returns x as a float32 (exactly).
func (x Float8E5M2) Float32() float32 { return half.E5M2ToF32(uint8(x)) }

func (x Float8E5M2) String() string { return fmt.Sprint(x.Float32()) }

// Number is the set of element types collectives accept. The types are
// exact (no ~): the element type decides the arithmetic, so a type merely
// based on one of these would be ambiguous.
type Number interface {
	int8 | uint8 | int32 | uint32 | int64 | uint64 | Float16 | float32 | float64 | BFloat16 | Float8E4M3 | Float8E5M2
}

// TypeOf returns the DataType of T.
func TypeOf[T Number]() DataType {
	switch any((*T)(nil)).(type) {
	case *int8:
		return Int8
	case *uint8:
		return Uint8
	case *int32:
		return Int32
	case *uint32:
		return Uint32
	case *int64:
		return Int64
	case *uint64:
		return Uint64
	case *Float16:
		return Float16Type
	case *float32:
		return Float32
	case *float64:
		return Float64
	case *BFloat16:
		return BFloat16Type
	case *Float8E4M3:
		return Float8E4M3Type
	case *Float8E5M2:
		return Float8E5M2Type
	}
	panic("unreachable")
}

// asBytes views s as its bytes, without copying.
func asBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}
