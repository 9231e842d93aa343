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
//   - RDMA verbs: slots are registered memory; Post is an RDMA write with
//     immediate into the receiver's slot, the immediate carrying the tag;
//     the receiver's Release returns credit;
//   - GPU memory: slots are memory.Buffer values of kind Device (CUDA IPC
//     or GPUDirect), and reductions on them run as device kernels; the
//     engine never dereferences them from the host.
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
// # Direct paths (planned)
//
// Two optional interfaces will let transports skip the slot copy where the
// medium allows it: a sender that transmits straight from the user's
// buffer (TCP sendmsg, RDMA write from registered user memory), and a
// receiver that lands data straight in the user's output when no reduction
// is needed (NCCL's "direct" primitives). The engine will test for them
// per connection; a transport that offers neither still works unchanged.
package transport
