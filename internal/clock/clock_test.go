package clock

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNowNeverGoesBackAndFollowsTheRuntimeClock reads Now on two
// goroutines for longer than a scale serves (so through a new anchor, on
// amd64 where the counter is the kernel's clock): no goroutine sees it go
// back, and it stays within a millisecond of the runtime's clock.
func TestNowNeverGoesBackAndFollowsTheRuntimeClock(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the clock for 1.2 s, past a new anchor; not with -short")
	}
	t.Logf("time-stamp counter in use: %v", usable)
	for _, err := range readOnTwo(1200*time.Millisecond, 1024) {
		require.NoError(t, err)
	}
	checkNearRuntime(t)
	if usable {
		s := cur.Load()
		require.NotNil(t, s, "the counter is the kernel's clock, but no scale was anchored in 1.2 s")
		require.Greater(t, s.n0, int64(0))
	}
}

// TestNowMeasuresWhatTheRuntimeClockDoes: readings are close to the
// runtime's clock, and time passes on them at its rate.
func TestNowMeasuresWhatTheRuntimeClockDoes(t *testing.T) {
	checkNearRuntime(t)
	a, ra := Now(), nanotime()
	time.Sleep(30 * time.Millisecond)
	b, rb := Now(), nanotime()
	d, rd := b-a, rb-ra
	require.InDelta(t, float64(rd), float64(d), float64(200*time.Microsecond), "Now measured %v where the runtime's clock measured %v", time.Duration(d), time.Duration(rd))
	checkNearRuntime(t)
}

func checkNearRuntime(t *testing.T) {
	t.Helper()
	before := nanotime()
	n := Now()
	after := nanotime()
	require.GreaterOrEqual(t, n, before-int64(time.Millisecond), "Now is %v behind the runtime's clock", time.Duration(before-n))
	require.LessOrEqual(t, n, after+int64(time.Millisecond), "Now is %v ahead of the runtime's clock", time.Duration(n-after))
}

// readOnTwo reads Now in a loop on two goroutines for d (looking at the
// time once every `every` reads), each checking that its readings never
// go back, and returns each goroutine's error.
func readOnTwo(d time.Duration, every int) []error {
	end := nanotime() + int64(d)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for g := range errs {
		wg.Go(func() {
			last := Now()
			for i := 0; ; i++ {
				n := Now()
				if n < last {
					errs[g] = &backErr{last, n, i}
					return
				}
				last = n
				if i%every == 0 && nanotime() > end {
					return
				}
			}
		})
	}
	wg.Wait()
	return errs
}

type backErr struct {
	last, now int64
	i         int
}

func (e *backErr) Error() string {
	return "Now went back by " + time.Duration(e.last-e.now).String() + " at read " + strconv.Itoa(e.i)
}

// TestScaleArithmetic: a scale's reading is its anchor plus ticks times
// the rate, in 32.32 fixed point, without overflow a second out.
func TestScaleArithmetic(t *testing.T) {
	// 3 GHz: a third of a ns a tick.
	s := &scale{t0: 1 << 40, n0: 5_000, mult: (1 << 32) / 3}
	s.limit = uint64(reanchorEvery) << 32 / s.mult
	require.InDelta(t, 3e9, float64(s.limit), 10)
	require.Equal(t, int64(5_000), s.at(1<<40))
	require.InDelta(t, 5_000+1e9, float64(s.at(1<<40+3_000_000_000)), 1)
	require.InDelta(t, 5_000+2e9, float64(s.at(1<<40+6_000_000_000)), 1)
}

// BenchmarkNow against the runtime's clock, which it stands in for.
func BenchmarkNow(b *testing.B) {
	b.Run("clock.Now", func(b *testing.B) {
		var x int64
		for b.Loop() {
			x += Now()
		}
		_ = x
	})
	b.Run("runtime.nanotime", func(b *testing.B) {
		var x int64
		for b.Loop() {
			x += nanotime()
		}
		_ = x
	})
}
