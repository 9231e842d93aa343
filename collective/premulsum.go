package collective

import "github.com/goccl/goccl/internal/kernels"

// Pre-multiplied sums, as NCCL's ncclRedOpCreatePreMulSum: an operator a
// communicator makes, whose reduction is the sum of every rank's input
// multiplied by that rank's scalar. DDP uses it to divide gradients by a
// factor before summing them (gradient_predivide_factor), which keeps
// float16 sums in range, and for weighted averages.
//
// The scalar is fused into the reduction: each step of the schedule that
// reads this rank's input multiplies it as it reads it (a scaled copy
// into the slot it sends, a scaled add into the value it reduces;
// internal/kernels ScaledSum and Scale), so the input is read once, as in
// a plain sum, and nothing is allocated. The schedules read each input
// element before anything writes it in place, which the simulator checks
// (algotest), so no value is scaled twice. Small operations that post
// their input whole (the shared board, the one-shot exchange) scale it
// once into scratch. Host memory only.

// premulOpBase is where a communicator's pre-multiplied sums are
// numbered: Op values below it are the five built-in operators.
const premulOpBase = 16

// PreMulSum returns an operator for c's AllReduce, ReduceScatter and
// Reduce (and their Start forms) that sums every rank's input multiplied
// by its rank's scalar: each rank passes its own (they may differ), and
// every rank must use such an operator where the others do (a rank that
// sums plainly against one that pre-multiplies is a mismatch, ErrMismatch). The operator is valid on
// c only, until DestroyOp. On integer types the scalar is converted to
// the type and multiplies with wrap-around; on the floating-point types
// the product is rounded to the type before the sum (no fused
// multiply-add; the 16- and 8-bit floats multiply in float32), so the
// result is exactly that of scaling the input first, and every rank gets
// the same bits.
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
		k.op.Red, k.premul, k.op.PreMul, k.op.Scale = kernels.Op(op), false, false, 0
		return nil
	}
	if op >= premulOpBase {
		c.mu.Lock()
		s, ok := c.premul[op]
		c.mu.Unlock()
		if ok {
			k.op.Red, k.premul, k.op.Scale, k.op.PreMul = kernels.Sum, true, s, true
			return nil
		}
		return c.argError(name, "reduction operator %v was not made by this communicator's PreMulSum, or was destroyed", op)
	}
	return c.argError(name, "reduction operator %v is not Sum, Prod, Min, Max, Avg or a PreMulSum", op)
}
