package emu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// piece is the largest part of a destination a kernel writes before it
// yields (shorter destinations are written in two halves).
const piece = 4096

// item is one queued piece of work.
type item struct {
	seq   uint64
	what  string                 // "reduce float32 sum", for errors
	views []view                 // the memory it uses, held pending until it is done
	run   func(b [][]byte) error // b[i] is views[i].bytes(); nil for an event record
	ev    *Event                 // the event it completes, for Record
	done  chan struct{}          // closed when it has run (or been skipped)
}

// Stream is an emulated stream: a goroutine of its own, started by
// NewStream and stopped by Close, runs its items in order. Its methods are
// called by one goroutine at a time (device.go, obligation 5); calls that
// overlap return ErrConcurrentUse.
type Stream struct {
	dev *Device
	id  int
	rng *rand.Rand // the goroutine's only: delays and piece orders

	busy   atomic.Bool // a method is running (obligation 5's check)
	closed atomic.Bool // Close was called; set under mu
	wake   chan struct{}
	quit   chan struct{} // closed by Close: waits that still wait fail
	exited chan struct{} // closed when the goroutine returns

	mu    sync.Mutex // guards queue, last, seq and err
	queue []*item
	last  *item // the last item enqueued
	seq   uint64
	err   error // the sticky failure
}

var _ device.Stream = (*Stream)(nil)

// NewStream returns a new stream on d and starts its goroutine; Close
// stops it.
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	id := d.streams
	d.streams++
	d.mu.Unlock()
	s := &Stream{
		dev:    d,
		id:     id,
		rng:    rand.New(rand.NewPCG(d.opts.Seed, uint64(id))),
		wake:   make(chan struct{}, 1),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	go s.loop()
	return s, nil
}

// Device returns the stream's device.
func (s *Stream) Device() device.Device { return s.dev }

// enter starts a method call: it fails if another is running or the
// stream is closed. leave ends it.
func (s *Stream) enter(call string) error {
	if !s.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %s of stream %d", ErrConcurrentUse, call, s.id)
	}
	if s.closed.Load() {
		s.busy.Store(false)
		return fmt.Errorf("%w: %s of stream %d", ErrClosed, call, s.id)
	}
	return nil
}

func (s *Stream) leave() { s.busy.Store(false) }

// failure returns the sticky failure, or nil.
func (s *Stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// enqueue resolves bufs (under the device lock, so that Free cannot come
// between the check and the acquisition) and queues an item running run
// on them. Host buffers are allowed only where host[i] is set.
func (s *Stream) enqueue(what string, bufs []memory.Buffer, host []bool, run func([][]byte) error) error {
	if err := s.failure(); err != nil {
		return fmt.Errorf("emu: stream %d failed earlier: %w", s.id, err)
	}
	vs := make([]view, len(bufs))
	d := s.dev
	d.mu.Lock()
	for i, b := range bufs {
		if b.Kind() == memory.Host && host != nil && host[i] {
			vs[i] = view{host: b.Bytes()}
			continue
		}
		v, err := d.lookup(b, what)
		if err != nil {
			d.mu.Unlock()
			return err
		}
		vs[i] = v
	}
	for _, v := range vs {
		if v.a != nil {
			v.a.pending++
		}
	}
	d.mu.Unlock()
	s.push(&item{what: what, views: vs, run: run})
	return nil
}

func (s *Stream) push(it *item) {
	it.done = make(chan struct{})
	s.mu.Lock()
	s.seq++
	it.seq = s.seq
	s.queue = append(s.queue, it)
	s.last = it
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loop is the stream's goroutine.
func (s *Stream) loop() {
	defer close(s.exited)
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			it := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.mu.Unlock()
			s.exec(it)
			continue
		}
		s.mu.Unlock()
		if s.closed.Load() {
			return
		}
		<-s.wake
	}
}

// exec runs one item after its random delay, or skips it if the stream
// has failed.
func (s *Stream) exec(it *item) {
	if s.dev.maxDelay > 0 {
		time.Sleep(time.Duration(s.rng.Int64N(int64(s.dev.maxDelay) + 1)))
	}
	err := s.failure()
	if err == nil {
		err = s.dev.check(it.views)
		if err == nil {
			if it.run != nil {
				b := make([][]byte, len(it.views))
				for i, v := range it.views {
					b[i] = v.bytes()
				}
				err = it.run(b)
			}
			if rerr := s.dev.release(it.views); err == nil {
				err = rerr
			}
		} else {
			s.dev.release(it.views)
		}
		if err != nil {
			err = fmt.Errorf("emu: stream %d, item %d (%s): %w", s.id, it.seq, it.what, err)
			s.fail(err)
		}
	} else {
		s.dev.release(it.views)
	}
	if it.ev != nil {
		it.ev.at = time.Now()
		it.ev.err = err
		close(it.ev.done)
	}
	close(it.done)
}

// pieces returns the [lo, hi) ranges, on element boundaries, in which a
// kernel writes an n-byte destination of es-byte elements, in a random
// order.
func (s *Stream) pieces(n, es int) [][2]int {
	size := piece
	if n <= piece {
		size = n / es / 2 * es
		if size == 0 {
			size = n
		}
	}
	var ps [][2]int
	for lo := 0; lo < n; lo += size {
		ps = append(ps, [2]int{lo, min(lo+size, n)})
	}
	s.rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	return ps
}

// Reduce enqueues dst = a op b (and dst2 = the same when dst2 is not
// empty), divided by div when div > 1 (op Sum or Avg only; div 0 or 1
// divides by nothing). See device.Stream.
func (s *Stream) Reduce(dst, dst2, a, b memory.Buffer, t kernels.Type, op kernels.Op, div int) error {
	if err := s.enter("Reduce"); err != nil {
		return err
	}
	defer s.leave()
	what := fmt.Sprintf("reduce %v %v", t, op)
	if err := device.CheckReduce(dst, dst2, a, b, t, op, div); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	has2 := dst2.Len() > 0
	n, es := dst.Len(), t.Size()
	f := kernels.Reduce(t, op)
	if div > 1 {
		// kernels.ReduceFinal divides only for Avg; the seam's div
		// divides the sum, which Avg's Func computes.
		f = kernels.ReduceFinal(t, kernels.Avg, div)
	}
	bufs := []memory.Buffer{dst, a, b}
	if has2 {
		bufs = append(bufs, dst2)
	}
	return s.enqueue(what, bufs, nil, func(m [][]byte) error {
		for _, p := range s.pieces(n, es) {
			lo, hi := p[0], p[1]
			f(m[0][lo:hi], m[1][lo:hi], m[2][lo:hi])
			if has2 {
				copy(m[3][lo:hi], m[0][lo:hi])
			}
			runtime.Gosched()
		}
		return nil
	})
}

// Post enqueues dst = src / div (kernels.Post with Avg; div 1 copies).
// dst may be exactly src. See device.Stream.
func (s *Stream) Post(dst, src memory.Buffer, t kernels.Type, div int) error {
	if err := s.enter("Post"); err != nil {
		return err
	}
	defer s.leave()
	if err := device.CheckPost(dst, src, t, div); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	n, es := dst.Len(), t.Size()
	f := kernels.Post(t, kernels.Avg, div)
	if f == nil {
		f = func(dst, src []byte) { copy(dst, src) }
	}
	return s.enqueue(fmt.Sprintf("post %v /%d", t, div), []memory.Buffer{dst, src}, nil, func(m [][]byte) error {
		for _, p := range s.pieces(n, es) {
			lo, hi := p[0], p[1]
			f(m[0][lo:hi], m[1][lo:hi])
			runtime.Gosched()
		}
		return nil
	})
}

// Copy enqueues dst = src, and dst2 = src when dst2 is not empty. Host
// buffers may be on one side: src, or dst and dst2. Host memory must stay
// unchanged (src) or untouched (dst, dst2) until the copy has run: unlike
// CUDA's copies from pageable memory, this one is always asynchronous.
func (s *Stream) Copy(dst, dst2, src memory.Buffer) error {
	if err := s.enter("Copy"); err != nil {
		return err
	}
	defer s.leave()
	if err := device.CheckCopy(dst, dst2, src); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	has2 := dst2.Len() > 0
	n := dst.Len()
	fromHost := src.Kind() == memory.Host
	bufs := []memory.Buffer{dst, src}
	host := []bool{!fromHost, fromHost}
	if has2 {
		bufs = append(bufs, dst2)
		host = append(host, !fromHost)
	}
	return s.enqueue("copy", bufs, host, func(m [][]byte) error {
		for _, p := range s.pieces(n, 1) {
			lo, hi := p[0], p[1]
			copy(m[0][lo:hi], m[1][lo:hi])
			if has2 {
				copy(m[2][lo:hi], m[1][lo:hi])
			}
			runtime.Gosched()
		}
		return nil
	})
}

// Sync blocks until the work enqueued before it has run, and returns the
// stream's failure if it has failed; or, when ctx ends first, returns
// context.Cause(ctx) and leaves the work queued.
func (s *Stream) Sync(ctx context.Context) error {
	if err := s.enter("Sync"); err != nil {
		return err
	}
	defer s.leave()
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if last != nil {
		select {
		case <-last.done:
		default:
			select {
			case <-last.done:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	return s.failure()
}

// Record enqueues an event that completes, after its own random delay,
// when the work enqueued before it has run; it fails if that work failed.
func (s *Stream) Record() (device.Event, error) {
	if err := s.enter("Record"); err != nil {
		return nil, err
	}
	defer s.leave()
	if err := s.failure(); err != nil {
		return nil, fmt.Errorf("emu: stream %d failed earlier: %w", s.id, err)
	}
	ev := &Event{dev: s.dev, done: make(chan struct{})}
	s.push(&item{what: "record", ev: ev})
	return ev, nil
}

// WaitEvent makes the work enqueued after it wait until ev, an event of
// this device (any of its streams), completes; if ev fails, so does this
// stream. If the stream is closed while it still waits, the stream
// fails.
func (s *Stream) WaitEvent(ev device.Event) error {
	if err := s.enter("WaitEvent"); err != nil {
		return err
	}
	defer s.leave()
	e, ok := ev.(*Event)
	if !ok {
		return fmt.Errorf("emu: WaitEvent of a %T: not an emulated event", ev)
	}
	if e.dev != s.dev {
		return fmt.Errorf("emu: WaitEvent on device %d of an event of another emulated device (%d)", s.dev.ordinal, e.dev.ordinal)
	}
	if e.closed.Load() {
		return fmt.Errorf("emu: WaitEvent of a closed event")
	}
	return s.enqueue("wait event", nil, nil, func([][]byte) error {
		select {
		case <-e.done:
		case <-s.quit:
			// Not failing would hang Close when e's stream waits for
			// something that only comes after this Close (a test's
			// cleanups run in reverse order).
			select {
			case <-e.done:
			default:
				return fmt.Errorf("stream closed while waiting for an event")
			}
		}
		if e.err != nil {
			return fmt.Errorf("the event waited for failed: %w", e.err)
		}
		return nil
	})
}

// WaitValue makes the work enqueued after it wait until the uint32 at
// flag (4 bytes of Mapped memory of this device, 4-aligned) is at least v
// modulo wrap-around: int32(got-v) >= 0. If the stream is closed while it
// still waits, the stream fails.
func (s *Stream) WaitValue(flag memory.Buffer, v uint32) error {
	if err := s.enter("WaitValue"); err != nil {
		return err
	}
	defer s.leave()
	if flag.Kind() != memory.Mapped {
		return fmt.Errorf("emu: WaitValue on %v memory: the flag must be mapped memory", flag.Kind())
	}
	_, ptr := flag.Device()
	if flag.Len() != 4 || ptr%4 != 0 {
		return fmt.Errorf("emu: WaitValue flag of %d bytes at %#x: want 4 bytes, 4-byte aligned", flag.Len(), ptr)
	}
	return s.enqueue(fmt.Sprintf("wait value %d at %#x", v, ptr), []memory.Buffer{flag}, nil, func(m [][]byte) error {
		p := (*uint32)(unsafe.Pointer(unsafe.SliceData(m[0])))
		pause := time.Microsecond
		for polls := 0; ; polls++ {
			got := atomic.LoadUint32(p)
			if int32(got-v) >= 0 {
				return nil
			}
			select {
			case <-s.quit:
				return fmt.Errorf("stream closed while waiting for %d at %#x (the flag holds %d)", v, ptr, got)
			default:
			}
			// Spin a little, then back off: a test may hold a stream
			// for a long time.
			if polls < 64 {
				runtime.Gosched()
				continue
			}
			timer := time.NewTimer(pause)
			select {
			case <-timer.C:
			case <-s.quit:
				timer.Stop()
			}
			pause = min(2*pause, time.Millisecond)
		}
	})
}

// Close waits for the queued work, stops the stream's goroutine and
// returns the stream's failure, if any. A WaitValue or WaitEvent that
// still waits when Close is called fails the stream instead of hanging
// Close (the work after it is skipped). Later calls of other methods
// return ErrClosed; Close again returns nil.
func (s *Stream) Close() error {
	if !s.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Close of stream %d", ErrConcurrentUse, s.id)
	}
	defer s.leave()
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	s.mu.Unlock()
	close(s.quit)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.exited
	return s.failure()
}

// Event is an emulated event. Its methods are safe for concurrent use.
type Event struct {
	dev    *Device
	done   chan struct{} // closed when the event completes
	at     time.Time     // completion time; written before done is closed
	err    error         // the failure of the work before it; ditto
	closed atomic.Bool
}

var _ device.Event = (*Event)(nil)

// Done reports whether the work before the event has run, and its
// failure.
func (e *Event) Done() (bool, error) {
	if e.closed.Load() {
		return false, fmt.Errorf("emu: Done of a closed event")
	}
	select {
	case <-e.done:
		return true, e.err
	default:
		return false, nil
	}
}

// Sync blocks until the event completes, and returns the failure of the
// work before it; or returns context.Cause(ctx) when ctx ends first.
func (e *Event) Sync(ctx context.Context) error {
	if e.closed.Load() {
		return fmt.Errorf("emu: Sync of a closed event")
	}
	select {
	case <-e.done:
		return e.err
	default:
	}
	select {
	case <-e.done:
		return e.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Since returns the time between start's completion and e's, both
// completed events of this device.
func (e *Event) Since(start device.Event) (time.Duration, error) {
	st, ok := start.(*Event)
	switch {
	case !ok:
		return 0, fmt.Errorf("emu: Since of a %T: not an emulated event", start)
	case st.dev != e.dev:
		return 0, fmt.Errorf("emu: Since of events of two emulated devices")
	case e.closed.Load() || st.closed.Load():
		return 0, fmt.Errorf("emu: Since of a closed event")
	}
	for _, x := range []*Event{st, e} {
		select {
		case <-x.done:
		default:
			return 0, fmt.Errorf("emu: Since of an event that has not completed")
		}
	}
	return e.at.Sub(st.at), nil
}

// Close releases the event; further calls fail (Close again does
// nothing).
func (e *Event) Close() error {
	e.closed.Store(true)
	return nil
}
