package tcp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The sockets are non-blocking, so their reads and writes return at
// once. Up to rawMax bytes they go through raw system calls, which skip
// the runtime's bookkeeping for calls that may block (entersyscall and
// exitsyscall, 2-4% of a small operation's CPU in `perf`); larger ones
// keep it, so that a long copy in the kernel does not hold up the
// garbage collector's stops.
const rawMax = 64 << 10

// sysRead is read(2) on a non-blocking descriptor.
func sysRead(fd int, b []byte) (int, error) {
	if len(b) > rawMax || len(b) == 0 {
		return unix.Read(fd, b)
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// iovecs fills v with a and b, the non-empty ones, and returns how many
// it used and their total length.
func iovecs(v *[2]unix.Iovec, a, b []byte) (int, int) {
	k := 0
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			v[k].Base = &p[0]
			v[k].SetLen(len(p))
			k++
		}
	}
	return k, len(a) + len(b)
}

// sysReadv is readv(2) into a then b on a non-blocking descriptor.
func sysReadv(fd int, a, b []byte) (int, error) { return sysIov(unix.SYS_READV, fd, a, b) }

// sysWritev is writev(2) of a then b on a non-blocking descriptor.
func sysWritev(fd int, a, b []byte) (int, error) { return sysIov(unix.SYS_WRITEV, fd, a, b) }

// sysIov is readv(2) or writev(2) (trap) of a then b. The calls are
// direct, so that the compiler keeps the iovecs where the converted
// pointer says while the kernel uses them.
func sysIov(trap uintptr, fd int, a, b []byte) (int, error) {
	var v [2]unix.Iovec
	k, total := iovecs(&v, a, b)
	if k == 0 {
		return 0, nil
	}
	var n uintptr
	var e unix.Errno
	if total <= rawMax {
		n, _, e = unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&v[0])), uintptr(k))
	} else {
		n, _, e = unix.Syscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&v[0])), uintptr(k))
	}
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// sysPoll0 is poll(2) with a zero timeout: it never blocks.
func sysPoll0(fds []unix.PollFd) (int, error) {
	if len(fds) == 0 {
		return 0, nil
	}
	var zero unix.Timespec
	n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
