package collective

import (
	"fmt"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/topology"
)

// deviceLinkFor is the tuner's model of the links a local group's device
// operations take (engine.Config.DeviceLink): its ranks' GPUs move device
// memory to each other's directly, so the model is the ring NCCL's
// search finds over those GPUs in sys (busRing). It is the zero model
// (device operations tuned as host ones) without a topology, or when a
// rank has no GPU or its GPU no PCI bus id. why says which, or what the
// model is.
func deviceLinkFor(sys *topology.System, devOf func(int) Device, n, maxChannels int) (algorithms.LinkModel, string) {
	if sys == nil {
		return algorithms.LinkModel{}, "no topology"
	}
	buses := make([]string, n)
	for r := range n {
		d := devOf(r)
		if d == nil {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d has no GPU", r)
		}
		if buses[r] = d.Info().PCIBusID; buses[r] == "" {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d's GPU has no PCI bus id", r)
		}
	}
	return busRing(sys, buses, maxChannels)
}

// deviceLinkOfJob is deviceLinkFor for the ranks of a job made by Init,
// by the GPUs they publish in their host summaries: only where every rank
// shares one host and reaches the others over shared memory with device
// slots in the receiver's GPU (CUDA IPC, not GOCCL_P2P_DISABLE), as the
// ranks of a local group move device memory. Every rank computes it from
// the same table and, on one host, the same topology.
func deviceLinkOfJob(sys *topology.System, peers []wire.PeerInfo, allShm, p2p bool, maxChannels int) (algorithms.LinkModel, string) {
	switch {
	case sys == nil:
		return algorithms.LinkModel{}, "no topology"
	case len(peers) < 2:
		return algorithms.LinkModel{}, "one rank"
	case hostLabels(peers) != nil:
		return algorithms.LinkModel{}, "ranks on several hosts"
	case !allShm || !p2p:
		return algorithms.LinkModel{}, "device data staged in host memory (not every pair over shared memory with CUDA IPC)"
	}
	buses := make([]string, len(peers))
	for r, p := range peers {
		s, _ := decodeHostSummary(p.Topology)
		if buses[r] = s.GPUBus; buses[r] == "" {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d names no GPU bus id", r)
		}
	}
	return busRing(sys, buses, maxChannels)
}

// busRing is the ring NCCL's search finds over the GPUs at buses (one per
// rank, all different) in sys, as topology.Ring.LinkModel gives it: the
// per-channel bandwidth and channel count, NCCL's hop latency for its
// worst link kind, with at most maxChannels channels sharing the ring's
// bandwidth. The zero model where a GPU is not in sys or ranks share one
// (their copies are then within one device).
func busRing(sys *topology.System, buses []string, maxChannels int) (algorithms.LinkModel, string) {
	if len(buses) < 2 {
		return algorithms.LinkModel{}, "one rank"
	}
	t, err := topology.Build(sys)
	if err != nil {
		return algorithms.LinkModel{}, fmt.Sprintf("topology: %v", err)
	}
	gpus := make([]*topology.Node, len(buses))
	seen := map[*topology.Node]int{}
	for r, bus := range buses {
		g, ok := t.GPUByBusID("", bus)
		if !ok {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d's GPU (%s) is not in the topology", r, bus)
		}
		if q, ok := seen[g]; ok {
			return algorithms.LinkModel{}, fmt.Sprintf("ranks %d and %d share GPU %s", q, r, bus)
		}
		seen[g], gpus[r] = r, g
	}
	ring, err := t.SearchRing(gpus)
	if err != nil {
		return algorithms.LinkModel{}, fmt.Sprintf("ring search: %v", err)
	}
	lm := ring.LinkModel()
	// Fewer channels than the ring's carry its bandwidth between them.
	total := lm.Bandwidth * float64(lm.MaxChannels)
	lm.MaxChannels = min(lm.MaxChannels, max(1, maxChannels))
	lm.Bandwidth = total / float64(lm.MaxChannels)
	if err := lm.Validate(); err != nil {
		return algorithms.LinkModel{}, fmt.Sprintf("ring %v: %v", ring, err)
	}
	return lm, ring.String()
}
