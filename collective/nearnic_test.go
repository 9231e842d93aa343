package collective_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/internal/netif"
	"github.com/goccl/goccl/topology"
)

// The NICs nearest a rank's GPU narrow the ones GOCCL_SOCKET_IFNAME
// named, on the two-rail fake tree: GPU 0 shares a PCIe switch with eth1
// (PXB) while eth0 hangs off the CPU (PHB), so GPU 0's rank uses eth1
// alone; GPU 1, on the other socket, is SYS from both and stripes over
// both, as without a GPU; an interface not in the tree (a veth, say), the
// emulated device and a GPU of unknown bus id change nothing.
func TestNICsNearestTheGPU(t *testing.T) {
	const root = "../topology/testdata/sysfs-2rail"
	addrs := []netif.Addr{{Iface: "eth0", IP: []byte{10, 0, 0, 1}}, {Iface: "eth1", IP: []byte{10, 1, 0, 1}}, {Iface: "eth1", IP: []byte{10, 1, 0, 2}}}
	ifaces := func(as []netif.Addr) []string {
		var out []string
		for _, a := range as {
			out = append(out, a.Iface)
		}
		return out
	}
	got, why := collective.NICsNearGPU(root, pciGPU{bus: "0000:03:00.0"}, addrs)
	require.Equal(t, []string{"eth1", "eth1"}, ifaces(got), "both of eth1's addresses, in order")
	require.Contains(t, why, "eth1 nearest GPU 0000:03:00.0 (PXB); not eth0 PHB")
	for name, dev := range map[string]collective.Device{
		"other socket": pciGPU{bus: "0000:81:00.0"}, "no bus id": pciGPU{}, "emulated": emu.New(0, emu.Options{}), "none": nil,
	} {
		got, why := collective.NICsNearGPU(root, dev, addrs)
		require.Equal(t, ifaces(addrs), ifaces(got), name)
		require.Empty(t, why, name)
	}
	veth := append([]netif.Addr{{Iface: "veth0"}}, addrs...)
	got, _ = collective.NICsNearGPU(root, pciGPU{bus: "0000:03:00.0"}, veth)
	require.Equal(t, ifaces(veth), ifaces(got), "an interface outside the tree: no narrowing")
	// RDMA devices are tried nearest first.
	rank := collective.IBRankNearGPU(root, pciGPU{bus: "0000:03:00.0"})
	require.NotNil(t, rank)
	require.Less(t, rank("mlx5_0"), rank("eth0"))
	require.Less(t, rank("eth0"), rank("mlx5_9"), "unknown devices last")
	require.Nil(t, collective.IBRankNearGPU(root, nil))
}

func TestNearest(t *testing.T) {
	d := map[string]topology.PathType{"a": topology.PIX, "b": topology.SYS, "c": topology.PIX, "d": topology.SYS}
	require.Equal(t, []string{"a", "c"}, collective.Nearest([]string{"b", "a", "d", "c"}, d))
	require.Nil(t, collective.Nearest([]string{"b", "d"}, d), "all equally far")
	require.Nil(t, collective.Nearest([]string{"a"}, d), "one alone")
	require.Nil(t, collective.Nearest([]string{"a", "x"}, d), "one unknown")
}
