package collective

import (
	"fmt"

	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/transport/verbs"
)

// gdrAllowed says whether GPUDirect RDMA may be used between this rank's
// GPU and its RDMA port, and why: NCCL's rule (ncclTopoCheckGdr,
// src/graph/paths.cc), the two no further apart on the PCI tree than
// GOCCL_NET_GDR_LEVEL (PXB by default: below the CPU, through PCIe
// switches). Whether the kernel and driver can do it is the transport's
// to find out (transport/verbs, gdr.go).
func gdrAllowed(ib IBConfig, dev Device, port *verbs.Port) (bool, string) {
	return gdrAllowedIn("/", ib, dev, port)
}

// gdrAllowedIn is gdrAllowed on the sysfs tree below root.
func gdrAllowedIn(root string, ib IBConfig, dev Device, port *verbs.Port) (bool, string) {
	level := topology.DefaultGDRLevel
	if ib.GDRLevel != "" {
		level, _ = topology.ParseGDRLevel(ib.GDRLevel) // checked by resolve
	}
	in := dev.Info()
	switch {
	case in.Emulated != port.Device.Emulated:
		return false, "an emulated test device paired with real hardware"
	case in.Emulated:
		// The emulated GPU and NIC have no PCI tree: they count as under
		// one PCIe switch.
		return topology.PIX <= level, fmt.Sprintf("emulated test devices, taken as PIX apart (GOCCL_NET_GDR_LEVEL=%v)", level)
	case in.PCIBusID == "":
		return false, "the GPU's PCI bus id is unknown"
	}
	ok, p, err := topology.GDRToNIC(root, in.PCIBusID, port.Device.Name, level)
	if err != nil {
		return false, err.Error()
	}
	return ok, fmt.Sprintf("GPU %s and %s are %v apart (GOCCL_NET_GDR_LEVEL=%v)", in.PCIBusID, port.Device.Name, p, level)
}
