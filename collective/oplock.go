package collective

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/internal/fence"
)

// opMutex guards a communicator's records of its operations (Comm.mu:
// closed, tail, lanes, seq, flight, pending, op). Everything but one path
// locks it as a sync.Mutex. That path is a blocking operation issued
// while nothing else is in flight, a loop's every call: it takes the
// records without the lock when no other goroutine holds it, and pays no
// locked instruction but one compare-and-swap at issue.
//
// Why: an 8-byte broadcast over shared memory takes 0.17 µs, and its
// root's store to the board's entry, a line the reader polls, waits for
// that line to come back from the reader's core at the first locked
// instruction after it: finish's lock. Issue and finish under a
// sync.Mutex are four locked instructions; the operation without them
// took 0.09 µs, Open MPI's 0.07 (docs/performance.md, thirteenth
// session).
//
// How. fast is where such an operation is: fastIdle (none), fastIssuing
// and fastFinishing (it is writing the records: its windows), fastRunning
// (between them, in the engine). slow counts holders of the lock. The
// operation enters with fast's compare-and-swap from fastIdle and then
// reads slow: a holder that came first makes it leave and lock instead.
// A holder adds itself to slow and then reads fast: an operation in a
// window makes it wait for the window to close (the windows neither
// block nor take locks, so this is short). Both sides' first steps are
// locked instructions, so one of them sees the other (Dekker). The
// window at finish opens with a plain store (fence.Store), not a locked
// instruction: that is the point. So a holder that finds an operation
// past fastIdle runs fence.Heavy after adding itself: from then on the
// operation's read of slow at finish sees it, or the holder sees the
// window. The operation's stores between issue and finish are published
// by its release stores to fast, and a holder's by its atomic decrement
// of slow, which the operation reads before it writes.
//
// A holder pays a membarrier system call (some microseconds) only when
// it meets an operation past fastIdle: the watchdog once a second during
// a long operation, and a goroutine that issues beside another's
// blocking call. Where fence.Ready is false, the fast path is off and
// this is a sync.Mutex with two atomic adds; if the kernel refuses a
// barrier later, the holder stops the world instead (see Lock), and the
// fast path goes off. Lock never waits for an operation to end, only for
// its windows, so the operation's own goroutine may lock it (an abort on
// a failure path) and the watchdog may while it runs.
type opMutex struct {
	mu   sync.Mutex
	fast uint32       // fastIdle, fastIssuing, fastRunning, fastFinishing (atomic)
	slow atomic.Int32 // holders of mu, each from after its Lock to its Unlock
}

const (
	fastIdle = iota
	fastIssuing
	fastRunning
	fastFinishing
)

// fastOps: whether blocking operations may take the records without the
// lock: fence.Ready, checked once, and off for good if a barrier is ever
// refused (tests turn it off to compare).
var fastOps atomic.Bool

func init() { fastOps.Store(fence.Ready()) }

// heavy is fence.Heavy (tests make it fail).
var heavy = fence.Heavy

// Lock locks m, waiting for a fast operation's window to close.
func (m *opMutex) Lock() {
	m.mu.Lock()
	m.slow.Add(1)
	if atomic.LoadUint32(&m.fast) == fastIdle {
		// An operation that enters from here on does so with a locked
		// instruction, and then sees slow.
		return
	}
	if !heavy() {
		// Refused since fence.Ready (a seccomp filter installed later):
		// no more fast operations, and a stop of the world for this one.
		// The runtime stops every goroutine that runs Go code with a
		// locked instruction (its status's compare-and-swap) at a safe
		// point, and one in a system call passed one on the way in and
		// passes one on the way out: so the operation's plain store is
		// visible once the stop is over, or its later read of slow comes
		// after one of those and sees this holder, as with the barrier.
		fastOps.Store(false)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms) // stops the world
	}
	for i := 0; ; i++ {
		if f := atomic.LoadUint32(&m.fast); f == fastIdle || f == fastRunning {
			return
		}
		backoff(i)
	}
}

// backoff is the i-th wait for a window to close: a window is a few dozen
// instructions, but its goroutine may have been preempted in it.
func backoff(i int) {
	if i < 64 {
		runtime.Gosched()
	} else {
		time.Sleep(time.Microsecond)
	}
}

// Unlock unlocks m.
func (m *opMutex) Unlock() {
	m.mu.Unlock()
	m.slow.Add(-1)
}

// enter opens the issue window of a blocking operation: true when the
// caller may write the records without the lock until running.
func (m *opMutex) enter() bool {
	if !fastOps.Load() || !atomic.CompareAndSwapUint32(&m.fast, fastIdle, fastIssuing) {
		return false
	}
	if m.slow.Load() != 0 {
		fence.Store(&m.fast, fastIdle)
		return false
	}
	return true
}

// running closes the issue window: the operation is in the engine.
func (m *opMutex) running() { fence.Store(&m.fast, fastRunning) }

// finishing opens the finish window, or returns false when a holder of
// the lock is in: then the caller locks m, finishes, and calls idle
// before Unlock.
func (m *opMutex) finishing() bool {
	fence.Store(&m.fast, fastFinishing)
	if m.slow.Load() != 0 {
		fence.Store(&m.fast, fastRunning)
		return false
	}
	return true
}

// idle closes the finish window (or, under the lock, ends the fast
// operation): another may enter.
func (m *opMutex) idle() { fence.Store(&m.fast, fastIdle) }
