// Package engine runs one rank's part of a collective: it asks the tuner
// (package algorithms) for a plan, takes the rank's schedule, cuts the
// buffers into channels, pieces and slices, and drives every step through
// the transport's connections and a data path: the host reduction kernels
// for host memory, a GPU's stream for device memory.
//
// # How a step runs
//
// A step has at most one incoming and one outgoing stream. The engine
// walks the step's blocks in slices of at most one slot. For each slice of
// a lockstep step it waits for the incoming slot, reserves the outgoing
// one, computes the step's value straight from the incoming slot and the
// local operand into the outgoing slot and/or the destination (one pass for
// recvReduceSend: the fused primitive of NCCL's prims_simple.h), posts the
// outgoing slot and releases the incoming one. Because each slice moves on
// as soon as it is ready, a chain of ranks pipelines at slice granularity,
// and a connection's Slots bound how far a sender runs ahead. Blocks are
// cut into at least four slices so that the chain's hops overlap, except
// where overlap buys nothing (slotSlices): exchanges that go in lockstep,
// one-hop schedules that forward nothing, and, when some machine runs more
// ranks than it has cores (Config.Oversubscribed), broadcast, reduce and
// all-reduce, whose hops have no idle core to overlap on.
//
// Exchanges (recursive doubling, Rabenseifner, all-to-all) alternate one
// outgoing and one incoming slice, so two ranks sending to each other
// never wait on each other.
//
// # The data path
//
// The walk is the same for host and device memory; what differs is a
// small backend (datapath.go): reduce, reduce into the output and the
// outgoing slot in one pass, copy, copy to two sinks, the final copy, and
// a fence. Device work is asynchronous, so the walk fences before it
// posts a slot the data path filled (or sends straight from memory it
// wrote), before it gives back a slot the data path read, and before it
// returns; on the host the fence is free. An operation runs on the
// device when either buffer is device memory or Op.Ready is set: each
// channel then has a stream of Config.Device, which waits for Op.Ready
// before touching the buffers, and its connections are those of the
// device channel range (transport.DeviceChannels), whose slots a GPU
// reaches (Caps.DeviceSlots). Direct sends and receives stay on memory
// the CPU reaches; the board stays on host memory.
//
// Each primitive is told who reads what it writes next (a sink), and the
// host path picks its stores by it: a slot another core reads next
// (transport.FarSlots: shared memory, the in-process transport) is
// written with streaming stores at every size, since a plain store would
// first take each line back from the core that read the slot last time;
// the output, with streaming stores above 8 MiB, where it cannot stay in
// the caches; anything read on this core soon (a slot a socket sends
// from), through the caches.
//
// # Channels and pieces
//
// Each channel owns a contiguous run of the pieces (algorithms.Layout) and
// its own connections (channel id c), and runs in its own goroutine when
// there is more than one; the operation completes when all have.
// Point-to-point operations use a separate channel id (MaxChannels), so
// that they never interleave with collective traffic on one connection.
//
// # Blocks
//
// On two ranks a host broadcast's, all-gather's, reduce's and
// reduce-scatter's steps only send or only receive. Where the connection
// is a transport.BlockCopier, the sending step may cut its input into
// blocks larger than a slot that the receiver copies straight out of the
// sender's memory (exec.go's sendBlocks: shared memory's
// process_vm_readv, one system call per block instead of one per slot).
// The sender decides alone; the receiving step peeks at its first slice
// and cuts its side the same way (recvBlocksOf), landing each block in
// the output, where a reduction then reduces it in place, or, where an
// in-place reduction's block would overwrite its own source, in a scratch
// buffer the reduction reads; after the operation it tells the connection
// how long it took, which is how the transport chooses between blocks and
// slots. No forwarding step is ever cut: a middle rank could not pass a
// block on to a peer that cannot read it.
//
// # Tags
//
// Every slice carries a tag (operation sequence number, message number on
// the connection, slice number) and its length. The receiver checks both
// against what its own schedule expects, so ranks that disagree about an
// operation fail with a MismatchError naming the peer instead of reducing
// each other's unrelated data. Collectives are numbered on every rank
// alike; sends and receives per peer and direction.
//
// # The board
//
// When every rank of the communicator shares one host, the transport may
// offer a board (transport.Board): memory all of them map, which may
// still be being joined when the engine gets it (transport.BoardJoiner:
// the first collective waits for it, and fails at once, naming the peer,
// when the communicator learns that a peer has gone). An all-reduce
// of at most Board.Max bytes then skips the connections: each rank posts
// its input to its entry once and reduces everyone's entries in rank
// order (board.go). Broadcasts, all-gathers, reduce-scatters and reduces
// that fit run there too (the root posts and the others read; every rank
// posts its block; every rank posts its input and folds its own block of
// everyone's; every rank but the root posts, and the root folds the
// posts). An operation that repeats the last board operation's key
// (collective, type, operator, count, root) goes straight to the board,
// past Run's checks, which that key has passed before (a broadcast past
// runOnBoard's set-up too); what it reads is still checked against its
// signature and size. A forced algorithm
// (Config.Algo) keeps operations on the connections. Every other
// collective marks its sequence number on
// the board, so a rank waiting there for a peer that runs the operation
// over its connections (the two disagree about it) fails at once with a
// MismatchError.
//
// # Ownership and failure
//
// Run is called by one goroutine at a time. It reads op.In and writes
// op.Out only until it returns. On any failure it returns a *StepError
// (channel, piece, step, peer) and leaves the connections in an unknown
// state: the caller must abort the endpoint, which fails the peers' pending
// operations promptly instead of letting them time out.
package engine
