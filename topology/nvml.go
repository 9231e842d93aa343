package topology

import (
	"errors"
	"fmt"
	"strings"
)

// NVML is the part of NVIDIA's management library discovery uses, small
// enough to fake. Package topology/gonvml adapts go-nvml to it (the
// driver's library, which needs cgo, and go-nvml's mock servers), so
// that this package carries no cgo and the core may use it.
type NVML interface {
	Init() error
	Shutdown() error
	DeviceCount() (int, error)
	Device(i int) (NVMLDevice, error)
}

// NVMLDevice is one GPU as NVML sees it.
type NVMLDevice interface {
	PCIBusID() (string, error)
	ComputeCapability() (major, minor int, err error)
	// NVLinks reports every active link: the PCI bus id of the far end
	// and what it is.
	NVLinks() ([]NVLinkInfo, error)
	// P2PNVLink reports whether NVML says peer-to-peer over NVLink works
	// with other.
	P2PNVLink(other NVMLDevice) (bool, error)
	// CPUAffinity is the mask of the CPUs nearest the GPU, as words of 64
	// bits, lowest first.
	CPUAffinity() ([]uint64, error)
}

// NVLinkInfo is one active NVLink.
type NVLinkInfo struct {
	Link   int
	Remote string // PCI bus id of the far end
	Kind   RemoteKind
}

// RemoteKind is what an NVLink leads to.
type RemoteKind int

// Remote kinds.
const (
	RemoteGPU RemoteKind = iota
	RemoteSwitch
	RemoteCPU     // IBM NPU (POWER)
	RemoteUnknown // NVML could not say: treated as a switch, as NCCL does
)

// tclass is the NCCL XML class of a remote kind.
func (k RemoteKind) tclass() string {
	switch k {
	case RemoteGPU:
		return "0x030200"
	case RemoteCPU:
		return "0x068001"
	}
	return "0x068000"
}

// ErrNoNVML is wrapped by the errors of an NVML that cannot be used (no
// driver, or a build without cgo).
var ErrNoNVML = errors.New("NVML not available")

// gpuInfo is what NVML says about one GPU.
type gpuInfo struct {
	bus     string
	sm      int
	nvlinks []NVLinkInfo
}

// readNVML asks lib for every GPU. It initialises and shuts the library
// down itself; nothing is called on it after a failed Init (go-nvml
// aborts the process on calls into a library that did not load).
func readNVML(lib NVML) (gpus []gpuInfo, err error) {
	if lib == nil {
		return nil, fmt.Errorf("%w: none given", ErrNoNVML)
	}
	if err := lib.Init(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoNVML, err)
	}
	defer func() {
		if e := lib.Shutdown(); e != nil && err == nil {
			err = fmt.Errorf("NVML shutdown: %w", e)
		}
	}()
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("NVML device count: %w", err)
	}
	for i := 0; i < n; i++ {
		d, err := lib.Device(i)
		if err != nil {
			return nil, fmt.Errorf("NVML device %d: %w", i, err)
		}
		bus, err := d.PCIBusID()
		if err != nil {
			return nil, fmt.Errorf("NVML device %d bus id: %w", i, err)
		}
		maj, mnr, err := d.ComputeCapability()
		if err != nil {
			return nil, fmt.Errorf("NVML device %d compute capability: %w", i, err)
		}
		links, err := d.NVLinks()
		if err != nil {
			return nil, fmt.Errorf("NVML device %d NVLinks: %w", i, err)
		}
		gpus = append(gpus, gpuInfo{bus: normBusID(bus), sm: maj*10 + mnr, nvlinks: links})
	}
	return gpus, nil
}

// Discovery is what Discover found and how.
type Discovery struct {
	System *System
	// NVML says what NVML gave: the GPU count, or why it was absent.
	NVML  string
	Notes []string
}

// Discover reads this machine: GPUs and their NVLinks from lib (NVML;
// nil or a failing one leaves a system without GPUs, and Discovery.NVML
// says why), the PCI tree, NUMA nodes and NICs from sysfs below root ("/"
// normally). A GPU NVML names that sysfs does not show is placed directly
// under the first NUMA node, with a note.
func Discover(root string, lib NVML) (*Discovery, error) {
	d := &Discovery{}
	gpus, err := readNVML(lib)
	if err != nil {
		if !errors.Is(err, ErrNoNVML) {
			return nil, err
		}
		d.NVML = "absent (" + err.Error() + ")"
	} else {
		d.NVML = fmt.Sprintf("%d GPUs", len(gpus))
	}
	s := &sysfs{root: root}
	if err := s.index(); err != nil {
		return nil, err
	}
	var inSysfs []string
	var missing []gpuInfo
	for _, g := range gpus {
		if _, ok := s.devs[g.bus]; ok {
			inSysfs = append(inSysfs, g.bus)
		} else {
			missing = append(missing, g)
		}
	}
	if inSysfs == nil {
		inSysfs = []string{} // GPUs come from NVML only
	}
	sys, err := DiscoverSysfs(root, inSysfs)
	if err != nil {
		return nil, err
	}
	for _, g := range missing {
		d.Notes = append(d.Notes, fmt.Sprintf("GPU %s is not in sysfs: placed under NUMA node %d without its PCI path", g.bus, sys.CPUs[0].NUMA))
		sys.CPUs[0].PCI = append(sys.CPUs[0].PCI, &PCI{BusID: g.bus, Class: "0x030200", GPU: &GPU{}})
	}
	// Fill the GPUs in from NVML, in NVML's order.
	byBus := map[string]*GPU{}
	for _, loc := range sys.GPUs() {
		byBus[normBusID(loc.PCI.BusID)] = loc.Item
	}
	for i, g := range gpus {
		gpu := byBus[g.bus]
		gpu.Dev, gpu.SM, gpu.Rank, gpu.GDR = i, g.sm, -1, true
		gpu.NVLinks = nil
		counts := map[string]*NVLink{}
		for _, l := range g.nvlinks {
			target, tclass := normBusID(l.Remote), l.Kind.tclass()
			if l.Kind != RemoteGPU {
				target = strings.Repeat("f", 7) + ":ffff:ff" // NCCL's name for an NVSwitch
			}
			k := target + "|" + tclass
			if c := counts[k]; c != nil {
				c.Count++
				continue
			}
			nl := &NVLink{Target: target, Count: 1, TClass: tclass}
			counts[k] = nl
			gpu.NVLinks = append(gpu.NVLinks, nl)
		}
	}
	d.System = sys
	return d, nil
}
