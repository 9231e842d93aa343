package bench

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/cuda"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

// Sweeps on device memory (Options.Stream). The sweeper keeps its host
// slices as mirrors of device buffers of the same shape: inputs are
// filled on the host and copied to the device, every operation is the
// Device form on the rank's stream, and a checked result is copied back
// and compared on the host, as nccl-tests does. Times are the stream's:
// from the stream's own timed events where it records them (a CUDA
// stream), else from the host clock around a stream that has drained.

// devSide is a sweeper's device state.
type devSide struct {
	s          collective.Stream
	send, recv memory.Buffer // whole allocations, the host mirrors' shape
}

// streamClock times a stream's work: with the device's own timed events
// where the stream records them (a CUDA stream), else with the host clock
// from a drained stream to a drained stream.
type streamClock struct {
	s     collective.Stream
	timed func() (device.Event, error) // nil: the host clock
	ev0   device.Event
	t0    time.Time
}

func newStreamClock(s collective.Stream) *streamClock {
	c := &streamClock{s: s}
	if cs, ok := s.(*cuda.Stream); ok {
		c.timed = func() (device.Event, error) {
			ev, err := cs.RecordTiming()
			if err != nil {
				return nil, err
			}
			return ev, nil
		}
	}
	return c
}

// start marks the beginning; the stream has drained.
func (c *streamClock) start() error {
	c.t0 = time.Now()
	if c.timed == nil {
		return nil
	}
	ev, err := c.timed()
	c.ev0 = ev
	return err
}

// stop waits for the stream's work and returns the time since start.
func (c *streamClock) stop(ctx context.Context) (time.Duration, error) {
	defer c.close()
	if c.timed == nil {
		err := c.s.Sync(ctx)
		return time.Since(c.t0), err
	}
	ev, err := c.timed()
	if err != nil {
		return 0, err
	}
	defer ev.Close()
	if err := ev.Sync(ctx); err != nil {
		return 0, err
	}
	return ev.Since(c.ev0)
}

func (c *streamClock) close() {
	if c.ev0 != nil {
		c.ev0.Close()
		c.ev0 = nil
	}
}

func newDevSide(s collective.Stream, sendBytes, recvBytes int) (*devSide, error) {
	d := s.Device()
	send, err := d.Alloc(max(sendBytes, 1))
	if err != nil {
		return nil, fmt.Errorf("bench: device buffer of %d bytes: %w", sendBytes, err)
	}
	recv, err := d.Alloc(max(recvBytes, 1))
	if err != nil {
		d.Free(send)
		return nil, fmt.Errorf("bench: device buffer of %d bytes: %w", recvBytes, err)
	}
	return &devSide{s: s, send: send, recv: recv}, nil
}

func (ds *devSide) free() {
	ds.s.Sync(context.Background())
	ds.s.Device().Free(ds.send)
	ds.s.Device().Free(ds.recv)
}

// devBuf returns the device buffer that mirrors x, a part of s.send or
// s.recv.
func (s *sweeper[T]) devBuf(x []T) memory.Buffer {
	if len(x) == 0 {
		return memory.Buffer{}
	}
	var z T
	es := int(unsafe.Sizeof(z))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	for _, m := range []struct {
		host []T
		dev  memory.Buffer
	}{{s.send, s.dev.send}, {s.recv, s.dev.recv}} {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(m.host)))
		if p >= base && p < base+uintptr(len(m.host)*es) {
			off := int(p - base)
			return m.dev.Slice(off, off+len(x)*es)
		}
	}
	panic("bench: a buffer outside the sweep's")
}

func hostBytes[T collective.Number](x []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(z)))
}

// upload copies both host mirrors to the device and waits.
func (s *sweeper[T]) upload(ctx context.Context) error {
	for _, m := range []struct {
		host []T
		dev  memory.Buffer
	}{{s.send, s.dev.send}, {s.recv, s.dev.recv}} {
		if len(m.host) == 0 {
			continue
		}
		b := hostBytes(m.host)
		if err := s.dev.s.Copy(m.dev.Slice(0, len(b)), memory.Buffer{}, memory.HostBuffer(b)); err != nil {
			return err
		}
	}
	return s.dev.s.Sync(ctx)
}

// download copies the device's receive buffer into its host mirror.
func (s *sweeper[T]) download(ctx context.Context) error {
	if len(s.recv) == 0 {
		return nil
	}
	b := hostBytes(s.recv)
	if err := s.dev.s.Copy(memory.HostBuffer(b), memory.Buffer{}, s.dev.recv.Slice(0, len(b))); err != nil {
		return err
	}
	return s.dev.s.Sync(ctx)
}

// devCall starts one operation on device memory and appends its
// requests.
func (s *sweeper[T]) devCall(ctx context.Context, in, out []T, op collective.Op, root int) error {
	c, st := s.c, s.dev.s
	dt := collective.TypeOf[T]()
	send, recv := s.devBuf(in), s.devBuf(out)
	var req *collective.Request
	var err error
	switch s.o.Coll {
	case AllReduce:
		req, err = collective.AllReduceDevice(ctx, c, send, recv, dt, op, st)
	case ReduceScatter:
		req, err = collective.ReduceScatterDevice(ctx, c, send, recv, dt, op, st)
	case AllGather:
		req, err = collective.AllGatherDevice(ctx, c, send, recv, dt, st)
	case Broadcast:
		req, err = collective.BroadcastDevice(ctx, c, send, recv, dt, root, st)
	case Reduce:
		req, err = collective.ReduceDevice(ctx, c, send, recv, dt, op, root, st)
	case AllToAll:
		req, err = collective.AllToAllDevice(ctx, c, send, recv, dt, st)
	case SendRecv:
		// As on the host: even ranks send first, odd ranks receive first.
		next, prev := (s.r+1)%s.n, (s.r+s.n-1)%s.n
		first := func() (*collective.Request, error) { return collective.SendDevice(ctx, c, send, dt, next, st) }
		second := func() (*collective.Request, error) { return collective.RecvDevice(ctx, c, recv, dt, prev, st) }
		if s.r%2 == 1 {
			first, second = second, first
		}
		a, err := first()
		if err != nil {
			return err
		}
		s.reqs = append(s.reqs, a)
		req, err = second()
	default:
		return fmt.Errorf("unknown collective %q", s.o.Coll)
	}
	if err != nil {
		return err
	}
	s.reqs = append(s.reqs, req)
	return nil
}

// devRun runs one checked operation: start it, wait for it and for the
// stream.
func (s *sweeper[T]) devRun(ctx context.Context, in, out []T, op collective.Op, root int) error {
	s.reqs = s.reqs[:0]
	err := s.devCall(ctx, in, out, op, root)
	if werr := s.waitReqs(ctx, 0); err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	return s.dev.s.Sync(ctx)
}

// waitReqs waits for the requests from index done on, and clears them.
func (s *sweeper[T]) waitReqs(ctx context.Context, done int) error {
	var first error
	for _, r := range s.reqs[done:] {
		if err := r.Wait(ctx); err != nil && first == nil {
			first = err
		}
	}
	s.reqs = s.reqs[:0]
	return first
}

// devLoop runs iters operations on the stream and returns their time.
// Blocking waits for each operation's host side before the next
// (nccl-tests' -z 1 has the host wait too); otherwise at most
// maxInFlight are outstanding.
func (s *sweeper[T]) devLoop(ctx context.Context, in, out []T, op collective.Op, root, iters int) (time.Duration, error) {
	if err := s.dev.s.Sync(ctx); err != nil {
		return 0, err
	}
	if err := s.c.Barrier(ctx); err != nil {
		return 0, err
	}
	clock := newStreamClock(s.dev.s)
	if err := clock.start(); err != nil {
		return 0, err
	}
	s.reqs = s.reqs[:0]
	done := 0
	for i := 0; i < iters; i++ {
		if err := s.devCall(ctx, in, out, op, root); err != nil {
			s.waitReqs(ctx, done)
			clock.close()
			return 0, err
		}
		if s.o.Blocking || len(s.reqs)-done > maxInFlight {
			upTo := len(s.reqs)
			if !s.o.Blocking {
				upTo -= maxInFlight
			}
			for ; done < upTo; done++ {
				if err := s.reqs[done].Wait(ctx); err != nil {
					s.waitReqs(ctx, done+1)
					clock.close()
					return 0, err
				}
			}
		}
	}
	d, err := clock.stop(ctx)
	if werr := s.waitReqs(ctx, done); err == nil {
		err = werr
	}
	return d, err
}
