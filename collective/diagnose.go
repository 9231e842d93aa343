package collective

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/flight"
	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/wire"
)

// The chain of waits (issue 18). When an operation times out, its error
// used to name the peer this rank waited on, which is as often a healthy
// neighbour waiting in turn as the rank at fault. So a rank whose
// operation times out asks the root instead (Watch.ReportStall); the root
// asks every rank where it waits, and each answers from its library's own
// goroutine (where, below), so a rank busy computing answers and a
// stopped one does not. The root sends every rank what it gathered
// (wire.Diagnosis), and each follows the chain from itself: a rank that
// runs an operation waits on the peer of its first unfinished channel;
// the chain ends at a rank that waits on no one (it has not reached the
// operation, say), that did not answer, or that has left, or it closes
// into a cycle. Every rank aborts with a StallError naming that end and
// the way to it. The same goes out before the root's notice of a rank
// that stopped answering the heartbeat, so that each survivor's
// UnresponsiveError says how its wait led there.
//
// Before the timeout, an operation that has waited a second (then 2, 4,
// 8 s...) has the root run the same round as a probe (Watch.ProbeStall),
// whose diagnosis the root sends only when it shows what no wait cures:
// ranks running the operation with their buffers placed differently
// (host memory on some, device memory on others: wire.Diagnosis.Misplaced,
// MisplacedError), on which every rank aborts.
//
// Between processes the root is the only place that sees every rank, so
// the diagnosis needs it: a rank whose root is gone, or that is not
// answered within bootstrap.DiagnosisWait and a second, reports its plain
// timeout. The ranks of a local group (NewLocalGroup) are at hand in one
// process, and their watchdogs ask each other directly (localWatch).

// StallError is the cause of the abort that follows an operation's
// timeout on some rank, once the ranks' waits were compared.
// errors.Is(err, ErrTimeout) holds for it.
type StallError struct {
	Op      string        // the operation that timed out ("allreduce")
	Seq     uint64        // its sequence number among the collectives
	Rank    int           // the rank on which it timed out
	Timeout time.Duration // that rank's timeout
	// End is the rank at the end of the chain of waits: one that waits on
	// no rank (it has not called the operation, say), did not answer or
	// has left the job; -1 when the ranks wait on each other in a cycle.
	End int
	// Chain is the ranks from this one to End when this rank waits on
	// another (just this one when it is End), the cycle when there is
	// one, and nil when this rank waits on no one and is not End.
	Chain []int
	// What says what End is doing ("has not called allreduce#216 ..."),
	// or names the cycle.
	What string
	// Waiting says where this rank waited ("rank 2 waits on rank 1
	// (...), which waits on rank 3"), "" when it ran no operation.
	Waiting string
	// Local is this rank's own timeout, when Rank is this rank: which
	// channels were where.
	Local error
}

func (e *StallError) Error() string {
	var b strings.Builder
	if e.Local != nil {
		b.WriteString(e.Local.Error())
	} else {
		fmt.Fprintf(&b, "%v: %s#%d ran past the %v timeout on rank %d", ErrTimeout, e.Op, e.Seq, e.Timeout, e.Rank)
	}
	// Ranks by number, never "this rank": the text also travels to the
	// peers as this rank's abort cause.
	if e.End < 0 {
		fmt.Fprintf(&b, "; %s", e.What)
	} else {
		fmt.Fprintf(&b, "; the chain of waits ends at rank %d, which %s", e.End, e.What)
	}
	if e.Waiting != "" {
		fmt.Fprintf(&b, "; %s", e.Waiting)
	}
	return b.String()
}

func (e *StallError) Unwrap() error { return ErrTimeout }

// where is this rank's answer to the root's where-query: the operation
// running and the peer its first unfinished channel waits on, or the last
// operation and how it ended. It runs on the watch's goroutine, so it
// reads atomics and takes c.mu only briefly.
func (c *Comm) where(probe bool) wire.Wait {
	w := wire.Wait{Rank: uint32(c.rank), Peer: -1}
	now := c.since()
	if !probe {
		// A probe's diagnosis aborts nothing (but a misplacement): an
		// operation that fails meanwhile need not wait for it.
		c.asked.Store(max(now, 1))
	}
	c.mu.Lock()
	running := c.op != nil
	if running {
		r := c.op
		w.State, w.Seq, w.Op = wire.WaitRunning, r.cseq, r.name
		w.For, w.Device = now-r.start, r.devV != 0
	}
	c.mu.Unlock()
	if running {
		prog := c.eng.Progress()
		for _, p := range prog {
			if p.Done || p.Peer < 0 {
				continue
			}
			w.Peer = int32(p.Peer)
			w.Detail = fmt.Sprintf("channel %d piece %d step %d, %v", p.Channel, p.Piece, p.Step, p.Kind)
			return w
		}
		switch {
		case len(prog) == 0:
			w.Detail = "setting up its connections or buffers"
		default:
			w.Detail = "its channels are done, or in steps of their own"
		}
		return w
	}
	// A send or receive in its lane (lanes.go) waits on its peer.
	if p2p := c.eng.P2PWaits(); len(p2p) > 0 {
		p := p2p[0]
		w.State, w.Op, w.Peer = wire.WaitRunning, p.Kind.String(), int32(p.Peer)
		w.Detail = fmt.Sprintf("step %d piece %d", p.Step, p.Piece)
		return w
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seeFinish(now)
	// The last collective: a diagnosis compares collectives' numbers
	// (sends and receives are numbered per peer).
	var r *Request
	for s := c.seq; s > 0 && c.seq-s < flightOps; s-- {
		if q := c.flight[(s-1)%flightOps]; q.op.Coll != algorithms.CollSend && q.op.Coll != algorithms.CollRecv {
			r = q
			break
		}
	}
	if r == nil {
		w.For = now
		return w
	}
	w.Seq, w.Op = r.cseq, r.name
	switch {
	case r.finished && r.err == nil:
		w.Detail, w.For = "finished", now-r.finishNs
	case r.finished:
		w.Detail, w.For = "failed: "+r.err.Error(), now-r.finishNs
	default:
		w.Detail, w.For = "issued, not yet started", now-r.issued
	}
	return w
}

// waitsOf follows d's chain of waits from rank from.
func waitsOf(d *wire.Diagnosis, from int) ([]int, bool) {
	return flight.Chain(from, func(r int) int {
		if r < 0 || r >= len(d.Waits) {
			return -1
		}
		w := d.Waits[r]
		if w.State != wire.WaitRunning || w.Peer < 0 || int(w.Peer) >= len(d.Waits) {
			return -1
		}
		return int(w.Peer)
	})
}

// diagnosisBound is how long a rank waits for the root's diagnosis once
// it has reported a stall or answered a where-query: the root's
// bootstrap.DiagnosisWait for the answers, and a second for the round
// trips.
const diagnosisBound = bootstrap.DiagnosisWait + time.Second

// diagnosing reports whether the root asked this rank where it waits
// recently enough that the diagnosis (or a silent rank's notice) may
// still be coming.
func (c *Comm) diagnosing() bool {
	a := c.asked.Load()
	return a != 0 && time.Duration(c.since()-a) < diagnosisBound
}

// stallCause is the cause this rank aborts with on diagnosis d.
func (c *Comm) stallCause(d *wire.Diagnosis) error {
	if len(d.Waits) != c.size || int(d.From) >= c.size {
		return fmt.Errorf("%w: %s#%d ran past the %v timeout on rank %d (the root's diagnosis covers %d ranks of %d)",
			ErrTimeout, d.Stall.Op, d.Stall.Seq, time.Duration(d.Stall.Timeout), d.From, len(d.Waits), c.size)
	}
	e := &StallError{Op: d.Stall.Op, Seq: d.Stall.Seq, Rank: int(d.From), Timeout: time.Duration(d.Stall.Timeout)}
	if int(d.From) == c.rank {
		if te := c.timedOut.Load(); te != nil {
			e.Local = te
		}
	}
	if m := misplaced(d); m != nil {
		// Host ranks and device ranks of one operation run it on
		// different connections (transport.DeviceChannels): whatever the
		// chain of waits looks like, that is the cause.
		return m
	}
	// The end: of the chain from this rank if it waits on someone, else of
	// the chain from the rank that timed out.
	chain, cycle := waitsOf(d, c.rank)
	if len(chain) == 1 && int(d.From) != c.rank {
		if from, fc := waitsOf(d, int(d.From)); len(from) > 0 {
			e.End = from[len(from)-1]
			if fc {
				chain, cycle = from, true
			} else if e.End != c.rank {
				chain = nil
			}
		}
	}
	if cycle {
		e.End = -1
		e.Chain = chain
		e.What = fmt.Sprintf("the ranks wait on each other in a cycle: %s (did they issue their operations in different orders?)", flight.Arrows(flight.Cycle(chain)))
	} else {
		if chain != nil {
			e.End = chain[len(chain)-1]
			e.Chain = chain
		}
		e.What = endWhat(d.Waits[e.End], d.Stall)
	}
	e.Waiting = waitingText(d, chain, cycle, c.rank)
	return e
}

// misplaced returns the error for d's operation when some of the ranks
// running it placed its buffers in host memory and others in device
// memory, else nil.
func misplaced(d *wire.Diagnosis) *MisplacedError {
	host, dev := d.Misplaced()
	if host == nil {
		return nil
	}
	return &MisplacedError{Op: d.Stall.Op, Seq: d.Stall.Seq, Host: host, Device: dev}
}

// MisplacedError is the cause of the abort when the ranks of one
// operation placed its buffers differently: some in host memory, others
// in device memory. The two run on separate connections, so neither side
// sees the other's data; while the operation waits, the ranks compare
// where they are (a second into the wait, then after 2, 4, 8... s:
// through the bootstrap root, or directly in a local group; at the
// timeout where neither answers). errors.Is(err, ErrMismatch) holds for
// it.
type MisplacedError struct {
	Op     string // the operation ("allreduce")
	Seq    uint64 // its sequence number among the collectives
	Host   []int  // the ranks that ran it on host memory
	Device []int  // and those on device memory
}

func (e *MisplacedError) Error() string {
	return fmt.Sprintf("%v: the ranks placed %s#%d's buffers differently: %s host memory, %s device memory "+
		"(an operation's ranks must all pass host buffers or all device buffers: the two run on separate connections, so neither side sees the other's data)",
		ErrMismatch, e.Op, e.Seq, ranksIn(e.Host), ranksIn(e.Device))
}

func (e *MisplacedError) Unwrap() error { return ErrMismatch }

// ranksIn names ranks: "rank 3 in", "ranks 0, 1 and 2 in".
func ranksIn(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d in", rs[0])
	}
	var b strings.Builder
	b.WriteString("ranks ")
	for i, r := range rs {
		switch {
		case i == len(rs)-1:
			b.WriteString(" and ")
		case i > 0:
			b.WriteString(", ")
		}
		fmt.Fprint(&b, r)
	}
	b.WriteString(" in")
	return b.String()
}

// endWhat says what the rank at the end of a chain is doing, for a
// diagnosis of operation s.
func endWhat(w wire.Wait, s wire.Stall) string {
	for_ := time.Duration(w.For).Seconds()
	switch w.State {
	case wire.WaitGone:
		return "has left the job (it closed its communicator, aborted or exited)"
	case wire.WaitNoAnswer:
		return fmt.Sprintf("did not answer the root (silent for %.1f s: its process stopped, deadlocked or swapping?)", for_)
	case wire.WaitRunning:
		return fmt.Sprintf("is running %s#%d (for %.1f s) and waits on no rank (%s)", w.Op, w.Seq, for_, w.Detail)
	}
	switch {
	case w.Op == "":
		return fmt.Sprintf("has not called %s#%d: it has issued no operation yet", s.Op, s.Seq)
	case w.Seq < s.Seq:
		return fmt.Sprintf("has not called %s#%d: its last operation, %s#%d, %s %.1f s ago", s.Op, s.Seq, w.Op, w.Seq, w.Detail, for_)
	}
	return fmt.Sprintf("runs no operation: its last, %s#%d, %s %.1f s ago", w.Op, w.Seq, w.Detail, for_)
}

// waitingText says how rank's own wait leads along chain.
func waitingText(d *wire.Diagnosis, chain []int, cycle bool, rank int) string {
	w := d.Waits[rank]
	if w.State != wire.WaitRunning {
		return ""
	}
	if len(chain) < 2 || chain[0] != rank {
		return fmt.Sprintf("rank %d waits in %s#%d on no rank (%s)", rank, w.Op, w.Seq, w.Detail)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rank %d waits on rank %d (%s#%d: %s)", rank, chain[1], w.Op, w.Seq, w.Detail)
	for i := 2; i < len(chain); i++ {
		fmt.Fprintf(&b, ", which waits on rank %d", chain[i])
	}
	return b.String()
}

// silentWaiting says how this rank's wait leads to the silent rank of
// diagnosis d, for its UnresponsiveError.
func (c *Comm) silentWaiting(d *wire.Diagnosis) string {
	if len(d.Waits) != c.size {
		return ""
	}
	chain, cycle := waitsOf(d, c.rank)
	if cycle || len(chain) < 2 || chain[len(chain)-1] != int(d.From) {
		return ""
	}
	return waitingText(d, chain, false, c.rank)
}

// isStall reports whether cause came from a timeout, here or elsewhere.
func isStall(cause error) bool {
	var se *StallError
	var te *timeoutError
	return errors.As(cause, &se) || errors.As(cause, &te)
}

// localWatch is what the ranks of a local group (NewLocalGroup) share so
// that their watchdogs can compare where each waits without a bootstrap
// root: it asks every rank's where directly, builds the diagnosis the
// root would send, and aborts the ranks as each would on receiving it.
type localWatch struct {
	comms []atomic.Pointer[Comm] // the group's, by rank (set as they are made)

	mu      sync.Mutex
	aborted bool // a diagnosis has aborted the group
}

// diagnosis gathers every rank's answer for stall s, reported by rank
// from.
func (l *localWatch) diagnosis(from int, s wire.Stall, probe bool) *wire.Diagnosis {
	d := &wire.Diagnosis{From: uint32(from), Stall: s, Probe: probe, Waits: make([]wire.Wait, len(l.comms))}
	for r := range l.comms {
		c := l.comms[r].Load()
		gone := c == nil || c.ended.Load()
		if c != nil && !gone {
			c.mu.Lock()
			gone = c.closed
			c.mu.Unlock()
		}
		if gone {
			d.Waits[r] = wire.Wait{Rank: uint32(r), State: wire.WaitGone, Peer: -1}
			continue
		}
		d.Waits[r] = c.where(probe)
	}
	return d
}

// probe compares where the ranks wait for rank from's operation s, which
// has waited long, and aborts every rank when some placed its buffers in
// host memory and others in device memory; it reports whether it did.
func (l *localWatch) probe(from int, s wire.Stall) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.aborted {
		return true
	}
	m := misplaced(l.diagnosis(from, s, true))
	if m == nil {
		return false
	}
	l.aborted = true
	l.abortAll(func(*Comm) error { return m })
	return true
}

// stall aborts every rank on the diagnosis of rank from's timeout s, each
// with its own cause, as ranks do on the root's (once per group).
func (l *localWatch) stall(from int, s wire.Stall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.aborted {
		return
	}
	l.aborted = true
	d := l.diagnosis(from, s, false)
	l.abortAll(func(c *Comm) error { return c.stallCause(d) })
}

// abortAll aborts every rank still running with cause's answer for it:
// every context first (noticeGrace, as for the root's diagnosis), so that
// each rank's failing operation reports its own cause, not a peer's
// closed connection.
func (l *localWatch) abortAll(cause func(*Comm) error) {
	for r := range l.comms {
		if c := l.comms[r].Load(); c != nil && !c.ended.Load() {
			go c.abortAfter(cause(c), noticeGrace)
		}
	}
}
