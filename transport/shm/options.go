package shm

import (
	"log/slog"
	"net"
	"time"

	"github.com/goccl/goccl/internal/device"
)

// Defaults.
const (
	// DefaultSlots is NCCL's NCCL_STEPS (src/include/device.h): a sender
	// may run up to eight slices ahead of its receiver.
	DefaultSlots = 8
	// DefaultSlotSize keeps a connection's ring (8 slots each way) within
	// a core's 2 MiB L2 cache, as transport/mem's default does. It was
	// chosen when slices passed from core to core through the caches;
	// with the engine writing them around the caches (doc.go,
	// "Messages"), 64, 256 and 512 KiB measured no better
	// (docs/performance.md, "Streaming stores into the slots").
	DefaultSlotSize = 128 << 10
	DefaultSpinFor  = time.Millisecond
	// setupTimeout bounds how long a connection may take to authenticate
	// and hand over its segment.
	setupTimeout = 10 * time.Second
	// sleepSlice is the longest a waiter sleeps on its futex before it
	// checks for a dead peer, its context and aborts that come without a
	// wake-up.
	sleepSlice = 2 * time.Millisecond
)

// CMAMode is Options.CMA.
type CMAMode int

// The values of Options.CMA.
const (
	CMAAuto CMAMode = iota
	CMAOn
	CMAOff
)

// Options configures an endpoint.
type Options struct {
	Rank, NRanks int
	// Peers holds, by rank, the address of each peer's shared-memory
	// listener (see Listen); "" for peers this rank does not reach over
	// shared memory.
	Peers  []string
	Secret []byte
	// AllowUIDs lists the users, besides this process's own (its
	// effective uid), whose processes may exchange segments with this
	// rank. Every connection's other end is checked (SO_PEERCRED): an
	// incoming one before anything is read from it, and it is closed at
	// once if refused; an outgoing one before a descriptor is sent on it.
	// Empty: this process's user only. Values must be uids (0 to 2³²-2).
	AllowUIDs []int
	// Listener is this rank's listener, made by Listen, whose address the
	// peers know. The endpoint owns it from New on.
	Listener *net.UnixListener
	Slots    int           // slots per ring; 0 means DefaultSlots
	SlotSize int           // bytes per slot; 0 means DefaultSlotSize
	SpinFor  time.Duration // polling before sleeping; 0 means DefaultSpinFor, <0 never polls
	// YieldWhenIdle gives the CPU away after every failed poll, for hosts
	// with more ranks than cores (Open MPI's mpi_yield_when_idle): the
	// rank being waited for may need this very core.
	YieldWhenIdle bool
	Logger        *slog.Logger
	// Progress, if set, is called by a channel's goroutine while it waits
	// on a connection of channel ch, to move what other transports have
	// queued to send on that channel (a TCP connection of the same
	// channel, in a communicator that mixes transports); while it reports
	// sends pending, the wait polls instead of sleeping.
	Progress func(ch int) (pending bool, err error)
	// Device, if set, is this rank's GPU: the segments of the connections
	// for device operations (channels from transport.DeviceChannels on)
	// are registered with it, so that its kernels reduce and copy
	// straight into their slots (memory.Mapped; NCCL's SHM transport
	// keeps GPU traffic in pinned host memory the same way). Nil: the
	// endpoint carries host operations only.
	Device device.Registrar
	// NoDeviceIPC keeps the device connections' slots in the registered
	// segments even where the device exports its memory to other
	// processes (device.IPCExporter), which otherwise puts them in the
	// receiver's device memory (ipc_linux.go; GOCCL_P2P_DISABLE).
	NoDeviceIPC bool
	// CMAMin and CMAMax bound the operations, in bytes, whose slices a
	// receiver that only lands them (broadcast, all-gather) copies
	// straight out of the sender's memory (process_vm_readv: one copy
	// where slots take two; cma_linux.go). 0 means DefaultCMAMin and
	// DefaultCMAMax (CMAMax 0: no upper bound); CMAMin < 0 turns it off.
	// Where the kernel refuses it (another user, ptrace_scope, seccomp),
	// slices go through slots as ever.
	CMAMin, CMAMax int64
	// BlockSize is the slice size of a 2-rank broadcast's, all-gather's,
	// reduce's or reduce-scatter's step whose slices go by the receiver's
	// copy (transport.BlockCopier): one process_vm_readv per block instead
	// of one per slot. 0 means DefaultBlockSize; a size no larger than a
	// slot keeps slot-sized slices; at most MaxBlockSize.
	BlockSize int
	// BlockMax bounds the reductions (reduce, reduce-scatter), in bytes,
	// whose steps go in blocks: 0 means DefaultBlockMax, < 0 no bound.
	// Above it the slots carry them, as the receiver's choice would only
	// explore. Broadcasts and all-gathers have no bound.
	BlockMax int64
	// CMA says whether receivers offer the single copy at all: CMAAuto
	// (the default) where it pays (slot-sized slices where this host's
	// kernel copies fast enough, measured once per process; blocks where
	// the receiving side measured them faster than the slots, as the
	// operations run: blocks_linux.go), CMAOn or CMAOff regardless.
	CMA CMAMode
	// NoSplit keeps a block's copy on its receiver's core: by default a
	// receiver asks its sender, idle in the meantime, to write the
	// block's second half into the output while it reads the first
	// (split_linux.go).
	NoSplit bool
	// NoStreamSlots has the engine write outgoing slots with plain
	// stores: by default it writes them with streaming stores
	// (transport.FarSlots), since the peer's core reads them next.
	NoStreamSlots bool
	// SharedMax bounds the operations, in bytes, whose slices go by
	// reference where the sender's buffers are shared allocations
	// (memory.AllocShared; shared_linux.go), from CMAMin on: 0 means
	// DefaultSharedMax, < 0 no bound. Above it the receiver's one copy
	// from the sender's memory, out of cache, is slower than the slots'
	// two copies, which the two ranks' cores make side by side; on a host
	// with more ranks than cores, where no core is spare, collective
	// lifts the bound. Both ends of a connection must have the same.
	SharedMax int64
	// ListenersUp: every peer's listener is up before this endpoint is
	// made (as the bootstrap guarantees), so a refused connection means
	// the peer has closed and Connect fails at once (connsetup.Dialer).
	ListenersUp bool
	// Board, if set on rank 0, is the board this endpoint uses (made by
	// OfferBoard before the ranks knew which of them would be rank 0; a
	// split's child): the others open it where BoardAt says, and none is
	// handed over. The endpoint owns it from a successful New on.
	Board *BoardOffer
	// BoardAt, if its PID is set on a rank other than 0, is where rank 0's
	// Board is (its BoardOffer.Ref, passed on by the caller).
	BoardAt BoardRef
}

// BoardRef says where an offered board is: the offering process, its
// descriptor and the offer's nonce (OfferBoard).
type BoardRef struct {
	PID, FD int
	Nonce   [16]byte
}

// MaxBlockSize is the largest Options.BlockSize: a block travels as one
// slice, whose length the descriptor's size field holds below its flags.
const MaxBlockSize = 256 << 20
