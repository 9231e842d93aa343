package cuda

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/cuda/ptx"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

const (
	streamNonBlocking = 1 // CU_STREAM_NON_BLOCKING
	eventDefault      = 0 // CU_EVENT_DEFAULT: can time
	eventNoTiming     = 2 // CU_EVENT_DISABLE_TIMING
	waitValueGEQ      = 0 // CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0
)

// Stream is a CUDA stream on one device. Its methods are called by one
// goroutine at a time (internal/device, obligation 5); it implements
// device.Stream.
type Stream struct {
	dev     *Device
	st      *devState
	h       uintptr // CUstream
	owned   bool    // created by NewStream (Close destroys it)
	closed  bool
	scratch uintptr      // cuCtxGetCurrent's answer and other out-values: see devState.enter
	params  *launchBlock // kernel parameters of the launch being made
}

// launchBlock is cuLaunchKernel's kernelParams: ptrs[i] points to the value
// of parameter i. It is a heap object of the Stream, pinned during each
// launch (it is passed to C and holds pointers into itself); the driver
// copies the values during cuLaunchKernel, so one block serves every
// launch. Each value takes 8 bytes, little-endian: a 32-bit parameter (div)
// reads its low half.
type launchBlock struct {
	vals [6]uint64
	ptrs [6]unsafe.Pointer
}

var _ device.Stream = (*Stream)(nil)

func newLaunchBlock() *launchBlock {
	b := new(launchBlock)
	for i := range b.ptrs {
		b.ptrs[i] = unsafe.Pointer(&b.vals[i])
	}
	return b
}

// NewStream returns a new stream on the device (cuStreamCreate with
// NON_BLOCKING: it does not synchronise with the legacy default stream).
// Close destroys it.
func (dev *Device) NewStream() (device.Stream, error) {
	if err := dev.live("NewStream"); err != nil {
		return nil, err
	}
	s := &Stream{dev: dev, st: dev.st, owned: true, params: newLaunchBlock()}
	d := dev.st.drv
	err := dev.st.do(func() error {
		return d.check("cuStreamCreate", callN(d.fn.streamCreate, uintptr(unsafe.Pointer(&s.h)), streamNonBlocking))
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// StreamFromHandle wraps a CUstream that someone else created on dev (a
// framework's own stream), so that goccl's work can be enqueued on it. The
// stream is not owned: Close waits for its work but does not destroy it,
// and the caller keeps it alive until then. h == 0 is the legacy default
// stream.
func StreamFromHandle(dev *Device, h uintptr) *Stream {
	return &Stream{dev: dev, st: dev.st, h: h, params: newLaunchBlock()}
}

// Handle returns the CUstream.
func (s *Stream) Handle() uintptr { return s.h }

// Device returns the stream's device.
func (s *Stream) Device() device.Device { return s.dev }

func (s *Stream) enter(call string) error {
	if s.closed {
		return fmt.Errorf("cuda: %s on a closed stream: %w", call, ErrClosed)
	}
	return s.st.enter(&s.scratch)
}

func (s *Stream) exit() { s.st.exit() }

// kernelBuffer checks that b is memory a kernel on this stream's device
// reaches (internal/device, obligation 1).
func (s *Stream) kernelBuffer(call, role string, b memory.Buffer) error {
	if !b.DeviceVisible() {
		return fmt.Errorf("cuda: %s: %s is %v memory: kernels reach only device or mapped memory", call, role, b.Kind())
	}
	if ord, _ := b.Device(); ord != s.st.ordinal {
		return fmt.Errorf("cuda: %s on device %d: %s is %v memory of device %d", call, s.st.ordinal, role, b.Kind(), ord)
	}
	return nil
}

func devPtr(b memory.Buffer) uint64 {
	if b.Len() == 0 {
		return 0
	}
	_, p := b.Device()
	return uint64(p)
}

// launch runs kernel f over nbytes with the first n values of s.params;
// the caller has entered the context.
func (s *Stream) launch(call string, f uintptr, nbytes int, n int) error {
	grid := ptx.Grid(nbytes)
	d := s.st.drv
	p := s.params
	clear(p.vals[n:])
	var pin runtime.Pinner
	pin.Pin(p)
	r := callN(d.fn.launchKer, f, uintptr(grid), 1, 1, ptx.BlockThreads, 1, 1, 0, s.h,
		uintptr(unsafe.Pointer(&p.ptrs[0])), 0)
	pin.Unpin()
	if r != 0 {
		return fmt.Errorf("cuda: %s of %d bytes: %w", call, nbytes, d.newError("cuLaunchKernel", r))
	}
	return nil
}

// Reduce enqueues dst[i] = a[i] op b[i] for elements of type t (Avg: the
// sum), and the same into dst2 when dst2 is not empty (kernel
// ptx.ReduceName(t, op)).
// div > 1 divides every result by div (Avg's last step, as
// kernels.ReduceFinal(t, Avg, div)); it is allowed with Sum and Avg only.
// Buffers are checked as internal/device's obligations 1 and 2 say, and a
// violation is an error, nothing enqueued; so is nothing to do (empty
// buffers) but without error.
func (s *Stream) Reduce(dst, dst2, a, b memory.Buffer, t kernels.Type, op kernels.Op, div int) error {
	const call = "Reduce"
	if err := device.CheckReduce(dst, dst2, a, b, t, op, div); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if uint64(div) > math.MaxUint32 {
		return fmt.Errorf("cuda: Reduce with div %d: the kernels take a 32-bit divisor", div)
	}
	if !ptx.HasKernels(t) {
		return fmt.Errorf("cuda: Reduce of %v: goccl has no CUDA kernels for it yet", t)
	}
	n, es := dst.Len(), t.Size()
	has2 := dst2.Len() > 0
	for _, x := range []struct {
		role string
		b    memory.Buffer
	}{{"dst", dst}, {"dst2", dst2}, {"a", a}, {"b", b}} {
		if x.role == "dst2" && !has2 {
			continue
		}
		if err := s.kernelBuffer(call, x.role, x.b); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	if err := s.enter(call); err != nil {
		return err
	}
	defer s.exit()
	m, err := s.st.kernels()
	if err != nil {
		return err
	}
	// div > 1 goes to the sum kernel, the only one that divides (the ABI
	// of package ptx); without it Avg is the sum.
	kop, kdiv := op, uint64(0)
	if div > 1 {
		kop, kdiv = kernels.Sum, uint64(div)
	}
	p := s.params
	p.vals[0], p.vals[1], p.vals[2], p.vals[3] = devPtr(dst), devPtr(dst2), devPtr(a), devPtr(b)
	p.vals[4], p.vals[5] = uint64(n/es), kdiv
	return s.launch(call, m.reduce[t][kop], n, 6)
}

// Post enqueues dst[i] = src[i] / div (kernel ptx.PostName(t); Avg of one
// contribution, as kernels.Post(t, Avg, div)); div must be at least 1, and
// 1 copies. dst may be exactly src.
func (s *Stream) Post(dst, src memory.Buffer, t kernels.Type, div int) error {
	const call = "Post"
	if err := device.CheckPost(dst, src, t, div); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if uint64(div) > math.MaxUint32 {
		return fmt.Errorf("cuda: Post with div %d: the kernels take a 32-bit divisor", div)
	}
	if !ptx.HasKernels(t) {
		return fmt.Errorf("cuda: Post of %v: goccl has no CUDA kernels for it yet", t)
	}
	n := dst.Len()
	if err := s.kernelBuffer(call, "dst", dst); err != nil {
		return err
	}
	if err := s.kernelBuffer(call, "src", src); err != nil {
		return err
	}
	if n == 0 || (div == 1 && dst.Same(src)) {
		return nil
	}
	if err := s.enter(call); err != nil {
		return err
	}
	defer s.exit()
	m, err := s.st.kernels()
	if err != nil {
		return err
	}
	p := s.params
	p.vals[0], p.vals[1], p.vals[2], p.vals[3] = devPtr(dst), devPtr(src), uint64(n/t.Size()), uint64(div)
	return s.launch(call, m.post[t], n, 4)
}

// Copy enqueues dst = src, and dst2 = src when dst2 is not empty. Device
// and mapped memory are of this stream's device; Host (pageable) memory may
// be on one side: the source, or the destinations. dst may be exactly src
// (nothing to copy there); dst2 overlaps neither.
//
// How: with dst2 and all three reachable by a kernel, the goccl_copy kernel
// reads src once and writes both. Otherwise one driver copy per
// destination: cuMemcpyDtoDAsync between device-visible buffers (the
// driver's copy runs at the device's full bandwidth, needs no kernel module
// and takes any alignment), cuMemcpyHtoDAsync from pageable memory (it
// returns once src is staged, so src may change afterwards),
// cuMemcpyDtoHAsync into pageable memory (it returns once the copy is
// done: the stream's earlier work included). Host memory that is in fact
// pinned makes those copies asynchronous: it must then stay untouched until
// the stream has been synchronised.
func (s *Stream) Copy(dst, dst2, src memory.Buffer) error {
	const call = "Copy"
	if err := device.CheckCopy(dst, dst2, src); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	n := src.Len()
	has2 := dst2.Len() > 0
	bufs := []struct {
		role string
		b    memory.Buffer
	}{{"dst", dst}, {"dst2", dst2}, {"src", src}}
	for _, x := range bufs {
		if x.b.Kind() == memory.Host || (x.role == "dst2" && !has2) {
			continue
		}
		if err := s.kernelBuffer(call, x.role, x.b); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	if err := s.enter(call); err != nil {
		return err
	}
	defer s.exit()
	if has2 && dst.DeviceVisible() && dst2.DeviceVisible() && src.DeviceVisible() && !dst.Same(src) {
		m, err := s.st.kernels()
		if err != nil {
			return err
		}
		p := s.params
		p.vals[0], p.vals[1], p.vals[2], p.vals[3] = devPtr(dst), devPtr(dst2), devPtr(src), uint64(n)
		return s.launch(call, m.copy, n, 4)
	}
	if err := s.copy(dst, src); err != nil {
		return err
	}
	if has2 {
		return s.copy(dst2, src)
	}
	return nil
}

// copy is one driver copy; the caller has entered the context.
func (s *Stream) copy(dst, src memory.Buffer) error {
	if dst.Same(src) {
		return nil
	}
	d := s.st.drv
	n := uintptr(src.Len())
	switch {
	case dst.DeviceVisible() && src.DeviceVisible():
		return d.check("cuMemcpyDtoDAsync", callN(d.fn.memcpyDtoDAsync, uintptr(devPtr(dst)), uintptr(devPtr(src)), n, s.h))
	case dst.DeviceVisible():
		h := src.Bytes()
		return d.check("cuMemcpyHtoDAsync", callN(d.fn.memcpyHtoDAsync, uintptr(devPtr(dst)), uintptr(unsafe.Pointer(&h[0])), n, s.h))
	default:
		h := dst.Bytes()
		return d.check("cuMemcpyDtoHAsync", callN(d.fn.memcpyDtoHAsync, uintptr(unsafe.Pointer(&h[0])), uintptr(devPtr(src)), n, s.h))
	}
}

// query reports whether the stream's work has finished (cuStreamQuery).
func (s *Stream) query() (bool, error) {
	if err := s.enter("Sync"); err != nil {
		return false, err
	}
	r := callN(s.st.drv.fn.streamQuery, s.h)
	s.exit()
	switch r {
	case 0:
		return true, nil
	case errNotReady:
		return false, nil
	}
	return false, s.st.drv.newError("cuStreamQuery", r)
}

// Sync blocks until all work enqueued so far has finished, polling
// cuStreamQuery (a short spin, then yields, then sleeps of up to 200 µs,
// so that a long wait does not hold a CPU). When ctx ends first it returns
// context.Cause(ctx); the work goes on and the stream stays usable. An
// error of the work (a faulting kernel) is returned as the driver's
// *Error; the context is then unusable, as CUDA's sticky errors make it.
func (s *Stream) Sync(ctx context.Context) error {
	return poll(ctx, s.query)
}

// Polling schedule of Sync.
const (
	spinPolls  = 64
	yieldPolls = 256
	maxSleep   = 200 * time.Microsecond
)

func poll(ctx context.Context, done func() (bool, error)) error {
	sleep := 5 * time.Microsecond
	for i := 0; ; i++ {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		switch {
		case i < spinPolls:
		case i < spinPolls+yieldPolls:
			runtime.Gosched()
		default:
			time.Sleep(sleep)
			sleep = min(2*sleep, maxSleep)
		}
	}
}

// Record enqueues an event that completes when the work enqueued so far
// has (cuEventCreate with DISABLE_TIMING, cuEventRecord). Such events are
// cheaper to record and wait on; Since needs events from RecordTiming.
// The caller closes the event.
func (s *Stream) Record() (device.Event, error) {
	return s.record(eventNoTiming)
}

// RecordTiming is Record with an event that can time (CU_EVENT_DEFAULT),
// for Event.Since.
func (s *Stream) RecordTiming() (*Event, error) {
	return s.record(eventDefault)
}

func (s *Stream) record(flags uintptr) (*Event, error) {
	if err := s.enter("Record"); err != nil {
		return nil, err
	}
	defer s.exit()
	d := s.st.drv
	// s.scratch is free once the context is current.
	if err := d.check("cuEventCreate", callN(d.fn.eventCreate, uintptr(unsafe.Pointer(&s.scratch)), flags)); err != nil {
		return nil, err
	}
	ev := &Event{st: s.st, h: s.scratch, timing: flags == eventDefault}
	if err := d.check("cuEventRecord", callN(d.fn.eventRecord, ev.h, s.h)); err != nil {
		callN(d.fn.eventDestroy, ev.h)
		return nil, err
	}
	return ev, nil
}

// WaitEvent makes work enqueued after it wait until ev (an *Event of this
// package, of any device) completes (cuStreamWaitEvent).
func (s *Stream) WaitEvent(ev device.Event) error {
	e, ok := ev.(*Event)
	if !ok {
		return fmt.Errorf("cuda: WaitEvent on a %T: want a *cuda.Event", ev)
	}
	if e.closed.Load() {
		return fmt.Errorf("cuda: WaitEvent on a closed event: %w", ErrClosed)
	}
	if err := s.enter("WaitEvent"); err != nil {
		return err
	}
	defer s.exit()
	d := s.st.drv
	return d.check("cuStreamWaitEvent", callN(d.fn.streamWaitEvent, s.h, e.h, 0))
}

// WaitValue makes work enqueued after it wait until the 32-bit word at flag
// (4 bytes, 4-byte aligned, of mapped or device memory of this device)
// holds v' with int32(v'-v) >= 0 (cuStreamWaitValue32 with
// CU_STREAM_WAIT_VALUE_GEQ). A host store to a mapped flag releases it.
// Where the driver cannot do this it returns an error matching
// ErrNoStreamMemOps, and nothing is enqueued: the caller then waits on the
// host and orders the stream with an event.
func (s *Stream) WaitValue(flag memory.Buffer, v uint32) error {
	const call = "WaitValue"
	if err := s.kernelBuffer(call, "flag", flag); err != nil {
		return err
	}
	_, p := flag.Device()
	if flag.Len() != 4 || p%4 != 0 {
		return fmt.Errorf("cuda: WaitValue flag of %d bytes at %#x: want 4 bytes, 4-byte aligned", flag.Len(), p)
	}
	d := s.st.drv
	if d.fn.streamWaitValue32 == 0 || (!d.waitValueV2 && !s.st.v1MemOp) {
		return fmt.Errorf("cuda: WaitValue on device %d (%s): %w", s.st.ordinal, d, ErrNoStreamMemOps)
	}
	if err := s.enter(call); err != nil {
		return err
	}
	defer s.exit()
	if r := callN(d.fn.streamWaitValue32, s.h, p, uintptr(v), waitValueGEQ); r != 0 {
		e := d.newError("cuStreamWaitValue32", r)
		if r == errNotSupported {
			return wrap(e.Error(), ErrNoStreamMemOps, e)
		}
		return e
	}
	return nil
}

// Close waits for the stream's work (cuStreamSynchronize) and, for a stream
// from NewStream, destroys it. Close again returns nil; other methods of a
// closed stream return ErrClosed.
func (s *Stream) Close() error {
	if s.closed {
		return nil
	}
	if err := s.enter("Close"); err != nil {
		s.closed = true
		return err
	}
	defer s.exit()
	s.closed = true
	d := s.st.drv
	err := d.check("cuStreamSynchronize", callN(d.fn.streamSynchronize, s.h))
	if s.owned {
		if e := d.check("cuStreamDestroy", callN(d.fn.streamDestroy, s.h)); err == nil {
			err = e
		}
	}
	return err
}

// Event marks a point in a stream's work. Its methods are safe for
// concurrent use with each other, but not with Close. It implements
// device.Event.
type Event struct {
	st     *devState
	h      uintptr // CUevent
	timing bool
	closed atomic.Bool
}

var _ device.Event = (*Event)(nil)

// Handle returns the CUevent.
func (e *Event) Handle() uintptr { return e.h }

func (e *Event) query() (bool, error) {
	if e.closed.Load() {
		return false, fmt.Errorf("cuda: query of a closed event: %w", ErrClosed)
	}
	var cur uintptr
	if err := e.st.enter(&cur); err != nil {
		return false, err
	}
	r := callN(e.st.drv.fn.eventQuery, e.h)
	e.st.exit()
	switch r {
	case 0:
		return true, nil
	case errNotReady:
		return false, nil
	}
	return false, e.st.drv.newError("cuEventQuery", r)
}

// Done reports whether the work before the event has finished
// (cuEventQuery).
func (e *Event) Done() (bool, error) { return e.query() }

// Sync blocks until the event completes, polling as Stream.Sync does, or
// until ctx ends (context.Cause(ctx)).
func (e *Event) Sync(ctx context.Context) error { return poll(ctx, e.query) }

// Since returns the device time from start to e (cuEventElapsedTime, in
// steps of about 0.5 µs). Both come from RecordTiming and have completed.
func (e *Event) Since(start device.Event) (time.Duration, error) {
	s, ok := start.(*Event)
	if !ok {
		return 0, fmt.Errorf("cuda: Since a %T: want a *cuda.Event", start)
	}
	if e.closed.Load() || s.closed.Load() {
		return 0, fmt.Errorf("cuda: Since with a closed event: %w", ErrClosed)
	}
	if !e.timing || !s.timing {
		return 0, fmt.Errorf("cuda: Since needs events from RecordTiming (Record's do not time)")
	}
	var ms float32
	err := e.st.do(func() error {
		return e.st.drv.check("cuEventElapsedTime", callN(e.st.drv.fn.eventElapsedTime, uintptr(unsafe.Pointer(&ms)), s.h, e.h))
	})
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close releases the event (cuEventDestroy; a pending event is released
// once it completes). Close again returns nil.
func (e *Event) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	d := e.st.drv
	return e.st.do(func() error { return d.check("cuEventDestroy", callN(d.fn.eventDestroy, e.h)) })
}
