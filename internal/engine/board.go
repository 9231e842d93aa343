package engine

import (
	"context"
	"errors"
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
// Small broadcasts, all-gathers, reduce-scatters and reduces run there
// the same way: the root posts and the others read its entry (marking the
// collective as theirs, so the root knows when it may reuse the entry);
// every rank posts its block and reads everyone's; every rank posts its
// whole input and folds everyone's copy of its own block; every rank but
// the root posts its input and marks the collective, and the root marks
// it and folds the posts in rank order, as an all-reduce does.
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
	set  bool // key, sig and host are those of an operation (host.ready is false for one that does not reduce)
	host hostPath
}

// onBoard reports whether op runs on the board. A forced algorithm
// (Config.Algo) keeps every operation on the connections, and device
// memory stays off it (the board is host memory).
func (e *Engine) onBoard(op *Op) bool {
	if e.board == nil || e.cfg.Algo != algorithms.AlgoAuto || onDevice(op) {
		return false
	}
	switch op.Coll {
	case algorithms.CollAllReduce, algorithms.CollBroadcast, algorithms.CollAllGather, algorithms.CollReduceScatter, algorithms.CollReduce:
		return boardPost(op, e.nranks) <= int64(e.board.Max())
	}
	return false
}

// boardPost is the bytes a rank posts for op on the board: its input (an
// all-gather's block, a reduce-scatter's n blocks).
func boardPost(op *Op, n int) int64 {
	if op.Coll == algorithms.CollReduceScatter {
		return op.Bytes(n)
	}
	return op.Bytes(1)
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

// awaitBoard waits, before the first collective, for a board that joins
// in the background (transport.BoardJoiner), failing at once when a peer
// has gone or goes meanwhile, as dial does for a connection.
func (e *Engine) awaitBoard(ctx context.Context, op *Op) error {
	if e.boardUp || e.board == nil || op.Coll == algorithms.CollSend || op.Coll == algorithms.CollRecv {
		return nil
	}
	j, ok := e.board.(transport.BoardJoiner)
	if !ok {
		e.boardUp = true
		return nil
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	peers := make([]int, 0, e.nranks-1)
	for p := range e.nranks {
		if p != e.rank {
			peers = append(peers, p)
		}
	}
	stop := e.cancelWhenGone(cancel, func(p int, err error) error {
		return &transport.PeerError{Peer: p, Op: "board", Err: err}
	}, peers...)
	err := j.Joined(cctx)
	stop()
	if err != nil {
		peer := -1 // rank 0 hands the board to every rank
		if e.rank != 0 {
			peer = 0 // and the others wait for it
		}
		var pe *transport.PeerError
		if errors.As(context.Cause(cctx), &pe) {
			peer = pe.Peer
		}
		return &StepError{Channel: 0, Piece: 0, Step: -1, Kind: algorithms.SendRecv, Peer: peer, Err: err}
	}
	// The joiner passes every call on to the board it joined: call that
	// board itself from now on (an interface call less per use).
	e.board = j.JoinedBoard()
	e.boardUp = true
	return nil
}

// markOff records on the board that collective seq runs elsewhere.
func (e *Engine) markOff(op *Op, seq uint64, sig uint32) {
	if e.board != nil && op.Coll != algorithms.CollSend && op.Coll != algorithms.CollRecv {
		e.board.Mark(seq, sig)
	}
}

// markReached marks collective seq on the board to say that this rank
// has got that far, on the board's multiples only
// (transport.BoardMarkEvery).
func (e *Engine) markReached(seq uint64, sig uint32) {
	if seq%e.markEvery == 0 {
		e.board.Mark(seq, sig)
	}
}

// boardAgain reports whether op has the key of the last board operation,
// so that Run's checks have passed for its key before (host memory on a
// host communicator, no uneven blocks, a size the board holds, the board
// joined) and it may go straight to runOnBoard, a broadcast to
// boardBroadcast: on 2 ranks that took an 8-byte broadcast from 0.275 µs
// to 0.223 in a slow state of the VM, a reduce from 0.161 to 0.149
// (docs/performance.md, "The 8-byte broadcast's layers, measured one by
// one").
func (e *Engine) boardAgain(op *Op) bool {
	k := &e.boardK
	return k.set && e.boardUp && k.key.is(e, op) && op.InOffs == nil && op.OutOffs == nil && !onDevice(op)
}

// boardBroadcast runs a broadcast on the board whose signature e.boardK
// holds: the root posts its input and the others read it.
func (e *Engine) boardBroadcast(ctx context.Context, op *Op, seq uint64) (*Plan, error) {
	sig := e.boardK.sig
	pl := e.boardRun(op, seq, sig)
	nb := op.Count * op.Type.Size()
	if err := e.board.Begin(); err != nil {
		return pl, boardFail(-1, err)
	}
	defer e.board.End()
	if root := op.Root; e.rank != root {
		// Reached this collective (done reading the last): the root may
		// reuse the entry this reader read last.
		e.markReached(seq, sig)
		data, err := e.readPost(ctx, root, seq, sig, nb)
		if err != nil {
			return pl, err
		}
		copy(op.Out.Bytes()[:nb], data)
		return pl, nil
	}
	if e.boardWaits == nil {
		e.boardPeer.Store(-1)
	}
	in := op.In.Bytes()[:nb]
	if err := e.board.Post(ctx, seq, sig, in); err != nil {
		return pl, boardFail(-1, err)
	}
	if !op.Out.SameStart(op.In) {
		copy(op.Out.Bytes()[:nb], in)
	}
	return pl, nil
}

// boardRun returns the plan of a board operation of signature sig (the
// engine's own, set again only when the last one differs) and has
// Progress report it.
func (e *Engine) boardRun(op *Op, seq uint64, sig uint32) *Plan {
	pl := &e.runPlan
	if pl.Sched != &boardSched || pl.Sig != sig {
		*pl = boardPlan(op, seq, sig)
	}
	pl.Seq = seq
	// Progress reads curSched. It stays set after a board operation (a
	// store on the way in and out, each a fenced exchange, was a tenth of
	// an 8-byte broadcast's time, docs/performance.md); Progress says what
	// runs only while an operation does, which its callers know.
	if e.curSched.Load() != &boardSched {
		e.curSched.Store(&boardSched)
	}
	return pl
}

// boardFail is a board operation's failure, waiting for peer (-1: none).
func boardFail(peer int, err error) error {
	return &StepError{Channel: 0, Piece: 0, Step: 0, Kind: algorithms.SendRecv, Peer: peer, Err: err}
}

// readPost returns rank r's post for collective seq, checked against this
// rank's signature sig and its size in bytes.
func (e *Engine) readPost(ctx context.Context, r int, seq uint64, sig uint32, size int) ([]byte, error) {
	if e.boardWaits == nil {
		e.boardPeer.Store(int32(r))
	}
	got, data, posted, err := e.board.Read(ctx, r, seq)
	if err != nil {
		return nil, boardFail(r, err)
	}
	if !posted || got != sig || len(data) != size {
		return nil, boardFail(r, &MismatchError{Peer: r, Got: transport.Tag{Op: seq, Sig: got}, Want: transport.Tag{Op: seq, Sig: sig},
			GotBytes: len(data), WantBytes: size, OffBoard: !posted})
	}
	return data, nil
}

// runOnBoard runs a small collective on the board.
func (e *Engine) runOnBoard(ctx context.Context, op *Op, seq uint64) (*Plan, error) {
	k := &e.boardK
	if !k.set || !k.key.is(e, op) || op.PreMul {
		k.key, k.sig, k.set = e.keyOf(op), boardPlan(op, seq, 0).Sig, true
		k.host.setup(op, e.nranks) // (a pre-multiplied sum's scale may differ from the last)
	}
	if op.Coll == algorithms.CollBroadcast {
		return e.boardBroadcast(ctx, op, seq)
	}
	pl := e.boardRun(op, seq, k.sig)
	n, me := e.nranks, e.rank
	nb := op.Count * op.Type.Size() // one block
	post := int(boardPost(op, n))
	if e.boardWaits == nil {
		e.boardPeer.Store(-1)
	}
	// What Read returns is the board's memory: it must stay mapped until
	// this collective is done with it, whatever aborts meanwhile.
	if err := e.board.Begin(); err != nil {
		return pl, boardFail(-1, err)
	}
	defer e.board.End()
	in := op.In.Bytes()[:post]
	if op.PreMul {
		// A pre-multiplied sum posts and folds its input scaled, made
		// once in scratch (it is small).
		in = k.host.scaleInto(&e.boardScaled, in)
	}
	// What this rank takes of its own post: its input, or a
	// reduce-scatter's block of it. In place, the output overwrites the
	// input before this rank's turn in a reduction comes: keep a copy.
	mine := in
	if op.Coll == algorithms.CollReduceScatter {
		mine = in[me*nb : (me+1)*nb]
	}
	if op.Coll.Reduces() && !op.PreMul && op.In.Overlaps(op.Out) {
		e.boardMine = append(e.boardMine[:0], mine...)
		mine = e.boardMine
	}
	if op.Coll == algorithms.CollReduce && me == op.Root {
		// A reduce's root posts nothing (nobody reads it): its mark says
		// it is done reading what the others posted for earlier ones.
		e.markReached(seq, pl.Sig)
	} else if err := e.board.Post(ctx, seq, pl.Sig, in); err != nil {
		return pl, boardFail(-1, err)
	}
	switch {
	case op.Coll == algorithms.CollReduce && me != op.Root:
		// Only the root reads the posts: the other posters learn from this
		// mark, made after the post (a mark before it would read as
		// having gone past without posting), that this rank is here.
		e.markReached(seq, pl.Sig)
		return pl, nil
	}
	// from returns what this rank takes of rank r's post: all of it, or
	// its own block of a reduce-scatter's.
	from := func(r int) ([]byte, error) {
		if r == me {
			return mine, nil
		}
		data, err := e.readPost(ctx, r, seq, pl.Sig, post)
		if err != nil || op.Coll != algorithms.CollReduceScatter {
			return data, err
		}
		return data[me*nb : (me+1)*nb], nil
	}
	for r := range n {
		src, err := from(r)
		if err != nil {
			return pl, err
		}
		if op.Coll == algorithms.CollAllGather {
			if dst := op.Out.Slice(r*nb, (r+1)*nb); r != me || !dst.SameStart(op.In) {
				copy(dst.Bytes(), src)
			}
			continue
		}
		// All-reduce, reduce-scatter: fold this rank's block of every post.
		k.host.fold(op.Out.Bytes()[:nb], src, r, n)
	}
	return pl, nil
}

// boardProgress is Progress during a board operation.
func (e *Engine) boardProgress() []Progress {
	peer := int(e.boardPeer.Load())
	if e.boardWaits != nil {
		peer = e.boardWaits.Waiting()
	}
	return []Progress{{Channel: 0, Step: 0, Kind: algorithms.SendRecv, Peer: peer}}
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
		what = fmt.Sprintf("both called %s, with a different count, or with its buffers in device memory and this rank's on the host (a device operation never goes on the board)", w.call())
	}
	return fmt.Sprintf("rank %d did not post operation %d on the shared board, where this rank waits for %d bytes: %s",
		e.Peer, e.Want.Op, e.WantBytes, what)
}
