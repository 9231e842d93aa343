package collective

import (
	"fmt"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/topology"
)

// deviceLinkFor is the tuner's model of the links a local group's device
// operations take (engine.Config.DeviceLink): its ranks' GPUs move device
// memory to each other's directly, so the model is the ring NCCL's
// search finds over those GPUs in sys (topology.Ring.LinkModel: the
// ring's per-channel bandwidth and channel count, NCCL's hop latency for
// its worst link kind), with at most maxChannels channels sharing the
// ring's bandwidth. It is the zero
// model (device operations tuned as host ones) without a topology, when a
// rank has no GPU or its GPU has no PCI bus id or is not in sys, or when
// ranks share a GPU (their copies are then within one device). why says
// which, or what the model is.
func deviceLinkFor(sys *topology.System, devOf func(int) Device, n, maxChannels int) (algorithms.LinkModel, string) {
	if sys == nil {
		return algorithms.LinkModel{}, "no topology"
	}
	if n < 2 {
		return algorithms.LinkModel{}, "one rank"
	}
	t, err := topology.Build(sys)
	if err != nil {
		return algorithms.LinkModel{}, fmt.Sprintf("topology: %v", err)
	}
	gpus := make([]*topology.Node, n)
	seen := map[*topology.Node]int{}
	for r := range n {
		d := devOf(r)
		if d == nil {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d has no GPU", r)
		}
		bus := d.Info().PCIBusID
		if bus == "" {
			return algorithms.LinkModel{}, fmt.Sprintf("rank %d's GPU has no PCI bus id", r)
		}
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
