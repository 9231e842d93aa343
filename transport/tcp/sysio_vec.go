//go:build darwin || openbsd || illumos

package tcp

import "golang.org/x/sys/unix"

// sysReadv is readv(2) into a then b on a non-blocking descriptor.
func sysReadv(fd int, a, b []byte) (int, error) { return unix.Readv(fd, [][]byte{a, b}) }

// sysWritev is writev(2) of a then b on a non-blocking descriptor.
func sysWritev(fd int, a, b []byte) (int, error) { return unix.Writev(fd, [][]byte{a, b}) }
