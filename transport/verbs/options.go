package verbs

import (
	"log/slog"
	"net"
	"time"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Defaults, NCCL's where it has one (src/transport/net_ib/, v2.30).
const (
	DefaultSlots    = 8         // NCCL_STEPS
	DefaultSlotSize = 512 << 10 // as TCP's: a job mixing the two keeps one shape
	DefaultSpinFor  = time.Millisecond
	DefaultTimeout  = 20 // NCCL_IB_TIMEOUT: 4.096 µs × 2^20 ≈ 4.3 s per try
	DefaultRetryCnt = 7  // NCCL_IB_RETRY_CNT
	rnrRetry        = 7  // forever: receives are always reposted
	minRNRTimer     = 12 // 0.64 ms
	setupTimeout    = 10 * time.Second
)

// Options configures an endpoint.
type Options struct {
	Rank, NRanks int
	// Peers holds every rank's control address (host:port), by rank; ""
	// for peers this endpoint does not reach.
	Peers  []string
	Secret []byte
	// Listener is this rank's control listener, listening on Peers[Rank].
	// The endpoint owns it from New on.
	Listener net.Listener
	// Provider gives the device: ibv.OpenLibrary's (libibverbs) or
	// ibemu's (the emulated test device).
	Provider ibv.Provider
	// Port, if set, is the port to use, already opened (OpenPort); the
	// endpoint owns it from New on. Nil: New opens one from Provider,
	// HCA and GIDIndex.
	// HCA chooses the device and port, in NCCL_IB_HCA's syntax
	// (ParseHCA); empty takes the first active port.
	Port *Port
	HCA  string
	// GIDIndex forces a GID table entry (RoCE); -1 chooses one: the
	// IPv4-mapped RoCE v2 entry, link-local entries skipped.
	GIDIndex int
	TC, SL   uint8 // traffic class and service level (NCCL_IB_TC, NCCL_IB_SL)
	// QPs stripes each connection over this many queue pairs
	// (NCCL_IB_QPS_PER_CONNECTION); 0 means 1.
	QPs      int
	Slots    int // 0 means DefaultSlots
	SlotSize int // 0 means DefaultSlotSize
	SpinFor  time.Duration
	Timeout  uint8 // 0 means DefaultTimeout
	RetryCnt uint8 // 0 means DefaultRetryCnt
	// Progress, if set, is called by a channel's goroutine while it waits
	// on a connection of channel ch, to move what other transports have
	// queued on that channel (see transport/shm's Options.Progress).
	Progress func(ch int) (pending bool, err error)
	Logger   *slog.Logger
	// Device, if set, is this rank's GPU: connections of device
	// operations (channels from transport.DeviceChannels on) carry them,
	// with slots in its memory where GDR allows and the hardware can
	// (GPUDirect RDMA), else staged in host memory registered with it (a
	// device.Registrar). gdr.go says how it is chosen.
	Device device.Device
	// GDR allows GPUDirect RDMA between Device and this port: the caller
	// decides from the topology (NCCL_NET_GDR_LEVEL's rule).
	GDR bool
	// NoFlush skips the flush read that GPUDirect RDMA needs below compute
	// capability 9.0 (NCCL_GDR_FLUSH_DISABLE).
	NoFlush bool
	// ListenersUp: every peer's listener is up before this endpoint is
	// made (as the bootstrap guarantees), so a refused connection means
	// the peer has closed and Connect fails at once (connsetup.Dialer).
	ListenersUp bool
}
