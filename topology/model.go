package topology

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/gonum/graph"
	"gonum.org/v1/gonum/graph/simple"
)

// NodeType is what a graph node is (NCCL's topo.h node types).
type NodeType int

// Node types.
const (
	GPUNode NodeType = iota
	PCINode          // a PCI switch or bridge
	NVSNode          // all NVSwitches of a host, as one node
	CPUNode          // a NUMA node
	NICNode
	NetNode // one port of a NIC
)

var nodeTypeNames = [...]string{"GPU", "PCI", "NVS", "CPU", "NIC", "NET"}

func (t NodeType) String() string { return nodeTypeNames[t] }

// LinkType is what a link is (topo.h's link types; their numbers match
// the path types they produce).
type LinkType int

// Link types.
const (
	LinkLOC LinkType = 0
	LinkNVL LinkType = 1
	LinkC2C LinkType = 3
	LinkPCI LinkType = 4
	LinkSYS LinkType = 9
	LinkNET LinkType = 10
)

// PathType rates a path by its worst hop. The order and the definitions
// are NCCL's (src/include/graph.h, at commit 5067397):
//
//	LOC  the node itself
//	NVL  over NVLink (directly, or through NVSwitches)
//	NVB  over NVLink through one intermediate GPU
//	C2C  over a chip-to-chip link to the CPU
//	PIX  through at most one PCIe bridge
//	PXB  through several PCIe bridges, not the host bridge
//	P2C  GPU to NIC over C2C to the CPU, then PCIe
//	PXN  GPU to NIC through an intermediate GPU (rail-local sends)
//	PHB  through PCIe and a host bridge (the CPU)
//	SYS  through PCIe and the SMP interconnect between NUMA nodes
//	NET  through the network
//	DIS  not connected
type PathType int

// Path types.
const (
	LOC PathType = iota
	NVL
	NVB
	C2CPath
	PIX
	PXB
	P2C
	PXN
	PHB
	SYS
	NET
	DIS
)

var pathNames = [...]string{"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS"}

func (p PathType) String() string {
	if p >= 0 && int(p) < len(pathNames) {
		return pathNames[p]
	}
	return fmt.Sprintf("PathType(%d)", int(p))
}

// Bandwidths in GB/s, NCCL's constants (src/graph/topo.h at 5067397).
const (
	LocBW = 5000.0
	// Inter-CPU (SYS) links by CPU (topo.cc ncclTopoGetInterCpuBw).
	p9BW       = 32.0
	armBW      = 6.0
	erpQPIBW   = 40.0 // Intel Emerald Rapids
	srpQPIBW   = 22.0 // Intel Sapphire Rapids
	sklQPIBW   = 10.0 // Intel Skylake
	bdwQPIBW   = 6.0  // older Intel
	amdBW      = 16.0
	defaultNet = 10000 // Mb/s when a net gives no speed
)

// NVLinkBW is NCCL's per-link NVLink bandwidth (GB/s) for a GPU of
// compute capability sm (×10): ncclTopoNVLinkBw.
func NVLinkBW(sm int) float64 {
	switch {
	case sm >= 100:
		return 40.1
	case sm >= 90:
		return 20.6
	case sm == 86:
		return 12.0
	case sm >= 70:
		return 20.0
	case sm >= 60:
		return 18.0
	}
	return 20.0
}

// PCIBW is a PCI link's bandwidth: width × per-lane rate / 80, with the
// per-lane rate from the link speed (NCCL's kvDictPciGen, matched by
// prefix; unknown speeds count as 8 GT/s, a width of 0 as 16).
func PCIBW(speed string, width int) float64 {
	per := 60
	s := strings.TrimSpace(speed)
	for _, g := range []struct {
		prefix string
		v      int
	}{{"2.5 GT/s", 15}, {"5 GT/s", 30}, {"5.0 GT/s", 30}, {"8 GT/s", 60}, {"8.0 GT/s", 60}, {"16 GT/s", 120}, {"16.0 GT/s", 120},
		{"32 GT/s", 240}, {"32.0 GT/s", 240}, {"64 GT/s", 480}, {"64.0 GT/s", 480}} {
		if strings.HasPrefix(s, g.prefix) {
			per = g.v
		}
	}
	if width == 0 {
		width = 16
	}
	return float64(width*per) / 80
}

// interCPUBW is the SYS link bandwidth between two NUMA nodes of a host.
func interCPUBW(c *CPU) float64 {
	switch {
	case c.Arch == "ppc64":
		return p9BW
	case c.Arch == "arm64" || c.Arch == "aarch64":
		return armBW
	case c.Vendor == "GenuineIntel" && c.Family == 6 && c.Model >= 0xCF:
		return erpQPIBW
	case c.Vendor == "GenuineIntel" && c.Family == 6 && c.Model >= 0x8F:
		return srpQPIBW
	case c.Vendor == "GenuineIntel" && c.Family == 6 && c.Model >= 0x55:
		return sklQPIBW
	case c.Vendor == "GenuineIntel":
		return bdwQPIBW
	case c.Vendor == "AuthenticAMD":
		return amdBW
	}
	return LocBW
}

// Node is a vertex of the topology graph.
type Node struct {
	id    int64
	Type  NodeType
	Name  string // bus id, or "cpu0", "nvs", a net name
	Host  string // host hash ("" for a single host)
	NUMA  int
	Slot  bool // a GPU or NIC slot: an empty <pci> of that class in a partial file
	GPU   *GPU
	Net   *Net
	NICs  []*Node // of a NIC node: its NET nodes
	Links []*Link
}

// ID implements gonum's graph.Node.
func (n *Node) ID() int64 { return n.id }

func (n *Node) String() string { return n.Type.String() + " " + n.Name }

// Link is a directed link; every connection has one each way.
type Link struct {
	From, To *Node
	Type     LinkType
	BW       float64 // GB/s
	Count    int     // NVLinks in the bundle
}

// Path is the best path between two nodes.
type Path struct {
	Type PathType
	BW   float64 // bottleneck, GB/s
	Hops int
	// Links, in order; nil for LOC and DIS.
	Links []*Link
}

// Topo is the graph built from a System, with the best path between every
// pair of nodes.
type Topo struct {
	Sys      *System
	Nodes    []*Node
	GPUs     []*Node // document order
	NICs     []*Node
	CPUs     []*Node
	NVS      []*Node
	Graph    *simple.WeightedDirectedGraph // weights: link bandwidth
	Warnings []string
	// GDRLevel is the longest GPU–NIC path over which a NIC moves GPU
	// memory directly (GPUDirect RDMA): GOCCL_NET_GDR_LEVEL, as
	// NCCL_NET_GDR_LEVEL. Build sets DefaultGDRLevel.
	GDRLevel PathType
	paths    map[[2]int64]Path
}

// Build makes the graph of s and computes the paths. It is a pure
// function of the document.
func Build(s *System) (*Topo, error) {
	t := &Topo{Sys: s, Graph: simple.NewWeightedDirectedGraph(0, 0), paths: map[[2]int64]Path{}, GDRLevel: DefaultGDRLevel}
	byBus := map[string]*Node{} // host|busid → GPU node
	nvs := map[string]*Node{}   // host → NVS node
	var hostCPUs = map[string][]*Node{}
	type pending struct {
		gpu  *Node
		link *NVLink
	}
	var nvlinks []pending
	for _, c := range s.CPUs {
		cpu := t.add(&Node{Type: CPUNode, Name: fmt.Sprintf("cpu%d", c.NUMA), Host: c.HostHash, NUMA: c.NUMA})
		t.CPUs = append(t.CPUs, cpu)
		hostCPUs[c.HostHash] = append(hostCPUs[c.HostHash], cpu)
		var rec func(p *PCI, parent *Node) error
		rec = func(p *PCI, parent *Node) error {
			bus := normBusID(p.BusID)
			n := &Node{Name: bus, Host: c.HostHash, NUMA: c.NUMA}
			switch {
			case p.GPU != nil:
				n.Type, n.GPU = GPUNode, p.GPU
			case p.NIC != nil:
				n.Type = NICNode
			case strings.HasPrefix(p.Class, "0x03"):
				n.Type, n.Slot = GPUNode, true
			case strings.HasPrefix(p.Class, "0x02"):
				n.Type, n.Slot = NICNode, true
			case strings.HasPrefix(p.Class, "0x068000"):
				// An NVSwitch on the PCI bus: NCCL merges them into one
				// NVS node; its PCI side carries no collective traffic.
				return nil
			default:
				n.Type = PCINode
			}
			t.add(n)
			t.connect(parent, n, LinkPCI, PCIBW(p.LinkSpeed, p.LinkWidth), 0)
			switch n.Type {
			case GPUNode:
				t.GPUs = append(t.GPUs, n)
				key := c.HostHash + "|" + bus
				if byBus[key] != nil {
					return fmt.Errorf("topology: two devices at %s (line %d)", bus, p.Line)
				}
				byBus[key] = n
				if n.GPU != nil {
					for _, l := range n.GPU.NVLinks {
						nvlinks = append(nvlinks, pending{n, l})
					}
					for _, cc := range n.GPU.C2C {
						t.connect(n, cpu, LinkC2C, cc.BW*float64(cc.Count)/1000, cc.Count)
					}
				}
			case NICNode:
				t.NICs = append(t.NICs, n)
				if p.NIC != nil {
					t.addNets(n, p.NIC)
				}
			}
			for _, ch := range p.Children {
				if err := rec(ch, n); err != nil {
					return err
				}
			}
			return nil
		}
		for _, p := range c.PCI {
			if err := rec(p, cpu); err != nil {
				return nil, err
			}
		}
		for i, nic := range c.NICs {
			n := t.add(&Node{Type: NICNode, Name: fmt.Sprintf("cpu%d-nic%d", c.NUMA, i), Host: c.HostHash, NUMA: c.NUMA})
			t.connect(cpu, n, LinkPCI, LocBW, 0)
			t.NICs = append(t.NICs, n)
			t.addNets(n, nic)
		}
	}
	// NVLinks (topo.cc ncclTopoAddNvLinks): to a GPU by bus id, to the
	// local CPU (POWER), or, for NVSwitches and anything else, to the
	// host's single NVS node.
	for _, p := range nvlinks {
		bw := float64(p.link.Count) * NVLinkBW(p.gpu.GPU.SM)
		switch {
		case strings.HasPrefix(p.link.TClass, "0x03"):
			peer := byBus[p.gpu.Host+"|"+normBusID(p.link.Target)]
			if peer == nil {
				t.Warnings = append(t.Warnings, fmt.Sprintf("GPU %s: NVLink to %s, which is not in the topology (line %d); ignored", p.gpu.Name, p.link.Target, p.link.Line))
				continue
			}
			if peer == p.gpu {
				// Real dumps contain these; a link from a GPU to itself
				// carries nothing to another device.
				t.Warnings = append(t.Warnings, fmt.Sprintf("GPU %s: NVLink whose target is its own bus id (line %d); ignored", p.gpu.Name, p.link.Line))
				continue
			}
			t.connect1(p.gpu, peer, LinkNVL, bw, p.link.Count)
		case strings.HasPrefix(p.link.TClass, "0x068001"), strings.HasPrefix(p.link.TClass, "0x0604"):
			t.connect(p.gpu, t.cpuOf(p.gpu), LinkNVL, bw, p.link.Count)
		default:
			sw := nvs[p.gpu.Host]
			if sw == nil {
				sw = t.add(&Node{Type: NVSNode, Name: "nvs", Host: p.gpu.Host, NUMA: -1})
				nvs[p.gpu.Host] = sw
				t.NVS = append(t.NVS, sw)
			}
			t.connect(p.gpu, sw, LinkNVL, bw, p.link.Count)
		}
	}
	// CPUs of a host talk over the SMP interconnect.
	for _, cpus := range hostCPUs {
		for i, a := range cpus {
			for _, b := range cpus[i+1:] {
				t.connect(a, b, LinkSYS, interCPUBW(t.cpuDoc(a)), 0)
			}
		}
	}
	t.computePaths()
	return t, nil
}

func (t *Topo) add(n *Node) *Node {
	n.id = int64(len(t.Nodes))
	t.Nodes = append(t.Nodes, n)
	t.Graph.AddNode(n)
	return n
}

func (t *Topo) addNets(nic *Node, doc *NIC) {
	for _, nt := range doc.Nets {
		n := t.add(&Node{Type: NetNode, Name: nt.Name, Host: nic.Host, NUMA: nic.NUMA, Net: nt})
		speed := nt.Speed
		if speed <= 0 {
			speed = defaultNet
		}
		t.connect(nic, n, LinkNET, float64(speed)/8000, 0)
		nic.NICs = append(nic.NICs, n)
	}
}

// connect links a and b both ways; connect1 one way (NCCL adds GPU-to-GPU
// NVLinks from each side's own <nvlink>).
func (t *Topo) connect(a, b *Node, typ LinkType, bw float64, count int) {
	t.connect1(a, b, typ, bw, count)
	t.connect1(b, a, typ, bw, count)
}

func (t *Topo) connect1(a, b *Node, typ LinkType, bw float64, count int) {
	for _, l := range a.Links {
		if l.To == b && l.Type == typ {
			l.BW += bw
			l.Count += count
			t.Graph.SetWeightedEdge(t.Graph.NewWeightedEdge(a, b, l.BW))
			return
		}
	}
	a.Links = append(a.Links, &Link{From: a, To: b, Type: typ, BW: bw, Count: count})
	t.Graph.SetWeightedEdge(t.Graph.NewWeightedEdge(a, b, bw))
}

func (t *Topo) cpuOf(n *Node) *Node {
	for _, c := range t.CPUs {
		if c.Host == n.Host && c.NUMA == n.NUMA {
			return c
		}
	}
	return nil
}

func (t *Topo) cpuDoc(n *Node) *CPU {
	for _, c := range t.Sys.CPUs {
		if c.HostHash == n.Host && c.NUMA == n.NUMA {
			return c
		}
	}
	return &CPU{}
}

// hopType is the path type one link contributes (paths.cc): its link
// type, except that a PCI link between two PCI switches is PXB and one
// that touches a CPU is PHB; the NIC-to-port link costs nothing.
func hopType(l *Link) PathType {
	switch l.Type {
	case LinkNVL:
		return NVL
	case LinkC2C:
		return C2CPath
	case LinkSYS:
		return SYS
	case LinkNET:
		return LOC
	case LinkLOC:
		return LOC
	}
	switch {
	case l.From.Type == CPUNode || l.To.Type == CPUNode:
		return PHB
	case l.From.Type == PCINode && l.To.Type == PCINode:
		return PXB
	}
	return PIX
}

// better is NCCL's rule for replacing a path (paths.cc at 5067397): a
// lower type, or the same type and more bandwidth, or both equal and fewer
// hops.
func better(a, b Path) bool {
	if a.Type != b.Type {
		return a.Type < b.Type
	}
	if a.BW != b.BW {
		return a.BW > b.BW
	}
	return a.Hops < b.Hops
}

// computePaths finds, from every node, the best path to every other by
// relaxing links until nothing improves. A path may continue through a
// GPU only over NVLink to another GPU, and only one such hop (NVB); it
// never continues through a NIC or a network port (they are endpoints).
func (t *Topo) computePaths() {
	for _, src := range t.Nodes {
		best := map[int64]Path{src.id: {Type: LOC, BW: LocBW}}
		queue := []*Node{src}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			p := best[n.id]
			if n != src && (n.Type == NICNode || n.Type == NetNode) {
				continue
			}
			for _, l := range n.Links {
				typ := max(p.Type, hopType(l))
				if n != src && n.Type == GPUNode {
					// Through a GPU: one NVLink relay to another GPU.
					if l.Type != LinkNVL || l.To.Type != GPUNode || p.Hops > 1 || hasGPUHop(p) {
						continue
					}
					typ = max(typ, NVB)
				}
				if l.To == src {
					continue
				}
				cand := Path{Type: typ, BW: math.Min(p.BW, l.BW), Hops: p.Hops + 1}
				if cur, ok := best[l.To.id]; ok && !better(cand, cur) {
					continue
				}
				cand.Links = append(append([]*Link(nil), p.Links...), l)
				best[l.To.id] = cand
				queue = append(queue, l.To)
			}
		}
		for id, p := range best {
			t.paths[[2]int64{src.id, id}] = p
		}
	}
}

// hasGPUHop reports whether p already passes through a GPU.
func hasGPUHop(p Path) bool {
	for _, l := range p.Links[:max(0, len(p.Links)-1)] {
		if l.To.Type == GPUNode {
			return true
		}
	}
	return false
}

// Path returns the best path from a to b (DIS when there is none, as
// between hosts: the network is not part of one host's graph).
func (t *Topo) Path(a, b *Node) Path {
	if p, ok := t.paths[[2]int64{a.id, b.id}]; ok {
		return p
	}
	return Path{Type: DIS}
}

// NearestNICs returns the NICs with the best path from gpu (ties all).
func (t *Topo) NearestNICs(gpu *Node) []*Node {
	var out []*Node
	var bestP Path
	for _, nic := range t.NICs {
		if nic.Host != gpu.Host {
			continue
		}
		p := t.Path(gpu, nic)
		if p.Type == DIS {
			continue
		}
		switch {
		case len(out) == 0 || p.Type < bestP.Type || (p.Type == bestP.Type && p.BW > bestP.BW):
			out, bestP = []*Node{nic}, p
		case p.Type == bestP.Type && p.BW == bestP.BW:
			out = append(out, nic)
		}
	}
	return out
}

// Label is a node's name for tables: GPU0.., NIC0.., in document order.
func (t *Topo) Label(n *Node) string {
	switch n.Type {
	case GPUNode:
		for i, g := range t.GPUs {
			if g == n {
				return "GPU" + strconv.Itoa(i)
			}
		}
	case NICNode:
		for i, x := range t.NICs {
			if x == n {
				return "NIC" + strconv.Itoa(i)
			}
		}
	}
	return n.Name
}

// NICName is what a NIC is called: its first port's name, else its bus id.
func NICName(n *Node) string {
	if len(n.NICs) > 0 && n.NICs[0].Name != "" {
		return n.NICs[0].Name
	}
	return n.Name
}

// Cell is the matrix entry between a GPU and another node, as
// `nvidia-smi topo -m` writes it: X for itself, NV<n> for an NVLink path
// (n links), else the path type.
func (t *Topo) Cell(a, b *Node) string {
	if a == b {
		return "X"
	}
	p := t.Path(a, b)
	if p.Type == NVL {
		n := math.MaxInt
		for _, l := range p.Links {
			n = min(n, l.Count)
		}
		return "NV" + strconv.Itoa(n)
	}
	return p.Type.String()
}

// GPUByBusID finds the GPU node at PCI bus id busID, in any spelling
// System.GPUByBusID takes, on host ("" matches any).
func (t *Topo) GPUByBusID(host, busID string) (*Node, bool) {
	want := normBusID(busID)
	for _, g := range t.GPUs {
		if (host == "" || g.Host == host) && normBusID(g.Name) == want {
			return g, true
		}
	}
	return nil, false
}

// GPUsOf returns the GPUs of one host, in document order.
func (t *Topo) GPUsOf(host string) []*Node {
	var out []*Node
	for _, g := range t.GPUs {
		if g.Host == host {
			out = append(out, g)
		}
	}
	return out
}

var _ graph.Node = (*Node)(nil)
