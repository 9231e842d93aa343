package ibemu

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func newSegment(n int) (*segment, error) {
	fd, err := unix.MemfdCreate("goccl-ibemu", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ibemu: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibemu: sizing a segment: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibemu: mapping a segment: %w", err)
	}
	return &segment{fd: fd, mem: mem}, nil
}
