package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// conn is a connection to one peer on one channel: this side's view of
// the pair's segment. Everything but wakeAll and teardown is called by the
// channel's goroutine only.
type conn struct {
	e    *Endpoint
	peer int
	ch   int
	seg  *segment
	ctl  int // control socket: only polled for the peer's hang-up
	tx   ring
	rx   ring

	// Send side: slices posted, the receiver's head as last read, and
	// whether a slot is reserved.
	tail, headSeen uint32
	reserved       bool

	// Receive side: slices released, the sender's tail as last read, and
	// whether a slot is held.
	head, tailSeen uint32
	holding        bool

	closeCtl sync.Once
}

var _ transport.Conn = (*conn)(nil)

func newConn(e *Endpoint, peer, ch int, seg *segment, ctl int) *conn {
	return &conn{e: e, peer: peer, ch: ch, seg: seg, ctl: ctl, tx: seg.ring(seg.side, e.g), rx: seg.ring(1-seg.side, e.g)}
}

// wakeAll wakes whoever sleeps on the segment, on either side. Any
// goroutine may call it, before teardown.
func (c *conn) wakeAll() {
	if !c.seg.acquire() {
		return
	}
	futexWake(c.tx.tail)
	futexWake(c.tx.head)
	futexWake(c.rx.tail)
	futexWake(c.rx.head)
	c.seg.release()
}

// teardown lets go of the segment and the control socket.
func (c *conn) teardown() {
	c.seg.detach()
	c.closeCtl.Do(func() { unix.Close(c.ctl) })
}

func (c *conn) Peer() int { return c.peer }

func (c *conn) Reserve(ctx context.Context, n int) (memory.Buffer, error) {
	if n < 0 || n > c.tx.slotSize || c.reserved {
		return memory.Buffer{}, fmt.Errorf("shm: reserve %d bytes of a %d-byte slot (reserved already: %v)", n, c.tx.slotSize, c.reserved)
	}
	if !c.seg.acquire() || c.e.down.Load() {
		return memory.Buffer{}, c.fail("send", c.e.closedErr())
	}
	if c.tail-c.headSeen >= c.tx.slots {
		err := c.await(ctx, "send", c.tx.head, c.tx.swait, func() bool {
			c.headSeen = c.tx.head.Load()
			return c.tail-c.headSeen < c.tx.slots
		}, c.check)
		if err != nil {
			c.seg.release()
			return memory.Buffer{}, err
		}
	}
	c.reserved = true
	return memory.HostBuffer(c.tx.slot(c.tail)[:n]), nil
}

func (c *conn) Post(n int, tag transport.Tag) error {
	if !c.reserved || n < 0 || n > c.tx.slotSize {
		return fmt.Errorf("shm: post of %d bytes without a matching reserve", n)
	}
	c.tx.putDesc(c.tail, tag.Op, tag.Sig, tag.Msg, tag.Slice, uint32(n))
	c.tail++
	c.tx.tail.Store(c.tail) // publishes the descriptor and the data
	if c.tx.rwait.Load() != 0 {
		futexWake(c.tx.tail)
	}
	c.reserved = false
	c.seg.release()
	return nil
}

func (c *conn) Wait(ctx context.Context) (memory.Buffer, transport.Tag, error) {
	if c.holding {
		return memory.Buffer{}, transport.Tag{}, errors.New("shm: wait while holding a slot")
	}
	if !c.seg.acquire() || c.e.down.Load() {
		return memory.Buffer{}, transport.Tag{}, c.fail("recv", c.e.closedErr())
	}
	if c.head == c.tailSeen {
		c.tailSeen = c.rx.tail.Load()
		if c.head == c.tailSeen {
			err := c.await(ctx, "recv", c.rx.tail, c.rx.rwait, func() bool {
				c.tailSeen = c.rx.tail.Load()
				return c.head != c.tailSeen
			}, c.check)
			if err != nil {
				c.seg.release()
				return memory.Buffer{}, transport.Tag{}, err
			}
		}
	}
	op, sig, msg, slice, size := c.rx.getDesc(c.head)
	if int(size) > c.rx.slotSize || c.tailSeen-c.head > c.rx.slots {
		c.seg.release()
		err := fmt.Errorf("protocol error: rank %d posted a %d-byte slice (slots hold %d) or overran the ring", c.peer, size, c.rx.slotSize)
		return memory.Buffer{}, transport.Tag{}, &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	c.holding = true
	return memory.HostBuffer(c.rx.slot(c.head)[:size]), transport.Tag{Op: op, Sig: sig, Msg: msg, Slice: slice}, nil
}

func (c *conn) Release() error {
	if !c.holding {
		return errors.New("shm: release without a matching wait")
	}
	c.head++
	c.rx.head.Store(c.head)
	if c.rx.swait.Load() != 0 {
		futexWake(c.rx.head)
	}
	c.holding = false
	c.seg.release()
	return nil
}

// await waits until ready holds: it polls for SpinFor, giving the CPU
// away every few polls, then sleeps on word (the counter the other side
// bumps) with flag raised, so that the other side knows to wake it. check
// reports failures: this endpoint closing, the peer aborting, leaving or
// dying, the context ending. While Options.Progress reports other
// transports' sends pending on this channel, it keeps them moving and
// polls instead of sleeping.
func (c *conn) await(ctx context.Context, op string, word, flag *atomic.Uint32, ready func() bool, check func(ctx context.Context, deep bool) error) error {
	fail := func(err error) error {
		if errors.Is(err, transport.ErrPeerClosed) && ready() {
			return c.afterWait() // the peer left, but not before posting this
		}
		var pe *transport.PeerError
		if errors.As(err, &pe) {
			return err // another transport's failure, naming its peer
		}
		return c.fail(op, err)
	}
	progress := c.e.o.Progress
	for {
		// Poll.
		var start, deep time.Time
		for i := 1; ; i++ {
			if ready() {
				return c.afterWait()
			}
			if i%16 != 0 {
				continue
			}
			pending := false
			if progress != nil {
				var err error
				if pending, err = progress(c.ch); err != nil {
					return fail(err)
				}
			}
			now := time.Now()
			if start.IsZero() {
				start, deep = now, now
			}
			if err := check(ctx, now.Sub(deep) > sleepSlice); err != nil {
				return fail(err)
			} else if now.Sub(deep) > sleepSlice {
				deep = now
			}
			if !pending && now.Sub(start) >= c.e.o.SpinFor {
				break
			}
			yieldCPU()
		}
		// Sleep.
		for {
			flag.Store(1)
			v := word.Load()
			if ready() {
				flag.Store(0)
				return c.afterWait()
			}
			if err := check(ctx, true); err != nil {
				flag.Store(0)
				return fail(err)
			}
			if progress != nil {
				pending, err := progress(c.ch)
				if err != nil {
					flag.Store(0)
					return fail(err)
				}
				if pending {
					flag.Store(0)
					break
				}
			}
			futexWait(word, v, sleepSlice)
		}
	}
}

// afterWait catches a wait that ended because Close swapped the segment
// for zero pages under it.
func (c *conn) afterWait() error {
	if c.e.down.Load() {
		return c.e.closedErr()
	}
	return nil
}

// check reports why a wait cannot succeed, if it cannot. With deep set it
// also looks at the control socket, a system call.
func (c *conn) check(ctx context.Context, deep bool) error {
	if c.e.down.Load() {
		return c.e.closedErr()
	}
	peer := 1 - c.seg.side
	if reason, ok := c.seg.abortReason(peer); ok {
		return &transport.PeerAbortedError{Peer: c.peer, Cause: errors.New(reason)}
	}
	if c.seg.gone(peer).Load() != 0 {
		return transport.ErrPeerClosed
	}
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if deep && hungUp(c.ctl) {
		// The kernel closed the peer's end: it exited. It may have left a
		// reason on its way out.
		if reason, ok := c.seg.abortReason(peer); ok {
			return &transport.PeerAbortedError{Peer: c.peer, Cause: errors.New(reason)}
		}
		if c.seg.gone(peer).Load() != 0 {
			return transport.ErrPeerClosed
		}
		return fmt.Errorf("connection lost (did rank %d's process exit or abort?)", c.peer)
	}
	return nil
}

// fail wraps err as a failure of the link to the peer; errors that say
// this endpoint was closed stay as they are.
func (c *conn) fail(op string, err error) error {
	if errors.Is(err, transport.ErrClosed) {
		return err
	}
	return &transport.PeerError{Peer: c.peer, Op: op, Err: err}
}
