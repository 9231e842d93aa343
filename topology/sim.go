package topology

import (
	"fmt"
	"math"
	"slices"

	"github.com/goccl/goccl/algorithms"
)

// NCCL's latency model (src/graph/tuning.cc at 5067397), µs, for the
// Simple protocol: a base per operation, then a hardware latency per step
// by link kind.
const (
	baseLatRing                = 8.4
	baseLatTree                = 8.4
	hwLatNVLRing, hwLatNVLTree = 3.4, 4.0
	hwLatPCIRing, hwLatPCITree = 5.7, 4.0
	hwLatNetRing, hwLatNetTree = 14.0, 14.0
	netOverhead                = 1.0 * 3 // per intra step on multi-node rings (Intel; ×3 for Simple)
	treeEfficiency             = 0.92
)

// perChMaxTreeBw caps a tree channel (GB/s) by generation (Volta, Ampere,
// Hopper, Blackwell) and node count (1, 2, more): tuning.cc.
var perChMaxTreeBw = [4][3]float64{{26.5, 18.5, 10}, {24, 23.6, 17.8}, {38.7, 41.4, 36}, {70, 42.8, 24}}

// Layout is a job shape: identical hosts, each running GPUsPerNode ranks.
type Layout struct {
	Nodes, GPUsPerNode int
}

// Model is the simulation of all-reduce on a layout: the rings and the
// bandwidths and latencies NCCL's tuner would use.
type Model struct {
	Layout    Layout
	Ring      Ring
	Tree      Tree
	NICs      int     // network ports per host the channels use
	NetBW     float64 // per port, GB/s, after the GPU-to-NIC path
	InterBW   float64 // per channel across hosts, GB/s
	Channels  int
	RingBus   float64 // ring busbw asymptote, GB/s
	TreeBus   float64 // tree busbw asymptote, GB/s (multi-node)
	RingLatUs float64
	TreeLatUs float64
	// HierBus and HierLatUs model goccl's hierarchical all-reduce
	// (algorithms.Hier; NCCL has no such pattern outside CollNet): a
	// reduce-scatter and an all-gather over each host's ring, and the
	// host's ports carrying 2(h-1)/h of the data for all its GPUs. Zero
	// on one host or with one GPU per host, where it is the ring.
	HierBus   float64
	HierLatUs float64
	// HierTreeBus and HierTreeLatUs are the same with a double binary
	// tree of hosts across (algorithms.HierTree): 2·log2 h network
	// latencies instead of 2(h-1), the ports carrying 2 times the data.
	HierTreeBus   float64
	HierTreeLatUs float64
}

// Prediction is the simulated result at one size.
type Prediction struct {
	Bytes  int64
	Algo   string // ring or tree, whichever is faster
	TimeUs float64
	BusBW  float64 // GB/s, nccl-tests' definition
}

// Simulate predicts all-reduce on l, every host shaped like the first
// host of t (across hosts, the first with network ports: its first
// GPUsPerNode GPUs and its NICs), as NCCL's
// ncclTopoGetAlgoTime would: time = latency + bytes / algorithm
// bandwidth, for the ring and (across hosts) the tree, the faster winning.
func Simulate(t *Topo, l Layout) (*Model, error) {
	if l.Nodes < 1 || l.GPUsPerNode < 1 {
		return nil, fmt.Errorf("topology: layout %d×%d: want at least one node and one GPU per node", l.Nodes, l.GPUsPerNode)
	}
	hosts := t.Sys.Hosts()
	if len(hosts) == 0 {
		return nil, fmt.Errorf("topology: the document has no host (no <cpu> element) to model")
	}
	host := hosts[0]
	if l.Nodes > 1 {
		// Across hosts, model the first host that has network ports.
		for _, h := range hosts {
			if slices.ContainsFunc(t.NICs, func(n *Node) bool { return n.Host == h && len(n.NICs) > 0 }) {
				host = h
				break
			}
		}
	}
	gpus := t.GPUsOf(host)
	if len(gpus) < l.GPUsPerNode {
		return nil, fmt.Errorf("topology: layout wants %d GPUs per node, the host modelled (%s) has %d", l.GPUsPerNode, host, len(gpus))
	}
	gpus = gpus[:l.GPUsPerNode]
	ring, err := t.SearchRing(gpus)
	if err != nil {
		return nil, err
	}
	m := &Model{Layout: l, Ring: ring, Tree: TreeFor(ring, l.Nodes), Channels: ring.Channels}
	nRanks := l.Nodes * l.GPUsPerNode
	intraLat := hwLatPCIRing
	intraTree := hwLatPCITree
	if ring.Type <= NVL {
		intraLat, intraTree = hwLatNVLRing, hwLatNVLTree
	}
	busBW := ring.Total()
	if l.Nodes > 1 {
		// Across hosts each channel leaves a host through one network
		// port and enters through another; the ports of a host carry
		// all channels together.
		var ports []float64
		for _, nic := range t.NICs {
			if nic.Host != host || len(nic.NICs) == 0 {
				continue
			}
			best := 0.0
			for _, g := range gpus {
				best = max(best, t.Path(g, nic).BW)
			}
			for _, net := range nic.NICs {
				bw := math.Min(best, t.Path(nic, net).BW)
				ports = append(ports, bw)
			}
		}
		if len(ports) == 0 {
			return nil, fmt.Errorf("topology: %d nodes need network ports, and no host has one with a known speed", l.Nodes)
		}
		m.NICs = min(len(ports), l.GPUsPerNode)
		m.NetBW = ports[0]
		for _, p := range ports[:m.NICs] {
			m.NetBW = math.Min(m.NetBW, p)
		}
		var sp float64
		for _, s := range speeds(ring.MinSM, true) {
			if s <= m.NetBW+1e-9 {
				sp = s
				break
			}
		}
		if sp == 0 {
			sp = m.NetBW
		}
		m.InterBW = sp
		interCh := int(math.Floor(float64(m.NICs)*m.NetBW/sp + 1e-9))
		m.Channels = max(1, min(interCh, maxChannels))
		busBW = math.Min(busBW, float64(m.Channels)*sp)
		intraLat = math.Max(intraLat, netOverhead)
	}
	m.RingBus = busBW
	nsteps := 2 * (nRanks - 1)
	nInter := 2 * (l.Nodes - 1)
	m.RingLatUs = baseLatRing + float64(nsteps-nInter)*intraLat + float64(nInter)*hwLatNetRing
	if l.Nodes > 1 {
		gen := 2 // Hopper
		switch {
		case ring.MinSM >= 100:
			gen = 3
		case ring.MinSM < 80:
			gen = 0
		case ring.MinSM < 90:
			gen = 1
		}
		col := min(l.Nodes-1, 2)
		m.TreeBus = math.Min(treeEfficiency*busBW, float64(m.Channels)*perChMaxTreeBw[gen][col])
		m.TreeLatUs = baseLatTree + 2*(float64(l.GPUsPerNode-1)*intraTree+math.Log2(float64(l.Nodes))*hwLatNetTree)
	}
	if l.Nodes > 1 && l.GPUsPerNode > 1 {
		h, g, n := float64(l.Nodes), float64(l.GPUsPerNode), float64(nRanks)
		// Seconds per byte of the operation: the host's ring moves
		// 2(g-1)/g of it at the ring's busbw, the host's ports 2(h-1)/h
		// at their sum; pieces pipeline, so the slower one counts.
		perByte := math.Max(2*(g-1)/g/ring.Total(), 2*(h-1)/h/(float64(m.NICs)*m.NetBW))
		m.HierBus = 2 * (n - 1) / n / perByte
		m.HierLatUs = baseLatRing + 2*(g-1)*intraLat + 2*(h-1)*hwLatNetRing
		perByte = math.Max(2*(g-1)/g/ring.Total(), 2/(float64(m.NICs)*m.NetBW))
		m.HierTreeBus = 2 * (n - 1) / n / perByte
		m.HierTreeLatUs = baseLatTree + 2*(g-1)*intraLat + 2*math.Log2(h)*hwLatNetTree
	}
	return m, nil
}

// PredictEach returns the model's all-reduce at size bytes for each
// algorithm it models: ring, then tree, hier and hiertree where they
// apply.
func (m *Model) PredictEach(bytes int64) []Prediction {
	n := m.Layout.Nodes * m.Layout.GPUsPerNode
	factor := 1.0
	if n > 1 {
		factor = 2 * float64(n-1) / float64(n)
	}
	// Ring and hier: algbw = busbw · n / (2(n-1)); tree: algbw = busbw / 2.
	mk := func(algo string, lat, busBW, algFactor float64) Prediction {
		p := Prediction{Bytes: bytes, Algo: algo, TimeUs: lat}
		if n > 1 {
			p.TimeUs += float64(bytes) / (1000 * busBW / algFactor)
			p.BusBW = float64(bytes) / p.TimeUs / 1000 * factor
		}
		return p
	}
	out := []Prediction{mk("ring", m.RingLatUs, m.RingBus, factor)}
	if n == 1 {
		out[0].TimeUs = baseLatRing
		return out
	}
	if m.TreeBus > 0 {
		out = append(out, mk("tree", m.TreeLatUs, m.TreeBus, 2)) // tree algbw = busbw / 2
	}
	if m.HierBus > 0 {
		out = append(out, mk("hier", m.HierLatUs, m.HierBus, factor))
	}
	if m.HierTreeBus > 0 {
		out = append(out, mk("hiertree", m.HierTreeLatUs, m.HierTreeBus, factor))
	}
	return out
}

// Predict returns the model's all-reduce time and bus bandwidth at size
// bytes with NCCL's choice: the faster of ring and tree.
func (m *Model) Predict(bytes int64) Prediction {
	return Fastest(m.PredictEach(bytes), "ring", "tree")
}

// Fastest returns the quickest of ps among the algorithms named (all of
// them when none is), the first of equals.
func Fastest(ps []Prediction, algos ...string) Prediction {
	var best Prediction
	found := false
	for _, p := range ps {
		if len(algos) > 0 && !slices.Contains(algos, p.Algo) {
			continue
		}
		if !found || p.TimeUs < best.TimeUs {
			best, found = p, true
		}
	}
	return best
}

// LinkModel is what the tuner needs from a ring search: per-channel
// bandwidth, channel count and the per-hop latency NCCL's model charges
// for the ring's worst link kind (Simple protocol). A GPU channel keeps
// its whole buffer in flight (NCCL's DEFAULT_BUFFSIZE, 4 MiB, for
// Simple), so the pipeline pays a hop's latency per 4 MiB, not per slice.
func (r Ring) LinkModel() algorithms.LinkModel {
	lat := hwLatPCIRing
	if r.Type <= NVL {
		lat = hwLatNVLRing
	}
	return algorithms.LinkModel{
		Latency:      lat * 1e-6,
		Bandwidth:    r.BW * 1e9,
		MaxChannels:  max(1, r.Channels),
		ChannelBytes: 1 << 20,
		ChunkBytes:   4 << 20,
	}
}

// CorePredict is the same prediction from goccl's own cost model
// (algorithms.Cost, a ring over the model's channels with the ring's link
// model, its bandwidth limited by the network across hosts and its hop
// latency the mean of NCCL's model for this ring).
func (m *Model) CorePredict(bytes int64) Prediction {
	n := m.Layout.Nodes * m.Layout.GPUsPerNode
	lm := m.Ring.LinkModel()
	lm.MaxChannels = m.Channels
	lm.Bandwidth = m.RingBus / float64(m.Channels) * 1e9
	if n > 1 {
		// The mean hop latency of NCCL's model for this ring (network
		// hops are few in a multi-node ring, but slow).
		lm.Latency = (m.RingLatUs - baseLatRing) / float64(2*(n-1)) * 1e-6
	}
	secs := algorithms.Cost(algorithms.Problem{Coll: algorithms.CollAllReduce, NRanks: n, Bytes: bytes, Link: lm}, algorithms.Ring, m.Channels)
	p := Prediction{Bytes: bytes, Algo: "ring", TimeUs: secs * 1e6}
	if n > 1 && secs > 0 {
		p.BusBW = float64(bytes) / secs / 1e9 * 2 * float64(n-1) / float64(n)
	}
	return p
}
