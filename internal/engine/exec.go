package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/clock"
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
	in, out        memory.Buffer
	dp             path // host or dev, by the operation's memory
	host           hostPath
	dev            devPath // its stream is made on the first device operation
	seq            uint64
	sig            uint32
	aliased        bool   // Input and Output overlap (an in-place operation)
	premul         bool   // a pre-multiplied sum: reads of the input are scaled (hostPath.scaleBy)
	scaled         []byte // oneShot's scaled input
	ch             int
	// landsOnly: every receive of the operation lands in the output (a
	// host broadcast or all-gather), where a transport.PeerCopier's
	// receiver copies straight from the sender; opBytes is its size.
	landsOnly bool
	opBytes   int64
	nranks    int
	// exchanges: every rank sends and receives throughout (a host
	// all-gather), which a transport.PageLender weighs.
	exchanges bool
	// recvBlocks: the connection this run's receive steps peeked at
	// (blocks), told how the run went when it ends; blockSteps and
	// slotSteps count the steps that came in blocks and the others; start
	// is when the run began (clock.Now), read only where recvBlocks is
	// set.
	recvBlocks            transport.BlockCopier
	blockSteps, slotSteps int
	start                 int64
	// blockOp: whether the operation's steps may be cut into blocks
	// (blocksLand: a 2-rank host broadcast or all-gather; blocksReduce: a
	// 2-rank host reduce or reduce-scatter); scratch lands the blocks an
	// in-place reduction reads.
	blockOp blockOp
	scratch []byte
	// sharedIn, sharedOut: the operation's buffers lie, wholly or in
	// part, in shared allocations (memory.AllocShared, or a registration's
	// whole pages), which a transport.PeerMapper's receiver maps (a slice
	// outside them goes the ordinary way: PostFrom decides per slice);
	// landsShared: every receive lands in the output (all-gather,
	// broadcast), where the receiver copies straight into it.
	sharedIn, sharedOut, landsShared bool

	io           lockIO           // the lockstep step running (setLockIO)
	conns        []transport.Conn // by peer
	connBase     int              // the channel number conns are for, minus this run's index
	sent, recvd  []uint32         // messages so far this operation, by peer
	spans        [3][]algorithms.Span
	cached       [][][3][]algorithms.Span // Plan.spans
	piece, stepI int                      // position, for errors
	prog         *atomic.Int64            // position for Engine.Progress: piece<<32 | step+1
	lastYield    int64                    // clock.Now; see yield
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
// The clock is read every yieldCheck steps only: a read of the runtime's
// clock costs 25-100 ns in the VMs here (vDSO clock_gettime), as much as
// a small step; clock.Now, 10-20 ns where it reads the counter.
func (x *chanRun) yield() {
	if x.steps++; x.steps < yieldCheck {
		return
	}
	x.steps = 0
	if now := clock.Now(); now-x.lastYield > int64(yieldEvery) {
		x.lastYield = now
		runtime.Gosched()
	}
}

// blockOp says whether, and how, an operation's steps may be cut into
// blocks (transport.BlockCopier).
type blockOp uint8

const (
	noBlocks     blockOp = iota
	blocksLand           // 2-rank host broadcast, all-gather: recv lands each block
	blocksReduce         // 2-rank host reduce, reduce-scatter: recvReduceCopy reduces each where it lands
)

func (x *chanRun) setup(e *Engine, op *Op, pl *Plan, c int, dev bool) {
	x.sched = pl.Sched
	x.unwritten = pl.Unwritten
	x.layout = pl.layout
	x.pieces = pl.Pieces
	x.lo, x.hi = c*pl.Pieces/pl.Channels, (c+1)*pl.Pieces/pl.Channels
	x.esize = op.Type.Size()
	x.slice = pl.SliceElems
	x.in, x.out = op.In, op.Out
	if dev {
		x.dev.setup(op, e.nranks)
		x.dp = path{dp: &x.dev}
	} else {
		x.host.setup(op, e.nranks)
		x.dp = path{host: &x.host}
	}
	x.seq = pl.Seq
	x.sig = pl.Sig
	x.cached = pl.spans
	x.aliased = op.In.Overlaps(op.Out)
	x.premul = op.PreMul && !dev
	x.ch = c
	// A broadcast on two ranks too (it was left out on the reasoning that
	// the root's copy into the slots runs beside the receiver's copy out
	// of them): measured with the single copy on, 2 ranks over shared
	// memory, it takes 0.41-0.54 of the slots' time at 64 KiB-1 MiB when
	// the root rewrites its input before every operation, and 0.16-0.31
	// when it does not, where the slots' hand-overs between the cores are
	// slow; 0.95-1.05 where they are fast (docs/performance.md, "Shared
	// memory at mid sizes on a fast day"). Whether the single copy is
	// offered at all is the transport's choice (shm.Options.CMA).
	x.landsOnly = !dev && (op.Coll == algorithms.CollAllGather || op.Coll == algorithms.CollBroadcast)
	x.exchanges = !dev && op.Coll == algorithms.CollAllGather
	// Slices of shared allocations go by reference in 2-rank broadcasts
	// too: the receiver's one copy straight out of the root's buffer
	// takes 0.55-0.6 of the slots' two, side by side as they are
	// (docs/performance.md, "MemAlloc").
	//
	// In the other collectives a step that sends the input as it is
	// (a reduce's leaves, the first step of a ring) sends it by
	// reference too, and the receiver reduces straight out of it. The
	// output blocks of an all-reduce's all-gather half went that way as
	// well (0.82-0.87 of the slots' time at 1-4 MiB, docs/performance.md,
	// "MemAlloc") until the slots were written with streaming stores
	// (transport.FarSlots): the sender's next reduction into an output
	// its peer has just read then waits for those lines as a plain store
	// into a slot did, and the slots take 0.4-0.45 of that time at 1 MiB
	// (docs/performance.md, "Streaming stores into the slots").
	x.sharedIn, x.sharedOut, x.landsShared = false, false, false
	if !dev {
		x.landsShared = op.Coll == algorithms.CollAllGather || op.Coll == algorithms.CollBroadcast
		x.sharedIn = memory.SharesAny(op.In)
		x.sharedOut = memory.SharesAny(op.Out)
	}
	x.opBytes = op.Bytes(e.nranks)
	x.nranks = e.nranks
	x.recvBlocks, x.blockSteps, x.slotSteps = nil, 0, 0
	x.blockOp = noBlocks
	if !dev && e.nranks == 2 && !x.premul {
		switch op.Coll {
		case algorithms.CollBroadcast, algorithms.CollAllGather:
			x.blockOp = blocksLand
		case algorithms.CollReduce, algorithms.CollReduceScatter:
			x.blockOp = blocksReduce
		}
	}
	clear(x.sent)
	clear(x.recvd)
}

func (x *chanRun) run(ctx context.Context) error {
	if x.blockOp != noBlocks {
		x.start = clock.Now()
	}
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
	// (slices still queued in the transport), and the output must be
	// complete (device work still running).
	x.stepI = -1
	if err := x.dp.fence(ctx); err != nil {
		return &StepError{Channel: x.ch, Piece: x.hi - 1, Step: len(x.sched.Steps), Kind: algorithms.Copy, Peer: -1, Err: err}
	}
	if peer, err := x.flush(ctx); err != nil {
		return &StepError{Channel: x.ch, Piece: x.hi - 1, Step: len(x.sched.Steps), Kind: algorithms.Send, Peer: peer, Err: err}
	}
	if x.recvBlocks != nil {
		x.recvBlocks.Received(x.opBytes, x.blockOp == blocksReduce, x.blockSteps, x.blockSteps+x.slotSteps, time.Duration(clock.Now()-x.start))
	}
	x.prog.Store(progDone)
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

func (x *chanRun) buf(b algorithms.Buf) memory.Buffer {
	if b == algorithms.Input {
		return x.in
	}
	return x.out
}

// recvSlice waits for the next slice from peer and checks that it is the
// one this rank expects.
func (x *chanRun) recvSlice(ctx context.Context, st *algorithms.Step, c transport.Conn, peer int, slice uint32, n int) (memory.Buffer, error) {
	b, tag, err := c.Wait(ctx)
	if err != nil {
		return b, x.fail(st, peer, err)
	}
	want := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.recvd[peer], Slice: slice}
	if tag != want || b.Len() != n {
		c.Release()
		return b, x.fail(st, peer, &MismatchError{Peer: peer, Got: tag, Want: want, GotBytes: b.Len(), WantBytes: n})
	}
	return b, nil
}

// recvInto lands the next slice from peer in dst and checks it.
func (x *chanRun) recvInto(ctx context.Context, st *algorithms.Step, dr transport.DirectReceiver, peer int, slice uint32, dst memory.Buffer) error {
	tag, n, err := dr.WaitInto(ctx, dst)
	want := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.recvd[peer], Slice: slice}
	if errors.Is(err, transport.ErrSizeMismatch) || (err == nil && tag != want) {
		return x.fail(st, peer, &MismatchError{Peer: peer, Got: tag, Want: want, GotBytes: n, WantBytes: dst.Len()})
	}
	if err != nil {
		return x.fail(st, peer, err)
	}
	return nil
}

// A lockstep step walks its local operand (src), its destination (dst),
// its incoming and its outgoing stream over the same blocks, slice by
// slice. Each slice is one value put in up to two places:
//
//   - the value's source is the local operand (copy, send, copySend), the
//     incoming slice (recv, recvCopySend), or the incoming slice reduced
//     with the local operand (the recvReduce kinds; reduce folds src into
//     dst);
//   - its sinks are the destination, the outgoing slot, or both.
//
// lockIO holds what a step's slices share: the connections, and the
// direct paths the transport offers.
type lockIO struct {
	st         *algorithms.Step
	srcS, dstS algorithms.Slicer
	hasSrc     bool
	hasDst     bool
	srcBuf     memory.Buffer
	// scaled: src is the input of a pre-multiplied sum, scaled as it is
	// read (scaledCompute).
	scaled       bool
	rc, sc       transport.Conn
	rpeer, speer int
	// far: another core reads sc's slots next (transport.FarSlots), so
	// they are written with streaming stores.
	far bool
	// Direct paths: dr lands incoming data straight in the destination
	// when it is only copied there (recv, recvCopySend); ds sends straight
	// from the user's buffers what no later step overwrites before the
	// transport has sent it: the input of an operation that does not run
	// in place, or blocks no later step writes (Plan.Unwritten). The
	// engine flushes before it returns. Only memory the CPU reaches goes
	// over them.
	dr transport.DirectReceiver
	ds transport.DirectSender
	// bc, block: the step is cut into blocks of block bytes that ds posts
	// by reference (transport.BlockCopier; blocks); block 0 otherwise.
	bc    transport.BlockCopier
	block int
	// toScratch: dr lands each block in the run's scratch, which the
	// step's reduction reads (recvReduceCopy in place; recvBlocksOf).
	toScratch bool
	// lent: rc may hand out the peer's own memory (transport.Lender),
	// checked before anything computed from it goes on.
	lent transport.Lender
}

// setLockIO fills x.io for step st (in place: it is large, and set up
// once per step of every operation).
func (x *chanRun) setLockIO(st *algorithms.Step) *lockIO {
	io := &x.io
	io.st = st
	io.srcS = algorithms.NewSlicer(x.spansOf(0, st.Src), x.slice)
	io.dstS = algorithms.NewSlicer(x.spansOf(1, st.Dst), x.slice)
	io.hasSrc, io.hasDst = st.Src.Buf != algorithms.NoBuf, st.Dst.Buf != algorithms.NoBuf
	io.srcBuf = x.buf(st.Src.Buf)
	io.scaled = x.premul && st.Src.Buf == algorithms.Input
	io.rpeer, io.speer = int(st.RecvPeer), int(st.SendPeer)
	io.rc, io.sc, io.dr, io.ds = nil, nil, nil, nil
	io.bc, io.block, io.toScratch = nil, 0, false
	io.lent = nil
	if st.Kind.Receives() {
		io.rc = x.conns[io.rpeer]
		io.lent, _ = io.rc.(transport.Lender)
	}
	io.far = false
	if st.Kind.Sends() {
		io.sc = x.conns[io.speer]
		io.far = farSlots(io.sc)
	}
	if io.rc != nil && x.out.HostVisible() && (st.Kind == algorithms.Recv || st.Kind == algorithms.RecvCopySend) {
		io.dr, _ = io.rc.(transport.DirectReceiver)
		if pc, ok := io.rc.(transport.PeerCopier); ok && !(x.landsOnly && pc.PeerCopies(x.opBytes, false) || x.landsShared && x.sharedOut && peerMaps(io.rc, x.opBytes, false)) {
			io.dr = nil // slots as ever: the receiver's copy would not pay
		}
	}
	sendsSrc := st.Kind == algorithms.Send || st.Kind == algorithms.CopySend
	sendsInput := st.Src.Buf == algorithms.Input && !x.aliased && sendsSrc
	// A scaled input is sent from the slot it is scaled into.
	if io.sc != nil && (x.unwritten[x.stepI] || sendsInput) && !(io.scaled && sendsSrc) && x.in.HostVisible() && x.out.HostVisible() {
		io.ds, _ = io.sc.(transport.DirectSender)
		byMap := (x.landsShared && (x.sharedIn || x.sharedOut) || x.sharedIn && sendsInput) &&
			peerMaps(io.sc, x.opBytes, true)
		cand := io.ds
		if pc, ok := io.sc.(transport.PeerCopier); ok && !(x.landsOnly && pc.PeerCopies(x.opBytes, true) || byMap) {
			io.ds = nil
		}
		if lender, ok := io.ds.(transport.PageLender); ok {
			// Whether the connection sends from the caller's pages in
			// this operation (TCP: lend_linux.go) is its own call.
			lender.LendFor(x.opBytes, x.nranks, x.landsOnly, x.exchanges)
		}
		if x.blockOp != noBlocks && sendsSrc && !byMap && !x.sharedIn && !x.sharedOut {
			x.sendBlocks(st, io, cand)
		}
	}
	return io
}

// sendBlocks cuts a send step of a 2-rank broadcast, all-gather, reduce
// or reduce-scatter into blocks where the connection says so (its
// receiver asked for them at this size: transport.BlockCopier); cand is
// the step's direct sender.
func (x *chanRun) sendBlocks(st *algorithms.Step, io *lockIO, cand transport.DirectSender) {
	bc, ok := io.sc.(transport.BlockCopier)
	if !ok || cand == nil {
		return
	}
	b := bc.BlockSlice(x.opBytes, x.blockOp == blocksReduce) / x.esize
	if b <= x.slice {
		return
	}
	io.ds, io.bc, io.block = cand, bc, b*x.esize
	io.srcS = algorithms.NewSlicer(x.spansOf(0, st.Src), b)
	io.dstS = algorithms.NewSlicer(x.spansOf(1, st.Dst), b)
}

// recvBlocksOf cuts the receive step of a 2-rank broadcast, all-gather,
// reduce or reduce-scatter into blocks where the sender did (sendBlocks):
// it peeks at the step's first slice and, when the sender cut the step
// into blocks, cuts this side the same way and lands each block with
// WaitInto: in the output (recv; recvReduceCopy out of place, which then
// reduces it there), or in the run's scratch, which an in-place
// recvReduceCopy reads. The sender
// decides alone and the receiver follows, so the two cuts match whatever
// either side's settings (transport.BlockCopier). On two ranks the steps
// of these collectives only send (send, copySend) or only receive (recv,
// recvReduceCopy); a forwarding step could not pass a block on to a peer
// that cannot read it, and is never cut.
func (x *chanRun) recvBlocksOf(ctx context.Context, st *algorithms.Step, io *lockIO) error {
	if io.rc == nil || io.sc != nil || st.Kind != algorithms.Recv && st.Kind != algorithms.RecvReduceCopy {
		return nil
	}
	bc, ok := io.rc.(transport.BlockCopier)
	if !ok {
		return nil
	}
	b, err := bc.PeekBlock(ctx)
	if err != nil {
		return x.fail(st, io.rpeer, err)
	}
	x.recvBlocks = bc
	if b == 0 {
		x.slotSteps++
		return nil
	}
	x.blockSteps++
	es := x.esize
	dr, ok := io.rc.(transport.DirectReceiver)
	if !ok || b%es != 0 || !x.out.HostVisible() {
		return x.fail(st, io.rpeer, fmt.Errorf("rank %d cut the step into blocks of %d bytes, which this rank cannot take into its output (%d-byte elements)", io.rpeer, b, es))
	}
	// A reduction lands each block in its own destination and reduces it
	// there (dst = dst op src, which the kernels allow) where that
	// destination is not the step's source: one buffer fewer in the cache
	// than through the scratch (out of place, the input stays apart from
	// the output). In place, the block would overwrite the source it is
	// reduced with, so it goes through the scratch.
	io.dr = dr
	io.toScratch = st.Kind == algorithms.RecvReduceCopy && (x.aliased || st.Src.Buf != algorithms.Input)
	io.dstS = algorithms.NewSlicer(x.spansOf(1, st.Dst), b/es)
	if io.hasSrc {
		io.srcS = algorithms.NewSlicer(x.spansOf(0, st.Src), b/es)
	}
	return nil
}

// farSlots reports whether c is a transport.FarSlots that says so.
func farSlots(c transport.Conn) bool {
	f, ok := c.(transport.FarSlots)
	return ok && f.SlotsFar()
}

// peerMaps reports whether c is a transport.PeerMapper that says so.
func peerMaps(c transport.Conn, opBytes int64, send bool) bool {
	pm, ok := c.(transport.PeerMapper)
	return ok && pm.PeerMaps(opBytes, send)
}

// lockstep runs a lockstep step: for each slice, receive, reserve the
// outgoing slot, compute the value into its sinks, fence, post, release.
func (x *chanRun) lockstep(ctx context.Context, st *algorithms.Step) error {
	io := x.setLockIO(st)
	if x.blockOp != noBlocks {
		if err := x.recvBlocksOf(ctx, st, io); err != nil {
			return err
		}
	}
	es := x.esize
	for sl := uint32(0); ; sl++ {
		var srcOff, dstOff, n int
		var ok bool
		if io.hasSrc {
			srcOff, n, ok = io.srcS.Next()
		}
		if io.hasDst {
			dstOff, n, ok = io.dstS.Next()
		}
		if !ok {
			break
		}
		nb := n * es
		var src, dst memory.Buffer
		if io.hasSrc {
			src = io.srcBuf.Slice(srcOff*es, srcOff*es+nb)
		}
		if io.hasDst {
			dst = x.out.Slice(dstOff*es, dstOff*es+nb)
		}
		if err := x.lockSlice(ctx, io, sl, nb, &src, &dst); err != nil {
			return err
		}
	}
	if io.rc != nil {
		x.recvd[io.rpeer]++
	}
	if io.sc != nil {
		x.sent[io.speer]++
	}
	return nil
}

// lockSlice moves one slice of a lockstep step.
func (x *chanRun) lockSlice(ctx context.Context, io *lockIO, sl uint32, nb int, src, dst *memory.Buffer) error {
	st := io.st
	// The incoming slice: landed in dst, or held in a slot until released.
	var in memory.Buffer
	held := false
	switch {
	case io.toScratch:
		if len(x.scratch) < nb {
			x.scratch = make([]byte, nb)
		}
		in = memory.HostBuffer(x.scratch[:nb])
		if err := x.recvInto(ctx, st, io.dr, io.rpeer, sl, in); err != nil {
			return err
		}
	case io.dr != nil:
		if err := x.recvInto(ctx, st, io.dr, io.rpeer, sl, *dst); err != nil {
			return err
		}
		in = *dst
	case io.rc != nil:
		var err error
		if in, err = x.recvSlice(ctx, st, io.rc, io.rpeer, sl, nb); err != nil {
			return err
		}
		held = true
	}
	release := func() error {
		if !held {
			return nil
		}
		held = false
		if err := io.rc.Release(); err != nil {
			return x.fail(st, io.rpeer, err)
		}
		return nil
	}
	// The outgoing slot, unless the value is sent from the user's memory
	// (then it is computed there and sent from there).
	var out memory.Buffer
	if io.sc != nil && io.ds == nil {
		var err error
		if out, err = io.sc.Reserve(ctx, nb); err != nil {
			release()
			return x.fail(st, io.speer, err)
		}
	}
	if io.block > 0 {
		// A block of the input (send, copySend: blocks) goes out before
		// this rank's own copy of it into the output, so that the peer's
		// copy runs beside that one instead of after it.
		tag := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[io.speer], Slice: sl}
		if sc, ok := io.bc.(transport.SplitCopier); ok {
			sc.BusyAfterPosts(st.Kind == algorithms.CopySend && !dst.SameStart(*src))
		}
		if err := io.bc.PostBlock(ctx, *src, tag, io.block); err != nil {
			return x.fail(st, io.speer, err)
		}
		if err := x.compute(st, dst, &out, &in, src, true, false, false); err != nil {
			return x.fail(st, -1, err)
		}
		return nil
	}
	direct := io.ds != nil
	var err error
	if io.scaled {
		x.scaledCompute(st, dst, &out, &in, src, direct, io.dr != nil, io.far)
	} else {
		err = x.compute(st, dst, &out, &in, src, direct, io.dr != nil, io.far)
	}
	if err == nil && (held || io.sc != nil) {
		// Device work must be done before the memory it wrote goes to the
		// peer or the slot it read goes back.
		err = x.dp.fence(ctx)
	}
	if err != nil {
		release()
		return x.fail(st, -1, err)
	}
	if held && io.lent != nil {
		if err := io.lent.Intact(); err != nil {
			release()
			return x.fail(st, io.rpeer, err)
		}
	}
	if direct {
		if err := release(); err != nil {
			return err
		}
		from := *dst
		if st.Kind == algorithms.Send || st.Kind == algorithms.CopySend {
			from = *src
		}
		tag := transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[io.speer], Slice: sl}
		if err := io.ds.PostFrom(ctx, from, tag); err != nil {
			return x.fail(st, io.speer, err)
		}
		return nil
	}
	if io.sc != nil {
		if err := io.sc.Post(nb, transport.Tag{Op: x.seq, Sig: x.sig, Msg: x.sent[io.speer], Slice: sl}); err != nil {
			release()
			return x.fail(st, io.speer, err)
		}
	}
	return release()
}

// compute puts a lockstep slice's value in its sinks: dst (the output)
// and out (the outgoing slot; empty when the value is sent from dst or
// src directly, and then a dst the transport sends from is written
// through the caches, since it reads it right away). landed: the incoming
// slice was received straight into dst; far: another core reads the slot
// next (transport.FarSlots). The buffers go by pointer: they
// are large, and this runs for every slice.
func (x *chanRun) compute(st *algorithms.Step, dst, out, in, src *memory.Buffer, direct, landed, far bool) error {
	dp := x.dp
	switch st.Kind {
	case algorithms.Copy:
		return dp.finalCopy(*dst, *src, st.Final)
	case algorithms.Send:
		if !direct {
			return dp.copy(*out, *src, slotSink(far))
		}
	case algorithms.Recv:
		if !landed {
			return dp.copy(*dst, *in, sinkOut)
		}
	case algorithms.CopySend:
		if !direct {
			if err := dp.copy(*out, *src, slotSink(far)); err != nil {
				return err
			}
		}
		if !dst.SameStart(*src) {
			// Sent from src, directly or not: nothing reads dst soon, so a
			// large output is written with streaming stores either way.
			return dp.copy(*dst, *src, sinkOut)
		}
	case algorithms.RecvReduceSend:
		return dp.reduce(*out, *in, *src, st.Final, slotSink(far))
	case algorithms.RecvReduceCopy:
		return dp.reduce(*dst, *in, *src, st.Final, sinkOut)
	case algorithms.Reduce:
		return dp.reduce(*dst, *dst, *src, st.Final, sinkOut)
	case algorithms.RecvReduceCopySend:
		if direct {
			return dp.reduce(*dst, *in, *src, st.Final, sinkNear)
		}
		return dp.reduce2(*dst, *out, *in, *src, st.Final, far)
	case algorithms.RecvCopySend:
		switch {
		case direct:
			if !landed {
				return dp.copy(*dst, *in, sinkNear)
			}
		case landed:
			return dp.copy(*out, *in, slotSink(far))
		default:
			return dp.copy2(*dst, *out, *in, far)
		}
	}
	return nil
}

// scaledCompute is compute for a step whose src is the input of a
// pre-multiplied sum (host memory): each read of src multiplies it by the
// rank's scalar (hostPath.scaleBy and scaledReduce), so the operation
// computes what it would on the input scaled first. A step that only
// copies or forwards what it receives reads no src and goes through
// compute. Sends of src are never direct (setLockIO): the scaled value
// exists only in the slot.
func (x *chanRun) scaledCompute(st *algorithms.Step, dst, out, in, src *memory.Buffer, direct, landed, far bool) {
	h := &x.host
	switch st.Kind {
	case algorithms.Copy:
		h.scaleBy(dst.Bytes(), src.Bytes())
	case algorithms.Send:
		h.scaleBy(out.Bytes(), src.Bytes())
	case algorithms.CopySend:
		// In place as well: the output must hold the scaled value even
		// where it is the input.
		h.scaleBy(out.Bytes(), src.Bytes())
		h.copy(*dst, *out, sinkOut)
	case algorithms.RecvReduceSend:
		h.scaledReduce(*out, *in, *src, slotSink(far))
	case algorithms.RecvReduceCopy:
		h.scaledReduce(*dst, *in, *src, sinkOut)
	case algorithms.Reduce:
		h.scaledReduce(*dst, *dst, *src, sinkOut)
	case algorithms.RecvReduceCopySend:
		if direct {
			h.scaledReduce(*dst, *in, *src, sinkNear)
		} else {
			h.scaledReduce2(*dst, *out, *in, *src, far)
		}
	default:
		x.compute(st, dst, out, in, src, direct, landed, far)
	}
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
	lent, _ := rc.(transport.Lender) // exchanges post through slots; checked all the same
	far := farSlots(sc)
	reduces := st.Kind.Reduces()
	scaleTx := x.premul && st.Tx.Buf == algorithms.Input
	scaleSrc := x.premul && reduces && st.Src.Buf == algorithms.Input
	var txSl, rxSl uint32
	for !txS.Done() || !dstS.Done() {
		if off, n, ok := txS.Next(); ok {
			nb := n * es
			b, err := sc.Reserve(ctx, nb)
			if err != nil {
				return x.fail(st, speer, err)
			}
			if scaleTx {
				x.host.scaleBy(b.Bytes(), txBuf.Slice(off*es, off*es+nb).Bytes())
			} else if err := x.dp.copy(b, txBuf.Slice(off*es, off*es+nb), slotSink(far)); err != nil {
				return x.fail(st, -1, err)
			}
			if err := x.dp.fence(ctx); err != nil {
				return x.fail(st, -1, err)
			}
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
			dst := x.out.Slice(off*es, off*es+nb)
			if reduces {
				soff, _, _ := srcS.Next()
				if scaleSrc {
					x.host.scaledReduce(dst, in, srcBuf.Slice(soff*es, soff*es+nb), sinkOut)
				} else {
					err = x.dp.reduce(dst, in, srcBuf.Slice(soff*es, soff*es+nb), st.Final, sinkOut)
				}
			} else {
				err = x.dp.copy(dst, in, sinkOut)
			}
			if err == nil {
				err = x.dp.fence(ctx)
			}
			if err != nil {
				rc.Release()
				return x.fail(st, -1, err)
			}
			if lent != nil {
				if err := lent.Intact(); err != nil {
					rc.Release()
					return x.fail(st, rpeer, err)
				}
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
