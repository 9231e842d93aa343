package fence

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHandshakeExcludes runs the handshake the package describes between
// a hot goroutine (Store, then an atomic load of the cold side's flag)
// and a cold one (an atomic store of its flag, Heavy, then a load of the
// hot side's word), each entering a critical section only when the other
// is not in or coming, and counts the times both were inside together.
// Without Heavy, x86's store buffer lets both in within a few thousand
// rounds on two cores.
func TestHandshakeExcludes(t *testing.T) {
	if !Ready() {
		t.Skip("membarrier is not available here: callers keep their locks, and there is no handshake to test")
	}
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two threads running at once (GOMAXPROCS >= 2)")
	}
	var hot, cold uint32
	var inside, both, hotIn, coldIn atomic.Int64
	enter := func(n *atomic.Int64) {
		if inside.Add(1) != 1 {
			both.Add(1)
		}
		n.Add(1)
		inside.Add(-1)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	if testing.Short() {
		deadline = time.Now().Add(100 * time.Millisecond)
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Add(2)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			Store(&hot, 1)
			if atomic.LoadUint32(&cold) == 0 {
				enter(&hotIn)
			}
			Store(&hot, 0)
		}
	}()
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			atomic.StoreUint32(&cold, 1)
			Heavy()
			for atomic.LoadUint32(&hot) != 0 {
				runtime.Gosched()
			}
			enter(&coldIn)
			atomic.StoreUint32(&cold, 0)
		}
		stop.Store(true)
	}()
	wg.Wait()
	if hotIn.Load() == 0 || coldIn.Load() == 0 {
		t.Fatalf("one side never got in (hot %d, cold %d): the test shows nothing", hotIn.Load(), coldIn.Load())
	}
	if n := both.Load(); n != 0 {
		t.Fatalf("both sides inside together %d times in %d hot and %d cold entries", n, hotIn.Load(), coldIn.Load())
	}
	t.Logf("%d hot and %d cold entries, never together", hotIn.Load(), coldIn.Load())
}

func TestStoreIsVisible(t *testing.T) {
	var v uint32
	Store(&v, 7)
	if got := atomic.LoadUint32(&v); got != 7 {
		t.Fatalf("Store(7) then load: %d", got)
	}
}
