package collective

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// Failure propagation over the bootstrap connection. The root keeps every
// rank's connection after the table (bootstrap.RootOptions.Watch): a rank
// that aborts tells the root, which tells every other rank, and the root
// reports a rank whose connection closes without a goodbye as dead. So a
// failure reaches ranks that are idle, or that do not talk to the failed
// rank, in milliseconds, instead of at their next operation that needs
// it or at its timeout.

// watchLater starts the watch of a communicator that was ready before
// its watched connection to the root (a split child's): join waits for
// that connection. Until it has come, failures travel on the data path
// only (a peer that dies is seen on its connections), an abort is not
// told to the root (the join tells it, once it comes) and Shrink waits
// for it. Close waits for it for a while (joinGrace), then gives up on
// it (cancel ends join).
func (c *Comm) watchLater(join func() (*bootstrap.Watch, error), cancel func()) {
	ready := make(chan struct{})
	c.watchReady, c.abandonWatch = ready, cancel
	go func() {
		w, err := join()
		if err != nil {
			close(ready)
			if !c.ended.Load() && !c.leaving.Load() {
				c.logger(SubsysInit).Warn("goccl: this communicator has no watch over its bootstrap root: a failure reaches this rank on its connections only", "rank", c.rank, "err", err)
			}
			if errors.Is(err, errOtherTable) {
				c.abort(err)
			}
			return
		}
		c.startWatch(w)
		close(ready)
		// An abort before ready was closed found no watch to tell: tell
		// the root now (tellOnce makes it once, whoever comes first).
		if c.ended.Load() && c.ctx.Err() != nil {
			if cause := context.Cause(c.ctx); !errors.Is(cause, ErrClosed) {
				c.tellOnce(w, cause)
			}
		}
	}()
}

// tellOnce sends the root this rank's abort, once: from abort, or from
// watchLater for an abort that came before the watch.
func (c *Comm) tellOnce(w *bootstrap.Watch, cause error) {
	if c.toldRoot.CompareAndSwap(false, true) {
		w.Abort(cause.Error()) // best effort: at most a second
	}
}

// errOtherTable: a split child's root has another table than the ranks
// traded.
var errOtherTable = errors.New("the new communicator's root has another table than the ranks exchanged")

// rootConn returns the watched connection to the root: nil when there is
// none, or none yet (watchLater).
func (c *Comm) rootConn() *bootstrap.Watch {
	if c.watchReady != nil {
		select {
		case <-c.watchReady:
		default:
			return nil
		}
	}
	return c.rootWatch
}

// startWatch takes over a rank's watched connection to the root.
func (c *Comm) startWatch(w *bootstrap.Watch) {
	c.rootWatch = w
	c.watchExit = make(chan struct{})
	c.shrunk = make(chan *wire.Table, 1)
	if d := heartbeatOf(c.cfg); d > 0 {
		go c.watchRoot(w, d)
	}
	w.SetWhere(c.where)
	go func() {
		defer close(c.watchExit)
		var silentDiag *wire.Diagnosis // where the ranks waited, before a silent rank's notice
		for {
			ev, err := w.Next()
			if ev.Table != nil {
				c.shrunk <- ev.Table
				continue
			}
			if err != nil {
				// The root went away (its process ended) or Close closed
				// the connection: failures travel on the data path only
				// from now on. Under InitFromEnv the root lives in rank
				// 0's process, so that rank is gone too: nobody can
				// connect to it any more.
				if r := c.id.rootRank - 1; r >= 0 && r != c.rank && r < c.size && !c.ended.Load() {
					c.eng.PeerGone(r, fmt.Errorf("rank %d has left: its process, which hosted the bootstrap root, closed the root's connection (%v)", r, err))
				}
				return
			}
			if d := ev.Diagnosis; d != nil {
				if d.Probe {
					// An operation waits long somewhere: only a fault it
					// cannot wait out ends it now.
					if m := misplaced(d); m != nil && len(d.Waits) == c.size && !c.ended.Load() {
						c.abortAfter(m, noticeGrace)
					}
					continue
				}
				if d.Silent {
					silentDiag = d
					continue
				}
				c.silence() // every rank got the same
				// Every rank reads its own diagnosis before this one's
				// connections close: otherwise a neighbour's error would be
				// this rank's abort, not its own chain.
				c.abortAfter(c.stallCause(d), noticeGrace)
				continue
			}
			a := ev.Abort
			if a.Left {
				// Not a failure: only connections to it can no longer be
				// made (an operation that needs one fails at once).
				if int(a.Rank) != c.rank && int(a.Rank) < c.size {
					c.eng.PeerGone(int(a.Rank), fmt.Errorf("rank %d %s (it left the job before this rank connected to it)", a.Rank, a.Reason))
				}
				continue
			}
			var cause error
			switch {
			case a.Silent && int(a.Rank) == c.rank:
				cause = fmt.Errorf("goccl: the root told the other ranks that this rank %s: it was stopped or starved for longer than the heartbeat timeout (GOCCL_HEARTBEAT_TIMEOUT), and the job goes on without it", a.Reason)
			case a.Silent:
				ue := &UnresponsiveError{Rank: int(a.Rank), Detail: a.Reason}
				if d := silentDiag; d != nil && d.From == a.Rank {
					ue.Waiting = c.silentWaiting(d)
				}
				cause = &transport.PeerError{Peer: int(a.Rank), Op: "watch", Err: ue}
			case a.Died:
				cause = &transport.PeerError{Peer: int(a.Rank), Op: "watch", Err: fmt.Errorf("rank %d died: %s", a.Rank, a.Reason)}
			default:
				cause = &transport.PeerAbortedError{Peer: int(a.Rank), Cause: errors.New(a.Reason)}
			}
			c.silence() // the root knows: it told us
			grace := time.Duration(0)
			if a.Silent {
				grace = noticeGrace // as for a diagnosis: each survivor reads its own notice
			}
			c.abortAfter(cause, grace)
		}
	}()
}

// noticeGrace is how long a rank waits after the root's diagnosis, or
// its notice of a silent rank, before it aborts and its connections
// close: every rank got the same from the root at about the same time,
// and each should fail with what its own wait says.
const noticeGrace = 100 * time.Millisecond

// UnresponsiveError is the cause of an abort when a rank stopped
// answering the heartbeat: its process is alive (its connections stay
// open) but does not run.
type UnresponsiveError struct {
	Rank   int    // -1: the bootstrap root, in no rank's process
	Detail string // "stopped responding 10.2 s ago (...)"
	Root   string // the root's address, when it is the root that fell silent
	// Waiting says how this rank's wait led to the silent rank ("rank 0
	// waits on rank 2 (allreduce#215: ...), which waits on rank 1"),
	// where the root could tell.
	Waiting string
}

func (e *UnresponsiveError) Error() string {
	var s string
	switch {
	case e.Root != "" && e.Rank >= 0:
		s = fmt.Sprintf("rank %d (it hosts the bootstrap root at %s) %s", e.Rank, e.Root, e.Detail)
	case e.Root != "":
		s = fmt.Sprintf("the bootstrap root at %s %s", e.Root, e.Detail)
	default:
		s = fmt.Sprintf("rank %d %s", e.Rank, e.Detail)
	}
	if e.Waiting != "" {
		s += "; " + e.Waiting
	}
	return s
}

// watchRoot aborts the communicator when the root's heartbeat stops: the
// root's process (rank 0's, under InitFromEnv) is stopped, deadlocked or
// swapping. It starts looking once the first ping has come (a root with a
// heartbeat sends one right after the table), so that a root without a
// heartbeat is not taken for a silent one.
func (c *Comm) watchRoot(w *bootstrap.Watch, timeout time.Duration) {
	tick := time.NewTicker(bootstrap.HeartbeatInterval(timeout))
	defer tick.Stop()
	for {
		select {
		case <-c.watchExit:
			return
		case <-tick.C:
		}
		if !w.Pinged() {
			continue // no ping yet
		}
		// The root's own timeout, when it is longer: its pings come as
		// often as it says, not as this rank's setting would have them.
		timeout := max(timeout, w.RootHeartbeat())
		heard := w.Heard()
		// An interval's grace: the root reports a rank after timeout, the
		// ranks the root a little later, so that a stopped rank 0 is not
		// raced by its own report.
		if d := time.Since(heard); d > timeout+bootstrap.HeartbeatInterval(timeout) {
			ue := &UnresponsiveError{Rank: c.id.rootRank - 1, Root: c.id.addr,
				Detail: fmt.Sprintf("stopped responding %.1f s ago (process stopped, deadlocked or swapping?)", d.Seconds())}
			var cause error = ue
			if ue.Rank >= 0 {
				cause = &transport.PeerError{Peer: ue.Rank, Op: "watch", Err: ue}
			}
			c.silence()
			c.abort(cause)
			return
		}
	}
}

// tellRoot tells the root this rank aborts (once, from abort).
func (c *Comm) tellRoot(cause error) {
	if w := c.rootConn(); w != nil {
		c.tellOnce(w, cause)
	}
}

// silence keeps this rank's coming abort from being told to the root.
func (c *Comm) silence() {
	c.told.Do(func() {})
	c.toldRoot.Store(true)
}

// leaveWatch says goodbye to the root and waits for the watcher to end.
func (c *Comm) leaveWatch() {
	if ready := c.watchReady; ready != nil {
		select {
		case <-ready:
		case <-time.After(joinGrace):
			c.leaving.Store(true) // the join's failure is Close's doing: no warning
			c.abandonWatch()
			<-ready
		}
	}
	if c.rootWatch == nil {
		return
	}
	c.rootWatch.Bye()
	<-c.watchExit
}

// ErrShrunk is the cause a communicator is aborted with when Shrink
// replaces it.
var ErrShrunk = errors.New("goccl: communicator replaced by Shrink")

// Shrink makes a new communicator of the ranks that are still here, like
// ncclCommShrink: every rank whose process is alive and has not closed
// this communicator must call it (typically after an operation failed
// because a rank died); the survivors keep their order and are numbered
// 0..k-1. This communicator is aborted (with ErrShrunk, unless it failed
// already) and must still be closed. Shrink waits, bounded by ctx or
// Config.InitTimeout, until every survivor has asked; the root (the
// process that served Init) must be among them. The new communicator
// learns of later failures on its own connections only: the root's watch
// stays with this one (close it after Shrink returns).
//
// The survivors need not have failed in the same operation: one can
// complete on some ranks before the failure reaches another. Agree on
// where to resume over the new communicator (an all-reduce with Min of
// each rank's last completed step, say) before going on.
func (c *Comm) Shrink(ctx context.Context) (*Comm, error) {
	if c == nil {
		return nil, &ArgError{Rank: -1, Op: "shrink", Err: ErrNilComm}
	}
	if ctx == nil {
		return nil, c.argError("shrink", "nil context")
	}
	if ready := c.watchReady; ready != nil {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("goccl: rank %d: shrink: waiting for the watch over the bootstrap root: %w", c.rank, context.Cause(ctx))
		}
	}
	if c.rootWatch == nil {
		return nil, c.argError("shrink", "needs a communicator with a bootstrap root to meet the survivors at (made by Init, InitFromEnv or Split, whose watch came)")
	}
	c.silence() // the others are shrinking too: nothing to tell
	c.abort(ErrShrunk)
	return buildProcs(ctx, c.id, c.size, c.rank, c.cfg, c.lookup, c.facts, func(ctx context.Context, info wire.PeerInfo) (meeting, error) {
		if err := c.rootWatch.Shrink(info); err != nil {
			return meeting{}, fmt.Errorf("asking the root for a shrink: %w", err)
		}
		select {
		case t := <-c.shrunk:
			return meeting{table: *t}, nil
		case <-c.watchExit:
			return meeting{}, errors.New("lost the connection to the root while shrinking (did its process exit?)")
		case <-ctx.Done():
			return meeting{}, fmt.Errorf("waiting for the other survivors to shrink: %w", context.Cause(ctx))
		}
	})
}

// joinGrace bounds how long Close waits for a watch that is still being
// joined (watchLater) before it abandons it.
const joinGrace = 2 * time.Second

// heartbeatOf is the heartbeat timeout cfg asks for; 0: none.
func heartbeatOf(cfg Config) time.Duration {
	if cfg.HeartbeatTimeout < 0 {
		return 0
	}
	if cfg.HeartbeatTimeout == 0 {
		return DefaultHeartbeatTimeout
	}
	return cfg.HeartbeatTimeout
}
