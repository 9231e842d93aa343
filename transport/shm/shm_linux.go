package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/connsetup"
	"github.com/goccl/goccl/internal/device"
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
// The name is random but no secret (/proc/net/unix lists it to every
// user), and the socket has no permissions: an endpoint checks who is at
// the other end of every connection (see Options.AllowUIDs).
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

	uid     int // this process's effective uid: peers must run as it (or be in o.AllowUIDs)
	acc     connsetup.Acceptor
	dialer  connsetup.Dialer
	pending connsetup.Pending[pendingSeg] // handed over, not yet collected

	mu      sync.Mutex // guards the fields below
	conns   map[connKey]*conn
	closed  bool
	cause   error
	done    chan struct{} // closed by Close
	closing chan struct{} // closed when Close has finished

	board   *board        // see JoinBoard
	joining *joiningBoard // see StartBoard

	down atomic.Bool // Close has begun: waiters stop
}

type connKey struct{ peer, ch int }

// pendingSeg is a segment a lower rank handed over before this rank's
// Connect asked for it, with its control socket (-1 for the board).
type pendingSeg struct {
	k   connKey
	seg *segment
	ctl int
	own memory.Buffer // this side's offer of device slots (ipc_linux.go)
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
	if o.CMAMin == 0 {
		o.CMAMin = DefaultCMAMin
	}
	if o.CMAMax == 0 {
		o.CMAMax = DefaultCMAMax
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.BlockMax == 0 {
		o.BlockMax = DefaultBlockMax
	}
	if o.SharedMax == 0 {
		o.SharedMax = DefaultSharedMax
	}
	if o.SpinFor == 0 {
		o.SpinFor = DefaultSpinFor
	}
	if o.Slots < 2 || o.Slots > 1024 || o.SlotSize < 64 || o.SlotSize >= devFlag {
		// (A slice's size and its flags share a descriptor word: sizes
		// stay below the lowest flag, devFlag.)
		return nil, fmt.Errorf("shm: need 2..1024 slots of 64 bytes to under 1 GiB: %d slots of %d", o.Slots, o.SlotSize)
	}
	if o.BlockSize < 0 || o.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("shm: blocks of %d bytes: need 0 to %d", o.BlockSize, MaxBlockSize)
	}
	for _, uid := range o.AllowUIDs {
		if uid < 0 || uid >= math.MaxUint32 {
			return nil, fmt.Errorf("shm: AllowUIDs holds %d, which is not a uid (0 to %d)", uid, uint32(math.MaxUint32-1))
		}
	}
	e := &Endpoint{o: o, g: geometry{slots: o.Slots, slotSize: o.SlotSize}, log: o.Logger, uid: os.Geteuid(),
		conns: map[connKey]*conn{}, done: make(chan struct{}), closing: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.acc = connsetup.Acceptor{Name: "shm", Rank: o.Rank, Secret: o.Secret, Purpose: wire.PurposeShm, Timeout: setupTimeout,
		Log: e.log, Vet: e.vetPeer, Check: e.checkSetup, Serve: e.serveIncoming, Arriving: &e.pending}
	e.dialer = connsetup.Dialer{Network: "unix", Secret: o.Secret, Purpose: wire.PurposeShm, Timeout: setupTimeout, Done: e.done, ListenersUp: o.ListenersUp}
	e.acc.Start(o.Listener)
	return e, nil
}

// Caps implements transport.Endpoint.
func (e *Endpoint) Caps() transport.Caps {
	c := transport.Caps{Slots: e.o.Slots, SlotSize: e.o.SlotSize, Memory: memory.Host}
	if e.o.Device != nil {
		c.DeviceSlots = memory.Mapped
		if _, ok := e.o.Device.(device.IPCExporter); ok && !e.o.NoDeviceIPC {
			// Where both ends of a connection map each other's (ipc_linux.go).
			c.DeviceSlots = memory.Device
		}
	}
	return c
}

// segMsg is what the lower rank sends with the segment's descriptor.
const segMsgLen = 24

func appendSegMsg(b []byte, g geometry) []byte {
	b = binary.LittleEndian.AppendUint64(b, magic)
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slots))
	b = binary.LittleEndian.AppendUint32(b, uint32(g.slotSize))
	return binary.LittleEndian.AppendUint64(b, uint64(g.size()))
}

// serveIncoming takes the segment (or the board) a lower rank hands over
// on c, set up and acknowledged, and files it for Connect (or JoinBoard).
// c itself is closed; a duplicate of it is kept as the control channel.
func (e *Endpoint) serveIncoming(nc net.Conn, s wire.ConnSetup) bool {
	c := nc.(*net.UnixConn)
	isBoard := s.Flags&wire.ConnBoard != 0
	var seg *segment
	var err error
	if isBoard && e.o.Rank == 0 && e.o.Board != nil { // (checkSetup let only such pulls in)
		e.servePull(c) // a higher rank asks for the offered board
		return false
	}
	if isBoard {
		seg, err = e.receiveBoard(c, [16]byte{})
	} else {
		seg, err = e.receiveSegment(c)
	}
	if err != nil {
		e.acc.Reject(c, err)
		return false
	}
	// A device connection's offer goes into the segment before the
	// acknowledgement, so that the dialer finds it (ipc_linux.go).
	var own memory.Buffer
	if !isBoard {
		own = e.offerIPC(seg, int(s.Channel))
	}
	if err := handshake.WriteFrame(c, wire.FrameConnSetup, nil); err != nil {
		e.freeOffer(own)
		seg.detach()
		e.acc.Drop(c, err)
		return false
	}
	ctl, k := -1, connKey{int(s.From), int(s.Channel)}
	if isBoard {
		k = boardKey
	} else if ctl, err = dupConn(c); err != nil {
		e.freeOffer(own)
		seg.detach()
		e.acc.Drop(c, err)
		return false
	}
	if !e.pending.Deliver(key(k), pendingSeg{k, seg, ctl, own}) {
		e.freeOffer(own)
		seg.detach()
		if ctl >= 0 {
			unix.Close(ctl)
		}
		e.acc.Drop(c, fmt.Errorf("a second segment from rank %d for channel %d (board: %v)", s.From, s.Channel, isBoard))
	}
	return false
}

func key(k connKey) connsetup.Key { return connsetup.Key{Peer: k.peer, Ch: k.ch} }

func (e *Endpoint) checkSetup(s wire.ConnSetup) error {
	switch {
	case s.Flags&^wire.ConnBoard != 0:
		return fmt.Errorf("unknown connection flags %#x", s.Flags)
	case s.Flags&wire.ConnBoard != 0 && e.o.Rank == 0 && e.o.Board != nil:
		// A pull of the offered board (offer_linux.go).
		if s.From == 0 || s.To != 0 || int(s.From) >= e.o.NRanks || e.o.Peers[s.From] == "" {
			return fmt.Errorf("rank %d may not ask for the board of a communicator of %d ranks", s.From, e.o.NRanks)
		}
		return nil
	case s.Flags&wire.ConnBoard != 0 && s.From != 0:
		return fmt.Errorf("rank %d may not hand rank %d a board (rank 0 does)", s.From, e.o.Rank)
	case s.Flags&wire.ConnBoard == 0 && !transport.ValidChannel(int(s.Channel)):
		return fmt.Errorf("no channel %d here", s.Channel)
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
	var p pendingSeg
	var err error
	if e.o.Rank < peer {
		p, err = e.dial(ctx, peer, ch)
	} else {
		p, err = e.awaitIncoming(ctx, k)
	}
	if err != nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
	}
	c := newConn(e, peer, ch, p.seg, p.ctl)
	if ch >= transport.DeviceChannels {
		// Device operations' kernels reach the slots through a mapping of
		// this process's view of the segment.
		why := c.takeOffer(p.own)
		if c.mapped, err = e.o.Device.Register(p.seg.mem); err != nil {
			c.teardown()
			return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("shm: registering the segment with the device: %w", err)}
		}
		if why == "" {
			e.log.Info("goccl: shm: device connection: this rank's sends go to the receiver's device memory (IPC)", "rank", e.o.Rank, "peer", peer, "channel", ch-transport.DeviceChannels)
		} else {
			e.log.Info("goccl: shm: device connection: this rank's sends go through registered host memory", "rank", e.o.Rank, "peer", peer, "channel", ch-transport.DeviceChannels, "why", why)
		}
	} else {
		e.freeOffer(p.own) // (none: only device channels offer)
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

func (e *Endpoint) awaitIncoming(ctx context.Context, k connKey) (pendingSeg, error) {
	return e.pending.Await(ctx, key(k), e.done)
}

// dial makes the pair's segment and hands it to peer; the connection it
// went over stays as the control channel.
func (e *Endpoint) dial(ctx context.Context, peer, ch int) (pendingSeg, error) {
	fd, seg, err := createSegment(e.g)
	if err != nil {
		return pendingSeg{}, err
	}
	defer unix.Close(fd)
	// A device connection's offer is in the segment before it goes
	// (ipc_linux.go).
	own := e.offerIPC(seg, ch)
	s := wire.ConnSetup{From: uint32(e.o.Rank), To: uint32(peer), Channel: uint32(ch), Socket: 0, NSocks: 1}
	c, err := e.handOver(ctx, peer, s, appendSegMsg(nil, e.g), fd)
	if err != nil {
		e.freeOffer(own)
		seg.detach()
		return pendingSeg{}, err
	}
	defer c.Close()
	ctl, err := dupConn(c)
	if err != nil {
		e.freeOffer(own)
		seg.detach()
		return pendingSeg{}, err
	}
	return pendingSeg{seg: seg, ctl: ctl, own: own}, nil
}

// handOver sets up a connection to peer and hands it fd with msg (a
// pair's segment, or the board), retrying while the peer's listener is
// not up yet. It returns the connection once the peer has mapped it.
func (e *Endpoint) handOver(ctx context.Context, peer int, s wire.ConnSetup, msg []byte, fd int) (*net.UnixConn, error) {
	addr := e.o.Peers[peer]
	c, err := e.dialer.Dial(ctx, addr, s, func(c net.Conn) error {
		// Whoever listens under the name now must be one of ours before
		// the descriptor goes: a rank that died frees its name for anyone.
		// (The dialer has no hook before the handshake, so a stranger's
		// listener does see this rank's hello; without the secret it gets
		// nothing more.) Retrying would reach the same listener.
		if err := e.vetPeer(c); err != nil {
			return connsetup.Permanent(fmt.Errorf("the listener: %w", err))
		}
		if _, _, err := c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(fd), nil); err != nil {
			return err
		}
		return connsetup.ExpectAck(c) // the peer has mapped it
	})
	if err != nil {
		return nil, fmt.Errorf("handing rank %d a segment at %s: %w", peer, addr, err)
	}
	return c.(*net.UnixConn), nil
}

// joinGrace bounds how long a graceful Close waits for a board join in
// flight.
const joinGrace = 2 * time.Second

// Close implements transport.Endpoint. A second Close waits for the first
// to finish.
func (e *Endpoint) Close(cause error) error {
	e.mu.Lock()
	if j := e.joining; j != nil && cause == nil && !e.closed {
		// A graceful close lets a board join in flight finish (the peers
		// are all there, so it takes a few round trips), rather than
		// break the hand-overs under the peers' feet.
		e.mu.Unlock()
		select {
		case <-j.done:
		case <-time.After(joinGrace):
		}
		e.mu.Lock()
	}
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
	conns := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		conns = append(conns, c)
	}
	b, j := e.board, e.joining
	e.mu.Unlock()
	e.acc.Close()
	if j != nil {
		// A join in the background ends now (done is closed), and leaves
		// the board itself if it got it.
		<-j.done
	}
	e.o.Board.Close() // no more pulls: the acceptor is closed
	for _, p := range e.pending.Close() {
		if p.k == boardKey { // handed over, never joined
			b = &board{e: e, seg: p.seg, me: e.o.Rank, n: e.o.NRanks}
		} else { // handed over, never collected: the peer has it
			c := newConn(e, p.k.peer, p.k.ch, p.seg, p.ctl)
			c.takeOwn(p.own)
			conns = append(conns, c)
		}
	}
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
