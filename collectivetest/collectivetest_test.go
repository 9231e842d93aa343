package collectivetest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

func average(ctx context.Context, c *collective.Comm) error {
	v := []float64{float64(c.Rank())}
	if err := collective.AllReduce(ctx, c, v, v, collective.Avg); err != nil {
		return err
	}
	if want := float64(c.Size()-1) / 2; v[0] != want {
		return fmt.Errorf("rank %d: average %v, want %v", c.Rank(), v[0], want)
	}
	return nil
}

func TestRun(t *testing.T) {
	collectivetest.Run(t, 4, average)
}

// recorder keeps what Run reports instead of failing the test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestRunReportsEveryRanksErrorAndTheLateOnes(t *testing.T) {
	rec := &recorder{TB: t}
	collectivetest.Run(rec, 3, func(ctx context.Context, c *collective.Comm) error {
		if c.Rank() == 1 {
			return errors.New("rank 1's own failure")
		}
		return nil
	})
	require.Equal(t, []string{"rank 1: rank 1's own failure"}, rec.errs)

	rec = &recorder{TB: t}
	start := time.Now()
	collectivetest.Run(rec, 2, func(ctx context.Context, c *collective.Comm) error {
		if c.Rank() == 0 {
			return nil // rank 1 waits for it in vain
		}
		// Without the run's context: only Run's abort at the deadline
		// ends the wait, so rank 1 is still running then.
		return average(context.Background(), c)
	}, collectivetest.WithTimeout(300*time.Millisecond))
	require.Less(t, time.Since(start), 5*time.Second)
	require.NotEmpty(t, rec.errs)
	require.Contains(t, rec.errs[0], "ranks 1 had not returned after 300ms")
}

func TestRunProcesses(t *testing.T) {
	for _, tr := range []string{"auto", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			collectivetest.RunProcesses(t, 3, func(ctx context.Context, c *collective.Comm) error {
				if os.Getenv("GOCCL_TRANSPORT") != tr {
					return fmt.Errorf("GOCCL_TRANSPORT=%q in the rank's process", os.Getenv("GOCCL_TRANSPORT"))
				}
				if info := c.Ranks(); info[0].PID == info[1].PID {
					return errors.New("ranks 0 and 1 share a process")
				}
				return average(ctx, c)
			}, collectivetest.WithEnv("GOCCL_TRANSPORT="+tr))
		})
	}
}

func TestRunProcessesSaysWhichRankFailed(t *testing.T) {
	if os.Getenv("GOCCL_COLLECTIVETEST") != "" {
		// In a rank's process: the failure below is the point.
		collectivetest.RunProcesses(t, 2, failOnRank1)
		return
	}
	// The parent's report, checked by running it as a subprocess test.
	rec := &recorder{TB: t}
	collectivetest.RunProcesses(rec, 2, failOnRank1)
	require.Len(t, rec.errs, 1)
	require.True(t, strings.HasPrefix(rec.errs[0], "rank 1 exited 1:"), rec.errs[0])
	require.Contains(t, rec.errs[0], "rank 1 does not like this")
}

func failOnRank1(ctx context.Context, c *collective.Comm) error {
	if c.Rank() == 1 {
		return errors.New("rank 1 does not like this")
	}
	return nil
}
