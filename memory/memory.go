// Package memory describes where a buffer lives, so that the engine, the
// reduction kernels and the transports can agree on it without copying.
//
// A Buffer is one of three kinds:
//
//   - Host: a []byte the CPU addresses directly (pageable memory; a GPU
//     kernel cannot read it);
//   - Device: an address in one GPU's memory, which the CPU must not
//     dereference;
//   - Mapped: pinned host memory mapped into one GPU's address space
//     (cuMemHostAlloc with DEVICEMAP, or cuMemHostRegister of existing
//     memory such as a shared-memory segment): the CPU reaches it as a
//     []byte and the GPU's kernels and copies through a device address.
//     Slots that a GPU fills and a socket or another process drains are
//     Mapped.
//
// A transport that can move device memory (CUDA IPC within a host,
// GPUDirect RDMA across hosts) accepts Device buffers as slots and sources
// directly, and reductions on them are done by device kernels rather than
// the host kernels, so no byte goes through host memory unless the
// hardware needs it to.
//
// A Buffer is a small value (pass it by value); it does not own the memory
// it describes. Whoever created the memory keeps it alive and unchanged for
// as long as any Buffer describing it is in use.
package memory

import (
	"errors"
	"fmt"
	"unsafe"
)

// Kind says where a buffer's memory is.
type Kind uint8

// Kinds of memory.
const (
	Host   Kind = iota // CPU-addressable (pageable) memory
	Device             // GPU memory; see Buffer.Device
	Mapped             // pinned host memory a GPU also addresses; see MappedBuffer
)

func (k Kind) String() string {
	switch k {
	case Host:
		return "host"
	case Device:
		return "device"
	case Mapped:
		return "mapped"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// DeviceVisible reports whether a GPU's kernels reach memory of kind k.
func (k Kind) DeviceVisible() bool { return k == Device || k == Mapped }

// Buffer is a run of bytes in host, device or mapped memory.
//
// It is 32 bytes in four fields, passed by value on every slice the
// engine moves: the CPU's view is a pointer and the length, not a slice
// header (which would make it 48), and the device and kind share a word.
// Four fields of at most 32 bytes is what Go's compiler keeps in
// registers; a fifth made every Buffer a stack temporary, written a
// word at a time and copied 16 bytes at a time, which stalls each copy
// on store forwarding (such copies drew a sixth of the samples of an
// 8-byte broadcast's profile: docs/performance.md, "The 8-byte call
// path").
type Buffer struct {
	// host is the first byte of the CPU's view (Host and Mapped), nil when
	// the buffer is empty: an unsafe.Pointer, so that a Buffer keeps Go
	// memory it describes alive, and never one past an object's end.
	host unsafe.Pointer
	ptr  uintptr // the GPU's address (Device and Mapped)
	n    int
	at   where
}

// where is a Buffer's kind of memory and, for Device and Mapped, its GPU.
type where struct {
	devID int32
	kind  Kind
}

// hostStart is the pointer a Buffer keeps for b.
func hostStart(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

// HostBuffer describes host memory b.
func HostBuffer(b []byte) Buffer { return Buffer{host: hostStart(b), n: len(b), at: where{kind: Host}} }

// DeviceBuffer describes n bytes at address ptr in the memory of GPU device.
func DeviceBuffer(device int, ptr uintptr, n int) Buffer {
	return Buffer{ptr: ptr, n: n, at: where{devID: int32(device), kind: Device}}
}

// MappedBuffer describes pinned host memory b that GPU device addresses at
// devPtr (the two views of the same bytes).
func MappedBuffer(b []byte, device int, devPtr uintptr) Buffer {
	return Buffer{host: hostStart(b), ptr: devPtr, n: len(b), at: where{devID: int32(device), kind: Mapped}}
}

// Kind reports where the buffer's memory is.
func (b Buffer) Kind() Kind { return b.at.kind }

// Len returns the buffer's length in bytes.
func (b Buffer) Len() int { return b.n }

// Bytes returns the host memory of b (Host and Mapped). It panics for
// device memory: reaching it from the CPU would be a bug, not an error to
// handle.
func (b Buffer) Bytes() []byte {
	if b.at.kind == Device {
		panic("memory: Bytes of a device buffer")
	}
	return unsafe.Slice((*byte)(b.host), b.n)
}

// HostVisible reports whether the CPU may reach b through Bytes.
func (b Buffer) HostVisible() bool { return b.at.kind != Device }

// DeviceVisible reports whether a GPU's kernels reach b (Device and
// Mapped), at the address Device returns.
func (b Buffer) DeviceVisible() bool { return b.at.kind != Host }

// Device returns the GPU and its address of device or mapped memory (0, 0
// for host memory).
func (b Buffer) Device() (device int, ptr uintptr) {
	if b.at.kind == Host {
		return 0, 0
	}
	return int(b.at.devID), b.ptr
}

// Slice returns bytes [lo, hi) of b. It panics if they are not inside b.
// It is small enough to be inlined: the engine slices buffers for every
// slice it moves.
func (b Buffer) Slice(lo, hi int) Buffer {
	if uint(lo) > uint(hi) || uint(hi) > uint(b.n) {
		panic(errSlice)
	}
	b.n = hi - lo
	if b.at.kind != Host {
		b.ptr += uintptr(lo)
	}
	switch {
	case b.at.kind == Device:
	case b.n == 0:
		b.host = nil
	default:
		b.host = unsafe.Add(b.host, lo)
	}
	return b
}

var errSlice = errors.New("memory: slice bounds out of range")

// space says which address space addr is in: the CPU's (Host and Mapped
// alike: a mapped buffer is host memory, so it overlaps the Host buffer
// over the same bytes) or a GPU's.
func (b Buffer) space() int32 {
	if b.at.kind == Device {
		return b.at.devID
	}
	return -1
}

// addr returns the buffer's start address in its space and whether it has
// one (an empty buffer has none).
func (b Buffer) addr() (uintptr, bool) {
	if b.at.kind == Device {
		return b.ptr, b.n > 0
	}
	if b.host == nil {
		return 0, false
	}
	return uintptr(b.host), true
}

// Overlaps reports whether b and o share at least one byte of the same
// memory (host memory, Host or Mapped; or the same GPU's memory).
func (b Buffer) Overlaps(o Buffer) bool {
	// Written to be inlined (every operation's argument check asks): a
	// non-empty Host or Mapped buffer has a host pointer, a GPU's buffer
	// is in its device's space only.
	x, y := uintptr(b.host), uintptr(o.host)
	if b.at.kind == Device || o.at.kind == Device {
		if b.at.kind != o.at.kind || b.at.devID != o.at.devID {
			return false
		}
		x, y = b.ptr, o.ptr
	}
	return b.n > 0 && o.n > 0 && x < y+uintptr(o.n) && y < x+uintptr(b.n)
}

// Offset returns the offset of o's first byte within b, and whether o lies
// entirely inside b.
func (b Buffer) Offset(o Buffer) (int, bool) {
	if b.space() != o.space() {
		return 0, false
	}
	x, ok1 := b.addr()
	y, ok2 := o.addr()
	if !ok1 || !ok2 || y < x || y+uintptr(o.n) > x+uintptr(b.n) {
		return 0, false
	}
	return int(y - x), true
}

// View returns the part of b that is the host bytes h, as b's kind sees
// it (for mapped memory: with its device address too). It panics unless h
// lies inside b's host view: a transport handing out views of memory it
// registered.
func (b Buffer) View(h []byte) Buffer {
	off, ok := b.Offset(HostBuffer(h))
	if !ok && len(h) > 0 {
		panic(errView)
	}
	return b.Slice(off, off+len(h))
}

var errView = errors.New("memory: View of bytes outside the buffer")

// Same reports whether b and o are exactly the same bytes.
func (b Buffer) Same(o Buffer) bool {
	off, ok := b.Offset(o)
	return ok && off == 0 && b.n == o.n
}

// SameStart reports whether b and o are not empty and start at the same
// byte of the same memory.
func (b Buffer) SameStart(o Buffer) bool {
	if b.at.kind == Device || o.at.kind == Device {
		return b.at.kind == o.at.kind && b.at.devID == o.at.devID && b.ptr == o.ptr && b.n > 0 && o.n > 0
	}
	return b.host != nil && b.host == o.host
}
