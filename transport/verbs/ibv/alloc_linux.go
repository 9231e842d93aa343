package ibv

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Alloc maps n bytes (rounded up to whole pages) of fresh zeroed memory.
func Alloc(n int) (*Mem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ibv: allocating %d bytes", n)
	}
	page := unix.Getpagesize()
	size := (n + page - 1) &^ (page - 1)
	fd, err := unix.MemfdCreate("goccl-verbs", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ibv: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibv: sizing %d bytes of memory: %w", size, err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibv: mapping %d bytes: %w", size, err)
	}
	m := &Mem{B: b[:n:n], fd: fd, all: b}
	allocs.add(m, size)
	return m, nil
}

// Free unmaps the memory. Its regions must have been deregistered.
func (m *Mem) Free() error {
	if m == nil || m.B == nil {
		return nil
	}
	allocs.remove(m)
	err := unix.Munmap(m.all)
	unix.Close(m.fd)
	m.B = nil
	return err
}
