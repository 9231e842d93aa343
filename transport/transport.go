package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goccl/goccl/memory"
)

// Endpoint is one rank's attachment to a transport. It makes the
// connections the engine asks for and tears them all down on Close.
type Endpoint interface {
	// Connect returns the connection to peer for channel ch, establishing
	// it on first use and returning the same Conn afterwards. Both ranks of
	// a pair connect when they first need the link; Connect blocks until
	// the link is usable or ctx ends. The lower rank of the pair sets the
	// link up and the higher waits for it: the lower rank's Connect fails
	// by itself, at once, when the peer's endpoint has closed (for tcp,
	// shm and verbs, when their Options say ListenersUp), so it need not
	// be cut short when the peer leaves (and must not be: the peer may
	// have accepted it, sent on it and closed). It is safe for concurrent
	// use.
	Connect(ctx context.Context, peer, ch int) (Conn, error)
	// Caps describes the connections this endpoint makes.
	Caps() Caps
	// Close tears the endpoint down and is idempotent. With a nil cause it
	// is graceful: data already posted stays readable by its receivers,
	// who get ErrPeerClosed only once they have drained it. With a non-nil
	// cause it aborts: every pending and later call on this endpoint's
	// connections, on both sides, fails at once, the peers' with a
	// *PeerError wrapping cause. Close does not wait for calls in progress.
	Close(cause error) error
}

// Caps describes an endpoint's connections. The engine sizes its slices
// and pieces from it, so every rank of a communicator must see the same
// Slots and SlotSize.
type Caps struct {
	Slots    int // slots per connection and direction (≥ 2)
	SlotSize int // bytes per slot
	// Memory is the kind of the slots of connections for host operations.
	Memory memory.Kind
	// DeviceSlots is the kind of the slots of connections for device
	// operations (channels from DeviceChannels on): Device or Mapped
	// memory, which a GPU's kernels reach. Host means the endpoint carries
	// no device operations.
	DeviceSlots memory.Kind
}

// DeviceChannels is added to the channel number of the connections that
// carry operations on device memory, so that a transport can give them
// slots a GPU reaches (Caps.DeviceSlots) while host operations keep slots
// in host memory.
const DeviceChannels = 1 << 16

// MaxChannel is the highest channel number of host operations a
// communicator uses: collectives on 0 up to 31, point-to-point on
// P2PChannel and the one after. Device operations use the same numbers
// from DeviceChannels on, and a transport may keep DeviceChannels-1 for
// itself (the RDMA board).
const MaxChannel = P2PChannel + 1

// P2PChannel carries host point-to-point data from the lower rank of a
// pair to the higher, P2PChannel+1 from the higher to the lower. Each of
// their connections is driven by a goroutine of its own, one per peer and
// direction, so that a rank's sends and receives progress independently
// (what MPI promises for Isend and Irecv): a transport keeps no state
// shared among the connections of these channels, and its Progress (see
// Progresser) has nothing to do for them. Device point-to-point runs in
// issue order, on the channel after a communicator's collective ones
// (plus DeviceChannels).
const P2PChannel = 32

// Independent reports whether channel ch's connections are each driven
// by a goroutine of their own (the point-to-point channels).
func Independent(ch int) bool {
	c := ch % DeviceChannels
	return ch < DeviceChannels && (c == P2PChannel || c == P2PChannel+1)
}

// P2PDataChannel is the channel that carries point-to-point data from
// rank from to rank to.
func P2PDataChannel(from, to int) int {
	if from > to {
		return P2PChannel + 1
	}
	return P2PChannel
}

// ValidChannel reports whether a peer may ask for a connection on channel
// ch: the numbers a communicator uses, so that an authenticated peer
// cannot make an endpoint set up connections without bound.
func ValidChannel(ch int) bool {
	return ch >= 0 && ch <= MaxChannel || ch == DeviceChannels-1 || ch >= DeviceChannels && ch <= DeviceChannels+MaxChannel
}

// Tag identifies a slice on the wire: which operation it belongs to (its
// sequence number and a signature of what it is), which message of that
// operation on this connection, and which slice of the message. The engine
// stamps every slice it posts and checks every slice it receives, so that
// two ranks that disagree about an operation get an error instead of each
// other's data.
type Tag struct {
	Op    uint64
	Sig   uint32 // hash of the operation's collective, type, operator, count, root and plan
	Msg   uint32
	Slice uint32
}

func (t Tag) String() string {
	return fmt.Sprintf("op %d (signature %08x) message %d slice %d", t.Op, t.Sig, t.Msg, t.Slice)
}

// Conn is a bidirectional connection to one peer on one channel: in each
// direction a ring of Slots slots of SlotSize bytes, filled by the sender
// and drained by the receiver in order. At most Slots slices are in flight
// per direction, so a sender runs at most that far ahead of its receiver.
//
// A connection is driven by one goroutine at a time (the engine's channel
// goroutine): a transport may move one direction's data while the caller
// waits on the other, and may share that work among the connections of a
// channel. Reserve is followed by Post before the next Reserve, and Wait by
// Release before the next Wait. Any goroutine may close the endpoint.
type Conn interface {
	// Peer returns the rank at the other end.
	Peer() int
	// Reserve blocks until the next outgoing slot is free and returns n
	// bytes of it (n ≤ SlotSize) for the caller to fill. The memory may be
	// the receiver's own (shared memory, in-process), so the sender writes
	// or reduces straight into it.
	Reserve(ctx context.Context, n int) (memory.Buffer, error)
	// Post hands the reserved slot, holding n bytes, to the receiver.
	Post(n int, tag Tag) error
	// Wait blocks until the next incoming slot is filled and returns its
	// bytes and tag. The data stays valid until Release.
	Wait(ctx context.Context) (memory.Buffer, Tag, error)
	// Release returns the slot obtained by Wait to the sender.
	Release() error
}

// Errors.
var (
	// ErrPeerClosed: the peer closed its endpoint gracefully and has no more
	// data for us, or takes no more from us.
	ErrPeerClosed = errors.New("peer closed the connection")
	// ErrClosed: this endpoint was closed.
	ErrClosed = errors.New("transport endpoint closed")
)

// PeerError is a failure of the link to one peer.
type PeerError struct {
	Peer int    // the rank at the other end
	Op   string // what was under way: "connect", "send", "recv"
	Err  error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("%s with rank %d: %v", e.Op, e.Peer, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// PeerAbortedError is the cause a peer gave when it aborted.
type PeerAbortedError struct {
	Peer  int
	Cause error
}

func (e *PeerAbortedError) Error() string {
	return fmt.Sprintf("rank %d aborted: %v", e.Peer, e.Cause)
}

func (e *PeerAbortedError) Unwrap() error { return e.Cause }

// ErrSizeMismatch: an incoming slice does not have the size the receiver
// expected (see DirectReceiver). The ranks disagree about the operation.
var ErrSizeMismatch = errors.New("incoming slice has an unexpected size")

// DirectReceiver is implemented by connections that can land a slice
// straight in the caller's memory, saving the copy out of a slot when no
// reduction is needed (NCCL's directRecv).
type DirectReceiver interface {
	// WaitInto blocks until the next incoming slice arrives. When it holds
	// exactly dst.Len() bytes, they are written into dst and WaitInto
	// returns the slice's tag. Otherwise it returns the tag and the slice's
	// size with ErrSizeMismatch, dst untouched; the connection is then
	// unusable. It replaces a Wait/Release pair.
	WaitInto(ctx context.Context, dst memory.Buffer) (Tag, int, error)
}

// DirectSender is implemented by connections that can send straight from
// the caller's memory, saving the copy into a slot (NCCL's directSend).
type DirectSender interface {
	// PostFrom queues src as the next outgoing slice, to be sent from src
	// itself: src must stay valid and unchanged until Flush returns. It
	// replaces a Reserve/Post pair. A transport that queues (TCP) does not
	// wait for a free slot; one whose receiver reads src itself (see
	// PeerCopier) waits for one, bounded by ctx.
	PostFrom(ctx context.Context, src memory.Buffer, tag Tag) error
}

// PageLender is implemented by connections that can send a slice
// posted with PostFrom out of the caller's own pages, the kernel reading
// them after the call returns, instead of copying it (TCP's vmsplice,
// tcp.Options.Lend), at the price of Flush waiting until the receiver
// has read what was lent. Before each step that sends with PostFrom the
// engine says what the operation is, and the connection decides whether
// it lends for the rest of the operation: its size in bytes, its ranks,
// whether every receive lands in the output (broadcast, all-gather:
// the receivers then only copy, and the senders' copies are what lending
// saves), and whether every rank both sends and receives throughout
// (all-gather: no rank is only a sender whose core the lending frees).
// Flush ends the operation; a PostFrom after it that was not preceded by
// LendFor copies.
type PageLender interface {
	LendFor(opBytes int64, nranks int, lands, exchange bool)
}

// PeerCopier is implemented by connections whose PostFrom leaves the
// copy to the receiver: it reads the slice straight out of the sender's
// memory (shared memory's cross-memory attach, process_vm_readv, as Open
// MPI's vader BTL does), so a slice moves with one copy instead of two,
// into the slot and out of it. That pays only where the receiver lands
// the slice in its output (DirectReceiver); a receiver that reduces would
// copy it into a slot first. So the engine sends with PostFrom on such a
// connection only in collectives whose receives all land (broadcast,
// all-gather), and only when PeerCopies says so for the operation's size.
type PeerCopier interface {
	// PeerCopies reports whether an operation of opBytes bytes should
	// move its slices by the receiver's copy: whether the size is one
	// where that pays, and whether the receiver can read the sender's
	// memory (as the receiver found it: send says which end asks). Both
	// Wait and WaitInto take slices sent either way.
	PeerCopies(opBytes int64, send bool) bool
}

// BlockCopier is implemented by PeerCopier connections whose sender can
// post, by reference, a slice larger than a slot: a block, which the
// receiver copies out of the sender's memory in one call into the kernel
// instead of one per slot-sized slice (process_vm_readv costs about 1.6 µs
// a call on these VMs: a MiB moves in 44 µs in one call and in 165 µs in
// 16 KiB ones; docs/performance.md, "Blocks by reference").
//
// The sender decides alone, step by step; the receiver follows what
// arrives. A sender whose step sends its input asks BlockSlice, cuts the
// step into slices of that size and posts each with PostBlock; a receiver
// asks PeekBlock before the step's first slice and, when it returns a
// block size, cuts its side of the step the same way and takes each slice
// with WaitInto. The two sides' cuts then match without a word between
// them, whichever way either side's settings lean. Only steps that land
// what they receive (recv: broadcast, all-gather) or reduce it into the
// output (recvReduceCopy: reduce, reduce-scatter) on two ranks are cut
// into blocks: a forwarding rank could not pass a block on to a peer that
// cannot read it. reduces says which of the two an operation is; each
// has its own choice, since the slots' cost differs between them.
type BlockCopier interface {
	// BlockSlice returns the size, in bytes, to cut a step of an
	// operation of opBytes into when its slices go by reference, or 0
	// to keep slot-sized slices (the peer cannot read this rank's memory,
	// or has not found that blocks pay at this size).
	BlockSlice(opBytes int64, reduces bool) int
	// PostBlock is PostFrom for a slice of a step cut into slices of
	// block bytes (BlockSlice's answer): src, at most block bytes, goes
	// by reference, and the receiver learns block from it.
	PostBlock(ctx context.Context, src memory.Buffer, tag Tag, block int) error
	// PeekBlock waits for the next incoming slice without taking it and
	// returns the block size its sender cut the step into, or 0 when the
	// step was cut into slot-sized slices.
	PeekBlock(ctx context.Context) (int, error)
	// Received tells the receiving side how long this rank's share of an
	// operation of opBytes took (its channel, from start to flush) and how
	// many of the steps it received in came in blocks, so that it can
	// choose which way to ask for the next ones of that size. The engine
	// calls it after every such operation.
	Received(opBytes int64, reduces bool, blocks, steps int, took time.Duration)
}

// SplitCopier is implemented by BlockCopier connections whose receiver
// shares a block's copy with its sender: the sender writes part of the
// block into the receiver's output while it waits on the connection
// (shm: split_linux.go). A sender that has work of its own after posting
// (its copy of the block into its own output) says so first, and its
// receiver then copies those blocks alone: a share the sender would take
// only once that work is done comes too late to pay.
type SplitCopier interface {
	// BusyAfterPosts says whether this side has work of its own after
	// the blocks it posts from now on.
	BusyAfterPosts(busy bool)
}

// FarSlots is implemented by connections whose slots (Reserve) another
// core reads next: another process's (shared memory), or another
// goroutine's. SlotsFar says whether the engine writes them with
// streaming stores, which take no cache line from the reader's core: a
// plain store to a line that core still holds from the slot's last use
// waits for the line to come back first. A connection whose slots a
// socket or a device copy reads on this core does not implement it.
type FarSlots interface {
	SlotsFar() bool
}

// PeerMapper is implemented by connections whose receiver can map the
// sender's shared allocations (memory.AllocShared) and copy a slice
// straight out of them with a plain copy: PostFrom sends a slice that
// lies in one by reference whatever PeerCopies says, and WaitInto copies
// it into the output. The engine uses PostFrom and WaitInto on such a
// connection in host all-gathers and broadcasts (of two ranks too), and
// PostFrom for the steps of other collectives that send the input as it
// is, when this rank's own buffers are shared allocations and PeerMaps
// says so for the operation's size (send: whether the peer can map this
// rank's; else whether this rank can map the peer's). Either side may
// decide alone: a slice by reference that arrives in Wait is lent
// (Lender) or copied into the slot.
type PeerMapper interface {
	PeerMaps(opBytes int64, send bool) bool
}

// Lender is implemented by connections whose Wait may return memory the
// peer lends instead of a slot: a read-only view of the peer's own
// buffer (a shared allocation, PeerMapper), valid until Release. The
// peer's caller may reuse that buffer once its operation has failed, so
// a caller that read such a slice calls Intact before it passes on
// anything computed from it: an error means the peer aborted and what
// was read may not be what it sent.
type Lender interface {
	Intact() error
}

// Flusher is implemented by connections whose posted slices may still be
// on their way out when Post returns.
type Flusher interface {
	// Flush blocks until every slice posted on the connection has left
	// this rank (handed to the network), the connection fails, or ctx
	// ends. The engine flushes every connection an operation used before
	// the operation returns, so that the caller may reuse its buffers.
	Flush(ctx context.Context) error
}

// Board is memory that every rank of a communicator reads and writes (one
// host's ranks over shared memory): a collective of a few bytes is one
// post per rank there, where connections would take n-1, and each rank
// reads the others' contributions straight from it (Open MPI's coll/sm
// works the same way). Collectives are numbered alike on every rank (the
// engine's sequence); a rank posts its contribution to collective seq, or
// marks that it runs seq some other way, and the others read that. Only
// the engine's goroutine calls a board's methods.
type Board interface {
	// Max is the largest contribution, in bytes.
	Max() int
	// Begin opens one collective's use of the board and End closes it:
	// Post and Read are called between the two only, and the memory Read
	// returns stays mapped until End whatever closes the endpoint in the
	// meantime (an abort from another goroutine unmaps the board only
	// once End has let go of it). Begin fails once the endpoint is
	// closing; every Begin that succeeds is followed by one End.
	Begin() error
	End()
	// Post publishes this rank's contribution to collective seq, with the
	// operation's signature (as in Tag.Sig). It may wait until every
	// member has finished reading what this rank posted some collectives
	// ago (two at least: the board's depth).
	Post(ctx context.Context, seq uint64, sig uint32, data []byte) error
	// Mark records that this rank runs collective seq (signature sig)
	// without the board, so that a rank waiting on the board for it learns
	// that at once instead of waiting until its timeout. It may be called
	// outside Begin and End too.
	Mark(seq uint64, sig uint32)
	// Read waits until rank r has posted collective seq, and returns its
	// signature and data, valid until this rank's next Post or End,
	// whichever comes first. If r marked
	// seq, or went past it, without posting it, Read returns posted false
	// and the mark's signature (0 if r went past without a mark).
	Read(ctx context.Context, r int, seq uint64) (sig uint32, data []byte, posted bool, err error)
}

// BoardPinner is implemented by a Board that keeps its memory mapped
// from a collective's Begin past its End, so that the collectives after
// it skip holding the board each (an atomic reference count taken and
// dropped per collective, two locked instructions, drew an eighth of
// the samples of an 8-byte broadcast's profile: docs/performance.md,
// "The 8-byte call path"). The memory stays
// mapped whatever closes the endpoint (an abort replaces it with
// harmless private pages) until Unpin, which the board's one user calls
// once no collective can Begin any more (its engine closing). Without
// Unpin the mapping lives as long as the process.
type BoardPinner interface {
	Unpin()
}

// BoardMarkEvery is implemented by a Board whose posts need to learn of
// the others' progress less often than every collective: MarkEvery
// returns k, and the engine then marks a collective that it would mark
// only to say that this rank has got that far (a broadcast's reader, a
// reduce's root and posters) only where its sequence number is a multiple
// of k. A mark that says a collective runs elsewhere (the Mark contract
// above) is made every time. Every run of the board's depth minus one
// consecutive collectives must hold a multiple of k, or a post could wait
// for a mark that never comes.
type BoardMarkEvery interface {
	MarkEvery() int
}

// BoardWaiter is implemented by a Board that knows whom it waits for:
// Waiting returns the member a Post or Read of this rank is waiting on
// now, or -1 when none is. The engine reports it in Progress, so that it
// need not record whom each read is for, a store per read on an 8-byte
// operation's path, where the board only records it once a read or a
// post has to wait. Any goroutine may call it.
type BoardWaiter interface {
	Waiting() int
}

// BoardJoiner is implemented by a Board that is still being set up when
// the endpoint hands it out (shared memory's joins in the background
// while the communicator is made). Joined waits until it is ready, or
// fails; no method but Max (a constant) may be called before Joined has
// succeeded.
type BoardJoiner interface {
	Joined(ctx context.Context) error
	// JoinedBoard, once Joined has succeeded, is the board that was
	// joined, for the caller to use in place of the joiner (which only
	// passes every call on to it).
	JoinedBoard() Board
}

// BoardHolder is implemented by endpoints that may share a Board among
// all of a communicator's ranks.
type BoardHolder interface {
	// Board returns the board, or nil if the endpoint has none.
	Board() Board
}

// Progresser is implemented by endpoints whose sends move only while a
// channel's goroutine moves them (TCP's non-blocking writes, finished by
// whatever the goroutine calls next). A channel may wait on a connection
// of another transport meanwhile (shared memory, RDMA), so the endpoints
// of a communicator that waits themselves take a progress function
// (their Options.Progress) and call it while they wait: ProgressOf makes
// it from the communicator's Progressers.
type Progresser interface {
	// Progress moves, without blocking, what channel ch's connections have
	// queued, and reports whether any of it still waits, or the first
	// error. Only channel ch's goroutine calls it; for an Independent
	// channel it does nothing (each connection's own goroutine moves it).
	Progress(ch int) (pending bool, err error)
}

// ProgressOf returns a function that progresses every Progresser among
// eps, or nil when none of them is one.
func ProgressOf(eps ...Endpoint) func(ch int) (bool, error) {
	var ps []Progresser
	for _, e := range eps {
		if p, ok := e.(Progresser); ok {
			ps = append(ps, p)
		}
	}
	switch len(ps) {
	case 0:
		return nil
	case 1:
		return ps[0].Progress
	}
	return func(ch int) (bool, error) {
		any := false
		for _, p := range ps {
			pending, err := p.Progress(ch)
			if err != nil {
				return pending, err
			}
			any = any || pending
		}
		return any, nil
	}
}
