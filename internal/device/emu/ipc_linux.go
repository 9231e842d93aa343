package emu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
)

// An IPC handle is 64 bytes, like a CUDA IPC handle:
//
//	[0:8)   ipcMagic
//	[8:12)  the exporting process's pid
//	[12:16) the memfd's descriptor in that process
//	[16:24) the allocation's size
//	[24:32) a random check, also stored in the memfd just past the
//	        allocation, so that a descriptor reused since is refused
//
// all little-endian; the rest is zero.
const ipcMagic = "gocclemu"

// sharedMem is what backs an AllocShared allocation.
type sharedMem struct {
	fd    int
	check uint64
}

// AllocShared returns n bytes of emulated device memory (memory.Device)
// that IPCHandle can export to another process: memfd-backed, filled with
// Poison. Free releases it.
func (d *Device) AllocShared(n int) (memory.Buffer, error) {
	if n <= 0 {
		return memory.Buffer{}, fmt.Errorf("emu: AllocShared of %d bytes: want at least 1", n)
	}
	if err := d.reserve(n); err != nil {
		return memory.Buffer{}, err
	}
	return d.allocMemfd(n, allocShared, "AllocShared")
}

// AllocIPC is AllocShared (device.IPCExporter).
func (d *Device) AllocIPC(n int) (memory.Buffer, error) { return d.AllocShared(n) }

// allocMemfd makes n bytes of memfd-backed device memory of kind k (n has
// been reserved; on failure it is given back): AllocShared's, and Alloc's
// with Options.DMABuf.
func (d *Device) allocMemfd(n int, k allocKind, call string) (memory.Buffer, error) {
	mem, sh, err := newShared(n)
	if err != nil {
		d.unreserve(n)
		return memory.Buffer{}, fmt.Errorf("emu: %s of %d bytes: %w", call, n, err)
	}
	a := d.register(mem, k, func() error {
		err := unix.Munmap(mem)
		if cerr := unix.Close(sh.fd); err == nil {
			err = cerr
		}
		return err
	})
	d.mu.Lock()
	a.sh = sh
	d.mu.Unlock()
	return memory.DeviceBuffer(d.ordinal, a.base, n), nil
}

func newShared(n int) ([]byte, sharedMem, error) {
	fd, err := unix.MemfdCreate("goccl-emu", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, sharedMem{}, fmt.Errorf("memfd_create: %w", err)
	}
	// The check is not test input, so it comes from the unseeded source.
	sh := sharedMem{fd: fd, check: rand.Uint64()}
	var c [8]byte
	binary.LittleEndian.PutUint64(c[:], sh.check)
	if err = unix.Ftruncate(fd, int64(n)+8); err == nil {
		_, err = unix.Pwrite(fd, c[:], int64(n))
	}
	var mem []byte
	if err == nil {
		mem, err = unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		unix.Close(fd)
		return nil, sharedMem{}, err
	}
	return mem, sh, nil
}

// allocExportable is Alloc with Options.DMABuf: memfd-backed device
// memory (n has been reserved).
func (d *Device) allocExportable(n int) (memory.Buffer, error) {
	return d.allocMemfd(n, allocDevice, "Alloc")
}

// DMABuf exports b as cuMemGetHandleForAddressRange does, for the
// emulated RDMA device: a new descriptor of the memfd behind b's
// allocation (made by Alloc with Options.DMABuf), and b's offset in it.
// b must be whole pages, as CUDA requires.
func (d *Device) DMABuf(b memory.Buffer) (int, uint64, error) {
	ord, ptr := b.Device()
	if b.Kind() != memory.Device || ord != d.ordinal || b.Len() == 0 {
		return -1, 0, fmt.Errorf("emu: DMABuf of %d bytes of %v memory of device %d: want device memory of device %d", b.Len(), b.Kind(), ord, d.ordinal)
	}
	if !d.opts.DMABuf {
		return -1, 0, fmt.Errorf("emu: DMABuf: this emulated device was made without Options.DMABuf: %w", device.ErrNotSupported)
	}
	page := uintptr(unix.Getpagesize())
	if ptr%page != 0 || uintptr(b.Len())%page != 0 {
		return -1, 0, fmt.Errorf("emu: DMABuf of %d bytes at %#x: not whole pages of %d bytes", b.Len(), ptr, page)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.find(ptr)
	if a == nil || a.freed || a.kind != allocDevice || ptr+uintptr(b.Len()) > a.end() {
		return -1, 0, fmt.Errorf("emu: DMABuf of %d bytes at %#x: not inside a live allocation from Alloc", b.Len(), ptr)
	}
	fd, err := unix.FcntlInt(uintptr(a.sh.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("emu: DMABuf: %w", err)
	}
	return fd, uint64(ptr - a.base), nil
}

// IPCHandle returns a handle through which another process opens b, a
// whole AllocShared allocation of this device, with OpenIPC.
func (d *Device) IPCHandle(b memory.Buffer) ([64]byte, error) {
	var h [64]byte
	ord, ptr := b.Device()
	if b.Kind() != memory.Device || ord != d.ordinal {
		return h, fmt.Errorf("emu: IPCHandle of a %v buffer of device %d: want device memory of device %d", b.Kind(), ord, d.ordinal)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.find(ptr)
	if a == nil || a.base != ptr || len(a.mem) != b.Len() || a.kind != allocShared {
		return h, fmt.Errorf("emu: IPCHandle of %d bytes at %#x: want a whole allocation made with AllocShared", b.Len(), ptr)
	}
	copy(h[:8], ipcMagic)
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(a.sh.fd))
	binary.LittleEndian.PutUint64(h[16:], uint64(len(a.mem)))
	binary.LittleEndian.PutUint64(h[24:], a.sh.check)
	return h, nil
}

// OpenIPC maps the memory of a handle that IPCHandle made in another
// process, as device memory of this device (memory.Device). CloseIPC
// unmaps it. Opening a handle in the process that exported it fails with
// ErrIPCSameProcess, as in CUDA.
func (d *Device) OpenIPC(h [64]byte) (memory.Buffer, error) {
	if string(h[:8]) != ipcMagic {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: not an emulated device's IPC handle")
	}
	pid := int(binary.LittleEndian.Uint32(h[8:]))
	fd := int(binary.LittleEndian.Uint32(h[12:]))
	n := binary.LittleEndian.Uint64(h[16:])
	check := binary.LittleEndian.Uint64(h[24:])
	if pid == os.Getpid() {
		return memory.Buffer{}, ErrIPCSameProcess
	}
	if n == 0 || n > 1<<40 {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: handle of %d bytes", n)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	f, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: opening %s: %w (has the exporter exited or freed the memory?)", path, err)
	}
	defer unix.Close(f) // the mapping outlives the descriptor
	var st unix.Stat_t
	var c [8]byte
	if err := unix.Fstat(f, &st); err != nil {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: %s: %w", path, err)
	}
	if uint64(st.Size) != n+8 {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: %s has %d bytes, the handle says %d+8: a stale handle", path, st.Size, n)
	}
	if _, err := unix.Pread(f, c[:], int64(n)); err != nil || binary.LittleEndian.Uint64(c[:]) != check {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: %s is not the exported memory (check mismatch: a stale handle)", path)
	}
	mem, err := unix.Mmap(f, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return memory.Buffer{}, fmt.Errorf("emu: OpenIPC: mapping %s: %w", path, err)
	}
	a := d.register(mem, allocImported, func() error { return unix.Munmap(mem) })
	return memory.DeviceBuffer(d.ordinal, a.base, int(n)), nil
}
