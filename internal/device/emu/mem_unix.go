//go:build unix

package emu

import "golang.org/x/sys/unix"

// mapAnon maps n bytes of anonymous memory outside the Go heap, and
// returns them with the function that unmaps them.
func mapAnon(n int) ([]byte, func() error, error) {
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return m, func() error { return unix.Munmap(m) }, nil
}
