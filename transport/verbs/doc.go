// Package verbs is goccl's RDMA transport: reliable-connected queue pairs
// over InfiniBand or RoCE, the NIC writing each slice straight into the
// receiver's memory, the CPU out of the data path.
//
// # Connections
//
// A connection (one peer, one channel) is a control socket and 1 to 16
// queue pairs (Options.QPs, NCCL_IB_QPS_PER_CONNECTION). The lower rank
// dials the peer's control listener; the socket is authenticated with
// the job's secret (package handshake) before anything on it is trusted,
// and its first frame (ConnSetup) is covered by the proof. Over it the
// two ends trade wire.VerbsInfo: LID, GID, the QP numbers, the first PSN,
// and the address and key of the memory the peer writes into. The
// acceptor builds its end in its setup goroutine, so that a dialer never
// waits on the order in which the acceptor's channels happen to connect.
// Both ends then move every QP INIT → RTR → RTS with NCCL's attributes
// (src/transport/net_ib: timeout 20, retry_cnt 7, rnr_retry 7,
// min_rnr_timer 12, max_rd_atomic 1, path MTU the smaller of the two
// ports'), post their receives, and trade a ready byte, so that no write
// arrives before a receive is posted.
//
// The socket stays open: it carries a graceful close's notice and an
// abort's reason, and it breaks when the peer's process dies, which names
// the dead rank at once. The NIC would notice too, but only after its
// retries (4.3 s × 8 with NCCL's defaults) and only when this side sends.
//
// # Data
//
// Both directions of a connection have Slots slots; message s uses slot
// s mod Slots and QP s mod QPs (see datapath.go):
//
//   - the receiver clears messages to be sent, writing one 16-byte entry
//     per message into the sender's clear-to-send FIFO (where the payload
//     may land, its key, its room: NCCL's CTS FIFO) and telling the
//     sender with a write with immediate;
//   - the sender posts one chain per message, in one call: an RDMA write
//     of the payload where the entry says (none for 32 bytes or less) and
//     a write with immediate of the 64-byte header (the engine's tag, the
//     size, the sequence, whether the payload is inline; a small payload
//     inline) into the receiver's header entry. The immediate has 32
//     bits: the tag travels in the header, the immediate carries the
//     sequence;
//   - the receiver acts on completions only, never on the data (the IB
//     specification orders placement only at completion), and on Release
//     frees the slot. Clearances are cumulative and held back while the
//     sender has room, since one per message would cost a request per
//     message.
//
// Requests are signaled once every Slots on a QP and completions polled
// 32 at a time; a staging slot is reused only once the request that read
// it has completed (a zero-length signaled write fences the QP where
// nothing signaled follows it). Registered memory is never Go heap: a
// connection's memory comes from ibv.Alloc (a memfd mapping), in two
// regions, the one peers may write and the staging they may not.
//
// # Failures
//
// A failed completion fails the connection with the verbs status and what
// it usually means (RETRY_EXC_ERR: the peer's NIC did not answer; a wrong
// GID index or a lossy RoCE fabric?), naming the peer; a fatal
// asynchronous event (a QP or CQ error, a port going down) fails the
// connections it touches; the control socket names a peer that aborted or
// died. The engine passes each on to the other ranks as it does for every
// transport.
//
// # The device
//
// The transport reaches its device through package ibv's seam. Two
// providers sit behind it: libibverbs (ibv.OpenLibrary, built with
// -tags verbs) and transport/verbs/ibemu, an emulated RC device for tests
// that moves bytes between processes through shared memory and is
// stricter than hardware; it is selected with GOCCL_IB_EMULATE=1 and is
// never reported as RDMA hardware (its port says so wherever it is shown).
//
// Why a build tag and dlopen: the cgo layer needs rdma-core's headers to
// build (the post and poll calls are inline functions of verbs.h, reached
// through small C wrappers), and a default go build ./... must work on a
// machine without them, so the layer is behind -tags verbs. Within it,
// libibverbs.so.1 is loaded with dlopen at run time, as NCCL's ibvwrap
// does, rather than linked: one binary runs on every machine, and where
// there is no RDMA it says why (no libibverbs, no device, no active port)
// instead of failing to start.
//
// # Settings
//
// GOCCL_TRANSPORT=verbs forces RDMA for every pair (Init fails, naming
// the pair and the reason, where a pair cannot use it); with auto, pairs
// on different hosts use RDMA when both ends have a usable port, TCP
// otherwise. GOCCL_IB_HCA chooses devices and ports in NCCL_IB_HCA's
// syntax (ParseHCA), GOCCL_IB_GID_INDEX a GID table entry, GOCCL_IB_TC and
// GOCCL_IB_SL the traffic class and service level,
// GOCCL_IB_QPS_PER_CONNECTION the striping, GOCCL_IB_TIMEOUT and
// GOCCL_IB_RETRY_CNT the NIC's retries; docs/rdma.md says what each does
// and what to check when a job fails.
//
// # Device operations
//
// With Options.Device, the connections of device operations (channels
// from transport.DeviceChannels on) give the engine slots the GPU
// reaches. Where Options.GDR allows it (the caller's topology rule,
// NCCL_NET_GDR_LEVEL's) and a probe at New can register GPU memory with
// the NIC (a dma-buf, else by address under nvidia-peermem), the payload
// slots and staging are device memory and the NIC moves them GPU to GPU
// (GPUDirect RDMA); below compute capability 9.0 a 1-byte RDMA read
// through a queue pair connected to itself flushes each slot that
// arrived before the engine reads it. Otherwise the host allocation is
// registered with the GPU and kernels reduce into it. Headers and the
// FIFO stay in host memory either way, and device connections inline
// nothing. gdr.go has the details; DevicePath says what was chosen.
//
// # Not yet
//
// Receives straight into registered user buffers, several NICs per rank,
// and slot shapes per connection (every connection of a communicator has
// the same Slots and SlotSize).
package verbs
