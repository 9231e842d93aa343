package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/transport"
)

// Point-to-point on host memory runs outside Run's one-at-a-time order
// (RunP2P): MPI promises that any set of matched Isend and Irecv calls
// completes, whatever order each rank starts them in and whatever their
// size, and a send waiting for its receive must not hold back a receive
// from another peer. So each peer and direction has a lane of its own: a
// chanRun, a connection on the channel that carries that direction's
// data (transport.P2PDataChannel: low to high ranks on P2PChannel, high to
// low on the one after, so that no connection is driven from both ends'
// sending goroutines), and a sequence counter. Operations of one lane run
// one at a time, in issue order (the caller serialises them: messages
// between a pair do not overtake each other); lanes run concurrently with
// each other and with Run.
//
// A send or receive of zero elements is a message too (one empty slice),
// as in MPI: a receive that expects data from an empty send, or the
// reverse, fails with a MismatchError instead of waiting forever.

// lane is one peer and direction's point-to-point state.
type lane struct {
	x    chanRun
	conn transport.Conn
	seq  uint64
	prog atomic.Int64
}

type laneKey struct {
	peer int
	recv bool
}

// p2pLanes holds the engine's lanes.
type p2pLanes struct {
	mu    sync.Mutex
	lanes map[laneKey]*lane
}

func (e *Engine) lane(k laneKey) *lane {
	e.p2p.mu.Lock()
	defer e.p2p.mu.Unlock()
	if e.p2p.lanes == nil {
		e.p2p.lanes = map[laneKey]*lane{}
	}
	l := e.p2p.lanes[k]
	if l == nil {
		l = &lane{}
		l.x = chanRun{conns: make([]transport.Conn, e.nranks), sent: make([]uint32, e.nranks), recvd: make([]uint32, e.nranks), prog: &l.prog}
		e.p2p.lanes[k] = l
	}
	return l
}

// RunP2P runs a send or receive on host memory (op.Coll is CollSend or
// CollRecv, op.Root the peer) in its lane, which the caller must keep to
// one operation at a time; any number of other lanes, and Run, may run
// meanwhile. Errors are as Run's.
func (e *Engine) RunP2P(ctx context.Context, op *Op) (Plan, error) {
	if op.Coll != algorithms.CollSend && op.Coll != algorithms.CollRecv {
		return Plan{}, fmt.Errorf("engine: RunP2P runs sends and receives, not %v", op.Coll)
	}
	if onDevice(op) {
		return Plan{}, errors.New("engine: RunP2P runs on host memory; device point-to-point goes through Run")
	}
	if err := e.CheckMemory(op, false); err != nil {
		return Plan{}, fmt.Errorf("engine: %w", err)
	}
	peer, recv := op.Root, op.Coll == algorithms.CollRecv
	l := e.lane(laneKey{peer, recv})
	seq := l.seq
	l.seq++
	from, to := e.rank, peer
	if recv {
		from, to = peer, e.rank
	}
	ch := transport.P2PDataChannel(from, to)
	if l.conn == nil {
		c, err := e.dial(ctx, peer, ch)
		if err != nil {
			return Plan{Seq: seq}, &StepError{Channel: ch, Step: -1, Peer: peer, Err: err}
		}
		l.conn = c
		l.x.conns[peer] = c
	}
	if op.Count == 0 {
		l.prog.Store(1) // waiting at step 0, for P2PWaits
		pl, err := e.emptyMessage(ctx, l, op, seq, ch)
		l.prog.Store(progDone)
		return pl, err
	}
	pl, err := e.Plan(op)
	if err != nil {
		return pl, err
	}
	pl.Seq = seq
	l.x.connBase = transport.P2PChannel
	l.x.setup(e, op, &pl, 0, false)
	l.x.ch = ch // in errors: the channel the lane's data travels on
	l.prog.Store(0)
	err = l.x.run(ctx)
	l.prog.Store(progDone) // done, or failed: no longer waiting either way
	return pl, err
}

// emptyMessage sends or receives the one empty slice of a zero-element
// operation.
func (e *Engine) emptyMessage(ctx context.Context, l *lane, op *Op, seq uint64, ch int) (Plan, error) {
	ap := algorithms.Plan{Algo: algorithms.P2P, Channels: 1}
	pl := Plan{Plan: ap, Seq: seq, Sig: signature(op, ap, 0, 0)}
	peer := op.Root
	tag := transport.Tag{Op: seq, Sig: pl.Sig}
	kind := algorithms.Send
	fail := func(err error) error {
		return &StepError{Channel: ch, Piece: 0, Step: 0, Kind: kind, Peer: peer, Err: err}
	}
	if op.Coll == algorithms.CollSend {
		if _, err := l.conn.Reserve(ctx, 0); err != nil {
			return pl, fail(err)
		}
		if err := l.conn.Post(0, tag); err != nil {
			return pl, fail(err)
		}
		if f, ok := l.conn.(transport.Flusher); ok {
			if err := f.Flush(ctx); err != nil {
				return pl, fail(err)
			}
		}
		return pl, nil
	}
	kind = algorithms.Recv
	b, got, err := l.conn.Wait(ctx)
	if err != nil {
		return pl, fail(err)
	}
	n := b.Len()
	l.conn.Release()
	if got != tag || n != 0 {
		return pl, fail(&MismatchError{Peer: peer, Got: got, Want: tag, GotBytes: n, WantBytes: 0})
	}
	return pl, nil
}

// P2PWaits reports the peers whose lanes have an operation running
// (with the step it is at), for diagnostics; any goroutine may call it.
func (e *Engine) P2PWaits() []Progress {
	e.p2p.mu.Lock()
	defer e.p2p.mu.Unlock()
	var out []Progress
	for k, l := range e.p2p.lanes {
		v := l.prog.Load()
		if v == 0 || v == progDone {
			continue
		}
		kind := algorithms.Send
		if k.recv {
			kind = algorithms.Recv
		}
		from, to := e.rank, k.peer
		if k.recv {
			from, to = k.peer, e.rank
		}
		out = append(out, Progress{Channel: transport.P2PDataChannel(from, to), Piece: int(v >> 32), Step: int(v&0xffffffff) - 1, Kind: kind, Peer: k.peer})
	}
	return out
}
