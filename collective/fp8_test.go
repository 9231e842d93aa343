package collective_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

func TestFloat8Conversions(t *testing.T) {
	require.Equal(t, float32(448), collective.Float8E4M3From(1e9).Float32(), "E4M3 saturates")
	require.Equal(t, float32(-448), collective.Float8E4M3From(float32(math.Inf(-1))).Float32())
	require.Equal(t, float32(1.125), collective.Float8E4M3From(1.1).Float32())
	require.True(t, math.IsInf(float64(collective.Float8E5M2From(1e9).Float32()), 1), "E5M2 overflows to Inf")
	require.Equal(t, float32(57344), collective.Float8E5M2From(57344).Float32())
	require.True(t, math.IsNaN(float64(collective.Float8E4M3From(float32(math.NaN())).Float32())))
	require.Equal(t, "0.5", collective.Float8E5M2From(0.5).String())
	require.Equal(t, 1, collective.Float8E4M3Type.Size())
	require.Equal(t, "float8e5m2", collective.Float8E5M2Type.String())
	require.Equal(t, collective.Float8E4M3Type, collective.TypeOf[collective.Float8E4M3]())
}

// Every collective and operator on the float8 types, over 4 ranks, with
// values whose results are exact in the format, so that the expected bits
// do not depend on the reduction order; and E4M3's saturation, E5M2's
// overflow.
func TestFloat8Collectives(t *testing.T) {
	collectivetest.Run(t, 4, func(ctx context.Context, c *collective.Comm) error {
		r := float32(c.Rank())
		n := 1000
		e4 := make([]collective.Float8E4M3, n)
		e5 := make([]collective.Float8E5M2, n)
		for i := range n {
			e4[i] = collective.Float8E4M3From(r * 0.5) // 0, 0.5, 1, 1.5
			// Every partial sum is a multiple of 0.25 or 0.5 below 4: exact
			// in E5M2's 2 fraction bits, whatever the order.
			e5[i] = collective.Float8E5M2From(0.25 * r * float32(i%2+1))
		}
		for _, tc := range []struct {
			op   collective.Op
			want func(i int) (float32, float32)
		}{
			{collective.Sum, func(i int) (float32, float32) { return 3, 1.5 * float32(i%2+1) }},
			{collective.Max, func(i int) (float32, float32) { return 1.5, 0.75 * float32(i%2+1) }},
			{collective.Min, func(i int) (float32, float32) { return 0, 0 }},
			{collective.Avg, func(i int) (float32, float32) { return 0.75, 0.375 * float32(i%2+1) }},
		} {
			o4 := make([]collective.Float8E4M3, n)
			o5 := make([]collective.Float8E5M2, n)
			if err := collective.AllReduce(ctx, c, e4, o4, tc.op); err != nil {
				return err
			}
			if err := collective.AllReduce(ctx, c, e5, o5, tc.op); err != nil {
				return err
			}
			for i := range n {
				w4, w5 := tc.want(i)
				if o4[i].Float32() != w4 || o5[i].Float32() != w5 {
					return fmt.Errorf("rank %d %v element %d: %v and %v, want %v and %v", c.Rank(), tc.op, i, o4[i], o5[i], w4, w5)
				}
			}
		}
		// Saturation and overflow.
		big4 := []collective.Float8E4M3{collective.Float8E4M3From(200)}
		big5 := []collective.Float8E5M2{collective.Float8E5M2From(20000)}
		if err := collective.AllReduce(ctx, c, big4, big4, collective.Sum); err != nil {
			return err
		}
		if err := collective.AllReduce(ctx, c, big5, big5, collective.Sum); err != nil {
			return err
		}
		if big4[0].Float32() != 448 || !math.IsInf(float64(big5[0].Float32()), 1) {
			return fmt.Errorf("rank %d: 4×200 in E4M3 is %v (want 448), 4×20000 in E5M2 %v (want +Inf)", c.Rank(), big4[0], big5[0])
		}
		// The other collectives move the bytes as they are.
		g := make([]collective.Float8E4M3, 4*n)
		if err := collective.AllGather(ctx, c, e4, g); err != nil {
			return err
		}
		for q := range 4 {
			if g[q*n].Float32() != float32(q)*0.5 {
				return fmt.Errorf("rank %d: all-gather block %d is %v", c.Rank(), q, g[q*n])
			}
		}
		b := []collective.Float8E5M2{collective.Float8E5M2From(r + 6)}
		if err := collective.Broadcast(ctx, c, b, b, 2); err != nil || b[0].Float32() != 8 {
			return fmt.Errorf("rank %d: broadcast %v, %v", c.Rank(), b[0], err)
		}
		rs := make([]collective.Float8E4M3, n/4)
		if err := collective.ReduceScatter(ctx, c, e4, rs, collective.Sum); err != nil || rs[0].Float32() != 3 {
			return fmt.Errorf("rank %d: reduce-scatter %v, %v", c.Rank(), rs[0], err)
		}
		return nil
	})
}
