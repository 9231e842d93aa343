// Package bootstrap brings the ranks of a job together: a root collects
// every rank's PeerInfo and hands the full table back, after which the
// ranks connect to each other directly (package transport/tcp).
//
// Every connection to the root is authenticated first (package
// handshake); a stranger with the wrong secret, garbage or a handshake
// cut short is logged and dropped and never disturbs the job. The root
// reports ranks that never arrive before the first waiting rank would give
// up (each rank says how long it will wait), so a missing rank is an
// error that names it, not a hang.
//
// With TLS (RootOptions.TLS, WithTLS), every connection to the root runs
// a TLS 1.3 handshake with crypto/tls first, both ends presenting
// certificates, and the authentication and everything after it travel
// inside TLS. A rank without TLS that reaches a root with it is refused
// with a reason in the clear.
//
// Goroutines: the root runs one accept loop and one goroutine per
// connection; all end when the root finishes (table sent, failure,
// timeout) or is closed. Join runs in its caller's goroutine.
package bootstrap

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/wire"
)

// Timeouts.
const (
	// HandshakeTimeout bounds how long a connection may take to
	// authenticate and register.
	HandshakeTimeout = 10 * time.Second
	// DefaultRootTimeout is how long a root serves when no rank says how
	// long it waits.
	DefaultRootTimeout = 5 * time.Minute
	// reportMargin is how much before the first waiting rank's deadline the
	// root reports missing ranks.
	reportMargin = 500 * time.Millisecond
	// MaxHandshakes caps the connections the root lets authenticate at
	// once; a newcomer beyond it closes the oldest of them (or of its own
	// source), as handshake.Pending does for the data listeners.
	MaxHandshakes = handshake.MaxPending
)

// RootOptions configures a root.
type RootOptions struct {
	Secret  []byte
	Version string        // the library version ranks must have
	Timeout time.Duration // how long to serve at most; 0 means DefaultRootTimeout
	Logger  *slog.Logger  // nil means slog.Default()
	// TLS, when set, makes every connection run TLS (as the server) before
	// anything else; it should require client certificates.
	TLS *tls.Config
	// Watch keeps every rank's connection after the table, as a failure
	// detector: a rank that aborts says so (Watch.Abort) and the root
	// tells every other rank; a rank whose connection closes without a
	// goodbye (Watch.Bye) has died, and the root tells the others that.
	// Every rank must then join with JoinWatch. The root serves until
	// every rank has said goodbye or gone, or until Close.
	Watch bool
	// Heartbeat, in watch mode, is how long a rank may leave the root's
	// pings unanswered before the root tells the others it stopped
	// responding (wire.Abort.Silent) and counts it out of a shrink; the
	// root pings every HeartbeatInterval of it. 0: no heartbeat. A rank's
	// library answers from a goroutine of its own, so a rank that is busy
	// computing answers, and one whose process is stopped, deadlocked in
	// the runtime or swapping does not.
	Heartbeat time.Duration
}

// HeartbeatInterval is how often a root with heartbeat timeout d pings
// every rank: five times per timeout, but not more often than every
// 100 ms nor less often than every 2 s (one small message each way per
// rank per 2 s of an idle job, at the default of 10 s).
func HeartbeatInterval(d time.Duration) time.Duration {
	return min(max(d/5, 100*time.Millisecond), 2*time.Second)
}

// Root serves one job's rendezvous.
type Root struct {
	ln   net.Listener
	opts RootOptions
	log  *slog.Logger
	done chan struct{}
	wg   sync.WaitGroup // accept loop and connection goroutines
	// quiet is closed once the heartbeat has nobody left to ping (every
	// rank gone, or Close): it ends at once, not at its next tick.
	quiet     chan struct{}
	quietOnce sync.Once

	drops handshake.DropLog // sampled: a stranger hammering the port cannot flood the log

	mu       sync.Mutex        // guards the fields below
	pending  handshake.Pending // connections still authenticating
	nranks   int
	regs     []*registration
	count    int
	report   *time.Timer // reports missing ranks at reportAt
	reportAt time.Time
	lifetime *time.Timer
	finished bool
	err      error
	conns    map[net.Conn]struct{} // open connections, closed on finish
	refused  int                   // connections dropped before registering
	lastDrop string                // the last one: from where, and why

	// Watch mode, after the table: which ranks said goodbye, aborted or
	// went away.
	watching bool
	left     []bool      // goodbye, abort or gone: no death notice for it
	heard    []time.Time // when each rank's last frame arrived (the heartbeat)
	pinging  []bool      // a ping to the rank is being written
	gone     int
	out      []bool                   // said goodbye or went away: not part of a shrink
	shrink   map[uint32]*registration // a shrink in progress: survivors' new registrations, by old rank
	diag     *diagRound               // a diagnosis being gathered (diagnose)
	rounds   uint32                   // diagnoses started
	stalled  bool                     // a stall's diagnosis went out: every rank aborts on it
	probed   time.Time                // when the last probe's round went out
	silenced []bool                   // reported (or being reported) as not responding
	asking   []bool                   // a where-query to the rank is being written
}

type registration struct {
	conn net.Conn
	info wire.PeerInfo
	from string
}

// StartRoot listens on addr ("host:port"; port 0 picks one; or "@name",
// an abstract Unix socket, for ranks that share this host's network
// namespace) and serves until every rank has registered and received the
// table, until it fails, or until Close.
func StartRoot(addr string, opts RootOptions) (*Root, error) {
	ln, err := net.Listen(network(addr), addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap root: %w", err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultRootTimeout
	}
	r := &Root{ln: ln, opts: opts, log: opts.Logger, done: make(chan struct{}), quiet: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.mu.Lock()
	r.lifetime = time.AfterFunc(opts.Timeout, func() {
		r.fail(fmt.Errorf("the root served for %v without every rank registering: %s", opts.Timeout, r.missing()))
	})
	r.mu.Unlock()
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr returns the address the root listens on.
func (r *Root) Addr() net.Addr { return r.ln.Addr() }

// Done is closed when the root has finished.
func (r *Root) Done() <-chan struct{} { return r.done }

// Err returns why the root failed (nil while running or after success).
func (r *Root) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close stops the root; ranks still waiting are told it closed. It waits
// for the root's goroutines and is idempotent.
func (r *Root) Close() error {
	r.fail(errors.New("the root was closed before every rank registered"))
	r.mu.Lock()
	r.watching = false // the connections end: the ranks just stop watching
	r.hush()
	for c := range r.conns {
		c.Close()
	}
	if g := r.diag; g != nil {
		if g.timer != nil {
			g.timer.Stop()
		}
		r.diag = nil // a diagnosis being gathered is dropped
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

func (r *Root) accept() {
	defer r.wg.Done()
	backoff := time.Millisecond
	for {
		c, err := r.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return // closed by finish
		}
		if err != nil {
			// Out of file descriptors and the like: keep serving once the
			// condition passes, rather than leaving a listener that
			// accepts nothing.
			r.log.Warn("goccl: bootstrap root cannot accept", "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		r.mu.Lock()
		if r.finished {
			r.mu.Unlock()
			c.Close()
			return
		}
		// Too many connections that have not authenticated: the oldest
		// (of this one's source, when it holds its share) makes room, so
		// that strangers can neither exhaust descriptors nor keep the
		// ranks out.
		if old := r.pending.Admit(c); old != nil {
			old.Close()
		}
		r.conns[c] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.handle(c)
	}
}

func (r *Root) drop(c net.Conn, why error) {
	r.drops.Log(r.log, "goccl: bootstrap root dropped a connection", "from", c.RemoteAddr().String(), "err", why)
	c.Close()
	r.mu.Lock()
	r.pending.Remove(c)
	delete(r.conns, c)
	r.refused++
	r.lastDrop = fmt.Sprintf("from %s: %v", c.RemoteAddr(), why)
	r.mu.Unlock()
}

// handle authenticates one connection and registers its rank.
func (r *Root) handle(raw net.Conn) {
	defer r.wg.Done()
	// A rank sends its hello (or its TLS ClientHello) at once: a silent
	// stranger gets HelloTimeout (the TLS handshake and the hello five
	// times that), its response ResponseTimeout.
	start := time.Now()
	hello := handshake.HelloTimeout
	if r.opts.TLS != nil {
		// The TLS handshake and the channel binding come first, on a root
		// that may run a hundred of them at once.
		hello *= 5
	}
	raw.SetDeadline(start.Add(min(hello, HandshakeTimeout)))
	c := raw
	if r.opts.TLS != nil {
		tc := tls.Server(raw, r.opts.TLS)
		if err := tc.Handshake(); err != nil {
			var rh tls.RecordHeaderError
			if errors.As(err, &rh) && rh.Conn != nil {
				// Not TLS at all: most likely a rank of this job without
				// the TLS settings. Say so in the clear.
				handshake.Reject(rh.Conn, "this job's root requires TLS: set GOCCL_TLS_CERT, GOCCL_TLS_KEY and GOCCL_TLS_CA on every rank")
			}
			r.drop(raw, fmt.Errorf("TLS: %w", err))
			return
		}
		// The secret's proof tied to this TLS session (a relay holding a
		// certificate of the job's CA runs one session with each end).
		if err := handshake.ConfirmTLS(tc, r.opts.Secret, tc.ConnectionState(), false); err != nil {
			r.drop(raw, fmt.Errorf("TLS: %w", err))
			return
		}
		c = tc
	}
	_, typ, payload, err := handshake.Server(c, r.opts.Secret, wire.PurposeBootstrap, wire.MaxTopology+4*wire.MaxString+64,
		func() {
			// Past the hello: out of the table newcomers evict from (see
			// handshake.Pending), with a short time to prove itself.
			r.mu.Lock()
			r.pending.Remove(raw)
			r.mu.Unlock()
			raw.SetDeadline(time.Now().Add(min(handshake.ResponseTimeout, HandshakeTimeout)))
		})
	r.mu.Lock()
	r.pending.Remove(raw)
	r.mu.Unlock()
	raw.SetDeadline(start.Add(HandshakeTimeout))
	if err != nil {
		r.drop(raw, err)
		return
	}
	if typ != wire.FramePeerInfo {
		r.drop(raw, fmt.Errorf("expected a registration, got a %v frame", typ))
		return
	}
	info, _, err := wire.ParsePeerInfo(payload)
	if err != nil {
		r.drop(raw, fmt.Errorf("malformed registration: %w", err))
		return
	}
	reg := &registration{conn: c, info: info, from: c.RemoteAddr().String()}
	if err := r.register(reg); err != nil {
		handshake.Reject(c, err.Error())
		r.drop(raw, err)
		return
	}
	// Registered: wait for the table without a deadline, but notice if the
	// rank goes away (its process died) before everyone has arrived; in
	// watch mode, keep reading its notices after the table.
	raw.SetDeadline(time.Time{})
	for {
		typ, payload, err := handshake.ReadFrame(c, wire.MaxFrame)
		r.mu.Lock()
		finished, watching := r.finished, r.watching
		if err == nil && r.heard != nil {
			r.heard[info.Rank] = time.Now()
		}
		r.mu.Unlock()
		if !finished {
			if err == nil {
				err = errors.New("sent data while waiting for the table")
			}
			r.fail(fmt.Errorf("rank %d (pid %d on %s) left before every rank had registered: %v", info.Rank, info.PID, info.HostID, err))
			return
		}
		if !watching {
			return
		}
		if err != nil {
			r.rankGone(int(info.Rank), fmt.Errorf("its connection to the root closed without a goodbye (%v): its process exited or was killed", err))
			return
		}
		switch typ {
		case wire.FrameAbort:
			a, _, err := wire.ParseAbort(payload)
			if err != nil {
				r.rankGone(int(info.Rank), fmt.Errorf("it sent a malformed abort notice: %v", err))
				c.Close()
				return
			}
			r.relay(wire.Abort{Rank: info.Rank, Reason: a.Reason})
		case wire.FramePong:
			// Heard (above).
		case wire.FrameStall, wire.FrameProbe:
			// A timeout's report, or a probe (the same Stall) for an
			// operation that has waited long.
			st, _, err := wire.ParseStall(payload)
			if err != nil {
				r.rankGone(int(info.Rank), fmt.Errorf("it sent a malformed %v frame: %v", typ, err))
				c.Close()
				return
			}
			r.diagnose(wire.Diagnosis{From: info.Rank, Stall: st, Probe: typ == wire.FrameProbe}, nil)
		case wire.FrameWait:
			if len(payload) < 4 {
				r.rankGone(int(info.Rank), errors.New("it sent a malformed wait report"))
				c.Close()
				return
			}
			w, _, err := wire.ParseWait(payload[4:])
			if err != nil {
				r.rankGone(int(info.Rank), fmt.Errorf("it sent a malformed wait report: %v", err))
				c.Close()
				return
			}
			// A rank speaks for itself only, and only of what it can
			// know: the root's own states (not answering, gone) are not
			// its to claim.
			w.Rank, w.For = info.Rank, max(w.For, 0)
			if w.State > wire.WaitRunning {
				w.State = wire.WaitIdle
			}
			r.answer(binary.BigEndian.Uint32(payload), w)
		case wire.FrameBye:
			r.mu.Lock()
			first := !r.left[info.Rank]
			r.left[info.Rank] = true
			r.out[info.Rank] = true
			r.checkShrinkLocked()
			r.mu.Unlock()
			if first {
				r.tellLeft(int(info.Rank))
			}
		case wire.FrameShrink:
			ni, _, err := wire.ParsePeerInfo(payload)
			if err != nil {
				r.rankGone(int(info.Rank), fmt.Errorf("it sent a malformed shrink request: %v", err))
				c.Close()
				return
			}
			r.mu.Lock()
			if r.shrink == nil {
				r.shrink = map[uint32]*registration{}
			}
			r.shrink[info.Rank] = &registration{conn: c, info: ni, from: c.RemoteAddr().String()}
			r.checkShrinkLocked()
			r.mu.Unlock()
		default:
			r.rankGone(int(info.Rank), fmt.Errorf("it sent a %v frame to the root", typ))
			c.Close()
			return
		}
	}
}

// heartbeat pings every watched rank each HeartbeatInterval and reports a
// rank that has not answered for Heartbeat: it stopped responding.
func (r *Root) heartbeat() {
	defer r.wg.Done()
	interval := HeartbeatInterval(r.opts.Heartbeat)
	t := time.NewTicker(interval)
	defer t.Stop()
	ping := pingFrame(r.opts.Heartbeat)
	last := time.Now()
	for {
		select {
		case <-t.C:
		case <-r.quiet:
			return
		}
		r.mu.Lock()
		if !r.watching || r.gone == r.nranks {
			r.mu.Unlock()
			return
		}
		now := time.Now()
		if now.Sub(last) > 2*interval {
			// This process was stopped or starved itself: no pings went
			// out, so no answers could come. Start the ranks' clocks
			// again rather than blame them.
			for i := range r.heard {
				r.heard[i] = now
			}
		}
		last = now
		var silent []int
		for i, g := range r.regs {
			if r.out[i] {
				continue
			}
			if d := now.Sub(r.heard[i]); d > r.opts.Heartbeat && !r.left[i] {
				silent = append(silent, i)
				continue
			}
			if r.pinging[i] {
				continue // the last ping is still being written
			}
			// Written from a goroutine of its own and without a deadline:
			// a deadline that expires breaks a TLS connection for good,
			// and nothing here may wait on a stopped rank's socket.
			r.pinging[i] = true
			c := g.conn
			go func() {
				c.Write(ping)
				r.mu.Lock()
				r.pinging[i] = false
				r.mu.Unlock()
			}()
		}
		r.mu.Unlock()
		for _, i := range silent {
			r.silent(i, now)
		}
	}
}

// writeWithin writes b to c, bounded by d, and leaves c without a write
// deadline: the heartbeat's pings write without one.
func writeWithin(c net.Conn, b []byte, d time.Duration) error {
	c.SetWriteDeadline(time.Now().Add(d))
	_, err := c.Write(b)
	c.SetWriteDeadline(time.Time{})
	return err
}

// pingFrame is a heartbeat ping: it carries the root's timeout, so that
// the ranks watch the root by the same one.
func pingFrame(timeout time.Duration) []byte {
	return wire.AppendFrame(nil, wire.FramePing, binary.BigEndian.AppendUint64(nil, uint64(timeout)))
}

// silent reports rank i, which stopped answering the heartbeat, to every
// other rank and to itself (it reads that if it ever resumes), and counts
// it out of a shrink.
func (r *Root) silent(i int, now time.Time) {
	r.mu.Lock()
	for_ := now.Sub(r.heard[i])
	if for_ <= r.opts.Heartbeat || r.out[i] || r.silenced[i] {
		r.mu.Unlock() // it answered meanwhile, or is out (or being reported) already
		return
	}
	r.silenced[i] = true
	g := r.regs[i]
	r.mu.Unlock()
	a := wire.Abort{Rank: uint32(i), Silent: true,
		Reason: fmt.Sprintf("stopped responding %.1f s ago (process stopped, deadlocked or swapping?)", for_.Seconds())}
	r.log.Warn("goccl: bootstrap root: a rank stopped answering the heartbeat", "rank", i, "pid", g.info.PID, "host", g.info.HostID, "silent", for_.Round(time.Millisecond))
	// Where the others wait goes out first, so that each can say how its
	// wait leads to the silent rank; then the notice.
	r.diagnose(wire.Diagnosis{From: uint32(i), Silent: true}, func() {
		r.relay(a)
		r.mu.Lock()
		self := wire.AppendFrame(nil, wire.FrameAbort, a.Append(nil))
		go g.conn.Write(self) // no deadline (TLS), no lock: it may never read
		r.out[i] = true
		r.checkShrinkLocked()
		r.mu.Unlock()
	})
}

// DiagnosisWait is how long the root waits for the ranks to say where
// they wait before it sends what it has: a rank that has not answered by
// then is reported as not answering (its process stopped, say).
const DiagnosisWait = time.Second

// probeGap is how soon after a probe's round the root starts another:
// the ranks of a job whose operation waits on a late rank probe at about
// the same moments, and one round answers them all.
const probeGap = 500 * time.Millisecond

// diagRound is a diagnosis being gathered.
type diagRound struct {
	id      uint32
	d       wire.Diagnosis // Waits by rank
	asked   []bool         // the ranks a where-query went to
	missing int            // answers still to come
	then    []func()       // run once the diagnosis has gone out
	timer   *time.Timer
}

// diagnose asks every rank still in the job where it waits, and sends
// every one of them (but a silent d.From) what they said once all have
// answered or DiagnosisWait has passed; then it runs then. A diagnosis
// asked for while one is being gathered joins it.
func (r *Root) diagnose(d wire.Diagnosis, then func()) {
	r.mu.Lock()
	if !r.watching {
		r.mu.Unlock()
		if then != nil {
			then()
		}
		return
	}
	defer r.mu.Unlock()
	if g := r.diag; g != nil {
		if g.d.Probe && !d.Probe {
			// A stall, or a silent rank's notice, after the probe's round
			// (at most DiagnosisWait): its where-queries told the ranks
			// that nothing would come of it.
			g.then = append(g.then, func() { r.diagnose(d, then) })
			return
		}
		if then != nil {
			g.then = append(g.then, then)
		}
		return
	}
	if !d.Silent && r.stalled {
		return // every rank had the diagnosis of a stall and aborted on it
	}
	if d.Probe && time.Since(r.probed) < probeGap {
		return // one went out a moment ago: the ranks have just compared
	}
	r.rounds++
	switch {
	case d.Probe:
		r.log.Debug("goccl: bootstrap root: an operation waits long; asking every rank where it waits", "rank", d.From, "op", d.Stall.Op, "seq", d.Stall.Seq)
	case !d.Silent:
		r.log.Warn("goccl: bootstrap root: an operation timed out; asking every rank where it waits", "rank", d.From, "op", d.Stall.Op, "seq", d.Stall.Seq)
	}
	g := &diagRound{id: r.rounds, d: d, asked: make([]bool, r.nranks)}
	if then != nil {
		g.then = append(g.then, then)
	}
	g.d.Waits = make([]wire.Wait, r.nranks)
	q := binary.BigEndian.AppendUint32(nil, g.id)
	if d.Probe {
		q = append(q, wire.WhereProbe)
	}
	frame := wire.AppendFrame(nil, wire.FrameWhere, q)
	for i, reg := range r.regs {
		w := &g.d.Waits[i]
		w.Rank, w.Peer = uint32(i), -1
		switch {
		case r.silenced[i] || (d.Silent && i == int(d.From)):
			w.State = wire.WaitNoAnswer // reported (or being reported) as not responding
		case r.out[i] || r.left[i]:
			w.State = wire.WaitGone
		default:
			w.State = wire.WaitNoAnswer // until it answers
			g.asked[i] = true
			g.missing++
			if r.asking[i] {
				continue // the last query is still being written: it is not reading
			}
			// No deadline (TLS), no lock: a stopped rank may never read.
			r.asking[i] = true
			c := reg.conn
			go func() {
				c.Write(frame)
				r.mu.Lock()
				r.asking[i] = false
				r.mu.Unlock()
			}()
		}
	}
	r.diag = g
	if g.missing == 0 {
		go r.finishDiagnosis(g)
		return
	}
	g.timer = time.AfterFunc(DiagnosisWait, func() { r.finishDiagnosis(g) })
}

// answer records rank w.Rank's answer to round id.
func (r *Root) answer(id uint32, w wire.Wait) {
	r.mu.Lock()
	g := r.diag
	if g == nil || g.id != id || int(w.Rank) >= len(g.asked) || !g.asked[w.Rank] {
		r.mu.Unlock()
		return // late, or not asked
	}
	g.asked[w.Rank] = false
	g.d.Waits[w.Rank] = w
	g.missing--
	done := g.missing == 0
	r.mu.Unlock()
	if done {
		if g.timer != nil {
			g.timer.Stop()
		}
		go r.finishDiagnosis(g)
	}
}

// finishDiagnosis sends round g's diagnosis (once), then runs its then.
func (r *Root) finishDiagnosis(g *diagRound) {
	r.mu.Lock()
	if r.diag != g {
		r.mu.Unlock()
		return
	}
	r.diag = nil
	now := time.Now()
	for i := range g.d.Waits {
		if w := &g.d.Waits[i]; w.State == wire.WaitNoAnswer {
			w.For = int64(now.Sub(r.heard[i]))
		}
	}
	switch {
	case g.d.Probe:
		r.probed = now
		if host, _ := g.d.Misplaced(); host == nil {
			// Nothing the ranks would act on: a diagnosis carries every
			// rank's wait to every rank (O(n²) bytes), and an operation
			// that waits on a late rank probes at every doubling.
			r.mu.Unlock()
			for _, f := range g.then {
				f()
			}
			return
		}
	case !g.d.Silent:
		r.stalled = true
	}
	frame := wire.AppendFrame(nil, wire.FrameDiagnosis, g.d.Append(nil))
	// The ranks that answered in turn, this process's last; those that did
	// not answer from goroutines of their own and without a deadline (TLS),
	// since their full sockets may hold a write up for good.
	var to []net.Conn
	for _, i := range r.localLastLocked() {
		if r.out[i] || r.left[i] || r.silenced[i] {
			continue
		}
		if g.d.Waits[i].State == wire.WaitNoAnswer {
			go r.regs[i].conn.Write(frame)
			continue
		}
		to = append(to, r.regs[i].conn)
	}
	r.mu.Unlock()
	for _, c := range to {
		writeWithin(c, frame, time.Second) // a rank that is gone already just misses it
	}
	for _, f := range g.then {
		f()
	}
}

// relay tells every rank but a.Rank that a.Rank failed, once.
func (r *Root) relay(a wire.Abort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.left[a.Rank] {
		return
	}
	r.left[a.Rank] = true
	frame := wire.AppendFrame(nil, wire.FrameAbort, a.Append(nil))
	for _, i := range r.localLastLocked() {
		if i != int(a.Rank) {
			writeWithin(r.regs[i].conn, frame, time.Second) // a rank that is gone already just misses it
		}
	}
}

// localLastLocked returns the registered ranks with those of this process
// last: one of them may exit as soon as it hears from the root (the table,
// a notice, a diagnosis), taking the root and what it has not sent yet
// with it.
func (r *Root) localLastLocked() []int {
	self := uint32(os.Getpid())
	order := make([]int, 0, len(r.regs))
	for _, local := range []bool{false, true} {
		for i, g := range r.regs {
			if g != nil && (g.info.PID == self) == local {
				order = append(order, i)
			}
		}
	}
	return order
}

// tellLeft tells the ranks still here that rank left: a rank that closes
// its communicator before another ever connected to it would otherwise
// leave that one retrying until its operation's timeout. From goroutines
// and without holding the lock: a stopped rank's full socket must not
// hold the root up.
func (r *Root) tellLeft(rank int) {
	a := wire.Abort{Rank: uint32(rank), Left: true, Reason: "closed its communicator"}
	frame := wire.AppendFrame(nil, wire.FrameAbort, a.Append(nil))
	r.mu.Lock()
	var to []net.Conn
	for i, g := range r.regs {
		if i != rank && g != nil && !r.out[i] {
			to = append(to, g.conn)
		}
	}
	r.mu.Unlock()
	for _, c := range to {
		// No deadline (one that expires breaks a TLS connection for
		// good), no lock: a rank that is gone already just misses it, and
		// Close closes the connection under a write that never ends.
		go c.Write(frame)
	}
}

// checkShrinkLocked completes a shrink once every rank still connected
// (not gone, no goodbye) has asked: the survivors, in their old order,
// become ranks 0..k-1 of a new table, which each of them gets.
func (r *Root) checkShrinkLocked() {
	if len(r.shrink) == 0 {
		return
	}
	var survivors []uint32
	for i := range r.regs {
		if r.out[i] {
			continue
		}
		if r.shrink[uint32(i)] == nil {
			return // still waiting for rank i
		}
		survivors = append(survivors, uint32(i))
	}
	t := wire.Table{Peers: make([]wire.PeerInfo, len(survivors))}
	for k, old := range survivors {
		p := r.shrink[old].info
		p.Rank, p.NRanks = uint32(k), uint32(len(survivors))
		t.Peers[k] = p
	}
	frame := wire.AppendFrame(nil, wire.FrameTable, t.Append(nil))
	for _, old := range survivors {
		writeWithin(r.shrink[old].conn, frame, time.Second)
	}
	r.shrink = nil
}

// rankGone notes that a rank's watch connection ended; unless the rank
// said goodbye or aborted, the others learn that it died. The root
// finishes serving when every rank is gone.
func (r *Root) rankGone(rank int, why error) {
	r.relay(wire.Abort{Rank: uint32(rank), Died: true, Reason: why.Error()})
	r.mu.Lock()
	r.gone++
	r.out[rank] = true
	r.checkShrinkLocked()
	if r.gone == r.nranks {
		r.hush()
	}
	r.mu.Unlock()
}

// hush ends the heartbeat.
func (r *Root) hush() { r.quietOnce.Do(func() { close(r.quiet) }) }

func (r *Root) register(reg *registration) error {
	info := reg.info
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return errors.New("the root has finished")
	}
	switch {
	case info.NRanks < 1 || info.NRanks > wire.MaxPeers:
		return fmt.Errorf("rank %d registered for a job of %d ranks (want 1..%d)", info.Rank, info.NRanks, wire.MaxPeers)
	case r.nranks != 0 && int(info.NRanks) != r.nranks:
		return fmt.Errorf("rank %d says the job has %d ranks; rank %d said %d", info.Rank, info.NRanks, r.firstRank(), r.nranks)
	case info.Rank >= info.NRanks:
		return fmt.Errorf("rank %d out of range for %d ranks", info.Rank, info.NRanks)
	case info.Version != r.opts.Version:
		return fmt.Errorf("rank %d runs goccl %q, the root runs %q: run the same version on every rank", info.Rank, info.Version, r.opts.Version)
	}
	if r.nranks == 0 {
		r.nranks = int(info.NRanks)
		r.regs = make([]*registration, r.nranks)
	}
	if old := r.regs[info.Rank]; old != nil {
		return fmt.Errorf("rank %d registered twice: pid %d on %s (%s), then pid %d on %s (%s)",
			info.Rank, old.info.PID, old.info.HostID, old.from, info.PID, info.HostID, reg.from)
	}
	r.regs[info.Rank] = reg
	r.count++
	if info.WaitMillis > 0 {
		// Report before the first waiting rank gives up; the time only ever
		// moves earlier.
		wait := time.Duration(info.WaitMillis)*time.Millisecond - reportMargin
		at := time.Now().Add(wait)
		switch {
		case r.report == nil:
			r.report, r.reportAt = time.AfterFunc(wait, r.reportMissing), at
		case at.Before(r.reportAt):
			r.report.Reset(wait)
			r.reportAt = at
		}
	}
	if r.count == r.nranks {
		r.sendTableLocked()
	}
	return nil
}

func (r *Root) firstRank() int {
	for i, g := range r.regs {
		if g != nil {
			return i
		}
	}
	return -1
}

func (r *Root) reportMissing() {
	r.mu.Lock()
	finished := r.finished
	r.mu.Unlock()
	if !finished {
		r.fail(errors.New(r.missing()))
	}
}

// missing describes the ranks that have not registered.
func (r *Root) missing() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nranks == 0 {
		return "no rank registered"
	}
	var missing, here []string
	for i, g := range r.regs {
		if g == nil {
			missing = append(missing, fmt.Sprint(i))
		} else {
			here = append(here, fmt.Sprint(i))
		}
	}
	msg := fmt.Sprintf("ranks %s of %d never registered with the root (registered: %s)",
		strings.Join(missing, ", "), r.nranks, strings.Join(here, ", "))
	if r.refused > 0 {
		// A missing rank may be one the root turned away: a wrong secret,
		// a certificate of another CA, TLS on one side only.
		msg += fmt.Sprintf("; the root refused %d connection(s), the last %s", r.refused, r.lastDrop)
	}
	return msg
}

// sendTableLocked sends the table to every rank and finishes.
func (r *Root) sendTableLocked() {
	t := wire.Table{Peers: make([]wire.PeerInfo, r.nranks)}
	for i, g := range r.regs {
		t.Peers[i] = g.info
	}
	frame := wire.AppendFrame(nil, wire.FrameTable, t.Append(nil))
	if r.opts.Watch && r.opts.Heartbeat > 0 {
		// A first ping right behind the table tells every rank that this
		// root has a heartbeat (Watch.Pinged), however soon its process
		// stops.
		frame = append(frame, pingFrame(r.opts.Heartbeat)...)
	}
	for _, i := range r.localLastLocked() {
		g := r.regs[i]
		if err := writeWithin(g.conn, frame, HandshakeTimeout); err != nil {
			r.log.Warn("goccl: bootstrap root could not send the table", "rank", g.info.Rank, "err", err)
		}
	}
	if r.opts.Watch {
		r.watching = true
		r.left = make([]bool, r.nranks)
		r.out = make([]bool, r.nranks)
		r.heard = make([]time.Time, r.nranks)
		r.pinging = make([]bool, r.nranks)
		r.silenced = make([]bool, r.nranks)
		r.asking = make([]bool, r.nranks)
		now := time.Now()
		for i := range r.heard {
			r.heard[i] = now
		}
		if r.opts.Heartbeat > 0 {
			r.wg.Add(1)
			go r.heartbeat()
		}
		r.finishRegistrationLocked(nil)
		return
	}
	r.finishLocked(nil)
}

// fail tells every waiting rank why and finishes.
func (r *Root) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	rej := wire.Reject{Reason: err.Error()}
	frame := wire.AppendFrame(nil, wire.FrameReject, rej.Append(nil))
	for _, g := range r.regs {
		if g != nil {
			g.conn.SetWriteDeadline(time.Now().Add(time.Second))
			g.conn.Write(frame)
		}
	}
	r.finishLocked(err)
}

func (r *Root) finishLocked(err error) {
	r.finishRegistrationLocked(err)
	for c := range r.conns {
		c.Close()
	}
}

// finishRegistrationLocked ends the rendezvous: no more connections, no
// more reports; the ranks' connections stay open (in watch mode).
func (r *Root) finishRegistrationLocked(err error) {
	r.finished = true
	r.err = err
	r.ln.Close()
	if r.report != nil {
		r.report.Stop()
	}
	r.lifetime.Stop()
	close(r.done)
}

// JoinOption changes how a rank reaches the root.
type JoinOption func(*joinOptions)

type joinOptions struct{ tls *tls.Config }

// WithTLS makes the rank run TLS (as the client) on its connection to the
// root before anything else. cfg should present a client certificate.
func WithTLS(cfg *tls.Config) JoinOption { return func(o *joinOptions) { o.tls = cfg } }

// Join registers info with the root at addr and returns the table. It
// retries the connection with backoff until ctx ends (the root may not be
// up yet), and tells the root how long it will wait, so that the root can
// name the ranks that never arrived before this rank gives up.
func Join(ctx context.Context, addr string, secret []byte, info wire.PeerInfo, opts ...JoinOption) (wire.Table, error) {
	t, c, err := join(ctx, addr, secret, info, opts)
	if c != nil {
		c.Close()
	}
	return t, err
}

// JoinWatch is Join for a root in watch mode (RootOptions.Watch): the
// connection stays open as a Watch.
func JoinWatch(ctx context.Context, addr string, secret []byte, info wire.PeerInfo, opts ...JoinOption) (wire.Table, *Watch, error) {
	t, c, err := join(ctx, addr, secret, info, opts)
	if err != nil {
		if c != nil {
			c.Close()
		}
		return t, nil, err
	}
	return t, newWatch(c), nil
}

// Watch is a rank's end of its watched connection to the root. A
// goroutine of its own reads the connection from JoinWatch on and answers
// the root's heartbeat pings, so that a rank still setting its transports
// up, or busy computing, answers; Next returns what else comes.
type Watch struct {
	c       net.Conn
	mu      sync.Mutex   // serialises writes
	heard   atomic.Int64 // when the root's last frame arrived (UnixNano)
	pings   atomic.Int64 // pings answered
	timeout atomic.Int64 // the root's heartbeat timeout, from its pings
	ponging atomic.Bool  // a pong is being written
	frames  chan watchFrame
	err     error       // why reading ended, once frames is closed
	stalled atomic.Bool // tests: the reader stops, as in a stopped process
	where   atomic.Pointer[func(probe bool) wire.Wait]
}

// Event is what the root sent: one of a failure notice, the new table of
// a shrink, or a diagnosis.
type Event struct {
	Abort     *wire.Abort
	Table     *wire.Table
	Diagnosis *wire.Diagnosis
}

type watchFrame struct {
	typ     wire.FrameType
	payload []byte
}

func newWatch(c net.Conn) *Watch {
	w := &Watch{c: c, frames: make(chan watchFrame, 16)}
	w.heard.Store(time.Now().UnixNano())
	go w.read()
	return w
}

// read reads the root's frames until the connection ends.
func (w *Watch) read() {
	defer close(w.frames)
	pong := wire.AppendFrame(nil, wire.FramePong, nil)
	for {
		typ, payload, err := handshake.ReadFrame(w.c, wire.MaxFrame)
		for w.stalled.Load() {
			time.Sleep(10 * time.Millisecond) // a stopped process acts on nothing
		}
		if err != nil {
			w.err = err
			return
		}
		w.heard.Store(time.Now().UnixNano())
		if typ == wire.FrameWhere {
			// Answered from a goroutine, like a ping: the answer reads the
			// communicator's state, and the reader must not wait on it.
			if len(payload) == 4 || len(payload) == 5 && payload[4] == wire.WhereProbe {
				go w.answer(payload)
			}
			continue
		}
		if typ != wire.FramePing {
			w.frames <- watchFrame{typ, payload}
			continue
		}
		if len(payload) == 8 {
			w.timeout.Store(int64(binary.BigEndian.Uint64(payload)))
		}
		w.pings.Add(1)
		// From a goroutine, without a deadline (one that expires breaks
		// a TLS connection for good), and one at a time.
		if w.ponging.CompareAndSwap(false, true) {
			go func() {
				w.mu.Lock()
				w.c.Write(pong) // a failure shows in the next read
				w.mu.Unlock()
				w.ponging.Store(false)
			}()
		}
	}
}

// answer tells the root where this rank waits, for the where-query
// (a round number) in q.
func (w *Watch) answer(q []byte) {
	st := wire.Wait{Peer: -1, Detail: "its communicator is still being set up"}
	if f := w.where.Load(); f != nil {
		st = (*f)(len(q) == 5)
	}
	w.send(wire.FrameWait, st.Append(append(make([]byte, 0, 4+st.Len()), q[:4]...)))
}

// SetWhere installs what answers the root's where-queries: where this
// rank's communicator waits, read from its own goroutine (the reader's
// helper), so it must not block. probe says the query is a probe's
// (ProbeStall), whose diagnosis aborts nothing unless it finds a fault.
func (w *Watch) SetWhere(f func(probe bool) wire.Wait) { w.where.Store(&f) }

// ProbeStall asks the root to compare where every rank waits, for an
// operation that has waited long but not timed out: the diagnosis comes
// through Next with Probe set. It waits at most a second.
func (w *Watch) ProbeStall(s wire.Stall) error { return w.send(wire.FrameProbe, s.Append(nil)) }

// ReportStall tells the root that this rank's operation timed out: the
// root asks every rank where it waits and sends all of them a diagnosis
// (through Next). It waits at most a second.
func (w *Watch) ReportStall(s wire.Stall) error { return w.send(wire.FrameStall, s.Append(nil)) }

// Heard is when the root's last frame (a heartbeat's ping, say) arrived;
// the time of JoinWatch before any did.
func (w *Watch) Heard() time.Time { return time.Unix(0, w.heard.Load()) }

// Pinged reports whether the root's heartbeat has pinged this rank yet:
// a root with a heartbeat sends its first ping right behind the table.
func (w *Watch) Pinged() bool { return w.pings.Load() > 0 }

// RootHeartbeat is the heartbeat timeout the root's pings said it uses
// (0 before any).
func (w *Watch) RootHeartbeat() time.Duration { return time.Duration(w.timeout.Load()) }

// Next waits for the root's next message: a failure notice, the new
// table of a shrink (Shrink), or a diagnosis (ReportStall, or before the
// notice of a silent rank). It returns an error when the connection ends
// (the root went away, or Close).
func (w *Watch) Next() (Event, error) {
	f, ok := <-w.frames
	if !ok {
		return Event{}, w.err
	}
	typ, payload := f.typ, f.payload
	switch typ {
	case wire.FrameAbort:
		a, _, err := wire.ParseAbort(payload)
		if err != nil {
			return Event{}, fmt.Errorf("malformed abort notice from the root: %w", err)
		}
		return Event{Abort: &a}, nil
	case wire.FrameTable:
		t, _, err := wire.ParseTable(payload)
		if err != nil {
			return Event{}, fmt.Errorf("malformed table from the root: %w", err)
		}
		return Event{Table: &t}, nil
	case wire.FrameDiagnosis:
		d, _, err := wire.ParseDiagnosis(payload)
		if err != nil {
			return Event{}, fmt.Errorf("malformed diagnosis from the root: %w", err)
		}
		return Event{Diagnosis: &d}, nil
	}
	return Event{}, fmt.Errorf("unexpected %v frame from the root", typ)
}

// Shrink asks the root for a new table without the ranks that are gone:
// info is this rank's new registration. The table arrives through Next
// once every rank still connected has asked.
func (w *Watch) Shrink(info wire.PeerInfo) error {
	if err := info.Validate(); err != nil {
		return err
	}
	return w.send(wire.FrameShrink, info.Append(nil))
}

// Abort tells the root (and through it every other rank) that this rank
// aborts, and why. It waits at most a second.
func (w *Watch) Abort(reason string) error {
	a := wire.Abort{Reason: reason}
	return w.send(wire.FrameAbort, a.Append(nil))
}

// send writes one frame to the root, waiting at most a second.
func (w *Watch) send(t wire.FrameType, payload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.SetWriteDeadline(time.Now().Add(time.Second))
	defer w.c.SetWriteDeadline(time.Time{}) // pongs write without one
	return handshake.WriteFrame(w.c, t, payload)
}

// Bye tells the root this rank leaves cleanly, then closes the connection.
func (w *Watch) Bye() error {
	err := w.send(wire.FrameBye, nil)
	w.c.Close()
	return err
}

// Close closes the connection without a goodbye.
func (w *Watch) Close() error { return w.c.Close() }

func join(ctx context.Context, addr string, secret []byte, info wire.PeerInfo, opts []JoinOption) (wire.Table, net.Conn, error) {
	if err := info.Validate(); err != nil {
		return wire.Table{}, nil, err
	}
	var o joinOptions
	for _, f := range opts {
		f(&o)
	}
	// The registration is built once the root has proved itself, so that
	// the wait it announces is what is left now, not before the retries.
	c, err := dialRoot(ctx, addr, secret, o.tls, func() (wire.FrameType, []byte) {
		if dl, ok := ctx.Deadline(); ok {
			info.WaitMillis = uint32(max(1, min(time.Until(dl).Milliseconds(), 1<<31)))
		}
		return wire.FramePeerInfo, info.Append(nil)
	})
	if err != nil {
		return wire.Table{}, nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer func() {
		if !stop() {
			c.SetDeadline(time.Time{}) // ctx ended as we returned: undo its deadline
		}
	}()
	c.SetDeadline(time.Time{})
	if ctx.Err() != nil {
		return wire.Table{}, c, context.Cause(ctx)
	}
	typ, payload, err := handshake.ReadFrame(c, wire.MaxFrame)
	if err != nil {
		if ctx.Err() != nil {
			return wire.Table{}, c, fmt.Errorf("waiting for the other ranks at the root %s: %w", addr, context.Cause(ctx))
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the root closed the connection (did its process exit?)")
		}
		return wire.Table{}, c, fmt.Errorf("waiting for the other ranks at the root %s: %w", addr, err)
	}
	switch typ {
	case wire.FrameReject:
		rej, _, err := wire.ParseReject(payload)
		if err != nil {
			return wire.Table{}, c, fmt.Errorf("malformed reject from the root: %w", err)
		}
		return wire.Table{}, c, fmt.Errorf("the root refused: %s", rej.Reason)
	case wire.FrameTable:
	default:
		return wire.Table{}, c, fmt.Errorf("expected the table from the root, got a %v frame", typ)
	}
	t, _, err := wire.ParseTable(payload)
	if err != nil {
		return wire.Table{}, c, fmt.Errorf("malformed table from the root: %w", err)
	}
	if len(t.Peers) != int(info.NRanks) {
		return wire.Table{}, c, fmt.Errorf("the root's table has %d ranks, want %d", len(t.Peers), info.NRanks)
	}
	for i, p := range t.Peers {
		if int(p.Rank) != i || p.Version != info.Version {
			return wire.Table{}, c, fmt.Errorf("the root's table is inconsistent at rank %d", i)
		}
	}
	return t, c, nil
}

// network is the network of a root's address: "unix" for an abstract
// socket's ("@name"), else "tcp".
func network(addr string) string {
	if strings.HasPrefix(addr, "@") {
		return "unix"
	}
	return "tcp"
}

// dialRoot connects and authenticates (sending first as the
// authenticated first frame), retrying with jittered exponential backoff
// while the root is not reachable yet.
func dialRoot(ctx context.Context, addr string, secret []byte, tlsCfg *tls.Config, first func() (wire.FrameType, []byte)) (net.Conn, error) {
	backoff := 10 * time.Millisecond
	if network(addr) == "unix" {
		// A root on this host that is not up yet is refused in a few µs,
		// and is usually a moment away (a split child's, started by its
		// rank 0 as its members start joining).
		backoff = 200 * time.Microsecond
	}
	var last error
	warned := false
	for attempt := 0; ; attempt++ {
		d := net.Dialer{Timeout: 5 * time.Second}
		raw, err := d.DialContext(ctx, network(addr), addr)
		var terr *tlsrec.HandshakeError
		if err == nil {
			c := raw
			err = handshake.Bounded(ctx, raw, HandshakeTimeout, func() error {
				if tlsCfg != nil {
					tc := tls.Client(tlsrec.RecordBounded(raw), tlsCfg)
					if err := tc.HandshakeContext(ctx); err != nil {
						if rej := rejectInsteadOfTLS(err, raw); rej != nil {
							return rej
						}
						return &tlsrec.HandshakeError{Err: err}
					}
					if err := handshake.ConfirmTLS(tc, secret, tc.ConnectionState(), true); err != nil {
						return err
					}
					c = tc
				}
				return handshake.Client(c, secret, wire.PurposeBootstrap, first)
			})
			if err == nil {
				return c, nil
			}
			raw.Close()
			var rej *handshake.RejectedError
			switch {
			case errors.As(err, &terr) && tlsrec.Permanent(terr.Err):
				return nil, fmt.Errorf("TLS with the root at %s: %w", addr, terr.Err)
			case errors.Is(err, handshake.ErrAuth):
				return nil, fmt.Errorf("the root at %s does not know this job's secret (a different GOCCL_SECRET, or another job's root on that port): %w", addr, err)
			case errors.As(err, &rej) && !rej.Unproven:
				return nil, fmt.Errorf("the root at %s: %w", addr, err)
			case errors.As(err, &rej) && !warned:
				// Not believed (a stranger on the port can send it), so
				// the retries go on; said at once all the same, since it
				// is usually a real rank's settings that differ.
				warned = true
				slog.Warn("goccl: the root refused this rank before proving it knows the job's secret; retrying until the init deadline", "root", addr, "err", err)
			}
		}
		if errors.As(err, &terr) {
			err = fmt.Errorf("%w (does the root have GOCCL_TLS_* set too?)", err)
		}
		if last == nil || !handshake.Ended(ctx) {
			// An attempt the deadline cut short says less than the
			// whole one before it (a loaded machine ends mid-handshake).
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("could not reach the root at %s before the init deadline (%d attempts; last error: %v): %w", addr, attempt+1, last, context.Cause(ctx))
		case <-time.After(backoff/2 + rand.N(backoff)):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// rejectInsteadOfTLS returns the reason of a reject frame that a root
// without TLS sent in reply to this rank's ClientHello: crypto/tls read
// the frame's header as a record header and failed on it.
func rejectInsteadOfTLS(err error, raw net.Conn) *handshake.RejectedError {
	var rh tls.RecordHeaderError
	if !errors.As(err, &rh) {
		return nil
	}
	typ, n, err := wire.ParseFrameHeader(rh.RecordHeader[:])
	if err != nil || typ != wire.FrameReject || n > wire.MaxString+64 {
		return nil
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(raw, payload); err != nil {
		return nil
	}
	r, _, err := wire.ParseReject(payload)
	if err != nil {
		return nil
	}
	return &handshake.RejectedError{Reason: r.Reason, Unproven: true}
}
