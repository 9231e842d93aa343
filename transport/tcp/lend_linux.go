package tcp

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Lending: a large slice sent from the caller's own pages.
//
// writev copies a slice into the socket's buffers, and on loopback that
// copy is half of a sender's CPU at 1 MiB (docs/performance.md, "Lent
// pages"). vmsplice(2) puts references to the caller's pages into a pipe
// instead, and splice(2) moves them on into the socket, so the kernel
// sends from those pages and copies nothing: on loopback the one copy
// left is the receiver's, out of the sender's pages; to a NIC that
// gathers, none.
//
// The pages are read when the receiver reads (or the NIC sends, or
// resends), after the system call has returned, so the caller must not
// change them until the receiver has read the slice. A lent slice says
// so in its header (wire.SliceLent); its receiver credits it as soon as
// it has read it, and the sender's Flush waits for the credit of the
// last slice it lent before it returns (transport.DirectSender's
// contract: src unchanged until Flush returns). Only counted slices
// (over creditMin bytes) from the caller's memory are lent: a staging
// slot is reused as soon as its slice is written, and a small slice
// costs less to copy than to lend. Which operations lend is the
// engine's question and the connection's answer (conn.LendFor).

// lendable reports whether this platform can lend pages to a socket.
const lendable = true

// pipeWant is the capacity asked of a lending socket's pipe: a slot of
// the default size, so that one vmsplice takes a whole slice. Pipes of
// more than a page or two count against the user's pipe-user-pages-soft
// (64 MiB by default), past which the kernel refuses to grow them.
const pipeWant = DefaultSlotSize

// pipeMin is the least pipe lent through: a smaller one would take a
// slice in several vmsplice and splice calls each (not measured; such a
// socket copies instead). At pipeWant, pipe-user-pages-soft allows 128
// lending sockets per user before the kernel refuses to grow a pipe.
const pipeMin = 256 << 10

// lender is one socket's pipe; only the goroutine that writes the
// socket (under its wmu) uses it.
type lender struct {
	r, w  int  // the pipe's ends, once made
	made  bool // the pipe exists
	off   bool // the pipe could not be made large enough: copy instead
	piped int  // bytes in the pipe not yet moved into the socket
}

// ready makes the pipe on first use and reports whether the socket fd
// lends.
func (l *lender) ready(fd int) bool {
	if l.made || l.off {
		return l.made
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		l.off = true
		return false
	}
	got, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeWant)
	if err == nil {
		// Both calls with nothing to move: a system that forbids either
		// (a seccomp filter) has the socket copy, rather than fail the
		// connection with bytes stuck in the pipe.
		if _, _, e := unix.Syscall6(unix.SYS_VMSPLICE, uintptr(p[1]), 0, 0, unix.SPLICE_F_NONBLOCK, 0, 0); e != 0 {
			err = e
		} else if _, e := unix.Splice(p[0], nil, fd, nil, 0, unix.SPLICE_F_NONBLOCK); e != nil {
			err = e
		}
	}
	if err != nil || got < pipeMin {
		unix.Close(p[0])
		unix.Close(p[1])
		l.off = true
		return false
	}
	l.r, l.w, l.made = p[0], p[1], true
	return true
}

// fill puts references to as much of b as the pipe takes into it and
// returns how many bytes that was. The pipe must be empty.
func (l *lender) fill(b []byte) (int, error) {
	for {
		iov := unix.Iovec{Base: &b[0]}
		iov.SetLen(len(b))
		n, _, e := unix.Syscall6(unix.SYS_VMSPLICE, uintptr(l.w), uintptr(unsafe.Pointer(&iov)), 1, unix.SPLICE_F_NONBLOCK, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return 0, e
		}
		l.piped += int(n)
		return int(n), nil
	}
}

// drain moves the pipe's bytes into the socket fd until it is empty or
// the socket takes no more (EAGAIN).
func (l *lender) drain(fd int) error {
	for l.piped > 0 {
		n, err := unix.Splice(l.r, nil, fd, nil, l.piped, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
		switch {
		case n > 0:
			l.piped -= int(n)
		case err == unix.EINTR:
		case err != nil:
			return err
		default:
			return fmt.Errorf("tcp: splice moved nothing out of a pipe holding %d bytes", l.piped)
		}
	}
	return nil
}

// sendMore writes b to the socket without pushing it out on its own
// (MSG_MORE): a lent slice's header joins the first of its pages.
func sendMore(fd int, b []byte) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_MORE|unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// close closes the pipe; pages still in it are released with it.
func (l *lender) close() {
	if l.made {
		unix.Close(l.r)
		unix.Close(l.w)
		l.made = false
	}
}
