//go:build unix

// Package tcp is goccl's transport between processes and hosts: a
// connection to a peer is several TCP sockets, slices striped across them
// in turn, each slice preceded by a header carrying the engine's tag.
//
// Every socket is authenticated with the job's secret before any other
// byte on it is trusted (package handshake), then identified by a setup
// frame naming its ranks, channel and index. The lower rank of a pair
// dials; the higher accepts.
//
// Sending: Reserve hands out one of Slots staging buffers (or PostFrom
// sends straight from the caller's memory); Post queues the slice on its
// socket and writes what the kernel takes at once. The rest is written, a
// non-blocking write at a time, by whatever the channel's goroutine calls
// next: Reserve, Wait, Flush. There is no writer thread to hand slices to
// (see sock). Receiving is done by the caller of Wait itself, straight
// from the socket into a read buffer, a landing buffer, or (WaitInto) the
// caller's memory: it polls for SpinFor before it parks in poll(2),
// because waking a parked thread costs tens of microseconds on these
// machines (../shared/baselines/RESULTS.md) and a collective's hops are
// often shorter than that.
//
// With Options.TLS set, every socket also runs a TLS 1.3 handshake
// (mutual: both ends present a certificate the job's CA signed) after the
// setup frame, and everything after it travels in TLS records, sealed and
// opened inside the same non-blocking loop (package tlsrec). The accepting
// end's first record confirms the socket, so a dialer whose certificate
// was refused learns it while connecting.
//
// Flow control: a sender is at most Slots staged slices plus the kernel's
// socket buffers ahead of its receiver, and, for slices over 64 KiB, at
// most Options.Window slices ahead of what the receiver has read, by
// credits the receiver sends back on a control socket of the connection
// (credit.go: a sender far ahead makes the receiver, the slower side of a
// one-way stream, do the kernel's work for both). Either way that is at
// least the capacity the engine's schedules need (algorithms.MinPieces).
//
// Lending (Options.Lend, lend_linux.go): a large slice posted from the
// caller's memory may go into its socket by reference (vmsplice and
// splice through a pipe) instead of being copied; its header says so, its
// receiver credits it as soon as it has read it, and Flush waits for that
// credit, since the kernel reads the caller's pages until then. The
// engine says per operation whether it should (transport.PageLender):
// by default broadcasts and all-gathers, where it was measured to pay.
//
// Goroutines: one accept loop per endpoint and one short-lived goroutine
// per incoming socket while it authenticates. Close stops and waits for
// them.
package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/internal/connsetup"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Endpoint is one rank's TCP transport.
type Endpoint struct {
	o   Options
	log *slog.Logger
	// window paces large slices (credit.go); 0: no credits, and no
	// control sockets.
	window int

	acc     connsetup.Acceptor
	dialer  connsetup.Dialer
	pending connsetup.Pending[[]link] // every socket of a connection a lower rank dialled, not yet collected

	mu       sync.Mutex // guards the fields below
	conns    map[connKey]*conn
	arriving map[connKey]*arrivingConn // sockets of connections still being dialled
	outboxes map[connKey]*outbox       // by channel (peer -1), by connection on Independent channels
	closed   bool
	cause    error
	done     chan struct{} // closed by Close

	closing chan struct{} // closed when Close has finished
}

type connKey struct{ peer, ch int }

// outboxKey is the outbox a connection to peer on channel ch writes
// through: its channel's, or its own on an Independent channel (whose
// connections are driven by goroutines of their own).
func outboxKey(peer, ch int) connKey {
	if transport.Independent(ch) {
		return connKey{peer, ch}
	}
	return connKey{-1, ch}
}

// link is a socket set up and ready to carry slices, with its TLS
// session when the endpoint uses TLS.
type link struct {
	c   net.Conn
	tls *tlsrec.Session
}

// arrivingConn collects the sockets of a connection the peer dials,
// until all have come.
type arrivingConn struct {
	socks []link
	n     int
}

var _ transport.Endpoint = (*Endpoint)(nil)

// New returns an endpoint and starts accepting the peers' sockets.
func New(o Options) (*Endpoint, error) {
	switch {
	case o.NRanks < 1 || o.Rank < 0 || o.Rank >= o.NRanks || len(o.Peers) != o.NRanks:
		return nil, fmt.Errorf("tcp: rank %d of %d with %d peer addresses", o.Rank, o.NRanks, len(o.Peers))
	case o.Listener == nil:
		return nil, errors.New("tcp: no listener")
	case o.PeerNICs != nil && len(o.PeerNICs) != o.NRanks:
		return nil, fmt.Errorf("tcp: %d ranks' interface lists for %d ranks", len(o.PeerNICs), o.NRanks)
	}
	if o.NSocks == 0 {
		o.NSocks = DefaultNSocks
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
	if o.NSocks < 1 || o.NSocks > 64 || o.Slots < 2 || o.SlotSize < 64 {
		return nil, fmt.Errorf("tcp: need 1..64 sockets, ≥ 2 slots of ≥ 64 bytes: %d sockets, %d slots of %d", o.NSocks, o.Slots, o.SlotSize)
	}
	window, err := windowFor(o)
	if err != nil {
		return nil, err
	}
	if err := ValidCongestion(o.Congestion); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	e := &Endpoint{o: o, log: o.Logger, window: window, conns: map[connKey]*conn{}, arriving: map[connKey]*arrivingConn{},
		outboxes: map[connKey]*outbox{}, done: make(chan struct{}), closing: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.acc = connsetup.Acceptor{Name: "tcp", Rank: o.Rank, Secret: o.Secret, Purpose: wire.PurposeData, Timeout: setupTimeout,
		Log: e.log, Check: e.checkSetup, Serve: e.serveIncoming, Arriving: &e.pending}
	e.dialer = connsetup.Dialer{Network: "tcp", Secret: o.Secret, Purpose: wire.PurposeData, Timeout: setupTimeout, Done: e.done, ListenersUp: o.ListenersUp,
		Control: control(o.Congestion)}
	e.acc.Start(append([]net.Listener{o.Listener}, o.Listeners...)...)
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

// serveIncoming runs TLS on an incoming socket (set up, checked and
// acknowledged) when the endpoint uses it, and files the socket with its
// connection; the connection goes to Connect once all its sockets came.
func (e *Endpoint) serveIncoming(c net.Conn, s wire.ConnSetup) bool {
	l := link{c: c}
	if e.o.TLS != nil {
		var err error
		if l.tls, err = e.serverTLS(c); err != nil {
			e.acc.Drop(c, fmt.Errorf("TLS with rank %d: %w", s.From, err))
			return false
		}
	}
	k := connKey{int(s.From), int(s.Channel)}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return false
	}
	a := e.arriving[k]
	if a == nil {
		a = &arrivingConn{socks: make([]link, e.nsocks())}
		e.arriving[k] = a
	}
	if old := a.socks[s.Socket].c; old != nil {
		// The dialer gave up on the first attempt (a slow acknowledgement)
		// and tried again: the newer socket is the one it uses.
		old.Close()
		a.n--
	}
	a.socks[s.Socket] = l
	a.n++
	complete := a.n == len(a.socks)
	if complete {
		delete(e.arriving, k)
	}
	e.mu.Unlock()
	c.SetDeadline(time.Time{})
	if complete && !e.pending.Deliver(key(k), a.socks) {
		for _, l := range a.socks {
			l.c.Close()
		}
		e.acc.Drop(c, fmt.Errorf("connection from rank %d on channel %d already established", s.From, s.Channel))
	}
	return true
}

func key(k connKey) connsetup.Key { return connsetup.Key{Peer: k.peer, Ch: k.ch} }

// established reports whether the connection k has all its sockets.
func (e *Endpoint) established(k connKey) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.conns[k] != nil || e.pending.Has(key(k))
}

// serverTLS runs the accepting end's TLS handshake on c, under c's setup
// deadline, then the channel binding (handshake.ConfirmTLS): this end's
// proof over the session goes out first, as the record that tells the
// dialer its certificate was accepted (in TLS 1.3 the client's handshake
// ends before the server has checked the client's certificate), and the
// dialer's comes back.
func (e *Endpoint) serverTLS(c net.Conn) (*tlsrec.Session, error) {
	ts, err := tlsrec.Handshake(context.Background(), c, e.o.TLS, false)
	if err != nil {
		return nil, err
	}
	if err := handshake.ConfirmTLS(sessionRW{c, ts}, e.o.Secret, ts.State, false); err != nil {
		return nil, err
	}
	return ts, nil
}

// clientTLS runs the dialing end's TLS handshake on c and the channel
// binding (see serverTLS).
func clientTLS(ctx context.Context, c net.Conn, cfg *tls.Config, secret []byte) (*tlsrec.Session, error) {
	ts, err := tlsrec.Handshake(ctx, c, cfg, true)
	if err != nil {
		return nil, err
	}
	if err := handshake.ConfirmTLS(sessionRW{c, ts}, secret, ts.State, true); err != nil {
		if errors.Is(err, handshake.ErrTLSBinding) {
			return nil, err
		}
		return nil, fmt.Errorf("waiting for the peer to accept this rank's certificate: %w", err)
	}
	return ts, nil
}

// sessionRW reads and writes a TLS session's application data with
// blocking calls on its socket, for the setup before the poll loop takes
// the socket over.
type sessionRW struct {
	c  net.Conn
	ts *tlsrec.Session
}

func (s sessionRW) Write(p []byte) (int, error) {
	if _, err := s.c.Write(s.ts.Seal(nil, p, nil)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s sessionRW) Read(p []byte) (int, error) {
	return s.ts.Read(p, func(b []byte) (int, error) {
		m, err := s.c.Read(b)
		if m > 0 {
			return m, nil
		}
		return 0, err
	})
}

func (e *Endpoint) checkSetup(s wire.ConnSetup) error {
	switch {
	case !transport.ValidChannel(int(s.Channel)):
		return fmt.Errorf("no channel %d here", s.Channel)
	case e.established(connKey{int(s.From), int(s.Channel)}):
		return fmt.Errorf("connection from rank %d on channel %d already established", s.From, s.Channel)
	case int(s.To) != e.o.Rank:
		return fmt.Errorf("socket meant for rank %d reached rank %d", s.To, e.o.Rank)
	case int(s.From) >= e.o.NRanks || int(s.From) >= e.o.Rank:
		return fmt.Errorf("rank %d may not dial rank %d (the lower rank of a pair dials)", s.From, e.o.Rank)
	case int(s.NSocks) != e.o.NSocks || int(s.Socket) >= e.nsocks():
		return fmt.Errorf("socket %d of %d from rank %d, this rank uses %d sockets per connection (set GOCCL_NSOCKS alike on every rank)", s.Socket, s.NSocks, s.From, e.o.NSocks)
	case (s.Flags&wire.ConnCredits != 0) != (e.window > 0):
		with, without := int(s.From), e.o.Rank
		if e.window > 0 {
			with, without = without, with
		}
		return fmt.Errorf("rank %d paces its TCP sends by the receiver's credits and rank %d does not (set GOCCL_TCP_WINDOW alike on every rank)", with, without)
	case (s.Flags&wire.ConnTLS != 0) != (e.o.TLS != nil):
		with, without := int(s.From), e.o.Rank
		if e.o.TLS != nil {
			with, without = without, with
		}
		return fmt.Errorf("rank %d uses TLS and rank %d does not (set GOCCL_TLS_CERT, GOCCL_TLS_KEY and GOCCL_TLS_CA on every rank or on none)", with, without)
	}
	return nil
}

// Connect implements transport.Endpoint.
func (e *Endpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	if peer < 0 || peer >= e.o.NRanks || peer == e.o.Rank {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("no such peer for rank %d of %d", e.o.Rank, e.o.NRanks)}
	}
	if ch >= transport.DeviceChannels && e.o.Device == nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: errors.New("tcp: a device channel on an endpoint without a device")}
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
	var socks []link
	var err error
	if e.o.Rank < peer {
		socks, err = e.dial(ctx, peer, ch)
	} else {
		socks, err = e.awaitIncoming(ctx, k)
	}
	if err != nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
	}
	e.mu.Lock()
	ok := outboxKey(peer, ch)
	ob := e.outboxes[ok]
	if ob == nil {
		ob = &outbox{}
		e.outboxes[ok] = ob
	}
	e.mu.Unlock()
	if e.window > 0 {
		if err := e.hello(peer, socks[e.o.NSocks]); err != nil {
			for _, l := range socks {
				l.c.Close()
			}
			return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
		}
	}
	c, err := newConn(e, peer, ob, socks)
	if err != nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
	}
	// Gathering (gather.go) is for the collective channels of host
	// operations: a point-to-point connection is driven by a goroutine of
	// its own that may never wait on anything that would flush it.
	c.gathers = !e.o.NoGather && e.o.TLS == nil && !transport.Independent(ch) && ch < transport.DeviceChannels
	if ch >= transport.DeviceChannels {
		if err := c.stage(); err != nil {
			c.release()
			return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		c.release()
		c.unstage()
		return nil, transport.ErrClosed
	}
	if old := e.conns[k]; old != nil { // a concurrent Connect won
		c.release()
		c.unstage()
		return old, nil
	}
	e.conns[k] = c
	return c, nil
}

// nsocks is the number of sockets of a connection: NSocks data sockets
// and, with credits, the control socket.
func (e *Endpoint) nsocks() int {
	if e.window > 0 {
		return e.o.NSocks + 1
	}
	return e.o.NSocks
}

func (e *Endpoint) awaitIncoming(ctx context.Context, k connKey) ([]link, error) {
	return e.pending.Await(ctx, key(k), e.done)
}

// dial opens, authenticates and identifies the connection's sockets.
func (e *Endpoint) dial(ctx context.Context, peer, ch int) ([]link, error) {
	socks := make([]link, 0, e.nsocks())
	fail := func(err error) ([]link, error) {
		for _, s := range socks {
			s.c.Close()
		}
		return nil, err
	}
	for i := 0; i < e.nsocks(); i++ {
		c, err := e.dialOne(ctx, peer, ch, i)
		if err != nil {
			return fail(err)
		}
		socks = append(socks, c)
	}
	return socks, nil
}

// nicDialTimeout bounds a socket's attempt at one of the peer's other
// interfaces before it falls back to the peer's first address: a rail
// this host cannot reach must not hold the connection up for the whole
// operation timeout.
var nicDialTimeout = 3 * time.Second

func (e *Endpoint) dialOne(ctx context.Context, peer, ch, i int) (link, error) {
	addr := e.o.Peers[peer]
	if e.o.PeerNICs != nil && i < e.o.NSocks { // the control socket goes to the first address

		if nics := e.o.PeerNICs[peer]; i%(1+len(nics)) > 0 {
			alt := nics[i%(1+len(nics))-1]
			actx, cancel := context.WithTimeout(ctx, nicDialTimeout)
			l, err := e.dialAddr(actx, alt, peer, ch, i)
			cancel()
			if err == nil || ctx.Err() != nil {
				return l, err
			}
			e.log.Warn("goccl: tcp: could not reach a peer's other interface; this socket uses its first address",
				"rank", e.o.Rank, "peer", peer, "addr", alt, "fallback", addr, "err", err)
		}
	}
	return e.dialAddr(ctx, addr, peer, ch, i)
}

// dialAddr opens socket i of the connection to peer on channel ch at addr.
func (e *Endpoint) dialAddr(ctx context.Context, addr string, peer, ch, i int) (link, error) {
	s := wire.ConnSetup{From: uint32(e.o.Rank), To: uint32(peer), Channel: uint32(ch), Socket: uint16(i), NSocks: uint16(e.o.NSocks)}
	if e.o.TLS != nil {
		s.Flags |= wire.ConnTLS
	}
	if e.window > 0 {
		s.Flags |= wire.ConnCredits
	}
	var ts *tlsrec.Session
	c, err := e.dialer.Dial(ctx, addr, s, func(c net.Conn) error {
		if e.o.TLS == nil {
			return nil
		}
		var err error
		if ts, err = clientTLS(ctx, c, e.o.TLS, e.o.Secret); err != nil {
			err = &tlsrec.HandshakeError{Err: err}
			if tlsrec.Permanent(err.(*tlsrec.HandshakeError).Err) {
				return connsetup.Permanent(err)
			}
		}
		return err
	})
	if err != nil {
		return link{}, fmt.Errorf("connecting to rank %d at %s: %w", peer, addr, err)
	}
	return link{c, ts}, nil
}

// Close implements transport.Endpoint. A second Close (an abort after a
// graceful close, say) waits for the first to finish.
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
	close(e.done)
	conns := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		conns = append(conns, c)
	}
	obs := make([]*outbox, 0, len(e.outboxes))
	for _, ob := range e.outboxes {
		obs = append(obs, ob)
	}
	for _, a := range e.arriving {
		for _, s := range a.socks {
			if s.c != nil {
				s.c.Close()
			}
		}
	}
	e.mu.Unlock()
	e.acc.Close() // a stranger mid-handshake must not hold Close up
	for _, socks := range e.pending.Close() {
		for _, s := range socks {
			s.c.Close()
		}
	}
	// Operations flush their connections before they return, so a
	// graceful close has nothing left to send but what the channels
	// gathered (gather.go) and a notice that nothing more comes: the
	// peers' receivers tell it from a lost connection (ErrPeerClosed). An
	// abort tells the peers why first: a rank that fails because another
	// died then passes the name of the dead rank on, instead of only its
	// own lost connection.
	for _, ob := range obs {
		ob.takeGathering() // and stops its timer
	}
	if cause == nil {
		deadline := time.Now().Add(closeFlush)
		for _, c := range conns {
			for _, s := range c.socks {
				s.drainGathered(deadline)
			}
		}
	}
	for _, c := range conns {
		if cause != nil {
			for _, s := range c.socks {
				s.notifyAbort(cause.Error())
			}
		} else {
			c.notifyClose()
		}
		c.shutdown()
	}
	for _, c := range conns {
		c.release()
		c.unstage()
	}
	close(e.closing)
	return nil
}

// Progress writes, without blocking, what channel ch's connections have
// queued, and reports whether any of it is still waiting, or the first
// write error. Only channel ch's goroutine may call it: another
// transport's wait does (package shm, in a communicator that mixes
// transports), since this transport's sends move only when the channel's
// goroutine moves them.
func (e *Endpoint) Progress(ch int) (pending bool, err error) {
	if transport.Independent(ch) {
		return false, nil // each connection's goroutine moves its own
	}
	e.mu.Lock()
	ob := e.outboxes[connKey{-1, ch}]
	e.mu.Unlock()
	if ob == nil {
		return false, nil
	}
	// Another transport's wait: the channel receives, so it is not a
	// one-way stream (gather.go).
	ob.oneWay = 0
	if len(ob.pending) > 0 || ob.gather.n.Load() > 0 {
		ob.progress()
	}
	return len(ob.pending) > 0, ob.firstErr()
}

// conn is a connection to one peer on one channel. Everything but
// shutdown and release is called by the channel's goroutine only.
type conn struct {
	e      *Endpoint
	peer   int
	socks  []*sock // the data sockets
	cr     credits // pacing, with the control socket
	ob     *outbox // the channel's sockets with slices to write
	lends  bool    // large slices from the caller's memory may be lent (Endpoint.lends)
	lendOp bool    // and are, in the operation running (LendFor)
	held   *sock   // the socket whose last job is held back (letGo), or nil

	// Send side.
	gathers bool     // may gather small slices (gather.go)
	bufs    [][]byte // staging slots
	free    []int    // free staging slots
	cur     int      // reserved slot, -1 if none
	sendSeq uint64

	// Receive side.
	land    []byte // landing buffer for payloads larger than a socket's read buffer
	recvSeq uint64
	holding bool
	// gone is the notice the peer left when it closed its end, once this
	// side has read it: a *transport.PeerAbortedError, or
	// transport.ErrPeerClosed. Every later call fails with it.
	gone error

	// On a connection of device operations: the staging memory (every
	// slot and the landing buffer, whole pages of it) registered with the
	// endpoint's device, set before first use; slots are handed out as
	// views of it. Empty otherwise.
	mapped     memory.Buffer
	unregister sync.Once
}

var (
	_ transport.Conn           = (*conn)(nil)
	_ transport.DirectReceiver = (*conn)(nil)
	_ transport.DirectSender   = (*conn)(nil)
	_ transport.Flusher        = (*conn)(nil)
)

func newConn(e *Endpoint, peer int, ob *outbox, raw []link) (*conn, error) {
	c := &conn{e: e, peer: peer, ob: ob, cur: -1, bufs: make([][]byte, e.o.Slots), lends: e.lends()}
	c.lendOp = c.lendsAll()
	c.cr.window = uint64(e.window)
	for i := e.o.Slots - 1; i >= 0; i-- {
		c.free = append(c.free, i)
	}
	for i, r := range raw {
		s, err := newSock(c, r)
		if err != nil {
			for _, r := range raw[i:] {
				r.c.Close()
			}
			c.release()
			return nil, err
		}
		if i == e.o.NSocks {
			s.quiet = true
			c.cr.ctl = s
			continue
		}
		c.socks = append(c.socks, s)
	}
	return c, nil
}

// shutdown wakes and fails every call on the connection's sockets. Any
// goroutine may call it.
func (c *conn) shutdown() {
	for _, s := range c.socks {
		s.shutdown()
	}
	if c.cr.ctl != nil {
		c.cr.ctl.shutdown()
	}
}

// notifyClose tells the peer, on every socket, that this rank closed
// gracefully and sends nothing more, if everything posted has been
// written; otherwise it says nothing, and the peer, missing slices, sees
// the connection lost. Best effort, as notifyAbort. Any goroutine may
// call it.
func (c *conn) notifyClose() {
	for _, s := range c.socks {
		s.wmu.Lock()
		defer s.wmu.Unlock()
	}
	for _, s := range c.socks {
		if len(s.queue) > 0 || s.ngathered > 0 || s.err != nil {
			return
		}
	}
	for _, s := range c.socks {
		s.setErr(net.ErrClosed) // nothing more goes out after the notice
		s.writeNoticeLocked(wire.CloseOp, "")
	}
}

// release closes the sockets once no call uses them.
func (c *conn) release() {
	for _, s := range c.socks {
		s.release()
	}
	if c.cr.ctl != nil {
		c.cr.ctl.release()
	}
}

func (c *conn) Peer() int { return c.peer }

func (c *conn) peerErr(op string, err error) error {
	var pe *transport.PeerError
	if errors.As(err, &pe) {
		return err // already names its peer (a write error seen while waiting)
	}
	if errClosedOrEOF(err) {
		// A peer that aborted or closed left a notice before hanging up; a
		// send that failed has not read it yet.
		for _, s := range c.socks {
			if c.gone != nil {
				break
			}
			c.gone = s.scanNotice()
		}
		if c.gone != nil {
			return &transport.PeerError{Peer: c.peer, Op: op, Err: c.gone}
		}
		err = fmt.Errorf("connection lost (did rank %d's process exit or abort?): %w", c.peer, err)
	}
	c.e.mu.Lock()
	cause := c.e.cause
	closed := c.e.closed
	c.e.mu.Unlock()
	if closed {
		if cause != nil {
			return fmt.Errorf("%w: %w", transport.ErrClosed, cause)
		}
		return transport.ErrClosed
	}
	return &transport.PeerError{Peer: c.peer, Op: op, Err: err}
}

// sendErr returns the first write error of the connection's sockets.
func (c *conn) sendErr() error {
	for _, s := range c.socks {
		if _, err := s.pending(); err != nil {
			return err
		}
		if s.closed.Load() {
			return net.ErrClosed
		}
	}
	return nil
}

func (c *conn) Reserve(ctx context.Context, n int) (memory.Buffer, error) {
	if n < 0 || n > c.e.o.SlotSize {
		return memory.Buffer{}, fmt.Errorf("tcp: reserve %d bytes of a %d-byte slot", n, c.e.o.SlotSize)
	}
	if c.gone != nil || c.socks[0].closed.Load() {
		// The peer has said it takes nothing more, or this endpoint
		// closed (Close shuts every socket down): a free slot would be
		// filled for nothing.
		return memory.Buffer{}, c.peerErr("send", net.ErrClosed)
	}
	if len(c.free) == 0 {
		// Every slot is on its way out: move the channel's data until one
		// comes back, parked on the pending sockets' writability.
		_, err := c.ob.wait(ctx, -1, 0, c.e.o, func() (int, bool, error) {
			if len(c.free) > 0 {
				return 0, true, nil
			}
			err := c.sendErr()
			return 0, err != nil, err
		})
		if err != nil {
			return memory.Buffer{}, c.sendFail(ctx, err)
		}
	}
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	if cap(c.bufs[i]) < n {
		size := 4096
		for size < n {
			size *= 2
		}
		c.bufs[i] = make([]byte, min(size, c.e.o.SlotSize))
	}
	c.cur = i
	return c.buf(c.bufs[i][:n]), nil
}

// stage gives a device connection its staging memory: Slots slots and a
// landing buffer of SlotSize each, in pages of its own (a registration
// pins whole pages, and two may not share one), registered with the
// device. It is Go memory, so a call still running when the endpoint
// closes never touches unmapped pages.
func (c *conn) stage() error {
	const page = 4096
	size := (c.e.o.Slots + 1) * c.e.o.SlotSize
	size = (size + page - 1) &^ (page - 1)
	raw := make([]byte, size+page)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(raw))) & (page - 1))
	mem := raw[off : off+size : off+size]
	m, err := c.e.o.Device.Register(mem)
	if err != nil {
		return fmt.Errorf("tcp: registering the staging memory with the device: %w", err)
	}
	c.mapped = m
	s := c.e.o.SlotSize
	for i := range c.bufs {
		c.bufs[i] = mem[i*s : (i+1)*s : (i+1)*s]
	}
	c.land = mem[c.e.o.Slots*s : (c.e.o.Slots+1)*s]
	return nil
}

// unstage undoes stage, once.
func (c *conn) unstage() {
	if c.mapped.Len() > 0 {
		c.unregister.Do(func() { c.e.o.Device.Unregister(c.mapped) })
	}
}

// buf describes b as the engine sees it: a view of the registered
// staging memory on a device connection, host memory otherwise.
func (c *conn) buf(b []byte) memory.Buffer {
	if c.mapped.Len() == 0 || len(b) == 0 {
		return memory.HostBuffer(b)
	}
	return c.mapped.View(b)
}

func (c *conn) sendFail(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		return &transport.PeerError{Peer: c.peer, Op: "send", Err: err}
	}
	return c.peerErr("send", err)
}

// push queues a slice on the next socket in turn.
func (c *conn) push(tag transport.Tag, data []byte, slot int) error {
	if tag.Slice&wire.SliceLent != 0 {
		return fmt.Errorf("tcp: slice number %#x is beyond the %#x slices a message may have", tag.Slice, wire.SliceLent-1)
	}
	j := job{data: data, slot: slot, credit: c.counted(len(data))}
	h := wire.SliceHeader{Op: tag.Op, Sig: tag.Sig, Msg: tag.Msg, Slice: tag.Slice, Size: uint32(len(data))}
	h.Put(j.hdr[:])
	s := c.socks[c.sendSeq%uint64(len(c.socks))]
	c.sendSeq++
	// A slice held back was not its operation's last: it goes, lent.
	c.letGo(true)
	if c.mayGather(len(data)) {
		taken, first, wrote := s.gather(j.hdr[:], data)
		if taken {
			if slot >= 0 {
				c.free = append(c.free, slot) // copied
			}
			switch {
			case wrote:
				c.ob.dropGathering(s)
				if n, err := s.pending(); err != nil {
					return c.peerErr("send", err)
				} else if n > 0 {
					c.ob.list(s)
				}
			case first:
				c.ob.addGathering(s)
			}
			return nil
		}
	}
	if c.ob.gather.n.Load() > 0 {
		// Slices gathered on the channel's other sockets go now too: the
		// receiver reads a connection's sockets in turn, and this one's
		// would wait behind them.
		c.ob.flushGathering()
	}
	if c.lendOp && slot < 0 && j.credit > 0 && c.mapped.Len() == 0 && s.lendReady() {
		// The caller's memory, counted: its pages may go out themselves.
		// It is held back until the connection knows whether more
		// follow, since lending the last slice of an operation would
		// have Flush wait for the receiver to read all of it.
		j.lend, j.held = true, true
	}
	if err := s.push(j); err != nil {
		return c.peerErr("send", err) // the connection has failed: nothing is held
	}
	if j.held {
		c.held = s
	}
	return nil
}

func (c *conn) Post(n int, tag transport.Tag) error {
	i := c.cur
	if i < 0 || n > len(c.bufs[i]) {
		return fmt.Errorf("tcp: post of %d bytes without a matching reserve", n)
	}
	c.cur = -1
	return c.push(tag, c.bufs[i][:n], i)
}

// PostFrom implements transport.DirectSender.
func (c *conn) PostFrom(_ context.Context, src memory.Buffer, tag transport.Tag) error {
	if src.Len() > c.e.o.SlotSize {
		return fmt.Errorf("tcp: post of %d bytes, slots hold %d", src.Len(), c.e.o.SlotSize)
	}
	return c.push(tag, src.Bytes(), -1)
}

// Flush implements transport.Flusher. A slice held back is the
// operation's last: it is copied, so that the sender can go on while the
// receiver reads it. Once every slice is in the kernel, Flush waits for
// the credit of the last slice lent, if any: until the receiver has read
// it, the kernel still reads the caller's pages.
func (c *conn) Flush(ctx context.Context) error {
	c.lendOp = c.lendsAll() // the operation ends
	if c.flushed() {
		return nil
	}
	c.letGo(false)
	if err := c.flushQueued(ctx); err != nil {
		return err
	}
	return c.awaitLent(ctx)
}

// slicesLent counts the slices this process has lent (SlicesLent).
var slicesLent atomic.Int64

// SlicesLent returns how many slices this process has sent out of its
// callers' own pages (Options.Lend), for tests and diagnostics.
func SlicesLent() int64 { return slicesLent.Load() }

// Where LendAuto lends: broadcasts of less than lendAutoMax2 bytes on 2
// ranks, broadcasts and all-gathers of at least lendAutoMin on more.
// Alternated over loopback (docs/performance.md, "Lent pages"), lending
// took the 2-rank broadcast of 1 MiB in place to 0.70 of the copies'
// time and of 16 MiB to 0.90, and broadcasts and all-gathers of 16 and
// 64 MiB on 4 ranks to 0.71-0.93. It lost where the receiver sets the
// pace: a 2-rank broadcast in place of 32 or 64 MiB took 1.11-1.27
// times as long (the receiver copies out of the root's pages in memory
// instead of the socket's buffers in cache, and the root, with nothing
// to copy, waits), the 4-rank broadcast of 1 MiB 1.1 (a chain's middle
// rank receives and lends, and each operation's end waits for its
// successor to read), and reductions at every size (the reducing
// receiver sets the pace, and copying let its senders run ahead). The
// 2-rank all-gather, where both ranks send and receive at once, took
// 1.2-1.6 times the copies' time at 1 and 2 MiB and was level at 4-16
// MiB (docs/performance.md, "The 2-rank all-gather over TCP, lent").
const (
	lendAutoMax2 = 32 << 20
	lendAutoMin  = 16 << 20
)

// LendFor implements transport.PageLender.
func (c *conn) LendFor(opBytes int64, nranks int, lands, exchange bool) {
	c.lendOp = c.lendsAll() || c.lends && c.e.o.Lend == LendAuto && lands &&
		(nranks == 2 && !exchange && opBytes < lendAutoMax2 || nranks > 2 && opBytes >= lendAutoMin)
}

// lendsAll: every counted slice from the caller's memory is lent
// (LendOn), whatever the operation.
func (c *conn) lendsAll() bool { return c.lends && c.e.o.Lend == LendOn }

// letGo lets the slice held back go: lent, or copied (the last of its
// operation, which Flush then need not wait for the receiver to read, so
// the sender goes on while the receiver reads it). On 2 ranks over
// loopback a 1 MiB broadcast took 128-146 µs an operation in place with
// every slice lent, 109-132 with the last one copied, and 151-162 with
// every slice copied (docs/performance.md, "Lent pages").
func (c *conn) letGo(lend bool) {
	s := c.held
	if s == nil {
		return
	}
	c.held = nil
	s.wmu.Lock()
	if len(s.queue) == 0 || !s.queue[len(s.queue)-1].held {
		s.wmu.Unlock() // not where push left it: nothing to let go
		return
	}
	j := &s.queue[len(s.queue)-1]
	j.held = false
	if lend {
		slicesLent.Add(1)
		c.cr.lent = j.credit
		// Flag it so that the receiver credits it as soon as it is read
		// (it is unwritten yet: held jobs are not pumped).
		h, _, _ := wire.ParseSliceHeader(j.hdr[:])
		h.Slice |= wire.SliceLent
		h.Put(j.hdr[:])
	} else {
		j.lend = false
	}
	s.pumpLocked()
	s.wmu.Unlock()
}

// flushQueued waits until every slice queued on the connection is in the
// kernel.
func (c *conn) flushQueued(ctx context.Context) error {
	if c.cr.ctl != nil {
		c.cr.ctl.pump() // a credit the kernel did not take at once
	}
	done := func() (int, bool, error) {
		for _, s := range c.socks {
			n, err := s.pending()
			if err != nil {
				return 0, true, err
			}
			if n > 0 {
				return 0, false, nil
			}
		}
		return 0, true, nil
	}
	if _, ok, err := done(); ok && err == nil {
		return nil
	}
	if _, err := c.ob.wait(ctx, -1, 0, c.e.o, done); err != nil {
		return c.sendFail(ctx, err)
	}
	return nil
}

// flushed reports, without a lock, that none of the connection's sockets
// (data or control) has a slice waiting, the last slice lent has been
// credited, and neither the channel nor a data socket has met a write
// error. A socket with a slice left in its queue is in the channel's
// outbox (listed) until a pump empties it, so this may only say no
// where the locked check would say yes. Flush runs after every
// operation on each of its connections: the locked check there, a lock
// pair on each of 4 data sockets and the control socket per peer, was
// a tenth of the 4-rank 8-byte reduce's CPU over TCP
// (docs/performance.md, "Flush without locks").
func (c *conn) flushed() bool {
	if c.ob.err != nil || c.cr.got < c.cr.lent || (c.cr.ctl != nil && c.cr.ctl.listed) {
		return false
	}
	for _, s := range c.socks {
		if s.listed || s.failed.Load() {
			return false
		}
	}
	return true
}

// header reads the next slice's header.
func (c *conn) header(ctx context.Context) (*sock, wire.SliceHeader, error) {
	s := c.socks[c.recvSeq%uint64(len(c.socks))]
	hb, err := s.next(ctx, wire.SliceHeaderLen, nil)
	if err != nil {
		return s, wire.SliceHeader{}, c.recvErr(ctx, err)
	}
	h, _, _ := wire.ParseSliceHeader(hb)
	if h.Op == wire.AbortOp && int(h.Size) <= wire.MaxString {
		reason := "no reason given"
		if b, err := s.next(ctx, int(h.Size), nil); err == nil && len(b) > 0 {
			reason = string(b)
		}
		c.gone = &transport.PeerAbortedError{Peer: c.peer, Cause: errors.New(reason)}
		return s, h, &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.gone}
	}
	if h.Op == wire.CloseOp && h.Size == 0 {
		c.gone = transport.ErrPeerClosed
		return s, h, &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.gone}
	}
	if int(h.Size) > c.e.o.SlotSize {
		err := fmt.Errorf("protocol error: rank %d sent a %d-byte slice, the limit is %d (different GOCCL slot settings?)", c.peer, h.Size, c.e.o.SlotSize)
		return s, h, &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	return s, h, nil
}

func tagOf(h wire.SliceHeader) transport.Tag {
	return transport.Tag{Op: h.Op, Sig: h.Sig, Msg: h.Msg, Slice: h.Slice &^ wire.SliceLent}
}

func (c *conn) Wait(ctx context.Context) (memory.Buffer, transport.Tag, error) {
	s, h, err := c.header(ctx)
	if err != nil {
		return memory.Buffer{}, transport.Tag{}, err
	}
	var dst []byte
	if int(h.Size) > readBufSize || c.mapped.Len() > 0 {
		// Large payloads, and every payload of a device connection (its
		// kernels read only registered memory), land in the landing buffer.
		if cap(c.land) < int(h.Size) {
			c.land = make([]byte, c.e.o.SlotSize)
		}
		dst = c.land
	}
	b, err := s.next(ctx, int(h.Size), dst)
	if err != nil {
		return memory.Buffer{}, transport.Tag{}, c.recvErr(ctx, err)
	}
	c.recvSeq++
	c.read(int(h.Size), h.Slice&wire.SliceLent != 0)
	c.holding = true
	return c.buf(b), tagOf(h), nil
}

// WaitInto implements transport.DirectReceiver: the payload goes from the
// socket straight into dst.
func (c *conn) WaitInto(ctx context.Context, dst memory.Buffer) (transport.Tag, int, error) {
	b := dst.Bytes()
	spilled, err := c.socks[c.recvSeq%uint64(len(c.socks))].headerSpill(ctx, b)
	if err != nil {
		return transport.Tag{}, 0, c.recvErr(ctx, err)
	}
	s, h, err := c.header(ctx)
	if err != nil {
		return transport.Tag{}, 0, err
	}
	if int(h.Size) != dst.Len() {
		return tagOf(h), int(h.Size), &transport.PeerError{Peer: c.peer, Op: "recv", Err: transport.ErrSizeMismatch}
	}
	if n := int(h.Size); n > spilled {
		if _, err := s.next(ctx, n-spilled, b[spilled:]); err != nil {
			return transport.Tag{}, 0, c.recvErr(ctx, err)
		}
	}
	c.recvSeq++
	c.read(int(h.Size), h.Slice&wire.SliceLent != 0)
	return tagOf(h), int(h.Size), nil
}

func (c *conn) recvErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		return &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	return c.peerErr("recv", err)
}

func (c *conn) Release() error {
	if !c.holding {
		return errors.New("tcp: release without a matching wait")
	}
	c.holding = false
	return nil
}
