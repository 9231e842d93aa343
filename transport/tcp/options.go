package tcp

import (
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	"github.com/goccl/goccl/internal/device"
)

// Defaults.
const (
	DefaultNSocks   = 4
	DefaultSlots    = 8
	DefaultSlotSize = 512 << 10
	DefaultSpinFor  = time.Millisecond
	// MinSlice is the smallest slice worth sending over TCP (the TCP link
	// model's MinSliceBytes, in collective): each slice costs a writev on
	// one end and a read on the other, with their wake-ups, a few µs
	// whatever its size. With the engine's 16 KiB floor, a 2-rank all-gather of 64 KiB
	// sent each rank's 32 KiB block as two slices and took 12.8 µs over
	// loopback; as one, 9.2 (docs/performance.md, "TCP: slices of at
	// least 32 KiB"). 64 KiB was worse where both directions carry data
	// (a 64 KiB slice and its header are more than loopback's 64 KiB MTU).
	MinSlice = 32 << 10
	// setupTimeout bounds how long a socket may take to authenticate and
	// identify itself.
	setupTimeout = 10 * time.Second
)

// LendMode is Options.Lend.
type LendMode int

const (
	// LendAuto lends in the operations where it was measured to pay:
	// broadcasts of less than 32 MiB on 2 ranks, broadcasts and
	// all-gathers of at least 16 MiB on more (conn.LendFor).
	LendAuto LendMode = iota
	// LendOn lends every counted slice sent from the caller's memory.
	LendOn
	// LendOff copies every slice into the socket.
	LendOff
)

// Options configures an endpoint.
type Options struct {
	Rank, NRanks int
	// Peers holds every rank's data address (host:port), by rank.
	Peers  []string
	Secret []byte
	// Listener is this rank's data listener, already listening on the
	// address published as Peers[Rank]. The endpoint owns it from New on.
	Listener net.Listener
	// Listeners, for a rank that listens on several network interfaces,
	// are its listeners on the others, in the order published as
	// PeerNICs[Rank]; the endpoint owns them too.
	Listeners []net.Listener
	// PeerNICs, if set, lists each rank's data addresses on its other
	// interfaces (nil or empty: one interface). Socket i of a connection
	// goes to the peer's address i mod (1+len(PeerNICs[peer])), counting
	// Peers[peer] as address 0, so the connection's slices, which go to
	// its sockets in turn, spread evenly over the peer's NICs (and over
	// this rank's, where the routes pair them, as one subnet per rail
	// does).
	PeerNICs [][]string
	NSocks   int           // sockets per connection; 0 means DefaultNSocks
	Slots    int           // staging slots per connection; 0 means DefaultSlots
	SlotSize int           // bytes per slot; 0 means DefaultSlotSize
	SpinFor  time.Duration // polling before parking; 0 means DefaultSpinFor, <0 never polls
	// Window is how many large slices (over creditMin bytes) a connection
	// sends ahead of what its receiver has read, counted by the credits
	// the receiver sends back on a control socket of the connection: 0
	// means Slots, below 0 no credits (TCP's own flow control alone).
	// It is at least Slots/2 + 1, the capacity the engine's schedules
	// need of a link. Every rank must agree on whether credits are used.
	Window int
	// Lend says which large slices from the caller's memory (PostFrom,
	// over creditMin bytes) go out of the caller's own pages, by
	// vmsplice(2) and splice(2) through a pipe per socket, instead of
	// being copied into the socket (Linux, without TLS, with credits;
	// elsewhere none): LendAuto, those of the operations where it pays
	// (conn.LendFor); LendOn, all; LendOff, none. A lent slice's
	// receiver credits it as soon as it has read it, and the sender's
	// Flush waits for the credit of the last slice lent, since the
	// kernel reads the pages until then. Ranks may differ.
	Lend LendMode
	// NoGather writes every small slice of a one-way stream at once, in a
	// system call of its own; by default a channel that has only sent
	// small slices for several operations in a row, each soon after the
	// last, gathers them and writes several in one call (gather.go).
	NoGather bool
	// Congestion chooses the TCP congestion control of the data sockets
	// ("": Reno where the system's would be BBR, which paces, and the
	// system's otherwise; CongestionSystem: the system's; a name: that
	// one on every socket, an error where the kernel refuses it). The
	// endpoint applies it to the sockets it dials; those it accepts have
	// their listener's, so make Listener and Listeners with Listen and
	// the same setting.
	Congestion string
	// YieldWhenIdle gives the CPU away after every failed poll (else
	// after every 16th), for hosts with more ranks than cores (Open MPI's
	// mpi_yield_when_idle): the rank being waited for may need this very
	// core. SpinFor is still checked every 16th poll, so on a busy host
	// the polling may outlast it by up to 16 yields.
	YieldWhenIdle bool
	Logger        *slog.Logger
	// TLS, when set, protects every socket with TLS 1.3 after goccl's own
	// handshake: both ends present certificates, checked as TLS says
	// (tlsrec.LoadConfig makes one that trusts a job's CA).
	TLS *tls.Config
	// Device, if set, is this rank's GPU: the connections of device
	// operations (channels from transport.DeviceChannels on) stage their
	// slices in pinned host memory registered with it, so that its
	// kernels write what goes out and read what came in there directly
	// (memory.Mapped). Nil: the endpoint carries host operations only.
	Device device.Registrar
	// ListenersUp: every peer's listener is up before this endpoint is
	// made (as the bootstrap guarantees), so a refused connection means
	// the peer has closed and Connect fails at once (connsetup.Dialer).
	ListenersUp bool
}
