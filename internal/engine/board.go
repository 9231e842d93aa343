package engine

import (
	"context"
	"fmt"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/transport"
)

// An all-reduce small enough for the endpoint's board (transport.Board:
// memory every rank of the communicator shares) runs there as a one-shot:
// each rank posts its input once and reduces the n contributions in rank
// order, the same kernels in the same order on every rank, so every rank
// gets the same bits. Where the connections' one-shot (oneshot.go) posts
// n-1 times and waits on n-1 segments, this touches one entry per rank.
//
// Every other collective marks its sequence number on the board, so that
// ranks that disagree (one on the board, another on the connections)
// still fail at once, with a MismatchError, rather than waiting for each
// other until the timeout.

// boardSched stands for a board operation in Progress and errors.
var boardSched = algorithms.Schedule{Steps: []algorithms.Step{{Kind: algorithms.SendRecv}}}

// boardKernels caches the signature and kernels of the last board
// operation: a training loop repeats its shapes.
type boardKernels struct {
	key  planKey
	sig  uint32
	host hostPath
}

// onBoard reports whether op runs on the board. A forced algorithm
// (Config.Algo) keeps every operation on the connections, and device
// memory stays off it (the board is host memory).
func (e *Engine) onBoard(op *Op) bool {
	return e.board != nil && e.cfg.Algo == algorithms.AlgoAuto && op.Coll == algorithms.CollAllReduce &&
		op.Bytes(e.nranks) <= int64(e.board.Max()) && !onDevice(op)
}

// boardPlan is the plan of an operation on the board; sig is its
// signature, or 0 to work it out.
func boardPlan(op *Op, seq uint64, sig uint32) Plan {
	pl := Plan{Plan: algorithms.Plan{Algo: algorithms.OneShot, Channels: 1}, Pieces: 1, Sched: &boardSched, Seq: seq, Sig: sig}
	if sig == 0 {
		// Slice 0 tells it apart from the connections' one-shot, whose
		// slice is at least the count.
		pl.Sig = signature(op, pl.Plan, 1, 0)
	}
	return pl
}

// OnBoard reports whether the plan runs on the board.
func (pl *Plan) OnBoard() bool { return pl.Sched == &boardSched }

// AlgoName names the plan's algorithm for logs and dumps: "board" for
// the board's one-shot.
func (pl *Plan) AlgoName() string {
	if pl.OnBoard() {
		return "board"
	}
	return pl.Algo.String()
}

// markOff records on the board that collective seq runs elsewhere.
func (e *Engine) markOff(op *Op, seq uint64, sig uint32) {
	if e.board != nil && op.Coll != algorithms.CollSend && op.Coll != algorithms.CollRecv {
		e.board.Mark(seq, sig)
	}
}

// runOnBoard runs an all-reduce on the board.
func (e *Engine) runOnBoard(ctx context.Context, op *Op, seq uint64) (Plan, error) {
	k := &e.boardK
	if key := keyOf(op); key != k.key || !k.host.ready {
		k.key, k.sig = key, boardPlan(op, seq, 0).Sig
		k.host.setup(op, e.nranks)
	}
	pl := boardPlan(op, seq, k.sig)
	nb := op.Count * op.Type.Size()
	in, out := op.In.Bytes()[:nb], op.Out.Bytes()[:nb]
	fail := func(peer int, err error) error {
		return &StepError{Channel: 0, Piece: 0, Step: 0, Kind: algorithms.SendRecv, Peer: peer, Err: err}
	}
	e.boardPeer.Store(-1)
	e.curSched.Store(&boardSched)
	defer e.curSched.Store(nil)
	// In place, the output overwrites the input before this rank's turn
	// in the reduction comes: keep a copy.
	mine := in
	if op.In.Overlaps(op.Out) {
		e.boardMine = append(e.boardMine[:0], in...)
		mine = e.boardMine
	}
	if err := e.board.Post(ctx, seq, pl.Sig, in); err != nil {
		return pl, fail(-1, err)
	}
	for r := range e.nranks {
		src := mine
		if r != e.rank {
			e.boardPeer.Store(int32(r))
			sig, data, posted, err := e.board.Read(ctx, r, seq)
			if err != nil {
				return pl, fail(r, err)
			}
			if !posted || sig != pl.Sig || len(data) != nb {
				want := transport.Tag{Op: seq, Sig: pl.Sig}
				return pl, fail(r, &MismatchError{Peer: r, Got: transport.Tag{Op: seq, Sig: sig}, Want: want, GotBytes: len(data), WantBytes: nb, OffBoard: !posted})
			}
			src = data
		}
		k.host.fold(out, src, r, e.nranks)
	}
	return pl, nil
}

// boardProgress is Progress during a board operation.
func (e *Engine) boardProgress() []Progress {
	return []Progress{{Channel: 0, Step: 0, Kind: algorithms.SendRecv, Peer: int(e.boardPeer.Load())}}
}

// offBoardText explains a MismatchError with OffBoard set. The peer's
// signature is that of a plan on the connections, so only the call in it
// (collective, type, operator) compares with this rank's.
func offBoardText(e *MismatchError) string {
	if e.Got.Sig == 0 {
		return fmt.Sprintf("rank %d went past operation %d without posting it on the shared board, where this rank waits for %d bytes as %v (did it call it with a zero count, or skip it?)",
			e.Peer, e.Want.Op, e.WantBytes, e.Want)
	}
	g, w := decodeSig(e.Got.Sig), decodeSig(e.Want.Sig)
	what := fmt.Sprintf("it called %s, this rank %s", g.call(), w.call())
	if g.call() == w.call() {
		what = fmt.Sprintf("both called %s, with a different count", w.call())
	}
	return fmt.Sprintf("rank %d did not post operation %d on the shared board, where this rank waits for %d bytes: %s",
		e.Peer, e.Want.Op, e.WantBytes, what)
}
