package collective_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// Each rank's input times its own scalar, summed: rank r contributes
// (r+1)·x with scalar 1/(r+1)... and the ranks pass different scalars.
func TestPreMulSum(t *testing.T) {
	scalars := []float64{0.5, 2, -1}
	collectivetest.Run(t, 3, func(ctx context.Context, c *collective.Comm) error {
		r := c.Rank()
		op, err := c.PreMulSum(scalars[r])
		if err != nil {
			return err
		}
		// float64: Σ s_r · (r+1) · (i+1) = (0.5·1 + 2·2 − 1·3)·(i+1) = 1.5·(i+1).
		n := 3000
		x := make([]float64, n)
		for i := range x {
			x[i] = float64((r + 1) * (i + 1))
		}
		keep := append([]float64(nil), x...)
		y := make([]float64, n)
		if err := collective.AllReduce(ctx, c, x, y, op); err != nil {
			return err
		}
		for i := range y {
			if y[i] != 1.5*float64(i+1) {
				return fmt.Errorf("rank %d: all-reduce element %d is %v, want %v", r, i, y[i], 1.5*float64(i+1))
			}
			if x[i] != keep[i] {
				return fmt.Errorf("rank %d: the input was changed", r)
			}
		}
		// In place, reduce-scatter and reduce, and an integer type (the
		// scalar in the type: 0, 2, -1).
		if err := collective.AllReduce(ctx, c, x, x, op); err != nil || x[5] != 9 {
			return fmt.Errorf("rank %d: in place: %v, %v", r, x[5], err)
		}
		rs := make([]float64, n/3)
		if err := collective.ReduceScatter(ctx, c, keep, rs, op); err != nil || rs[0] != 1.5*float64(r*n/3+1) {
			return fmt.Errorf("rank %d: reduce-scatter: %v, %v", r, rs[0], err)
		}
		iv := []int32{int32(r + 1)}
		var out []int32
		if r == 0 {
			out = make([]int32, 1)
		}
		if err := collective.Reduce(ctx, c, iv, out, op, 0); err != nil {
			return err
		}
		if r == 0 && out[0] != 0*1+2*2-1*3 {
			return fmt.Errorf("int32 reduce: %d, want 1", out[0])
		}
		// float16: rounded once per product.
		h := []collective.Float16{collective.Float16From(float32(r + 1))}
		if err := collective.AllReduce(ctx, c, h, h, op); err != nil || h[0].Float32() != 1.5 {
			return fmt.Errorf("rank %d: float16: %v, %v", r, h[0], err)
		}
		if op.String() == "" || op == collective.Sum {
			return fmt.Errorf("op %v", op)
		}
		return c.DestroyOp(op)
	})
}

// A rank that pre-multiplies against one that sums plainly: a mismatch,
// named, not a silently different result.
func TestPreMulSumAgainstSum(t *testing.T) {
	comms, _ := newNet(t, 2, collective.WithTimeout(time.Minute))
	errs := runRanks(t, comms, func(r int, c *collective.Comm) error {
		op := collective.Sum
		if r == 0 {
			var err error
			if op, err = c.PreMulSum(0.5); err != nil {
				return err
			}
		}
		v := make([]float32, 1000)
		return collective.AllReduce(context.Background(), c, v, v, op)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, collective.ErrMismatch, "rank %d", r)
	}
	require.Contains(t, errs[0].Error()+errs[1].Error(), "premulsum")
}

func TestPreMulSumArguments(t *testing.T) {
	comms := newGroup(t, 2)
	other := newGroup(t, 1)
	op, err := other[0].PreMulSum(2)
	require.NoError(t, err)
	v := []float32{1}
	err = collective.AllReduce(context.Background(), comms[0], v, v, op)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	require.ErrorContains(t, err, "not made by this communicator's PreMulSum")
	require.NoError(t, other[0].DestroyOp(op))
	require.ErrorIs(t, other[0].DestroyOp(op), collective.ErrInvalidArgument)
	err = collective.AllReduce(context.Background(), other[0], v, v, op)
	require.ErrorContains(t, err, "or was destroyed")
	err = collective.AllReduce(context.Background(), comms[0], v, v, collective.Op(7))
	require.ErrorContains(t, err, "is not Sum, Prod, Min, Max, Avg or a PreMulSum")
}
