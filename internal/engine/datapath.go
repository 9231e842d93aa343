package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// dataPath does the data work of a channel's slices on the memory they
// live in: the host kernels for host memory, a device stream's kernels for
// device memory. The schedule walk (exec.go) is the same for both; only
// these primitives differ (NCCL's prims_simple.h keeps one walk over its
// protocols' loads and stores the same way).
//
// Every primitive may be asynchronous: a device path enqueues the work
// and returns. fence waits until everything issued so far has finished;
// the walk calls it before it hands a slot the primitives filled to a
// peer (Post, PostFrom), gives back a slot they read (Release), or
// returns. The host path's work is done when the call returns, so its
// fence is free.
//
// Buffers have the lengths the step's slice has, all equal. A sink says
// who reads what a primitive writes next, which is how the host path
// chooses its stores (sink's constants); a device path ignores it.
type dataPath interface {
	// reduce computes dst = a op b; final applies the operator's last step
	// (Avg's division).
	reduce(dst, a, b memory.Buffer, final bool, to sink) error
	// reduce2 computes dst = slot = a op b in one pass: dst is the output,
	// slot an outgoing slot, read next on another core when far.
	reduce2(dst, slot, a, b memory.Buffer, final, far bool) error
	// copy copies src to dst.
	copy(dst, src memory.Buffer, to sink) error
	// copy2 copies src to the output dst and to the slot, read next on
	// another core when far.
	copy2(dst, slot, src memory.Buffer, far bool) error
	// finalCopy copies src to the output dst, applying the operator's last
	// step when final (a single contribution's Avg).
	finalCopy(dst, src memory.Buffer, final bool) error
	// fence waits until the work issued so far has finished.
	fence(ctx context.Context) error
}

// path is how the walk calls its data path: the device path through the
// interface, the host path directly. At a few bytes an interface call per
// primitive, with its buffers copied, is a measurable part of an
// operation (docs/performance.md), and on the host fence is nothing at
// all; the direct calls let the compiler see that.
type path struct {
	host *hostPath // set on host memory
	dp   dataPath  // set on device memory
}

// sink says who reads a primitive's destination next.
type sink uint8

const (
	// sinkNear: this core, soon (a slot a socket sends from, a scratch
	// buffer, a destination sent on from where it is); written through
	// the caches.
	sinkNear sink = iota
	// sinkOut: the operation's output, which nothing reads soon; a large
	// one (streamBytes) is written with streaming stores.
	sinkOut
	// sinkFar: a slot that another core reads next (shared memory, a
	// goroutine's peer: transport.FarSlots); written with streaming stores
	// whatever its size. A plain store to a line the reader's cache still
	// holds from the slot's last use must first take the line back from
	// that core, and on the machines measured here that made the
	// sender's copy into the slot three times the cost of the reduction
	// beside it; a streaming store takes no line anywhere, and the reader
	// reads the slot from memory instead of from the writer's cache
	// (docs/performance.md, "Streaming stores into the slots").
	sinkFar
)

// slotSink is the sink of an outgoing slot, near or far.
func slotSink(far bool) sink {
	if far {
		return sinkFar
	}
	return sinkNear
}

func (p path) reduce(dst, a, b memory.Buffer, final bool, to sink) error {
	if p.host != nil {
		return p.host.reduce(dst, a, b, final, to)
	}
	return p.dp.reduce(dst, a, b, final, to)
}

func (p path) reduce2(dst, slot, a, b memory.Buffer, final, far bool) error {
	if p.host != nil {
		return p.host.reduce2(dst, slot, a, b, final, far)
	}
	return p.dp.reduce2(dst, slot, a, b, final, far)
}

func (p path) copy(dst, src memory.Buffer, to sink) error {
	if p.host != nil {
		return p.host.copy(dst, src, to)
	}
	return p.dp.copy(dst, src, to)
}

func (p path) copy2(dst, slot, src memory.Buffer, far bool) error {
	if p.host != nil {
		return p.host.copy2(dst, slot, src, far)
	}
	return p.dp.copy2(dst, slot, src, far)
}

func (p path) finalCopy(dst, src memory.Buffer, final bool) error {
	if p.host != nil {
		return p.host.finalCopy(dst, src, final)
	}
	return p.dp.finalCopy(dst, src, final)
}

func (p path) fence(ctx context.Context) error {
	if p.host != nil {
		return nil
	}
	return p.dp.fence(ctx)
}

// hostPath is the data path on host memory: internal/kernels, chosen once
// per operation shape. It has dataPath's primitives but no fence (its work
// is done when a call returns), and path calls it directly.
type hostPath struct {
	kt           kernels.Type
	kop          kernels.Op
	n            int // ranks, for Avg
	ready        bool
	red, final   kernels.Func
	redS, finalS kernels.Func
	red2, final2 kernels.Func2
	post         func(dst, src []byte)
	// stream: the output is too large for the caches, so writes to it use
	// streaming stores (see streamBytes).
	stream bool
	// A pre-multiplied sum's kernels (Op.PreMul), for the steps that read
	// this rank's input: it is scaled as it is read (kernels.ScaledSum,
	// kernels.Scale), never copied scaled first.
	premul  bool
	scale   float64
	sred    kernels.Func // dst = a + b·scale
	sredS   kernels.Func // ... with streaming stores to dst
	sred2   kernels.Func2
	scaleBy func(dst, src []byte) // dst = src·scale
}

// streamBytes is the output size from which writes to the output use
// streaming stores. Below it the output may still be in the caches when
// the caller reads it; above it, it cannot be (2 MiB of L2 per core here),
// and a streaming store saves the read of each line before it is written:
// docs/performance.md measured a 64 MiB reduction 1.5x and a copy 2.3x
// faster that way.
const streamBytes = 8 << 20

// setup chooses the kernels for op.
func (h *hostPath) setup(op *Op, nranks int) {
	h.stream = op.Out.Len() >= streamBytes
	if !op.Coll.Reduces() {
		h.red, h.final, h.post, h.ready, h.premul = nil, nil, nil, false, false
		return
	}
	if op.PreMul && (!h.premul || math.Float64bits(h.scale) != math.Float64bits(op.Scale) || h.kt != op.Type || !h.ready) {
		h.sred = kernels.ScaledSum(op.Type, op.Scale)
		h.sredS = kernels.ScaledSumStream(op.Type, op.Scale)
		h.sred2 = kernels.ScaledSumStream2(op.Type, op.Scale)
		h.scaleBy = kernels.Scale(op.Type, op.Scale)
		h.scale = op.Scale
	}
	h.premul = op.PreMul
	if h.ready && h.kt == op.Type && h.kop == op.Red && h.n == nranks {
		return
	}
	h.red = kernels.Reduce(op.Type, op.Red)
	h.final = kernels.ReduceFinal(op.Type, op.Red, nranks)
	h.post = kernels.Post(op.Type, op.Red, nranks)
	h.redS = kernels.ReduceStream(op.Type, op.Red)
	h.finalS = kernels.ReduceFinalStream(op.Type, op.Red, nranks)
	h.red2 = kernels.ReduceStream2(op.Type, op.Red)
	h.final2 = kernels.ReduceFinalStream2(op.Type, op.Red, nranks)
	h.kt, h.kop, h.n, h.ready = op.Type, op.Red, nranks, true
}

// streams says whether a write to a destination read by to goes around
// the caches.
func (h *hostPath) streams(to sink) bool {
	return to == sinkFar || to == sinkOut && h.stream
}

func (h *hostPath) reduce(dst, a, b memory.Buffer, final bool, to sink) error {
	f := h.red
	switch {
	case h.streams(to) && final:
		f = h.finalS
	case h.streams(to):
		f = h.redS
	case final:
		f = h.final
	}
	f(dst.Bytes(), a.Bytes(), b.Bytes())
	return nil
}

func (h *hostPath) reduce2(dst, slot, a, b memory.Buffer, final, far bool) error {
	d, s := dst.Bytes(), slot.Bytes()
	f2 := h.red2 // first destination by streaming stores, the second through the caches
	if final {
		f2 = h.final2
	}
	switch {
	case far:
		// One pass: the slot by streaming stores, the output through the
		// caches (a large output too: measured against two streaming
		// passes, docs/performance.md).
		f2(s, d, a.Bytes(), b.Bytes())
	case h.stream:
		// One pass: the output by streaming stores, the slot (read on
		// this core soon) through the caches.
		f2(d, s, a.Bytes(), b.Bytes())
	default:
		f := h.red
		if final {
			f = h.final
		}
		f(d, a.Bytes(), b.Bytes())
		copy(s, d)
	}
	return nil
}

func (h *hostPath) copy(dst, src memory.Buffer, to sink) error {
	if h.streams(to) {
		kernels.CopyStream(dst.Bytes(), src.Bytes())
	} else {
		kernels.Copy(dst.Bytes(), src.Bytes())
	}
	return nil
}

func (h *hostPath) copy2(dst, slot, src memory.Buffer, far bool) error {
	h.copy(dst, src, sinkOut)
	h.copy(slot, src, slotSink(far))
	return nil
}

func (h *hostPath) finalCopy(dst, src memory.Buffer, final bool) error {
	if final && h.post != nil {
		h.post(dst.Bytes(), src.Bytes())
		return nil
	}
	if !dst.SameStart(src) {
		h.copy(dst, src, sinkOut)
	}
	return nil
}

// scaledReduce is reduce with b, this rank's input, scaled (Op.PreMul;
// Sum, whose final step is nothing).
func (h *hostPath) scaledReduce(dst, a, b memory.Buffer, to sink) {
	f := h.sred
	if h.streams(to) {
		f = h.sredS
	}
	f(dst.Bytes(), a.Bytes(), b.Bytes())
}

// scaleInto returns src scaled (Op.PreMul) in *scratch, grown to fit:
// for the small operations that post their input whole.
func (h *hostPath) scaleInto(scratch *[]byte, src []byte) []byte {
	*scratch = append((*scratch)[:0], make([]byte, len(src))...)
	h.scaleBy(*scratch, src)
	return *scratch
}

// scaledReduce2 is reduce2 with b scaled.
func (h *hostPath) scaledReduce2(dst, slot, a, b memory.Buffer, far bool) {
	d, s := dst.Bytes(), slot.Bytes()
	switch {
	case far:
		h.sred2(s, d, a.Bytes(), b.Bytes())
	case h.stream:
		h.sred2(d, s, a.Bytes(), b.Bytes())
	default:
		h.sred(d, a.Bytes(), b.Bytes())
		copy(s, d)
	}
}

// fold is accumulate on host memory.
func (h *hostPath) fold(out, src []byte, r, n int) {
	switch {
	case r == 0:
		if len(out) > 0 && unsafe.SliceData(out) != unsafe.SliceData(src) {
			copy(out, src)
		}
	case r == n-1:
		h.final(out, out, src)
	default:
		h.red(out, out, src)
	}
}

// devPath is the data path on a GPU's memory: each primitive is enqueued
// on the channel's stream, fence waits for the stream. Buffers are device
// memory or mapped host memory of the stream's device (device.Stream's
// obligations); the engine checks that before an operation starts.
type devPath struct {
	s   device.Stream
	kt  kernels.Type
	kop kernels.Op
	div int // ranks, for Avg's division; 0 for every other operator
}

func (d *devPath) setup(op *Op, nranks int) {
	d.kt, d.kop, d.div = op.Type, op.Red, 0
	if op.Coll.Reduces() && op.Red == kernels.Avg && nranks > 1 {
		d.div = nranks
	}
}

func (d *devPath) divFor(final bool) int {
	if final {
		return d.div
	}
	return 0
}

func (d *devPath) reduce(dst, a, b memory.Buffer, final bool, _ sink) error {
	return d.s.Reduce(dst, memory.Buffer{}, a, b, d.kt, d.kop, d.divFor(final))
}

func (d *devPath) reduce2(dst, slot, a, b memory.Buffer, final, _ bool) error {
	return d.s.Reduce(dst, slot, a, b, d.kt, d.kop, d.divFor(final))
}

func (d *devPath) copy(dst, src memory.Buffer, _ sink) error {
	return d.s.Copy(dst, memory.Buffer{}, src)
}

func (d *devPath) copy2(dst, slot, src memory.Buffer, _ bool) error {
	return d.s.Copy(dst, slot, src)
}

func (d *devPath) finalCopy(dst, src memory.Buffer, final bool) error {
	if final && d.div > 1 {
		return d.s.Post(dst, src, d.kt, d.div)
	}
	if !dst.SameStart(src) {
		return d.s.Copy(dst, memory.Buffer{}, src)
	}
	return nil
}

func (d *devPath) fence(ctx context.Context) error { return d.s.Sync(ctx) }

// onDevice reports whether op runs on a device: whether it is ordered
// after device work (Op.Ready) or either of its buffers is device memory.
func onDevice(op *Op) bool {
	return op.Ready != nil || op.In.Kind() == memory.Device || op.Out.Kind() == memory.Device
}

// CheckMemory says why op cannot run on this engine's memory, or returns
// nil: a device operation (onDev) needs the engine's device, buffers its
// kernels reach on that device, and slots they reach; a host one needs
// slots the CPU reaches. The collective layer calls it to refuse a call
// before issuing it; Run calls it again.
func (e *Engine) CheckMemory(op *Op, onDev bool) error {
	if !onDev {
		if e.caps.Memory == memory.Device {
			return errors.New("host buffers on a communicator whose connections' slots are device memory; pass device buffers")
		}
		return nil
	}
	dev := e.cfg.Device
	if dev == nil {
		return errors.New("device buffers on a communicator without a device")
	}
	for _, b := range []struct {
		name string
		buf  memory.Buffer
	}{{"send", op.In}, {"recv", op.Out}} {
		if b.buf.Len() == 0 {
			continue
		}
		if !b.buf.DeviceVisible() {
			return fmt.Errorf("%s buffer is pageable host memory, which a GPU cannot reach: a device operation needs device or mapped memory", b.name)
		}
		if ord, _ := b.buf.Device(); ord != dev.Ordinal() {
			return fmt.Errorf("%s buffer is on device %d, but this communicator's device is %d", b.name, ord, dev.Ordinal())
		}
	}
	if !e.caps.DeviceSlots.DeviceVisible() {
		return errors.New("this communicator's transport carries no device operations (its slots are not memory a GPU reaches)")
	}
	return nil
}
