package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/device"
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
	// the reserved slot's payload (inline, or in its data slot).
	tail, headSeen uint32
	reserved       []byte
	reservedInline bool
	isReserved     bool

	// Receive side: slices released, and whether a slot is held.
	head    uint32
	holding bool
	// lent: the slice held is a view of the peer's shared allocation
	// (shared_linux.go), not a slot.
	lent bool

	// Cross-memory attach (cma_linux.go): the peer's pid, whether this
	// side has probed whether it can read the peer's memory, and the last
	// slice this side posted by reference (for Flush).
	pid    int
	probed bool
	// choices: this side's way (blocks or slots) per size class, as it
	// receives (blocks_linux.go).
	choices [2][64]blockChoice // [0] operations that land, [1] those that reduce
	// mapsProbed: whether this side can map the peer's shared
	// allocations has been probed (shared_linux.go); byMap counts the
	// slices posted by reference into them (tests look).
	mapsProbed bool
	byMap      atomic.Int64
	lastRef    uint32
	hasRef     bool
	byRef      atomic.Int64 // slices posted by reference so far (tests look)

	// Split copies (split_linux.go): what this side posted by reference,
	// by slot; noSplit, set once a chunk's write was refused (on the side
	// that wrote it, and on its receiver, told by helpFailed); counts of
	// the chunks the peer wrote for this side (splitBy) and this side for
	// the peer (splitFor); helpGen numbers this side's requests.
	sent              []sentRef
	noSplit           bool
	helpGen           uint32
	busyAfter         bool // transport.SplitCopier: this side's next blocks say refBusy
	splitBy, splitFor atomic.Int64

	closeCtl sync.Once
	sleeps   atomic.Int32 // futex sleeps so far (tests look)

	// mapped is the segment registered with the endpoint's device, on a
	// connection for device operations: slots are handed out as views of
	// it (memory.Mapped). Empty otherwise. Set before the connection is
	// used; unregistered once, at teardown.
	mapped     memory.Buffer
	unregister sync.Once

	// A device connection's slots in device memory (ipc_linux.go): devRx
	// this side's offer, which the peer may write into; devTx the peer's,
	// mapped here (devTxWhole as OpenIPC returned it), into which this
	// side's longer slices go; ipc the device, nil when neither.
	// reservedDev: the reserved slot is in devTx.
	devRx, devTx, devTxWhole memory.Buffer
	ipc                      device.IPCExporter
	freeIPCOnce              sync.Once
	reservedDev              bool
}

var (
	_ transport.Conn           = (*conn)(nil)
	_ transport.DirectSender   = (*conn)(nil)
	_ transport.DirectReceiver = (*conn)(nil)
	_ transport.Flusher        = (*conn)(nil)
	_ transport.PeerCopier     = (*conn)(nil)
	_ transport.SplitCopier    = (*conn)(nil)
)

func newConn(e *Endpoint, peer, ch int, seg *segment, ctl int) *conn {
	return &conn{e: e, peer: peer, ch: ch, seg: seg, ctl: ctl, tx: seg.ring(seg.side, e.g), rx: seg.ring(1-seg.side, e.g), pid: peerPid(ctl)}
}

// wakeAll wakes whoever sleeps on the segment, on either side. Any
// goroutine may call it, before teardown.
func (c *conn) wakeAll() {
	if !c.seg.acquire() {
		return
	}
	for _, r := range []*ring{&c.tx, &c.rx} {
		futexWake(r.head)
		for i := uint32(0); i < r.slots; i++ {
			futexWake(r.seq(i))
		}
	}
	c.seg.release()
}

// buf describes b, bytes of the segment, as the engine sees them: mapped
// memory on a device connection, host memory otherwise.
func (c *conn) buf(b []byte) memory.Buffer {
	if c.mapped.Len() == 0 || len(b) == 0 {
		return memory.HostBuffer(b)
	}
	return c.mapped.View(b)
}

// teardown lets go of the segment and the control socket. A device
// connection's registration goes first: the detached segment may be
// replaced by other pages.
func (c *conn) teardown() {
	c.freeIPCOnce.Do(c.freeIPC)
	if c.mapped.Len() > 0 {
		c.unregister.Do(func() { c.e.o.Device.Unregister(c.mapped) })
	}
	c.seg.detach()
	c.closeCtl.Do(func() { unix.Close(c.ctl) })
}

func (c *conn) Peer() int { return c.peer }

// SlotsFar says the engine writes this connection's slots with streaming
// stores (transport.FarSlots): the peer's core reads them next, and a
// plain store to a line it read from the slot's last use would wait for
// the line to come back (docs/performance.md, "Streaming stores into the
// slots").
func (c *conn) SlotsFar() bool { return !c.e.o.NoStreamSlots }

func (c *conn) Reserve(ctx context.Context, n int) (memory.Buffer, error) {
	if n < 0 || n > c.tx.slotSize || c.isReserved {
		return memory.Buffer{}, fmt.Errorf("shm: reserve %d bytes of a %d-byte slot (reserved already: %v)", n, c.tx.slotSize, c.isReserved)
	}
	if !c.seg.enter(&c.e.down) {
		return memory.Buffer{}, c.fail("send", c.e.closedErr())
	}
	if c.tail-c.headSeen >= c.tx.slots {
		err := c.await(ctx, "send", c.tx.head, c.tx.swait, func() bool {
			c.serveSplit()
			c.headSeen = c.tx.head.Load()
			return c.tail-c.headSeen < c.tx.slots
		})
		if err != nil {
			c.seg.release()
			return memory.Buffer{}, err
		}
	}
	c.isReserved = true
	c.reserved = c.tx.payload(c.tail, n)
	c.reservedInline = n <= inlineMax
	if c.reservedDev = c.devTx.Len() > 0 && !c.reservedInline; c.reservedDev {
		off := c.tx.slotOff(c.tail)
		return c.devTx.Slice(off, off+n), nil
	}
	return c.buf(c.reserved), nil
}

func (c *conn) Post(n int, tag transport.Tag) error {
	if !c.isReserved || n < 0 || n > len(c.reserved) {
		return fmt.Errorf("shm: post of %d bytes without a matching reserve", n)
	}
	if c.reservedDev {
		c.publish(tag, uint32(n)|devFlag) // in the peer's device memory, however short
		return nil
	}
	if n <= inlineMax && !c.reservedInline {
		copy(c.tx.payload(c.tail, n), c.reserved)
	}
	c.publish(tag, uint32(n))
	return nil
}

// publish hands the reserved slot to the receiver with size (and flags)
// in its descriptor, wakes the receiver if it sleeps, and lets go of the
// segment that Reserve acquired.
func (c *conn) publish(tag transport.Tag, size uint32) {
	seq := c.tx.seq(c.tail)
	c.tx.publish(c.tail, tag.Op, tag.Sig, tag.Msg, tag.Slice, size)
	c.tail++
	if c.tx.rwait.Load() != 0 {
		futexWake(seq)
	}
	c.isReserved, c.reserved, c.reservedDev = false, nil, false
	c.seg.release()
}

func (c *conn) Wait(ctx context.Context) (memory.Buffer, transport.Tag, error) {
	if c.holding {
		return memory.Buffer{}, transport.Tag{}, errors.New("shm: wait while holding a slot")
	}
	if !c.seg.enter(&c.e.down) {
		return memory.Buffer{}, transport.Tag{}, c.fail("recv", c.e.closedErr())
	}
	tag, n, byRef, dev, err := c.next(ctx)
	if err != nil {
		c.seg.release()
		return memory.Buffer{}, transport.Tag{}, err
	}
	if dev {
		// In this side's device memory (ipc_linux.go).
		c.holding = true
		off := c.rx.slotOff(c.head)
		return c.devRx.Slice(off, off+n), tag, nil
	}
	if n > c.rx.slotSize {
		c.seg.release()
		return memory.Buffer{}, transport.Tag{}, &transport.PeerError{Peer: c.peer, Op: "recv", Err: fmt.Errorf("protocol error: rank %d posted a %d-byte block where this rank takes slices of at most %d (the two ranks disagree about the step)", c.peer, n, c.rx.slotSize)}
	}
	b := c.rx.payload(c.head, n)
	c.lent = false
	if byRef && c.rx.refKind(c.head) == refShared {
		// Out of one of the peer's shared allocations: the caller reads
		// it where it is (Lender).
		v, err := c.viewShared(c.rx.descOf(c.head), n)
		if err != nil {
			c.seg.release()
			return memory.Buffer{}, transport.Tag{}, err
		}
		c.holding, c.lent = true, true
		return memory.HostBuffer(v), tag, nil
	}
	if byRef {
		// Sent by reference (PostFrom): copied into the slot here, for a
		// caller that reads it from there.
		b = c.rx.slot(c.head)[:n]
		if err := c.fetch(ctx, c.rx.descOf(c.head), b); err != nil {
			c.seg.release()
			return memory.Buffer{}, transport.Tag{}, err
		}
	}
	c.holding = true
	return c.buf(b), tag, nil
}

// next waits until the next incoming slice is posted and returns its tag,
// its size (bounded by the slot's), whether it was sent by reference and
// whether it is in this side's device memory. The caller holds the
// segment.
func (c *conn) next(ctx context.Context) (transport.Tag, int, bool, bool, error) {
	c.probe()
	if !c.rx.filled(c.head) {
		if err := c.await(ctx, "recv", c.rx.seq(c.head), c.rx.rwait, func() bool { return c.rx.filled(c.head) }); err != nil {
			return transport.Tag{}, 0, false, false, err
		}
	}
	op, sig, msg, slice, size := c.rx.getDesc(c.head)
	tag := transport.Tag{Op: op, Sig: sig, Msg: msg, Slice: slice}
	n := int(size &^ (refFlag | devFlag))
	dev := size&devFlag != 0
	var err error
	switch {
	case n > c.rx.slotSize && !(size&refFlag != 0 && c.rx.refKind(c.head) == refCMA && n <= MaxBlockSize):
		// Only a block by reference may be larger than a slot
		// (transport.BlockCopier).
		err = fmt.Errorf("protocol error: rank %d posted a %d-byte slice, slots hold %d", c.peer, n, c.rx.slotSize)
	case dev && (c.devRx.Len() == 0 || size&refFlag != 0):
		err = fmt.Errorf("protocol error: rank %d posted a slice into device memory this rank did not offer", c.peer)
	}
	if err != nil {
		return tag, n, false, false, &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	return tag, n, size&refFlag != 0, dev, nil
}

// advance gives the slot of the slice just taken back to the sender.
func (c *conn) advance() {
	c.head++
	c.rx.head.Store(c.head)
	if c.rx.swait.Load() != 0 {
		futexWake(c.rx.head)
	}
}

func (c *conn) Release() error {
	if !c.holding {
		return errors.New("shm: release without a matching wait")
	}
	c.advance()
	c.holding = false
	c.seg.release()
	return nil
}

// await waits until ready holds. It polls for SpinFor, then sleeps on
// word (what the other side changes when ready may hold) with flag
// raised, so that the other side knows to wake it. While polling it gives
// the CPU away after every failed poll when Options.YieldWhenIdle is set
// (ranks outnumber cores: the rank we wait for may need this core), else
// only every few microseconds. It fails when this endpoint closes, the
// peer aborts, leaves or dies, or ctx ends. While Options.Progress reports
// other transports' sends pending on this channel, it keeps them moving
// and polls instead of sleeping.
func (c *conn) await(ctx context.Context, op string, word, flag *atomic.Uint32, ready func() bool) error {
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
	every := 256 // polls between checks: with PAUSE, about 10 µs
	if c.e.o.YieldWhenIdle {
		every = 16
	}
	for {
		// Poll.
		var start, deep time.Time
		for i := 1; ; i++ {
			if ready() {
				return c.afterWait()
			}
			if c.e.o.YieldWhenIdle {
				yieldCPU()
			} else {
				pause()
			}
			if i%every != 0 {
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
			isDeep := now.Sub(deep) > sleepSlice
			if err := c.check(ctx, isDeep); err != nil {
				return fail(err)
			} else if isDeep {
				deep = now
			}
			if !pending && now.Sub(start) >= c.e.o.SpinFor {
				break
			}
			if !c.e.o.YieldWhenIdle {
				yieldCPU()
			}
		}
		// Sleep.
		for {
			flag.Store(1)
			v := word.Load()
			if ready() {
				flag.Store(0)
				return c.afterWait()
			}
			if err := c.check(ctx, true); err != nil {
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
			c.sleeps.Add(1)
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
