package collective

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/goccl/goccl/internal/netif"
	"github.com/goccl/goccl/topology"
)

// The NIC nearest each rank's GPU. On a server with a NIC per GPU or per
// pair (a DGX's rails), NCCL gives each GPU the NIC with the best PCI
// path to it (ncclTopoGetLocalNet, src/graph/search.cc): its traffic then
// crosses one PCIe switch instead of the CPU's root complex and the
// socket interconnect. goccl does the same where the topology says so: a
// rank with a GPU whose PCI bus id is known reads the PCI tree (sysfs),
// and
//   - over TCP, when GOCCL_SOCKET_IFNAME names several interfaces, uses
//     only those nearest its GPU (those tied at the best path; all of
//     them, striped as before, when they are equally far or any is not in
//     the tree);
//   - over RDMA, opens the allowed port of the device nearest its GPU
//     first (verbs.OpenPortPreferring).
// Without a GPU, or on the emulated test device (which has no PCI tree),
// nothing changes.

// gpuNICPaths returns the path types from dev's GPU to the network
// devices below root, or nil with why not.
func gpuNICPaths(root string, dev Device) (map[string]topology.PathType, string) {
	if dev == nil {
		return nil, "no GPU"
	}
	in := dev.Info()
	switch {
	case in.Emulated:
		return nil, "the emulated test device has no PCI tree"
	case in.PCIBusID == "":
		return nil, "the GPU's PCI bus id is unknown"
	}
	p, err := topology.NICPaths(root, in.PCIBusID)
	if err != nil {
		return nil, err.Error()
	}
	return p, ""
}

// nearest returns the names (in their order) at the best path in dist,
// or nil when that would not narrow them: fewer than two, one not in
// dist, or all equally far.
func nearest(names []string, dist map[string]topology.PathType) []string {
	if len(names) < 2 {
		return nil
	}
	best, worst := topology.DIS, topology.LOC
	for _, n := range names {
		p, ok := dist[n]
		if !ok {
			return nil
		}
		best, worst = min(best, p), max(worst, p)
	}
	if best == worst {
		return nil
	}
	var out []string
	for _, n := range names {
		if dist[n] == best {
			out = append(out, n)
		}
	}
	return out
}

// gpuNICs is a rank's GPU and the paths from it to the network devices
// below a sysfs root, read once, when first asked (TCP and RDMA both
// ask; without a GPU or a choice to make, nobody reads the tree).
type gpuNICs struct {
	dev   Device
	paths func() map[string]topology.PathType
}

func newGPUNICs(root string, dev Device) gpuNICs {
	return gpuNICs{dev: dev, paths: sync.OnceValue(func() map[string]topology.PathType {
		p, _ := gpuNICPaths(root, dev)
		return p
	})}
}

// narrow narrows addrs, the interfaces GOCCL_SOCKET_IFNAME chose (one or
// more addresses each), to those of the interfaces nearest the GPU,
// keeping their order. It returns addrs unchanged, and "", when there is
// nothing to narrow; else the narrowed list and what it did, for the log.
func (g gpuNICs) narrow(addrs []netif.Addr) ([]netif.Addr, string) {
	dev := g.dev
	var names []string
	for _, a := range addrs {
		if !slices.Contains(names, a.Iface) {
			names = append(names, a.Iface)
		}
	}
	if len(names) < 2 {
		return addrs, ""
	}
	dist := g.paths()
	keep := nearest(names, dist)
	if keep == nil {
		return addrs, ""
	}
	var out []netif.Addr
	for _, a := range addrs {
		if slices.Contains(keep, a.Iface) {
			out = append(out, a)
		}
	}
	var far []string
	for _, n := range names {
		if !slices.Contains(keep, n) {
			far = append(far, fmt.Sprintf("%s %v", n, dist[n]))
		}
	}
	return out, fmt.Sprintf("%s nearest GPU %s (%v); not %s", strings.Join(keep, ","), dev.Info().PCIBusID, dist[keep[0]], strings.Join(far, ", "))
}

// ibRank orders RDMA devices for verbs.OpenPortPreferring: by the path
// from the GPU, unknown ones last; nil without a GPU or a tree.
func (g gpuNICs) ibRank() func(name string) int {
	dist := g.paths()
	if dist == nil {
		return nil
	}
	return func(name string) int {
		if p, ok := dist[name]; ok {
			return int(p)
		}
		return int(topology.DIS) + 1
	}
}
