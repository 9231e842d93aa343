package collective

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOpMutexExcludes has goroutines that run "operations" the way run
// does (enter, the issue window, running, the finish window or the lock)
// increment a plain counter in their windows, beside goroutines that
// lock the mutex and increment it too; an overlap loses increments (and
// the race detector, which sees the handshake's stores as synchronising,
// reports it).
func TestOpMutexExcludes(t *testing.T) {
	t.Run("barrier", func(t *testing.T) { testOpMutexExcludes(t, false) })
	// A kernel that refuses the barrier after fence.Ready said yes: a
	// holder that meets an operation stops the world instead, and the
	// fast path goes off.
	t.Run("refused", func(t *testing.T) { testOpMutexExcludes(t, true) })
}

func testOpMutexExcludes(t *testing.T, refuse bool) {
	if !fastOps.Load() {
		t.Skip("the fast path is off here (fence.Ready is false)")
	}
	defer fastOps.Store(true)
	if refuse {
		old := heavy
		heavy = func() bool { return false }
		defer func() { heavy = old }()
	}
	var m opMutex
	var count int // written only by whoever holds the records
	var want, fast, slowFinish, inside, overlaps atomic.Int64
	touch := func() {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		count++
		want.Add(1)
		inside.Add(-1)
	}
	d := 200 * time.Millisecond
	if testing.Short() {
		d = 50 * time.Millisecond
	}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				if !m.enter() {
					// As issue does when it cannot take the fast path;
					// but mostly yield and try again, or under the race
					// detector operations that lock keep the others
					// out of the fast path for good.
					if i%8 == 0 {
						m.Lock()
						touch()
						m.Unlock()
					} else {
						runtime.Gosched()
					}
					continue
				}
				fast.Add(1)
				touch()
				m.running()
				for i := 0; i < 50; i++ { // the engine
					_ = i
				}
				if m.finishing() {
					touch()
					m.idle()
					continue
				}
				slowFinish.Add(1)
				m.Lock()
				touch()
				m.idle()
				m.Unlock()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				m.Lock()
				touch()
				m.Unlock()
				time.Sleep(20 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if fast.Load() == 0 && !refuse {
		// (Refused, the first holder to meet an operation still in enter
		// turns the fast path off before it is counted.)
		t.Fatal("no operation took the fast path: the test shows nothing about it")
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d overlaps between holders of the records", n)
	}
	if int64(count) != want.Load() {
		t.Fatalf("count %d, want %d: increments were lost", count, want.Load())
	}
	if f := atomic.LoadUint32(&m.fast); f != fastIdle {
		t.Fatalf("fast = %d at the end, want idle", f)
	}
	if refuse && fastOps.Load() {
		t.Fatal("the barrier was refused, and the fast path is still on")
	}
	t.Logf("%d fast operations (%d finished under the lock), %d entries in all",
		fast.Load(), slowFinish.Load(), want.Load())
}

// TestBlockingOpsBesideReaders runs blocking all-reduces on every rank of
// a local group while other goroutines read the flight recorder and
// issue asynchronous operations between them (each rank in the same
// order), with the fast path on and off: the results and the recorder
// must be right either way.
func TestBlockingOpsBesideReaders(t *testing.T) {
	for _, on := range []bool{true, false} {
		name := "fast"
		if !on {
			name = "locked"
		}
		t.Run(name, func(t *testing.T) {
			if on && !fastOps.Load() {
				t.Skip("the fast path is off here (fence.Ready is false)")
			}
			old := fastOps.Load()
			fastOps.Store(on)
			defer fastOps.Store(old)
			const n, rounds = 3, 300
			comms, err := NewLocalGroup(n)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, c := range comms {
					c.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stop atomic.Bool
			var readers sync.WaitGroup
			for _, c := range comms {
				readers.Go(func() {
					var b bytes.Buffer
					for !stop.Load() {
						b.Reset()
						if err := c.DebugDump(&b); err != nil {
							t.Errorf("rank %d: DebugDump: %v", c.Rank(), err)
							return
						}
						time.Sleep(50 * time.Microsecond)
					}
				})
			}
			var wg sync.WaitGroup
			for _, c := range comms {
				wg.Go(func() {
					buf, side := []float32{0}, []float32{0}
					for i := range rounds {
						buf[0] = float32(c.Rank() + i)
						var r *Request
						if i%50 == 49 {
							// An asynchronous one first: the blocking call
							// waits for it, in the lock's path.
							side[0] = float32(c.Rank())
							var err error
							if r, err = StartAllReduce(ctx, c, side, side, Sum); err != nil {
								t.Errorf("rank %d: StartAllReduce %d: %v", c.Rank(), i, err)
								return
							}
						}
						if err := AllReduce(ctx, c, buf, buf, Sum); err != nil {
							t.Errorf("rank %d: AllReduce %d: %v", c.Rank(), i, err)
							return
						}
						if want := float32(n*i + n*(n-1)/2); buf[0] != want {
							t.Errorf("rank %d: round %d: %v, want %v", c.Rank(), i, buf[0], want)
							return
						}
						if r == nil {
							continue
						}
						if err := r.Wait(ctx); err != nil {
							t.Errorf("rank %d: wait %d: %v", c.Rank(), i, err)
							return
						}
						if want := float32(n * (n - 1) / 2); side[0] != want {
							t.Errorf("rank %d: round %d, asynchronous: %v, want %v", c.Rank(), i, side[0], want)
							return
						}
					}
				})
			}
			wg.Wait()
			stop.Store(true)
			readers.Wait()
			var b bytes.Buffer
			if err := comms[0].DebugDump(&b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(b.Bytes(), []byte(`"op": "allreduce"`)) {
				t.Fatalf("the dump names no all-reduce:\n%s", b.String())
			}
		})
	}
}
