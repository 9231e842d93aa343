// Package connsetup is the setup path every transport between processes
// shares (tcp, shm, verbs): the accepting side's loop, admission,
// authentication, connection setup and acknowledgement, the dialing
// side's retries, and the table where connections wait for the Connect
// that asks for them. What a transport does once a connection is set up
// (TLS for TCP's sockets, handing over a segment's descriptor for shared
// memory, trading queue pairs for RDMA) is its own, in the Serve and Then
// functions it passes.
//
// Every connection proves knowledge of the job's secret first (package
// handshake); its first frame, a wire.ConnSetup saying which ranks and
// channel it joins, is covered by the proof, checked by the transport, and
// echoed back as the acknowledgement, or refused with a reason the dialer
// reports.
package connsetup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// Acceptor accepts a transport's incoming connections.
type Acceptor struct {
	Name    string // the transport, for logs: "tcp", "shm", "verbs"
	Rank    int
	Secret  []byte
	Purpose wire.Purpose
	Timeout time.Duration // for a connection to authenticate and be set up
	Log     *slog.Logger
	// Vet, if set, looks at a connection before anything is read from it
	// (the peer's credentials on a Unix socket); an error closes it, and
	// is logged as a drop.
	Vet func(net.Conn) error
	// Check decides whether a connection setup is acceptable here; its
	// error is sent to the dialer as the refusal.
	Check func(wire.ConnSetup) error
	// Serve continues with a connection that is authenticated, checked
	// and acknowledged, under the setup deadline, which it clears if it
	// keeps the connection. It returns whether it kept the connection;
	// otherwise the acceptor closes it. Errors it logs with Drop.
	Serve func(c net.Conn, s wire.ConnSetup) (kept bool)
	// Arriving, if set, learns of each connection from its acknowledgement
	// until Serve returns (Pending.Expect): the dialer may send on it and
	// leave in that time, and a Connect whose wait the peer's leaving cut
	// short still collects it.
	Arriving interface{ Expect(Key) (settle func()) }

	lns     []net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	setup   handshake.Pending // authenticating
	serving map[net.Conn]struct{}
	closed  bool
	drops   handshake.DropLog
	started bool
}

// Start accepts on every listener given (one per network interface an
// endpoint listens on) until Close. The acceptor owns them.
func (a *Acceptor) Start(lns ...net.Listener) {
	a.lns, a.serving, a.started = lns, map[net.Conn]struct{}{}, true
	if a.Log == nil {
		a.Log = slog.Default()
	}
	for _, ln := range lns {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			handshake.AcceptLoop(ln, func(err error) { a.Drop(nil, err) }, a.admit, func(c net.Conn) { go a.serve(c) })
		}()
	}
}

func (a *Acceptor) admit(c net.Conn) handshake.Admission {
	a.mu.Lock()
	defer a.mu.Unlock()
	adm := handshake.Admit(a.closed, &a.setup, c)
	if adm == handshake.Serve {
		a.serving[c] = struct{}{}
		a.wg.Add(1)
	}
	return adm
}

// Drop logs a refused connection (sampled: a stranger hammering a port
// cannot flood the log).
func (a *Acceptor) Drop(c net.Conn, err error) {
	from := ""
	if c != nil && c.RemoteAddr() != nil {
		from = c.RemoteAddr().String()
	}
	a.drops.Log(a.Log, "goccl: "+a.Name+" transport dropped a connection", "rank", a.Rank, "from", from, "err", err)
}

// Reject refuses c with err as the reason, and logs it.
func (a *Acceptor) Reject(c net.Conn, err error) {
	handshake.Reject(c, err.Error())
	a.Drop(c, err)
}

func (a *Acceptor) serve(c net.Conn) {
	defer a.wg.Done()
	kept := false
	defer func() {
		a.mu.Lock()
		a.setup.Remove(c)
		delete(a.serving, c)
		a.mu.Unlock()
		if !kept {
			c.Close()
		}
	}()
	if a.Vet != nil {
		if err := a.Vet(c); err != nil {
			a.Drop(c, err)
			return
		}
	}
	start := time.Now()
	c.SetDeadline(start.Add(min(handshake.HelloTimeout, a.Timeout)))
	_, typ, payload, err := handshake.Server(c, a.Secret, a.Purpose, 64, func() {
		// A valid hello: the dialer is past the point where it would
		// retry an eviction, so it leaves the table that newcomers evict
		// from, and has the short ResponseTimeout to prove itself.
		a.mu.Lock()
		a.setup.Remove(c)
		a.mu.Unlock()
		c.SetDeadline(time.Now().Add(min(handshake.ResponseTimeout, a.Timeout)))
	})
	c.SetDeadline(start.Add(a.Timeout))
	if err != nil {
		a.Drop(c, err)
		return
	}
	if typ != wire.FrameConnSetup {
		a.Reject(c, fmt.Errorf("expected a connection setup, got a %v frame", typ))
		return
	}
	s, _, err := wire.ParseConnSetup(payload)
	if err == nil {
		err = a.Check(s)
	}
	if err != nil {
		a.Reject(c, err)
		return
	}
	if a.Arriving != nil {
		defer a.Arriving.Expect(Key{Peer: int(s.From), Ch: int(s.Channel)})()
	}
	if err := handshake.WriteFrame(c, wire.FrameConnSetup, payload); err != nil {
		a.Drop(c, fmt.Errorf("acknowledging a connection of rank %d: %w", s.From, err))
		return
	}
	kept = a.Serve(c, s)
}

// SettingUp is how many connections are being set up now.
func (a *Acceptor) SettingUp() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.serving)
}

// Close stops accepting, closes the connections still being set up (a
// stranger mid-handshake must not hold Close up) and waits for the
// setups in progress.
func (a *Acceptor) Close() {
	if !a.started {
		return
	}
	a.mu.Lock()
	a.closed = true
	for _, ln := range a.lns {
		ln.Close()
	}
	for c := range a.serving {
		c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// Dialer opens a transport's outgoing connections.
type Dialer struct {
	Network string // "tcp", "unix"
	Secret  []byte
	Purpose wire.Purpose
	Timeout time.Duration
	// Done ends the retries (the endpoint is closing).
	Done <-chan struct{}
	// ListenersUp: every peer's listener was up before this end learned
	// its address (the bootstrap announces a rank once its listeners
	// are), so a refused connection means the peer's endpoint has closed
	// (it exited or closed its communicator) and Dial fails at once
	// instead of retrying until its context ends.
	ListenersUp bool
	// Control, if set, is the net.Dialer's: it sets a socket up between
	// socket(2) and connect(2).
	Control func(network, address string, c syscall.RawConn) error
}

// Permanent marks an error of a Then function that retrying will not
// cure (a refused certificate).
func Permanent(err error) error { return &permanentError{err} }

type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Dial connects to addr and sets the connection up as s says: it
// authenticates, sends s, waits for the acknowledgement, then runs then
// (if set) under the same deadline. It retries, backing off up to half a
// second, while the peer's listener is not up yet or an attempt fails on
// the way, until ctx ends; a wrong secret, a refusal and a permanent
// error of then end it at once, and so does a listener that is not there
// (connection refused) when d.ListenersUp.
func (d *Dialer) Dial(ctx context.Context, addr string, s wire.ConnSetup, then func(c net.Conn) error) (net.Conn, error) {
	backoff := 5 * time.Millisecond
	for {
		nd := net.Dialer{Timeout: d.Timeout, Control: d.Control}
		c, err := nd.DialContext(ctx, d.Network, addr)
		if d.ListenersUp && errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: nothing listens at %s any more (the peer closed its communicator or exited)", err, addr)
		}
		if err == nil {
			err = handshake.Bounded(ctx, c, d.Timeout, func() error {
				if err := handshake.Client(c, d.Secret, d.Purpose, func() (wire.FrameType, []byte) {
					return wire.FrameConnSetup, s.Append(nil)
				}); err != nil {
					return err
				}
				if err := ExpectAck(c); err != nil {
					return err
				}
				if then != nil {
					return then(c)
				}
				return nil
			})
			if err == nil {
				return c, nil
			}
			c.Close()
			var rej *handshake.RejectedError
			var perm *permanentError
			if errors.Is(err, handshake.ErrAuth) || errors.As(err, &rej) && !rej.Unproven || errors.As(err, &perm) || ctx.Err() != nil {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", err, context.Cause(ctx))
		case <-d.Done:
			return nil, transport.ErrClosed
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// ExpectAck reads the peer's acknowledgement of a setup step (an echo of
// the ConnSetup), or its refusal.
func ExpectAck(c net.Conn) error {
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

// Key names a connection: the peer and the channel.
type Key struct{ Peer, Ch int }

// Pending holds connections a peer set up before this rank's Connect
// asked for them.
type Pending[V any] struct {
	mu     sync.Mutex
	m      map[Key]*slot[V]
	closed bool
}

type slot[V any] struct {
	v     V
	set   bool
	ready chan struct{}
	// coming counts the connections for this key acknowledged and not
	// yet through Serve (Expect); settled closes when it drops to zero.
	coming  int
	settled chan struct{}
}

func (p *Pending[V]) slotLocked(k Key) *slot[V] {
	if p.m == nil {
		p.m = map[Key]*slot[V]{}
	}
	s := p.m[k]
	if s == nil {
		s = &slot[V]{ready: make(chan struct{})}
		p.m[k] = s
	}
	return s
}

// Has reports whether a connection for k was delivered and not yet
// collected.
func (p *Pending[V]) Has(k Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.m[k]
	return s != nil && s.set
}

// Deliver files v for k; false if one was already delivered or the table
// is closed (the caller then disposes of v).
func (p *Pending[V]) Deliver(k Key, v V) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.slotLocked(k)
	if s.set || p.closed {
		return false
	}
	s.v, s.set = v, true
	close(s.ready)
	return true
}

// Expect notes that a connection for k has been acknowledged and is on
// its way here (Acceptor.Arriving): until settle is called, an Await
// whose context ends waits for it instead of reporting it missing. The
// acceptor calls settle once Serve returns, which is within its setup
// deadline.
func (p *Pending[V]) Expect(k Key) (settle func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.slotLocked(k)
	if s.coming == 0 {
		s.settled = make(chan struct{})
	}
	s.coming++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if s.coming--; s.coming == 0 {
				close(s.settled)
			}
		})
	}
}

// Await waits for k's connection and collects it, until ctx ends or done
// closes. One that has arrived, or was acknowledged and is still being
// set up (Expect), is collected even when ctx has ended: a peer may have
// sent on it, then left.
func (p *Pending[V]) Await(ctx context.Context, k Key, done <-chan struct{}) (V, error) {
	p.mu.Lock()
	s := p.slotLocked(k)
	p.mu.Unlock()
	var zero V
	select {
	case <-s.ready: // arrived already
	default:
		select {
		case <-s.ready:
		case <-ctx.Done():
			arrived, err := p.settles(s, done)
			if err != nil {
				return zero, err
			}
			if !arrived {
				return zero, fmt.Errorf("waiting for rank %d to connect (channel %d): %w", k.Peer, k.Ch, context.Cause(ctx))
			}
		case <-done:
			return zero, transport.ErrClosed
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return zero, transport.ErrClosed // Close disposes of it
	}
	delete(p.m, k)
	return s.v, nil
}

// settles waits for the connections of s that are still being set up
// (Expect) and reports whether one arrived; ErrClosed if done closes.
func (p *Pending[V]) settles(s *slot[V], done <-chan struct{}) (bool, error) {
	p.mu.Lock()
	coming, settled := s.coming > 0, s.settled
	p.mu.Unlock()
	if coming {
		select {
		case <-s.ready:
		case <-settled:
		case <-done:
			return false, transport.ErrClosed
		}
	}
	select { // Serve delivers before the acceptor settles
	case <-s.ready:
		return true, nil
	default:
		return false, nil
	}
}

// Close closes the table and returns what was delivered and never
// collected, for the caller to dispose of.
func (p *Pending[V]) Close() []V {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var out []V
	for _, s := range p.m {
		if s.set {
			out = append(out, s.v)
		}
	}
	return out
}
