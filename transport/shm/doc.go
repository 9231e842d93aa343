// Package shm is goccl's transport between processes on one host: a
// connection is a pair of slot rings in a shared memory segment, so a
// sender writes (or reduces) straight into the slot its receiver reads,
// and the receiver reduces straight out of it; no byte goes through the
// kernel.
//
// # Segments
//
// For each pair of ranks and channel, the lower rank creates an anonymous
// memfd segment (one ring per direction: control lines, slot descriptors,
// slot data; see segment_linux.go) and hands its file
// descriptor to the higher rank over a Unix socket (SCM_RIGHTS), checked
// as the next section says. Both map it and close the descriptor at once.
// The segment has no name, so nothing can outlive the job: the kernel
// frees it when the last mapping goes, crashed processes included.
//
// # Who may connect
//
// Each rank listens on an abstract Unix socket with a random name
// (Listen). Abstract sockets have no file permissions, and /proc/net/unix
// lists their names to every user, so neither the socket nor its name
// keeps anyone out: any process in the network namespace can connect,
// and can take a name once its rank has gone. A connection is therefore
// admitted in two steps:
//
//  1. Its other end's credentials (SO_PEERCRED, as of its connect or
//     listen): the process must run as this process's user or one in
//     Options.AllowUIDs. The accepting side checks before it reads a
//     byte and closes a refused connection at once, so that another
//     user's connections cannot fill the few places of connections
//     being set up (the board's hand-over comes the same way); the
//     dialing side checks the listener before it hands over a
//     descriptor.
//  2. The handshake (internal/handshake): both ends prove that they know
//     the job's secret, and the setup that follows says which ranks and
//     channel the connection joins.
//
// # What shared memory trusts
//
// A process that maps a segment can write anything into it, so ranks
// trust each other's data, as on any transport; that is what admission
// establishes. Sizes a peer writes into slot descriptors and board
// entries are bounded before use. What a peer must not be able to do is
// crash this rank, and a memfd shrunk by anyone who holds it would: the
// next access to the pages cut off is SIGBUS. So every memfd the
// transport hands out (pair segments, the board) is created with
// MFD_ALLOW_SEALING and, once sized and before it is handed over, sealed
// against shrinking and growing and against further seals; a rank maps a
// descriptor it receives only if it carries those seals and has the size
// this rank expects, and refuses the hand-over otherwise.
//
// # Messages
//
// Each slot has a 64-byte descriptor (one cache line) holding the slice's
// tag, size and a sequence flag written last; slices of up to 32 bytes
// travel inside the descriptor itself, larger ones in the slot's data
// pages. A receiver polls the one descriptor it expects, and one cache
// line brings it the flag, the tag and a small payload together (NCCL's
// LL protocol puts flags next to data for the same reason). The receiver
// advances a head counter, on a cache line of its own, as it releases
// slots; the sender reads it only when it runs out of slots.
//
// The engine writes a slot's data pages with streaming stores
// (transport.FarSlots; Options.NoStreamSlots, GOCCL_SLOT_STREAM_DISABLE):
// the receiver's core read the same lines when the slot last went round,
// and a plain store would first have to take each line back from it.
// Going around the caches, a slice reaches the receiver through memory
// instead of from the sender's cache, and that measured 1.5 to 2.9 times
// faster at 64 KiB to 64 MiB on these VMs (docs/performance.md,
// "Streaming stores into the slots").
//
// # Waiting
//
// Waits poll the descriptor (or the head) with PAUSE for SpinFor, giving
// the CPU away every 256 polls, then sleep on a futex in the segment, a
// few milliseconds at a time so that contexts, aborts and dead peers are
// noticed. A rank that sleeps sets a flag; the other side wakes it only
// when the flag is set, so the common path makes no system call at all.
// With Options.YieldWhenIdle (the collective layer sets it when a machine
// runs more ranks than it has cores, as 4 ranks on 2 here, whatever hosts
// they count as) every failed poll yields:
// the rank being waited for may need this very core. MPICH's pure
// busy-waiting turns an 8-byte all-reduce into 4 ms in that case
// (../shared/baselines/RESULTS.md). While waiting, Options.Progress lets a
// communicator that mixes transports keep its TCP sends moving.
//
// # The board
//
// When every rank of a communicator is on this host, Init and Split call
// StartBoard (JoinBoard in the background): rank 0 creates one more memfd
// segment, the board, and hands it to every other rank at once, as it
// hands over pair segments. A split child's is offered ahead instead
// (OfferBoard: every member makes one before the exchange that says who
// the child's rank 0 is; Options.Board, BoardAt): the others open rank
// 0's through /proc/<pid>/fd, checked by its seals, size and a nonce,
// and pull it from rank 0's listener only where that open is refused
// (offer_linux.go). The engine waits for it at the first
// collective (transport.BoardJoiner), and a graceful Close lets a join in
// flight finish rather than break the hand-overs. Each rank has 64
// entries there (collective seq uses entry seq mod 64) of BoardMax bytes,
// and a
// collective that fits is one post to its entry and a read of everyone
// else's (the engine's board.go says which; board_linux.go has the layout
// and the rule for reusing an
// entry). Readers wait as on a connection, on the board's one futex word.
// A rank that aborts raises a flag there with its reason; a rank whose
// process dies leaves no flag, and the communicator's watch (the
// bootstrap root) aborts the survivors' endpoints, which ends their waits.
//
// # The receiver's single copy
//
// Where the receiver only lands a slice in its output (all-gather, and
// broadcasts of three ranks or more), the sender may post where the slice
// is instead of copying it, and the receiver has the kernel copy it
// straight out of the sender's memory (process_vm_readv). It is probed
// per connection and, by default, used in slot-sized slices only where
// this host's kernel copies at least half as fast as user space, and
// only in operations of 192 KiB to 8 MiB: below, a system call per slice
// costs more than the copy it saves; above, the kernel's copy out of a
// peer's whole buffer loses to the slots' ring.
// cma_linux.go has the details.
//
// On two ranks, where a broadcast's, all-gather's, reduce's and
// reduce-scatter's steps only send or only receive, the sender may cut a
// step into blocks (1 MiB, Options.BlockSize) that go by reference, one
// system call each instead of one per slot, and the receiver cuts its
// side of the step by what the first slice says (transport.BlockCopier).
// Whether blocks or slots carry a size is measured as the operations run,
// per size class and per kind of operation, by the receiving side, which
// asks the sender for one or the other in the segment's header
// (blocks_linux.go): on these VMs the answer flips with the machine's
// cross-core state. A block's copy is shared with its sender, which
// otherwise only waits: it writes the second half into the receiver's
// output (process_vm_writev) while the receiver reads the first, unless
// it said in the post that it has a copy of its own to make (out of
// place) or the kernel refused it once (split_linux.go).
//
// Where the sender's slice lies in a shared allocation
// (memory.AllocShared, which collective.MemAlloc returns), the reference
// names the allocation instead, and the receiver maps it read-only once,
// through /proc/<pid>/fd, checking its seals and its nonce, and copies
// the slice out with a plain copy at memcpy's speed, or, from a plain
// Wait, lends the mapped slice itself to the caller (transport.Lender),
// which reduces straight out of it (shared_linux.go).
//
// # Failures
//
// The Unix socket stays open as a control channel: a peer that dies closes
// it (the kernel does), which the waiting side notices; a peer that aborts
// writes its cause there and raises a flag in the segment first, so the
// other side reports the cause. Close(nil) marks this rank gone; its
// receivers drain what it posted, then get ErrPeerClosed.
//
// Goroutines: one accept loop per endpoint and one short-lived goroutine
// per incoming connection while it authenticates. Close stops them.
package shm
