package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Supported reports whether this platform has the transport.
const Supported = true

// ErrUnsupported: this platform has no shared-memory transport.
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux (memfd, futex)")

// Listen opens a listener on a fresh abstract Unix socket
// ("@goccl-<pid>-<random>"). Abstract sockets belong to a network
// namespace and vanish with their last descriptor: nothing is left in the
// file system, and only processes in this network namespace can dial it.
func Listen() (*net.UnixListener, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("@goccl-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen: %w", err)
	}
	return ln, nil
}

// Endpoint is one rank's shared-memory transport.
type Endpoint struct {
	o   Options
	g   geometry
	log *slog.Logger
	wg  sync.WaitGroup // accept loop and setup goroutines

	mu      sync.Mutex // guards the fields below
	conns   map[connKey]*conn
	pending map[connKey]*pendingConn
	setup   map[net.Conn]struct{} // incoming connections still authenticating
	closed  bool
	cause   error
	done    chan struct{} // closed by Close
	closing chan struct{} // closed when Close has finished

	board *board // see JoinBoard

	down  atomic.Bool // Close has begun: waiters stop
	drops handshake.DropLog
}

type connKey struct{ peer, ch int }

// pendingConn is a segment a lower rank handed over before this rank's
// Connect asked for it.
type pendingConn struct {
	seg   *segment
	ctl   int
	ready chan struct{} // closed when seg and ctl are set
}

var _ transport.Endpoint = (*Endpoint)(nil)

// New returns an endpoint and starts accepting the peers' segments.
func New(o Options) (*Endpoint, error) {
	switch {
	case o.NRanks < 1 || o.Rank < 0 || o.Rank >= o.NRanks || len(o.Peers) != o.NRanks:
		return nil, fmt.Errorf("shm: rank %d of %d with %d peer addresses", o.Rank, o.NRanks, len(o.Peers))
	case o.Listener == nil:
		return nil, errors.New("shm: no listener")
	}
	if o.Slots == 0 {
		o.Slots = DefaultSlots
	}
	if o.SlotSize == 0 {
		o.SlotSize = DefaultSlotSize
	}
	if o.SpinFor == 0 {
		o.SpinFor = DefaultSpinFor
	}
	if o.Slots < 2 || o.Slots > 1024 || o.SlotSize < 64 || o.SlotSize > 1<<30 {
		return nil, fmt.Errorf("shm: need 2..1024 slots of 64 bytes to 1 GiB: %d slots of %d", o.Slots, o.SlotSize)
	}
	e := &Endpoint{o: o, g: geometry{slots: o.Slots, slotSize: o.SlotSize}, log: o.Logger,
		conns: map[connKey]*conn{}, pending: map[connKey]*pendingConn{}, setup: map[net.Conn]struct{}{},
		done: make(chan struct{}), closing: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// Caps implements transport.Endpoint.
func (e *Endpoint) Caps() transport.Caps {
	c := transport.Caps{Slots: e.o.Slots, SlotSize: e.o.SlotSize, Memory: memory.Host}
	if e.o.Device != nil {
		c.DeviceSlots = memory.Mapped
	}
	return c
}

func (e *Endpoint) accept() {
	defer e.wg.Done()
	handshake.AcceptLoop(e.o.Listener, func(err error) { e.logDrop(err) }, e.admit, func(c net.Conn) { go e.setupIncoming(c.(*net.UnixConn)) })
}

// admit files an accepted connection among those authenticating, unless
// the endpoint is closing or too many are.
func (e *Endpoint) admit(c net.Conn) handshake.Admission {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := handshake.Admit(e.closed, e.setup, c)
	if a == handshake.Serve {
		e.wg.Add(1)
	}
	return a
}

// logDrop logs a refused connection (handshake.DropLog samples them).
func (e *Endpoint) logDrop(err error) {
	e.drops.Log(e.log, "goccl: shm transport dropped a connection", "rank", e.o.Rank, "err", err)
}

// segMsg is what the lower rank sends with the segment's descriptor.
const segMsgLen = 24

func appendSegMsg(b []byte, g geometry) []byte {
	b = binary.LittleEndian.AppendUint64(b, magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slots))
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slotSize))
	return binary.LittleEndian.AppendUint64(b, uint64(g.size()))
}

// setupIncoming authenticates a connection from a lower rank, takes the
// segment it hands over, and files it for Connect.
func (e *Endpoint) setupIncoming(c *net.UnixConn) {
	defer e.wg.Done()
	defer func() {
		e.mu.Lock()
		delete(e.setup, c)
		e.mu.Unlock()
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(setupTimeout))
	_, typ, payload, err := handshake.Server(c, e.o.Secret, wire.PurposeShm, 64)
	if err != nil {
		e.logDrop(err)
		return
	}
	reject := func(err error) {
		handshake.Reject(c, err.Error())
		e.logDrop(err)
	}
	if typ != wire.FrameConnSetup {
		reject(fmt.Errorf("expected a connection setup, got a %v frame", typ))
		return
	}
	s, _, err := wire.ParseConnSetup(payload)
	if err == nil {
		err = e.checkSetup(s)
	}
	if err != nil {
		reject(err)
		return
	}
	if err := handshake.WriteFrame(c, wire.FrameConnSetup, payload); err != nil {
		e.logDrop(err)
		return
	}
	isBoard := s.Flags&wire.ConnBoard != 0
	var seg *segment
	if isBoard {
		seg, err = e.receiveBoard(c)
	} else {
		seg, err = e.receiveSegment(c)
	}
	if err != nil {
		reject(err)
		return
	}
	if err := handshake.WriteFrame(c, wire.FrameConnSetup, payload); err != nil {
		seg.detach()
		e.logDrop(err)
		return
	}
	ctl, k := -1, connKey{int(s.From), int(s.Channel)}
	if isBoard {
		k = boardKey
	} else if ctl, err = dupConn(c); err != nil {
		seg.detach()
		e.logDrop(err)
		return
	}
	e.mu.Lock()
	p := e.pendingLocked(k)
	dup := p.seg != nil
	if !e.closed && !dup {
		p.seg, p.ctl = seg, ctl
		close(p.ready)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	seg.detach()
	if ctl >= 0 {
		unix.Close(ctl)
	}
	if dup {
		e.logDrop(fmt.Errorf("a second segment from rank %d for channel %d (board: %v)", s.From, s.Channel, isBoard))
	}
}

func (e *Endpoint) checkSetup(s wire.ConnSetup) error {
	switch {
	case s.Flags&^wire.ConnBoard != 0:
		return fmt.Errorf("unknown connection flags %#x", s.Flags)
	case s.Flags&wire.ConnBoard != 0 && s.From != 0:
		return fmt.Errorf("rank %d may not hand rank %d a board (rank 0 does)", s.From, e.o.Rank)
	case int(s.To) != e.o.Rank:
		return fmt.Errorf("segment meant for rank %d reached rank %d", s.To, e.o.Rank)
	case int(s.From) >= e.o.NRanks || int(s.From) >= e.o.Rank:
		return fmt.Errorf("rank %d may not hand rank %d a segment (the lower rank of a pair does)", s.From, e.o.Rank)
	case e.o.Peers[s.From] == "":
		return fmt.Errorf("rank %d is not a shared-memory peer of rank %d", s.From, e.o.Rank)
	}
	return nil
}

// receiveSegment reads the segment message and its descriptor, and maps it.
func (e *Endpoint) receiveSegment(c *net.UnixConn) (*segment, error) {
	buf := make([]byte, segMsgLen)
	fd, err := readWithFD(c, buf)
	if err != nil {
		return nil, fmt.Errorf("reading the segment: %w", err)
	}
	defer unix.Close(fd)
	want := appendSegMsg(nil, e.g)
	if string(buf[:8]) != string(want[:8]) {
		return nil, errors.New("malformed segment message")
	}
	if string(buf) != string(want) {
		return nil, fmt.Errorf("peer's segments have %d slots of %d bytes, rank %d uses %d of %d (set the slot settings alike on every rank)",
			binary.LittleEndian.Uint32(buf[8:]), binary.LittleEndian.Uint32(buf[12:]), e.o.Rank, e.g.slots, e.g.slotSize)
	}
	return mapSegment(fd, e.g, 1)
}

// dupConn returns a blocking-free duplicate of c's descriptor, to keep as
// the control channel once c is closed (out of Go's netpoller: it is only
// polled for hang-ups).
func dupConn(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	cerr := raw.Control(func(s uintptr) {
		fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	})
	if cerr != nil {
		return -1, cerr
	}
	return fd, err
}

func (e *Endpoint) pendingLocked(k connKey) *pendingConn {
	p := e.pending[k]
	if p == nil {
		p = &pendingConn{ctl: -1, ready: make(chan struct{})}
		e.pending[k] = p
	}
	return p
}

// Connect implements transport.Endpoint.
func (e *Endpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	if peer < 0 || peer >= e.o.NRanks || peer == e.o.Rank {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("no such peer for rank %d of %d", e.o.Rank, e.o.NRanks)}
	}
	if e.o.Peers[peer] == "" {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("rank %d is not reachable over shared memory", peer)}
	}
	if ch >= transport.DeviceChannels && e.o.Device == nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: errors.New("shm: a device channel on an endpoint without a device")}
	}
	k := connKey{peer, ch}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, transport.ErrClosed
	}
	if c := e.conns[k]; c != nil {
		e.mu.Unlock()
		return c, nil
	}
	e.mu.Unlock()
	var seg *segment
	var ctl int
	var err error
	if e.o.Rank < peer {
		seg, ctl, err = e.dial(ctx, peer, ch)
	} else {
		seg, ctl, err = e.awaitIncoming(ctx, k)
	}
	if err != nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
	}
	c := newConn(e, peer, ch, seg, ctl)
	if ch >= transport.DeviceChannels {
		// Device operations' kernels reach the slots through a mapping of
		// this process's view of the segment.
		if c.mapped, err = e.o.Device.Register(seg.mem); err != nil {
			c.teardown()
			return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("shm: registering the segment with the device: %w", err)}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		c.teardown()
		return nil, transport.ErrClosed
	}
	if old := e.conns[k]; old != nil { // a concurrent Connect won
		c.teardown()
		return old, nil
	}
	e.conns[k] = c
	return c, nil
}

func (e *Endpoint) awaitIncoming(ctx context.Context, k connKey) (*segment, int, error) {
	e.mu.Lock()
	p := e.pendingLocked(k)
	e.mu.Unlock()
	select {
	case <-p.ready:
	case <-ctx.Done():
		return nil, -1, fmt.Errorf("waiting for rank %d's segment (channel %d): %w", k.peer, k.ch, context.Cause(ctx))
	case <-e.done:
		return nil, -1, transport.ErrClosed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, -1, transport.ErrClosed // Close releases it
	}
	delete(e.pending, k)
	return p.seg, p.ctl, nil
}

// dial makes the pair's segment and hands it to peer.
func (e *Endpoint) dial(ctx context.Context, peer, ch int) (*segment, int, error) {
	var seg *segment
	ctl := -1
	err := e.retry(ctx, peer, func() (err error) {
		seg, ctl, err = e.dialOnce(ctx, peer, ch)
		return err
	})
	return seg, ctl, err
}

// retry runs hand (a hand-over to peer) until it succeeds, is refused, or
// ctx ends: the peer's listener may not be up yet.
func (e *Endpoint) retry(ctx context.Context, peer int, hand func() error) error {
	addr := e.o.Peers[peer]
	backoff := 5 * time.Millisecond
	for {
		err := hand()
		if err == nil {
			return nil
		}
		var rej *handshake.RejectedError
		if errors.Is(err, handshake.ErrAuth) || errors.As(err, &rej) || ctx.Err() != nil {
			return fmt.Errorf("handing rank %d a segment at %s: %w", peer, addr, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("handing rank %d a segment at %s: %v: %w", peer, addr, err, context.Cause(ctx))
		case <-e.done:
			return transport.ErrClosed
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (e *Endpoint) dialOnce(ctx context.Context, peer, ch int) (*segment, int, error) {
	fd, seg, err := createSegment(e.g)
	if err != nil {
		return nil, -1, err
	}
	defer unix.Close(fd)
	s := wire.ConnSetup{From: uint32(e.o.Rank), To: uint32(peer), Channel: uint32(ch), Socket: 0, NSocks: 1}
	ctl := -1
	err = e.handOver(ctx, peer, s, appendSegMsg(nil, e.g), fd, func(c *net.UnixConn) (err error) {
		ctl, err = dupConn(c)
		return err
	})
	if err != nil {
		seg.detach()
		return nil, -1, err
	}
	return seg, ctl, nil
}

// handOver dials peer, authenticates, and hands it fd with msg (a pair's
// segment, or the board); keep, if set, runs on the connection once the
// peer has mapped it.
func (e *Endpoint) handOver(ctx context.Context, peer int, s wire.ConnSetup, msg []byte, fd int, keep func(*net.UnixConn) error) error {
	d := net.Dialer{Timeout: setupTimeout}
	nc, err := d.DialContext(ctx, "unix", e.o.Peers[peer])
	if err != nil {
		return err
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	err = handshake.Bounded(ctx, c, setupTimeout, func() error {
		if err := handshake.Client(c, e.o.Secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
			return wire.FrameConnSetup, s.Append(nil)
		}); err != nil {
			return err
		}
		if err := expectAck(c); err != nil {
			return err
		}
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
			return err
		}
		return expectAck(c) // the peer has mapped it
	})
	if err == nil && keep != nil {
		err = keep(c)
	}
	return err
}

// expectAck reads the peer's acknowledgement of a hand-over step, or its
// refusal.
func expectAck(c *net.UnixConn) error {
	typ, payload, err := handshake.ReadFrame(c, wire.MaxString+64)
	if err != nil {
		return err
	}
	if typ == wire.FrameReject {
		r, _, _ := wire.ParseReject(payload)
		return &handshake.RejectedError{Reason: r.Reason}
	}
	if typ != wire.FrameConnSetup {
		return fmt.Errorf("expected a setup acknowledgement, got a %v frame", typ)
	}
	return nil
}

// Close implements transport.Endpoint. A second Close waits for the first
// to finish.
func (e *Endpoint) Close(cause error) error {
	e.mu.Lock()
	if e.closed {
		if cause != nil && e.cause == nil {
			e.cause = cause
		}
		e.mu.Unlock()
		<-e.closing
		return nil
	}
	e.closed = true
	e.cause = cause
	e.down.Store(true)
	close(e.done)
	e.o.Listener.Close()
	for c := range e.setup {
		c.Close()
	}
	conns := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		conns = append(conns, c)
	}
	b := e.board
	for k, p := range e.pending {
		switch {
		case p.seg == nil:
		case k == boardKey: // handed over, never joined
			b = &board{e: e, seg: p.seg, me: e.o.Rank, n: e.o.NRanks}
		default: // handed over, never collected: the peer has it
			conns = append(conns, newConn(e, k.peer, k.ch, p.seg, p.ctl))
		}
	}
	e.mu.Unlock()
	if b != nil {
		b.leave(cause)
	}
	for _, c := range conns {
		// Tell the peer first (an abort's reason, or that nothing more
		// comes), then wake everyone sleeping on the segment: the peer,
		// and this rank's own waiters, who see down.
		if cause != nil {
			c.seg.setAborted(cause.Error())
		} else {
			c.seg.gone(c.seg.side).Store(1)
		}
		c.wakeAll()
		c.teardown()
	}
	e.wg.Wait()
	close(e.closing)
	return nil
}

// closedErr is the error of a call on a closed endpoint.
func (e *Endpoint) closedErr() error {
	e.mu.Lock()
	cause := e.cause
	e.mu.Unlock()
	if cause != nil {
		return fmt.Errorf("%w: %w", transport.ErrClosed, cause)
	}
	return transport.ErrClosed
}
