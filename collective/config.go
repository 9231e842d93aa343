package collective

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/shm"
	"github.com/goccl/goccl/transport/tcp"
)

// Defaults.
const (
	// DefaultTimeout bounds every operation unless its context ends first:
	// 10 minutes, torch's default for its NCCL process groups.
	DefaultTimeout = 10 * time.Minute
	// DefaultSpin is how long waits poll before they sleep.
	DefaultSpin = time.Millisecond
	// DefaultInitTimeout bounds the bootstrap of Init and InitFromEnv.
	DefaultInitTimeout = 2 * time.Minute
	// DefaultHeartbeatTimeout is how long a rank may not answer the
	// root's heartbeat before the others are told it stopped responding.
	DefaultHeartbeatTimeout = 10 * time.Second
	// DefaultMaxChannels is the most channels the tuner uses.
	DefaultMaxChannels = 2
	// MaxChannels is the most channels a communicator can be given.
	MaxChannels = transport.P2PChannel // point-to-point takes the channels after them
)

// Config holds a communicator's settings. The zero value means defaults.
// Every rank of a communicator must use the same Config (except Timeout),
// because each derives its plans from it independently.
type Config struct {
	// Algorithm forces the all-reduce algorithm (algorithms.Ring, Tree,
	// RecDoubling, Rabenseifner, OneShot, Hier or HierTree);
	// algorithms.AlgoAuto lets the tuner choose. Reduce-scatter,
	// all-gather and reduce follow it where they implement it (Ring,
	// OneShot, Hier; all-gather also RecDoubling; reduce Ring and
	// OneShot) and choose for themselves otherwise; the other collectives
	// have one algorithm each and ignore it.
	Algorithm algorithms.Algorithm
	// Channels forces the number of channels (parallel slices of the
	// buffer, each with its own connections), 1..MaxChannels; 0 lets the
	// tuner choose up to MaxChannels.
	Channels int
	// MaxChannels bounds the tuner's choice; 0 means DefaultMaxChannels.
	MaxChannels int
	// ChunkSize forces the pipelining block size in bytes (at least 1 KiB);
	// 0 lets the link model decide.
	ChunkSize int64
	// Timeout bounds each operation; 0 means DefaultTimeout. An operation
	// that runs out fails, and the communicator is aborted.
	Timeout time.Duration
	// Slots and SlotSize shape the transports' connections (2..64 slots of
	// 4 KiB..64 MiB); 0 means the transport's defaults. Every rank must use
	// the same values.
	Slots    int
	SlotSize int
	// InitTimeout bounds Init and InitFromEnv when their context has no
	// deadline; 0 means DefaultInitTimeout.
	InitTimeout time.Duration
	// HeartbeatTimeout is how long a rank of a communicator made by Init
	// or InitFromEnv may leave the bootstrap root's heartbeat unanswered
	// before every other rank's communicator aborts naming it as not
	// responding (its process stopped, deadlocked or swapping: a rank
	// busy computing still answers, from a goroutine of the library's);
	// the ranks watch the root the same way. 0 means
	// DefaultHeartbeatTimeout, negative turns the heartbeat off
	// (GOCCL_HEARTBEAT_TIMEOUT; "0" there turns it off). Every rank and
	// the root's process should agree.
	HeartbeatTimeout time.Duration
	// NSocks is the number of TCP sockets per connection between two
	// ranks (1..64); 0 means the transport's default. Every rank must use
	// the same value.
	NSocks int
	// TCPWindow is how many large slices (over 64 KiB) a TCP connection
	// sends ahead of what its receiver has read, paced by credits the
	// receiver sends back on a control socket of the connection; 0 means
	// the connection's slot count, negative turns the credits off (TCP's
	// own flow control alone). It must be at least half the slots and one
	// more. Every rank must agree on whether credits are used.
	TCPWindow int
	// TCPCongestion chooses the congestion control of the TCP data
	// sockets (GOCCL_TCP_CONGESTION): empty, Reno where the system's
	// would be BBR (its pacing timers cost the CPU a collective needs,
	// and the connections' credits already bound what is in flight), the
	// system's otherwise; "system", the system's everywhere; a name
	// ("cubic", "bbr", "dctcp"), that one on every data socket, the
	// kernel refusing it (not built, or not in
	// net.ipv4.tcp_allowed_congestion_control for a process without
	// CAP_NET_ADMIN) an error at Init. Linux only.
	TCPCongestion string
	// TCPLend says whether large slices sent from the caller's buffers go
	// out of its own pages (vmsplice and splice through a pipe, Linux
	// only, not with TLS) instead of being copied into the sockets
	// (GOCCL_TCP_LEND): "auto" (or "") in broadcasts of less than 32 MiB
	// on 2 ranks and in broadcasts and all-gathers of at least 16 MiB on
	// more, where it was measured to pay; "on" in every operation,
	// point-to-point sends included; "off" never. The sender then waits,
	// at the end of an operation, until its receivers have read what it
	// lent. Ranks may differ.
	TCPLend string
	// TCPGatherDisable writes every small slice over TCP in a system call
	// of its own (GOCCL_TCP_GATHER_DISABLE=1). By default a channel that
	// has only sent small slices for several operations in a row,
	// each soon after the last (a stream of reduces seen from a non-root,
	// of broadcasts from the root), gathers them and writes up to 16 in
	// one call: its operations return at once, and a gathered slice goes
	// out at the rank's next wait, or within 50 µs if it makes no further
	// call (transport/tcp/gather.go).
	TCPGatherDisable bool
	// SocketIfname chooses the network interfaces, as NCCL_SOCKET_IFNAME:
	// prefixes to use ("eth,ib"), ^ to exclude ("^docker,lo"), = for exact
	// names ("=eth0"). Empty: every interface that is up except loopback
	// and container bridges, or loopback when that is all there is; the
	// best of them carries the data. When set and matching several
	// interfaces, each TCP connection's sockets spread over them all.
	SocketIfname string
	// HostID overrides the host identity (hostname and boot id) that
	// decides which ranks share a host; set it per network namespace to
	// make namespaces count as hosts.
	HostID string
	// Transport chooses how processes reach each other: TransportAuto
	// (or ""): shared memory between ranks on one host, RDMA verbs
	// between hosts where both ends have a usable port, TCP otherwise;
	// TransportTCP: TCP everywhere; TransportShm: shared memory everywhere;
	// TransportVerbs: RDMA for every pair. Init fails if some pair cannot
	// use the transport forced. Ranks may differ: a pair uses shared
	// memory only if neither side forces TCP or verbs, and verbs if one
	// side forces it and both can.
	Transport string
	// IB configures the RDMA transport (GOCCL_IB_*); see IBConfig.
	IB IBConfig
	// Spin is how long a rank waiting for data polls before it sleeps
	// (parking and waking a thread costs tens of microseconds); 0 means
	// DefaultSpin, a negative value never polls.
	Spin time.Duration
	// DebugLevel is the level of goccl's log on stderr (GOCCL_DEBUG: WARN
	// by default, INFO for a summary of each new communicator, TRACE for a
	// line per operation).
	DebugLevel slog.Level
	// debugSubsys is the set of subsystems logged (GOCCL_DEBUG_SUBSYS).
	debugSubsys map[string]bool
	// DebugDump, when set, is a directory: on a timeout or an abort each
	// rank writes its flight recorder there as JSON (package flight), and
	// on SIGUSR1 every communicator of the process does. Comm.DebugDump
	// writes it on demand either way.
	DebugDump string
	// TLSCert, TLSKey and TLSCA, all three or none, turn on mutual TLS 1.3
	// for every TCP connection: to the bootstrap root and between ranks.
	// They are PEM files: this rank's certificate and key, and the CA that
	// signed every rank's certificate. A peer is trusted if the CA signed
	// its certificate, whatever its name; each certificate needs both the
	// serverAuth and clientAuth extended key usages (or none). Shared
	// memory stays within the host and does not use TLS.
	TLSCert, TLSKey, TLSCA string
	// ShmAllowUIDs lists the other users whose processes may connect to
	// this rank's shared-memory sockets (GOCCL_SHM_ALLOW_UIDS, a comma
	// list of uids): by default only processes of this process's user
	// may, so that ranks of one job on one host running as different
	// users need it on every rank.
	ShmAllowUIDs []int
	// ShmCMA says whether a shared-memory receiver copies slices straight
	// out of the sender's memory (process_vm_readv, one copy where slots
	// take two; GOCCL_SHM_CMA): "auto" (or "") where it pays, "on" or
	// "off" regardless. Under "auto", 2-rank broadcasts, all-gathers,
	// reduces and reduce-scatters take blocks (ShmBlock) or slots by what
	// the receiving side measures as they run, per size and kind of
	// operation; slot-sized slices (all-gathers and broadcasts of 3 ranks
	// or more) go by reference where this host's kernel copies at least
	// half as fast as user space, measured once per process. The kernel
	// refuses it between processes that may not ptrace each other; then
	// slots carry everything, as with "off".
	ShmCMA string
	// ShmBlock is the size, in bytes, of the blocks a 2-rank broadcast,
	// all-gather, reduce or reduce-scatter over shared memory sends by
	// the receiver's single copy
	// (one process_vm_readv per block instead of one per slot;
	// GOCCL_SHM_BLOCK): 0 means shm.DefaultBlockSize (1 MiB); a size no
	// larger than a slot keeps slot-sized slices. Whether blocks or slots
	// carry a size is measured as the operations run, unless ShmCMA says
	// "on" (blocks) or "off" (slots).
	ShmBlock int
	// ShmSplitDisable keeps each block's copy on its receiver's core
	// (GOCCL_SHM_SPLIT_DISABLE=1): by default a receiver asks its sender,
	// which only waits meanwhile, to write the second half of each block
	// of 128 KiB or more into the output while it reads the first, so
	// that a 2-rank broadcast copies on both cores (process_vm_writev;
	// where the kernel refuses it, the receiver copies it all).
	ShmSplitDisable bool
	// SlotStreamDisable has a sender write the slots of shared memory and
	// of a local group's connections with plain stores
	// (GOCCL_SLOT_STREAM_DISABLE=1): by default it writes them with
	// streaming stores, which take no cache line back from the receiver's
	// core (transport.FarSlots).
	SlotStreamDisable bool
	// P2PDisable keeps device operations between processes of one host
	// in registered host memory (GOCCL_P2P_DISABLE=1, as NCCL_P2P_DISABLE):
	// by default their slots are in the receiver's device memory, which
	// the sender maps through CUDA IPC, where both processes' GPUs can
	// (transport/shm, ipc_linux.go).
	P2PDisable bool
	// Insecure lets InitFromEnv start a job that has no GOCCL_SECRET:
	// its connections are then checked for protocol version and job, but
	// not authenticated (GOCCL_INSECURE=1; logged at WARN). For trusted
	// clusters only: without it, InitFromEnv refuses (ErrNoSecret).
	Insecure bool
	// tls is what those files make, loaded once by resolve; nil without TLS.
	tls *tls.Config
	// devices are the GPUs of WithDevice; nil: host memory only.
	devices []Device
	// topology is WithTopology's: the machine the devices are in.
	topology *topology.System
	// deviceLink is the tuner's model of a local group's device links
	// (deviceLinkFor; zero: the host operations' link), and deviceLinkWhy
	// what it is or why there is none (the INFO summary's device_link).
	deviceLink    algorithms.LinkModel
	deviceLinkWhy string
	// localOnly: the communicator is made for ranks that all reach each
	// other over shared memory (a split of a parent that does): no TCP
	// data listener, and each rank is known by its shared-memory one.
	localOnly bool
	// oversubscribed: some machine of the job runs more ranks than it has
	// CPUs (anyOversubscribed, from the table, so alike on every rank);
	// the engine then slices some collectives by the slot
	// (engine.Config.Oversubscribed).
	oversubscribed bool
}

// IBConfig configures the RDMA verbs transport. The zero value means
// NCCL's defaults.
type IBConfig struct {
	// HCA chooses the device and port, in NCCL_IB_HCA's syntax:
	// "mlx5_0:1,mlx5_1" (prefixes of device names, optionally with a
	// port), "^mlx5_1" (all but these), "=mlx5_0" (exact names). Empty:
	// the first active port.
	HCA string
	// GIDIndex, if set, forces the GID table entry on RoCE; nil chooses
	// the IPv4-mapped RoCE v2 entry, skipping link-local ones.
	GIDIndex *int
	// TC and SL are the traffic class and service level of every
	// connection (NCCL_IB_TC, NCCL_IB_SL).
	TC, SL int
	// QPsPerConnection stripes each connection over this many queue
	// pairs, 1..16 (NCCL_IB_QPS_PER_CONNECTION); 0 means 1.
	QPsPerConnection int
	// Timeout (0..31; 4.096 µs × 2^Timeout per try) and RetryCnt (0..7)
	// bound how long a NIC retries a peer that does not answer before
	// the connection fails with RETRY_EXC_ERR; 0 means NCCL's 20 and 7.
	Timeout, RetryCnt int
	// Emulate uses the emulated RC device (transport/verbs/ibemu) in
	// place of RDMA hardware: for tests on machines without it. It moves
	// bytes between processes through shared memory and is never RDMA.
	Emulate bool
	// GDRLevel is the longest PCI path between a rank's GPU and its NIC
	// over which the NIC reads and writes GPU memory directly (GPUDirect
	// RDMA), as NCCL_NET_GDR_LEVEL: LOC, PIX, PXB, PHB or SYS (or 0..5).
	// Empty means PXB, NCCL's default. Further apart, device operations
	// are staged through host memory.
	GDRLevel string
	// GDRFlushDisable skips the flush read that GPUDirect RDMA does
	// below compute capability 9.0 (NCCL_GDR_FLUSH_DISABLE): only for
	// systems whose PCIe ordering makes it unnecessary.
	GDRFlushDisable bool
}

// Option changes a Config.
type Option func(*settings)

type settings struct {
	// set holds what each option sets, in the order given: applied over
	// the environment, so options win. An option is one function that
	// names its field once (no list of field names to keep in step).
	set      []func(*Config)
	devices  []Device
	topology *topology.System
	lookup   func(string) (string, bool)
}

// with records that an option sets a field.
func (s *settings) with(f func(*Config)) { s.set = append(s.set, f) }

// WithAlgorithm forces the all-reduce algorithm.
func WithAlgorithm(a algorithms.Algorithm) Option {
	return func(s *settings) { s.with(func(c *Config) { c.Algorithm = a }) }
}

// WithChannels forces the channel count.
func WithChannels(n int) Option {
	return func(s *settings) { s.with(func(c *Config) { c.Channels = n }) }
}

// WithMaxChannels bounds the tuner's channel count.
func WithMaxChannels(n int) Option {
	return func(s *settings) { s.with(func(c *Config) { c.MaxChannels = n }) }
}

// WithChunkSize forces the pipelining block size in bytes.
func WithChunkSize(b int64) Option {
	return func(s *settings) { s.with(func(c *Config) { c.ChunkSize = b }) }
}

// WithTimeout sets the per-operation timeout.
func WithTimeout(d time.Duration) Option {
	return func(s *settings) { s.with(func(c *Config) { c.Timeout = d }) }
}

// WithSlots shapes the in-process transport's connections.
func WithSlots(slots, slotSize int) Option {
	return func(s *settings) {
		s.with(func(c *Config) { c.Slots, c.SlotSize = slots, slotSize })
	}
}

// WithHeartbeatTimeout sets how long a rank may leave the root's
// heartbeat unanswered before the others are told it stopped responding
// (Config.HeartbeatTimeout; negative: no heartbeat).
func WithHeartbeatTimeout(d time.Duration) Option {
	return func(s *settings) { s.with(func(c *Config) { c.HeartbeatTimeout = d }) }
}

// WithInitTimeout bounds Init and InitFromEnv when their context has no
// deadline.
func WithInitTimeout(d time.Duration) Option {
	return func(s *settings) { s.with(func(c *Config) { c.InitTimeout = d }) }
}

// WithNSocks sets the number of TCP sockets per connection.
func WithNSocks(n int) Option {
	return func(s *settings) { s.with(func(c *Config) { c.NSocks = n }) }
}

// WithSocketIfname chooses network interfaces (NCCL_SOCKET_IFNAME syntax).
func WithSocketIfname(spec string) Option {
	return func(s *settings) { s.with(func(c *Config) { c.SocketIfname = spec }) }
}

// WithSpin sets how long waits poll before they sleep (negative: never).
func WithSpin(d time.Duration) Option {
	return func(s *settings) { s.with(func(c *Config) { c.Spin = d }) }
}

// WithTransport chooses the transport between processes: "auto", "tcp"
// or "shm" (see Config.Transport).
func WithTransport(t string) Option {
	return func(s *settings) { s.with(func(c *Config) { c.Transport = t }) }
}

// WithDebugDump names the directory the flight recorder is written to on
// a timeout or an abort, and on SIGUSR1 (see Config.DebugDump).
func WithDebugDump(dir string) Option {
	return func(s *settings) { s.with(func(c *Config) { c.DebugDump = dir }) }
}

// WithHostID overrides the host identity.
func WithHostID(id string) Option {
	return func(s *settings) { s.with(func(c *Config) { c.HostID = id }) }
}

// WithTLSFiles turns on mutual TLS with this rank's certificate and key
// and the job's CA (PEM files; see Config.TLSCert).
func WithTLSFiles(cert, key, ca string) Option {
	return func(s *settings) { s.with(func(c *Config) { c.TLSCert, c.TLSKey, c.TLSCA = cert, key, ca }) }
}

// WithDevice binds communicators to GPUs, for the collectives on device
// memory (AllReduceDevice and the others in device.go): one device for
// every rank (this process's rank, or every rank of a local group, which
// then share one GPU), or one per rank of a local group. A device comes
// from package cuda (cuda.Load, then Driver.Device).
func WithDevice(devs ...Device) Option {
	return func(s *settings) { s.devices = devs }
}

// WithTopology gives the machine's topology, as topology.Discover reads
// it (goccl-perf passes what it discovers through NVML and sysfs). The
// device operations of a NewLocalGroup whose GPUs it holds, or of a job
// made by Init whose ranks share this host and reach each other over
// shared memory with CUDA IPC, are then tuned by the ring NCCL's search
// finds over the ranks' GPUs (NVLink or PCI, their bandwidth and channel
// count: topology.Ring.LinkModel) instead of the transport's model.
// Without it, or where it does not hold a rank's GPU (by PCI bus id),
// device operations are tuned as host ones; the INFO summary's
// device_link says which.
func WithTopology(sys *topology.System) Option {
	return func(s *settings) { s.topology = sys }
}

// WithConfig sets every field of c: they win over the environment, and
// zero fields mean defaults, except DebugLevel, which is taken as it is
// (its zero value is slog.LevelInfo; slog.LevelWarn is the default).
func WithConfig(c Config) Option {
	return func(s *settings) {
		s.with(func(cfg *Config) {
			subsys := cfg.debugSubsys // from the environment: Config cannot set it
			*cfg = c
			if cfg.debugSubsys == nil {
				cfg.debugSubsys = subsys
			}
			cfg.devices, cfg.tls = nil, nil // set by WithDevice, and made below
		})
	}
}

// WithEnv makes the communicator read GOCCL_* variables through lookup
// instead of os.LookupEnv; WithEnv(nil) ignores the environment.
func WithEnv(lookup func(string) (string, bool)) Option {
	return func(s *settings) {
		if lookup == nil {
			lookup = func(string) (string, bool) { return "", false }
		}
		s.lookup = lookup
	}
}

// Environment variables, all read here and nowhere else. An invalid value
// is an error, never a silent default.
const (
	EnvAlgo              = "GOCCL_ALGO"               // ring, tree, recdoubling, rabenseifner, oneshot, hier, hiertree or auto
	EnvNChannels         = "GOCCL_NCHANNELS"          // 1..32
	EnvMaxChannels       = "GOCCL_MAX_NCHANNELS"      // 1..32
	EnvChunkSize         = "GOCCL_CHUNK_SIZE"         // bytes, with an optional K, M or G suffix (powers of 1024)
	EnvTimeout           = "GOCCL_TIMEOUT"            // a Go duration ("90s", "10m") or whole seconds
	EnvInitTimeout       = "GOCCL_INIT_TIMEOUT"       // like GOCCL_TIMEOUT, for Init and InitFromEnv
	EnvHeartbeat         = "GOCCL_HEARTBEAT_TIMEOUT"  // a duration; 0 turns the heartbeat off
	EnvNSocks            = "GOCCL_NSOCKS"             // TCP sockets per connection, 1..64
	EnvTCPWindow         = "GOCCL_TCP_WINDOW"         // large slices a TCP connection sends ahead of its receiver's credits; 0 the slot count, "off" none
	EnvTCPCongest        = "GOCCL_TCP_CONGESTION"     // "system", or a congestion control's name; empty: Reno in place of BBR
	EnvTCPLend           = "GOCCL_TCP_LEND"           // auto, on or off: large slices sent from the caller's pages (vmsplice)
	EnvTCPGatherDisable  = "GOCCL_TCP_GATHER_DISABLE" // 1: every small slice of a one-way stream in a write of its own
	EnvSocketIf          = "GOCCL_SOCKET_IFNAME"
	EnvHostID            = "GOCCL_HOSTID"
	EnvSpin              = "GOCCL_SPIN"                // a duration ("1ms", "200us"); 0 never polls
	EnvTransport         = "GOCCL_TRANSPORT"           // auto, tcp, shm or verbs
	EnvDebugDump         = "GOCCL_DEBUG_DUMP"          // a directory for flight recorder dumps
	EnvDebug             = "GOCCL_DEBUG"               // WARN, INFO, DEBUG, TRACE or NONE
	EnvDebugSubsys       = "GOCCL_DEBUG_SUBSYS"        // INIT,COLL,NET or ALL; ^ excludes
	EnvTLSCert           = "GOCCL_TLS_CERT"            // PEM: this rank's certificate
	EnvTLSKey            = "GOCCL_TLS_KEY"             // PEM: its private key
	EnvTLSCA             = "GOCCL_TLS_CA"              // PEM: the CA that signed every rank's certificate
	EnvInsecure          = "GOCCL_INSECURE"            // 1: InitFromEnv runs without GOCCL_SECRET, unauthenticated
	EnvShmAllowUIDs      = "GOCCL_SHM_ALLOW_UIDS"      // uids, comma-separated, whose processes may join this rank's shared memory
	EnvShmCMA            = "GOCCL_SHM_CMA"             // auto, on or off: the receiver's single copy (process_vm_readv)
	EnvShmBlock          = "GOCCL_SHM_BLOCK"           // bytes per block of the receiver's single copy on 2 ranks (default 1 MiB)
	EnvShmSplitDisable   = "GOCCL_SHM_SPLIT_DISABLE"   // 1: each block's copy on the receiver's core alone
	EnvSlotStreamDisable = "GOCCL_SLOT_STREAM_DISABLE" // 1: shared-memory and local slots written with plain stores, not streaming ones
	EnvP2PDisable        = "GOCCL_P2P_DISABLE"         // 1: device slots between processes in host memory, not CUDA IPC

	EnvIBHCA      = "GOCCL_IB_HCA"                // NCCL_IB_HCA's syntax: mlx5_0:1,mlx5_1 / ^mlx5_1 / =mlx5_0
	EnvIBGIDIndex = "GOCCL_IB_GID_INDEX"          // a GID table index
	EnvIBTC       = "GOCCL_IB_TC"                 // 0..255
	EnvIBSL       = "GOCCL_IB_SL"                 // 0..15
	EnvIBQPs      = "GOCCL_IB_QPS_PER_CONNECTION" // 1..16
	EnvIBTimeout  = "GOCCL_IB_TIMEOUT"            // 1..31
	EnvIBRetryCnt = "GOCCL_IB_RETRY_CNT"          // 1..7
	EnvIBEmulate  = "GOCCL_IB_EMULATE"            // 1: the emulated test device, not RDMA
	EnvGDRLevel   = "GOCCL_NET_GDR_LEVEL"         // LOC, PIX, PXB, PHB, SYS (NCCL_NET_GDR_LEVEL)
	EnvGDRFlush   = "GOCCL_GDR_FLUSH_DISABLE"     // 1: no flush read below compute capability 9.0
)

// resolve builds the Config: defaults, then the environment, then
// options. It also returns the environment it read, for InitFromEnv.
func resolve(opts []Option) (Config, func(string) (string, bool), error) {
	s := settings{lookup: os.LookupEnv}
	for _, o := range opts {
		o(&s)
	}
	cfg, err := fromEnv(s.lookup)
	if err != nil {
		return Config{}, nil, err
	}
	for _, f := range s.set {
		f(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, nil, err
	}
	if cfg.tls, err = cfg.loadTLS(); err != nil {
		return Config{}, nil, err
	}
	for i, d := range s.devices {
		if d == nil {
			return Config{}, nil, fmt.Errorf("%w: WithDevice: device %d is nil", ErrInvalidArgument, i)
		}
	}
	cfg.devices, cfg.topology = s.devices, s.topology
	return cfg.withDefaults(), s.lookup, nil
}

// fromEnv reads the GOCCL_* variables.
func fromEnv(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	bad := func(name, val, want string) error {
		return fmt.Errorf("%w: %s=%q: want %s", ErrInvalidArgument, name, val, want)
	}
	if v, ok := lookup(EnvAlgo); ok && v != "" {
		a, err := algorithms.ParseAlgorithm(strings.TrimSpace(v))
		if err != nil || (a != algorithms.AlgoAuto && !a.Supports(algorithms.CollAllReduce)) {
			return c, bad(EnvAlgo, v, "auto, ring, tree, recdoubling, rabenseifner, oneshot, hier or hiertree")
		}
		c.Algorithm = a
	}
	for _, e := range []struct {
		name string
		dst  *int
	}{{EnvNChannels, &c.Channels}, {EnvMaxChannels, &c.MaxChannels}} {
		if v, ok := lookup(e.name); ok && v != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 || n > MaxChannels {
				return c, bad(e.name, v, fmt.Sprintf("an integer in 1..%d", MaxChannels))
			}
			*e.dst = n
		}
	}
	if v, ok := lookup(EnvChunkSize); ok && v != "" {
		n, err := ParseSize(v)
		if err != nil || n < 1024 {
			return c, bad(EnvChunkSize, v, "a size of at least 1K, like 512K or 1M")
		}
		c.ChunkSize = n
	}
	for _, e := range []struct {
		name string
		dst  *time.Duration
	}{{EnvTimeout, &c.Timeout}, {EnvInitTimeout, &c.InitTimeout}} {
		if v, ok := lookup(e.name); ok && v != "" {
			d, err := parseTimeout(v)
			if err != nil || d <= 0 {
				return c, bad(e.name, v, `a positive duration like "90s" or "10m", or whole seconds`)
			}
			*e.dst = d
		}
	}
	if v, ok := lookup(EnvHeartbeat); ok && strings.TrimSpace(v) != "" {
		if strings.TrimSpace(v) == "0" {
			c.HeartbeatTimeout = -1
		} else if d, err := parseTimeout(v); err != nil || d <= 0 {
			return c, bad(EnvHeartbeat, v, `a positive duration like "10s", or 0 to turn the heartbeat off`)
		} else {
			c.HeartbeatTimeout = d
		}
	}
	if v, ok := lookup(EnvNSocks); ok && v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 64 {
			return c, bad(EnvNSocks, v, "an integer in 1..64")
		}
		c.NSocks = n
	}
	if v, ok := lookup(EnvTCPWindow); ok && v != "" {
		if v = strings.TrimSpace(v); v == "off" {
			c.TCPWindow = -1
		} else if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 4096 {
			return c, bad(EnvTCPWindow, v, `an integer in 0..4096, or "off"`)
		} else {
			c.TCPWindow = n
		}
	}
	if v, ok := lookup(EnvTCPCongest); ok {
		v = strings.TrimSpace(v)
		if err := tcp.ValidCongestion(v); err != nil {
			return c, bad(EnvTCPCongest, v, `"system" or a congestion control's name (reno, cubic, bbr, ...)`)
		}
		c.TCPCongestion = v
	}
	if v, ok := lookup(EnvTCPLend); ok && v != "" {
		v = strings.ToLower(strings.TrimSpace(v))
		if _, known := tcpLendModes[v]; !known {
			return c, bad(EnvTCPLend, v, "auto, on or off")
		}
		c.TCPLend = v
	}
	if v, ok := lookup(EnvSocketIf); ok {
		c.SocketIfname = v
	}
	if v, ok := lookup(EnvHostID); ok {
		c.HostID = v
	}
	if v, ok := lookup(EnvDebugDump); ok {
		c.DebugDump = strings.TrimSpace(v)
	}
	c.TLSCert, _ = lookup(EnvTLSCert)
	c.TLSKey, _ = lookup(EnvTLSKey)
	c.TLSCA, _ = lookup(EnvTLSCA)
	v, _ := lookup(EnvDebug)
	lvl, _, err := parseLevel(v)
	if err != nil {
		return c, bad(EnvDebug, v, "WARN, INFO, DEBUG, TRACE or NONE")
	}
	c.DebugLevel = lvl
	v, _ = lookup(EnvDebugSubsys)
	if c.debugSubsys, err = parseSubsys(v); err != nil {
		return c, bad(EnvDebugSubsys, v, "a list of INIT, COLL, NET or ALL, optionally after ^")
	}
	if v, ok := lookup(EnvTransport); ok && v != "" {
		c.Transport = strings.ToLower(strings.TrimSpace(v))
		if !knownTransport(c.Transport) {
			return c, bad(EnvTransport, v, "auto, tcp, shm or verbs")
		}
	}
	if v, ok := lookup(EnvIBHCA); ok {
		c.IB.HCA = v
	}
	for _, e := range []struct {
		name   string
		dst    *int
		lo, hi int
	}{{EnvIBTC, &c.IB.TC, 0, 255}, {EnvIBSL, &c.IB.SL, 0, 15}, {EnvIBQPs, &c.IB.QPsPerConnection, 1, 16},
		{EnvIBTimeout, &c.IB.Timeout, 1, 31}, {EnvIBRetryCnt, &c.IB.RetryCnt, 1, 7}, {EnvIBGIDIndex, nil, 0, 255}} {
		if v, ok := lookup(e.name); ok && strings.TrimSpace(v) != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < e.lo || n > e.hi {
				return c, bad(e.name, v, fmt.Sprintf("an integer in %d..%d", e.lo, e.hi))
			}
			if e.dst == nil {
				c.IB.GIDIndex = &n
			} else {
				*e.dst = n
			}
		}
	}
	if v, ok := lookup(EnvShmAllowUIDs); ok && strings.TrimSpace(v) != "" {
		for _, f := range strings.Split(v, ",") {
			uid, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || uid < 0 {
				return c, bad(EnvShmAllowUIDs, v, "a comma-separated list of numeric uids")
			}
			c.ShmAllowUIDs = append(c.ShmAllowUIDs, uid)
		}
	}
	if v, ok := lookup(EnvShmCMA); ok && v != "" {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "auto", "on", "off":
			c.ShmCMA = strings.ToLower(strings.TrimSpace(v))
		default:
			return c, bad(EnvShmCMA, v, "auto, on or off")
		}
	}
	if v, ok := lookup(EnvShmBlock); ok && v != "" {
		n, err := ParseSize(strings.TrimSpace(v))
		if err != nil || n < 0 || n > shm.MaxBlockSize {
			return c, bad(EnvShmBlock, v, "a size in 0..256M (such as 256K or 1M)")
		}
		c.ShmBlock = int(n)
	}
	// On/off switches: 1, true or yes sets them; 0, false or no leaves
	// them off.
	for _, f := range []struct {
		name string
		dst  *bool
	}{{EnvInsecure, &c.Insecure}, {EnvIBEmulate, &c.IB.Emulate}, {EnvGDRFlush, &c.IB.GDRFlushDisable}, {EnvP2PDisable, &c.P2PDisable}, {EnvShmSplitDisable, &c.ShmSplitDisable}, {EnvSlotStreamDisable, &c.SlotStreamDisable}, {EnvTCPGatherDisable, &c.TCPGatherDisable}} {
		v, ok := lookup(f.name)
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		switch strings.TrimSpace(v) {
		case "1", "true", "yes":
			*f.dst = true
		case "0", "false", "no":
		default:
			return c, bad(f.name, v, "1 or 0")
		}
	}
	if v, ok := lookup(EnvGDRLevel); ok && strings.TrimSpace(v) != "" {
		if _, err := topology.ParseGDRLevel(v); err != nil {
			return c, bad(EnvGDRLevel, v, "LOC, PIX, PXB, PHB or SYS (or 0..5)")
		}
		c.IB.GDRLevel = strings.TrimSpace(v)
	}
	if v, ok := lookup(EnvSpin); ok && v != "" {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if strings.TrimSpace(v) == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			return c, bad(EnvSpin, v, `a duration like "1ms" or "200us", or 0 to never poll`)
		}
		if d == 0 {
			d = -1 // never poll
		}
		c.Spin = d
	}
	return c, nil
}

func parseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > int64(1<<63-1)/int64(time.Second) {
			return 0, fmt.Errorf("timeout %s s out of range", v)
		}
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

// ParseSize parses a byte count with an optional K, M or G suffix (powers
// of 1024, as nccl-tests' -b and -e; "KiB"/"KB" spellings are accepted).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}

func knownTransport(t string) bool {
	switch t {
	case TransportAuto, TransportTCP, TransportShm, TransportVerbs:
		return true
	}
	return false
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: config: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Algorithm != algorithms.AlgoAuto && !c.Algorithm.Supports(algorithms.CollAllReduce):
		return bad("algorithm %v does not implement all-reduce (want auto, ring, tree, recdoubling, rabenseifner, oneshot, hier or hiertree)", c.Algorithm)
	case c.Channels < 0 || c.Channels > MaxChannels:
		return bad("Channels %d out of range 0..%d", c.Channels, MaxChannels)
	case c.MaxChannels < 0 || c.MaxChannels > MaxChannels:
		return bad("MaxChannels %d out of range 0..%d", c.MaxChannels, MaxChannels)
	case c.ChunkSize != 0 && c.ChunkSize < 1024:
		return bad("ChunkSize %d below 1 KiB", c.ChunkSize)
	case c.Timeout < 0:
		return bad("negative Timeout %v", c.Timeout)
	case c.Slots != 0 && (c.Slots < 2 || c.Slots > 64):
		return bad("Slots %d out of range 2..64", c.Slots)
	case c.SlotSize != 0 && (c.SlotSize < 4096 || c.SlotSize > 64<<20):
		return bad("SlotSize %d out of range 4 KiB..64 MiB", c.SlotSize)
	case c.Channels > 0 && c.MaxChannels > 0 && c.Channels > c.MaxChannels:
		return bad("Channels %d exceeds MaxChannels %d", c.Channels, c.MaxChannels)
	case c.InitTimeout < 0:
		return bad("negative InitTimeout %v", c.InitTimeout)
	case c.NSocks < 0 || c.NSocks > 64:
		return bad("NSocks %d out of range 0..64", c.NSocks)
	case c.ShmBlock < 0 || c.ShmBlock > shm.MaxBlockSize:
		return bad("ShmBlock %d out of range 0..256 MiB", c.ShmBlock)
	case c.TCPWindow > 4096:
		return bad("TCPWindow %d out of range (at most 4096; negative turns credits off)", c.TCPWindow)
	case tcp.ValidCongestion(c.TCPCongestion) != nil:
		return bad("TCPCongestion: %v", tcp.ValidCongestion(c.TCPCongestion))
	case !knownLend(c.TCPLend):
		return bad("TCPLend %q (want auto, on or off)", c.TCPLend)
	case c.Transport != "" && !knownTransport(c.Transport):
		return bad("Transport %q (want auto, tcp, shm or verbs)", c.Transport)
	case c.IB.TC < 0 || c.IB.TC > 255 || c.IB.SL < 0 || c.IB.SL > 15:
		return bad("IB traffic class %d (0..255), service level %d (0..15)", c.IB.TC, c.IB.SL)
	case c.IB.QPsPerConnection < 0 || c.IB.QPsPerConnection > 16:
		return bad("IB QPsPerConnection %d out of range 0..16", c.IB.QPsPerConnection)
	case c.IB.Timeout < 0 || c.IB.Timeout > 31 || c.IB.RetryCnt < 0 || c.IB.RetryCnt > 7:
		return bad("IB Timeout %d (0..31), RetryCnt %d (0..7)", c.IB.Timeout, c.IB.RetryCnt)
	case c.IB.GIDIndex != nil && (*c.IB.GIDIndex < 0 || *c.IB.GIDIndex > 255):
		return bad("IB GIDIndex %d out of range 0..255", *c.IB.GIDIndex)
	case c.IB.GDRLevel != "" && !validGDRLevel(c.IB.GDRLevel):
		return bad("IB GDRLevel %q: want LOC, PIX, PXB, PHB or SYS (or 0..5)", c.IB.GDRLevel)
	case (c.TLSCert == "") != (c.TLSKey == "") || (c.TLSCert == "") != (c.TLSCA == ""):
		return bad("TLS needs a certificate, its key and the CA, all three (%s=%q %s=%q %s=%q)",
			EnvTLSCert, c.TLSCert, EnvTLSKey, c.TLSKey, EnvTLSCA, c.TLSCA)
	}
	return nil
}

// loadTLS loads the TLS files, or returns nil when TLS is off.
func (c Config) loadTLS() (*tls.Config, error) {
	if c.TLSCert == "" {
		return nil, nil
	}
	cfg, err := tlsrec.LoadConfig(c.TLSCert, c.TLSKey, c.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("%w: %v (GOCCL_TLS_CERT, GOCCL_TLS_KEY, GOCCL_TLS_CA)", ErrInvalidArgument, err)
	}
	return cfg, nil
}

func (c Config) withDefaults() Config {
	if c.debugSubsys == nil {
		c.debugSubsys, _ = parseSubsys("")
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxChannels == 0 {
		// A forced channel count above the default raises the bound with it.
		c.MaxChannels = max(DefaultMaxChannels, c.Channels)
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = DefaultInitTimeout
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.Spin == 0 {
		c.Spin = DefaultSpin
	}
	if c.Transport == "" {
		c.Transport = TransportAuto
	}
	// Slots, SlotSize and NSocks stay 0 here: each transport has its own
	// defaults, and the communicator reports the values in effect.
	return c
}

func validGDRLevel(s string) bool {
	_, err := topology.ParseGDRLevel(s)
	return err == nil
}

// tcpLendModes maps Config.TCPLend to the transport's setting.
var tcpLendModes = map[string]tcp.LendMode{"": tcp.LendAuto, "auto": tcp.LendAuto, "on": tcp.LendOn, "off": tcp.LendOff}

func knownLend(v string) bool {
	_, ok := tcpLendModes[v]
	return ok
}
