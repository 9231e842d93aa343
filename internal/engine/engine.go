package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Config fixes an engine's choices. It must be the same on every rank of a
// communicator, because every rank derives its plan from it independently.
type Config struct {
	// Algo forces an algorithm for the collectives it implements
	// (AlgoAuto: the tuner chooses).
	Algo algorithms.Algorithm
	// Channels forces the channel count (0: the tuner chooses).
	Channels int
	// ChunkBytes forces the pipelining block size (0: the link model's).
	ChunkBytes int64
	// MaxChannels bounds the channel count; channel ids 0..MaxChannels-1
	// carry collectives, MaxChannels device point-to-point (in issue
	// order), and transport.P2PChannel and the one after host
	// point-to-point (in lanes).
	MaxChannels int
	// Link is the tuner's model of the links.
	Link algorithms.LinkModel
	// Device is the GPU whose memory device operations use (nil: host
	// memory only). Each channel runs its device work on a stream of its
	// own, made on first use.
	Device device.Device
	// Hosts labels each rank's host (equal labels, same host; nil: one
	// host). Schedules follow it: rings host by host, the tree across
	// hosts (algorithms.Params.Hosts), and the tuner weighs the
	// hierarchical all-reduce when hosts have equal rank counts. Every
	// rank must be given the same.
	Hosts []int
	// IntraLink is the tuner's model of the links inside a host, when
	// Hosts has several (zero: Link).
	IntraLink algorithms.LinkModel
	// DeviceLink is the tuner's model of the links device operations
	// take, where they differ from host operations' (zero: Link): GPUs
	// that move device memory to each other's over NVLink or PCI, as the
	// topology's ring search finds them (topology.Ring.LinkModel). Every
	// rank must be given the same.
	DeviceLink algorithms.LinkModel
	// Oversubscribed: some host of the job runs more ranks than it has
	// cores. Broadcast, reduce and all-reduce then send their blocks a
	// slot at a time (slotSlices). Every rank must be given the same.
	Oversubscribed bool
}

// Op is one operation on one rank. Counts are in elements.
type Op struct {
	Coll algorithms.Collective
	Type kernels.Type
	Red  kernels.Op
	// Count is the number of elements per major block: the count of
	// all-reduce, broadcast, reduce, send and recv, the receive count of
	// reduce-scatter, the send count of all-gather, the per-peer block of
	// all-to-all (algorithms.NewLayout).
	Count int
	Root  int // broadcast/reduce root; peer of send/recv
	In    memory.Buffer
	Out   memory.Buffer
	// Ready, for an operation on device memory, completes when the
	// buffers are ready (the caller's earlier work on them has finished):
	// every device stream of the operation waits for it before it touches
	// them. Nil: they are ready now.
	Ready device.Event
	// PreMul makes a pre-multiplied sum (Red Sum, host memory): every
	// step that reads this rank's input multiplies it by Scale as it
	// reads it (kernels.ScaledSum and kernels.Scale), which gives what
	// scaling the input first would, without that pass. The signature says
	// so, so that a rank that sums plainly against one that pre-multiplies
	// is a mismatch; each rank has its own Scale.
	PreMul bool
	Scale  float64
	// InOffs and OutOffs make an all-to-all of uneven blocks (AllToAllv):
	// block j of In, for rank j, is elements [InOffs[j], InOffs[j+1]), and
	// block i of Out, from rank i, [OutOffs[i], OutOffs[i+1])
	// (algorithms.Layout). Count is then the largest block of the whole
	// exchange, the same on every rank: the plan is made for it. The
	// caller makes sure that each block's length agrees with its peer's.
	InOffs, OutOffs []int
}

// sigPreMul is the operator field of a pre-multiplied sum's signature.
const sigPreMul = 5

// Plan is how an operation runs.
type Plan struct {
	algorithms.Plan
	Pieces     int
	SliceElems int // elements per slice (at most a slot)
	Sched      *algorithms.Schedule
	Peers      []int // the schedule's peers, in first-use order
	// Unwritten[k] says that no step after step k writes the blocks step k
	// sends, so the transport may send them straight from the user's
	// buffer (see chanRun.lockstep).
	Unwritten []bool
	Seq       uint64 // the operation's tag sequence number
	// Sig fingerprints what every rank must agree on: collective, type,
	// operator, count, root and plan. It travels in every slice's tag.
	Sig uint32
	// spans caches, for plans with few pieces and steps (small
	// operations, where working them out is a good part of the cost), the
	// spans of every piece's steps: spans[piece][step][i], i as in
	// chanRun.spans. Nil otherwise.
	spans  [][][3][]algorithms.Span
	layout algorithms.Layout
}

// maxCachedSpans bounds pieces × steps for a plan to cache its spans.
const maxCachedSpans = 64

// Engine runs one rank's operations through a transport endpoint. Run is
// called by one goroutine at a time (the communicator serialises
// collectives); RunP2P by one per lane, beside Run (p2p.go). The engine
// starts a goroutine per extra channel for the duration of an operation
// and none otherwise.
type Engine struct {
	rank, nranks int
	ep           transport.Endpoint
	caps         transport.Caps
	cfg          Config
	grid         algorithms.Grid // the hosts' shape; PerHost 0 when uneven

	mu     sync.Mutex // guards scheds and plans (Plan may be called from any goroutine)
	scheds map[schedKey]*algorithms.Schedule
	plans  map[planKey]Plan // recent plans: training loops repeat their sizes

	// Owned by the goroutine in Run.
	lastKey  planKey // the previous operation's plan, without the lock and the hash
	devLink  bool    // Config.DeviceLink is set
	lastPlan *Plan
	runPlan  Plan // what Run returns a pointer to: the plan of the latest operation
	conns    map[connKey]transport.Conn
	collSeq  uint64
	p2pSend  []uint64 // per peer: send operations so far
	p2pRecv  []uint64
	runs     []*chanRun // reused per channel

	p2p  p2pLanes // host point-to-point, outside Run (p2p.go)
	gone goneSet  // peers that left (PeerGone)

	// What Progress reports, written by Run: the running plan's schedule
	// and channel count, and each channel's position.
	curSched    atomic.Pointer[algorithms.Schedule]
	curChannels atomic.Int32
	prog        [maxProgress]atomic.Int64
	// An in-place operation whose schedule needs a copy of its input
	// (algorithms.Schedule.CopyInPlace) runs as copyOp, on scratch (host)
	// or devScratch (device memory).
	scratch    []byte
	devScratch memory.Buffer
	copyOp     Op

	// The endpoint's board, if it has one that every rank shares
	// (board.go), and what its operations keep between calls.
	board       transport.Board
	boardK      boardKernels
	boardMine   []byte       // a copy of the input, in place
	boardScaled []byte       // a pre-multiplied sum's scaled input
	boardPeer   atomic.Int32 // whom a board operation waits for, for Progress, where the board does not say (boardWaits nil)
	boardWaits  transport.BoardWaiter
	markEvery   uint64 // progress marks only on multiples of this (transport.BoardMarkEvery)
	boardUp     bool   // the board is joined (transport.BoardJoiner)
	// oneShotPeer: whom a one-shot all-reduce waits for (oneshot.go).
	oneShotPeer atomic.Int32
}

type schedKey struct {
	coll algorithms.Collective
	algo algorithms.Algorithm
	root int
}

type connKey struct{ peer, ch int }

// planKey is what a plan, and the signature in it, depend on.
type planKey struct {
	coll   algorithms.Collective
	typ    kernels.Type
	red    kernels.Op
	count  int
	root   int
	premul bool
	dev    bool // a device operation tuned by Config.DeviceLink
}

// keyOf is op's plan key. A device operation has keys of its own only
// where Config.DeviceLink tunes it differently.
func (e *Engine) keyOf(op *Op) planKey {
	return planKey{op.Coll, op.Type, op.Red, op.Count, op.Root, op.PreMul, e.devLink && onDevice(op)}
}

// is reports whether k is op's key, field by field: keyOf's struct is
// built in a temporary and compared 16 bytes at a time, which stalls on
// store forwarding (a twentieth of the samples of an 8-byte broadcast's
// profile).
func (k *planKey) is(e *Engine, op *Op) bool {
	return k.coll == op.Coll && k.typ == op.Type && k.red == op.Red && k.count == op.Count && k.root == op.Root && k.premul == op.PreMul &&
		k.dev == (e.devLink && onDevice(op))
}

// maxPlans bounds the plan cache; it is cleared when full.
const maxPlans = 256

// New returns an engine for rank of nranks over endpoint ep.
func New(rank, nranks int, ep transport.Endpoint, cfg Config) (*Engine, error) {
	caps := ep.Caps()
	switch {
	case nranks < 1 || rank < 0 || rank >= nranks:
		return nil, fmt.Errorf("engine: rank %d of %d", rank, nranks)
	case caps.Slots < 2 || caps.SlotSize < 64:
		return nil, fmt.Errorf("engine: transport offers %d slots of %d bytes; need ≥ 2 of ≥ 64", caps.Slots, caps.SlotSize)
	case cfg.MaxChannels < 1:
		return nil, fmt.Errorf("engine: MaxChannels %d < 1", cfg.MaxChannels)
	case cfg.Channels > cfg.MaxChannels:
		return nil, fmt.Errorf("engine: %d channels forced, at most %d", cfg.Channels, cfg.MaxChannels)
	case cfg.Hosts != nil && len(cfg.Hosts) != nranks:
		return nil, fmt.Errorf("engine: %d host labels for %d ranks", len(cfg.Hosts), nranks)
	}
	if err := cfg.Link.Validate(); err != nil {
		return nil, err
	}
	if cfg.IntraLink != (algorithms.LinkModel{}) {
		if err := cfg.IntraLink.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.DeviceLink != (algorithms.LinkModel{}) {
		if err := cfg.DeviceLink.Validate(); err != nil {
			return nil, fmt.Errorf("engine: device link: %w", err)
		}
	}
	grid, err := algorithms.HostGrid(cfg.Hosts, nranks)
	if err != nil {
		if cfg.Algo == algorithms.Hier || cfg.Algo == algorithms.HierTree {
			// Forced, it could never run: say so now, not at the first
			// all-reduce.
			return nil, fmt.Errorf("engine: algorithm %v forced: %w", cfg.Algo, err)
		}
		// Hosts of different sizes: no hierarchy (PerHost 0), but the
		// tuner still knows the job spans hosts.
		grid = algorithms.Grid{Hosts: algorithms.HostCount(cfg.Hosts)}
	}
	e := &Engine{
		rank: rank, nranks: nranks, ep: ep, caps: caps, cfg: cfg, grid: grid,
		devLink: cfg.DeviceLink != (algorithms.LinkModel{}),
		scheds:  map[schedKey]*algorithms.Schedule{},
		plans:   map[planKey]Plan{},
		conns:   map[connKey]transport.Conn{},
		p2pSend: make([]uint64, nranks),
		p2pRecv: make([]uint64, nranks),
	}
	if bh, ok := ep.(transport.BoardHolder); ok && nranks > 1 {
		e.board = bh.Board()
		e.boardWaits, _ = e.board.(transport.BoardWaiter)
		e.markEvery = 1
		if m, ok := e.board.(transport.BoardMarkEvery); ok && m.MarkEvery() > 1 {
			e.markEvery = uint64(m.MarkEvery())
		}
	}
	return e, nil
}

// checkBlocks checks an all-to-all's uneven blocks against its buffers.
func (e *Engine) checkBlocks(op *Op) error {
	if op.InOffs == nil && op.OutOffs == nil {
		return nil
	}
	if op.Coll != algorithms.CollAllToAll {
		return fmt.Errorf("uneven blocks on a %v", op.Coll)
	}
	es := op.Type.Size()
	for _, b := range []struct {
		name string
		offs []int
		buf  memory.Buffer
	}{{"send", op.InOffs, op.In}, {"receive", op.OutOffs, op.Out}} {
		if len(b.offs) != e.nranks+1 || b.offs[0] != 0 {
			return fmt.Errorf("%d %s offsets starting at %v for %d ranks; want %d from 0", len(b.offs), b.name, b.offs[:min(1, len(b.offs))], e.nranks, e.nranks+1)
		}
		for j := range e.nranks {
			if k := b.offs[j+1] - b.offs[j]; k < 0 || k > op.Count {
				return fmt.Errorf("%s block %d has %d elements; want 0 to the largest block, %d", b.name, j, k, op.Count)
			}
		}
		if last := b.offs[e.nranks]; int64(last)*int64(es) > int64(b.buf.Len()) {
			return fmt.Errorf("%s blocks end at element %d; the buffer holds %d", b.name, last, b.buf.Len()/es)
		}
	}
	me := e.rank
	if s, r := op.InOffs[me+1]-op.InOffs[me], op.OutOffs[me+1]-op.OutOffs[me]; s != r {
		return fmt.Errorf("this rank's own block is %d elements to send and %d to receive", s, r)
	}
	return nil
}

// Bytes is the operation's size on nranks ranks as nccl-tests counts it
// (the buffer of all-reduce, broadcast, reduce, send and recv; the send
// buffer of reduce-scatter; the receive buffer of all-gather and
// all-to-all).
func (op *Op) Bytes(n int) int64 {
	return int64(op.Count) * int64(op.Coll.Majors(n)) * int64(op.Type.Size())
}

// Plan returns how op would run: algorithm, channels, pieces and schedule.
// It does not consume a sequence number.
func (e *Engine) Plan(op *Op) (Plan, error) {
	if e.onBoard(op) {
		return boardPlan(op, 0, 0), nil
	}
	k := e.keyOf(op)
	e.mu.Lock()
	pl, ok := e.plans[k]
	e.mu.Unlock()
	if ok {
		return pl, nil
	}
	pl, err := e.plan(op)
	if err != nil {
		return pl, err
	}
	e.mu.Lock()
	if len(e.plans) >= maxPlans {
		clear(e.plans)
	}
	e.plans[k] = pl
	e.mu.Unlock()
	return pl, nil
}

func (e *Engine) plan(op *Op) (Plan, error) {
	pb := algorithms.Problem{Coll: op.Coll, NRanks: e.nranks, Bytes: op.Bytes(e.nranks), Link: e.cfg.Link,
		Hosts: e.grid.Hosts, PerHost: e.grid.PerHost, Intra: e.cfg.IntraLink}
	if e.devLink && onDevice(op) {
		pb.Link = e.cfg.DeviceLink
	}
	pl := algorithms.Tune(pb, e.cfg.Algo, e.cfg.Channels, e.cfg.ChunkBytes)
	pl.Channels = min(pl.Channels, e.cfg.MaxChannels)
	if op.Coll == algorithms.CollSend || op.Coll == algorithms.CollRecv {
		pl.Channels = 1
	}
	s, err := e.schedule(op, pl.Algo)
	if err != nil {
		return Plan{}, err
	}
	es := op.Type.Size()
	slotElems := e.caps.SlotSize / es
	pieces := algorithms.Pieces(s, pl, op.Count, es, e.caps.Slots, slotElems)
	// Like NCCL (enqueue.cc halves the chunk while a channel has too little
	// work), cut slices smaller than a slot when blocks are small, so that
	// every step streams at least minSlicesPerStep slices: a chain of ranks
	// only overlaps its hops when there is more than one slice in flight.
	blockElems := (op.Count + pieces*s.Minor - 1) / (pieces * s.Minor)
	sliceElems := slotElems
	if blockElems > 0 && !slotSlices(op.Coll, pl.Algo, e.cfg.Oversubscribed) {
		want := (blockElems + minSlicesPerStep - 1) / minSlicesPerStep
		sliceElems = min(slotElems, max(want, max(minSliceBytes, int(e.cfg.Link.MinSliceBytes))/es))
	}
	// Smaller slices mean fewer elements in flight per connection: keep
	// every message within half the slots (algorithms.MinPieces).
	pieces = max(pieces, algorithms.Pieces(s, pl, op.Count, es, e.caps.Slots, sliceElems))
	l := algorithms.NewLayout(op.Coll, e.nranks, e.rank, op.Root, op.Count)
	out := Plan{Plan: pl, Sched: s, Peers: s.Peers(), Unwritten: unwrittenAfter(s), Pieces: pieces, SliceElems: sliceElems,
		Sig: signature(op, pl, pieces, sliceElems), layout: l}
	if pieces*len(s.Steps) <= maxCachedSpans {
		out.spans = make([][][3][]algorithms.Span, pieces)
		for p := range out.spans {
			out.spans[p] = make([][3][]algorithms.Span, len(s.Steps))
			for i, st := range s.Steps {
				for j, ref := range []algorithms.Ref{st.Src, st.Dst, st.Tx} {
					if ref.Buf != algorithms.NoBuf {
						out.spans[p][i][j] = l.Spans(nil, ref, s.Minor, p, pieces)
					}
				}
			}
		}
	}
	return out, nil
}

// unwrittenAfter returns, for each step, whether the blocks it sends (its
// Src for send and copySend, its Dst for the forwarding kinds) are free of
// writes by every later step. Blocks name the same elements in Input and
// Output whenever the two alias (every in-place form), so a later write to
// Output is a write to those blocks either way.
func unwrittenAfter(s *algorithms.Schedule) []bool {
	out := make([]bool, len(s.Steps))
	for k, st := range s.Steps {
		var sent algorithms.Ref
		switch st.Kind {
		case algorithms.Send, algorithms.CopySend:
			sent = st.Src
		case algorithms.RecvCopySend, algorithms.RecvReduceCopySend:
			sent = st.Dst
		default:
			continue
		}
		out[k] = true
		for _, later := range s.Steps[k+1:] {
			if later.Dst.Buf != algorithms.NoBuf && later.Dst.Block < sent.Block+sent.N && sent.Block < later.Dst.Block+later.Dst.N {
				out[k] = false
				break
			}
		}
	}
	return out
}

// signature is the operation header every slice carries (in its tag):
// what the ranks of an operation must agree on, encoded so that a rank
// that receives a slice of a different operation can say what the sender
// was doing. From bit 0: collective, element type, operator, algorithm,
// channels-1 (widths sig*Bits below), then a hash (FNV-1a) of the
// count, the root and the slicing. Send and Recv encode alike and leave
// out the peer, which is the other rank on each side; collectives without
// a reduction or a root leave those out, since their values need not
// match.
func signature(op *Op, pl algorithms.Plan, pieces, slice int) uint32 {
	coll, red, root := op.Coll, op.Red, op.Root
	switch coll {
	case algorithms.CollSend, algorithms.CollRecv:
		coll, root = algorithms.CollSend, 0
	case algorithms.CollAllReduce, algorithms.CollReduceScatter, algorithms.CollAllGather, algorithms.CollAllToAll:
		root = 0
	}
	if !coll.Reduces() {
		red = 0
	} else if op.PreMul {
		red = sigPreMul
	}
	h := uint32(2166136261)
	for _, v := range []uint64{uint64(op.Count), uint64(root), uint64(pieces), uint64(slice)} {
		for i := 0; i < 8; i++ {
			h ^= uint32(v >> (8 * i) & 0xff)
			h *= 16777619
		}
	}
	field := func(v uint32, shift, bits int) uint32 { return v & (1<<bits - 1) << shift }
	return field(uint32(coll), sigCollShift, sigCollBits) | field(uint32(op.Type), sigTypeShift, sigTypeBits) |
		field(uint32(red), sigRedShift, sigRedBits) | field(uint32(pl.Algo), sigAlgoShift, sigAlgoBits) |
		field(uint32(pl.Channels-1), sigChanShift, sigChanBits) | field(h^h>>12^h>>24, sigHashShift, sigHashBits)
}

// The signature's fields, from bit 0.
const (
	sigCollBits = 4
	sigTypeBits = 4
	sigRedBits  = 3
	sigAlgoBits = 4
	sigChanBits = 6
	sigHashBits = 11

	sigCollShift = 0
	sigTypeShift = sigCollShift + sigCollBits
	sigRedShift  = sigTypeShift + sigTypeBits
	sigAlgoShift = sigRedShift + sigRedBits
	sigChanShift = sigAlgoShift + sigAlgoBits
	sigHashShift = sigChanShift + sigChanBits
	sigEnd       = sigHashShift + sigHashBits
)

// Each field holds every value it carries, and the fields fill 32 bits
// exactly: an array of negative length does not compile, so a collective,
// type, operator, algorithm or channel count that outgrows its field
// breaks the build instead of aliasing another in the signature.
var (
	_ [1<<sigCollBits - algorithms.NumCollectives]struct{}
	_ [1<<sigTypeBits - kernels.NumTypes]struct{}
	_ [1<<sigRedBits - max(kernels.NumOps, sigPreMul+1)]struct{}
	_ [1<<sigAlgoBits - algorithms.NumAlgorithms]struct{}
	_ [1<<sigChanBits - transport.P2PChannel]struct{} // collectives use channels below it
	_ [sigEnd - 32]struct{}
	_ [32 - sigEnd]struct{}
)

// sigFields decodes a signature's leading fields.
type sigFields struct {
	coll     algorithms.Collective
	typ      kernels.Type
	red      kernels.Op
	algo     algorithms.Algorithm
	channels int
	rest     uint32
}

func decodeSig(s uint32) sigFields {
	field := func(shift, bits int) uint32 { return s >> shift & (1<<bits - 1) }
	return sigFields{coll: algorithms.Collective(field(sigCollShift, sigCollBits)), typ: kernels.Type(field(sigTypeShift, sigTypeBits)),
		red: kernels.Op(field(sigRedShift, sigRedBits)), algo: algorithms.Algorithm(field(sigAlgoShift, sigAlgoBits)),
		channels: int(field(sigChanShift, sigChanBits)) + 1, rest: s >> sigHashShift}
}

func (f sigFields) call() string {
	s := fmt.Sprintf("%v(%v", f.coll, f.typ)
	switch {
	case f.coll.Reduces() && f.red == sigPreMul:
		s += ", premulsum"
	case f.coll.Reduces():
		s += ", " + f.red.String()
	}
	return s + ")"
}

// describe says how two signatures differ.
func describeMismatch(got, want uint32) string {
	g, w := decodeSig(got), decodeSig(want)
	switch {
	case g.coll != w.coll || g.typ != w.typ || g.red != w.red:
		return fmt.Sprintf("it called %s, this rank %s", g.call(), w.call())
	case g.algo != w.algo || g.channels != w.channels:
		// The tuner picks by size: different counts are the likelier
		// cause, different settings the other.
		return fmt.Sprintf("both called %s, but it ran %v on %d channels and this rank %v on %d: their counts differ (the algorithm is chosen by size), or their settings do (GOCCL_ALGO, GOCCL_NCHANNELS)",
			w.call(), g.algo, g.channels, w.algo, w.channels)
	case g.rest != w.rest:
		return fmt.Sprintf("both called %s, with a different count, root or slot setting", w.call())
	}
	return "same call, out of order"
}

// slotSlices reports the plans whose slices are a slot's rather than cut
// to a few per block (minSlicesPerStep):
//   - the recursive-doubling all-gather, whose exchanges go in lockstep
//     (chanRun.exchange sends a slice and waits for the partner's before
//     the next, so each slice is a wait), and the one-shot reduce-scatter
//     and all-gather, one hop with nothing forwarded, where smaller slices
//     only add sends, reads and wake-ups. Measured (docs/performance.md,
//     "Recursive doubling for the all-gather"): 4 ranks over TCP, 1 MiB,
//     the recursive-doubling all-gather 1389-1720 µs with the pipelined
//     algorithms' slices, 501-695 with a slot's; the one-shot all-gather
//     708 -> 394 µs, its reduce-scatter 963 -> 598. Where each rank has
//     a core, the all-reduces that do not forward either (one-shot,
//     recursive doubling, Rabenseifner) keep the engine's cut: measured
//     both ways, mixed.
//   - broadcast, reduce and all-reduce where ranks outnumber cores
//     (oversubscribed), whatever the algorithm: the cut exists so that a
//     chain's hops overlap, and there is no idle core to overlap them on,
//     while every slice is one more poll, wake-up and yield at both
//     ends (and the all-reduces that forward nothing were mixed either
//     way, measured with a core per rank). 4 ranks on 2 cores
//     (docs/performance.md, "Slices of a slot where ranks outnumber
//     cores"): 64 KiB broadcast and reduce 0.55-0.85 of the time, over TCP
//     the 1 MiB reduce and all-reduce 0.8-0.87. The ring all-gather lost
//     (4 MiB over TCP, 1.07-1.23 times as long), so the all-gathers and
//     reduce-scatters keep the cut there.
func slotSlices(c algorithms.Collective, a algorithms.Algorithm, oversubscribed bool) bool {
	switch c {
	case algorithms.CollAllGather, algorithms.CollReduceScatter:
		return a == algorithms.RecDoubling || a == algorithms.OneShot
	case algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllReduce:
		return oversubscribed
	}
	return false
}

// Slicing of small blocks; see plan. A link model may raise the floor
// (algorithms.LinkModel.MinSliceBytes).
const (
	minSlicesPerStep = 4
	minSliceBytes    = 16 << 10
)

func (e *Engine) schedule(op *Op, algo algorithms.Algorithm) (*algorithms.Schedule, error) {
	k := schedKey{op.Coll, algo, op.Root}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.scheds[k]; s != nil {
		return s, nil
	}
	s, err := algorithms.Build(algorithms.Params{Coll: op.Coll, Algo: algo, NRanks: e.nranks, Rank: e.rank, Root: op.Root, Hosts: e.cfg.Hosts})
	if err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	e.scheds[k] = s
	return s, nil
}

// nextSeq returns the operation's tag sequence number. Collectives count
// on every rank alike; point-to-point operations count per peer and
// direction, since only the two ranks involved see them.
func (e *Engine) nextSeq(op *Op) uint64 {
	var s uint64
	switch op.Coll {
	case algorithms.CollSend:
		s = e.p2pSend[op.Root]
		e.p2pSend[op.Root]++
	case algorithms.CollRecv:
		s = e.p2pRecv[op.Root]
		e.p2pRecv[op.Root]++
	default:
		s = e.collSeq
		e.collSeq++
	}
	return s
}

// Run executes op and blocks until this rank's part of it is done: its
// output is complete and everything it sends has been handed to the
// transport. It fails when ctx ends, when a link fails, or when a peer's
// data does not match what this rank expects; the error is a *StepError
// saying where. After a failure the connections are in an unknown state:
// the caller must abort the endpoint. The plan it returns is the engine's:
// valid until the next Run.
func (e *Engine) Run(ctx context.Context, op *Op) (*Plan, error) {
	if e.boardAgain(op) {
		if op.Coll == algorithms.CollBroadcast {
			return e.boardBroadcast(ctx, op, e.nextSeq(op))
		}
		return e.runOnBoard(ctx, op, e.nextSeq(op))
	}
	// The plan goes back by pointer, into the engine's own (it is large,
	// and small operations copied it at every return: docs/performance.md).
	pl := &e.runPlan
	dev := onDevice(op)
	if err := e.CheckMemory(op, dev); err != nil {
		return e.noPlan(0), fmt.Errorf("engine: %w", err)
	}
	if err := e.checkBlocks(op); err != nil {
		return e.noPlan(0), fmt.Errorf("engine: %w", err)
	}
	if op.PreMul && (dev || op.Red != kernels.Sum || !op.Coll.Reduces()) {
		return e.noPlan(0), fmt.Errorf("engine: a pre-multiplied sum is a host reduction with Red Sum (got %v %v on %v memory)", op.Coll, op.Red, op.In.Kind())
	}
	seq := e.nextSeq(op)
	if err := e.awaitBoard(ctx, op); err != nil {
		return e.noPlan(seq), err
	}
	if op.Count == 0 {
		// Nothing moves, so nothing is checked: like NCCL, a zero count is
		// a no-op that does not synchronise.
		e.markOff(op, seq, signature(op, algorithms.Plan{Channels: 1}, 0, 0))
		return e.noPlan(seq), nil
	}
	if e.onBoard(op) {
		return e.runOnBoard(ctx, op, seq)
	}
	if e.curSched.Load() == &boardSched {
		// Left set by the last operation, on the board (runOnBoard):
		// while this one connects, Progress must not report that one's.
		e.curSched.Store(nil)
	}
	if e.lastPlan == nil || !e.lastKey.is(e, op) {
		k := e.keyOf(op)
		p, err := e.Plan(op)
		if err != nil {
			*pl = p
			return pl, err
		}
		e.lastKey, e.lastPlan = k, &p
	}
	if op.InOffs != nil {
		// Uneven blocks: the plan is the largest block's, the layout this
		// call's.
		*pl = *e.lastPlan
		pl.layout.InOffs, pl.layout.OutOffs = op.InOffs, op.OutOffs
		pl.spans = nil
	} else {
		// The last operation's plan itself: nothing below writes it but
		// its sequence number, which is this operation's.
		pl = e.lastPlan
	}
	pl.Seq = seq
	e.markOff(op, seq, pl.Sig)
	for len(e.runs) < pl.Channels {
		e.runs = append(e.runs, &chanRun{conns: make([]transport.Conn, e.nranks), sent: make([]uint32, e.nranks), recvd: make([]uint32, e.nranks),
			prog: &e.prog[min(len(e.runs), maxProgress-1)]})
	}
	if dev {
		if err := e.streams(pl.Channels, op.Ready); err != nil {
			return pl, &StepError{Channel: 0, Step: -1, Peer: -1, Err: err}
		}
	}
	if pl.Sched.CopyInPlace && op.In.Overlaps(op.Out) {
		in, err := e.copyInput(ctx, op.In, dev)
		if err != nil {
			return pl, &StepError{Channel: 0, Step: 0, Kind: algorithms.Copy, Peer: -1, Err: err}
		}
		e.copyOp = *op
		e.copyOp.In = in
		op = &e.copyOp
	}
	// Connect every channel's peers first, from this goroutine, so that the
	// channel goroutines only read the connection table.
	chBase := 0
	if op.Coll == algorithms.CollSend || op.Coll == algorithms.CollRecv {
		chBase = e.cfg.MaxChannels
	}
	if dev {
		chBase += transport.DeviceChannels
	}
	for c := 0; c < pl.Channels; c++ {
		x := e.runs[c]
		if x.connBase != chBase {
			clear(x.conns)
			x.connBase = chBase
		}
		for _, p := range pl.Peers {
			if x.conns[p] != nil {
				continue
			}
			conn, err := e.connect(ctx, p, chBase+c)
			if err != nil {
				return pl, &StepError{Channel: c, Step: -1, Peer: p, Err: err}
			}
			x.conns[p] = conn
		}
		x.setup(e, op, pl, c, dev)
	}
	for c := 0; c < min(pl.Channels, maxProgress); c++ {
		e.prog[c].Store(0)
	}
	e.curChannels.Store(int32(pl.Channels))
	e.curSched.Store(pl.Sched)
	defer e.curSched.Store(nil)
	if pl.Channels == 1 {
		if isOneShot(op, pl) {
			e.curSched.Store(&oneShotSched)
			return pl, e.runs[0].oneShot(ctx, e.rank, e.nranks, &e.oneShotPeer)
		}
		return pl, e.runs[0].run(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	for c := 0; c < pl.Channels; c++ {
		x := e.runs[c]
		g.Go(func() error { return x.run(gctx) })
	}
	return pl, g.Wait()
}

// noPlan is what Run returns for an operation that has no plan (it
// failed its checks, or moves nothing): its sequence number only.
func (e *Engine) noPlan(seq uint64) *Plan {
	e.runPlan = Plan{Seq: seq}
	return &e.runPlan
}

// streams makes sure the first n channels have a device stream, and
// makes each wait for ready (if not nil).
func (e *Engine) streams(n int, ready device.Event) error {
	for _, x := range e.runs[:n] {
		if x.dev.s == nil {
			s, err := e.cfg.Device.NewStream()
			if err != nil {
				return err
			}
			x.dev.s = s
		}
		if ready != nil {
			if err := x.dev.s.WaitEvent(ready); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyInput returns a copy of in, in scratch memory of its kind (on the
// device, made by channel 0's stream).
func (e *Engine) copyInput(ctx context.Context, in memory.Buffer, dev bool) (memory.Buffer, error) {
	n := in.Len()
	if !dev {
		if cap(e.scratch) < n {
			e.scratch = make([]byte, n)
		}
		e.scratch = e.scratch[:n]
		copy(e.scratch, in.Bytes())
		return memory.HostBuffer(e.scratch), nil
	}
	if e.devScratch.Len() < n {
		if e.devScratch.Len() > 0 {
			if err := e.cfg.Device.Free(e.devScratch); err != nil {
				return memory.Buffer{}, err
			}
			e.devScratch = memory.Buffer{}
		}
		b, err := e.cfg.Device.Alloc(n)
		if err != nil {
			return memory.Buffer{}, err
		}
		e.devScratch = b
	}
	s := e.runs[0].dev.s
	dst := e.devScratch.Slice(0, n)
	if err := s.Copy(dst, memory.Buffer{}, in); err != nil {
		return memory.Buffer{}, err
	}
	return dst, s.Sync(ctx)
}

// Close releases what the engine holds on the device: its streams and
// scratch memory. No operation may run during or after it.
func (e *Engine) Close() error {
	var first error
	if p, ok := e.board.(transport.BoardPinner); ok {
		p.Unpin() // no collective runs or comes: the board may go
	}
	for _, x := range e.runs {
		if x.dev.s != nil {
			if err := x.dev.s.Close(); err != nil && first == nil {
				first = err
			}
			x.dev.s = nil
		}
	}
	if e.devScratch.Len() > 0 {
		if err := e.cfg.Device.Free(e.devScratch); err != nil && first == nil {
			first = err
		}
		e.devScratch = memory.Buffer{}
	}
	return first
}

func (e *Engine) connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	k := connKey{peer, ch}
	if c := e.conns[k]; c != nil {
		return c, nil
	}
	c, err := e.dial(ctx, peer, ch)
	if err != nil {
		return nil, err
	}
	e.conns[k] = c
	return c, nil
}

// goneSet is the peers that have left (PeerGone), and the connections
// being set up to each, to fail when it goes.
type goneSet struct {
	mu      sync.Mutex
	err     map[int]error
	waiting map[int]map[*int]context.CancelCauseFunc
}

// PeerGone tells the engine that peer has left for good (it closed its
// communicator: the bootstrap root says so): a connection being set up
// to it fails with err at once, and so does every later one. A connection
// already up stays as it is: the transport drains it, then reports the
// peer closed.
func (e *Engine) PeerGone(peer int, err error) {
	g := &e.gone
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = map[int]error{}
	}
	if g.err[peer] != nil {
		return
	}
	g.err[peer] = err
	for _, cancel := range g.waiting[peer] {
		cancel(err)
	}
}

// dial connects to peer on channel ch, failing at once if the peer has
// gone or goes meanwhile. Only the higher rank's wait is cut short when
// the peer goes: the lower rank sets the link up (transport.Endpoint),
// and its Connect, once the peer has answered, may be all that holds what
// the peer sent before it left (the peer accepted, sent and closed while
// this rank read its acknowledgement). A peer that has gone answers no
// new dial, so that Connect fails on its own, at once.
func (e *Engine) dial(ctx context.Context, peer, ch int) (transport.Conn, error) {
	g := &e.gone
	g.mu.Lock()
	if err := g.err[peer]; err != nil {
		g.mu.Unlock()
		return e.arrived(ctx, peer, ch, err)
	}
	g.mu.Unlock()
	cctx, cancel := context.WithCancelCause(ctx)
	stop := func() {}
	if e.rank > peer {
		stop = e.cancelWhenGone(cancel, func(_ int, err error) error { return err }, peer)
	}
	c, err := e.ep.Connect(cctx, peer, ch)
	stop()
	g.mu.Lock()
	gone := g.err[peer]
	g.mu.Unlock()
	cancel(nil)
	if err != nil && gone != nil && ctx.Err() == nil {
		return e.arrived(ctx, peer, ch, gone)
	}
	return c, err
}

// cancelWhenGone makes PeerGone of any of peers cancel with what cause
// makes of the peer's error, until stop is called; a peer that has gone
// already cancels at once.
func (e *Engine) cancelWhenGone(cancel context.CancelCauseFunc, cause func(peer int, err error) error, peers ...int) (stop func()) {
	g := &e.gone
	id := new(int)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiting == nil {
		g.waiting = map[int]map[*int]context.CancelCauseFunc{}
	}
	for _, p := range peers {
		if err := g.err[p]; err != nil {
			cancel(cause(p, err))
		}
		if g.waiting[p] == nil {
			g.waiting[p] = map[*int]context.CancelCauseFunc{}
		}
		g.waiting[p][id] = func(err error) { cancel(cause(p, err)) }
	}
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, p := range peers {
			delete(g.waiting[p], id)
		}
	}
}

// arrived returns a connection that peer, which has gone, made before it
// left: it still carries what the peer sent (Connect with an ended
// context collects one that has arrived). Without one, the connection
// fails with gone: only waiting for it is hopeless.
func (e *Engine) arrived(ctx context.Context, peer, ch int, gone error) (transport.Conn, error) {
	cctx, cancel := context.WithCancelCause(ctx)
	cancel(gone)
	if c, err := e.ep.Connect(cctx, peer, ch); err == nil {
		return c, nil
	}
	return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: gone}
}

// maxProgress bounds the channels Progress reports.
const maxProgress = 64

// progDone is a channel's position once it has finished its part.
const progDone = -1

// Progress is where one channel of the running operation is.
type Progress struct {
	Channel, Piece, Step int // Step -1: not started (or Done)
	Kind                 algorithms.Kind
	Peer                 int  // the step's incoming peer, else its outgoing one, else -1
	Done                 bool // the channel has finished its part
}

// Progress reports how far each channel of the operation running now has
// got (nil when none runs, but between operations it may still report
// the last one on the board: ask while an operation runs). Any
// goroutine may call it, for diagnostics: a channel that is waiting shows
// the step it waits in.
func (e *Engine) Progress() []Progress {
	s := e.curSched.Load()
	if s == nil {
		return nil
	}
	if s == &boardSched {
		return e.boardProgress()
	}
	if s == &oneShotSched {
		p := Progress{Channel: 0, Step: 0, Kind: algorithms.SendRecv, Peer: int(e.oneShotPeer.Load())}
		if e.prog[0].Load() == progDone {
			p = Progress{Channel: 0, Step: -1, Peer: -1, Done: true}
		}
		return []Progress{p}
	}
	n := min(int(e.curChannels.Load()), maxProgress)
	out := make([]Progress, 0, n)
	for c := 0; c < n; c++ {
		v := e.prog[c].Load()
		if v == 0 || v == progDone {
			out = append(out, Progress{Channel: c, Step: -1, Peer: -1, Done: v == progDone})
			continue
		}
		p := Progress{Channel: c, Piece: int(v >> 32), Step: int(v&0xffffffff) - 1, Peer: -1}
		if p.Step >= 0 && p.Step < len(s.Steps) {
			st := s.Steps[p.Step]
			p.Kind = st.Kind
			switch {
			case st.RecvPeer >= 0:
				p.Peer = int(st.RecvPeer)
			case st.SendPeer >= 0:
				p.Peer = int(st.SendPeer)
			}
		}
		out = append(out, p)
	}
	return out
}

// StepError says where an operation failed.
type StepError struct {
	Channel int
	Piece   int
	Step    int // -1 while connecting
	Kind    algorithms.Kind
	Peer    int // the peer of the failing call, -1 if none
	Err     error
}

func (e *StepError) Error() string {
	if e.Step < 0 && e.Peer < 0 {
		return fmt.Sprintf("channel %d: setting up: %v", e.Channel, e.Err)
	}
	if e.Step < 0 {
		return fmt.Sprintf("channel %d: connecting to rank %d: %v", e.Channel, e.Peer, e.Err)
	}
	return fmt.Sprintf("channel %d piece %d step %d (%v): %v", e.Channel, e.Piece, e.Step, e.Kind, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// MismatchError reports a slice whose tag or size differs from what the
// receiver expected: the ranks disagree about the operation.
type MismatchError struct {
	Peer      int
	Got, Want transport.Tag
	GotBytes  int
	WantBytes int
	// OffBoard: this rank waited on the shared board (board.go) for a
	// collective the peer ran over its connections (Got.Sig is its
	// signature) or went past (Got.Sig is 0).
	OffBoard bool
}

func (e *MismatchError) Error() string {
	if e.OffBoard {
		return offBoardText(e)
	}
	what := "the ranks disagree about the operation"
	switch {
	case e.Got.Sig != e.Want.Sig:
		what = "the ranks called different operations: " + describeMismatch(e.Got.Sig, e.Want.Sig)
	case e.Got.Op != e.Want.Op:
		what = "the ranks are at different operations (one issued more collectives than the other)"
	}
	return fmt.Sprintf("rank %d sent %d bytes as %v, this rank expected %d bytes as %v: %s",
		e.Peer, e.GotBytes, e.Got, e.WantBytes, e.Want, what)
}
