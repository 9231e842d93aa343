// Package transport defines what the engine needs from a transport, and
// nothing more: endpoints that make connections, and connections that are
// rings of slots.
//
// # Why slots
//
// NCCL's connections (src/include/transport.h, prims_simple.h) are rings
// of NCCL_STEPS = 8 buffers per direction: the sender fills the next free
// buffer and advances a tail counter, the receiver consumes and advances a
// head counter. That shape fits every medium goccl targets without copies
// the hardware does not need:
//
//   - in process (package mem) and shared memory between processes (shm):
//     the slots live in memory both ranks map, so Reserve hands the sender
//     the receiver's own slot and the sender reduces straight into it; the
//     receiver reduces straight out of it; head and tail are counters in
//     the segment (on separate cache lines), waited on by spinning, then
//     yielding, then a futex;
//   - TCP: the slots are the sender's staging buffers (Post writes them to
//     the sockets, striped) and the receiver's landing buffers (a reader
//     fills them from the sockets);
//   - RDMA verbs (package verbs): slots are registered memory; Post is
//     an RDMA write into the slot the receiver cleared, then a write with
//     immediate of a header carrying the tag (the immediate has only 32
//     bits: it carries the sequence); the receiver's Release returns
//     credit through the sender's clear-to-send FIFO;
//   - GPU memory: operations on device memory use their own connections
//     (channels from DeviceChannels on), whose slots a GPU's kernels
//     reach (Caps.DeviceSlots): device memory in process (package mem),
//     the receiver's device memory mapped through CUDA IPC between
//     processes (package shm, where both ends can; else its segments
//     registered with the GPU, memory.Mapped), TCP staging registered with
//     the GPU, and GPU memory an RDMA NIC writes (GPUDirect). Reductions on
//     them run as device kernels, and the engine never dereferences
//     device memory from the host.
//
// Every Post carries a Tag that the receiver checks, so a confused peer is
// an error, never silently wrong data.
//
// # Lifecycle
//
// An Endpoint is one rank's attachment (like NCCL's ncclTransport:
// canConnect, setup, connect, free). Connect is lazy and per (peer,
// channel): a ring needs two peers, a tree three, all-to-all all of them.
// Close(nil) is graceful, Close(cause) aborts, and an abort reaches the
// peers as a *PeerError wrapping a *PeerAbortedError that names the rank.
//
// The transports between processes (tcp, shm, verbs) set their
// connections up the same way, through internal/connsetup: the lower
// rank of a pair dials, both prove they know the job's secret, the
// dialer's ConnSetup (covered by the proof) says which ranks and channel
// the connection joins, and the acceptor checks and acknowledges it
// before each transport does its own part (TLS, handing over a segment,
// trading queue pairs). The package transporttest holds the contract
// every transport passes.
//
// # Progress
//
// Waits live in the transports. A transport whose sends move only while
// a channel's goroutine moves them (TCP) is a Progresser; the ones that
// wait on their own media (shared memory, RDMA) take the progress of the
// communicator's Progressers (ProgressOf) and call it while they wait,
// so that one channel may mix transports.
//
// # Direct paths
//
// Two optional interfaces let a transport skip a copy where its medium
// allows it (NCCL's "direct" primitives): DirectSender sends straight
// from the user's buffer (TCP writes it to the socket), DirectReceiver
// lands a slice straight in the user's output (TCP reads into it), and
// Flusher tells the engine when the user's buffers are free again. The
// engine tests for them per connection. The shared-memory transport's
// sender already writes into the receiver's slot; its direct paths are
// the receiver's single copy out of the sender's memory (PeerCopier),
// which the engine uses only where the receiver lands the slice, and
// which is on only where this host's kernel copies fast enough, and, on
// two ranks, blocks larger than a slot sent that way (BlockCopier), which
// the receiver lands or reduces from a scratch buffer, where it measured
// them to pay.
//
// # Boards
//
// An endpoint whose ranks all share memory may also offer a Board
// (BoardHolder): a small region every rank reads and writes, where an
// all-reduce of a few bytes is one post per rank and a read of the
// others' posts, not n-1 messages on n-1 connections (Open MPI's coll/sm
// does the same). Shared memory has one (transport/shm's JoinBoard); RDMA
// could offer one as a registered region that every rank writes into
// with RDMA writes.
package transport
