package engine

import (
	"context"
	"sync/atomic"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// A OneShot all-reduce whose whole input is one slice (a small operation,
// where the algorithm is worth running at all) is one exchange: post the
// input to every peer, then reduce the n contributions in rank order as
// they are received. oneShot runs it straight on the connections, without
// the schedule's 2n-1 steps and their slicers: on oversubscribed cores
// each rank's turn on a core is short, and docs/performance.md measured
// the step machinery as the larger part of it. The slices, tags and
// results are the schedule's own.

// isOneShot reports whether pl runs as one exchange (see oneShot).
func isOneShot(op *Op, pl *Plan) bool {
	return pl.Algo == algorithms.OneShot && pl.Channels == 1 && pl.Pieces == 1 &&
		op.Coll == algorithms.CollAllReduce && op.Count <= pl.SliceElems
}

// oneShotStep stands for the exchange in errors and progress reports,
// oneShotSched in Engine.Progress, which reports the peer in waitPeer.
var (
	oneShotStep  = algorithms.Step{Kind: algorithms.SendRecv}
	oneShotSched = algorithms.Schedule{Steps: []algorithms.Step{oneShotStep}}
)

// oneShot runs the exchange; it keeps the peer it waits on in waitPeer.
func (x *chanRun) oneShot(ctx context.Context, rank, nranks int, waitPeer *atomic.Int32) error {
	nb := x.in.Len()
	x.piece, x.stepI = 0, 0
	x.prog.Store(1)
	tag := transport.Tag{Op: x.seq, Sig: x.sig}
	mine := x.in
	if x.premul {
		// A pre-multiplied sum: the input scaled once, into scratch (it
		// is small), is what this rank posts and folds.
		mine = memory.HostBuffer(x.host.scaleInto(&x.scaled, x.in.Bytes()))
	}
	for i := 1; i < nranks; i++ {
		// Each rank starts with the peer after it, so that no rank receives
		// every first post at once.
		p := (rank + i) % nranks
		c := x.conns[p]
		waitPeer.Store(int32(p))
		b, err := c.Reserve(ctx, nb)
		if err != nil {
			return x.fail(&oneShotStep, p, err)
		}
		err = x.dp.copy(b, mine, slotSink(farSlots(c)))
		if err == nil {
			err = x.dp.fence(ctx)
		}
		if err != nil {
			return x.fail(&oneShotStep, -1, err)
		}
		if err := c.Post(nb, tag); err != nil {
			return x.fail(&oneShotStep, p, err)
		}
	}
	// In place, from rank 2 on, the engine has made x.in a copy of the
	// input (Schedule.CopyInPlace), so writing the output does not change
	// it. Ranks 0 and 1 fold their own term first: rank 0 starts from it,
	// rank 1 reduces rank 0's slot with it straight into the output, one
	// element at a time, as the schedule's recvReduceCopy does.
	out := x.out.Slice(0, nb)
	for r := range nranks {
		src := mine
		if r == rank && rank == 1 {
			continue // folded with rank 0's
		}
		if r != rank {
			waitPeer.Store(int32(r))
			in, err := x.recvSlice(ctx, &oneShotStep, x.conns[r], r, 0, nb)
			if err != nil {
				return err
			}
			src = in
		}
		var err error
		if r == 0 && rank == 1 {
			err = x.dp.reduce(out, src, mine, nranks == 2, sinkOut)
		} else {
			err = accumulate(x.dp, out, src, r, nranks)
		}
		if err == nil && r != rank {
			err = x.dp.fence(ctx)
		}
		if err != nil {
			if r != rank {
				x.conns[r].Release()
			}
			return x.fail(&oneShotStep, -1, err)
		}
		if r != rank {
			if err := x.conns[r].Release(); err != nil {
				return x.fail(&oneShotStep, r, err)
			}
		}
	}
	if err := x.dp.fence(ctx); err != nil {
		return x.fail(&oneShotStep, -1, err)
	}
	if p, err := x.flush(ctx); err != nil {
		return x.fail(&oneShotStep, p, err)
	}
	x.prog.Store(progDone)
	return nil
}

// accumulate folds rank r's contribution src into out, in rank order, so
// that every rank that runs the same sequence gets the same bits: the
// first is copied, the last reduced with the operator's final step
// (Avg's division). On host memory it is hostPath.fold, called directly:
// at a few bytes the data path's calls would cost more than the work.
func accumulate(dp path, out, src memory.Buffer, r, n int) error {
	if dp.host != nil {
		dp.host.fold(out.Bytes(), src.Bytes(), r, n)
		return nil
	}
	switch r {
	case 0:
		if !out.SameStart(src) {
			return dp.copy(out, src, sinkNear)
		}
		return nil
	case n - 1:
		return dp.reduce(out, out, src, true, sinkNear)
	}
	return dp.reduce(out, out, src, false, sinkNear)
}
