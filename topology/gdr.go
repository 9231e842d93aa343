package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultGDRLevel is NCCL's default NCCL_NET_GDR_LEVEL (ncclTopoCheckGdr,
// src/graph/paths.cc): a NIC reads and writes a GPU's memory directly
// when the two meet below the CPU, through PCIe switches (PXB or
// closer); through the CPU's root complex the peer-to-peer traffic is
// slower than staging, or not routed at all.
const DefaultGDRLevel = PXB

// ParseGDRLevel parses GOCCL_NET_GDR_LEVEL as NCCL parses
// NCCL_NET_GDR_LEVEL: a path type (LOC, PIX, PXB, PHB, SYS) up to which
// GPUDirect RDMA is used, or NCCL's numbers for them (0..4; 5 is SYS too).
func ParseGDRLevel(s string) (PathType, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	switch s {
	case "LOC":
		return LOC, nil
	case "PIX":
		return PIX, nil
	case "PXB":
		return PXB, nil
	case "PHB":
		return PHB, nil
	case "SYS":
		return SYS, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 5 {
		return [...]PathType{LOC, PIX, PXB, PHB, SYS, SYS}[n], nil
	}
	return 0, fmt.Errorf("GDR level %q: want LOC, PIX, PXB, PHB or SYS (or 0..5)", s)
}

// GDR reports whether port net of NIC nic would read and write the
// memory of gpu directly (GPUDirect RDMA) at the given level: the two
// are on one host, the port supports it (the topology's gdr attribute),
// and the path between GPU and NIC is no longer than level. The kernel
// side (nvidia-peermem or dma-buf) is checked when a connection is made.
func (t *Topo) GDR(gpu, nic *Node, net *Net, level PathType) (bool, PathType) {
	if gpu.Host != nic.Host {
		return false, NET
	}
	p := t.Path(gpu, nic).Type
	if net != nil && !net.GDR {
		return false, p
	}
	return p <= level, p
}

// GDRToNIC reads the PCI tree below root (sysfs: "/" on a live system)
// and reports whether RDMA device ibDev ("mlx5_0") would read and write
// the memory of the GPU at busID directly at level (as GDR does), with
// the path between them. The GPU or the device missing from the tree is
// an error that says which.
func GDRToNIC(root, busID, ibDev string, level PathType) (bool, PathType, error) {
	t, gpu, err := gpuTopo(root, busID)
	if err != nil {
		return false, DIS, err
	}
	for _, nic := range t.NICs {
		for _, n := range nic.NICs {
			if n.Net != nil && n.Net.Name == ibDev {
				ok, p := t.GDR(gpu, nic, n.Net, level)
				return ok, p, nil
			}
		}
	}
	return false, DIS, fmt.Errorf("RDMA device %s is not in the PCI tree below %s", ibDev, root)
}

// gpuTopo builds the topology of the PCI tree below root with the GPU at
// busID in it, and returns that GPU's node.
func gpuTopo(root, busID string) (*Topo, *Node, error) {
	sys, err := DiscoverSysfs(root, []string{busID})
	if err != nil {
		return nil, nil, err
	}
	t, err := Build(sys)
	if err != nil {
		return nil, nil, err
	}
	for _, g := range t.GPUs {
		if normBusID(g.Name) == normBusID(busID) {
			return t, g, nil
		}
	}
	return nil, nil, fmt.Errorf("GPU %s is not in the PCI tree below %s", busID, root)
}

// NICPaths reads the PCI tree below root (sysfs: "/" on a live system)
// and returns the path type from the GPU at busID to every network
// device in it, by name: RDMA devices ("mlx5_0") and network interfaces
// ("eth0") alike. It is what a rank with a GPU needs to use the NIC
// nearest its GPU, as NCCL gives each GPU the NIC with the best path
// (ncclTopoGetLocalNet, src/graph/search.cc).
func NICPaths(root, busID string) (map[string]PathType, error) {
	t, gpu, err := gpuTopo(root, busID)
	if err != nil {
		return nil, err
	}
	out := map[string]PathType{}
	for _, nic := range t.NICs {
		p := t.Path(gpu, nic).Type
		for _, n := range nic.NICs {
			if n.Net != nil {
				out[n.Net.Name] = p
			}
		}
	}
	return out, nil
}
