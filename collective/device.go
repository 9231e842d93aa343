package collective

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

// Collectives on device memory: the package documentation's "Device
// memory" section states their obligations; this file implements them.
// Each call records an event on the caller's stream (engine.Op.Ready: the
// communicator's streams wait for it before they touch the buffers),
// issues the operation asynchronously, and makes the caller's stream wait
// until a word of mapped memory reaches the operation's value, which the
// communicator stores when the operation has ended.

// Device is a GPU as goccl uses it: a *cuda.Device.
type Device = device.Device

// Stream is a queue of work on a GPU, which device collectives are ordered
// on: a *cuda.Stream (cuda.StreamFromHandle wraps a framework's own).
type Stream = device.Stream

// AllReduceDevice is AllReduce on device memory, ordered on s.
func AllReduceDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, op Op, s Stream) (*Request, error) {
	return c.startDevice(ctx, "allreduce", send, recv, t, s, func(a *args, k *call) error { return allReduceArgs(c, a, op, k) })
}

// ReduceScatterDevice is ReduceScatter on device memory, ordered on s.
func ReduceScatterDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, op Op, s Stream) (*Request, error) {
	return c.startDevice(ctx, "reducescatter", send, recv, t, s, func(a *args, k *call) error { return reduceScatterArgs(c, a, op, k) })
}

// AllGatherDevice is AllGather on device memory, ordered on s.
func AllGatherDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, s Stream) (*Request, error) {
	return c.startDevice(ctx, "allgather", send, recv, t, s, func(a *args, k *call) error { return allGatherArgs(c, a, k) })
}

// BroadcastDevice is Broadcast on device memory, ordered on s.
func BroadcastDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, root int, s Stream) (*Request, error) {
	return c.startDevice(ctx, "broadcast", send, recv, t, s, func(a *args, k *call) error { return broadcastArgs(c, a, root, k) })
}

// ReduceDevice is Reduce on device memory, ordered on s.
func ReduceDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, op Op, root int, s Stream) (*Request, error) {
	return c.startDevice(ctx, "reduce", send, recv, t, s, func(a *args, k *call) error { return reduceArgs(c, a, op, root, k) })
}

// AllToAllDevice is AllToAll on device memory, ordered on s.
func AllToAllDevice(ctx context.Context, c *Comm, send, recv memory.Buffer, t DataType, s Stream) (*Request, error) {
	return c.startDevice(ctx, "alltoall", send, recv, t, s, func(a *args, k *call) error { return allToAllArgs(c, a, k) })
}

// SendDevice is Send of device memory, ordered on s.
func SendDevice(ctx context.Context, c *Comm, buf memory.Buffer, t DataType, peer int, s Stream) (*Request, error) {
	return c.startDevice(ctx, "send", buf, memory.Buffer{}, t, s, func(a *args, k *call) error {
		return p2pArgs(c, "send", algorithms.CollSend, a, peer, k)
	})
}

// RecvDevice is Recv into device memory, ordered on s.
func RecvDevice(ctx context.Context, c *Comm, buf memory.Buffer, t DataType, peer int, s Stream) (*Request, error) {
	return c.startDevice(ctx, "recv", memory.Buffer{}, buf, t, s, func(a *args, k *call) error {
		return p2pArgs(c, "recv", algorithms.CollRecv, a, peer, k)
	})
}

// describeDevice names d for RankInfo, logs and the perf tool's header.
// The emulated test device says that it is one.
func describeDevice(d Device) string {
	in := d.Info()
	if in.Emulated {
		return fmt.Sprintf("emulated:%d (%s)", d.Ordinal(), in.Name)
	}
	s := fmt.Sprintf("cuda:%d %s", d.Ordinal(), in.Name)
	if in.PCIBusID != "" {
		s += " [" + in.PCIBusID + "]"
	}
	return s
}

// devicePath says how device operations move between this rank and its
// peers, for the INFO summary: by transport, for the ones this rank's
// peers use.
func (c *Comm) devicePath() string {
	k := c.ep.Caps().DeviceSlots
	switch {
	case c.size == 1:
		return "self"
	case !k.DeviceVisible():
		return "none: this transport carries no device operations yet"
	case c.routes == nil: // ranks in one process
		if k == memory.Device {
			return "device-to-device (slots in the receiver's device memory)"
		}
		return "through registered host memory"
	}
	uses := map[string]bool{}
	for r, t := range c.routes {
		if r != c.rank {
			uses[t] = true
		}
	}
	var parts []string
	if uses[TransportShm] {
		_, ipc := c.dev.dev.(device.IPCExporter)
		if ipc && !c.cfg.P2PDisable {
			parts = append(parts, "shared memory: into the receiver's device memory (CUDA IPC) where both ends map each other's, else registered host memory")
		} else {
			parts = append(parts, "shared memory: through registered host memory")
		}
	}
	if uses[TransportTCP] {
		parts = append(parts, "TCP: staged through registered host memory")
	}
	if uses[TransportVerbs] {
		parts = append(parts, c.ibDevicePath)
	}
	return strings.Join(parts, "; ")
}

// devState is what a communicator with a device keeps for its device
// operations.
type devState struct {
	dev Device
	// flag is a word of mapped memory the callers' streams wait on
	// (device.Stream.WaitValue): each device operation gets the next value
	// (devOps, under Comm.mu) and stores it there when it ends. Operations
	// end in issue order, so the word only grows.
	flag   memory.Buffer
	devOps uint32
	mem    memory.Buffer // the allocation flag lies in
	// streams the operations were ordered on (under Comm.mu): a stream
	// may reach its wait on flag only after the operation ended, so close
	// frees flag once each has passed its waits.
	streams map[Stream]struct{}
}

func newDevState(d Device) (*devState, error) {
	flag, err := d.AllocHost(64)
	if err != nil {
		return nil, fmt.Errorf("goccl: the device operations' flag: %w", err)
	}
	ds := &devState{dev: d, flag: flag.Slice(0, 4), mem: flag, streams: map[Stream]struct{}{}}
	ds.word().Store(0)
	return ds, nil
}

func (ds *devState) word() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(unsafe.SliceData(ds.flag.Bytes())))
}

// close frees the flag once every stream that waits on it has passed its
// waits, within d; a stream that has not (its earlier work still runs)
// keeps the flag's 64 bytes allocated rather than let it read freed
// memory later.
func (ds *devState) close(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for s := range ds.streams {
		ev, err := s.Record()
		if err != nil {
			// A closed stream has finished its work (device.Stream.Close);
			// a failed one runs nothing more.
			continue
		}
		err = ev.Sync(ctx)
		ev.Close()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("goccl: a stream did not pass this communicator's last device operation within %v; its flag stays allocated: %w", d, err)
		}
	}
	return ds.dev.Free(ds.mem)
}

// checkDeviceArgs checks what every device call needs.
func (c *Comm) checkDeviceArgs(name string, send, recv memory.Buffer, t DataType, s Stream) error {
	if err := checkComm(c, name); err != nil {
		return err
	}
	if c.dev == nil {
		return c.argError(name, "device buffers on a communicator without a device (make it WithDevice)")
	}
	if !t.Valid() {
		return c.argError(name, "element type %v is not one of the twelve", t)
	}
	if t == Float8E4M3Type || t == Float8E5M2Type {
		return c.argError(name, "%v on device memory: goccl has no CUDA kernels for the float8 types yet (host slices of them work)", t)
	}
	if s == nil {
		return c.argError(name, "nil stream")
	}
	if d := s.Device().Ordinal(); d != c.dev.dev.Ordinal() {
		return c.argError(name, "stream of device %d, but this communicator's device is %d", d, c.dev.dev.Ordinal())
	}
	for _, b := range []struct {
		what string
		buf  memory.Buffer
	}{{"send", send}, {"recv", recv}} {
		if b.buf.Len()%t.Size() != 0 {
			return c.argError(name, "%s buffer of %d bytes is not a whole number of %v elements", b.what, b.buf.Len(), t)
		}
	}
	return nil
}

// startDevice checks a device call, issues it and orders it on s (the
// package documentation's obligations 1-4).
func (c *Comm) startDevice(ctx context.Context, name string, send, recv memory.Buffer, t DataType, s Stream, mk func(*args, *call) error) (*Request, error) {
	if err := c.checkDeviceArgs(name, send, recv, t, s); err != nil {
		return nil, err
	}
	var k call
	a := bufferArgs(t, send, recv)
	if err := mk(&a, &k); err != nil {
		return nil, err
	}
	if k.premul {
		return nil, c.argError(name, "a PreMulSum on device memory: goccl has no kernel for it yet (host slices work)")
	}
	// The memory rules are the engine's: buffers and slots the device
	// reaches.
	if err := c.eng.CheckMemory(&k.op, true); err != nil {
		return nil, c.argError(name, "%v", err)
	}
	// Ready also makes a call on mapped buffers alone run on the device
	// (engine.Op.Ready), whose streams order it.
	ready, err := s.Record()
	if err != nil {
		return nil, &OpError{Rank: c.rank, Op: name, Seq: 0, Peer: -1, Err: fmt.Errorf("recording the stream's event: %w", err)}
	}
	k.op.Ready = ready
	r, prev, err := c.issue(ctx, &k, true)
	if err != nil {
		ready.Close()
		return nil, err
	}
	blocking := false
	if err := s.WaitValue(c.dev.flag, r.devV); err != nil {
		// No stream memory operations: the host waits instead (4).
		blocking = true
	} else {
		c.mu.Lock()
		c.dev.streams[s] = struct{}{}
		c.mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		defer c.wg.Done()
		err := c.exec(ctx, &k, r, prev)
		ready.Close()
		// Release s's later work, in issue order (exec ran after prev had
		// stored its value), before anyone learns the operation ended.
		c.dev.word().Store(r.devV)
		c.finish(r, err)
		close(done)
	}()
	if blocking {
		<-done
	}
	return r, nil
}
