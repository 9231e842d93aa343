package clock

import (
	"math/bits"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// resetForTest forgets the scale and the first sample, so that the next
// reading starts the calibration over.
func resetForTest() {
	mu.Lock()
	defer mu.Unlock()
	cur.Store(nil)
	sampled = false
}

// TestNowNeverGoesBackThroughTheFirstAnchor starts the calibration over
// again and again and reads Now on two goroutines across the moment the
// first scale takes over from the runtime's clock: where a goroutine's
// reading from the runtime's clock is followed by one from the scale.
// (With the counter read after the runtime's clock in the anchor, 1 of
// 30 runs of it failed here.)
func TestNowNeverGoesBackThroughTheFirstAnchor(t *testing.T) {
	if !usable {
		t.Skip("the time-stamp counter is not the kernel's clock source here: Now is the runtime's clock, with no anchor to cross")
	}
	if testing.Short() {
		t.Skip("starts the calibration over 40 times, 20 ms each; not with -short")
	}
	for round := range 40 {
		resetForTest()
		for _, err := range readOnTwo(20*time.Millisecond, 256) {
			require.NoError(t, err, "round %d", round)
		}
		checkNearRuntime(t)
	}
}

// TestAnAnchorReadsNoEarlierThanTheRuntimeClock: a scale anchored on a
// sample and read at once is not behind the runtime's clock read just
// before it (it is what makes the switch from the runtime's clock to the
// first scale monotonic). A scale anchored on the counter read after the
// runtime's clock fails this about half the time.
func TestAnAnchorReadsNoEarlierThanTheRuntimeClock(t *testing.T) {
	if !usable {
		t.Skip("the time-stamp counter is not the kernel's clock source here: no scale is anchored")
	}
	n1, t1 := sample()
	time.Sleep(20 * time.Millisecond)
	n2, t2 := sample()
	mult, _ := bits.Div64(uint64(n2-n1)>>32, uint64(n2-n1)<<32, t2-t1)
	require.NotZero(t, mult)
	behind := 0
	for range 2000 {
		n, tk := sample()
		s := &scale{t0: tk, n0: n, raw: n, mult: mult}
		r := nanotime()
		if v := s.at(ticks()); v < r {
			behind++
		}
	}
	require.Zero(t, behind, "of 2000 scales anchored and read at once, %d read behind the runtime's clock read just before", behind)
}
