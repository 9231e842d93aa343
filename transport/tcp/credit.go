//go:build unix

package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/wire"
)

// Credits: the receiver's pace, sent back to the sender.
//
// A sender that writes whatever the kernel takes runs megabytes ahead of
// its receiver (loopback's socket buffers grow to 4 MiB and more), and
// the receiver then reads each socket while the sender is still
// appending to it: the kernel queues the arriving segments on the
// receiver's backlog, and the receiver, the slower side of a one-way
// stream, processes them itself. A 1 MiB stream over 4 loopback sockets
// moved 285-400 µs a message so; acknowledged every 256 KiB slice with
// at most 8 slices unread, 166-205 (docs/performance.md, "TCP: a window
// of credits"). NCCL's network transports are paced the same way: a
// sender writes into a receiver's buffer only once the receiver has
// posted it (the CTS FIFO of net_ib; the verbs transport here clears
// messages likewise).
//
// Only large slices (over creditMin bytes) are counted: small ones cost
// the kernel little however far ahead they are, and a credit for them
// would add a system call to the latency of small operations. Both ends
// tell a counted slice by the size in its header. The k-th counted slice
// (from 1) goes out once k ≤ got + window, got being the peer's latest
// credit; the receiver sends a credit once it has read every = window -
// Slots/2 more counted slices since its last one, by the sender's window
// and slots, which each end tells the other when the connection is made
// (ranks may differ in both). A credit lags what was read by at
// most every-1 slices, so a link holds at least window-every+1 =
// Slots/2 + 1 counted slices its receiver has not read: what the engine's
// schedules need (algorithms.MinPieces), so credits cannot deadlock a
// schedule that TCP's own buffering carries.
//
// Credits travel on a control socket of their own, never behind data: a
// sender waiting for credit might otherwise have to read past slices its
// schedule does not want yet. Each direction of the control socket
// carries its writer's window first (a wire.WindowOp frame, see hello),
// then credit frames (wire.CreditHeader) and nothing else, in TLS
// records where the connection uses TLS. Its failures are not the connection's: a peer
// that closed gracefully needs no more credit, and one that failed says
// so on the data sockets. A sender waiting for credit on a closed
// control socket fails as a send to a lost peer.

// creditMin is the size above which a slice counts against the window.
const creditMin = readBufSize

// credits is a connection's pacing state; only the channel's goroutine
// touches it.
type credits struct {
	ctl    *sock  // the control socket; nil without credits
	window uint64 // counted slices the sender may have unread
	every  uint64 // counted slices read between credits, by the peer's window (0: not known yet, every slice)

	sent  uint64 // counted slices queued to send (the k of the last)
	got   uint64 // the peer's latest credit
	err   error  // the control socket failed (sticky)
	recvd uint64 // counted slices read from the peer
	told  uint64 // the credit last queued for the peer
	lent  uint64 // the last counted slice lent (lend_linux.go): Flush waits for its credit
}

// hello tells the peer this end's window and slots, on the control
// socket l before it leaves blocking mode: the peer credits every
// window - Slots/2 counted slices it reads from this end, so that this
// end keeps the room its schedules need whatever the peer's own settings.
// The peer reads it with its first credits (readCredits); until then it
// credits every slice, which is always safe. Reading it here would make
// Connect wait for the peer's own Connect, and a ring of ranks each
// connecting to the next would wait in a circle.
func (e *Endpoint) hello(peer int, l link) error {
	l.c.SetWriteDeadline(time.Now().Add(setupTimeout))
	defer l.c.SetWriteDeadline(time.Time{})
	h := wire.SliceHeader{Op: wire.WindowOp, Msg: uint32(e.window), Slice: uint32(e.o.Slots)}
	b := h.Append(nil)
	var err error
	if l.tls != nil {
		_, err = sessionRW{l.c, l.tls}.Write(b)
	} else {
		_, err = l.c.Write(b)
	}
	if err != nil {
		return fmt.Errorf("telling rank %d this rank's credit window: %w", peer, err)
	}
	return nil
}

// windowFor returns the window for o, 0 without credits.
func windowFor(o Options) (int, error) {
	if o.Window < 0 {
		return 0, nil
	}
	w := o.Window
	if w == 0 {
		w = o.Slots
	}
	if need := minWindow(o.Slots); w < need {
		return 0, fmt.Errorf("tcp: a window of %d slices is less than the %d a link of %d slots must hold", w, need, o.Slots)
	}
	return w, nil
}

// lends reports whether this endpoint lends the pages of large slices
// (Options.Lend, lend_linux.go): where the platform can, without TLS
// (records are sealed into a buffer anyway), and with credits, which
// tell the sender when its pages are free again.
func (e *Endpoint) lends() bool {
	return lendable && e.o.Lend != LendOff && e.o.TLS == nil && e.window > 0
}

// minWindow is the least window for a sender with the given slots: the
// Slots/2 + 1 counted slices of room its schedules need of a link. Its
// receiver credits every window - minWindow + 1 slices, so that a credit's
// lag never leaves less.
func minWindow(slots int) int { return slots/2 + 1 }

// countable reports whether a slice of n bytes counts against the window;
// both ends tell by the size in its header.
func (c *conn) countable(n int) bool { return c.cr.ctl != nil && n > creditMin }

// counted numbers a slice of n bytes to send: its k, or 0 if it is not
// counted.
func (c *conn) counted(n int) uint64 {
	if !c.countable(n) {
		return 0
	}
	c.cr.sent++
	return c.cr.sent
}

// room reports whether counted slice k may be written now. It reads the
// peer's credits once half the window is used beyond the last credit
// known, so that they do not pile up unread on the control socket; a
// control socket that failed is an error only for a slice that waits on
// it.
func (c *conn) room(k uint64) (bool, error) {
	if k > c.cr.got+c.cr.window/2 && c.cr.err == nil {
		c.cr.err = c.readCredits()
	}
	if k <= c.cr.got+c.cr.window {
		return true, nil
	}
	return false, c.cr.err
}

// readCredits reads every credit frame the control socket holds, without
// blocking.
func (c *conn) readCredits() error {
	s := c.cr.ctl
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if s.rbuf == nil {
		s.rbuf = make([]byte, 4096)
	}
	const hl = wire.SliceHeaderLen
	for {
		n, err := s.readNB(s.rbuf[s.w:])
		switch {
		case n > 0:
			s.w += n
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return err
		default:
			return io.EOF
		}
		for s.w-s.r >= hl {
			h, _, _ := wire.ParseSliceHeader(s.rbuf[s.r:])
			if h.Op == wire.WindowOp && c.cr.every == 0 {
				w, slots := int(h.Msg), int(h.Slice)
				if h.Size != 0 || slots < 2 || w < minWindow(slots) {
					return fmt.Errorf("%w: rank %d announced a window of %d slices for %d slots", errBadCredit, c.peer, w, slots)
				}
				c.cr.every = uint64(w - minWindow(slots) + 1)
				s.r += hl
				continue
			}
			switch {
			case h.Op != wire.CreditOp || h.Size != 0:
				return fmt.Errorf("%w: rank %d sent a frame that is not a credit (op %#x, %d bytes)", errBadCredit, c.peer, h.Op, h.Size)
			case h.Credit() < c.cr.got || h.Credit() > c.cr.sent:
				return fmt.Errorf("%w: rank %d credited %d slices, after %d, of %d sent", errBadCredit, c.peer, h.Credit(), c.cr.got, c.cr.sent)
			}
			c.cr.got = h.Credit()
			s.r += hl
		}
		s.w = copy(s.rbuf, s.rbuf[s.r:s.w])
		s.r = 0
	}
}

// errBadCredit is a control socket that carried something other than
// credits the peer could give.
var errBadCredit = errors.New("protocol error on the control socket")

// read notes that a slice of n bytes was read from the peer and queues a
// credit when every counted slices were read since the last, or at once
// for a slice whose pages the peer lent (wire.SliceLent): it waits for
// that credit to reuse them.
func (c *conn) read(n int, lent bool) {
	c.ob.oneWay = 0 // the channel receives: not a one-way stream (gather.go)
	if !c.countable(n) {
		return
	}
	c.cr.recvd++
	if c.cr.every == 0 && c.cr.err == nil {
		// The peer's window comes first on the control socket, written
		// before any of its data, so it is almost always there by now;
		// until it has been read, every counted slice is credited.
		c.cr.err = c.readCredits()
	}
	if c.cr.recvd-c.cr.told < max(c.cr.every, 1) && !lent {
		return
	}
	c.cr.told = c.cr.recvd
	j := job{slot: -1}
	h := wire.CreditHeader(c.cr.told)
	h.Put(j.hdr[:])
	if c.cr.ctl.push(j) != nil {
		// Not the connection's failure (see above), but no credit goes
		// out any more: the peer, should it wait for one, reads the end
		// of the socket and fails rather than waiting.
		c.cr.ctl.shutdown()
	}
}

// awaitLent waits for the credit of the last slice lent.
func (c *conn) awaitLent(ctx context.Context) error {
	if c.cr.got >= c.cr.lent {
		return nil
	}
	try := func() (int, bool, error) {
		if c.cr.err == nil {
			c.cr.err = c.readCredits()
		}
		if c.cr.got >= c.cr.lent {
			return 0, true, nil
		}
		if c.cr.err != nil {
			return 0, true, c.cr.err
		}
		return 0, false, nil
	}
	if _, err := c.ob.wait(ctx, c.cr.ctl.fd, unix.POLLIN, c.e.o, try); err != nil {
		return c.sendFail(ctx, err)
	}
	return nil
}
