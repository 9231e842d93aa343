package disttest

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// Rank r holds r+1 copies of the value r: the union over 4 ranks is
// 0, 1, 1, 2, 2, 2, 3, 3, 3, 3.
func check(ctx context.Context, c *collective.Comm) error {
	local := make([]float64, c.Rank()+1)
	for i := range local {
		local[i] = float64(c.Rank())
	}
	m, err := GlobalMoments(ctx, c, local)
	if err != nil {
		return err
	}
	if m.N != 10 || m.Mean != 2 || math.Abs(m.Std-1) > 1e-12 {
		return fmt.Errorf("rank %d: %+v, want 10 values of mean 2 and deviation 1", c.Rank(), m)
	}
	return nil
}

func TestGlobalMomentsInProcess(t *testing.T) {
	collectivetest.Run(t, 4, check)
}

func TestGlobalMomentsInProcesses(t *testing.T) {
	collectivetest.RunProcesses(t, 4, check)
}

func TestNoValues(t *testing.T) {
	collectivetest.Run(t, 2, func(ctx context.Context, c *collective.Comm) error {
		if _, err := GlobalMoments(ctx, c, nil); err == nil {
			return fmt.Errorf("rank %d: no error without values", c.Rank())
		}
		return nil
	})
}
