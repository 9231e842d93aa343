package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/internal/connsetup"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Endpoint is one rank's RDMA transport: one device port, and per
// connection a control socket, queue pairs and registered memory.
type Endpoint struct {
	o    Options
	log  *slog.Logger
	port *Port
	mrs  *mrCache
	wg   sync.WaitGroup // the event watcher
	// How device operations move (gdr.go), why, whether received device
	// slots are flushed, and how many flush reads were made.
	gdr     gdrMode
	gdrWhy  string
	flush   bool
	flushes atomic.Uint64

	acc     connsetup.Acceptor
	dialer  connsetup.Dialer
	pending connsetup.Pending[*conn] // established by a lower rank, not yet collected

	mu    sync.Mutex // guards the fields below
	conns map[connKey]*conn
	byQPN map[uint32]*conn
	chans map[connKey]*chanSet // by channel (peer -1), by connection on Independent channels
	board *board               // see JoinBoard
	// leftovers free connections' memory a call still held when Close
	// tore them down; a later Close calls them.
	leftovers []func()
	closed    bool
	cause     error
	done      chan struct{}
	closing   chan struct{}
}

type connKey struct{ peer, ch int }

// chanSet is a channel's connections: a wait on one clears the others'
// peers to send (see conn.release).
type chanSet struct {
	mu    sync.Mutex
	conns []*conn
}

var _ transport.Endpoint = (*Endpoint)(nil)

// New opens the device port o.HCA selects and starts accepting the
// peers' control connections.
func New(o Options) (*Endpoint, error) {
	switch {
	case o.NRanks < 1 || o.Rank < 0 || o.Rank >= o.NRanks || len(o.Peers) != o.NRanks:
		return nil, fmt.Errorf("verbs: rank %d of %d with %d peer addresses", o.Rank, o.NRanks, len(o.Peers))
	case o.Listener == nil:
		return nil, errors.New("verbs: no listener")
	case o.Provider == nil && o.Port == nil:
		return nil, errors.New("verbs: no device provider")
	}
	if o.QPs == 0 {
		o.QPs = 1
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
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = DefaultRetryCnt
	}
	switch {
	case o.QPs < 1 || o.QPs > wire.MaxQPs:
		return nil, fmt.Errorf("verbs: %d queue pairs per connection (GOCCL_IB_QPS_PER_CONNECTION: 1 to %d)", o.QPs, wire.MaxQPs)
	case o.Slots < 2 || o.Slots > 256 || o.SlotSize < 64 || o.SlotSize > 1<<30:
		return nil, fmt.Errorf("verbs: need 2..256 slots of 64 bytes to 1 GiB: %d slots of %d", o.Slots, o.SlotSize)
	case o.Timeout > 31 || o.RetryCnt > 7:
		return nil, fmt.Errorf("verbs: timeout %d (≤ 31), retry count %d (≤ 7)", o.Timeout, o.RetryCnt)
	}
	port := o.Port
	if port == nil {
		spec, err := ParseHCA(o.HCA)
		if err != nil {
			return nil, err
		}
		if port, err = OpenPort(o.Provider, spec, o.GIDIndex); err != nil {
			return nil, fmt.Errorf("verbs: %w", err)
		}
	}
	e := &Endpoint{o: o, log: o.Logger, port: port, mrs: newMRCache(port.Ctx), conns: map[connKey]*conn{}, byQPN: map[uint32]*conn{}, chans: map[connKey]*chanSet{},
		done: make(chan struct{}), closing: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.chooseDevicePath()
	e.acc = connsetup.Acceptor{Name: "verbs", Rank: o.Rank, Secret: o.Secret, Purpose: wire.PurposeVerbs, Timeout: setupTimeout,
		Log: e.log, Check: e.checkSetup, Serve: e.serveIncoming, Arriving: &e.pending}
	e.dialer = connsetup.Dialer{Network: "tcp", Secret: o.Secret, Purpose: wire.PurposeVerbs, Timeout: setupTimeout, Done: e.done, ListenersUp: o.ListenersUp}
	e.acc.Start(o.Listener)
	if es, ok := port.Ctx.(ibv.EventSource); ok {
		e.wg.Add(1)
		go e.watchEvents(es)
	}
	return e, nil
}

// qpsFor is the number of queue pairs of a connection on channel ch.
func (e *Endpoint) qpsFor(ch int) int {
	if ch == boardChannel {
		return 1
	}
	return e.o.QPs
}

// Port is the device port the endpoint uses.
func (e *Endpoint) Port() *Port { return e.port }

// Caps implements transport.Endpoint.
func (e *Endpoint) Caps() transport.Caps {
	c := transport.Caps{Slots: e.o.Slots, SlotSize: e.o.SlotSize, Memory: memory.Host}
	switch {
	case e.gdr.direct():
		c.DeviceSlots = memory.Device
	case e.gdr == gdrStaged:
		c.DeviceSlots = memory.Mapped
	}
	return c
}

// DevicePath says how device operations move over this endpoint, and why
// (for the INFO summary): GPUDirect RDMA and how memory is registered, or
// staging through host memory and why not GPUDirect.
func (e *Endpoint) DevicePath() string {
	switch {
	case e.gdr.direct() && e.flush:
		return e.gdr.String() + ", with a flush read per slot (compute capability below 9.0)"
	case e.gdr.direct():
		return e.gdr.String()
	}
	return e.gdr.String() + ": " + e.gdrWhy
}

// serveIncoming makes the connection a lower rank set up, on its control
// socket, and files it for Connect. The connection is made here, not in
// Connect: the dialer's Connect must not wait on what this rank's
// channels happen to connect first.
func (e *Endpoint) serveIncoming(c net.Conn, s wire.ConnSetup) bool {
	vc, err := newConn(e, int(s.From), int(s.Channel), c)
	if err != nil {
		e.acc.Reject(c, err)
		return false
	}
	if err := vc.establish(false); err != nil {
		e.acc.Drop(c, fmt.Errorf("connecting the queue pairs of rank %d (channel %d): %w", s.From, s.Channel, err))
		vc.teardown()
		return true // teardown closed it
	}
	c.SetDeadline(time.Time{})
	k := connsetup.Key{Peer: int(s.From), Ch: int(s.Channel)}
	if !e.pending.Deliver(k, vc) {
		e.acc.Drop(c, fmt.Errorf("a second connection from rank %d on channel %d", s.From, s.Channel))
		vc.teardown()
		return true
	}
	vc.watch()
	return true
}

func (e *Endpoint) checkSetup(s wire.ConnSetup) error {
	k := connKey{int(s.From), int(s.Channel)}
	e.mu.Lock()
	dup := e.conns[k] != nil
	e.mu.Unlock()
	switch {
	case !transport.ValidChannel(k.ch):
		return fmt.Errorf("no channel %d here", s.Channel)
	case dup || e.pending.Has(connsetup.Key{Peer: k.peer, Ch: k.ch}):
		return fmt.Errorf("connection from rank %d on channel %d already established", s.From, s.Channel)
	case s.Flags != 0:
		return fmt.Errorf("unknown connection flags %#x", s.Flags)
	case int(s.To) != e.o.Rank:
		return fmt.Errorf("connection meant for rank %d reached rank %d", s.To, e.o.Rank)
	case int(s.From) >= e.o.NRanks || int(s.From) >= e.o.Rank:
		return fmt.Errorf("rank %d may not dial rank %d (the lower rank of a pair dials)", s.From, e.o.Rank)
	case e.o.Peers[s.From] == "":
		return fmt.Errorf("rank %d is not an RDMA peer of rank %d", s.From, e.o.Rank)
	case int(s.NSocks) != e.qpsFor(int(s.Channel)):
		return fmt.Errorf("rank %d stripes a connection over %d queue pairs, rank %d over %d (set GOCCL_IB_QPS_PER_CONNECTION alike on every rank)", s.From, s.NSocks, e.o.Rank, e.qpsFor(int(s.Channel)))
	}
	return nil
}

// Connect implements transport.Endpoint.
func (e *Endpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	fail := func(err error) (transport.Conn, error) {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: err}
	}
	if peer < 0 || peer >= e.o.NRanks || peer == e.o.Rank {
		return fail(fmt.Errorf("no such peer for rank %d of %d", e.o.Rank, e.o.NRanks))
	}
	if e.o.Peers[peer] == "" {
		return fail(fmt.Errorf("rank %d is not reachable over RDMA", peer))
	}
	if ch >= transport.DeviceChannels && e.gdr == gdrNone {
		return fail(fmt.Errorf("verbs: a device channel on an endpoint that carries no device operations (%s)", e.gdrWhy))
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
	var c *conn
	var err error
	if e.o.Rank < peer {
		c, err = e.dial(ctx, peer, ch)
	} else {
		c, err = e.pending.Await(ctx, connsetup.Key{Peer: peer, Ch: ch}, e.done)
	}
	if err != nil {
		return fail(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		go c.close(e.cause)
		return nil, transport.ErrClosed
	}
	if old := e.conns[k]; old != nil { // a concurrent Connect won
		go c.close(nil)
		return old, nil
	}
	e.conns[k] = c
	for _, q := range c.qps {
		e.byQPN[q.Num()] = c
	}
	// The connections of an Independent channel are each driven by a
	// goroutine of their own: each is a set of one.
	sk := connKey{-1, ch}
	if transport.Independent(ch) {
		sk.peer = c.peer
	}
	set := e.chans[sk]
	if set == nil {
		set = &chanSet{}
		e.chans[sk] = set
	}
	set.mu.Lock()
	set.conns = append(set.conns, c)
	set.mu.Unlock()
	c.set = set
	return c, nil
}

// dial sets up the control connection to peer and makes the connection
// over it.
func (e *Endpoint) dial(ctx context.Context, peer, ch int) (*conn, error) {
	addr := e.o.Peers[peer]
	s := wire.ConnSetup{From: uint32(e.o.Rank), To: uint32(peer), Channel: uint32(ch), NSocks: uint16(e.qpsFor(ch))}
	c, err := e.dialer.Dial(ctx, addr, s, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to rank %d at %s: %w", peer, addr, err)
	}
	vc, err := newConn(e, peer, ch, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := handshake.Bounded(ctx, c, setupTimeout, func() error { return vc.establish(true) }); err != nil {
		vc.teardown()
		return nil, fmt.Errorf("connecting the queue pairs with rank %d: %w", peer, err)
	}
	vc.watch()
	return vc, nil
}

// expect reads one frame of type want (its payload into *payload when
// set), or the peer's refusal.
func expect(c net.Conn, want wire.FrameType, payload *[]byte) error {
	typ, p, err := handshake.ReadFrame(c, wire.MaxString+256)
	if err != nil {
		return err
	}
	if typ == wire.FrameReject {
		r, _, _ := wire.ParseReject(p)
		return &handshake.RejectedError{Reason: r.Reason}
	}
	if typ != want {
		return fmt.Errorf("expected a %v frame, got a %v frame", want, typ)
	}
	if payload != nil {
		*payload = p
	}
	return nil
}

// watchEvents fails the connections a fatal asynchronous event touches.
func (e *Endpoint) watchEvents(es ibv.EventSource) {
	defer e.wg.Done()
	for {
		select {
		case <-e.done:
			return
		default:
		}
		ev, ok, err := es.WaitEvent(100 * time.Millisecond)
		if err != nil {
			return
		}
		if !ok || !ev.Fatal() {
			continue
		}
		e.log.Warn("goccl: RDMA device event", "rank", e.o.Rank, "device", e.port.Device.Name, "event", ev.String())
		e.mu.Lock()
		var hit []*conn
		if c := e.byQPN[ev.QPNum]; c != nil && ev.QPNum != 0 {
			hit = append(hit, c)
		} else if ev.QPNum == 0 {
			for _, c := range e.conns {
				hit = append(hit, c)
			}
		}
		e.mu.Unlock()
		for _, c := range hit {
			c.failAsync(fmt.Errorf("device %s reported %v", e.port.Device.Name, ev))
		}
	}
}

// Close implements transport.Endpoint. A second Close waits for the
// first to finish, then frees the memory of connections whose slot a call
// still held when the first tore them down: the caller makes it once no
// call uses the endpoint (a communicator does, when its operations are
// done).
func (e *Endpoint) Close(cause error) error {
	e.mu.Lock()
	if e.closed {
		if cause != nil && e.cause == nil {
			e.cause = cause
		}
		e.mu.Unlock()
		<-e.closing
		e.mu.Lock()
		left := e.leftovers
		e.leftovers = nil
		e.mu.Unlock()
		for _, f := range left {
			f()
		}
		return nil
	}
	e.closed = true
	e.cause = cause
	close(e.done)
	conns := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	e.acc.Close()
	// Established, never collected: the peer has them.
	conns = append(conns, e.pending.Close()...)
	for _, c := range conns {
		c.close(cause)
	}
	e.wg.Wait()
	e.port.Ctx.Close()
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

// Control messages, after the QP exchange: one byte, and for an abort a
// length and the reason.
const (
	ctlReady = 'R' // queue pairs ready, receives posted
	ctlGone  = 'G' // closed gracefully: everything posted has landed
	ctlAbort = 'A'
)

func writeAbort(c net.Conn, reason string) {
	if len(reason) > wire.MaxString {
		reason = reason[:wire.MaxString]
	}
	b := []byte{ctlAbort, 0, 0}
	binary.BigEndian.PutUint16(b[1:], uint16(len(reason)))
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	c.Write(append(b, reason...))
}

func readAbort(r io.Reader) string {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "no reason given"
	}
	b := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(r, b); err != nil || len(b) == 0 {
		return "no reason given"
	}
	return string(b)
}
