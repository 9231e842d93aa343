package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/netif"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/transport/mem"
)

// NewLocalGroupNet is NewLocalGroup that also returns the in-process
// network, so that tests can inject faults.
func NewLocalGroupNet(n int, opts ...Option) ([]*Comm, *mem.Network, error) {
	return newLocalGroup(n, opts)
}

// GDRAllowedIn is gdrAllowed on a fake sysfs tree.
var GDRAllowedIn = gdrAllowedIn

// NICsNearGPU and IBRankNearGPU are gpuNICs's narrow and ibRank on a
// fake sysfs tree; Nearest is nearnic.go's.
var (
	NICsNearGPU = func(root string, dev Device, addrs []netif.Addr) ([]netif.Addr, string) {
		return newGPUNICs(root, dev).narrow(addrs)
	}
	Nearest       = nearest
	IBRankNearGPU = func(root string, dev Device) func(string) int { return newGPUNICs(root, dev).ibRank() }
)

// RootListenAddr is rootListenAddr on the given interfaces.
var RootListenAddr = rootListenAddr

// HostSummaryRoundTrip encodes a host summary with the given NICs and
// decodes it back; Decode decodes raw bytes (for the fuzzer).
func HostSummaryRoundTrip(shm string, nics, names []string, mbps uint32) (gotShm string, gotNICs, gotNames []string, gotMbps uint32, ok bool) {
	h, ok := decodeHostSummary(hostSummary{CPUs: 3, Shm: shm, NICs: nics, NICNames: names, NetMbps: mbps}.encode())
	return h.Shm, h.NICs, h.NICNames, h.NetMbps, ok
}

// DecodeHostSummary reports whether b decodes as a host summary.
func DecodeHostSummary(b []byte) bool { _, ok := decodeHostSummary(b); return ok }

// TCPNICBound is tcpNICBound over ranks on different hosts (so each has
// a TCP pair), each with the given interface speed (Mb/s; 0 unknown).
func TCPNICBound(mbps ...uint32) float64 {
	var peers []wire.PeerInfo
	tcp := make([]bool, len(mbps))
	for r, m := range mbps {
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: fmt.Sprint("host", r),
			Topology: hostSummary{CPUs: 2, NetMbps: m}.encode()})
		tcp[r] = true
	}
	return tcpNICBound(peers, tcp)
}

// IBPortBound is ibPortBound over ranks on different hosts with the
// given RDMA port rates (Mb/s; 0 unknown, -1 no port).
func IBPortBound(mbps ...int) float64 {
	var peers []wire.PeerInfo
	for r, m := range mbps {
		s := hostSummary{CPUs: 2}
		if m >= 0 {
			s.Verbs, s.IBMbps = fmt.Sprint("10.0.0.", r, ":4000"), uint32(m)
		}
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: fmt.Sprint("host", r), Topology: s.encode()})
	}
	return ibPortBound(peers)
}

// IBRateRoundTrip encodes a host summary with an RDMA port rate and
// decodes it back.
func IBRateRoundTrip(mbps uint32) (uint32, bool) {
	h, ok := decodeHostSummary(hostSummary{CPUs: 2, Verbs: "10.0.0.1:4000", NetMbps: 10000, IBMbps: mbps, Machine: "m"}.encode())
	return h.IBMbps, ok && h.NetMbps == 10000 && h.Machine == "m"
}

// DeviceLinkOf is the tuner's model of c's device links (zero: its host
// operations').
func DeviceLinkOf(c *Comm) algorithms.LinkModel { return c.cfg.deviceLink }

// DeviceLinkFor is deviceLinkFor over one device per rank.
func DeviceLinkFor(sys *topology.System, devs []Device, maxChannels int) (algorithms.LinkModel, string) {
	return deviceLinkFor(sys, func(r int) Device { return devs[r] }, len(devs), maxChannels)
}

// DeviceLinkOfJob is deviceLinkOfJob over ranks on the given hosts with
// the given GPU bus ids, every pair over shared memory as allShm says.
func DeviceLinkOfJob(sys *topology.System, hosts, buses []string, allShm, p2p bool) (algorithms.LinkModel, string) {
	var peers []wire.PeerInfo
	for r := range hosts {
		s := hostSummary{CPUs: 2, NetNS: "net:[1]", Shm: fmt.Sprint("@shm", r), GPUBus: buses[r]}
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: hosts[r], Topology: s.encode()})
	}
	return deviceLinkOfJob(sys, peers, allShm, p2p, 32)
}

// GPUBusRoundTrip encodes a host summary with a GPU bus id and decodes
// it back, with a CPU set after it.
func GPUBusRoundTrip(bus string) (string, bool) {
	h, ok := decodeHostSummary(hostSummary{CPUs: 2, Machine: "m", GPUBus: bus, CPUMask: []byte{3}}.encode())
	return h.GPUBus, ok && h.Machine == "m" && len(h.CPUMask) == 1
}

// IntraLinkIsShm reports whether intraLink picks shared memory's model for
// ranks on the given hosts, where shmOK[r] says whether rank r has a
// shared-memory listener.
func IntraLinkIsShm(hosts []string, shmOK []bool) bool {
	var peers []wire.PeerInfo
	for r, h := range hosts {
		s := hostSummary{CPUs: 2, NetNS: "net:[1]"}
		if shmOK[r] {
			s.Shm = fmt.Sprint("@shm", r)
		}
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: h, Topology: s.encode()})
	}
	return intraLink(peers, tcpLink) == func() algorithms.LinkModel { l := shmLink; l.MaxChannels = tcpLink.MaxChannels; return l }()
}

// SplitPart is what a rank tells the others in Split's exchange.
type SplitPart struct {
	Color, Key int
	Port       int64
	Info       []byte
	Failed     bool
}

// SplitExchange is Split's exchange over c: every rank's part, by rank.
func (c *Comm) SplitExchange(ctx context.Context, me SplitPart) ([]SplitPart, error) {
	parts, err := c.splitExchange(ctx, splitPart{color: me.Color, key: me.Key, port: me.Port, info: me.Info, failed: me.Failed})
	out := make([]SplitPart, len(parts))
	for r, p := range parts {
		out[r] = SplitPart{Color: p.color, Key: p.key, Port: p.port, Info: p.info, Failed: p.failed}
	}
	return out, err
}

// SplitInline is how many PeerInfo bytes travel in the exchange's first
// all-gather.
const SplitInline = splitInline

// SplitRecord is a rank's record in Split's exchange, in bytes.
const SplitRecord = splitRecord

// LocalRootAddr is where a split child's root listens on one host.
func LocalRootAddr(secret [16]byte, pid uint32) string { return localRootAddr(secret, pid) }

// Oversubscribed is oversubscribed for ranks on the given hosts, each
// host with cpus CPUs, asked for host.
func Oversubscribed(hosts []string, cpus int, host string) bool {
	var peers []wire.PeerInfo
	for r, h := range hosts {
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: h, Topology: hostSummary{CPUs: cpus}.encode()})
	}
	return summarize(peers)[host].oversubscribed()
}

// OversubscribedSets is oversubscribed for ranks on the given hosts,
// rank r allowed the CPUs of bit mask sets[r] (0: it published no set and
// reports 2 CPUs).
func OversubscribedSets(hosts []string, sets []uint64, host string) bool {
	var peers []wire.PeerInfo
	for r, h := range hosts {
		s := hostSummary{CPUs: 2}
		if sets[r] != 0 {
			s.CPUs = bits.OnesCount64(sets[r])
			s.CPUMask = binary.LittleEndian.AppendUint64(nil, sets[r])
		}
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: h, Topology: s.encode()})
	}
	return summarize(peers)[host].oversubscribed()
}

// OversubscribedOn is oversubscribed for ranks on the given hosts, rank r
// on machine machines[r] ("": unknown) allowed the CPUs of bit mask
// sets[r]; ChannelsPerRank is channelsPerRank for the same ranks.
func OversubscribedOn(hosts, machines []string, sets []uint64, host string) (bool, int) {
	var peers []wire.PeerInfo
	for r, h := range hosts {
		s := hostSummary{CPUs: bits.OnesCount64(sets[r]), CPUMask: binary.LittleEndian.AppendUint64(nil, sets[r]), Machine: machines[r]}
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: h, Topology: s.encode()})
	}
	l := summarize(peers)
	return l[host].oversubscribed(), channelsPerRank(l)
}

// CPUMaskRoundTrip encodes a host summary with CPU set m and decodes it
// back.
func CPUMaskRoundTrip(m []byte) ([]byte, uint32, bool) {
	h, ok := decodeHostSummary(hostSummary{CPUs: 3, NetMbps: 7, CPUMask: m, Machine: "boot-id"}.encode())
	return h.CPUMask, h.NetMbps, ok && h.Machine == "boot-id"
}

// CPUMask is this process's CPU set as a host summary carries it.
var CPUMask = cpuMask

// AnyOversubscribed is anyOversubscribed for ranks on the given hosts,
// each host with cpus CPUs.
func AnyOversubscribed(hosts []string, cpus int) bool {
	var peers []wire.PeerInfo
	for r, h := range hosts {
		peers = append(peers, wire.PeerInfo{Rank: uint32(r), HostID: h, Topology: hostSummary{CPUs: cpus}.encode()})
	}
	return anyOversubscribed(summarize(peers))
}

// TCPLinkModel and ShmLinkModel are the tuner's models of the transports.
var TCPLinkModel, ShmLinkModel = tcpLink, shmLink
