//go:build unix && !linux && !darwin && !openbsd && !illumos

package tcp

import "golang.org/x/sys/unix"

// Where golang.org/x/sys has no readv and writev (FreeBSD, NetBSD,
// DragonFly, Solaris), each is two calls: the second only when the first
// moved all of a, so the result is what one vectored call returns on a
// non-blocking descriptor, a short count included.

// sysReadv reads into a then b on a non-blocking descriptor.
func sysReadv(fd int, a, b []byte) (int, error) {
	return twice(fd, a, b, unix.Read)
}

// sysWritev writes a then b on a non-blocking descriptor.
func sysWritev(fd int, a, b []byte) (int, error) {
	return twice(fd, a, b, unix.Write)
}
