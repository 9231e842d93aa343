// Package memory describes where a buffer lives, so that the engine, the
// reduction kernels and the transports can agree on it without copying.
//
// A Buffer is either host memory (a []byte the CPU addresses directly) or
// device memory (an address in one GPU's memory, which the CPU must not
// dereference). Host buffers are what goccl runs on today. Device buffers
// are the seam for CUDA: a transport that can move device memory (CUDA IPC
// within a host, GPUDirect RDMA across hosts) accepts them as slots and
// sources directly, and reductions on them are done by device kernels
// rather than the host kernels, so no byte goes through host memory unless
// the hardware needs it to.
//
// A Buffer is a small value (pass it by value); it does not own the memory
// it describes. Whoever created the memory keeps it alive and unchanged for
// as long as any Buffer describing it is in use.
package memory

import (
	"fmt"
	"unsafe"
)

// Kind says where a buffer's memory is.
type Kind uint8

// Kinds of memory.
const (
	Host   Kind = iota // CPU-addressable memory
	Device             // GPU memory; see Buffer.Device
)

func (k Kind) String() string {
	switch k {
	case Host:
		return "host"
	case Device:
		return "device"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Buffer is a run of bytes in host or device memory.
type Buffer struct {
	host  []byte
	ptr   uintptr // device address when kind == Device
	n     int
	devID int32
	kind  Kind
}

// HostBuffer describes host memory b.
func HostBuffer(b []byte) Buffer { return Buffer{host: b, n: len(b), kind: Host} }

// DeviceBuffer describes n bytes at address ptr in the memory of GPU device.
func DeviceBuffer(device int, ptr uintptr, n int) Buffer {
	return Buffer{ptr: ptr, n: n, devID: int32(device), kind: Device}
}

// Kind reports where the buffer's memory is.
func (b Buffer) Kind() Kind { return b.kind }

// Len returns the buffer's length in bytes.
func (b Buffer) Len() int { return b.n }

// Bytes returns the host memory of b. It panics for device memory: reaching
// it from the CPU would be a bug, not an error to handle.
func (b Buffer) Bytes() []byte {
	if b.kind != Host {
		panic("memory: Bytes of a device buffer")
	}
	return b.host
}

// Device returns the GPU and address of device memory (0, 0 for host).
func (b Buffer) Device() (device int, ptr uintptr) {
	if b.kind != Device {
		return 0, 0
	}
	return int(b.devID), b.ptr
}

// Slice returns bytes [lo, hi) of b.
func (b Buffer) Slice(lo, hi int) Buffer {
	if lo < 0 || hi < lo || hi > b.n {
		panic(fmt.Sprintf("memory: slice [%d:%d] of a %d-byte buffer", lo, hi, b.n))
	}
	if b.kind == Host {
		return Buffer{host: b.host[lo:hi:hi], n: hi - lo, kind: Host}
	}
	return Buffer{ptr: b.ptr + uintptr(lo), n: hi - lo, devID: b.devID, kind: Device}
}

// addr returns the buffer's start address and whether it has one (an empty
// host buffer has none).
func (b Buffer) addr() (uintptr, bool) {
	if b.kind == Device {
		return b.ptr, b.n > 0
	}
	if len(b.host) == 0 {
		return 0, false
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b.host))), true
}

// Overlaps reports whether b and o share at least one byte of the same
// memory (same kind and, for device memory, the same GPU).
func (b Buffer) Overlaps(o Buffer) bool {
	if b.kind != o.kind || (b.kind == Device && b.devID != o.devID) {
		return false
	}
	x, ok1 := b.addr()
	y, ok2 := o.addr()
	if !ok1 || !ok2 {
		return false
	}
	return x < y+uintptr(o.n) && y < x+uintptr(b.n)
}

// Offset returns the offset of o's first byte within b, and whether o lies
// entirely inside b.
func (b Buffer) Offset(o Buffer) (int, bool) {
	if b.kind != o.kind || (b.kind == Device && b.devID != o.devID) {
		return 0, false
	}
	x, ok1 := b.addr()
	y, ok2 := o.addr()
	if !ok1 || !ok2 || y < x || y+uintptr(o.n) > x+uintptr(b.n) {
		return 0, false
	}
	return int(y - x), true
}

// Same reports whether b and o are exactly the same bytes.
func (b Buffer) Same(o Buffer) bool {
	off, ok := b.Offset(o)
	return ok && off == 0 && b.n == o.n
}
