// Package ibemu is an emulated reliable-connected verbs device, for
// tests: behind the ibv seam, as the cgo layer is, it moves real bytes
// between real processes, and it is harder on a protocol than hardware
// is wherever hardware is allowed to be. It is a test device: goccl never
// reports, logs or documents it as RDMA hardware (its devices say
// Emulated, and are named "emu0").
//
// # How it moves bytes
//
// Every open device is an emulated NIC with a Unix socket in a fabric
// directory (Options.Dir; all NICs that share the directory share the
// fabric, across network namespaces too). Memory regions must come from
// ibv.Alloc (memfd-backed), or be a dma-buf descriptor that can be mapped
// (RegDeviceMR: the emulated GPU's exported allocations are memfds, so
// GPUDirect's registration path runs here as on hardware); a NIC publishes its regions in a table in
// shared memory, and each queue pair's receive queue and inbound
// completions in a segment of its own. A peer asks the NIC's socket once
// for the descriptors of a QP's segment, the region table and each
// region's memory, and maps them. From then on a send queue is executed
// by the requester's process, as a NIC's requester engine would: it
// checks keys, bounds and access against the peer's table, copies the
// payload straight into the peer's mapped memory, takes a posted receive
// from the peer's receive queue for a write with immediate, and appends
// the completion to the peer's inbound ring, which the peer's CQ polls.
// Execution runs inline in PostSend unless the QP must wait (RNR, an
// unreachable peer, a deferral chosen by the seed), then on a timer, in
// order: a send queue is one queue.
//
// # How it is stricter than hardware
//
//   - Order holds only within a QP. With Options.Adversarial, requests are
//     deferred at random (seeded), so QPs overtake each other, and a
//     message's bytes are placed in a random order of chunks: a protocol
//     that polls on data instead of completions reads torn messages.
//   - A deferred request reads its source when it runs, not when it was
//     posted: a sender that reuses a buffer before its completion sends
//     the new bytes.
//   - A write with immediate consumes a posted receive. None posted: RNR
//     NAK, retried every min_rnr_timer, rnr_retry times (7: forever),
//     then RNR_RETRY_EXC_ERR.
//   - Keys, bounds and access are checked on both sides (LOC_PROT_ERR,
//     REM_ACCESS_ERR; an RDMA READ needs remote read on the peer's region
//     and local write on its own); an error moves the QP to ERR, and every request
//     still queued, and every receive posted, completes with
//     WR_FLUSH_ERR. The responder's QP goes to ERR on a remote access
//     error too, with an async event.
//   - The QP state machine checks each transition's attribute mask
//     (required and allowed attributes, IB spec table 91), the port, the
//     path MTU against the port's, the address vector (RoCE needs a GRH
//     and a non-empty source GID; InfiniBand ports, Options.InfiniBand,
//     take a unicast LID without one).
//   - Unsignaled requests keep their send-queue slots until a later
//     signaled completion of the QP is polled (as mlx5 retires them):
//     PostSend fails with ENOMEM when the queue is full, so a protocol
//     that never signals stalls at once, not after hours.
//   - A CQ holding more completions than its size is overrun: Poll fails,
//     its QPs go to ERR, an async CQ_ERR event is raised.
//   - A peer that cannot be reached (wrong GID, wrong QPN, mismatched
//     PSNs, a path MTU larger than the peer's, a dead process) gives
//     RETRY_EXC_ERR after the transport timeout (4.096 µs × 2^timeout ×
//     (retry_cnt+1)), scaled by Options.TimeScale.
//
// # What it does not emulate
//
// Atomics, registration of GPU memory by address (no peer-memory client:
// RegDeviceMR without a descriptor fails with ErrNotSupported, as
// without nvidia-peermem), shared receive queues, UD, multicast, inline
// data limits, memory windows, and the wire itself: placement is a
// memory copy, as the shared-memory transport's is.
package ibemu
