package collective

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/flight"
	"github.com/goccl/goccl/internal/engine"
)

// flightOps is how many operations the flight recorder keeps.
const flightOps = 256

// record snapshots the flight recorder.
func (c *Comm) record(reason string, cause error) *flight.Dump {
	d := &flight.Dump{Rank: c.rank, Size: c.size, PID: os.Getpid(), Reason: reason}
	if c.peers != nil && c.rank < len(c.peers) {
		d.Host = c.peers[c.rank].HostID
	}
	if cause != nil {
		d.Error = cause.Error()
	}
	c.mu.Lock()
	c.seeFinish(c.since())
	running := c.op
	n := min(c.seq, flightOps)
	d.Dropped = c.seq - n
	// Copy under the lock: a blocking operation's Request is reused once
	// the recorder drops it.
	type snap struct {
		r             *Request // identity only
		name          string
		op            engine.Op
		cseq          uint64
		issued, start int64
		finished      bool
		finishNs      int64
		err           error
		device        bool
	}
	snaps := make([]snap, 0, n)
	for s := c.seq - n; s < c.seq; s++ {
		r := c.flight[s%flightOps]
		snaps = append(snaps, snap{r: r, name: r.name, op: r.op,
			cseq: r.cseq, issued: r.issued, start: r.start, finished: r.finished, finishNs: r.finishNs, err: r.err, device: r.devV != 0})
	}
	c.mu.Unlock()
	for _, sn := range snaps {
		op := sn.op
		e := flight.Entry{Seq: sn.cseq, Op: sn.name, Type: DataType(op.Type).String(), Count: op.Count, Root: -1,
			IssuedUs: float64(sn.issued) / 1e3, Device: sn.device}
		e.Bytes = op.Bytes(c.size)
		switch op.Coll {
		case algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollSend, algorithms.CollRecv:
			e.Root = op.Root
		}
		if op.Coll.Reduces() {
			e.RedOp = Op(op.Red).String()
			if op.PreMul {
				e.RedOp = "premulsum"
			}
		}
		switch op.Coll {
		case algorithms.CollSend:
			e.P2P = "send"
		case algorithms.CollRecv:
			e.P2P = "recv"
		}
		if op.Count > 0 && op.Coll != algorithms.CollSend && op.Coll != algorithms.CollRecv {
			if pl, err := c.eng.Plan(&op); err == nil {
				e.Algo, e.Channels = pl.AlgoName(), pl.Channels
			}
		}
		if sn.start != 0 {
			e.StartedUs = float64(sn.start) / 1e3
		}
		switch {
		case sn.finished && sn.err == nil:
			e.State = flight.Done
		case sn.finished:
			e.State, e.Err = flight.Failed, sn.err.Error()
		case e.StartedUs > 0:
			e.State = flight.Running
		default:
			e.State = flight.Issued
		}
		if sn.finished {
			e.FinishedUs = float64(sn.finishNs) / 1e3
		}
		if sn.r == running && !sn.finished {
			for _, p := range c.eng.Progress() {
				e.Progress = append(e.Progress, flight.Progress{Channel: p.Channel, Piece: p.Piece, Step: p.Step, Kind: p.Kind.String(), Peer: p.Peer, Done: p.Done})
			}
		}
		d.Ops = append(d.Ops, e)
	}
	return d
}

// DebugDump writes the flight recorder, the last operations of this rank
// (sequence, collective, type, count, root, state, times, and how far
// each channel of a running one got), as JSON (flight.Dump). Running it
// on every rank of a stuck job and giving the files to flight.Analyze (or
// goccl-run -analyze) names the operation where the ranks diverge or the
// rank that never arrived.
func (c *Comm) DebugDump(w io.Writer) error {
	if c == nil {
		return &ArgError{Rank: -1, Op: "debugdump", Err: ErrNilComm}
	}
	return c.record("request", nil).Write(w)
}

// dumpOnFailure writes the flight recorder to Config.DebugDump, once, when
// the communicator is aborted (by a timeout, a failure or Abort).
func (c *Comm) dumpOnFailure(cause error) {
	if c.cfg.DebugDump == "" {
		return
	}
	c.dumped.Do(func() {
		reason := "abort"
		if isStall(cause) {
			reason = "timeout"
		}
		p, err := c.record(reason, cause).WriteFile(c.cfg.DebugDump)
		if err != nil {
			slog.Warn("goccl: could not write the flight recorder", "rank", c.rank, "dir", c.cfg.DebugDump, "err", err)
			return
		}
		slog.Warn("goccl: communicator aborted; flight recorder written", "rank", c.rank, "path", p, "cause", cause)
	})
}

// Communicators that dump on SIGUSR1: those with Config.DebugDump set.
var (
	sigMu    sync.Mutex
	sigComms = map[*Comm]bool{}
	sigOnce  sync.Once
)

// registerDump makes c dump on SIGUSR1. The process's signal goroutine is
// started with the first such communicator and lives as long as the
// process.
func registerDump(c *Comm) {
	if c.cfg.DebugDump == "" {
		return
	}
	sigMu.Lock()
	sigComms[c] = true
	sigMu.Unlock()
	sigOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR1)
		go func() {
			for range ch {
				dumpAll("signal")
			}
		}()
	})
}

func unregisterDump(c *Comm) {
	sigMu.Lock()
	delete(sigComms, c)
	sigMu.Unlock()
}

// dumpAll writes every registered communicator's recorder.
func dumpAll(reason string) {
	sigMu.Lock()
	var cs []*Comm
	for c := range sigComms {
		cs = append(cs, c)
	}
	sigMu.Unlock()
	for _, c := range cs {
		p, err := c.record(reason, nil).WriteFile(c.cfg.DebugDump)
		if err != nil {
			slog.Warn("goccl: could not write the flight recorder", "rank", c.rank, "err", err)
			continue
		}
		fmt.Fprintf(os.Stderr, "goccl: rank %d flight recorder written to %s\n", c.rank, p)
	}
}
