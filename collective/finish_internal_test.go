package collective

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestUnseenFinishIsStampedByTheWatchdog: a blocking operation on the
// fast path leaves its finish time unseen (one clock read per operation,
// finishUnseen), and with nothing else issued or read, the watchdog's next
// round (every second at most) stamps it: no later than when it looked,
// no earlier than the operation started.
func TestUnseenFinishIsStampedByTheWatchdog(t *testing.T) {
	if !fastOps.Load() {
		t.Skip("the fast path is off here (fence.Ready is false), so no finish is left unseen")
	}
	comms, err := NewLocalGroup(2)
	require.NoError(t, err)
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(comms))
	for i, c := range comms {
		wg.Go(func() {
			v := []float32{float32(i + 1)}
			errs[i] = AllReduce(context.Background(), c, v, v, Sum)
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	c := comms[0]
	latest := func() (start, fin int64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		r := c.flight[(c.seq-1)%flightOps]
		require.True(t, r.finished)
		return r.start, r.finishNs
	}
	_, fin := latest()
	require.Equal(t, int64(finishUnseen), fin, "a blocking operation with nothing in flight finishes on the fast path, its time unseen")
	before := c.since()
	var start int64
	require.Eventually(t, func() bool {
		start, fin = latest()
		return fin != finishUnseen
	}, 5*time.Second, 20*time.Millisecond, "the watchdog stamps it within its round")
	require.GreaterOrEqual(t, fin, start)
	require.GreaterOrEqual(t, fin, before, "stamped when it was seen, after the operation")
}
