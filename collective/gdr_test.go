package collective_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/transport/verbs"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// pciGPU is a device that says where it sits on the PCI tree, as a CUDA
// device does; nothing else of it is used.
type pciGPU struct {
	device.Device
	bus string
}

func (g pciGPU) Info() device.Info { return device.Info{Name: "test GPU", PCIBusID: g.bus, Major: 8} }

// GPUDirect is allowed as NCCL_NET_GDR_LEVEL allows it on the PCI tree
// (the fake one of package topology's tests: a GPU behind the NIC's PCIe
// switch, another across the CPUs), and never between an emulated test
// device and real hardware.
func TestGDRFollowsTheTopology(t *testing.T) {
	const root = "../topology/testdata/sysfs-2gpu"
	nic := &verbs.Port{Device: ibv.DeviceInfo{Name: "mlx5_0"}}
	near, far := pciGPU{bus: "0000:03:00.0"}, pciGPU{bus: "0000:81:00.0"}
	ok, why := collective.GDRAllowedIn(root, collective.IBConfig{}, near, nic)
	require.True(t, ok, why)
	require.Contains(t, why, "PXB apart (GOCCL_NET_GDR_LEVEL=PXB)")
	ok, why = collective.GDRAllowedIn(root, collective.IBConfig{}, far, nic)
	require.False(t, ok, why)
	require.Contains(t, why, "SYS apart")
	ok, _ = collective.GDRAllowedIn(root, collective.IBConfig{GDRLevel: "SYS"}, far, nic)
	require.True(t, ok)
	ok, _ = collective.GDRAllowedIn(root, collective.IBConfig{GDRLevel: "PIX"}, near, nic)
	require.False(t, ok)
	ok, why = collective.GDRAllowedIn(root, collective.IBConfig{}, pciGPU{}, nic)
	require.False(t, ok)
	require.Contains(t, why, "bus id is unknown")
	ok, why = collective.GDRAllowedIn(root, collective.IBConfig{}, emu.New(0, emu.Options{}), nic)
	require.False(t, ok)
	require.Contains(t, why, "emulated test device paired with real hardware")
}
