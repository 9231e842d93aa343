//go:build linux && cgo

package topology_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/topology/gonvml"
)

// wire gives go-nvml's mock server what its DGX mocks leave unset: bus
// ids, and links NVLinks per GPU to NVSwitches (bus ids 0000:c0..c5).
func wire(t *testing.T, s *server.Server, links int) {
	t.Helper()
	n, r := s.DeviceGetCount()
	require.Equal(t, nvml.SUCCESS, r)
	cstr := func(v string) (b [32]int8) {
		for i := range v {
			b[i] = int8(v[i])
		}
		return b
	}
	for i := 0; i < n; i++ {
		d, r := s.DeviceGetHandleByIndex(i)
		require.Equal(t, nvml.SUCCESS, r)
		dev := d.(*server.Device)
		bus := fmt.Sprintf("00000000:%02x:00.0", 0x10*(i+1)+1)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: cstr(bus), PciDeviceId: dev.Config.PciDeviceId}, nvml.SUCCESS
		}
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= links {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: cstr(fmt.Sprintf("00000000:c%d:00.0", l%6))}, nvml.SUCCESS
		}
		dev.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
	}
}

// TestDiscoverWithNVMLMocks: go-nvml's DGX A100 and H100 mock servers
// go through discovery (GPUs from NVML, the rest from a fake sysfs without
// those GPUs), into XML and back, into the graph, and the ring search
// finds every GPU pair NVLinked through the NVSwitches.
func TestDiscoverWithNVMLMocks(t *testing.T) {
	for _, c := range []struct {
		name  string
		srv   *server.Server
		links int
		sm    int
	}{
		{"dgxa100", dgxa100.New(), 12, 80},
		{"dgxh100", dgxh100.New(), 18, 90},
	} {
		t.Run(c.name, func(t *testing.T) {
			wire(t, c.srv, c.links)
			d, err := topology.Discover("testdata/sysfs-2gpu", gonvml.From(c.srv))
			require.NoError(t, err)
			require.Equal(t, "8 GPUs", d.NVML)
			// The mock's GPU 7 (0000:81:00.0) is the fake tree's second GPU
			// and takes its place; the other seven are not in that tree.
			require.Len(t, d.Notes, 7)
			placed := false
			for _, loc := range d.System.GPUs() {
				placed = placed || (loc.PCI.BusID == "0000:81:00.0" && loc.CPU.NUMA == 1)
			}
			require.True(t, placed, "GPU 0000:81:00.0 under NUMA node 1")
			var x bytes.Buffer
			require.NoError(t, d.System.WriteXML(&x))
			back, err := topology.ReadXML(&x)
			require.NoError(t, err)
			require.Equal(t, topology.ClearLines(d.System), topology.ClearLines(back))
			tp := topology.BuildT(t, back)
			require.Len(t, tp.GPUs, 8)
			require.Len(t, tp.NVS, 1)
			for _, a := range tp.GPUs {
				require.Equal(t, c.sm, a.GPU.SM)
				for _, b := range tp.GPUs {
					if a != b {
						require.Equal(t, fmt.Sprintf("NV%d", c.links), tp.Cell(a, b))
					}
				}
			}
			r, err := tp.SearchRing(tp.GPUs)
			require.NoError(t, err)
			require.InDelta(t, float64(c.links)*topology.NVLinkBW(c.sm), r.Total(), topology.NVLinkBW(c.sm)*1.01, "ring %v", r)
		})
	}
}

// TestNVMLGuardsCallsAfterAFailedInit: no call reaches go-nvml after Init
// fails (it would abort the process), and discovery carries on without
// GPUs, saying why.
func TestNVMLGuardsCallsAfterAFailedInit(t *testing.T) {
	srv := dgxh100.New()
	calls := 0
	srv.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	srv.DeviceGetCountFunc = func() (int, nvml.Return) { calls++; return 8, nvml.SUCCESS }
	lib := gonvml.From(srv)
	d, err := topology.Discover("testdata/sysfs-2gpu", lib)
	require.NoError(t, err)
	require.Contains(t, d.NVML, "absent")
	require.Zero(t, calls)
	_, err = lib.DeviceCount()
	require.Error(t, err)
	require.Zero(t, calls)
	// The fake tree's own GPUs are not reported without NVML.
	require.Empty(t, d.System.GPUs())
	// The driver's NVML on this machine: absent, without a crash.
	d, err = topology.Discover("/", gonvml.System())
	require.NoError(t, err)
	t.Log("this machine: NVML", d.NVML)
}
