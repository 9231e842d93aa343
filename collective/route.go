package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// Transport names, for Config.Transport and GOCCL_TRANSPORT.
const (
	TransportAuto = "auto" // shared memory between ranks that share a host, TCP otherwise
	TransportTCP  = "tcp"  // TCP for every pair
	TransportShm  = "shm"  // shared memory for every pair; an error if some pair cannot
	// TransportVerbs is RDMA (InfiniBand, RoCE) for every pair; an error
	// if some pair cannot.
	TransportVerbs = "verbs"
)

// hostSummary is what a rank tells the others about itself and its host,
// in PeerInfo.Topology: its CPU count (the topology issue will grow this
// into the full system document), its network namespace, the address of
// its shared-memory listener ("" when it has none), and the control
// address of its RDMA transport ("" when it has no usable port), with
// whether it forces RDMA.
type hostSummary struct {
	CPUs       int
	NetNS      string
	Shm        string
	Verbs      string
	ForceVerbs bool
	// EmulatedIB: the port is the emulated test device, whose data
	// movement is a memory copy (its connections take shared memory's
	// slot shape).
	EmulatedIB bool
	// NICs are the data addresses of the rank's TCP listeners on its
	// other network interfaces (named NICNames), when GOCCL_SOCKET_IFNAME
	// chose several.
	NICs, NICNames []string
	// NetMbps is the sum of the link speeds (sysfs) of the interfaces its
	// TCP connections use, in megabits per second; 0 where any is unknown.
	NetMbps uint32
	// IBMbps is the rate of its RDMA port (ibv_port_attr's active width
	// and speed), in megabits per second; 0 where it has none, where the
	// rate is unknown, or for the emulated test device.
	IBMbps uint32
	// CPUMask is the set of CPUs the rank may run on (cpuMask; nil:
	// unknown), so that ranks bound to cores of their own (as launchers
	// bind them) do not count as sharing them (summarize).
	CPUMask []byte
	// Machine is the kernel the rank runs under (netif.MachineID; "":
	// unknown): ranks of several hosts on one machine share its CPUs
	// (summarize).
	Machine string
	// GPUBus is the PCI bus id of the rank's GPU ("": none, or unknown),
	// for the device operations' link model (deviceLinkOfJob).
	GPUBus string
}

const summaryVersion = 6

func (h hostSummary) encode() []byte {
	f := byte(0)
	if h.ForceVerbs {
		f |= 1
	}
	if h.EmulatedIB {
		f |= 2
	}
	b := []byte{summaryVersion, byte(h.CPUs >> 8), byte(h.CPUs), f}
	for _, s := range []string{h.NetNS, h.Shm, h.Verbs} {
		b = appendShort(b, s)
	}
	n := min(len(h.NICs), len(h.NICNames), maxSummaryNICs)
	b = append(b, byte(n))
	for i := range n {
		b = appendShort(appendShort(b, h.NICs[i]), h.NICNames[i])
	}
	b = binary.BigEndian.AppendUint32(b, h.NetMbps)
	b = binary.BigEndian.AppendUint32(b, h.IBMbps)
	b = appendShort(appendShort(b, h.Machine), h.GPUBus)
	if len(h.CPUMask) > 0 && len(h.CPUMask) <= 255 {
		b = appendShort(b, string(h.CPUMask))
	}
	return b
}

// maxSummaryNICs bounds the interfaces a host summary lists.
const maxSummaryNICs = 16

// appendShort appends s with a one-byte length, cut to 255 bytes.
func appendShort(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	return append(append(b, byte(len(s))), s...)
}

// readShort reads what appendShort wrote from the front of b.
func readShort(b []byte) (s string, rest []byte, ok bool) {
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return "", nil, false
	}
	return string(b[1 : 1+int(b[0])]), b[1+int(b[0]):], true
}

func decodeHostSummary(b []byte) (hostSummary, bool) {
	if len(b) < 4 || b[0] != summaryVersion {
		return hostSummary{}, false
	}
	h := hostSummary{CPUs: int(b[1])<<8 | int(b[2]), ForceVerbs: b[3]&1 != 0, EmulatedIB: b[3]&2 != 0}
	b = b[4:]
	ok := true
	for _, dst := range []*string{&h.NetNS, &h.Shm, &h.Verbs} {
		if *dst, b, ok = readShort(b); !ok {
			return hostSummary{}, false
		}
	}
	if len(b) < 1 || b[0] > maxSummaryNICs {
		return hostSummary{}, false
	}
	n := int(b[0])
	b = b[1:]
	for range n {
		var addr, name string
		if addr, b, ok = readShort(b); !ok {
			return hostSummary{}, false
		}
		if name, b, ok = readShort(b); !ok {
			return hostSummary{}, false
		}
		h.NICs, h.NICNames = append(h.NICs, addr), append(h.NICNames, name)
	}
	if len(b) < 8 {
		return hostSummary{}, false
	}
	h.NetMbps, h.IBMbps = binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
	if h.Machine, b, ok = readShort(b[8:]); !ok {
		return hostSummary{}, false
	}
	if h.GPUBus, b, ok = readShort(b); !ok {
		return hostSummary{}, false
	}
	if len(b) > 0 {
		// The CPU set, where the rank could read it.
		m, rest, ok := readShort(b)
		if !ok || len(rest) > 0 {
			return hostSummary{}, false
		}
		h.CPUMask = []byte(m)
	}
	return h, true
}

// netNamespace names this process's network namespace ("net:[4026531840]"),
// or "" where there is no such thing. Ranks in different namespaces cannot
// reach each other's abstract Unix sockets, so they do not share memory
// even on one host.
func netNamespace() string {
	s, _ := os.Readlink("/proc/self/ns/net")
	return s
}

// sharesMemory reports whether ranks a and b can use the shared-memory
// transport, and if not, why. Every rank computes it from the same table,
// so both sides of a pair agree.
func sharesMemory(a, b wire.PeerInfo) (bool, string) {
	sa, _ := decodeHostSummary(a.Topology)
	sb, _ := decodeHostSummary(b.Topology)
	switch {
	case a.HostID != b.HostID:
		return false, fmt.Sprintf("rank %d is on host %q, rank %d on %q", a.Rank, a.HostID, b.Rank, b.HostID)
	case sa.NetNS != sb.NetNS:
		return false, fmt.Sprintf("ranks %d and %d are in different network namespaces (%s, %s)", a.Rank, b.Rank, sa.NetNS, sb.NetNS)
	case sa.Shm == "":
		return false, fmt.Sprintf("rank %d has no shared-memory transport (GOCCL_TRANSPORT=tcp there, or not Linux)", a.Rank)
	case sb.Shm == "":
		return false, fmt.Sprintf("rank %d has no shared-memory transport (GOCCL_TRANSPORT=tcp there, or not Linux)", b.Rank)
	}
	return true, ""
}

// routes decides, for every peer of rank, "shm", "verbs" or "tcp", and
// whether any pair of the whole job goes over the network (TCP or
// verbs), which sets the slot shape every rank must agree on. Every rank
// computes it from the same table, so both ends of a pair agree: a pair
// uses verbs when both ends have a port and one forces it, else shared
// memory when it can, else verbs when both ends have a port, else TCP.
func routes(peers []wire.PeerInfo, rank int, mode string) (route []string, anyNet bool, err error) {
	route = make([]string, len(peers))
	for i := range peers {
		for j := i + 1; j < len(peers); j++ {
			r, why := pairRoute(peers[i], peers[j])
			if r != TransportShm {
				anyNet = true
			}
			if i != rank && j != rank {
				continue
			}
			peer := i + j - rank
			switch {
			case mode == TransportShm && r != TransportShm:
				return nil, false, fmt.Errorf("%w: GOCCL_TRANSPORT=shm, but rank %d cannot reach rank %d over shared memory: %s",
					ErrInvalidArgument, rank, peer, why)
			case mode == TransportVerbs && r != TransportVerbs:
				return nil, false, fmt.Errorf("%w: GOCCL_TRANSPORT=verbs, but rank %d cannot reach rank %d over RDMA: %s",
					ErrInvalidArgument, rank, peer, why)
			}
			route[peer] = r
		}
	}
	route[rank] = "self"
	return route, anyNet, nil
}

// pairRoute is the transport of ranks a and b, and why not the one a
// rank may have forced.
func pairRoute(a, b wire.PeerInfo) (string, string) {
	sa, _ := decodeHostSummary(a.Topology)
	sb, _ := decodeHostSummary(b.Topology)
	rdma := sa.Verbs != "" && sb.Verbs != ""
	noRDMA := ""
	switch {
	case sa.Verbs == "":
		noRDMA = fmt.Sprintf("rank %d has no usable RDMA port (its INFO log says why)", a.Rank)
	case sb.Verbs == "":
		noRDMA = fmt.Sprintf("rank %d has no usable RDMA port (its INFO log says why)", b.Rank)
	}
	if rdma && (sa.ForceVerbs || sb.ForceVerbs) {
		return TransportVerbs, ""
	}
	ok, why := sharesMemory(a, b)
	switch {
	case ok:
		return TransportShm, "they share memory, and neither forces RDMA"
	case rdma:
		return TransportVerbs, why
	}
	if noRDMA != "" {
		why = noRDMA + "; " + why
	}
	return TransportTCP, why
}

// routedEndpoint sends each peer's connections through the transport its
// route names.
type routedEndpoint struct {
	byPeer []transport.Endpoint
	all    []transport.Endpoint
	caps   transport.Caps
}

func (r *routedEndpoint) Connect(ctx context.Context, peer, ch int) (transport.Conn, error) {
	if peer < 0 || peer >= len(r.byPeer) || r.byPeer[peer] == nil {
		return nil, &transport.PeerError{Peer: peer, Op: "connect", Err: errors.New("no such peer")}
	}
	return r.byPeer[peer].Connect(ctx, peer, ch)
}

func (r *routedEndpoint) Caps() transport.Caps { return r.caps }

func (r *routedEndpoint) Close(cause error) error {
	var errs []error
	for _, ep := range r.all {
		errs = append(errs, ep.Close(cause))
	}
	return errors.Join(errs...)
}
