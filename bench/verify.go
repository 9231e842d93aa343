package bench

import (
	"math"
	"unsafe"

	"github.com/goccl/goccl/collective"
)

// Checking follows nccl-tests' verifiable idea: every rank's inputs are
// chosen so that the result is exact in the element type, whatever order
// the ranks' contributions are combined in, so the expected output can be
// computed independently and compared bit for bit.
//
//   - sum, avg: x(r,i) = b(i) + (n-1)·c(i) on rank 0 and b(i) - c(i)
//     elsewhere, with small integers b and c: the total is n·b(i), so avg
//     is b(i) exactly, and every partial sum is a small integer (exact in
//     float16 and bfloat16 up to about 40 ranks; integers wrap alike in
//     any order).
//   - prod: floats ±2^e with e ∈ {-1, 0, 1} (no rounding, no overflow up
//     to about 45 ranks in float16); integers 1, 2 or -1 (wrapping
//     multiplication is associative).
//   - min, max, and the collectives that only move data: small integers.
//
// Outputs are poisoned (NaN, or an integer the patterns do not produce)
// before each checked operation, so a skipped write shows.

// pattern returns rank r's input at global element index i, as a real
// number the element type holds exactly.
func pattern(c Coll, op collective.Op, float, unsigned bool, n, r, i int) float64 {
	if !c.reduces() {
		v := (i*3 + r*5) % 17
		if unsigned {
			return float64(v)
		}
		return float64(v - 8)
	}
	switch op {
	case collective.Sum, collective.Avg:
		b, cc := (i*7)%9-4, i%3
		if unsigned {
			b += 4
		}
		if r == 0 {
			return float64(b + (n-1)*cc)
		}
		return float64(b - cc)
	case collective.Prod:
		k := (r + 2*i) % 3
		if float {
			v := math.Ldexp(1, k-1)
			if (r+i)%5 == 0 {
				v = -v
			}
			return v
		}
		return []float64{1, 2, -1}[k]
	}
	v := (i*5 + r*3) % 11
	if unsigned {
		return float64(v)
	}
	return float64(v - 5)
}

// typed is what checking needs to know about an element type.
type typed[T collective.Number] struct {
	float, unsigned bool
	from            func(float64) T // exact for the patterns
	toF             func(T) float64 // floats only
	bits            func(T) uint64
	poison          [2]T
	// intOp applies op to two integers with the type's wrapping arithmetic;
	// nil for floats.
	intOp  func(a, b T, op collective.Op) T
	intDiv func(a T, n int) T
}

func integer[T int8 | uint8 | int32 | uint32 | int64 | uint64](unsigned bool) typed[T] {
	var minV T
	if !unsigned {
		minV = T(1) << (unsafe.Sizeof(minV)*8 - 1) // the most negative value
	} else {
		minV = ^T(0) - 0x35 // a large value the patterns never reach
	}
	return typed[T]{
		unsigned: unsigned,
		from:     func(v float64) T { return T(int64(v)) },
		bits:     func(v T) uint64 { return uint64(v) },
		poison:   [2]T{minV, minV + 1},
		intOp: func(a, b T, op collective.Op) T {
			switch op {
			case collective.Sum, collective.Avg:
				return a + b
			case collective.Prod:
				return a * b
			case collective.Min:
				return min(a, b)
			}
			return max(a, b)
		},
		intDiv: func(a T, n int) T { return a / T(n) },
	}
}

func floating[T collective.Number](from func(float64) T, toF func(T) float64, bits func(T) uint64) typed[T] {
	nan := from(math.NaN())
	return typed[T]{float: true, from: from, toF: toF, bits: bits, poison: [2]T{nan, nan}}
}

// typedFor returns the checking helpers for T.
func typedFor[T collective.Number]() any {
	switch collective.TypeOf[T]() {
	case collective.Int8:
		return integer[int8](false)
	case collective.Uint8:
		return integer[uint8](true)
	case collective.Int32:
		return integer[int32](false)
	case collective.Uint32:
		return integer[uint32](true)
	case collective.Int64:
		return integer[int64](false)
	case collective.Uint64:
		return integer[uint64](true)
	case collective.Float16Type:
		return floating(func(v float64) collective.Float16 { return collective.Float16From(float32(v)) },
			func(v collective.Float16) float64 { return float64(v.Float32()) },
			func(v collective.Float16) uint64 { return uint64(v) })
	case collective.Float32:
		return floating(func(v float64) float32 { return float32(v) }, func(v float32) float64 { return float64(v) },
			func(v float32) uint64 { return uint64(math.Float32bits(v)) })
	case collective.Float64:
		return floating(func(v float64) float64 { return v }, func(v float64) float64 { return v }, math.Float64bits)
	case collective.BFloat16Type:
		return floating(func(v float64) collective.BFloat16 { return collective.BFloat16From(float32(v)) },
			func(v collective.BFloat16) float64 { return float64(v.Float32()) },
			func(v collective.BFloat16) uint64 { return uint64(v) })
	case collective.Float8E4M3Type:
		return floating(func(v float64) collective.Float8E4M3 { return collective.Float8E4M3From(float32(v)) },
			func(v collective.Float8E4M3) float64 { return float64(v.Float32()) },
			func(v collective.Float8E4M3) uint64 { return uint64(v) })
	case collective.Float8E5M2Type:
		return floating(func(v float64) collective.Float8E5M2 { return collective.Float8E5M2From(float32(v)) },
			func(v collective.Float8E5M2) float64 { return float64(v.Float32()) },
			func(v collective.Float8E5M2) uint64 { return uint64(v) })
	}
	panic("bench: unknown element type")
}

// input is rank r's input element i.
func (t typed[T]) input(c Coll, op collective.Op, n, r, i int) T {
	return t.from(pattern(c, op, t.float, t.unsigned, n, r, i))
}

// reduced is the expected reduction of element i over all ranks.
func (t typed[T]) reduced(c Coll, op collective.Op, n, i int) T {
	if t.intOp == nil {
		acc := pattern(c, op, true, false, n, 0, i)
		for r := 1; r < n; r++ {
			v := pattern(c, op, true, false, n, r, i)
			switch op {
			case collective.Sum, collective.Avg:
				acc += v
			case collective.Prod:
				acc *= v
			case collective.Min:
				acc = min(acc, v)
			case collective.Max:
				acc = max(acc, v)
			}
		}
		if op == collective.Avg {
			acc /= float64(n)
		}
		return t.from(acc)
	}
	acc := t.input(c, op, n, 0, i)
	for r := 1; r < n; r++ {
		acc = t.intOp(acc, t.input(c, op, n, r, i), op)
	}
	if op == collective.Avg {
		acc = t.intDiv(acc, n)
	}
	return acc
}

// poisonAt is the value an output element holds before a checked
// operation writes it.
func (t typed[T]) poisonAt(i int) T { return t.poison[i&1] }
