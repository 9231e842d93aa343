package topology

import (
	"fmt"
	"math"

	"github.com/goccl/goccl/algorithms"
)

// Per-channel speeds (GB/s) the search tries, highest first: NCCL's
// speedArrayIntra/Inter (src/graph/search.cc at 5067397), by the lowest
// compute capability present.
var (
	speedIntraDefault = []float64{40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3}
	speedInterDefault = []float64{48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12}
	speedIntraSM90    = []float64{60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3}
	speedInterSM90    = []float64{48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12}
	speedIntraSM100   = []float64{90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18}
	speedInterSM100   = []float64{96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12}
)

// maxChannels is the most ring channels NCCL searches for (MAXCHANNELS/2).
const maxChannels = 32

func speeds(sm int, inter bool) []float64 {
	switch {
	case sm >= 100 && inter:
		return speedInterSM100
	case sm >= 100:
		return speedIntraSM100
	case sm >= 90 && inter:
		return speedInterSM90
	case sm >= 90:
		return speedIntraSM90
	case inter:
		return speedInterDefault
	}
	return speedIntraDefault
}

// Ring is the result of a ring search over one host's GPUs.
type Ring struct {
	Order    []*Node  // the GPUs in ring order
	Channels int      // rings run in parallel (each its own connections)
	BW       float64  // GB/s each channel may use on every hop
	Type     PathType // the worst hop's path type
	MinSM    int
}

// Total is what the channels carry together: NCCL's busBw for a ring
// with the Simple protocol.
func (r Ring) Total() float64 { return float64(r.Channels) * r.BW }

func (r Ring) String() string {
	s := ""
	for i, g := range r.Order {
		if i > 0 {
			s += " -> "
		}
		s += g.Name
	}
	return fmt.Sprintf("%s (%d channels × %.4g GB/s, worst hop %v)", s, r.Channels, r.BW, r.Type)
}

// SearchRing finds a ring order over gpus (one host's) and the channels
// it supports, as NCCL's ncclTopoCompute does for the ring pattern: try
// per-channel speeds from NCCL's speed array, highest first; at each, an
// order whose hops' paths leave room for the most channels (every channel
// takes its speed from every link each hop crosses); keep the order and
// speed with the most total bandwidth; then split channels in two while
// each is fast (ncclTopoDupChannels). Orders are tried exhaustively up to 9
// GPUs (the first fixed), greedily beyond.
func (t *Topo) SearchRing(gpus []*Node) (Ring, error) {
	if len(gpus) == 0 {
		return Ring{}, fmt.Errorf("topology: no GPUs to search a ring over")
	}
	minSM := math.MaxInt
	for _, g := range gpus {
		sm := 0
		if g.GPU != nil {
			sm = g.GPU.SM
		}
		minSM = min(minSM, sm)
	}
	if len(gpus) == 1 {
		return Ring{Order: gpus, Channels: 1, BW: LocBW, Type: LOC, MinSM: minSM}, nil
	}
	for i, a := range gpus {
		for _, b := range gpus[i+1:] {
			if t.Path(a, b).Type == DIS {
				return Ring{}, fmt.Errorf("topology: %s and %s are not connected (different hosts?)", a.Name, b.Name)
			}
		}
	}
	// The fastest any GPU reaches another bounds the speeds worth trying.
	maxBW := 0.0
	for _, a := range gpus {
		for _, b := range gpus {
			if a != b {
				maxBW = max(maxBW, t.Path(a, b).BW)
			}
		}
	}
	orders := candidateOrders(t, gpus)
	best := Ring{MinSM: minSM}
	for _, s := range speeds(minSM, false) {
		if s > maxBW {
			continue
		}
		for _, o := range orders {
			ch, typ := t.ringChannels(o, s)
			ch = min(ch, maxChannels)
			if ch == 0 {
				continue
			}
			if float64(ch)*s > best.Total()+1e-9 || (float64(ch)*s >= best.Total()-1e-9 && typ < best.Type && best.Channels > 0) {
				best = Ring{Order: o, Channels: ch, BW: s, Type: typ, MinSM: minSM}
			}
		}
	}
	if best.Channels == 0 {
		// NCCL's fallback: PCI order, one slow channel.
		o := append([]*Node(nil), gpus...)
		_, typ := t.ringChannels(o, 0)
		return Ring{Order: o, Channels: 1, BW: 0.1, Type: typ, MinSM: minSM}, nil
	}
	// ncclTopoDupChannels: split fast channels in two.
	if best.BW >= 25 && !(minSM > 80 && best.BW < 50 && best.Channels > 4) && best.Channels*2 <= maxChannels {
		best.Channels *= 2
		best.BW /= 2
	}
	return best, nil
}

// ringChannels returns how many channels of speed s the ring order o
// supports, and its worst hop type.
func (t *Topo) ringChannels(o []*Node, s float64) (int, PathType) {
	use := map[*Link]int{}
	worst := LOC
	for i, a := range o {
		b := o[(i+1)%len(o)]
		p := t.Path(a, b)
		worst = max(worst, p.Type)
		for _, l := range p.Links {
			use[l]++
		}
	}
	if s == 0 {
		return 0, worst
	}
	ch := math.MaxInt
	for l, n := range use {
		ch = min(ch, int(math.Floor(l.BW/(s*float64(n))+1e-9)))
	}
	return ch, worst
}

// candidateOrders lists the ring orders to try.
func candidateOrders(t *Topo, gpus []*Node) [][]*Node {
	if len(gpus) <= 9 {
		var out [][]*Node
		rest := append([]*Node(nil), gpus[1:]...)
		permute(rest, 0, func(p []*Node) {
			out = append(out, append([]*Node{gpus[0]}, p...))
		})
		return out
	}
	// Greedy: from each start, go to the best next GPU (type, then bw).
	var out [][]*Node
	for _, start := range gpus {
		o := []*Node{start}
		used := map[*Node]bool{start: true}
		for len(o) < len(gpus) {
			cur := o[len(o)-1]
			var next *Node
			for _, g := range gpus {
				if used[g] {
					continue
				}
				if next == nil || better(t.Path(cur, g), t.Path(cur, next)) {
					next = g
				}
			}
			o = append(o, next)
			used[next] = true
		}
		out = append(out, o)
	}
	return out
}

func permute(a []*Node, k int, f func([]*Node)) {
	if k == len(a) {
		f(a)
		return
	}
	for i := k; i < len(a); i++ {
		a[k], a[i] = a[i], a[k]
		permute(a, k+1, f)
		a[k], a[i] = a[i], a[k]
	}
}

// Tree is the tree pattern for all-reduce: within a host, a chain in ring
// order; across hosts, NCCL's double binary tree over the hosts
// (algorithms.DoubleBinaryTree), each host entering at its chain's head.
type Tree struct {
	Chain []*Node // one host's chain
	// Parents[t][h] is host h's parent in tree t (-1 at a root).
	Parents [2][]int
}

// TreeFor returns the tree for nodes hosts over a ring order.
func TreeFor(r Ring, nodes int) Tree {
	tr := Tree{Chain: r.Order}
	for k := 0; k < 2; k++ {
		tr.Parents[k] = make([]int, nodes)
		for h := 0; h < nodes; h++ {
			p, _ := algorithms.DoubleBinaryTree(nodes, h, k)
			tr.Parents[k][h] = p
		}
	}
	return tr
}
