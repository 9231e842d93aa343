package collective

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/bootstrap"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/launch"
	"github.com/goccl/goccl/internal/netif"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/shm"
	"github.com/goccl/goccl/transport/tcp"
	"github.com/goccl/goccl/transport/verbs"
	"github.com/goccl/goccl/transport/verbs/ibemu"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Version is the library version. Ranks of one job must run the same
// version; Init refuses a mismatch with an error naming both.
const Version = "0.1.0"

// UniqueID names one job's rendezvous: the root's address and the job's
// 128-bit secret. One rank makes it (NewUniqueID) and hands it to the
// others out of band, as with ncclGetUniqueId; anyone who has it can join
// the job, so treat it like a password.
type UniqueID struct {
	addr   string
	secret [16]byte
	// rootRank+1 is the rank whose process hosts the root (InitFromEnv:
	// rank 0's); 0 when no rank does, or it is not known (NewUniqueID's
	// process). Not part of the string form.
	rootRank int
}

const idPrefix = "goccl1:"

// String encodes the ID for handing to the other ranks:
// "goccl1:<32 hex digits of secret>:<host:port>".
func (id UniqueID) String() string {
	return idPrefix + hex.EncodeToString(id.secret[:]) + ":" + id.addr
}

// Addr returns the root's address.
func (id UniqueID) Addr() string { return id.addr }

// ParseUniqueID decodes what String produced.
func ParseUniqueID(s string) (UniqueID, error) {
	bad := func(why string) (UniqueID, error) {
		return UniqueID{}, fmt.Errorf("%w: unique id %q: %s (want %s<32 hex digits>:<host:port>)", ErrInvalidArgument, s, why, idPrefix)
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(s), idPrefix)
	if !ok {
		return bad("missing prefix")
	}
	sec, addr, ok := strings.Cut(rest, ":")
	if !ok || len(sec) != 32 {
		return bad("no 32-digit secret")
	}
	var id UniqueID
	if _, err := hex.Decode(id.secret[:], []byte(sec)); err != nil {
		return bad("secret is not hex")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return bad("bad address")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return bad("bad port")
	}
	id.addr = addr
	return id, nil
}

// NewUniqueID makes a job's ID and starts its root in this process, on the
// interface GOCCL_SOCKET_IFNAME (or Config.SocketIfname) selects. The root
// (a goroutine and a listening socket) serves until every rank has joined,
// until it fails, or for InitTimeout, whichever comes first.
func NewUniqueID(opts ...Option) (UniqueID, error) {
	cfg, _, err := resolve(opts)
	if err != nil {
		return UniqueID{}, err
	}
	ifs, err := netif.System()
	if err != nil {
		return UniqueID{}, err
	}
	addrs, err := netif.Select(ifs, cfg.SocketIfname)
	if err != nil {
		return UniqueID{}, err
	}
	var id UniqueID
	if _, err := rand.Read(id.secret[:]); err != nil {
		return UniqueID{}, err
	}
	r, err := bootstrap.StartRoot(net.JoinHostPort(addrs[0].Host(), "0"), bootstrap.RootOptions{
		Secret: id.secret[:], Version: Version, Timeout: cfg.InitTimeout, Watch: true, TLS: cfg.tls, Heartbeat: heartbeatOf(cfg)})
	if err != nil {
		return UniqueID{}, err
	}
	_, port, _ := net.SplitHostPort(r.Addr().String())
	id.addr = net.JoinHostPort(addrs[0].Host(), port)
	return id, nil
}

// tcpLink is the tuner's model of TCP connections: a hop is a kernel
// round trip on each side (RESULTS.md measures 2.8 µs one way while
// polling, 40 µs while blocking); a stream moves about 1.5–2.5 GB/s on
// loopback. Chunks are 2 MiB, NCCL's ring chunk over the network (4 steps
// of 512 KiB): a piece's blocks are what is in flight between two ranks,
// and 512 KiB left a 10 Gbit/s veth a quarter idle (docs/performance.md).
var tcpLink = algorithms.LinkModel{
	Latency:      10e-6,
	Bandwidth:    1.5e9,
	ReduceRate:   6e9,
	MaxChannels:  DefaultMaxChannels,
	ChannelBytes: 4 << 20,
	ChunkBytes:   2 << 20,
	// A slice costs a writev and a read whatever its size (tcp.MinSlice).
	MinSliceBytes: tcp.MinSlice,
	// The one-shot reduce-scatter and all-gather: 0.69-1.06 of the
	// ring's time on 3 and 4 ranks (docs/performance.md).
	OneShotHalves: true,
	// The one-shot reduce: 0.8-0.9 of the chain's time up to 1 KiB on 4
	// ranks, 1.1-1.4 at 16 KiB; the model puts the crossover near 3 KiB
	// (docs/performance.md).
	OneShotReduce: true,
	// The recursive-doubling all-gather: level with the ring at 16 MiB
	// on 4 ranks, 1.07 of its time on 8 (docs/performance.md).
	ExchangeEfficiency: 0.9,
}

// verbsLink is the tuner's model of RDMA connections: a hop is a write
// with immediate and its completion (ib_write_lat measures 1–2 µs on
// HDR/NDR, perftest issue 131) plus the engine's step; bandwidth is a
// link's (24 GB/s busbw per HDR 200G NIC in NCCL, less on older ones);
// chunks as TCP's, 4 slots of 512 KiB in flight.
var verbsLink = algorithms.LinkModel{
	Latency:      3e-6,
	Bandwidth:    12e9,
	ReduceRate:   6e9,
	MaxChannels:  DefaultMaxChannels,
	ChannelBytes: 4 << 20,
	ChunkBytes:   2 << 20,
}

// shmLink is the tuner's model of shared-memory connections: a hop is a
// store seen by a polling core (well under a microsecond) plus the
// engine's own work per step, 2 µs as fitted by bench/fit to the choices
// of 2 ranks on 2 CPUs (at 1 µs the ring took 16 KiB all-reduces from
// recursive doubling, which was 1.39 times faster; in two runs 33 and 34
// of 35 picks were within 10% of the fastest, at 2 µs 35 of 35 in both);
// bandwidth is a memory copy through the caches (RESULTS.md: 10–30 GB/s
// for one core); chunks of 512 KiB keep a piece of a 2-rank ring within
// four 128 KiB slots. Posting a small message is a store to one cache
// line, a tenth of a hop: one-shot all-reduce, which posts to every peer
// and waits once, measured 0.74–0.82× the time of recursive doubling at
// 8 B with 4, 6 and 8 ranks (docs/performance.md), so the tuner picks it
// for small operations.
var shmLink = algorithms.LinkModel{
	Latency:      2e-6,
	Bandwidth:    8e9,
	ReduceRate:   6e9,
	MaxChannels:  DefaultMaxChannels,
	ChannelBytes: 4 << 20,
	ChunkBytes:   512 << 10,
	PostCost:     0.1,
	// The one-shot reduce-scatter and all-gather: the all-gather
	// 0.73-1.06 of the ring's time on 3 and 4 ranks, the reduce-scatter
	// only ahead at small sizes (docs/performance.md).
	OneShotHalves: true,
	// The recursive-doubling all-gather: 1.34 of the ring's time at 16
	// MiB on 4 ranks, 1.56 on 8 (docs/performance.md).
	ExchangeEfficiency: 0.7,
}

// TunerLink returns the tuner's model of one transport's links (shm,
// tcp or verbs) as Init starts from it for a job where some machine runs
// more ranks than it has CPUs (oversubscribed) or none does, before a
// NIC's or port's speed bounds its bandwidth: for tools that hold it
// against measurements (bench/fit). False for another name.
func TunerLink(transport string, oversubscribed bool) (algorithms.LinkModel, bool) {
	switch transport {
	case TransportShm:
		return busyLink(shmLink, oversubscribed), true
	case TransportTCP:
		return tcpLink, true
	case TransportVerbs:
		return verbsLink, true
	}
	return algorithms.LinkModel{}, false
}

// busyLink is shared memory's model l for a job that is oversubscribed
// or not: where ranks outnumber the CPUs, a hop waits for the receiver
// to get a core (shmBusyHop).
func busyLink(l algorithms.LinkModel, oversubscribed bool) algorithms.LinkModel {
	if oversubscribed {
		l.Latency *= shmBusyHop
	}
	return l
}

// shmBusyHop is what a hop over shared memory costs, relative to
// shmLink's, where the machine runs more ranks than it has CPUs: each
// hop then waits for its receiver to get a core (a context switch, not a
// store seen by a polling core). Fitted with bench/fit to the choices of
// 3 and 4 ranks on 2 CPUs, 64 B-16 MiB, every algorithm forced, two runs
// 10 minutes apart, each fitted and then scored on the other: the picks
// within 10% of the fastest went from 59 and 56 of 70 to 68 and 62, the
// geometric mean of pick/fastest from 1.060 and 1.116 to 1.008 and 1.066
// (docs/performance.md, "The tuner's link models, fitted"). The ring's
// 2(n-1) hops then cost what they do, and the one-shot, recursive
// doubling and Rabenseifner take the sizes up to 256 KiB-1 MiB from it.
// Only for a job on one machine: the hops inside a host of a job across
// hosts (intraLink) were not measured so.
const shmBusyHop = 5.66 // 2^2.5: 11.3 µs a hop

// Init joins rank of nranks to the job named by id and returns its
// communicator. Ranks on the same host (same host identity and network
// namespace) talk through shared memory, others over TCP;
// Config.Transport (GOCCL_TRANSPORT) forces one. Init blocks until every
// rank has joined (all ranks call Init), ctx ends, or Config.InitTimeout
// passes when ctx has no deadline; a rank that never arrives fails every
// other rank's Init with an error naming it.
func Init(ctx context.Context, id UniqueID, nranks, rank int, opts ...Option) (*Comm, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: Init: nil context", ErrInvalidArgument)
	case nranks < 1 || rank < 0 || rank >= nranks:
		return nil, fmt.Errorf("%w: Init: rank %d of %d ranks (want 0 ≤ rank < nranks)", ErrInvalidArgument, rank, nranks)
	case id.addr == "":
		return nil, fmt.Errorf("%w: Init: empty unique id (make one with NewUniqueID or ParseUniqueID)", ErrInvalidArgument)
	}
	cfg, lookup, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	return initProcs(ctx, id, nranks, rank, cfg, lookup, nil)
}

func initProcs(ctx context.Context, id UniqueID, nranks, rank int, cfg Config, lookup func(string) (string, bool), facts *hostFacts) (*Comm, error) {
	return buildProcs(ctx, id, nranks, rank, cfg, lookup, facts, func(ctx context.Context, info wire.PeerInfo) (meeting, error) {
		t, w, err := bootstrap.JoinWatch(ctx, id.addr, id.secret[:], info, bootstrap.WithTLS(cfg.tls))
		return meeting{table: t, watch: w}, err
	})
}

// rendezvous trades this rank's PeerInfo for the job's table: with the
// root at init, through the old communicator's root connection at a
// shrink, over the parent's connections at a split.
type rendezvous func(ctx context.Context, info wire.PeerInfo) (meeting, error)

// meeting is what a rendezvous gives: the table, and the watched
// connection to the root (Init's), or a join of it still under way (a
// split child's, which the communicator takes when it comes:
// Comm.watchLater), or neither (a shrink's).
type meeting struct {
	table    wire.Table
	rootAddr string // the root's, when it is not the UniqueID's (a split child's)
	watch    *bootstrap.Watch
	// join waits for the watched connection still being joined; cancel
	// gives up on it; abandon does both, for a setup that failed.
	join    func() (*bootstrap.Watch, error)
	cancel  func()
	abandon func()
	// board, on rank 0, is the shared-memory board offered before the
	// rendezvous (a split child's), buildProcs's to use or close; boardAt,
	// on the others, is where it is (shm.Options.Board, BoardAt).
	board   *shm.BoardOffer
	boardAt shm.BoardRef
}

// buildProcs makes a communicator between processes: listeners, the
// rendezvous, then the transports to every peer. The table decides this
// rank's place (a shrink renumbers the survivors).
func buildProcs(ctx context.Context, id UniqueID, nranks, rank int, cfg Config, lookup func(string) (string, bool), facts *hostFacts, rdv rendezvous) (*Comm, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.InitTimeout)
		defer cancel()
	}
	fail := func(err error) (*Comm, error) {
		return nil, fmt.Errorf("goccl: rank %d of %d: init: %w", rank, nranks, err)
	}
	mode := cfg.Transport
	if mode == TransportShm && !shm.Supported {
		return fail(fmt.Errorf("%w: GOCCL_TRANSPORT=shm: %v", ErrInvalidArgument, shm.ErrUnsupported))
	}
	if facts == nil {
		var err error
		if facts, err = localFacts(id, rank, cfg, lookup); err != nil {
			return fail(err)
		}
	}
	addrs, near, nics := facts.addrs, facts.near, facts.nics
	// The listeners exist before this rank is announced, so that a peer
	// that dials at once finds them.
	var shmLn *net.UnixListener
	var err error
	if (mode == TransportAuto || mode == TransportShm) && shm.Supported {
		if shmLn, err = shm.Listen(); err != nil {
			if mode == TransportShm {
				return fail(err)
			}
			slog.Warn("goccl: no shared-memory transport, using TCP on this host", "rank", rank, "err", err)
		}
	}
	// A split child whose ranks all share this host (cfg.localOnly) has
	// no use for a TCP listener: its address is the shared-memory one.
	var ln net.Listener
	if !cfg.localOnly || shmLn == nil {
		if ln, err = tcp.Listen(net.JoinHostPort(addrs[0].Host(), "0"), cfg.TCPCongestion); err != nil {
			if shmLn != nil {
				shmLn.Close()
			}
			return fail(err)
		}
	}
	var dataAddr string
	if ln != nil {
		dataAddr = ln.Addr().String()
	} else {
		dataAddr = shmLn.Addr().String()
	}
	// A GOCCL_SOCKET_IFNAME that names several interfaces spreads each TCP
	// connection's sockets over them: a listener on each (nicLns, after
	// ln's), published in the host summary. Without it only the best
	// interface is used, as before: the default choice may include
	// interfaces the other hosts cannot reach.
	var nicLns []net.Listener
	closeTCP := func() {
		if ln != nil {
			ln.Close()
		}
		for _, l := range nicLns {
			l.Close()
		}
	}
	closeEarly := func() { // before shmLn is in closeListeners
		closeTCP()
		if shmLn != nil {
			shmLn.Close()
		}
	}
	if len(nics) > 1 && ln != nil {
		for _, a := range nics[1:] {
			l, err := tcp.Listen(net.JoinHostPort(a.Host(), "0"), cfg.TCPCongestion)
			if err != nil {
				closeEarly()
				return fail(fmt.Errorf("listening on %s (%s): %w", a.Iface, a.Host(), err))
			}
			nicLns = append(nicLns, l)
		}
	}
	// The RDMA port, opened before this rank is announced so that the
	// others learn whether it has one.
	var vport *verbs.Port
	var ibDevicePath string // how device operations cross RDMA, and why
	var vln net.Listener
	if mode == TransportAuto || mode == TransportVerbs {
		p, err := openVerbsPort(cfg.IB, near.ibRank())
		switch {
		case err == nil:
			if vln, err = net.Listen("tcp", net.JoinHostPort(addrs[0].Host(), "0")); err != nil {
				p.Ctx.Close()
				closeEarly()
				return fail(err)
			}
			vport = p
		case mode == TransportVerbs:
			closeEarly()
			return fail(fmt.Errorf("GOCCL_TRANSPORT=verbs: %w", err))
		default:
			slog.Debug("goccl: no RDMA transport", "rank", rank, "why", err)
		}
	}
	closeListeners := func() {
		closeTCP()
		if shmLn != nil {
			shmLn.Close()
		}
		if vport != nil {
			vln.Close()
			vport.Ctx.Close()
		}
	}
	hostID, nicSpeeds := facts.hostID, facts.nicSpeeds
	summary := hostSummary{CPUs: runtime.NumCPU(), NetNS: facts.netNS, NetMbps: facts.netMbps, CPUMask: cpuMask(), Machine: facts.machine}
	if len(cfg.devices) == 1 {
		summary.GPUBus = cfg.devices[0].Info().PCIBusID
	}
	for i, l := range nicLns {
		summary.NICs = append(summary.NICs, l.Addr().String())
		summary.NICNames = append(summary.NICNames, nics[i+1].Iface)
	}
	if shmLn != nil {
		summary.Shm = shmLn.Addr().String()
	}
	if vport != nil {
		summary.Verbs, summary.ForceVerbs = vln.Addr().String(), mode == TransportVerbs
		summary.EmulatedIB = vport.Device.Emulated
		if r := vport.Attr.Rate(); r > 0 && !vport.Device.Emulated {
			summary.IBMbps = uint32(min(r*1e3, math.MaxUint32))
		}
	}
	info := wire.PeerInfo{Rank: uint32(rank), NRanks: uint32(nranks), PID: uint32(os.Getpid()),
		HostID: hostID, DataAddr: dataAddr, Version: Version, Topology: summary.encode()}
	m, err := rdv(ctx, info)
	if err != nil {
		closeListeners()
		return fail(err)
	}
	defer func() { m.board.Close() }() // unless the shm endpoint took it (nil then)
	table := m.table
	if m.rootAddr != "" {
		id.addr = m.rootAddr
	}
	baseFail := fail
	fail = func(err error) (*Comm, error) {
		switch {
		case m.watch != nil:
			m.watch.Close()
		case m.abandon != nil:
			m.abandon()
		}
		return baseFail(err)
	}
	// Where this rank stands in the table (a shrink renumbers).
	me := -1
	for i, p := range table.Peers {
		if p.DataAddr == info.DataAddr && p.PID == info.PID && p.HostID == info.HostID {
			me = i
		}
	}
	if me < 0 {
		closeListeners()
		return fail(errors.New("this rank is not in the root's table"))
	}
	rank, nranks = me, len(table.Peers)
	// A host with more ranks than CPUs: waiting ranks of both transports
	// give their core away after every failed poll.
	hosts := summarize(table.Peers)
	busy := hosts[hostID].oversubscribed()
	route, anyNet, err := routes(table.Peers, rank, mode)
	if err != nil {
		closeListeners()
		return fail(err)
	}
	// Every connection of the job has the same slot shape (the engine's
	// plans depend on it): the network's (TCP's and verbs' are alike) when
	// any pair goes over it, else shared memory's, unless Config sets it.
	slots, slotSize, link := shm.DefaultSlots, shm.DefaultSlotSize, shmLink
	tcpRanks := make([]bool, len(table.Peers)) // the ranks with a TCP pair (then link is tcpLink)
	if anyNet {
		slots, slotSize, link = tcp.DefaultSlots, tcp.DefaultSlotSize, verbsLink
		emulated := true
		for i, p := range table.Peers {
			s, _ := decodeHostSummary(p.Topology)
			emulated = emulated && (s.Verbs == "" || s.EmulatedIB)
			for _, q := range table.Peers {
				if r, _ := pairRoute(p, q); p.Rank != q.Rank && r == TransportTCP {
					link, emulated = tcpLink, false // the slowest link of the job
					tcpRanks[i] = true
					break
				}
			}
		}
		if emulated {
			// The emulated device moves bytes by a memory copy, as shared
			// memory does: its slots fit the caches the same way.
			slots, slotSize = shm.DefaultSlots, shm.DefaultSlotSize
		}
	}
	if cfg.Slots != 0 {
		slots = cfg.Slots
	}
	if cfg.SlotSize != 0 {
		slotSize = cfg.SlotSize
	}
	var dev Device
	switch len(cfg.devices) {
	case 0:
	case 1:
		dev = cfg.devices[0]
	default:
		closeListeners()
		return fail(fmt.Errorf("%w: WithDevice: %d devices for one rank", ErrInvalidArgument, len(cfg.devices)))
	}
	tcpPeers := make([]string, nranks)
	shmPeers := make([]string, nranks)
	verbsPeers := make([]string, nranks)
	var tcpNICs [][]string
	var nTCP, nShm, nVerbs int
	for i, p := range table.Peers {
		s, _ := decodeHostSummary(p.Topology)
		switch route[i] {
		case TransportTCP:
			tcpPeers[i] = p.DataAddr
			nTCP++
			if len(s.NICs) > 0 && len(nicLns) > 0 {
				// Both ends have several: stripe over the peer's.
				if tcpNICs == nil {
					tcpNICs = make([][]string, nranks)
				}
				tcpNICs[i] = s.NICs
			}
		case TransportShm:
			shmPeers[i] = s.Shm
			nShm++
		case TransportVerbs:
			verbsPeers[i] = s.Verbs
			nVerbs++
		}
	}
	rep := &routedEndpoint{byPeer: make([]transport.Endpoint, nranks)}
	if (nTCP > 0 || nShm == 0 && nVerbs == 0) && ln == nil {
		if nTCP > 0 {
			closeListeners()
			return fail(fmt.Errorf("rank %d is reached over TCP, but this communicator was made for ranks that share a host and has no TCP listener", slices.Index(route, TransportTCP)))
		}
		// A communicator of one: its TCP endpoint carries nothing but
		// wants a listener.
		if ln, err = tcp.Listen(net.JoinHostPort(addrs[0].Host(), "0"), cfg.TCPCongestion); err != nil {
			closeListeners()
			return fail(err)
		}
	}
	if nTCP > 0 || nShm == 0 && nVerbs == 0 {
		tcpPeers[rank] = ln.Addr().String()
		to := tcp.Options{Rank: rank, ListenersUp: true, NRanks: nranks, Peers: tcpPeers, Secret: id.secret[:], Listener: ln,
			Listeners: nicLns, PeerNICs: tcpNICs,
			NSocks: cfg.NSocks, Window: cfg.TCPWindow, Congestion: cfg.TCPCongestion, Slots: slots, SlotSize: slotSize, SpinFor: cfg.Spin, TLS: cfg.tls,
			YieldWhenIdle: busy, Lend: tcpLendModes[cfg.TCPLend], NoGather: cfg.TCPGatherDisable}
		if reg, ok := dev.(device.Registrar); ok {
			// Device operations stage their slices in registered memory.
			to.Device = reg
		}
		ep, err := tcp.New(to)
		if err != nil {
			closeListeners()
			return fail(err)
		}
		rep.all = append(rep.all, ep)
		for i, r := range route {
			if r == TransportTCP {
				rep.byPeer[i] = ep
			}
		}
	} else {
		closeTCP()
		nics = nil
	}
	if nVerbs > 0 {
		verbsPeers[rank] = vln.Addr().String()
		vo := verbs.Options{Rank: rank, ListenersUp: true, NRanks: nranks, Peers: verbsPeers, Secret: id.secret[:], Listener: vln, Port: vport,
			TC: uint8(cfg.IB.TC), SL: uint8(cfg.IB.SL), QPs: cfg.IB.QPsPerConnection, Slots: slots, SlotSize: slotSize,
			SpinFor: cfg.Spin, Timeout: uint8(cfg.IB.Timeout), RetryCnt: uint8(cfg.IB.RetryCnt)}
		// TCP's sends move only while the channel's goroutine moves them,
		// also while it waits on an RDMA connection.
		vo.Progress = transport.ProgressOf(rep.all...)
		gdrWhy := ""
		if dev != nil {
			vo.Device, vo.NoFlush = dev, cfg.IB.GDRFlushDisable
			vo.GDR, gdrWhy = gdrAllowed(cfg.IB, dev, vport)
		}
		ep, err := verbs.New(vo)
		if err != nil {
			vln.Close()
			vport.Ctx.Close()
			if shmLn != nil {
				shmLn.Close()
			}
			rep.Close(err)
			return fail(err)
		}
		rep.all = append(rep.all, ep)
		if dev != nil {
			ibDevicePath = ep.DevicePath() + "; " + gdrWhy
			if ep.Caps().DeviceSlots == memory.Device {
				ibDevicePath = "device-to-device over RDMA: " + ibDevicePath
			} else {
				ibDevicePath = "over RDMA: " + ibDevicePath
			}
		}
		if nVerbs == nranks-1 {
			// Every rank is an RDMA peer: small all-reduces go on a board
			// of RDMA writes (transport/verbs's JoinBoard).
			if err := ep.JoinBoard(ctx); err != nil {
				if shmLn != nil {
					shmLn.Close()
				}
				rep.Close(err)
				return fail(err)
			}
		}
		for i, r := range route {
			if r == TransportVerbs {
				rep.byPeer[i] = ep
			}
		}
	} else if vport != nil {
		vln.Close()
		vport.Ctx.Close()
	}
	if nShm > 0 {
		o := shm.Options{Rank: rank, ListenersUp: true, NRanks: nranks, Peers: shmPeers, Secret: id.secret[:], Listener: shmLn,
			Slots: slots, SlotSize: slotSize, SpinFor: cfg.Spin, YieldWhenIdle: busy, AllowUIDs: cfg.ShmAllowUIDs,
			CMA: map[string]shm.CMAMode{"on": shm.CMAOn, "off": shm.CMAOff}[cfg.ShmCMA], BlockSize: cfg.ShmBlock, NoSplit: cfg.ShmSplitDisable, NoStreamSlots: cfg.SlotStreamDisable, NoDeviceIPC: cfg.P2PDisable}
		if busy {
			// Above shm.DefaultSharedMax the slots' two copies beat the
			// receiver's one copy out of a shared allocation only because
			// the two ranks' cores make them side by side; with more ranks
			// than cores no core is spare, and the one copy moves half the
			// bytes at every size: 4 ranks on 2 cores, MemAlloc buffers,
			// the all-gather at 64 MiB 17-21 ms against 26-31, the
			// broadcast 26-31 against 38-44 (docs/performance.md, "MemAlloc
			// where ranks outnumber cores"). Every rank of a host sees the
			// same, as both ends of a connection must.
			o.SharedMax = -1
		}
		if reg, ok := dev.(device.Registrar); ok {
			// Device operations reduce straight into the segments, which
			// the GPU reaches once registered.
			o.Device = reg
		}
		// TCP's sends move only while the channel's goroutine moves them,
		// also while it waits on shared memory.
		o.Progress = transport.ProgressOf(rep.all...)
		if nShm == nranks-1 {
			// A split child's board, offered ahead (split.go).
			o.Board, o.BoardAt = m.board, m.boardAt
		}
		ep, err := shm.New(o)
		if err != nil {
			shmLn.Close()
			rep.Close(err)
			return fail(err)
		}
		if o.Board != nil {
			m.board = nil // the endpoint's
		}
		rep.all = append(rep.all, ep)
		if nShm == nranks-1 {
			// Every rank is on this host: small all-reduces go on a board
			// they all share (transport/shm's JoinBoard), joined while
			// the communicator gets ready (the engine waits for it at the
			// first collective).
			if err := ep.StartBoard(cfg.InitTimeout); err != nil {
				rep.Close(err)
				return fail(err)
			}
		}
		for i, r := range route {
			if r == TransportShm {
				rep.byPeer[i] = ep
			}
		}
	} else if shmLn != nil {
		shmLn.Close()
	}
	rep.caps = rep.all[0].Caps()
	for _, ep := range rep.all[1:] {
		// Device operations need every transport to carry them; slots of
		// different kinds that a GPU reaches (shared memory's mapped ones,
		// RDMA's in device memory) are only as much as mapped memory.
		switch k := ep.Caps().DeviceSlots; {
		case !k.DeviceVisible():
			rep.caps.DeviceSlots = memory.Host
		case k != rep.caps.DeviceSlots && rep.caps.DeviceSlots.DeviceVisible():
			rep.caps.DeviceSlots = memory.Mapped
		}
	}
	var ep transport.Endpoint = rep
	if len(rep.all) == 1 {
		ep = rep.all[0]
	}
	link.MaxChannels = min(cfg.MaxChannels, channelsPerRank(hosts))
	if slices.Contains(tcpRanks, true) {
		// The channels of a TCP connection share its NIC: together they
		// cannot outrun the slowest NIC a TCP pair uses, where every such
		// rank's interfaces report their speed.
		link.Bandwidth = min(link.Bandwidth, tcpNICBound(table.Peers, tcpRanks)/float64(link.MaxChannels))
	} else if anyNet {
		// RDMA alike: the channels' queue pairs share the port, and the
		// slowest port of the job's RDMA ranks bounds them all.
		link.Bandwidth = min(link.Bandwidth, ibPortBound(table.Peers)/float64(link.MaxChannels))
	}
	cfg.oversubscribed = anyOversubscribed(hosts)
	if !anyNet {
		link = busyLink(link, cfg.oversubscribed)
	}
	intra := intraLink(table.Peers, link)
	cfg.deviceLink, cfg.deviceLinkWhy = algorithms.LinkModel{}, "no GPU"
	if dev != nil {
		// The model is the job's: anyNet and the table are every rank's.
		_, ipc := dev.(device.IPCExporter)
		cfg.deviceLink, cfg.deviceLinkWhy = deviceLinkOfJob(cfg.topology, table.Peers, !anyNet, ipc && !cfg.P2PDisable, link.MaxChannels)
	}
	c, err := newComm(rank, nranks, cfg, ep, link, dev, hostLabels(table.Peers), intra)
	if err != nil {
		ep.Close(err)
		return fail(err)
	}
	c.peers = table.Peers
	c.routes = route
	for i, a := range nics {
		name := a.Iface
		if nicSpeeds[i] > 0 {
			name += fmt.Sprintf(":%gGb/s", nicSpeeds[i]*8/1e9)
		}
		c.nics = append(c.nics, name)
	}
	if nVerbs > 0 {
		c.ibPort = vport.String()
		c.ibDevicePath = ibDevicePath
	}
	c.id, c.lookup, c.facts = id, lookup, facts
	switch {
	case m.watch != nil:
		c.startWatch(m.watch)
	case m.join != nil:
		c.watchLater(m.join, m.cancel)
	}
	c.logReady()
	return c, nil
}

// hostFacts are what a rank learns about its host before it listens:
// where to listen, which interfaces TCP stripes over and how fast they
// are, which host it is. Init reads them (netif, sysfs, /proc); a Split
// child takes its parent's, which are the same process's.
type hostFacts struct {
	addrs     []netif.Addr // where this rank listens, best first
	near      gpuNICs      // the NICs nearest this rank's GPU
	nics      []netif.Addr // one per interface TCP spreads over (addrs[0]'s first)
	nicSpeeds []float64    // nics' speeds, bytes per second; 0 unknown
	netMbps   uint32       // their sum, 0 when any is unknown
	hostID    string
	netNS     string
	machine   string // netif.MachineID
}

func localFacts(id UniqueID, rank int, cfg Config, lookup func(string) (string, bool)) (*hostFacts, error) {
	ifs, err := netif.System()
	if err != nil {
		return nil, err
	}
	addrs, err := netif.Select(ifs, cfg.SocketIfname)
	if err != nil {
		return nil, err
	}
	if cfg.SocketIfname == "" && loopbackRoot(id.addr) {
		// The root is reachable from this host only, so every rank is
		// here: listen on loopback, not on an interface others can reach.
		addrs = loopbackAddrs(id.addr)
	}
	var gpu Device // this rank's, if any: its NIC is the nearest one (nearnic.go)
	if len(cfg.devices) == 1 {
		gpu = cfg.devices[0]
	}
	f := &hostFacts{near: newGPUNICs("/", gpu), hostID: cfg.HostID, netNS: netNamespace()}
	mode := cfg.Transport
	tcpToo := mode == TransportAuto || mode == TransportTCP
	if cfg.SocketIfname != "" && tcpToo {
		var why string
		if addrs, why = f.near.narrow(addrs); why != "" {
			slog.Info("goccl: TCP on the NICs nearest this rank's GPU", "rank", rank, "nics", why)
		}
	}
	f.addrs, f.nics = addrs, []netif.Addr{addrs[0]}
	if cfg.SocketIfname != "" && tcpToo {
		// A GOCCL_SOCKET_IFNAME that names several interfaces spreads each
		// TCP connection's sockets over them (a listener on each).
		f.nics = netif.PerInterface(addrs)
	}
	if f.machine, err = netif.MachineID(); err != nil {
		return nil, fmt.Errorf("machine identity: %w", err)
	}
	if f.hostID == "" {
		if f.hostID, err = netif.HostID(lookup, f.machine); err != nil {
			return nil, err
		}
	}
	// Each interface's speed (sysfs), for the tuner and the INFO summary.
	f.nicSpeeds = make([]float64, len(f.nics))
	netBW, known := 0.0, true
	for i, a := range f.nics {
		var ok bool
		f.nicSpeeds[i], ok = netif.Speed(a.Iface)
		netBW, known = netBW+f.nicSpeeds[i], known && ok
	}
	if known {
		f.netMbps = uint32(min(netBW*8/1e6, math.MaxUint32))
	}
	return f, nil
}

// InitFromEnv joins the job a launcher started this process in. It reads,
// in this order: goccl's own variables (GOCCL_ID, or GOCCL_ROOT with
// GOCCL_RANK, GOCCL_WORLD_SIZE and GOCCL_SECRET, as goccl-run sets them);
// torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
// Open MPI's (OMPI_COMM_WORLD_*); MPICH/Hydra/Intel MPI's (PMI_RANK,
// PMI_SIZE); Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). Without
// GOCCL_ID, rank 0 hosts the root at GOCCL_ROOT (or MASTER_ADDR:MASTER_PORT).
//
// Without GOCCL_SECRET (and without GOCCL_ID), InitFromEnv refuses to
// start, with ErrNoSecret: anyone who can reach the root's port could
// join such a job. Set GOCCL_SECRET to the same 32 hex digits on every
// rank before the launcher starts them (openssl rand -hex 16); goccl-run
// makes its own. GOCCL_INSECURE=1 (Config.Insecure) runs without one on a
// trusted cluster: the key is then derived from the root address and the
// world size, so connections are checked for protocol version and job
// but not authenticated. See docs/launchers.md and docs/security.md.
func InitFromEnv(ctx context.Context, opts ...Option) (*Comm, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: InitFromEnv: nil context", ErrInvalidArgument)
	}
	cfg, lookup, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	env, err := launch.FromEnv(lookup)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	var id UniqueID
	if env.ID != "" {
		if id, err = ParseUniqueID(env.ID); err != nil {
			return nil, fmt.Errorf("GOCCL_ID: %w", err)
		}
	} else {
		id.addr = env.Root
		id.rootRank = 1 // rank 0 hosts the root (below)
		if env.Secret != "" {
			hex.Decode(id.secret[:], []byte(env.Secret)) // launch.FromEnv checked it
		} else {
			if !cfg.Insecure {
				return nil, fmt.Errorf("%w (this rank was started by %s): anyone who can reach %s could join the job and read its data. "+
					"Give every rank the same secret before the launcher starts them: export GOCCL_SECRET=$(openssl rand -hex 16) "+
					"(mpirun: -x GOCCL_SECRET; Kubernetes: from a Secret; see docs/launchers.md), "+
					"or set GOCCL_INSECURE=1 to run unauthenticated on a trusted cluster", ErrNoSecret, launcherName(env.Source), env.Root)
			}
			unauthenticatedWarning.Do(func() {
				slog.Warn("goccl: GOCCL_INSECURE=1 and no GOCCL_SECRET: connections are not authenticated; anyone who can reach the root can join (see docs/security.md)", "root", env.Root)
			})
			sum := sha256.Sum256([]byte(fmt.Sprintf("goccl unauthenticated job %s %d", env.Root, env.Size)))
			copy(id.secret[:], sum[:])
		}
		if env.Rank == 0 {
			ifs, _ := netif.System() // none: every interface, as before
			r, err := bootstrap.StartRoot(rootListenAddr(env.Root, ifs), bootstrap.RootOptions{
				Secret: id.secret[:], Version: Version, Timeout: cfg.InitTimeout, Watch: true, TLS: cfg.tls, Heartbeat: heartbeatOf(cfg)})
			if err != nil {
				return nil, fmt.Errorf("goccl: rank 0 hosts the root at %s: %w", env.Root, err)
			}
			c, err := initProcs(ctx, id, env.Size, env.Rank, cfg, lookup, nil)
			if err != nil {
				r.Close()
				if rerr := r.Err(); rerr != nil && !errors.Is(err, rerr) {
					return nil, fmt.Errorf("%w (root: %v)", err, rerr)
				}
			}
			return c, err
		}
	}
	return initProcs(ctx, id, env.Size, env.Rank, cfg, lookup, nil)
}

var unauthenticatedWarning sync.Once

// launcherName names the launcher whose variables gave the rank.
func launcherName(source string) string {
	switch source {
	case "goccl":
		return "goccl's variables (GOCCL_RANK, GOCCL_WORLD_SIZE)"
	case "torchrun":
		return "torchrun or Kubeflow (RANK, WORLD_SIZE)"
	case "openmpi":
		return "Open MPI's mpirun"
	case "mpich":
		return "MPICH, Hydra or Intel MPI"
	case "slurm":
		return "Slurm's srun"
	}
	return source
}

type hostLoad struct{ ranks, cpus int }

// summarize counts ranks and CPUs per host. A host's CPUs are those its
// ranks may run on together: the union of their CPU sets where every one
// of them published its set, so that ranks bound to cores of their own
// (Open MPI binds each rank to a core by default for 2 ranks, Slurm may
// for any) count as many CPUs as they are bound to; else the fewest CPUs
// any of its ranks reports.
//
// Ranks are counted by the machine they run on, not by their host id:
// hosts that are network namespaces or containers of one machine
// (GOCCL_HOSTID) share its cores, and each host's figures are its
// machine's. Measured (docs/performance.md, "Hosts that share a
// machine"): 2 namespaces x 2 ranks on 2 cores, an 8-byte all-reduce took
// 97 µs with each namespace counted alone (2 ranks on 2 CPUs: polling),
// 61 with the waiting ranks yielding. Ranks that report no machine are
// counted by host alone.
func summarize(peers []wire.PeerInfo) map[string]hostLoad {
	loads := map[string]hostLoad{}
	union := map[string][]byte{}
	sets := map[string]bool{} // every rank of the machine published its CPU set
	keys := make([]string, len(peers))
	for i, p := range peers {
		s, ok := decodeHostSummary(p.Topology)
		k := "host " + p.HostID
		if ok && s.Machine != "" {
			k = "machine " + s.Machine
		}
		keys[i] = k
		h, seen := loads[k]
		h.ranks++
		if ok && (h.cpus == 0 || s.CPUs < h.cpus) {
			h.cpus = s.CPUs
		}
		if !seen {
			sets[k] = true
		}
		if !ok || len(s.CPUMask) == 0 {
			sets[k] = false
		} else {
			u := union[k]
			for len(u) < len(s.CPUMask) {
				u = append(u, 0)
			}
			for i, m := range s.CPUMask {
				u[i] |= m
			}
			union[k] = u
		}
		loads[k] = h
	}
	for k, h := range loads {
		if sets[k] {
			h.cpus = 0
			for _, m := range union[k] {
				h.cpus += bits.OnesCount8(m)
			}
		}
		h.cpus = max(h.cpus, 1)
		loads[k] = h
	}
	// A host whose ranks report different machines (one GOCCL_HOSTID
	// given on several) takes the most loaded of them.
	out := map[string]hostLoad{}
	for i, p := range peers {
		l := loads[keys[i]]
		if h, seen := out[p.HostID]; !seen || l.ranks*h.cpus > h.ranks*l.cpus {
			out[p.HostID] = l
		}
	}
	return out
}

// oversubscribed reports whether the host runs more ranks than it has
// CPUs: then a waiting rank gives its core away after every failed poll
// (shm and tcp Options.YieldWhenIdle).
func (h hostLoad) oversubscribed() bool { return h.ranks > h.cpus }

// anyOversubscribed reports whether some host of the job (hosts from
// summarize) runs more ranks than it has CPUs.
func anyOversubscribed(hosts map[string]hostLoad) bool {
	for _, h := range hosts {
		if h.oversubscribed() {
			return true
		}
	}
	return false
}

// intraLink is the tuner's model of the links inside a host: shared
// memory's when every pair of ranks on one host uses it, else link (some
// host's ranks talk over TCP or RDMA). It is computed from the table, not
// from this rank's routes, so every rank gets the same plans.
func intraLink(peers []wire.PeerInfo, link algorithms.LinkModel) algorithms.LinkModel {
	any := false
	for i, p := range peers {
		for _, q := range peers[i+1:] {
			if p.HostID != q.HostID {
				continue
			}
			if r, _ := pairRoute(p, q); r != TransportShm {
				return link
			}
			any = true
		}
	}
	if !any {
		return link
	}
	in := shmLink
	in.MaxChannels = link.MaxChannels
	return in
}

// tcpNICBound is the slowest network bandwidth (bytes per second) that
// a rank with a TCP pair (tcp[r]) reports for its interfaces, or +Inf
// when any such rank's speed is unknown.
func tcpNICBound(peers []wire.PeerInfo, tcp []bool) float64 {
	return slowestRate(peers, func(r int, _ hostSummary) bool { return tcp[r] }, func(s hostSummary) uint32 { return s.NetMbps })
}

// ibPortBound is the slowest RDMA port rate (bytes per second) among
// the ranks that have a port, or +Inf when any such rank's rate is
// unknown (the emulated device reports none).
func ibPortBound(peers []wire.PeerInfo) float64 {
	return slowestRate(peers, func(_ int, s hostSummary) bool { return s.Verbs != "" }, func(s hostSummary) uint32 { return s.IBMbps })
}

// slowestRate is the slowest of mbps (Mb/s, 0 unknown) over the ranks
// counts takes, in bytes per second, or +Inf when any such rank's rate
// is unknown or none counts. Every rank computes it from the same table,
// so all use the same link model.
func slowestRate(peers []wire.PeerInfo, counts func(r int, s hostSummary) bool, mbps func(hostSummary) uint32) float64 {
	bound := math.Inf(1)
	for r, p := range peers {
		s, _ := decodeHostSummary(p.Topology)
		if !counts(r, s) {
			continue
		}
		m := mbps(s)
		if m == 0 {
			return math.Inf(1)
		}
		bound = min(bound, float64(m)*1e6/8)
	}
	return bound
}

// hostLabels numbers the ranks' hosts in the order of their lowest rank,
// for the engine's schedules (engine.Config.Hosts); nil when all share one.
func hostLabels(peers []wire.PeerInfo) []int {
	ids := map[string]int{}
	labels := make([]int, len(peers))
	for r, p := range peers {
		l, ok := ids[p.HostID]
		if !ok {
			l = len(ids)
			ids[p.HostID] = l
		}
		labels[r] = l
	}
	if len(ids) <= 1 {
		return nil
	}
	return labels
}

// channelsPerRank is how many channels every rank can drive at once: each
// channel is a goroutine that polls while it waits, so a host should not
// have more channels in flight than CPUs. Every rank computes it from the
// same table, so all choose the same plans.
func channelsPerRank(hosts map[string]hostLoad) int {
	c := MaxChannels
	for _, h := range hosts {
		c = min(c, max(1, h.cpus/h.ranks))
	}
	return c
}

// openVerbsPort opens the RDMA port the IB settings choose: on the
// emulated test device with Emulate, through libibverbs otherwise; the
// allowed devices in prefer's order (nearest the rank's GPU first), when
// prefer is not nil.
func openVerbsPort(ib IBConfig, prefer func(name string) int) (*verbs.Port, error) {
	spec, err := verbs.ParseHCA(ib.HCA)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var pr ibv.Provider
	if ib.Emulate {
		pr = ibemu.New(ibemu.Options{})
	} else if pr, err = ibv.OpenLibrary(); err != nil {
		return nil, fmt.Errorf("%w (GOCCL_IB_EMULATE=1 uses the emulated test device instead)", err)
	}
	gid := -1
	if ib.GIDIndex != nil {
		gid = *ib.GIDIndex
	}
	return verbs.OpenPortPreferring(pr, spec, gid, prefer)
}
