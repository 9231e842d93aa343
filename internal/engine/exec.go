package engine

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// chanRun executes one channel's share of an operation: its pieces, each
// through the whole schedule, slice by slice.
type chanRun struct {
	// Set by setup, read by run.
	sched          *algorithms.Schedule
	unwritten      []bool
	layout         algorithms.Layout
	lo, hi, pieces int // this channel's pieces [lo, hi) of pieces
	esize          int
	slice          int // elements per slice
	in, out        []byte
	red, final     kernels.Func
	kt             kernels.Type // what red, final, post and the streaming kernels are for
	kop            kernels.Op
	// stream: the output is too large for the caches, so writes to it use
	// streaming stores (see streamBytes): the kernels below, and
	// kernels.CopyStream.
	stream       bool
	redS, finalS kernels.Func
	red2, final2 kernels.Func2
	post         func(dst, src []byte)
	seq          uint64
	sig          uint32
	aliased      bool // Input and Output overlap (an in-place operation)
	ch           int

	conns        []transport.Conn // by peer
	connBase     int              // the channel number conns are for, minus this run's index
	sent, recvd  []uint32         // messages so far this operation, by peer
	spans        [3][]algorithms.Span
	cached       [][][3][]algorithms.Span // Plan.spans
	piece, stepI int                      // position, for errors
	prog         *atomic.Int64            // position for Engine.Progress: piece<<32 | step+1
	lastYield    int64                    // nanotime; see yield
	steps        uint32                   // steps since the clock was last read
}

// yieldEvery is how often a channel's goroutine yields (see yield), and
// yieldCheck how many steps pass between looks at the clock.
const (
	yieldEvery = 4 * time.Millisecond
	yieldCheck = 32
)

// yield gives the goroutine back to the scheduler every few milliseconds.
// A rank whose peers keep up never blocks (the transports poll), and a
// goroutine that runs 10 ms without a scheduling point makes the
// runtime's sysmon preempt it and retake its P from system calls, after
// which sysmon polls every 20 µs and wakes threads on cores the peers need
// (docs/performance.md measured 9% of the CPU in sysmon's wake-ups). Not
// more often than needed: each Gosched wakes an idle P's thread, which
// spins, finds nothing and sleeps again (two futex calls and a context
// switch; once a millisecond that was 8% of an oversubscribed 8-byte
// all-reduce, docs/performance.md).
//
// The clock is read every yieldCheck steps only: a read costs about
// 100 ns in this VM (vDSO clock_gettime), as much as a small step.
func (x *chanRun) yield() {
	if x.steps++; x.steps < yieldCheck {
		return
	}
	x.steps = 0
	if now := nanotime(); now-x.lastYield > int64(yieldEvery) {
		x.lastYield = now
		runtime.Gosched()
	}
}

// nanotime is the runtime's monotonic clock: time.Now also reads the wall
// clock, which costs as much again, once per step.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

func (x *chanRun) setup(e *Engine, op *Op, pl *Plan, c int) {
	x.sched = pl.Sched
	x.unwritten = pl.Unwritten
	x.layout = pl.layout
	x.pieces = pl.Pieces
	x.lo, x.hi = c*pl.Pieces/pl.Channels, (c+1)*pl.Pieces/pl.Channels
	x.esize = op.Type.Size()
	x.slice = pl.SliceElems
	x.in, x.out = nil, nil
	if op.In.Len() > 0 {
		x.in = op.In.Bytes()
	}
	if op.Out.Len() > 0 {
		x.out = op.Out.Bytes()
	}
	if !op.Coll.Reduces() {
		x.red, x.final, x.post = nil, nil, nil
	} else if x.red == nil || x.kt != op.Type || x.kop != op.Red {
		x.red = kernels.Reduce(op.Type, op.Red)
		x.final = kernels.ReduceFinal(op.Type, op.Red, e.nranks)
		x.post = kernels.Post(op.Type, op.Red, e.nranks)
		x.redS = kernels.ReduceStream(op.Type, op.Red)
		x.finalS = kernels.ReduceFinalStream(op.Type, op.Red, e.nranks)
		x.red2 = kernels.ReduceStream2(op.Type, op.Red)
		x.final2 = kernels.ReduceFinalStream2(op.Type, op.Red, e.nranks)
		x.kt, x.kop = op.Type, op.Red
	}
	x.stream = op.Out.Len() >= streamBytes
	x.seq = pl.Seq
	x.sig = pl.Sig
	x.cached = pl.spans
	x.aliased = op.In.Overlaps(op.Out)
	x.ch = c
	clear(x.sent)
	clear(x.recvd)
}

func (x *chanRun) run(ctx context.Context) error {
	for p := x.lo; p < x.hi; p++ {
		x.piece = p
		for i := range x.sched.Steps {
			x.stepI = i
			x.prog.Store(int64(p)<<32 | int64(i+1))
			x.yield()
			st := &x.sched.Steps[i]
			var err error
			if st.Kind.Exchange() {
				err = x.exchange(ctx, st)
			} else {
				err = x.lockstep(ctx, st)
			}
			if err != nil {
				return err
			}
		}
	}
	// Everything posted must have left before the caller may reuse its
	// buffers (slices sent straight from them) or this rank goes quiet
	// (slices still queued in the transport).
	x.stepI = -1
	if peer, err := x.flush(ctx); err != nil {
		return &StepError{Channel: x.ch, Piece: x.hi - 1, Step: len(x.sched.Steps), Kind: algorithms.Send, Peer: peer, Err: err}
	}
	return nil
}

// flush waits until everything posted on the run's connections has left,
// and returns the peer of the first connection that fails.
func (x *chanRun) flush(ctx context.Context) (int, error) {
	for peer, c := range x.conns {
		if f, ok := c.(transport.Flusher); ok && c != nil {
			if err := f.Flush(ctx); err != nil {
				return peer, err
			}
		}
	}
	return -1, nil
}

func (x *chanRun) fail(st *algorithms.Step, peer int, err error) error {
	return &StepError{Channel: x.ch, Piece: x.piece, Step: x.stepI, Kind: st.Kind, Peer: peer, Err: err}
}

func (x *chanRun) spansOf(i int, ref algorithms.Ref) []algorithms.Span {
	if x.cached != nil {
		return x.cached[x.piece][x.stepI][i]
	}
	x.spans[i] = x.spans[i][:0]
	if ref.Buf != algorithms.NoBuf {
		x.spans[i] = x.layout.Spans(x.spans[i], ref, x.sched.Minor, x.piece, x.pieces)
	}
	return x.spans[i]
}

func (x *chanRun) buf(b algorithms.Buf) []byte {
	if b == algorithms.Input {
		return x.in
	}
	return x.out
}

func sameStart(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// recvSlice waits for the next slice from peer and checks that it is the
// one this rank expects.
func (x *chanRun) recvSlice(ctx context.Context, st *algorithms.Step, c transport.Conn, peer int, slice uint32, n int) ([]byte, error) {
	b, tag, err := c.Wait(ctx)
	if err != nil {
		return nil, x.fail(st, peer, err)
	}
	want := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.recvd[peer], Slice: slice}
	if tag != want || b.Len() != n {
		c.Release()
		return nil, x.fail(st, peer, &MismatchError{Peer: peer, Got: tag, Want: want, GotBytes: b.Len(), WantBytes: n})
	}
	return b.Bytes(), nil
}

// recvInto lands the next slice from peer in dst and checks it.
func (x *chanRun) recvInto(ctx context.Context, st *algorithms.Step, dr transport.DirectReceiver, peer int, slice uint32, dst []byte) error {
	tag, n, err := dr.WaitInto(ctx, memory.HostBuffer(dst))
	want := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.recvd[peer], Slice: slice}
	if errors.Is(err, transport.ErrSizeMismatch) || (err == nil && tag != want) {
		return x.fail(st, peer, &MismatchError{Peer: peer, Got: tag, Want: want, GotBytes: n, WantBytes: len(dst)})
	}
	if err != nil {
		return x.fail(st, peer, err)
	}
	return nil
}

// lockstep runs a step whose local operand, destination, incoming and
// outgoing streams all walk the same blocks, slice by slice: receive a
// slice, reserve the outgoing slot, compute into it, post, release.
func (x *chanRun) lockstep(ctx context.Context, st *algorithms.Step) error {
	es := x.esize
	srcS := algorithms.NewSlicer(x.spansOf(0, st.Src), x.slice)
	dstS := algorithms.NewSlicer(x.spansOf(1, st.Dst), x.slice)
	hasSrc, hasDst := st.Src.Buf != algorithms.NoBuf, st.Dst.Buf != algorithms.NoBuf
	srcBuf, dstBuf := x.buf(st.Src.Buf), x.out
	var rc, sc transport.Conn
	rpeer, speer := int(st.RecvPeer), int(st.SendPeer)
	if st.Kind.Receives() {
		rc = x.conns[rpeer]
	}
	if st.Kind.Sends() {
		sc = x.conns[speer]
	}
	red := x.red // into a slot
	if st.Final {
		red = x.final
	}
	redOut := x.reducer(st.Final) // into the output
	// Direct paths, where the transport offers them: land incoming data
	// straight in the destination when it is only copied there (recv,
	// recvCopySend), and send straight from the user's buffers what no
	// later step overwrites before the transport has sent it: the input of
	// an operation that does not run in place, or blocks no later step
	// writes (Plan.Unwritten). The engine flushes before it returns.
	var dr transport.DirectReceiver
	if rc != nil && (st.Kind == algorithms.Recv || st.Kind == algorithms.RecvCopySend) {
		dr, _ = rc.(transport.DirectReceiver)
	}
	var ds transport.DirectSender
	if sc != nil && (x.unwritten[x.stepI] || (st.Src.Buf == algorithms.Input && !x.aliased && (st.Kind == algorithms.Send || st.Kind == algorithms.CopySend))) {
		ds, _ = sc.(transport.DirectSender)
	}
	for sl := uint32(0); ; sl++ {
		var srcOff, dstOff, n int
		var ok bool
		if hasSrc {
			srcOff, n, ok = srcS.Next()
		}
		if hasDst {
			dstOff, n, ok = dstS.Next()
		}
		if !ok {
			break
		}
		nb := n * es
		var src, dst, in, out []byte
		if hasSrc {
			src = srcBuf[srcOff*es : srcOff*es+nb]
		}
		if hasDst {
			dst = dstBuf[dstOff*es : dstOff*es+nb]
		}
		switch {
		case dr != nil:
			if err := x.recvInto(ctx, st, dr, rpeer, sl, dst); err != nil {
				return err
			}
			in = dst
		case rc != nil:
			var err error
			if in, err = x.recvSlice(ctx, st, rc, rpeer, sl, nb); err != nil {
				return err
			}
		}
		if ds != nil {
			// The step's value lives in the user's memory: compute it there
			// and send it from there.
			from := dst
			switch st.Kind {
			case algorithms.Send:
				from = src
			case algorithms.CopySend:
				from = src
				if !sameStart(dst, src) {
					copy(dst, src)
				}
			case algorithms.RecvCopySend:
				if dr == nil {
					copy(dst, in)
				}
			case algorithms.RecvReduceCopySend:
				red(dst, in, src)
			}
			if rc != nil && dr == nil {
				if err := rc.Release(); err != nil {
					return x.fail(st, rpeer, err)
				}
			}
			tag := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[speer], Slice: sl}
			if err := ds.PostFrom(memory.HostBuffer(from), tag); err != nil {
				return x.fail(st, speer, err)
			}
			continue
		}
		if sc != nil {
			b, err := sc.Reserve(ctx, nb)
			if err != nil {
				if rc != nil && dr == nil {
					rc.Release()
				}
				return x.fail(st, speer, err)
			}
			out = b.Bytes()
		}
		switch st.Kind {
		case algorithms.Copy:
			x.copyFinal(dst, src, st.Final)
		case algorithms.Send:
			copy(out, src)
		case algorithms.Recv:
			if dr == nil {
				x.copyOut(dst, in)
			}
		case algorithms.CopySend:
			copy(out, src)
			if !sameStart(dst, src) {
				x.copyOut(dst, src)
			}
		case algorithms.RecvReduceSend:
			red(out, in, src)
		case algorithms.RecvReduceCopy:
			redOut(dst, in, src)
		case algorithms.Reduce:
			redOut(dst, dst, src)
		case algorithms.RecvReduceCopySend:
			if x.stream {
				// One pass: the output by streaming stores, the slot
				// (read by the next rank soon) through the caches.
				red2 := x.red2
				if st.Final {
					red2 = x.final2
				}
				red2(dst, out, in, src)
			} else {
				red(dst, in, src)
				copy(out, dst)
			}
		case algorithms.RecvCopySend:
			if dr == nil {
				x.copyOut(dst, in)
			}
			copy(out, in)
		}
		if sc != nil {
			if err := sc.Post(nb, transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[speer], Slice: sl}); err != nil {
				if rc != nil && dr == nil {
					rc.Release()
				}
				return x.fail(st, speer, err)
			}
		}
		if rc != nil && dr == nil {
			if err := rc.Release(); err != nil {
				return x.fail(st, rpeer, err)
			}
		}
	}
	if rc != nil {
		x.recvd[rpeer]++
	}
	if sc != nil {
		x.sent[speer]++
	}
	return nil
}

// copyFinal copies src to dst, applying the operator's post-processing if
// the copy completes a reduction (a single rank's Avg).
func (x *chanRun) copyFinal(dst, src []byte, final bool) {
	if final && x.post != nil {
		x.post(dst, src)
		return
	}
	if !sameStart(dst, src) {
		x.copyOut(dst, src)
	}
}

// streamBytes is the output size from which writes to the output use
// streaming stores. Below it the output may still be in the caches when
// the caller reads it; above it, it cannot be (2 MiB of L2 per core here),
// and a streaming store saves the read of each line before it is written:
// docs/performance.md measured a 64 MiB reduction 1.5x and a copy 2.3x
// faster that way.
const streamBytes = 8 << 20

// copyOut copies to the output.
func (x *chanRun) copyOut(dst, src []byte) {
	if x.stream {
		kernels.CopyStream(dst, src)
	} else {
		copy(dst, src)
	}
}

// reducer returns the kernel for a reduction into the output.
func (x *chanRun) reducer(final bool) kernels.Func {
	switch {
	case x.stream && final:
		return x.finalS
	case x.stream:
		return x.redS
	case final:
		return x.final
	}
	return x.red
}

// exchange runs SendRecv and SendRecvReduceCopy: per round, send the next
// outgoing slice (if any), then take the next incoming one (if any). Each
// outgoing slice is copied into its slot before the incoming slice of the
// same round is written, which is what makes recursive doubling's
// in-place exchange safe.
func (x *chanRun) exchange(ctx context.Context, st *algorithms.Step) error {
	es := x.esize
	txS := algorithms.NewSlicer(x.spansOf(2, st.Tx), x.slice)
	dstS := algorithms.NewSlicer(x.spansOf(1, st.Dst), x.slice)
	srcS := algorithms.NewSlicer(x.spansOf(0, st.Src), x.slice)
	txBuf, srcBuf := x.buf(st.Tx.Buf), x.buf(st.Src.Buf)
	rpeer, speer := int(st.RecvPeer), int(st.SendPeer)
	rc, sc := x.conns[rpeer], x.conns[speer]
	red := x.reducer(st.Final) // into the output
	reduces := st.Kind.Reduces()
	var txSl, rxSl uint32
	for !txS.Done() || !dstS.Done() {
		if off, n, ok := txS.Next(); ok {
			nb := n * es
			b, err := sc.Reserve(ctx, nb)
			if err != nil {
				return x.fail(st, speer, err)
			}
			copy(b.Bytes(), txBuf[off*es:off*es+nb])
			if err := sc.Post(nb, transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[speer], Slice: txSl}); err != nil {
				return x.fail(st, speer, err)
			}
			txSl++
		}
		if off, n, ok := dstS.Next(); ok {
			nb := n * es
			in, err := x.recvSlice(ctx, st, rc, rpeer, rxSl, nb)
			if err != nil {
				return err
			}
			dst := x.out[off*es : off*es+nb]
			if reduces {
				soff, _, _ := srcS.Next()
				red(dst, in, srcBuf[soff*es:soff*es+nb])
			} else {
				x.copyOut(dst, in)
			}
			if err := rc.Release(); err != nil {
				return x.fail(st, rpeer, err)
			}
			rxSl++
		}
	}
	x.sent[speer]++
	x.recvd[rpeer]++
	return nil
}
