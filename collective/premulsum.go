package collective

import (
	"fmt"
	"unsafe"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// Pre-multiplied sums, as NCCL's ncclRedOpCreatePreMulSum: an operator a
// communicator makes, whose reduction is the sum of every rank's input
// multiplied by that rank's scalar. DDP uses it to divide gradients by a
// factor before summing them (gradient_predivide_factor), which keeps
// float16 sums in range, and for weighted averages.
//
// The scalar multiplies this rank's input as the operation starts, then
// the sum runs as usual: one pass over the input, not fused into the
// reduction kernels (yet). An all-reduce, and a reduce on its root, scale
// into the output and run in place there (the result overwrites it
// anyway), so they allocate nothing; a reduce-scatter, and a reduce off
// the root, scale into a scratch copy. Host memory only.

// premulOpBase is where a communicator's pre-multiplied sums are
// numbered: Op values below it are the five built-in operators.
const premulOpBase = 16

// PreMulSum returns an operator for c's AllReduce, ReduceScatter and
// Reduce (and their Start forms) that sums every rank's input multiplied
// by its rank's scalar: each rank passes its own (they may differ), and
// every rank must use such an operator where the others do (a rank that
// sums plainly against one that pre-multiplies is a mismatch, ErrMismatch). The operator is valid on
// c only, until DestroyOp. On integer types the scalar is converted to
// the type and multiplies with wrap-around; on the 16- and 8-bit floats
// the product is computed in float32 and rounded once.
func (c *Comm) PreMulSum(scalar float64) (Op, error) {
	if c == nil {
		return 0, &ArgError{Rank: -1, Op: "premulsum", Err: ErrNilComm}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.premul == nil {
		c.premul = map[Op]float64{}
	}
	op := premulOpBase + Op(c.premulNext)
	c.premulNext++
	c.premul[op] = scalar
	return op, nil
}

// DestroyOp releases an operator PreMulSum made (ncclRedOpDestroy); using
// it afterwards is an argument error.
func (c *Comm) DestroyOp(op Op) error {
	if c == nil {
		return &ArgError{Rank: -1, Op: "destroyop", Err: ErrNilComm}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.premul[op]; !ok {
		return c.argError("destroyop", "%v is not an operator this communicator made", op)
	}
	delete(c.premul, op)
	return nil
}

// setRed checks op for a reducing call k and sets its kernel operator:
// a built-in one, or Sum with this rank's scalar for a PreMulSum.
func (c *Comm) setRed(name string, op Op, k *call) error {
	if op.Valid() {
		k.op.Red, k.premul, k.op.PreMul = kernels.Op(op), false, false
		return nil
	}
	if op >= premulOpBase {
		c.mu.Lock()
		s, ok := c.premul[op]
		c.mu.Unlock()
		if ok {
			k.op.Red, k.premul, k.scale, k.op.PreMul = kernels.Sum, true, s, true
			return nil
		}
		return c.argError(name, "reduction operator %v was not made by this communicator's PreMulSum, or was destroyed", op)
	}
	return c.argError(name, "reduction operator %v is not Sum, Prod, Min, Max, Avg or a PreMulSum", op)
}

// preScale replaces a PreMulSum's input by its scaled values: in the
// output, which the operation then reduces in place, where the output
// holds as many elements as the input; in a scratch copy otherwise.
func (k *call) preScale() error {
	in, out := k.op.In, k.op.Out
	if in.Kind() == memory.Device || k.op.Ready != nil {
		return fmt.Errorf("%w: a PreMulSum on device memory: goccl has no kernel for it yet", ErrInvalidArgument)
	}
	src := in.Bytes()
	if (k.op.Coll == algorithms.CollAllReduce || k.op.Coll == algorithms.CollReduce) && out.Len() == in.Len() && out.Kind() == memory.Host {
		scaleBytes(DataType(k.op.Type), out.Bytes(), src, k.scale)
		k.op.In = out
		return nil
	}
	dst := make([]byte, len(src))
	scaleBytes(DataType(k.op.Type), dst, src, k.scale)
	k.op.In = memory.HostBuffer(dst)
	return nil
}

func scaleBytes(t DataType, dst, src []byte, s float64) {
	switch t {
	case Int8:
		scaleInt[int8](dst, src, s)
	case Uint8:
		scaleInt[uint8](dst, src, s)
	case Int32:
		scaleInt[int32](dst, src, s)
	case Uint32:
		scaleInt[uint32](dst, src, s)
	case Int64:
		scaleInt[int64](dst, src, s)
	case Uint64:
		scaleInt[uint64](dst, src, s)
	case Float32:
		scaleBy(dst, src, float32(s))
	case Float64:
		scaleBy(dst, src, s)
	case Float16Type:
		d, x, f := viewAs[Float16](dst), viewAs[Float16](src), float32(s)
		for i, v := range x[:len(d)] {
			d[i] = Float16From(v.Float32() * f)
		}
	case BFloat16Type:
		d, x, f := viewAs[BFloat16](dst), viewAs[BFloat16](src), float32(s)
		for i, v := range x[:len(d)] {
			d[i] = BFloat16From(v.Float32() * f)
		}
	case Float8E4M3Type:
		d, x, f := viewAs[Float8E4M3](dst), viewAs[Float8E4M3](src), float32(s)
		for i, v := range x[:len(d)] {
			d[i] = Float8E4M3From(v.Float32() * f)
		}
	case Float8E5M2Type:
		d, x, f := viewAs[Float8E5M2](dst), viewAs[Float8E5M2](src), float32(s)
		for i, v := range x[:len(d)] {
			d[i] = Float8E5M2From(v.Float32() * f)
		}
	}
}

func scaleInt[T int8 | uint8 | int32 | uint32 | int64 | uint64](dst, src []byte, s float64) {
	scaleBy(dst, src, T(int64(s))) // the scalar in the type; products wrap around
}

// scaleBy multiplies each element of src by m into dst (which may be
// src): a plain loop, which the compiler keeps free of calls and bounds
// checks; a closure per element measured 5 ns an element.
func scaleBy[T int8 | uint8 | int32 | uint32 | int64 | uint64 | float32 | float64](dst, src []byte, m T) {
	d, s := viewAs[T](dst), viewAs[T](src)
	s = s[:len(d)]
	for i, x := range s {
		d[i] = x * m
	}
}

func viewAs[T Number](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}
