//go:build unix

package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// sock is one TCP socket of a connection.
//
// Once set up, a socket leaves Go's netpoller: the connection's file
// descriptor is duplicated and the net.Conn closed, which removes it from
// the runtime's epoll set. Otherwise every slice that arrives would wake
// whichever runtime thread sits in epoll_wait for the process's other
// network waiters (our listener, the program's own servers), only for it
// to find nobody waiting: on a 2-vCPU machine that thread preempts the
// rank being waited for (docs/performance.md). Waiting is done here
// instead: polling while spinning, poll(2) with a short timeout when
// parked.
//
// The send side has no goroutine of its own. Slices wait in the socket's
// queue and are written, without blocking, by whichever call the
// channel's goroutine makes next (Post, Reserve, Wait, Flush): like an
// MPI progress engine, the rank moves its outgoing data while it waits for
// incoming data, and never hands a slice to another thread.
//
// With TLS, a slice is sealed into records when it reaches the head of
// the queue, so records go out in the order they were numbered, and the
// read side opens records into the read buffer or the caller's memory.
type sock struct {
	c   *conn
	fd  int
	tls *tlsrec.Session // nil without TLS

	users  atomic.Int32 // calls using fd; release waits for none before closing it
	closed atomic.Bool  // set once; fd is then shut down

	// Receive side, driven by the channel's goroutine.
	rbuf   []byte
	r, w   int  // unread bytes are rbuf[r:w]
	broken bool // a read failed mid-slice: the stream is no longer framed

	// Send side, driven by the channel's goroutine; wmu also lets Close
	// write an abort notice between slices.
	wmu   sync.Mutex // guards queue, qbuf, err and writes to fd
	queue []job
	// qbuf is the array queue was last allocated in, from its start:
	// an emptied queue starts over in it (every written job is zeroed,
	// so it keeps no slice alive), where dropping it cost an allocation
	// per message.
	qbuf   []job
	err    error       // sticky write error (setErr)
	failed atomic.Bool // err is set: conn.flushed reads it without wmu
	listed bool        // in the outbox's pending list (channel goroutine only)
	// creditWait: the slice at the head of the queue waits for the
	// peer's credit (channel goroutine only).
	creditWait bool
	// quiet marks the control socket: its failures are not the
	// connection's (credit.go).
	quiet  bool
	sealed []byte // TLS: the records of the slice at the head of the queue, kept for reuse
	lp     lender // the pipe that lent slices go through (lend_linux.go), under wmu
	// Gathered small slices (gather.go), under wmu: their headers and
	// payloads, and how many. Only while the queue is empty.
	gathered  []byte
	ngathered int
	// gatherListed: in the outbox's gather list (under its mutex).
	gatherListed bool
}

// job is a slice waiting to be written: its header, its payload (a
// staging slot or the caller's memory) and how much of each is out.
type job struct {
	hdr        [wire.SliceHeaderLen]byte
	data       []byte
	hoff, doff int
	slot       int    // staging slot to free when written, -1 for caller memory
	credit     uint64 // its number among the connection's counted slices (credit.go), 0 if not counted
	sealed     bool   // TLS: data holds the slice's records, hdr is in them
	lend       bool   // data goes out from its own pages (lend_linux.go)
	// held: a slice that may be lent waits at the tail of its queue
	// until the connection knows whether it is its operation's last
	// (conn.letGo).
	held bool
	// gathered: the bytes of slices a socket gathered (gather.go), headers
	// in them; its array goes back to the socket once written.
	gathered bool
}

// pollSlice bounds one parked poll(2), so that a parked call notices its
// context ending within this long.
const pollSlice = 5 * time.Millisecond

// newSock takes over l's socket.
func newSock(c *conn, l link) (*sock, error) {
	nc := l.c
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("tcp: %T has no file descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(f uintptr) { fd, derr = unix.Dup(int(f)) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	// The duplicate shares the open file description; closing the original
	// deregisters it from the netpoller.
	nc.Close()
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &sock{c: c, fd: fd, tls: l.tls}, nil
}

// notifyAbort writes an abort notice carrying reason, if the socket is at
// a slice boundary and the kernel takes it at once; best effort, since the
// connection is being torn down anyway. Any goroutine may call it.
func (s *sock) notifyAbort(reason string) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if len(s.queue) > 0 && (s.queue[0].doff > 0 || s.queue[0].hoff > 0 && !s.queue[0].gathered) {
		return // mid-slice: a notice would garble the stream
	}
	s.setErr(errAborted) // nothing more goes out after the notice
	if len(reason) > wire.MaxString {
		reason = reason[:wire.MaxString]
	}
	s.writeNoticeLocked(wire.AbortOp, reason)
}

// writeNoticeLocked writes a notice (a slice header with op, and payload)
// if the kernel takes it at once. The caller holds wmu, with the socket at
// a slice boundary. A notice is the last thing a socket sends, so with TLS
// a close_notify follows it (RFC 8446 §6.1): without one the peer cannot
// tell this end's close from a cut connection (tlsrec.ErrTruncated). Both
// go in one non-blocking write, so neither waits on a peer that reads
// nothing more; a short write loses their tail, as it would a notice's
// alone.
func (s *sock) writeNoticeLocked(op uint64, payload string) {
	h := wire.SliceHeader{Op: op, Size: uint32(len(payload))}
	b := append(h.Append(nil), payload...)
	if s.tls != nil {
		b = s.tls.SealCloseNotify(s.tls.Seal(nil, b, nil))
	}
	if s.enter() == nil {
		unix.Write(s.fd, b)
		s.exit()
	}
}

// errAborted stops a socket's sends once an abort notice went out.
var errAborted = errors.New("connection aborted")

// scanNotice looks, without blocking, through what the peer has sent on
// this socket for a notice it left on its way out: an abort, returned as
// a *transport.PeerAbortedError with its reason, or a graceful close,
// returned as transport.ErrPeerClosed; nil if there is none. When a send
// fails because the peer hung up, the notice says why. It skips data
// slices (the receive side is at a slice boundary whenever the send side
// is in use, both being driven by the channel's goroutine), leaves the
// notice itself unread, and gives up after 64 MiB.
func (s *sock) scanNotice() error {
	if s.broken || s.enter() != nil {
		return nil
	}
	defer s.exit()
	if s.rbuf == nil {
		s.rbuf = make([]byte, readBufSize)
	}
	more := func() bool { // read what is there into rbuf
		if s.r > 0 {
			s.w = copy(s.rbuf, s.rbuf[s.r:s.w])
			s.r = 0
		}
		if s.w == len(s.rbuf) {
			return false
		}
		n, _ := s.readNB(s.rbuf[s.w:])
		if n <= 0 {
			return false
		}
		s.w += n
		return true
	}
	for budget := 64 << 20; budget > 0; {
		for s.w-s.r < wire.SliceHeaderLen {
			if !more() {
				return nil
			}
		}
		h, _, _ := wire.ParseSliceHeader(s.rbuf[s.r:])
		if h.Op == wire.CloseOp && h.Size == 0 {
			return transport.ErrPeerClosed
		}
		if h.Op == wire.AbortOp && int(h.Size) <= wire.MaxString {
			for s.w-s.r < wire.SliceHeaderLen+int(h.Size) {
				if !more() {
					return nil
				}
			}
			reason := string(s.rbuf[s.r+wire.SliceHeaderLen : s.r+wire.SliceHeaderLen+int(h.Size)])
			return &transport.PeerAbortedError{Peer: s.c.peer, Cause: errors.New(reason)}
		}
		skip := wire.SliceHeaderLen + int(h.Size)
		budget -= skip
		for skip > 0 {
			if s.w == s.r && !more() {
				return nil
			}
			n := min(skip, s.w-s.r)
			s.r += n
			skip -= n
		}
	}
	return nil
}

// shutdown wakes every call blocked on the socket (reads see end of file,
// writes fail) without closing the descriptor, which may still be in use.
// Any goroutine may call it.
func (s *sock) shutdown() {
	if s.closed.CompareAndSwap(false, true) {
		unix.Shutdown(s.fd, unix.SHUT_RDWR)
	}
}

// release closes the descriptor once no call uses it.
func (s *sock) release() {
	s.shutdown()
	for s.users.Load() != 0 {
		time.Sleep(100 * time.Microsecond)
	}
	unix.Close(s.fd)
	s.wmu.Lock()
	s.lp.close()
	s.lp.off = true
	s.wmu.Unlock()
}

// enter and exit bracket every use of the descriptor.
func (s *sock) enter() error {
	s.users.Add(1)
	if s.closed.Load() {
		s.users.Add(-1)
		return net.ErrClosed
	}
	return nil
}

func (s *sock) exit() { s.users.Add(-1) }

// push queues a slice and writes what the kernel takes at once.
func (s *sock) push(j job) error {
	s.wmu.Lock()
	if s.err != nil {
		err := s.err
		s.wmu.Unlock()
		return err
	}
	s.queueGatheredLocked() // slices gathered on this socket go first (gather.go)
	s.enqueueLocked(j)
	s.pumpLocked()
	more, err := len(s.queue) > 0, s.err
	s.wmu.Unlock()
	if more {
		s.c.ob.list(s)
	}
	return err
}

// enqueueLocked appends j to the queue; the caller holds wmu.
func (s *sock) enqueueLocked(j job) {
	full := len(s.queue) == cap(s.queue)
	s.queue = append(s.queue, j)
	if full {
		s.qbuf = s.queue[:0] // a new array, which append fills from its start
	}
}

// setErr makes err the socket's sticky write error; the caller holds
// wmu.
func (s *sock) setErr(err error) {
	s.err = err
	s.failed.Store(true)
}

// pending reports how many slices wait and the sticky write error.
func (s *sock) pending() (int, error) {
	s.wmu.Lock()
	n, err := len(s.queue), s.err
	s.wmu.Unlock()
	return n, err
}

// pump writes queued slices, without blocking, until the kernel takes no
// more; finished staging slots go back to the connection.
func (s *sock) pump() {
	s.wmu.Lock()
	s.pumpLocked()
	s.wmu.Unlock()
}

func (s *sock) pumpLocked() {
	if s.err != nil || len(s.queue) == 0 {
		return
	}
	if err := s.enter(); err != nil {
		s.setErr(err)
		return
	}
	defer s.exit()
	s.creditWait = false
	for len(s.queue) > 0 {
		j := &s.queue[0]
		if j.held {
			return
		}
		if j.credit > 0 && j.hoff == 0 && j.doff == 0 {
			ok, err := s.c.room(j.credit)
			if err != nil {
				s.setErr(err)
				return
			}
			if !ok {
				s.creditWait = true
				return
			}
			j.credit = 0
		}
		if s.tls != nil && !j.sealed {
			s.seal(j)
		}
		if j.lend {
			done, err := s.lend(j)
			switch {
			case err != nil:
				s.setErr(err)
				return
			case done:
				s.popLocked()
				continue
			case j.lend:
				return // the socket takes no more for now
			}
			// Not lent after all: the rest is copied below.
		}
		if !s.writeJobLocked(j) {
			return
		}
		s.popLocked()
	}
	s.queue = s.qbuf[:0]
}

// writeJobLocked writes j, the job at the head of the queue, until it is
// all out (true), the kernel takes no more for now, or a write fails
// (false, with the socket's error set). The caller holds wmu, inside
// enter and exit.
func (s *sock) writeJobLocked(j *job) bool {
	for {
		n, err := sysWritev(s.fd, j.hdr[j.hoff:], j.data[j.doff:])
		if n > 0 {
			h := min(n, len(j.hdr)-j.hoff)
			j.hoff += h
			j.doff += n - h
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false
		case err != nil:
			s.setErr(err)
			return false
		}
		if j.hoff == len(j.hdr) && j.doff == len(j.data) {
			return true
		}
	}
}

// popLocked takes the written job at the head of the queue off it, handing
// back what it held: its staging slot, its gather buffer (gather.go), its
// TLS records' buffer. The caller holds wmu.
func (s *sock) popLocked() {
	j := &s.queue[0]
	if j.slot >= 0 {
		s.c.free = append(s.c.free, j.slot)
	}
	if j.gathered && s.gathered == nil {
		s.gathered = j.data[:0]
	}
	if j.sealed {
		s.sealed = j.data[:0]
	}
	*j = job{}
	s.queue = s.queue[1:]
}

// lendReady reports whether the socket lends (its pipe is made, on
// first use). Called by the channel's goroutine before it queues a job.
func (s *sock) lendReady() bool {
	if s.tls != nil {
		return false
	}
	if s.enter() != nil {
		return false
	}
	s.wmu.Lock()
	ok := s.lp.ready(s.fd)
	s.wmu.Unlock()
	s.exit()
	return ok
}

// lend writes the job at the head of the queue by lending its pages
// (lend_linux.go): its header with MSG_MORE, then its data through the
// socket's pipe. It reports whether the job is all in the socket; false
// with no error when the socket takes no more for now, or when the pipe
// refused the caller's memory: the job is then no longer lent, and the
// rest of it is copied.
func (s *sock) lend(j *job) (bool, error) {
	for {
		if s.lp.piped > 0 {
			// Bytes already lent go first, whichever job they were.
			if err := s.lp.drain(s.fd); err != nil {
				if err == unix.EAGAIN {
					return false, nil
				}
				return false, err
			}
		}
		if j.hoff < len(j.hdr) {
			n, err := sendMore(s.fd, j.hdr[j.hoff:])
			switch {
			case n > 0:
				j.hoff += n
				continue
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false, nil
			}
			return false, err
		}
		if j.doff == len(j.data) {
			return true, nil
		}
		n, err := s.lp.fill(j.data[j.doff:])
		if err != nil {
			// Memory the pipe will not take (or no pipe): copy the rest.
			// Flush still waits for its credit, which comes all the same.
			j.lend = false
			s.lp.close()
			s.lp.off = true
			return false, nil
		}
		j.doff += n
	}
}

// seal turns the job at the head of the queue into TLS records, in the
// socket's reusable record buffer; its staging slot is free again at once.
func (s *sock) seal(j *job) {
	j.data = s.tls.Seal(s.sealed[:0], j.hdr[:], j.data)
	s.sealed = nil
	j.hoff, j.sealed = len(j.hdr), true
	if j.slot >= 0 {
		s.c.free = append(s.c.free, j.slot)
		j.slot = -1
	}
}

// readNB reads what the socket has without blocking, with read(2)'s
// conventions: (0, nil) is the end of the stream, EAGAIN that nothing
// is there yet. With TLS it returns opened application data, and the end
// of the stream is the peer's close_notify; a socket that ends without
// one fails with tlsrec.ErrTruncated.
func (s *sock) readNB(b []byte) (int, error) {
	if s.tls == nil {
		return sysRead(s.fd, b)
	}
	n, err := s.tls.Read(b, func(p []byte) (int, error) {
		for {
			m, err := sysRead(s.fd, p)
			switch {
			case m > 0:
				return m, nil
			case err == unix.EINTR:
				continue
			case err == nil:
				return 0, io.EOF
			}
			return 0, err
		}
	})
	if err == io.EOF {
		return 0, nil
	}
	return n, err
}

// readBufSize is the size of a socket's read buffer: small slices (and
// every header) come in with one read, large payloads bypass it.
const readBufSize = 64 << 10

// next returns the next n bytes from the socket: a view of the read
// buffer when they fit (valid until the next call), else dst filled.
func (s *sock) next(ctx context.Context, n int, dst []byte) ([]byte, error) {
	if n <= readBufSize && dst == nil {
		if err := s.fill(ctx, n); err != nil {
			return nil, err
		}
		b := s.rbuf[s.r : s.r+n]
		s.r += n
		return b, nil
	}
	got := copy(dst[:n], s.rbuf[s.r:s.w])
	s.r += got
	for got < n {
		m, err := s.readSome(ctx, dst[got:n])
		got += m
		if err != nil {
			s.broken = true
			return nil, err
		}
	}
	return dst[:n], nil
}

// fill makes at least n bytes available in the read buffer, reading as
// much as the socket has (so a header and a small payload usually arrive
// in one system call).
func (s *sock) fill(ctx context.Context, n int) error {
	if s.w-s.r >= n {
		return nil
	}
	if s.rbuf == nil {
		s.rbuf = make([]byte, readBufSize)
	}
	if s.r > 0 { // compact; views handed out earlier are released by now
		s.w = copy(s.rbuf, s.rbuf[s.r:s.w])
		s.r = 0
	}
	for s.w < n {
		m, err := s.readSome(ctx, s.rbuf[s.w:])
		s.w += m
		if err != nil {
			if s.w-s.r > 0 && n > wire.SliceHeaderLen {
				s.broken = true // part of a payload is gone
			}
			return err
		}
	}
	return nil
}

// spillMin is the smallest payload that headerSpill reads straight into
// the caller's memory: below it, the copy out of the read buffer costs
// less than giving up reading several slices in one system call.
const spillMin = 4 << 10

// headerSpill reads the next slice's header into the read buffer and, in
// the same system calls, the start of its payload straight into dst,
// which is where the caller wants a payload of exactly len(dst) bytes: it
// returns how many payload bytes landed there. Through the read buffer,
// the first 64 KiB of every large slice were copied twice (read(2) into
// the buffer, then out of it). A header that is not for len(dst) bytes
// (an abort or close notice, a size mismatch) gets what spilled into dst
// back into the read buffer after it, so that header() reads the stream
// as if nothing had spilled; should that not fit, the stream is broken
// and the call fails (the operation fails on a mismatch anyway). It reads
// nothing when the header, or part of it, is buffered already, or with
// TLS (records are opened into the read buffer).
func (s *sock) headerSpill(ctx context.Context, dst []byte) (int, error) {
	if s.tls != nil || len(dst) < spillMin || s.w > s.r {
		return 0, nil
	}
	if s.rbuf == nil {
		s.rbuf = make([]byte, readBufSize)
	}
	s.r, s.w = 0, 0
	const hl = wire.SliceHeaderLen
	got := 0
	for s.w < hl {
		m, err := s.readvSome(ctx, s.rbuf[s.w:hl], dst[got:])
		if m > 0 {
			h := min(m, hl-s.w)
			s.w += h
			got += m - h
		}
		if err != nil {
			if got > 0 || s.w > 0 {
				s.broken = true // part of a frame is gone
			}
			return 0, err
		}
	}
	if h, _, _ := wire.ParseSliceHeader(s.rbuf[:hl]); int(h.Size) == len(dst) && h.Op != wire.AbortOp && h.Op != wire.CloseOp {
		return got, nil
	}
	if got > len(s.rbuf)-s.w {
		s.broken = true
		return 0, fmt.Errorf("tcp: a %d-byte slice from rank %d where %d bytes were wanted: %w", got, s.c.peer, len(dst), transport.ErrSizeMismatch)
	}
	s.w += copy(s.rbuf[s.w:], dst[:got])
	return 0, nil
}

// readvSome is readSome into a then b, with readv(2) (no TLS).
func (s *sock) readvSome(ctx context.Context, a, b []byte) (int, error) {
	return s.readWith(ctx, func() (int, error) { return sysReadv(s.fd, a, b) })
}

// readSome reads at least one byte into b. While it waits it keeps the
// channel's outgoing slices moving; it polls for the endpoint's SpinFor
// (giving the CPU away now and then), then parks in poll(2) until data
// comes, the connection fails or ctx ends.
func (s *sock) readSome(ctx context.Context, b []byte) (int, error) {
	return s.readWith(ctx, func() (int, error) { return s.readNB(b) })
}

// readWith is readSome's loop around rd, a non-blocking read with
// read(2)'s conventions.
func (s *sock) readWith(ctx context.Context, rd func() (int, error)) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	return s.c.ob.wait(ctx, s.fd, unix.POLLIN, s.c.e.o, func() (int, bool, error) {
		m, err := rd()
		switch {
		case m > 0:
			return m, true, nil
		case err == unix.EINTR || err == unix.EAGAIN:
		case err != nil:
			return 0, true, err
		default:
			return 0, true, io.EOF // the peer closed
		}
		if s.closed.Load() {
			return 0, true, net.ErrClosed
		}
		if err := s.c.ob.firstErr(); err != nil {
			return 0, true, err
		}
		return 0, false, nil
	})
}

// outbox holds the sockets of one channel that have slices waiting to be
// written. Only the channel's goroutine touches it.
type outbox struct {
	pending []*sock
	err     error // the first write error, naming its peer
	// gather lists the sockets with gathered slices (gather.go); its
	// timer's goroutine touches it too.
	gather gatherList
	// oneWay counts the small slices the channel sent since it last
	// received a slice or sent a large one, lastSmall is when it sent the
	// last (clock.Now; gather.go).
	oneWay    int
	lastSmall int64
}

// progress writes what it can of every pending socket's queue, and what
// the channel's sockets have gathered.
func (ob *outbox) progress() {
	if ob.gather.n.Load() > 0 {
		ob.flushGathering()
	}
	kept := ob.pending[:0]
	for _, s := range ob.pending {
		if s.c.held == s {
			// Waiting, with a slice held back: it goes now, lent.
			s.c.letGo(true)
		}
		s.pump()
		n, err := s.pending()
		if err != nil && s.quiet {
			s.shutdown() // no more credits: see conn.read
		} else if err != nil && ob.err == nil {
			ob.err = s.c.peerErr("send", err)
		}
		if n > 0 && err == nil {
			kept = append(kept, s)
		} else {
			s.listed = false
		}
	}
	for i := len(kept); i < len(ob.pending); i++ {
		ob.pending[i] = nil
	}
	ob.pending = kept
}

// list puts s on the pending list, once.
func (ob *outbox) list(s *sock) {
	if !s.listed {
		ob.pending = append(ob.pending, s)
		s.listed = true
	}
}

// firstErr returns a write error the channel has met: a dead peer must
// fail a rank that waits on another peer too, or it would wait forever
// for data that depends on what it cannot send.
func (ob *outbox) firstErr() error { return ob.err }

// wait calls try until it reports done, moving the channel's outgoing
// slices in between: first polling without sleeping for o.SpinFor, then
// parked in poll(2) on fd (for events) and on the pending sockets (for
// writability), a pollSlice at a time so that ctx is honoured.
func (ob *outbox) wait(ctx context.Context, fd int, events int16, o Options, try func() (int, bool, error)) (int, error) {
	if m, done, err := try(); done {
		return m, err
	}
	// fds[0] is the socket waited on, if any (fd < 0: only the pending
	// sockets, as when waiting for a staging slot to come back).
	primary := 0
	fds := make([]unix.PollFd, 0, 1+len(ob.pending))
	if fd >= 0 {
		primary = 1
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: events})
	}
	if o.SpinFor > 0 {
		// Poll with a zero timeout rather than retrying the call: tcp_poll
		// reads the socket's state without its lock, where each failed
		// read would take the lock the sender's softirq needs to deliver
		// the very data we wait for.
		var deadline time.Time
		for i := 0; ; i++ {
			ob.progress()
			if n, _ := sysPoll0(fds[:primary]); n > 0 || primary == 0 {
				if m, done, err := try(); done {
					return m, err
				}
			}
			if i&15 == 15 {
				now := time.Now()
				if deadline.IsZero() {
					deadline = now.Add(o.SpinFor)
				} else if now.After(deadline) {
					break
				}
			}
			// Give the CPU away now and then: to a rank sharing the core,
			// and to the kernel's own network work (veth and other
			// virtual devices deliver in softirq threads), which a
			// polling rank otherwise starves; docs/performance.md
			// measured 0.79 GB/s without this over a veth, 1.50 with.
			// With more ranks than cores, at every turn, as Open MPI's
			// mpi_yield_when_idle (docs/performance.md, "Yielding at
			// every turn": 4 ranks on 2 cores, 8-32 B all-reduces,
			// all-gathers and reduce-scatters in 0.47-0.73 of the time).
			if o.YieldWhenIdle || i&15 == 15 {
				yieldCPU()
			}
		}
	}
	for {
		ob.progress()
		if m, done, err := try(); done {
			return m, err
		}
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		fds = fds[:primary]
		for _, s := range ob.pending {
			if s.creditWait {
				// Waiting for the peer's credit, not for the kernel.
				fds = append(fds, unix.PollFd{Fd: int32(s.c.cr.ctl.fd), Events: unix.POLLIN})
				continue
			}
			fds = append(fds, unix.PollFd{Fd: int32(s.fd), Events: unix.POLLOUT})
		}
		if _, err := unix.Poll(fds, int(pollSlice/time.Millisecond)); err != nil && err != unix.EINTR {
			return 0, err
		}
	}
}

// errClosedOrEOF reports errors that mean the socket is gone. A TLS
// stream that ended without close_notify is one: the peer hung up or
// died (its notice, if it left one, says which), or the connection was
// cut; its close_notify reads as the end of the stream, io.EOF.
func errClosedOrEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) ||
		errors.Is(err, tlsrec.ErrTruncated)
}
