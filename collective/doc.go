// Package collective is goccl's public API: communicators and the
// collective operations on them, in the model of NCCL, Gloo and MPI.
//
// A communicator is a fixed group of Size() ranks, usually one per process
// and GPU. Each rank holds a *Comm and calls the same collectives, with the
// same counts, in the same order; goccl moves and reduces the data through
// the fastest transport it has and returns when this rank's part is done.
//
//	comms, err := collective.NewLocalGroup(4) // 4 ranks in this process
//	...
//	// on each rank's goroutine:
//	err := collective.AllReduce(ctx, comms[r], grads, grads, collective.Sum)
//
// Ranks in separate processes or hosts join with Init (given a UniqueID
// one rank made with NewUniqueID) or InitFromEnv (under goccl-run,
// torchrun, mpirun, srun or a Kubernetes Job); they talk over TCP, and
// every connection proves knowledge of the job's 128-bit secret before any
// other byte is trusted.
//
// # Obligations of callers
//
//  1. Every rank issues the same collectives in the same order, each with
//     the same element type, count, reduction operator and root. Ranks that
//     disagree fail with an error wrapping ErrMismatch, or with the
//     operation's timeout, never with silently wrong data.
//  2. Collectives on one communicator run one at a time in the order they
//     were issued on that rank, blocking or not. Start* forms return at
//     once; the operation's buffers belong to goccl until its
//     Request.Wait returns: do not read its output or change its input
//     before.
//  3. Send and Recv match per pair of ranks in issue order and must agree
//     on the length and type (on host memory a send of no elements is a
//     message too).
//     On host memory each peer and direction is a lane of its own, beside
//     the collectives and the other lanes, as MPI's Isend and Irecv: any
//     set of matched StartSend and StartRecv calls completes whatever
//     order each rank starts them in. AllToAllv, Gather and Scatter are
//     built on them; Group issues several together, in the style of
//     NCCL's ncclGroupStart and ncclGroupEnd. Device sends and receives
//     keep their stream's order.
//  4. Each Comm belongs to one rank: in NewLocalGroup, drive each Comm from
//     its own goroutine, as each rank of a real job is its own process.
//  5. Close every Comm. Close waits for pending operations; to stop them
//     instead, Abort first.
//
// # Failures
//
// Bad arguments (mismatched lengths, a root or peer out of range, a send
// to self, overlapping buffers, a closed or nil communicator) return an
// *ArgError before any data moves; the communicator stays usable. Ranks
// that disagree about an operation's collective, type, operator, count or
// root are caught by a signature every slice (and every post to a host's
// shared board) carries (ErrMismatch), at the first slice a rank receives
// from a disagreeing peer: in the operation
// itself, or, when the disagreement leaves nobody receiving (every rank a
// broadcast root), in the next one. The signature encodes the collective,
// type, operator, algorithm and channels, so the error names what both
// ranks called. Once an
// operation has started, any failure (its context cancelled, the timeout,
// a peer that aborted or died, disagreeing ranks) returns an *OpError that
// names this rank, the operation and its sequence number, and the peer it
// was waiting for; it also aborts the communicator, which makes the
// peers' dependent operations fail promptly instead of hanging. Every
// operation is bounded by Config.Timeout (default 10 minutes) as well as
// its context. When an operation times out on a communicator made by Init
// or InitFromEnv, the root compares where every rank waits and every rank
// fails with a StallError naming the rank at the end of the chain of
// waits (one that has not called the operation, did not answer, or left)
// and how this rank's wait leads there. The ranks of a NewLocalGroup,
// which have no root, compare their waits directly and fail the same way;
// without either (a root that does not answer), the timeout says per
// channel the step and the peer it was at.
//
// # Surviving a failure
//
// After Init the root keeps every rank's connection as a failure
// detector: a rank that aborts, or whose process dies, is reported to
// every other rank within milliseconds, even to ranks that are idle, whose
// Context ends with the cause. A rank whose process is alive but does not
// run (stopped, deadlocked, swapping) keeps its sockets open, so nothing
// breaks; the root's heartbeat finds it: a rank that leaves the root's
// pings unanswered for Config.HeartbeatTimeout (10 s;
// GOCCL_HEARTBEAT_TIMEOUT) is reported to every other rank as not
// responding (UnresponsiveError, which says how the rank's wait led
// there), and the ranks report a silent root the
// same way (under InitFromEnv, rank 0's process). The library answers from
// a goroutine of its own, so a rank busy computing between collectives is
// never reported. The survivors can then call Shrink, which
// makes a new communicator of the ranks still there (the root's process
// must be one of them), numbered in their old order; under goccl-run,
// -keep-going leaves them running when a rank dies.
//
// # Sub-communicators
//
// Comm.Split makes communicators of subsets of the ranks (data-parallel
// and tensor-parallel groups, say), each a full communicator with a
// watch of its own; what the child needs is traded over the parent's
// connections, and a failure in one does not abort the others.
// Package collectivetest runs a function on N ranks, in process or in N
// processes, for the tests of code built on goccl.
//
// # Diagnostics
//
// Each communicator keeps a flight recorder of its last 256 operations
// (package flight): Comm.DebugDump writes it as JSON, and with
// Config.DebugDump (GOCCL_DEBUG_DUMP) set to a directory every rank writes
// it there when its communicator aborts or times out, and on SIGUSR1.
// flight.Analyze (goccl-run does it for a failed job) names the first
// operation where the ranks called different collectives, or the rank
// that never arrived, and follows the chain of waits to a rank that left
// no recorder (a stopped process). GOCCL_DEBUG=INFO logs a summary of each new
// communicator on stderr (log/slog), TRACE a line per operation;
// GOCCL_DEBUG_SUBSYS picks INIT, COLL or NET.
//
// # Across hosts
//
// Ranks with the same host identity (GOCCL_HOSTID, else the hostname and
// boot id) share a host. The schedules follow the hosts, not the rank
// numbers, so the launcher's numbering (block, round robin, any order)
// does not change which links carry the data: rings run host by host
// (each host's ranks in a row, so a ring over h hosts crosses h host
// boundaries), the tree is a chain through each host's ranks with a double
// binary tree of hosts joining their lowest ranks (NCCL's pattern), and
// recursive doubling and Rabenseifner pair neighbours in the host ring
// first (ranks of one host, where hosts have an even number of ranks).
// The INFO summary prints the ring order, hosts separated by "|".
// Hosts that are namespaces or containers of one machine (one kernel boot
// id) are still counted together for its CPUs: where their ranks
// outnumber its cores, waiting ranks give their core away at every poll.
//
// When every host has the same number of ranks, the all-reduce may be
// hierarchical (GOCCL_ALGO=hier, or the tuner's pick for large sizes): a
// reduce-scatter inside each host over shared memory, an all-reduce of
// each shard across hosts, an all-gather inside each host; the network
// then carries 2(h-1)/h of the data per host where a flat ring carries
// 2(n-1)/n. Reduce-scatter and all-gather have a hierarchical form too
// (the same GOCCL_ALGO=hier, or the tuner's pick at every size on such
// hosts): each host's link carries (h-1)/h of the data where a ring's
// carries (n-1)/n, the blocks going around m rings host by host at once,
// each entering the hosts at another local rank, so that all of a host's
// ranks cross together. Broadcast and reduce need none: their chain
// along the host ring already crosses each host boundary once. The INFO
// summary of a communicator across hosts prints the picks at 64 MiB.
//
// A GOCCL_SOCKET_IFNAME that matches several interfaces gives every TCP
// connection sockets on each of them (the INFO summary's "nics", with
// each one's speed where sysfs reports it), so its slices alternate over
// the rails; a socket that cannot reach a peer's other interface uses the
// peer's first. The tuner's model of TCP gives a connection's channels
// together no more bandwidth than the slowest NIC of the job's TCP ranks,
// where all of them report a speed; its model of RDMA, no more than the
// slowest port of the job's RDMA ranks (their active width and speed).
// The TCP data sockets do not pace: where the system's congestion
// control is BBR they use Reno (the INFO summary's "tcp_cc";
// GOCCL_TCP_CONGESTION chooses otherwise), since the connections'
// credits already bound what is in flight and BBR's timers cost the CPUs
// a collective needs (transport/tcp/congestion.go). In broadcasts and
// all-gathers, where it was measured to pay, the TCP sockets send large
// slices out of the caller's own pages instead of copying them
// (GOCCL_TCP_LEND; transport/tcp/lend_linux.go), and a sender's operation
// ends once its receivers have read them. A channel that has only sent
// small slices for several operations in a row, each soon after the last
// (a stream of reduces seen from a non-root rank, or of broadcasts from
// the root), gathers them and writes up to 16 in one system call; they
// go out at the rank's next wait, or within 50 µs when it makes no
// further call (GOCCL_TCP_GATHER_DISABLE; transport/tcp/gather.go).
//
// # Configuration
//
// Config, set with Options, has a zero value meaning defaults. The
// environment variables GOCCL_ALGO, GOCCL_NCHANNELS, GOCCL_MAX_NCHANNELS,
// GOCCL_CHUNK_SIZE, GOCCL_TIMEOUT, GOCCL_INIT_TIMEOUT, GOCCL_NSOCKS,
// GOCCL_TCP_WINDOW, GOCCL_TCP_CONGESTION, GOCCL_TCP_LEND, GOCCL_TCP_GATHER_DISABLE, GOCCL_SOCKET_IFNAME, GOCCL_HOSTID, GOCCL_SPIN, GOCCL_SHM_CMA, GOCCL_SHM_BLOCK, GOCCL_SHM_SPLIT_DISABLE, GOCCL_SLOT_STREAM_DISABLE, GOCCL_P2P_DISABLE, GOCCL_TRANSPORT,
// GOCCL_DEBUG, GOCCL_DEBUG_SUBSYS, GOCCL_DEBUG_DUMP and GOCCL_TLS_CERT,
// GOCCL_TLS_KEY, GOCCL_TLS_CA are read once, when a communicator is made;
// options override them; an invalid value is an error. The launchers'
// variables are read by InitFromEnv only.
//
// # Security
//
// Every connection first proves it knows the job's 128-bit secret (an
// HMAC challenge in each direction), so strangers are turned away before
// any byte of theirs is trusted. With Config.TLSCert, TLSKey and TLSCA
// (GOCCL_TLS_*), every TCP connection also runs mutual TLS 1.3: to the
// bootstrap root with crypto/tls, and between ranks with internal/tlsrec,
// which seals and opens TLS records inside the TCP transport's
// non-blocking loop. Shared memory is not encrypted: it never leaves the
// host, and its segments are reachable only through a Unix socket that
// performs the same secret handshake.
//
// # Device memory
//
// A communicator made WithDevice (a *cuda.Device from package cuda) also
// takes GPU buffers, as memory.Buffer values, in AllReduceDevice and the
// other Device forms. They follow NCCL's stream semantics:
//
//  1. The call returns once the operation is enqueued on the caller's
//     stream. The operation reads its input after the stream's earlier
//     work, and the stream's later work runs after the operation's output
//     is complete. The host does not wait.
//  2. Until the stream's work up to the call has completed, the buffers
//     belong to goccl.
//  3. Device operations run in issue order with every other operation of
//     the communicator. The returned Request completes when the operation
//     has ended on the host's side, and Wait returns its error. The stream
//     is released on failure too (its later work then sees an unspecified
//     output), and the communicator aborts as after any failure.
//  4. Where a device cannot make a stream wait on a flag in host memory
//     (no stream memory operations), the call blocks until the operation
//     has ended instead.
//  5. Bad arguments are an *ArgError before anything is enqueued.
//  6. Close waits, up to Config.Timeout, until every stream a device
//     operation was ordered on has passed it: the flag those streams
//     wait on is freed only then.
//
// Reductions on device memory are goccl's CUDA kernels (package
// cuda/ptx), with the host kernels' arithmetic bit for bit. Between ranks
// of one process the data moves device to device, through slots in the
// receiving rank's device memory. Between processes on one host each
// connection's data slots are in the receiver's device memory, which the
// sender maps through CUDA IPC (NCCL's P2P transport), so its kernels
// write straight into them; where the two processes cannot map each
// other's memory (GPUs without peer access), or with GOCCL_P2P_DISABLE=1,
// the shared-memory segments are registered with the GPU (pinned, mapped)
// and the kernels reduce into those. Across hosts TCP stages each slice
// in registered pinned memory, which the kernels fill and drain, and RDMA
// writes device memory directly where GPUDirect is allowed. Host slices
// keep working on a communicator with a device. With WithTopology, device
// operations that move GPU to GPU (a local group's, and those of a job on
// one host over CUDA IPC) are tuned by the ring NCCL's search finds over
// the ranks' GPUs, NVLink or PCI, in place of the transport's model.
//
// Every rank of one operation places its buffers alike: all in host
// memory or all in device memory (as NCCL, which takes device memory
// only). The two take different paths on connections of their own, and
// a mix is not caught before it runs: once the operation has waited a
// second, the watchdog has the ranks compare through the root where they
// wait (again after 2, 4, 8 s...), and every rank fails with a
// MisplacedError naming the host and the device ranks (ErrMismatch); the
// ranks of a NewLocalGroup compare directly. An operation small enough
// for shared memory's board fails at once, the host rank naming the
// device rank's operation as one it did not post there.
//
// # Memory the ranks of a host share
//
// MemAlloc (NCCL's ncclMemAlloc) returns host memory that the other ranks
// on this host can map: with such buffers, in operations of 64 KiB to 4
// MiB over shared memory, all-gathers and broadcasts send each slice by
// reference and the receiver copies it straight out of the sender's
// buffer into its own (one copy, where Go memory takes two, through the
// transport's slots), and reductions read a peer's input (and an
// out-of-place all-reduce its finished blocks) where they are. It
// works as ordinary memory for anything else; MemFree gives it back.
// goccl-perf -R 1 runs on it.
//
// Register (NCCL's ncclCommRegister) does the same for a buffer the
// caller already has, Go memory included: the whole pages inside it move
// into a memfd mapped at the same addresses, with their contents (mremap
// puts the new mapping in the old one's place in one step), and slices in
// those pages go as MemAlloc's do; the part-pages at either end go the
// ordinary way. Registering the same pages again is counted, not
// repeated. Deregister moves the pages back into private memory. Only
// private anonymous read-write memory is moved (a file's mapping would be
// cut off from its file), and nothing may write the buffer or run an
// operation on it while either runs. goccl-perf -R 2 runs on registered
// Go memory.
//
// # Arithmetic
//
// Integer Sum and Prod wrap around; Avg divides the sum by Size() (integers
// truncate toward zero, as NCCL). Float16, BFloat16 and the OCP float8
// types (Float8E4M3, saturating at ±448, and Float8E5M2) are reduced in
// float32 and rounded back after each step; float8 works on host memory
// only for now. Comm.PreMulSum makes NCCL's pre-multiplied sum: each
// rank's input times its own scalar, summed (host memory only). Min and Max propagate NaN. The
// reduction order depends on the algorithm, so floating-point results may
// differ in the last bits between algorithms, but never between ranks:
// every rank ends with the same bits.
package collective
