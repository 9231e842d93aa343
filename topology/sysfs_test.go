package topology

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSysfsFakeTree discovers testdata/sysfs-2gpu: two NUMA nodes, a GPU
// and a 400 Gb/s InfiniBand NIC behind one PCIe switch on node 0, a second
// GPU on node 1, and a virtio NIC whose net device sits below its PCI
// device (IPoIB and loopback must not count).
func TestSysfsFakeTree(t *testing.T) {
	s, err := DiscoverSysfs("testdata/sysfs-2gpu", nil)
	require.NoError(t, err)
	require.Len(t, s.CPUs, 2)
	require.Equal(t, "GenuineIntel", s.CPUs[0].Vendor)
	require.Equal(t, 143, s.CPUs[0].Model)
	require.Equal(t, "00000000,0000ffff", s.CPUs[0].Affinity)
	tp := build(t, s)
	require.Len(t, tp.GPUs, 2)
	require.Equal(t, "0000:03:00.0", tp.GPUs[0].Name)
	require.Equal(t, "0000:81:00.0", tp.GPUs[1].Name)
	var names []string
	for _, n := range tp.NICs {
		names = append(names, NICName(n))
	}
	require.ElementsMatch(t, []string{"mlx5_0", "eth0"}, names)
	mlx := tp.NearestNICs(tp.GPUs[0])
	require.Len(t, mlx, 1)
	require.Equal(t, "mlx5_0", NICName(mlx[0]))
	require.Equal(t, PXB, tp.Path(tp.GPUs[0], mlx[0]).Type)
	require.Equal(t, 400000, mlx[0].NICs[0].Net.Speed)
	require.Equal(t, 1, mlx[0].NICs[0].Net.Port)
	require.Equal(t, SYS, tp.Path(tp.GPUs[0], tp.GPUs[1]).Type)
	require.InDelta(t, 22.0, tp.Path(tp.GPUs[0], tp.GPUs[1]).BW, 1e-9, "Sapphire Rapids UPI")
	require.InDelta(t, 48.0, tp.Path(tp.GPUs[0], mlx[0]).BW, 1e-9, "PCIe gen5 x16")
	// It writes XML that reads back the same.
	var x bytes.Buffer
	require.NoError(t, s.WriteXML(&x))
	back, err := ReadXML(&x)
	require.NoError(t, err)
	require.Equal(t, clearLines(s), clearLines(back))
	// A GPU bus id that is not there is an error.
	_, err = DiscoverSysfs("testdata/sysfs-2gpu", []string{"0000:55:00.0"})
	require.ErrorContains(t, err, "0000:55:00.0")
}

// TestSysfsThisMachine runs discovery on the live /sys: it must not fail,
// and finds at least one CPU.
func TestSysfsThisMachine(t *testing.T) {
	if _, err := os.Stat("/sys/devices"); err != nil {
		t.Skip("no /sys on this system:", err)
	}
	s, err := DiscoverSysfs("/", nil)
	require.NoError(t, err)
	require.NotEmpty(t, s.CPUs)
	_, err = Build(s)
	require.NoError(t, err)
}

// GDRToNIC follows the PCI tree: the GPU behind the NIC's PCIe switch
// uses GPUDirect at the default level, the one across the CPUs does not,
// and levels move the line.
func TestGDRToNIC(t *testing.T) {
	ok, p, err := GDRToNIC("testdata/sysfs-2gpu", "0000:03:00.0", "mlx5_0", DefaultGDRLevel)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, PXB, p)
	ok, p, err = GDRToNIC("testdata/sysfs-2gpu", "0000:03:00.0", "mlx5_0", PIX)
	require.NoError(t, err)
	require.False(t, ok, "PXB is past PIX")
	require.Equal(t, PXB, p)
	ok, p, err = GDRToNIC("testdata/sysfs-2gpu", "00000000:81:00.0", "mlx5_0", DefaultGDRLevel)
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, SYS, p)
	ok, _, err = GDRToNIC("testdata/sysfs-2gpu", "0000:81:00.0", "mlx5_0", SYS)
	require.NoError(t, err)
	require.True(t, ok)
	_, _, err = GDRToNIC("testdata/sysfs-2gpu", "0000:03:00.0", "mlx5_9", SYS)
	require.ErrorContains(t, err, "mlx5_9 is not in the PCI tree")
	_, _, err = GDRToNIC("testdata/sysfs-2gpu", "0000:55:00.0", "mlx5_0", SYS)
	require.Error(t, err)
}

// From each GPU of the fake tree, the path to every network device by
// name: GPU 0 shares a PCIe switch with mlx5_0; GPU 1 is on the other
// socket from it.
func TestNICPaths(t *testing.T) {
	p, err := NICPaths("testdata/sysfs-2gpu", "0000:03:00.0")
	require.NoError(t, err)
	require.Equal(t, PXB, p["mlx5_0"])
	require.Contains(t, p, "eth0")
	require.Greater(t, p["eth0"], PXB)
	q, err := NICPaths("testdata/sysfs-2gpu", "0000:81:00.0")
	require.NoError(t, err)
	require.Equal(t, SYS, q["mlx5_0"])
	t.Logf("GPU 0: %v; GPU 1: %v", p, q)
	_, err = NICPaths("testdata/sysfs-2gpu", "0000:55:00.0")
	require.ErrorContains(t, err, "0000:55:00.0")
}

// The two-rail tree: an Ethernet NIC beside the InfiniBand one, behind GPU
// 0's PCIe switch.
func TestNICPathsTwoRails(t *testing.T) {
	p, err := NICPaths("testdata/sysfs-2rail", "0000:03:00.0")
	require.NoError(t, err)
	require.Equal(t, map[string]PathType{"mlx5_0": PXB, "eth1": PXB, "eth0": PHB}, p)
	q, err := NICPaths("testdata/sysfs-2rail", "0000:81:00.0")
	require.NoError(t, err)
	require.Equal(t, map[string]PathType{"mlx5_0": SYS, "eth1": SYS, "eth0": SYS}, q)
}
