package emu

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

// Name is the emulated device's name in Info: never a GPU's.
const Name = "emulated device (tests only)"

// Poison is the byte fresh and freed memory is filled with: 0xFF is a NaN
// in float16, bfloat16, float32 and float64, and -1 or the maximum in the
// integer types.
const Poison byte = 0xFF

// Defaults of Options.
const (
	DefaultMaxDelay = 50 * time.Microsecond
	DefaultMemory   = 1 << 30
)

// Errors the emulator returns; the messages of wrapped ones say which
// buffer, stream or handle.
var (
	// ErrClosed is returned by the methods of a closed Stream.
	ErrClosed = errors.New("emu: stream closed")
	// ErrInUse is returned by Free (and CloseIPC) of memory that queued
	// work still uses: the memory is released all the same, and the
	// stream whose work meets it fails.
	ErrInUse = errors.New("emu: memory freed while queued work uses it")
	// ErrConcurrentUse is returned when two goroutines call a Stream's
	// methods at once (device.go, obligation 5).
	ErrConcurrentUse = errors.New("emu: stream methods called concurrently (one goroutine at a time)")
	// ErrIPCSameProcess is returned by OpenIPC of a handle exported by the
	// calling process, as CUDA refuses it.
	ErrIPCSameProcess = errors.New("emu: IPC handle opened in the exporting process")
)

// Options configures a Device. The zero value means the defaults.
type Options struct {
	// Seed seeds the math/rand/v2 PCG sources of the streams' delays and
	// of the order in which kernels write their pieces.
	Seed uint64
	// MaxDelay bounds the random delay before every queued item runs:
	// 0 means DefaultMaxDelay, a negative value no delay.
	MaxDelay time.Duration
	// Memory is the device memory Alloc and AllocShared may hand out, in
	// bytes: 0 means DefaultMemory.
	Memory int64
	// NoPoison leaves fresh and freed memory as the system gives it
	// (zeroes) instead of filling it with Poison.
	NoPoison bool
	// DMABuf backs Alloc's memory with memfds (Linux only), so that
	// DMABuf exports it as CUDA exports device memory for GPUDirect RDMA
	// (the emulated RDMA device, transport/verbs/ibemu, maps such a
	// descriptor). Without it DMABuf fails with device.ErrNotSupported,
	// as on a GPU without dma-buf support.
	DMABuf bool
	// Major and Minor are the compute capability Info reports (0.0 by
	// default): the RDMA transport's flush read depends on it.
	Major, Minor int
}

// allocKind is how an allocation was made.
type allocKind uint8

const (
	allocDevice     allocKind = iota // Alloc
	allocMapped                      // AllocHost
	allocShared                      // AllocShared: memfd-backed, exportable
	allocImported                    // OpenIPC: another process's AllocShared
	allocRegistered                  // Register: existing host memory, mapped
)

var allocNames = [...]string{"device", "mapped", "shared device", "IPC-imported", "registered host"}

func (k allocKind) String() string { return allocNames[k] }

// alloc is one allocation. mem and the fields above mu's line do not
// change after registration.
type alloc struct {
	base    uintptr
	mem     []byte // exactly the allocation's bytes
	kind    allocKind
	release func() error // unmaps (and closes what else backs the memory)

	// guarded by Device.mu
	pending int       // queued items that reference the allocation
	freed   bool      // Free or CloseIPC was called; unmapped once pending is 0
	sh      sharedMem // what backs an allocShared allocation
}

func (a *alloc) end() uintptr { return a.base + uintptr(len(a.mem)) }

// Device is a host-emulated GPU for tests. Its methods are safe for
// concurrent use.
type Device struct {
	ordinal  int
	opts     Options
	maxDelay time.Duration

	mu      sync.Mutex
	allocs  []*alloc        // live allocations, sorted by base; guarded by mu
	freed   map[uintptr]int // freed bases (not since reused) and lengths, for double frees; guarded by mu
	used    int64           // bytes of device memory allocated; guarded by mu
	streams int             // streams created, to seed each; guarded by mu
}

var (
	_ device.Device         = (*Device)(nil)
	_ device.Registrar      = (*Device)(nil)
	_ device.DMABufExporter = (*Device)(nil)
	_ device.IPCExporter    = (*Device)(nil)
)

// New returns an emulated device that reports ordinal as its index. Two
// Devices never share memory, even with the same ordinal: a buffer of one
// is not inside a live allocation of the other.
func New(ordinal int, opts Options) *Device {
	d := &Device{ordinal: ordinal, opts: opts, freed: map[uintptr]int{}}
	switch {
	case opts.MaxDelay == 0:
		d.maxDelay = DefaultMaxDelay
	case opts.MaxDelay > 0:
		d.maxDelay = opts.MaxDelay
	}
	if d.opts.Memory == 0 {
		d.opts.Memory = DefaultMemory
	}
	return d
}

// Ordinal returns the ordinal New was given.
func (d *Device) Ordinal() int { return d.ordinal }

// Info describes the device as emulated: it is never a GPU.
func (d *Device) Info() device.Info {
	return device.Info{Name: Name, Memory: d.opts.Memory, Major: d.opts.Major, Minor: d.opts.Minor, Emulated: true}
}

// Alloc returns n bytes of emulated device memory (memory.Device), filled
// with Poison.
func (d *Device) Alloc(n int) (memory.Buffer, error) {
	if n <= 0 {
		return memory.Buffer{}, fmt.Errorf("emu: Alloc of %d bytes: want at least 1", n)
	}
	if err := d.reserve(n); err != nil {
		return memory.Buffer{}, err
	}
	if d.opts.DMABuf {
		return d.allocExportable(n)
	}
	mem, release, err := mapAnon(n)
	if err != nil {
		d.unreserve(n)
		return memory.Buffer{}, fmt.Errorf("emu: Alloc of %d bytes: %w", n, err)
	}
	a := d.register(mem, allocDevice, release)
	return memory.DeviceBuffer(d.ordinal, a.base, n), nil
}

// AllocHost returns n bytes of emulated pinned host memory mapped for this
// device (memory.Mapped, the device address being the host address),
// filled with Poison.
func (d *Device) AllocHost(n int) (memory.Buffer, error) {
	if n <= 0 {
		return memory.Buffer{}, fmt.Errorf("emu: AllocHost of %d bytes: want at least 1", n)
	}
	mem, release, err := mapAnon(n)
	if err != nil {
		return memory.Buffer{}, fmt.Errorf("emu: AllocHost of %d bytes: %w", n, err)
	}
	a := d.register(mem, allocMapped, release)
	return memory.MappedBuffer(a.mem, d.ordinal, a.base), nil
}

func (d *Device) reserve(n int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.used+int64(n) > d.opts.Memory {
		return fmt.Errorf("emu: out of device memory: %d bytes asked, %d of %d in use", n, d.used, d.opts.Memory)
	}
	d.used += int64(n)
	return nil
}

func (d *Device) unreserve(n int) {
	d.mu.Lock()
	d.used -= int64(n)
	d.mu.Unlock()
}

// register poisons mem and adds it to the live allocations.
func (d *Device) register(mem []byte, kind allocKind, release func() error) *alloc {
	if !d.opts.NoPoison && kind != allocImported && kind != allocRegistered {
		fill(mem, Poison)
	}
	a := &alloc{base: addrOf(mem), mem: mem[:len(mem):len(mem)], kind: kind, release: release}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, _ := slices.BinarySearchFunc(d.allocs, a.base, func(x *alloc, p uintptr) int { return cmp.Compare(x.base, p) })
	d.allocs = slices.Insert(d.allocs, i, a)
	// The system may give the addresses of freed memory out again: they
	// are no longer a double free.
	for base, n := range d.freed {
		if base < a.end() && a.base < base+uintptr(n) {
			delete(d.freed, base)
		}
	}
	return a
}

// Free releases memory that Alloc, AllocHost or AllocShared returned:
// the whole allocation, as they returned it. It poisons the memory and
// unmaps it, once no queued work references it. Freeing memory that
// queued work still uses returns ErrInUse (the memory is released all the
// same) and fails the streams whose work meets it.
func (d *Device) Free(b memory.Buffer) error {
	return d.free(b, "Free")
}

// CloseIPC unmaps memory that OpenIPC returned (the exporter's memory is
// left as it is). Queued work that uses it is handled as by Free.
func (d *Device) CloseIPC(b memory.Buffer) error {
	return d.free(b, "CloseIPC")
}

func (d *Device) free(b memory.Buffer, call string) error {
	if b.Kind() == memory.Host {
		return fmt.Errorf("emu: %s of host memory (%d bytes): not allocated by the device", call, b.Len())
	}
	ord, ptr := b.Device()
	if ord != d.ordinal {
		return fmt.Errorf("emu: %s on device %d of %v memory at %#x of device %d", call, d.ordinal, b.Kind(), ptr, ord)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := slices.BinarySearchFunc(d.allocs, ptr, func(x *alloc, p uintptr) int { return cmp.Compare(x.base, p) })
	if !ok {
		if n, ok := d.freed[ptr]; ok {
			return fmt.Errorf("emu: %s of %#x: double free (the %d bytes there were freed already)", call, ptr, n)
		}
		if a := d.find(ptr); a != nil {
			return fmt.Errorf("emu: %s of %#x, at offset %d of the %d-byte allocation at %#x: free the whole allocation", call, ptr, ptr-a.base, len(a.mem), a.base)
		}
		return fmt.Errorf("emu: %s of %#x: not allocated by this device (%d)", call, ptr, d.ordinal)
	}
	a := d.allocs[i]
	if b.Len() != len(a.mem) {
		return fmt.Errorf("emu: %s of %d bytes at %#x: the allocation there has %d; free the whole allocation", call, b.Len(), ptr, len(a.mem))
	}
	wantKind := memory.Device
	if a.kind == allocMapped || a.kind == allocRegistered {
		wantKind = memory.Mapped
	}
	if b.Kind() != wantKind {
		return fmt.Errorf("emu: %s of a %v buffer at %#x: the memory there is %v memory", call, b.Kind(), ptr, a.kind)
	}
	switch {
	case call == "Free" && a.kind == allocImported:
		return fmt.Errorf("emu: Free of IPC-imported memory at %#x: use CloseIPC", ptr)
	case call == "CloseIPC" && a.kind != allocImported:
		return fmt.Errorf("emu: CloseIPC of %v memory at %#x: not opened with OpenIPC; use Free", a.kind, ptr)
	case call == "Free" && a.kind == allocRegistered:
		return fmt.Errorf("emu: Free of registered host memory at %#x: use Unregister", ptr)
	case call == "Unregister" && a.kind != allocRegistered:
		return fmt.Errorf("emu: Unregister of %v memory at %#x: not registered with Register", a.kind, ptr)
	}
	d.allocs = slices.Delete(d.allocs, i, i+1)
	d.freed[ptr] = len(a.mem)
	if a.kind == allocDevice || a.kind == allocShared {
		d.used -= int64(len(a.mem))
	}
	a.freed = true
	if a.pending > 0 {
		// The stream items that hold it unmap it when the last one is
		// done; they fail when they meet it.
		return fmt.Errorf("%w: %s of the %d bytes at %#x with %d queued item(s) using them", ErrInUse, call, len(a.mem), ptr, a.pending)
	}
	return d.destroy(a)
}

// Register maps existing host memory b for the device's kernels, as
// cuMemHostRegister does (shared-memory segments), and returns it as
// mapped memory (the device address being the host address). b must
// stay allocated, and must not overlap memory already registered, until
// Unregister; it is neither poisoned nor unmapped by the device.
func (d *Device) Register(b []byte) (memory.Buffer, error) {
	if len(b) == 0 {
		return memory.Buffer{}, errors.New("emu: Register of no bytes")
	}
	p := addrOf(b)
	d.mu.Lock()
	for _, a := range d.allocs {
		if a.base < p+uintptr(len(b)) && p < a.end() {
			d.mu.Unlock()
			return memory.Buffer{}, fmt.Errorf("emu: Register of %d bytes at %#x: overlaps the %v allocation at %#x", len(b), p, a.kind, a.base)
		}
	}
	d.mu.Unlock()
	a := d.register(b, allocRegistered, func() error { return nil })
	return memory.MappedBuffer(a.mem, d.ordinal, a.base), nil
}

// Unregister undoes Register, once no queued work uses the memory (as
// Free: ErrInUse otherwise, and the streams whose work meets it fail).
func (d *Device) Unregister(b memory.Buffer) error {
	return d.free(b, "Unregister")
}

// destroy poisons and unmaps a freed allocation. Imported memory is not
// poisoned: it is the exporter's; registered memory is the caller's.
func (d *Device) destroy(a *alloc) error {
	if !d.opts.NoPoison && a.kind != allocImported && a.kind != allocRegistered {
		fill(a.mem, Poison)
	}
	if err := a.release(); err != nil {
		return fmt.Errorf("emu: unmapping %#x: %w", a.base, err)
	}
	return nil
}

// find returns the live allocation holding address p, or nil. d.mu is
// held.
func (d *Device) find(p uintptr) *alloc {
	i, ok := slices.BinarySearchFunc(d.allocs, p, func(x *alloc, p uintptr) int { return cmp.Compare(x.base, p) })
	if ok {
		return d.allocs[i]
	}
	if i == 0 {
		return nil
	}
	if a := d.allocs[i-1]; p < a.end() {
		return a
	}
	return nil
}

// Live returns the number of allocations not yet freed (including
// IPC-imported memory not yet closed), for leak checks.
func (d *Device) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.allocs)
}

// Bytes returns the host bytes behind b, a Device or Mapped buffer inside
// a live allocation of this device. It is the tests' way to fill and read
// emulated device memory, as a test harness would with cudaMemcpy: the
// engine must never call it. The slice is valid until the memory is
// freed; reading it while queued work writes the memory shows that
// work's torn writes. Bytes panics for any other buffer: that is a bug in
// the test.
func (d *Device) Bytes(b memory.Buffer) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.lookup(b, "Bytes")
	if err != nil {
		panic(err.Error())
	}
	return v.bytes()
}

// view is a buffer resolved at enqueue: an allocation and a range in it,
// or host memory.
type view struct {
	a    *alloc
	off  int
	n    int
	host []byte // when a is nil
}

func (v view) bytes() []byte {
	if v.a == nil {
		return v.host
	}
	return v.a.mem[v.off : v.off+v.n : v.off+v.n]
}

// lookup resolves b, a Device or Mapped buffer of this device, to the
// live allocation it lies in. An empty buffer resolves to no allocation.
// d.mu is held.
func (d *Device) lookup(b memory.Buffer, what string) (view, error) {
	if b.Kind() == memory.Host {
		return view{}, fmt.Errorf("emu: %s: kernel on pageable host memory (%d bytes)", what, b.Len())
	}
	ord, ptr := b.Device()
	if ord != d.ordinal {
		return view{}, fmt.Errorf("emu: %s: %v buffer at %#x of device %d used on device %d", what, b.Kind(), ptr, ord, d.ordinal)
	}
	n := b.Len()
	if b.Kind() == memory.Mapped && n > 0 && addrOf(b.Bytes()) != ptr {
		return view{}, fmt.Errorf("emu: %s: mapped buffer whose host view (%#x) is not its device address (%#x)", what, addrOf(b.Bytes()), ptr)
	}
	if n == 0 {
		return view{}, nil
	}
	a := d.find(ptr)
	if a == nil || ptr+uintptr(n) > a.end() {
		return view{}, fmt.Errorf("emu: %s: %d-byte %v buffer at %#x is not inside a live allocation of this device (%d)%s",
			what, n, b.Kind(), ptr, d.ordinal, d.freedNote(ptr))
	}
	if (a.kind == allocMapped || a.kind == allocRegistered) != (b.Kind() == memory.Mapped) {
		return view{}, fmt.Errorf("emu: %s: %v buffer at %#x lies in %v memory", what, b.Kind(), ptr, a.kind)
	}
	return view{a: a, off: int(ptr - a.base), n: n}, nil
}

// freedNote says whether p was in memory freed already. d.mu is held.
func (d *Device) freedNote(p uintptr) string {
	for base, n := range d.freed {
		if base <= p && p < base+uintptr(n) {
			return fmt.Sprintf(": the %d bytes at %#x were freed", n, base)
		}
	}
	return ""
}

// check returns an error if an allocation of vs was freed.
func (d *Device) check(vs []view) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, v := range vs {
		if v.a != nil && v.a.freed {
			return fmt.Errorf("%w: the %d bytes at %#x (offset %d of the allocation at %#x) were freed before the work ran",
				ErrInUse, v.n, v.a.base+uintptr(v.off), v.off, v.a.base)
		}
	}
	return nil
}

// release undoes acquire, unmapping freed allocations no item holds any
// more, and reports an allocation freed while the work ran.
func (d *Device) release(vs []view) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var err error
	for _, v := range vs {
		a := v.a
		if a == nil {
			continue
		}
		a.pending--
		if !a.freed {
			continue
		}
		if err == nil {
			err = fmt.Errorf("%w: the %d bytes at %#x were freed while the work ran", ErrInUse, v.n, a.base+uintptr(v.off))
		}
		if a.pending == 0 {
			if derr := d.destroy(a); err == nil {
				err = derr
			}
		}
	}
	return err
}

func fill(b []byte, c byte) {
	for i := range b {
		b[i] = c
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
