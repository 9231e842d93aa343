// Package device is the seam between goccl's engine and a GPU: the few
// things a collective on device memory needs from one, whichever layer
// provides them. Package cuda implements it with the CUDA driver and
// goccl's PTX kernels; a host-emulated device (internal/device/emu) that
// only tests use implements it on host memory, stricter than hardware.
//
// # Why a stream, and what the engine asks of it
//
// Device work is asynchronous: a kernel launch returns before the kernel
// has run. The engine enqueues a slice's reduction or copy on its stream
// and must not hand the slot that work fills to a peer (Post), nor give
// back the slot it reads (Release), before the work has finished: Sync
// is that fence. Work on one stream runs in the order it was enqueued;
// work on two streams is ordered only through events (Record, WaitEvent)
// or 32-bit flags in mapped memory (WaitValue), which is how a
// communicator orders its work after, and before, the caller's stream.
//
// # Obligations
//
//  1. Buffers given to Reduce, Post and Copy are memory.Device or
//     memory.Mapped buffers of the stream's device (Copy also takes Host
//     buffers on one side: host-to-device and device-to-host copies). A
//     kernel never reaches pageable host memory: an implementation
//     returns an error for one, it does not fault.
//  2. Lengths: dst, dst2 (when not empty), a and b have the same length,
//     a multiple of the element size. dst may be exactly a or exactly b;
//     dst2 must not overlap any of the others.
//  3. Arithmetic is internal/kernels' contract, rule for rule: wrapping
//     integers, Avg as the wrapped sum divided with truncation (integers)
//     or a correctly rounded division in the type (float32, float64) or
//     in float32 (float16, bfloat16, rounded once); Min and Max give NaN
//     when either operand is NaN.
//  4. Enqueueing does not wait for earlier work. An error from an enqueue
//     or from Sync means the stream may be unusable: the engine aborts
//     the operation.
//  5. Every method of a Stream is called by one goroutine at a time; a
//     Device's methods are safe for concurrent use. A CUDA context is
//     current per OS thread and goroutines move between threads, so an
//     implementation makes its context current inside every call.
package device

import (
	"context"
	"errors"
	"time"

	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
)

// Device is one GPU.
type Device interface {
	// Ordinal is the device's index, as memory.Buffer.Device reports it.
	Ordinal() int
	// Info describes the device for logs and the INFO summary.
	Info() Info
	// Alloc returns n bytes of device memory (memory.Device), not
	// initialised.
	Alloc(n int) (memory.Buffer, error)
	// AllocHost returns n bytes of pinned host memory mapped for this
	// device (memory.Mapped), not initialised.
	AllocHost(n int) (memory.Buffer, error)
	// Free releases memory that Alloc or AllocHost returned. Work that
	// still uses it must have finished.
	Free(b memory.Buffer) error
	// NewStream returns a new stream on this device.
	NewStream() (Stream, error)
}

// Registrar is implemented by devices that can map existing host memory
// for their kernels (cuMemHostRegister with DEVICEMAP): a transport
// registers the shared-memory segments or staging buffers that hold its
// slots, so that device operations reduce and copy straight into them.
type Registrar interface {
	Device
	// Register returns b as mapped memory of this device. b must stay
	// allocated until Unregister.
	Register(b []byte) (memory.Buffer, error)
	// Unregister undoes Register; b is what Register returned. Work that
	// still uses it must have finished.
	Unregister(b memory.Buffer) error
}

// DMABufExporter is implemented by devices whose memory another device
// reaches through a dma-buf: an RDMA NIC writing straight into GPU memory
// (GPUDirect RDMA, registered with ibv_reg_dmabuf_mr).
type DMABufExporter interface {
	Device
	// DMABuf returns a new descriptor of a dma-buf holding b, device
	// memory of this device from Alloc whose address and length are
	// multiples of the host page size, and where b starts in it. The
	// caller closes the descriptor. An error wrapping ErrNotSupported
	// means the device, its driver or the kernel cannot export.
	DMABuf(b memory.Buffer) (fd int, off uint64, err error)
}

// IPCExporter is implemented by devices whose memory another process on
// the host maps (CUDA IPC: cuIpcGetMemHandle, cuIpcOpenMemHandle):
// shared memory's connections for device operations put their slots in
// the receiver's device memory that way, so that the sender's kernels
// write straight into it (NCCL's P2P transport), where the GPU would
// otherwise cross PCIe to registered host memory.
type IPCExporter interface {
	Device
	// AllocIPC returns n bytes of device memory (memory.Device) that
	// IPCHandle exports, not initialised; Free releases it.
	AllocIPC(n int) (memory.Buffer, error)
	// IPCHandle returns a handle through which another process opens b,
	// a whole allocation from AllocIPC.
	IPCHandle(b memory.Buffer) ([64]byte, error)
	// OpenIPC maps, as device memory of this device, the allocation a
	// handle from another process names; it fails where this device
	// cannot reach the exporter's (no peer access between the two GPUs,
	// or the same process). CloseIPC unmaps it. Work that uses it must
	// have finished.
	OpenIPC(h [64]byte) (memory.Buffer, error)
	CloseIPC(b memory.Buffer) error
}

// ErrNotSupported: the device cannot do what was asked (dma-buf export
// before CUDA 11.7, or where the driver reports no support).
var ErrNotSupported = errors.New("not supported by this device")

// Info describes a device.
type Info struct {
	Name     string // "NVIDIA H200"
	PCIBusID string // "0000:19:00.0", as NVML and sysfs spell it; "" if none
	Major    int    // compute capability
	Minor    int
	Memory   int64 // bytes of device memory
	// Emulated is set by the host-emulated test device, so that nothing
	// reports it as a GPU.
	Emulated bool
}

// Stream is an ordered queue of work on one device.
type Stream interface {
	// Device is the stream's device.
	Device() Device
	// Reduce enqueues dst[i] = a[i] op b[i] for elements of type t (Avg:
	// the sum), and the same into dst2 when dst2 is not empty. div > 1,
	// allowed with Sum and Avg only, divides every sum by div (Avg's
	// final step, kernels.ReduceFinal(t, Avg, div)); 0 and 1 divide
	// nothing.
	Reduce(dst, dst2, a, b memory.Buffer, t kernels.Type, op kernels.Op, div int) error
	// Post enqueues dst[i] = src[i] / div (Avg of a single contribution;
	// kernels.Post). dst may be exactly src.
	Post(dst, src memory.Buffer, t kernels.Type, div int) error
	// Copy enqueues dst = src, and dst2 = src when dst2 is not empty.
	Copy(dst, dst2, src memory.Buffer) error
	// Sync blocks until all work enqueued so far has finished, or until
	// ctx ends (the work then goes on; the stream stays usable).
	Sync(ctx context.Context) error
	// Record enqueues an event that completes when the work enqueued so
	// far has.
	Record() (Event, error)
	// WaitEvent makes work enqueued after it wait until ev completes.
	WaitEvent(ev Event) error
	// WaitValue makes work enqueued after it wait until the 32-bit word at
	// flag (4 bytes of Mapped memory, 4-byte aligned) holds a value v'
	// with int32(v'-v) >= 0 (at least v, modulo wrap-around). A host
	// store to flag releases it.
	WaitValue(flag memory.Buffer, v uint32) error
	// Close waits for the stream's work and releases it; further calls
	// fail.
	Close() error
}

// Event marks a point in a stream's work.
type Event interface {
	// Done reports whether the work before the event has finished.
	Done() (bool, error)
	// Sync blocks until the event completes or ctx ends.
	Sync(ctx context.Context) error
	// Since is the device time between start and this event, both
	// completed, recorded on the same device.
	Since(start Event) (time.Duration, error)
	// Close releases the event.
	Close() error
}
