package handshake

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"
)

// Admission says what an accept loop does with a new connection.
type Admission int

const (
	Serve Admission = iota // hand it to serve
	Drop                   // close it and go on
	Stop                   // close it and stop accepting (the owner is closing)
)

// Limits on the connections a listener lets authenticate at once, so
// that strangers can neither exhaust file descriptors nor keep a job's
// ranks out (issue 19: 128 silent connections from a stranger, held for
// the setup timeout, used to refuse every newcomer and stop the job).
const (
	// MaxPending caps the connections still authenticating; when it is
	// reached the oldest of them is closed to make room, not the newcomer.
	MaxPending = 128
	// MaxPendingPerSource caps those of one source address (TCP): its own
	// oldest makes room for a newcomer from it, so one host's strangers
	// hold at most this many of the slots.
	MaxPendingPerSource = 32
	// HelloTimeout is how long a new connection has to send its hello:
	// a rank sends it at once, a silent stranger is closed soon.
	HelloTimeout = time.Second
	// ResponseTimeout is how long, after its hello, a connection has to
	// send its response and first frame: a round trip for a rank, so
	// that connections past the hello (which no newcomer evicts, since
	// their dialers would not retry) cannot pile up either.
	ResponseTimeout = 3 * time.Second
)

// Pending is the table of a listener's connections that have not sent a
// valid hello yet, in arrival order: a rank sends its hello at once, so
// a connection stays here for a moment, and one evicted here is one whose
// dialer retries. Its owner guards it with its own lock, and takes a
// connection out once its hello has come.
type Pending struct {
	conns    map[net.Conn]pendingConn
	bySource map[string]int
	seq      uint64
}

type pendingConn struct {
	seq    uint64
	source string // "" where the address says nothing (Unix sockets)
}

// sourceOf is the part of c's remote address that names its sender: the
// IP of a TCP peer, its /64 for IPv6 (a host may hold a whole /64 and use
// a new address for every connection).
func sourceOf(c net.Conn) string {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	if a.IP.To4() == nil && len(a.IP) == net.IPv6len {
		return a.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return a.IP.String()
}

// Admit files c and returns the connection to close to make room for it
// (nil if none): the oldest of c's source once that source has
// MaxPendingPerSource pending, else the oldest of all once MaxPending are.
func (p *Pending) Admit(c net.Conn) (evict net.Conn) {
	if p.conns == nil {
		p.conns, p.bySource = map[net.Conn]pendingConn{}, map[string]int{}
	}
	src := sourceOf(c)
	switch {
	case src != "" && p.bySource[src] >= MaxPendingPerSource:
		evict = p.oldest(func(pc pendingConn) bool { return pc.source == src })
	case len(p.conns) >= MaxPending:
		evict = p.oldest(func(pendingConn) bool { return true })
	}
	if evict != nil {
		p.Remove(evict)
	}
	p.seq++
	p.conns[c] = pendingConn{seq: p.seq, source: src}
	if src != "" {
		p.bySource[src]++
	}
	return evict
}

func (p *Pending) oldest(match func(pendingConn) bool) net.Conn {
	var o net.Conn
	var seq uint64
	for c, pc := range p.conns {
		if match(pc) && (o == nil || pc.seq < seq) {
			o, seq = c, pc.seq
		}
	}
	return o
}

// Remove takes c out of the table (done authenticating, or gone).
func (p *Pending) Remove(c net.Conn) {
	pc, ok := p.conns[c]
	if !ok {
		return
	}
	delete(p.conns, c)
	if pc.source != "" {
		if p.bySource[pc.source]--; p.bySource[pc.source] <= 0 {
			delete(p.bySource, pc.source)
		}
	}
}

// Has reports whether c is in the table.
func (p *Pending) Has(c net.Conn) bool { _, ok := p.conns[c]; return ok }

// Len is the number of connections in the table.
func (p *Pending) Len() int { return len(p.conns) }

// All returns the connections in the table.
func (p *Pending) All() []net.Conn {
	out := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

// AcceptLoop accepts connections on ln until ln is closed. Other accept
// errors (out of file descriptors and the like) go to onError, and the
// loop keeps accepting once the condition passes, backing off up to a
// second, rather than leaving a listener that accepts nothing. admit
// decides what happens to each connection; serve gets those admitted and
// must not block (it starts the goroutine that authenticates them).
func AcceptLoop(ln net.Listener, onError func(error), admit func(net.Conn) Admission, serve func(net.Conn)) {
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			onError(fmt.Errorf("accept: %w", err))
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		switch admit(c) {
		case Serve:
			serve(c)
		case Drop:
			c.Close()
		case Stop:
			c.Close()
			return
		}
	}
}

// Admit is the admission of an endpoint that keeps the connections still
// authenticating in pending: Stop once it is closing, else Serve, with c
// filed in pending and, when that made room, the connection it evicted
// closed (its setup then fails and ends). The caller holds the lock that
// guards closed and pending.
func Admit(closed bool, pending *Pending, c net.Conn) Admission {
	if closed {
		return Stop
	}
	if old := pending.Admit(c); old != nil {
		old.Close()
	}
	return Serve
}

// DropLog counts refused connections and logs the first few, then one in
// a hundred, so that a stranger hammering a port cannot flood the log.
type DropLog struct{ n atomic.Int64 }

// Log counts one refusal and logs msg with args and the count so far, if
// this one is due.
func (d *DropLog) Log(log *slog.Logger, msg string, args ...any) {
	n := d.n.Add(1)
	if n > 5 && n%100 != 0 {
		return
	}
	log.Warn(msg, append(args, "dropped so far", n)...)
}
