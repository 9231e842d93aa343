// Package mem is an in-process transport: the ranks of a communicator are
// goroutines of one process and a connection is a ring of slots in shared
// Go memory. The sender writes (or reduces) straight into the slot the
// receiver reads from, one copy per hop, as NCCL's P2P transport does
// between GPUs.
//
// It backs collective.NewLocalGroup, and it injects faults for tests: a
// hook sees every post and wait and can delay it, fail it, or kill a rank
// (Network.SetFault, Network.Kill).
package mem

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Defaults for Options.
const (
	// DefaultSlots is NCCL's NCCL_STEPS (src/include/device.h): a sender
	// runs at most 8 slices ahead of its receiver.
	DefaultSlots = 8
	// DefaultSlotSize keeps a slice, its local operand and its destination
	// (3 × 128 KiB) inside a 2 MiB L2 cache while it is reduced; see
	// docs/performance.md for the measurement (made before the engine
	// wrote slots with streaming stores: Options.NoStreamSlots).
	DefaultSlotSize = 128 << 10
)

// spinFor is how long a waiting call polls before it parks its goroutine.
// Parking costs a wake-up when the peer posts, which on these 2-vCPU
// machines is tens of microseconds when it has to wake the other vCPU
// (../shared/baselines/RESULTS.md); polling with Gosched in between lets
// other ranks' goroutines run on the same core meanwhile. See
// docs/performance.md for the measurement behind the value.
const spinFor = 20 * time.Microsecond

// spin polls ch for up to spinFor and reports what it got.
func spin(ch chan int) (int, bool) {
	var start time.Time
	for i := 1; ; i++ {
		select {
		case x := <-ch:
			return x, true
		default:
		}
		if i%32 == 0 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				return 0, false
			}
			runtime.Gosched()
		}
	}
}

// ErrKilled is the cause Network.Kill gives by default.
var ErrKilled = errors.New("killed by fault injection")

// Options configures a Network. Zero fields take the defaults.
type Options struct {
	Slots    int
	SlotSize int
	// Slot memory for the connections of device operations (channels
	// from transport.DeviceChannels on), for ranks on GPUs: NCCL's P2P
	// transport keeps a connection's buffers on the receiver's GPU.
	// DeviceAlloc returns n bytes for a slot that rank receives into, and
	// Network.Close gives every one back with DeviceFree. DeviceMemory is
	// the kind DeviceAlloc returns, which Caps reports as DeviceSlots.
	// With DeviceAlloc nil, the network carries host operations only.
	DeviceAlloc  func(rank, n int) (memory.Buffer, error)
	DeviceFree   func(rank int, b memory.Buffer) error
	DeviceMemory memory.Kind
	// NoStreamSlots has the engine write host slots with plain stores: by
	// default it writes them with streaming stores (transport.FarSlots),
	// since the receiving goroutine reads them next, on a core of its own
	// as often as not.
	NoStreamSlots bool
}

// EventKind says what a fault hook is looking at.
type EventKind uint8

// Event kinds.
const (
	EventPost EventKind = iota // a sender is about to hand over a slot
	EventWait                  // a receiver is about to take a filled slot
)

func (k EventKind) String() string {
	if k == EventPost {
		return "post"
	}
	return "wait"
}

// Event describes a post or wait to a fault hook.
type Event struct {
	Kind     EventKind
	From, To int // sender and receiver of the connection
	Channel  int
	Tag      transport.Tag // for EventPost; zero for EventWait
}

// FaultFunc is called before every post (by the sender's goroutine) and
// every wait (by the receiver's). It may sleep to inject a delay, call
// Network.Kill, or return an error, which fails the call with it.
type FaultFunc func(Event) error

// Network connects n in-process ranks.
type Network struct {
	n     int
	opts  Options
	fault atomic.Pointer[FaultFunc]

	mu    sync.Mutex // guards links and the endpoints' states
	links map[linkKey]*link
	eps   []*Endpoint
}

type linkKey struct{ from, to, ch int }

// NewNetwork returns a network of n ranks.
func NewNetwork(n int, opts Options) (*Network, error) {
	if opts.Slots == 0 {
		opts.Slots = DefaultSlots
	}
	if opts.SlotSize == 0 {
		opts.SlotSize = DefaultSlotSize
	}
	if n < 1 || opts.Slots < 2 || opts.SlotSize < 64 {
		return nil, fmt.Errorf("mem: need n ≥ 1, slots ≥ 2 and slot size ≥ 64: n=%d slots=%d slot size=%d", n, opts.Slots, opts.SlotSize)
	}
	if (opts.DeviceAlloc == nil) != (opts.DeviceFree == nil) {
		return nil, errors.New("mem: Options.DeviceAlloc and Options.DeviceFree go together")
	}
	nw := &Network{n: n, opts: opts, links: map[linkKey]*link{}}
	for r := 0; r < n; r++ {
		nw.eps = append(nw.eps, &Endpoint{nw: nw, rank: r, conns: map[[2]int]*conn{}})
	}
	return nw, nil
}

// Endpoint returns rank's endpoint.
func (nw *Network) Endpoint(rank int) *Endpoint { return nw.eps[rank] }

// Close gives back the slot memory that Options.DeviceAlloc provided. Every
// endpoint must have been closed, and nothing may still use its slots:
// call it once every rank's operations have returned.
func (nw *Network) Close() error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	var first error
	for _, l := range nw.links {
		for i, b := range l.dbufs {
			if b.Len() == 0 {
				continue
			}
			if err := nw.opts.DeviceFree(l.to, b); err != nil && first == nil {
				first = err
			}
			l.dbufs[i] = memory.Buffer{}
		}
	}
	return first
}

// SetFault installs a fault hook (nil removes it). It is safe to call at
// any time.
func (nw *Network) SetFault(f FaultFunc) {
	if f == nil {
		nw.fault.Store(nil)
		return
	}
	nw.fault.Store(&f)
}

// Kill aborts rank's endpoint as if its process had died: every pending and
// later call on its connections fails, its peers' with a PeerError naming
// it. A nil cause means ErrKilled.
func (nw *Network) Kill(rank int, cause error) {
	if cause == nil {
		cause = ErrKilled
	}
	nw.eps[rank].Close(cause)
}

func (nw *Network) hook(ev Event) error {
	if f := nw.fault.Load(); f != nil {
		return (*f)(ev)
	}
	return nil
}

// Endpoint is one rank's side of a Network.
type Endpoint struct {
	nw   *Network
	rank int

	// Guarded by nw.mu.
	conns  map[[2]int]*conn // (peer, channel)
	closed bool
	cause  error // non-nil once aborted
}

var _ transport.Endpoint = (*Endpoint)(nil)

// Caps implements transport.Endpoint.
func (ep *Endpoint) Caps() transport.Caps {
	o := &ep.nw.opts
	c := transport.Caps{Slots: o.Slots, SlotSize: o.SlotSize, Memory: memory.Host}
	if o.DeviceAlloc != nil {
		c.DeviceSlots = o.DeviceMemory
	}
	return c
}

// Connect implements transport.Endpoint. In process there is nothing to
// negotiate: the link exists as soon as either side asks for it.
func (ep *Endpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	nw := ep.nw
	if peer < 0 || peer >= nw.n || peer == ep.rank {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("no such peer for rank %d of %d", ep.rank, nw.n)}
	}
	if ch >= transport.DeviceChannels && nw.opts.DeviceAlloc == nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: errors.New("mem: a device channel on a network without device memory")}
	}
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if ep.closed {
		return nil, transport.ErrClosed
	}
	key := [2]int{peer, ch}
	if c := ep.conns[key]; c != nil {
		return c, nil
	}
	c := &conn{ep: ep, peer: peer, ch: ch, out: nw.linkLocked(ep.rank, peer, ch), in: nw.linkLocked(peer, ep.rank, ch), cur: -1, rcur: -1}
	ep.conns[key] = c
	return c, nil
}

// linkLocked returns the link from→to on ch, creating it in the state its
// endpoints are in.
func (nw *Network) linkLocked(from, to, ch int) *link {
	k := linkKey{from, to, ch}
	if l := nw.links[k]; l != nil {
		return l
	}
	l := newLink(from, to, ch, nw.opts)
	nw.links[k] = l
	for _, r := range []int{from, to} {
		ep := nw.eps[r]
		switch {
		case ep.cause != nil:
			l.abort(r, ep.cause)
		case ep.closed:
			l.leave(r)
		}
	}
	return l
}

// Close implements transport.Endpoint.
func (ep *Endpoint) Close(cause error) error {
	nw := ep.nw
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if cause != nil && ep.cause == nil {
		ep.cause = cause
		for k, l := range nw.links {
			if k.from == ep.rank || k.to == ep.rank {
				l.abort(ep.rank, cause)
			}
		}
	}
	if !ep.closed {
		ep.closed = true
		for k, l := range nw.links {
			if k.from == ep.rank || k.to == ep.rank {
				l.leave(ep.rank)
			}
		}
	}
	return nil
}

// link is one direction of one channel between two ranks.
type link struct {
	from, to int
	slotSize int
	bufs     [][]byte // slot memory, grown on demand up to slotSize
	// On a device channel: slot memory from Options.DeviceAlloc, made
	// whole on first use.
	alloc func(rank, n int) (memory.Buffer, error)
	dbufs []memory.Buffer
	meta  []slotMeta
	free  chan int // slots the sender may fill, in ring order
	full  chan int // slots the receiver may drain, in ring order

	dead     chan struct{} // closed when either end aborts
	deadOnce sync.Once
	abortBy  int // rank that aborted (valid once dead is closed)
	cause    error

	fromGone, toGone         chan struct{} // closed on graceful close of an end
	fromGoneOnce, toGoneOnce sync.Once
}

type slotMeta struct {
	n   int
	tag transport.Tag
}

func newLink(from, to, ch int, o Options) *link {
	l := &link{
		from: from, to: to, slotSize: o.SlotSize,
		bufs: make([][]byte, o.Slots), meta: make([]slotMeta, o.Slots),
		free: make(chan int, o.Slots), full: make(chan int, o.Slots),
		dead: make(chan struct{}), fromGone: make(chan struct{}), toGone: make(chan struct{}),
	}
	if ch >= transport.DeviceChannels {
		l.alloc, l.dbufs = o.DeviceAlloc, make([]memory.Buffer, o.Slots)
	}
	for i := 0; i < o.Slots; i++ {
		l.free <- i
	}
	return l
}

// slot returns n bytes of slot i (allocated memory), allocating it on
// first use.
func (l *link) slot(i, n int) (memory.Buffer, error) {
	if l.dbufs[i].Len() == 0 {
		b, err := l.alloc(l.to, l.slotSize)
		if err != nil {
			return memory.Buffer{}, fmt.Errorf("mem: slot memory for rank %d: %w", l.to, err)
		}
		if b.Len() < l.slotSize {
			return memory.Buffer{}, fmt.Errorf("mem: slot memory for rank %d: %d bytes, need %d", l.to, b.Len(), l.slotSize)
		}
		l.dbufs[i] = b
	}
	return l.dbufs[i].Slice(0, n), nil
}

// slotCap is how many bytes slot i holds now.
func (l *link) slotCap(i int) int {
	if l.alloc != nil {
		return l.dbufs[i].Len()
	}
	return cap(l.bufs[i])
}

func (l *link) abort(by int, cause error) {
	l.deadOnce.Do(func() {
		l.abortBy, l.cause = by, cause
		close(l.dead)
	})
}

func (l *link) leave(r int) {
	if r == l.from {
		l.fromGoneOnce.Do(func() { close(l.fromGone) })
	} else {
		l.toGoneOnce.Do(func() { close(l.toGone) })
	}
}

// deadErr is the error rank me sees on a dead link.
func (l *link) deadErr(me int, op string) error {
	if l.abortBy == me {
		return fmt.Errorf("%w: %w", transport.ErrClosed, l.cause)
	}
	return &transport.PeerError{Peer: l.abortBy, Op: op, Err: &transport.PeerAbortedError{Peer: l.abortBy, Cause: l.cause}}
}

// conn is one rank's view of the two links with a peer on a channel.
type conn struct {
	ep      *Endpoint
	peer    int
	ch      int
	out, in *link
	cur     int // slot reserved by the sender side, -1 if none
	rcur    int // slot held by the receiver side, -1 if none
}

func (c *conn) Peer() int { return c.peer }

// SlotsFar says the engine writes this connection's host slots with
// streaming stores (transport.FarSlots; docs/performance.md, "Streaming
// stores into the slots").
func (c *conn) SlotsFar() bool { return !c.ep.nw.opts.NoStreamSlots }

func (c *conn) Reserve(ctx context.Context, n int) (memory.Buffer, error) {
	l := c.out
	if n < 0 || n > l.slotSize {
		return memory.Buffer{}, fmt.Errorf("mem: reserve %d bytes of a %d-byte slot", n, l.slotSize)
	}
	i, ok := spin(l.free)
	if !ok {
		select {
		case i = <-l.free:
		case <-l.dead:
			return memory.Buffer{}, l.deadErr(c.ep.rank, "send")
		case <-l.toGone:
			return memory.Buffer{}, c.goneErr(l, "send")
		case <-l.fromGone:
			return memory.Buffer{}, c.goneErr(l, "send")
		case <-ctx.Done():
			return memory.Buffer{}, &transport.PeerError{Peer: c.peer, Op: "send", Err: context.Cause(ctx)}
		}
	}
	// A slot was free, but the link may be over: either end may have
	// closed, this one included (a slice posted after this rank's graceful
	// close would still reach the peer).
	select {
	case <-l.dead:
		l.free <- i
		return memory.Buffer{}, l.deadErr(c.ep.rank, "send")
	case <-l.toGone:
		l.free <- i
		return memory.Buffer{}, c.goneErr(l, "send")
	case <-l.fromGone:
		l.free <- i
		return memory.Buffer{}, c.goneErr(l, "send")
	default:
	}
	if l.alloc != nil {
		b, err := l.slot(i, n)
		if err != nil {
			l.free <- i
			return memory.Buffer{}, err
		}
		c.cur = i
		return b, nil
	}
	if cap(l.bufs[i]) < n {
		// Grow to a power of two (at least 4 KiB), at most the slot size,
		// so that small operations do not pin whole slots.
		size := 4096
		for size < n {
			size *= 2
		}
		l.bufs[i] = make([]byte, min(size, l.slotSize))
	}
	c.cur = i
	return memory.HostBuffer(l.bufs[i][:n]), nil
}

// goneErr is the error for a link one of whose ends has closed. An abort
// closes the ends too, so the abort is checked first: it carries the cause.
func (c *conn) goneErr(l *link, op string) error {
	select {
	case <-l.dead:
		return l.deadErr(c.ep.rank, op)
	default:
	}
	mine := l.toGone
	if c.ep.rank == l.from {
		mine = l.fromGone
	}
	select {
	case <-mine:
		return transport.ErrClosed
	default:
	}
	return &transport.PeerError{Peer: c.peer, Op: op, Err: transport.ErrPeerClosed}
}

func (c *conn) Post(n int, tag transport.Tag) error {
	l := c.out
	i := c.cur
	if i < 0 || n > l.slotCap(i) {
		return fmt.Errorf("mem: post of %d bytes without a matching reserve", n)
	}
	c.cur = -1
	if err := c.ep.nw.hook(Event{Kind: EventPost, From: l.from, To: l.to, Channel: c.ch, Tag: tag}); err != nil {
		l.free <- i
		return &transport.PeerError{Peer: c.peer, Op: "send", Err: err}
	}
	l.meta[i] = slotMeta{n: n, tag: tag}
	l.full <- i // never blocks: at most Slots indices exist
	return nil
}

func (c *conn) Wait(ctx context.Context) (memory.Buffer, transport.Tag, error) {
	l := c.in
	if err := c.ep.nw.hook(Event{Kind: EventWait, From: l.from, To: l.to, Channel: c.ch}); err != nil {
		return memory.Buffer{}, transport.Tag{}, &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	i, ok := spin(l.full)
	if !ok {
		select {
		case i = <-l.full:
		case <-l.dead:
			return memory.Buffer{}, transport.Tag{}, l.deadErr(c.ep.rank, "recv")
		case <-l.fromGone:
			// Graceful close: hand out what was posted before it.
			select {
			case i = <-l.full:
			default:
				return memory.Buffer{}, transport.Tag{}, c.goneErr(l, "recv")
			}
		case <-l.toGone:
			return memory.Buffer{}, transport.Tag{}, c.goneErr(l, "recv")
		case <-ctx.Done():
			return memory.Buffer{}, transport.Tag{}, &transport.PeerError{Peer: c.peer, Op: "recv", Err: context.Cause(ctx)}
		}
	}
	c.rcur = i
	m := l.meta[i]
	if l.alloc != nil {
		return l.dbufs[i].Slice(0, m.n), m.tag, nil
	}
	return memory.HostBuffer(l.bufs[i][:m.n]), m.tag, nil
}

func (c *conn) Release() error {
	i := c.rcur
	if i < 0 {
		return errors.New("mem: release without a matching wait")
	}
	c.rcur = -1
	c.in.free <- i
	return nil
}
