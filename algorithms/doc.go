// Package algorithms builds collective schedules as data: for every rank, a
// list of steps in NCCL's primitive vocabulary (send, recv,
// recvReduceSend, recvReduceCopy, recvReduceCopySend, recvCopySend, copy,
// copySend, and two exchanges, sendRecv and sendRecvReduceCopy), over block
// indices. It also holds the cost model and the tuner that pick an
// algorithm, a channel count and a chunk size.
//
// The package imports the standard library only. It has no goroutines, no
// clock, no environment and no I/O: everything here is a pure function of
// its arguments, so schedules can be tested exhaustively without running a
// transport (package algotest simulates them), and the engine that runs
// them (internal/engine) owns all the I/O.
//
// # Blocks, pieces and slices
//
// A schedule does not depend on the element count. It names blocks; a
// Layout maps blocks to element ranges for a given count:
//
//  1. The element space is Majors × K elements: one major block per rank
//     for reduce-scatter, all-gather and all-to-all (each rank's share),
//     else one.
//  2. The engine cuts every major block into P pieces (P a multiple of the
//     channel count; each channel owns a contiguous run of pieces) and runs
//     the whole schedule once per piece, in order. That is NCCL's loop over
//     chunks: pieces pipeline through the ranks.
//  3. Within a piece, each major block is cut into the schedule's Minor
//     blocks (n for a ring all-reduce, 2 for the double binary tree, p for
//     Rabenseifner).
//  4. Within a step, the engine streams each block in slices of at most one
//     slot, so a step that receives and sends forwards a slice as soon as it
//     has it.
//
// All cuts are balanced (parts differ by at most one element), so any count
// works with any rank count; blocks may be empty, and an empty block moves
// nothing on either side.
//
// # Obligations of a schedule (checked by Check, Validate and algotest)
//
//  1. Step fields match the kind; peers exist and are not the rank itself.
//  2. Dst is always Output: Input (the user's send buffer) is never written.
//  3. For each ordered pair of ranks, the messages one sends the other are,
//     in order, the messages the other receives from it: connections are
//     FIFO and carry no tags.
//  4. Each output element is the reduction of every rank's input element
//     exactly once (or, for data movement, exactly the right input), and
//     the step marked Final is the one that completes it, once.
//  5. It does not deadlock when every message fits in half of a link's
//     slots (MinPieces), whatever the interleaving of ranks.
//  6. It is correct when the buffers alias in NCCL's in-place forms, or
//     says it is not (CopyInPlace) and the engine gives it a copy of the
//     input.
//
// # Algorithms
//
// All-reduce: Ring (reduce-scatter + all-gather, bandwidth-optimal), Tree
// (double binary tree, logarithmic latency at full bandwidth), RecDoubling
// (log2 n exchanges of the whole buffer, for small messages) and
// Rabenseifner (recursive halving then doubling, for mid sizes), which
// fold the extra ranks of a count that is not a power of two, and OneShot
// (every rank sends its input to every other and reduces all n locally in
// rank order: one hop, for small messages on few ranks, and for every
// size on two ranks over a link slower than the reduction), and Hier (the
// hierarchical all-reduce for hosts of equal rank counts: reduce-scatter
// inside each host, all-reduce of each shard across hosts, all-gather
// inside each host), on rings of hosts or, as HierTree, on a double binary
// tree of them.
// Reduce-scatter and all-gather: the halves of the ring; OneShot, every
// rank sending each peer its block directly (one hop, the ring's bytes,
// for a few ranks on one host, and for a reduce-scatter of up to a chunk
// on two ranks over a link slower than the reduction); and Hier, the
// same n-1 steps as the ring on chains that cross hosts all at once
// (hosts.go), so that a host's link carries (h-1)/h of the data.
// All-gather also has RecDoubling: log2 n exchanges of growing groups of
// blocks (for a power of two from 4, fewer hops than the ring's n-1 and
// fewer messages than OneShot's n-1; other counts fold, two hops more),
// for small and mid sizes on one host.
// Broadcast and reduce: a pipelined chain along the ring. All-to-all:
// pairwise exchange.
// Send and recv: one transfer.
//
// Across hosts (Params.Hosts), rings run host by host (HostRing), the tree
// is a chain in each host under a double binary tree of hosts (HostTree),
// and the all-reduces that pair ranks by number pair ring positions; see
// hosts.go for the reasoning.
package algorithms
