package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

// CUDA constants this file uses (cuda.h).
const (
	attrCanMapHostMemory  = 19  // CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
	attrUnifiedAddressing = 41  // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
	attrCCMajor           = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrCCMinor           = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	attrStreamMemOps      = 92  // CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS (v1 mem ops; deprecated in 12)
	attrDMABufSupported   = 124 // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (11.7+)

	memRangeHandleDMABufFD = 1 // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

	hostAllocPortable  = 1 // CU_MEMHOSTALLOC_PORTABLE
	hostAllocDeviceMap = 2 // CU_MEMHOSTALLOC_DEVICEMAP
	hostRegPortable    = 1 // CU_MEMHOSTREGISTER_PORTABLE
	hostRegDeviceMap   = 2 // CU_MEMHOSTREGISTER_DEVICEMAP

	ptrAttrMemoryType    = 2 // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	ptrAttrDeviceOrdinal = 9 // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	memTypeDevice        = 2 // CU_MEMORYTYPE_DEVICE

	ipcLazyEnablePeerAccess = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
)

// allocKind says how this package made an allocation, so that Free,
// Unregister and CloseIPC accept exactly their own.
type allocKind uint8

const (
	allocDevice     allocKind = iota + 1 // Alloc: cuMemAlloc
	allocHost                            // AllocHost: cuMemHostAlloc
	allocRegistered                      // Register: cuMemHostRegister
	allocIPC                             // OpenIPC: cuIpcOpenMemHandle
)

var (
	allocNames   = [...]string{"", "Alloc", "AllocHost", "Register", "OpenIPC"}
	releaseNames = [...]string{"", "Free", "Free", "Unregister", "CloseIPC"}
)

type allocation struct {
	kind allocKind
	n    int
}

// devState is what all Devices of one ordinal share: the primary context
// and the memory and module made in it.
type devState struct {
	drv     *Driver
	ordinal int
	cu      uintptr // CUdevice
	info    device.Info
	v1MemOp bool // cuStreamWaitValue32 is v1 and the device attribute allows it
	dmabuf  bool // the device exports its memory as dma-bufs

	refs int            // open Devices; guarded by drv.mu
	ctx  atomic.Uintptr // the primary context while refs > 0; written under drv.mu

	mu     sync.Mutex             // guards allocs, modErr and loading mod
	allocs map[uintptr]allocation // by start address (the host address for AllocHost and Register)
	mod    atomic.Pointer[module] // goccl's kernels, loaded on first use
	modErr error                  // why loading them failed (not retried)
}

// Device is one CUDA device as opened by Driver.Open: it holds a reference
// on the device's primary context. A Device's methods are safe for
// concurrent use. It implements device.Device.
//
// Several Devices may be open on one ordinal (two communicators of one
// process on one GPU): they share the context, memory and kernels, and
// memory one allocates another may free. The primary context, with all its
// memory, streams and the loaded kernels, is released when the last of
// them closes.
type Device struct {
	st     *devState
	closed atomic.Bool
}

var (
	_ device.Device         = (*Device)(nil)
	_ device.Registrar      = (*Device)(nil)
	_ device.DMABufExporter = (*Device)(nil)
	_ device.IPCExporter    = (*Device)(nil)
)

// Open returns the device with the given ordinal (0 ≤ ordinal <
// DeviceCount), retaining its primary context (cuDevicePrimaryCtxRetain)
// until Close.
func (d *Driver) Open(ordinal int) (*Device, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: no device %d (the driver shows %d)", ordinal, n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.devs[ordinal]
	if st == nil {
		if st, err = d.newDevState(ordinal); err != nil {
			return nil, err
		}
		d.devs[ordinal] = st
	}
	if st.refs == 0 {
		var ctx uintptr
		if err := d.check("cuDevicePrimaryCtxRetain", callN(d.fn.primaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), st.cu)); err != nil {
			return nil, err
		}
		st.ctx.Store(ctx)
	}
	st.refs++
	return &Device{st: st}, nil
}

// Devices opens every device the driver shows, in ordinal order. On failure
// it closes those it opened.
func (d *Driver) Devices() ([]*Device, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	devs := make([]*Device, 0, n)
	for i := range n {
		dev, err := d.Open(i)
		if err != nil {
			for _, o := range devs {
				o.Close()
			}
			return nil, err
		}
		devs = append(devs, dev)
	}
	return devs, nil
}

// newDevState queries what does not change: these calls need no context.
func (d *Driver) newDevState(ordinal int) (*devState, error) {
	st := &devState{drv: d, ordinal: ordinal, allocs: map[uintptr]allocation{}}
	var cu int32
	if err := d.check("cuDeviceGet", callN(d.fn.deviceGet, uintptr(unsafe.Pointer(&cu)), uintptr(ordinal))); err != nil {
		return nil, err
	}
	st.cu = uintptr(cu)
	var buf [256]byte
	if err := d.check("cuDeviceGetName", callN(d.fn.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), st.cu)); err != nil {
		return nil, err
	}
	st.info.Name = cBytes(buf[:])
	buf = [256]byte{}
	if callN(d.fn.deviceGetPCIBusID, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), st.cu) == 0 {
		// "0000:19:00.0"; lower case, as NVML and sysfs spell it.
		st.info.PCIBusID = strings.ToLower(cBytes(buf[:]))
	}
	var mem uint64
	if err := d.check("cuDeviceTotalMem", callN(d.fn.deviceTotalMem, uintptr(unsafe.Pointer(&mem)), st.cu)); err != nil {
		return nil, err
	}
	st.info.Memory = int64(mem)
	var err error
	if st.info.Major, err = st.attribute(attrCCMajor); err != nil {
		return nil, err
	}
	if st.info.Minor, err = st.attribute(attrCCMinor); err != nil {
		return nil, err
	}
	if !d.waitValueV2 && d.fn.streamWaitValue32 != 0 {
		v, err := st.attribute(attrStreamMemOps)
		st.v1MemOp = err == nil && v != 0
	}
	if d.fn.memGetHandleForAddressRange != 0 {
		// A driver older than the attribute fails the query: no support.
		v, err := st.attribute(attrDMABufSupported)
		st.dmabuf = err == nil && v != 0
	}
	return st, nil
}

// attribute returns a cuDeviceGetAttribute value.
func (st *devState) attribute(attr int) (int, error) {
	var v int32
	if err := st.drv.check("cuDeviceGetAttribute", callN(st.drv.fn.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), st.cu)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Attribute returns the value of a CUdevice_attribute (cuda.h's
// CU_DEVICE_ATTRIBUTE_* numbers) for the device.
func (dev *Device) Attribute(attr int) (int, error) { return dev.st.attribute(attr) }

// cBytes returns the NUL-terminated string at the start of b.
func cBytes(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Close releases the Device's reference on the primary context
// (cuDevicePrimaryCtxRelease). When the last Device of the ordinal closes,
// the context is destroyed with everything in it: memory from Alloc and
// AllocHost, registrations, IPC mappings, streams, events, kernels. Close
// again returns nil; other methods of a closed Device return ErrClosed.
func (dev *Device) Close() error {
	if !dev.closed.CompareAndSwap(false, true) {
		return nil
	}
	st := dev.st
	d := st.drv
	d.mu.Lock()
	defer d.mu.Unlock()
	if st.refs--; st.refs > 0 {
		return nil
	}
	var err error
	if m := st.mod.Load(); m != nil {
		// Unload while the context lives; errors here are not worth
		// failing Close for: the context goes next.
		err = st.do(func() error { return d.check("cuModuleUnload", callN(d.fn.moduleUnload, m.h)) })
	}
	st.mu.Lock()
	st.mod.Store(nil)
	st.modErr = nil
	clear(st.allocs)
	st.mu.Unlock()
	if e := d.check("cuDevicePrimaryCtxRelease", callN(d.fn.primaryCtxRelease, st.cu)); e != nil {
		err = e
	}
	st.ctx.Store(0)
	return err
}

// enter locks the goroutine to its OS thread and makes the device's primary
// context current there, for the driver calls that follow; exit undoes the
// lock. scratch receives cuCtxGetCurrent's answer: a Stream passes a field
// of its own, so that its hot path does not allocate.
//
// A context is current per OS thread, and a goroutine may move to another
// thread between any two calls, so every call that needs the context runs
// between enter and exit. cuCtxGetCurrent is a thread-local read in the
// driver; cuCtxSetCurrent validates the context as well, so it is made only
// when another context (or none) is current, which after the first call on
// a thread is rare: most calls cost one extra driver call, not two, the
// pattern of the CUDA runtime's device guards. The context is left current
// on the thread, as cudaSetDevice would leave it.
func (st *devState) enter(scratch *uintptr) error {
	runtime.LockOSThread()
	d := st.drv
	if r := callN(d.fn.ctxGetCurrent, uintptr(unsafe.Pointer(scratch))); r != 0 {
		runtime.UnlockOSThread()
		return d.newError("cuCtxGetCurrent", r)
	}
	ctx := st.ctx.Load()
	if *scratch == ctx && ctx != 0 {
		return nil
	}
	if ctx == 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuda: device %d: %w (its last Device was closed)", st.ordinal, ErrClosed)
	}
	if r := callN(d.fn.ctxSetCurrent, ctx); r != 0 {
		runtime.UnlockOSThread()
		return d.newError("cuCtxSetCurrent", r)
	}
	return nil
}

func (st *devState) exit() { runtime.UnlockOSThread() }

// do runs f with the device's context current.
func (st *devState) do(f func() error) error {
	var cur uintptr
	if err := st.enter(&cur); err != nil {
		return err
	}
	defer st.exit()
	return f()
}

// live returns ErrClosed for a closed Device.
func (dev *Device) live(call string) error {
	if dev.closed.Load() {
		return fmt.Errorf("cuda: %s on device %d: %w", call, dev.st.ordinal, ErrClosed)
	}
	return nil
}

// Ordinal returns the device's ordinal, as memory.Buffer.Device reports it
// for the memory of this device.
func (dev *Device) Ordinal() int { return dev.st.ordinal }

// Info describes the device: name, PCI bus id, compute capability and
// memory, as read when it was first opened.
func (dev *Device) Info() device.Info { return dev.st.info }

// Driver returns the driver the device was opened with.
func (dev *Device) Driver() *Driver { return dev.st.drv }

func (dev *Device) track(p uintptr, a allocation) {
	dev.st.mu.Lock()
	dev.st.allocs[p] = a
	dev.st.mu.Unlock()
}

// untrack forgets the allocation at p if it is one of kind k of n bytes.
func (dev *Device) untrack(call string, p uintptr, n int, k allocKind) error {
	st := dev.st
	st.mu.Lock()
	defer st.mu.Unlock()
	a, ok := st.allocs[p]
	switch {
	case !ok:
		return fmt.Errorf("cuda: %s of %d bytes at %#x on device %d: not an allocation %s returned (a slice of one, or freed already?)", call, n, p, st.ordinal, allocNames[k])
	case a.kind != k:
		return fmt.Errorf("cuda: %s of memory from %s: release it with %s", call, allocNames[a.kind], releaseNames[a.kind])
	case a.n != n:
		return fmt.Errorf("cuda: %s of %d bytes at %#x: %s returned %d bytes there", call, n, p, allocNames[k], a.n)
	}
	delete(st.allocs, p)
	return nil
}

// AllocIPC is Alloc: memory from cuMemAlloc is what cuIpcGetMemHandle
// exports (device.IPCExporter).
func (dev *Device) AllocIPC(n int) (memory.Buffer, error) { return dev.Alloc(n) }

// Alloc returns n bytes of device memory (cuMemAlloc), not initialised, as
// a memory.Device buffer of this device; Free releases it. n == 0 returns
// an empty buffer without allocating.
func (dev *Device) Alloc(n int) (memory.Buffer, error) {
	if err := dev.live("Alloc"); err != nil {
		return memory.Buffer{}, err
	}
	if n < 0 {
		return memory.Buffer{}, fmt.Errorf("cuda: Alloc of %d bytes", n)
	}
	if n == 0 {
		return memory.DeviceBuffer(dev.st.ordinal, 0, 0), nil
	}
	d := dev.st.drv
	var p uintptr
	err := dev.st.do(func() error {
		return d.check("cuMemAlloc", callN(d.fn.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n)))
	})
	if err != nil {
		return memory.Buffer{}, err
	}
	dev.track(p, allocation{allocDevice, n})
	return memory.DeviceBuffer(dev.st.ordinal, p, n), nil
}

// AllocHost returns n bytes of pinned host memory mapped into the device's
// address space (cuMemHostAlloc with PORTABLE|DEVICEMAP, and
// cuMemHostGetDevicePointer), not initialised, as a memory.Mapped buffer:
// the CPU reaches it through Bytes (a slice over the pinned memory, not Go
// heap: it must not be used after Free), the device through its device
// address. Free releases it.
func (dev *Device) AllocHost(n int) (memory.Buffer, error) {
	if err := dev.live("AllocHost"); err != nil {
		return memory.Buffer{}, err
	}
	if n <= 0 {
		return memory.Buffer{}, fmt.Errorf("cuda: AllocHost of %d bytes: want at least 1", n)
	}
	d := dev.st.drv
	var hp unsafe.Pointer
	var dp uintptr
	err := dev.st.do(func() error {
		if err := d.check("cuMemHostAlloc", callN(d.fn.memHostAlloc, uintptr(unsafe.Pointer(&hp)), uintptr(n), hostAllocPortable|hostAllocDeviceMap)); err != nil {
			return err
		}
		if err := d.check("cuMemHostGetDevicePointer", callN(d.fn.memHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), uintptr(hp), 0)); err != nil {
			callN(d.fn.memFreeHost, uintptr(hp))
			return err
		}
		return nil
	})
	if err != nil {
		return memory.Buffer{}, err
	}
	dev.track(uintptr(hp), allocation{allocHost, n})
	return memory.MappedBuffer(unsafe.Slice((*byte)(hp), n), dev.st.ordinal, dp), nil
}

// Free releases memory that Alloc or AllocHost of a Device of this ordinal
// returned: the whole buffer, not a slice of it. Work that still uses it
// must have finished. Memory from Register or OpenIPC (see Unregister and
// CloseIPC), slices, double frees and memory from anywhere else are
// refused with an error; an empty buffer is accepted and does nothing.
func (dev *Device) Free(b memory.Buffer) error {
	if err := dev.live("Free"); err != nil {
		return err
	}
	if b.Len() == 0 {
		return nil
	}
	ord, dp := b.Device()
	d := dev.st.drv
	switch {
	case b.Kind() == memory.Host:
		return fmt.Errorf("cuda: Free of host memory (%d bytes): not allocated by CUDA", b.Len())
	case ord != dev.st.ordinal:
		return fmt.Errorf("cuda: Free on device %d of memory of device %d", dev.st.ordinal, ord)
	case b.Kind() == memory.Device:
		if err := dev.untrack("Free", dp, b.Len(), allocDevice); err != nil {
			return err
		}
		return dev.st.do(func() error { return d.check("cuMemFree", callN(d.fn.memFree, dp)) })
	default: // Mapped
		hp := hostAddr(b)
		if err := dev.untrack("Free", hp, b.Len(), allocHost); err != nil {
			return err
		}
		return dev.st.do(func() error { return d.check("cuMemFreeHost", callN(d.fn.memFreeHost, hp)) })
	}
}

// hostAddr is the CPU address of a Host or Mapped buffer (0 if empty).
func hostAddr(b memory.Buffer) uintptr {
	h := b.Bytes()
	if len(h) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(h)))
}

// Register pins existing host memory and maps it into the device's address
// space (cuMemHostRegister with PORTABLE|DEVICEMAP), as NCCL does for its
// shared-memory segments, and returns it as a memory.Mapped buffer over the
// same bytes. b must stay allocated and mapped, neither freed nor unmapped,
// until Unregister: memory from mmap (shared-memory segments) or C. A Go
// slice is accepted only because this cannot be checked: the garbage
// collector frees it once unreachable, so the caller keeps it reachable
// until Unregister.
func (dev *Device) Register(b []byte) (memory.Buffer, error) {
	if err := dev.live("Register"); err != nil {
		return memory.Buffer{}, err
	}
	if len(b) == 0 {
		return memory.Buffer{}, fmt.Errorf("cuda: Register of an empty slice")
	}
	d := dev.st.drv
	hp := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	var dp uintptr
	err := dev.st.do(func() error {
		if err := d.check("cuMemHostRegister", callN(d.fn.memHostRegister, hp, uintptr(len(b)), hostRegPortable|hostRegDeviceMap)); err != nil {
			return err
		}
		if err := d.check("cuMemHostGetDevicePointer", callN(d.fn.memHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), hp, 0)); err != nil {
			callN(d.fn.memHostUnregister, hp)
			return err
		}
		return nil
	})
	if err != nil {
		return memory.Buffer{}, err
	}
	dev.track(hp, allocation{allocRegistered, len(b)})
	return memory.MappedBuffer(b, dev.st.ordinal, dp), nil
}

// Unregister undoes Register (cuMemHostUnregister) for the whole buffer it
// returned. Work that still uses the memory must have finished.
func (dev *Device) Unregister(b memory.Buffer) error {
	if err := dev.live("Unregister"); err != nil {
		return err
	}
	if b.Kind() != memory.Mapped {
		return fmt.Errorf("cuda: Unregister of %v memory: want what Register returned", b.Kind())
	}
	hp := hostAddr(b)
	if err := dev.untrack("Unregister", hp, b.Len(), allocRegistered); err != nil {
		return err
	}
	d := dev.st.drv
	return dev.st.do(func() error { return d.check("cuMemHostUnregister", callN(d.fn.memHostUnregister, hp)) })
}

// CanAccessPeer reports whether this device can address other's memory
// directly (cuDeviceCanAccessPeer). A device is not its own peer: false for
// the same ordinal.
func (dev *Device) CanAccessPeer(other *Device) (bool, error) {
	if dev.st.ordinal == other.st.ordinal {
		return false, nil
	}
	var v int32
	d := dev.st.drv
	if err := d.check("cuDeviceCanAccessPeer", callN(d.fn.deviceCanAccessPeer, uintptr(unsafe.Pointer(&v)), dev.st.cu, other.st.cu)); err != nil {
		return false, err
	}
	return v != 0, nil
}

// PointerDevice says which device owns the memory at ptr
// (cuPointerGetAttribute): its ordinal, and whether it is device memory
// (isDevice; false for pinned or registered host memory, whose ordinal is
// the device of the context that mapped it). A pointer CUDA does not know
// (pageable host memory) gives ordinal -1, false and no error.
func (dev *Device) PointerDevice(ptr uintptr) (ordinal int, isDevice bool, err error) {
	if err := dev.live("PointerDevice"); err != nil {
		return -1, false, err
	}
	d := dev.st.drv
	var typ uint32
	var ord int32
	unknown := false
	err = dev.st.do(func() error {
		r := callN(d.fn.pointerGetAttribute, uintptr(unsafe.Pointer(&typ)), ptrAttrMemoryType, ptr)
		if r == errInvalidValue {
			unknown = true
			return nil
		}
		if err := d.check("cuPointerGetAttribute", r); err != nil {
			return err
		}
		return d.check("cuPointerGetAttribute", callN(d.fn.pointerGetAttribute, uintptr(unsafe.Pointer(&ord)), ptrAttrDeviceOrdinal, ptr))
	})
	if err != nil || unknown {
		return -1, false, err
	}
	return int(ord), typ == memTypeDevice, nil
}

// IPCHandle returns a handle (cuIpcGetMemHandle) through which another
// process opens b with OpenIPC. b is device memory of this device that
// starts an allocation (cuMemAlloc's pointer, not inside one): the handle
// names the whole allocation.
func (dev *Device) IPCHandle(b memory.Buffer) ([64]byte, error) {
	var h [64]byte
	if err := dev.live("IPCHandle"); err != nil {
		return h, err
	}
	ord, dp := b.Device()
	if b.Kind() != memory.Device || ord != dev.st.ordinal || b.Len() == 0 {
		return h, fmt.Errorf("cuda: IPCHandle of %d bytes of %v memory of device %d: want device memory of device %d", b.Len(), b.Kind(), ord, dev.st.ordinal)
	}
	d := dev.st.drv
	err := dev.st.do(func() error {
		base, _, err := dev.st.addressRange(dp)
		if err != nil {
			return err
		}
		if base != dp {
			return fmt.Errorf("cuda: IPCHandle of memory at offset %d of its allocation: export the allocation and slice what OpenIPC returns", dp-base)
		}
		return d.check("cuIpcGetMemHandle", callN(d.fn.ipcGetMemHandle, uintptr(unsafe.Pointer(&h)), dp))
	})
	return h, err
}

// addressRange returns the allocation containing dp (cuMemGetAddressRange);
// the context must be current.
func (st *devState) addressRange(dp uintptr) (base uintptr, n int, err error) {
	var size uintptr
	d := st.drv
	if err := d.check("cuMemGetAddressRange", callN(d.fn.memGetAddressRange, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size)), dp)); err != nil {
		return 0, 0, err
	}
	return base, int(size), nil
}

// OpenIPC maps the allocation that a handle from IPCHandle in another
// process names (cuIpcOpenMemHandle with LAZY_ENABLE_PEER_ACCESS) and
// returns it whole as device memory of this device (its length from
// cuMemGetAddressRange, which may exceed what was asked of cuMemAlloc: the
// driver rounds allocations up). CloseIPC unmaps it. Opening a handle in
// the process that exported it fails (CUDA refuses it): use the memory
// directly there.
func (dev *Device) OpenIPC(h [64]byte) (memory.Buffer, error) {
	if err := dev.live("OpenIPC"); err != nil {
		return memory.Buffer{}, err
	}
	d := dev.st.drv
	var dp uintptr
	var n int
	err := dev.st.do(func() error {
		if err := d.check("cuIpcOpenMemHandle", ipcOpen(d.fn.ipcOpenMemHandle, &dp, &h, ipcLazyEnablePeerAccess)); err != nil {
			return err
		}
		var err error
		if _, n, err = dev.st.addressRange(dp); err != nil {
			callN(d.fn.ipcCloseMemHandle, dp)
		}
		return err
	})
	if err != nil {
		return memory.Buffer{}, err
	}
	dev.track(dp, allocation{allocIPC, n})
	return memory.DeviceBuffer(dev.st.ordinal, dp, n), nil
}

// CloseIPC unmaps memory that OpenIPC returned (cuIpcCloseMemHandle), the
// whole buffer. The exporter's memory is left as it is.
func (dev *Device) CloseIPC(b memory.Buffer) error {
	if err := dev.live("CloseIPC"); err != nil {
		return err
	}
	ord, dp := b.Device()
	if b.Kind() != memory.Device || ord != dev.st.ordinal {
		return fmt.Errorf("cuda: CloseIPC of %v memory of device %d on device %d", b.Kind(), ord, dev.st.ordinal)
	}
	if err := dev.untrack("CloseIPC", dp, b.Len(), allocIPC); err != nil {
		return err
	}
	d := dev.st.drv
	return dev.st.do(func() error { return d.check("cuIpcCloseMemHandle", callN(d.fn.ipcCloseMemHandle, dp)) })
}

// DMABuf exports b, whole pages of device memory of this device, as a
// dma-buf (cuMemGetHandleForAddressRange with DMA_BUF_FD), for an RDMA
// NIC to register (ibv_reg_dmabuf_mr): GPUDirect RDMA without
// nvidia-peermem, as NCCL does where the driver supports it. The
// descriptor holds exactly b, so b starts at offset 0 of it; the caller
// closes it.
func (dev *Device) DMABuf(b memory.Buffer) (int, uint64, error) {
	if err := dev.live("DMABuf"); err != nil {
		return -1, 0, err
	}
	ord, dp := b.Device()
	if b.Kind() != memory.Device || ord != dev.st.ordinal || b.Len() == 0 {
		return -1, 0, fmt.Errorf("cuda: DMABuf of %d bytes of %v memory of device %d: want device memory of device %d", b.Len(), b.Kind(), ord, dev.st.ordinal)
	}
	page := uintptr(os.Getpagesize())
	if dp%page != 0 || uintptr(b.Len())%page != 0 {
		return -1, 0, fmt.Errorf("cuda: DMABuf of %d bytes at %#x: not whole pages of %d bytes", b.Len(), dp, page)
	}
	d := dev.st.drv
	switch {
	case d.fn.memGetHandleForAddressRange == 0:
		return -1, 0, fmt.Errorf("cuda: CUDA driver %s has no cuMemGetHandleForAddressRange (11.7 or later has): %w", versionString(d.version), device.ErrNotSupported)
	case !dev.st.dmabuf:
		return -1, 0, fmt.Errorf("cuda: %s reports no dma-buf support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: the NVIDIA open kernel modules and Linux 5.12 or later have it): %w", dev.st.info.Name, device.ErrNotSupported)
	}
	var fd int32
	err := dev.st.do(func() error {
		return d.check("cuMemGetHandleForAddressRange", callN(d.fn.memGetHandleForAddressRange,
			uintptr(unsafe.Pointer(&fd)), dp, uintptr(b.Len()), memRangeHandleDMABufFD, 0))
	})
	if err != nil {
		return -1, 0, err
	}
	return int(fd), 0, nil
}
