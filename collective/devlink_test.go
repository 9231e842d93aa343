package collective_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/topology"
)

// readTopology reads one of package topology's test documents.
func readTopology(t *testing.T, name string) *topology.System {
	t.Helper()
	f, err := os.Open("../topology/testdata/" + name)
	require.NoError(t, err)
	defer f.Close()
	sys, err := topology.ReadXML(f)
	require.NoError(t, err)
	return sys
}

// ringModel is what the topology's own ring search gives over buses.
func ringModel(t *testing.T, sys *topology.System, buses ...string) algorithms.LinkModel {
	t.Helper()
	tp, err := topology.Build(sys)
	require.NoError(t, err)
	var gpus []*topology.Node
	for _, b := range buses {
		g, ok := tp.GPUByBusID("", b)
		require.True(t, ok, b)
		gpus = append(gpus, g)
	}
	r, err := tp.SearchRing(gpus)
	require.NoError(t, err)
	return r.LinkModel()
}

// A local group's device operations are tuned by the ring over its GPUs
// that the topology gives: NVLink's bandwidth and hop latency for two
// H100s joined by four NVLinks, PCI's for two GPUs across a PCIe switch.
func TestDeviceLinkFromTheTopology(t *testing.T) {
	multi := readTopology(t, "multihost.xml")
	nvl := []collective.Device{pciGPU{emu.New(0, emu.Options{}), "0000:21:00.0"}, pciGPU{emu.New(1, emu.Options{}), "0000:22:00.0"}}
	comms, err := collective.NewLocalGroup(2, collective.WithEnv(nil), collective.WithDevice(nvl...), collective.WithTopology(multi))
	require.NoError(t, err)
	for _, c := range comms {
		defer c.Close()
	}
	want := ringModel(t, multi, "0000:21:00.0", "0000:22:00.0")
	total := want.Bandwidth * float64(want.MaxChannels)
	want.MaxChannels = min(want.MaxChannels, comms[0].Config().MaxChannels)
	want.Bandwidth = total / float64(want.MaxChannels)
	for _, c := range comms {
		require.Equal(t, want, collective.DeviceLinkOf(c))
	}
	got := collective.DeviceLinkOf(comms[0])
	require.InDelta(t, 80e9, got.Bandwidth*float64(got.MaxChannels), 1e9, "four H100 NVLinks, 20 GB/s each in NCCL's model")
	// Fewer channels share the ring's bandwidth.
	two, _ := collective.DeviceLinkFor(multi, nvl, 2)
	require.Equal(t, 2, two.MaxChannels)
	require.InDelta(t, total, two.Bandwidth*2, 1)

	ndv4 := readTopology(t, "azure-ndv4.xml")
	pci := []collective.Device{pciGPU{emu.New(0, emu.Options{}), "0003:00:00.0"}, pciGPU{emu.New(1, emu.Options{}), "0004:00:00.0"}}
	lm, why := collective.DeviceLinkFor(ndv4, pci, 32)
	require.Equal(t, ringModel(t, ndv4, "0003:00:00.0", "0004:00:00.0"), lm, why)
	require.Greater(t, lm.Latency, got.Latency, "a PCI hop costs more than an NVLink one in NCCL's model")
	require.Less(t, lm.Bandwidth*float64(lm.MaxChannels), got.Bandwidth*float64(got.MaxChannels), "PCI is slower than four NVLinks")

	// Without a topology there is no device model: device operations are
	// tuned as host ones (the engine's TestDeviceLinkTunesDeviceOperations
	// checks that host operations keep their plans either way).
	plain, err := collective.NewLocalGroup(2, collective.WithEnv(nil), collective.WithDevice(nvl...))
	require.NoError(t, err)
	for _, c := range plain {
		defer c.Close()
		require.Equal(t, algorithms.LinkModel{}, collective.DeviceLinkOf(c))
	}
}

// Where the topology cannot say, device operations are tuned as host ones,
// and the reason is given.
func TestDeviceLinkFallsBack(t *testing.T) {
	multi := readTopology(t, "multihost.xml")
	d := emu.New(0, emu.Options{})
	for name, c := range map[string]struct {
		sys  *topology.System
		devs []collective.Device
		why  string
	}{
		"no topology":      {nil, []collective.Device{pciGPU{d, "0000:21:00.0"}, pciGPU{d, "0000:22:00.0"}}, "no topology"},
		"no bus id":        {multi, []collective.Device{d, d}, "no PCI bus id"},
		"not in the file":  {multi, []collective.Device{pciGPU{d, "0000:21:00.0"}, pciGPU{d, "0000:77:00.0"}}, "not in the topology"},
		"one GPU for both": {multi, []collective.Device{pciGPU{d, "0000:21:00.0"}, pciGPU{d, "0000:21:00.0"}}, "share GPU"},
	} {
		lm, why := collective.DeviceLinkFor(c.sys, c.devs, 32)
		require.Equal(t, algorithms.LinkModel{}, lm, name)
		require.Contains(t, why, c.why, name)
	}
}

// The ranks of a job made by Init publish their GPUs' bus ids; on one
// host, every pair over shared memory with CUDA IPC, they get the ring
// over those GPUs, and otherwise the host operations' model, saying why.
func TestDeviceLinkOfAJob(t *testing.T) {
	multi := readTopology(t, "multihost.xml")
	buses := []string{"0000:21:00.0", "0000:22:00.0"}
	lm, why := collective.DeviceLinkOfJob(multi, []string{"h", "h"}, buses, true, true)
	want, _ := collective.DeviceLinkFor(multi, []collective.Device{pciGPU{nil, buses[0]}, pciGPU{nil, buses[1]}}, 32)
	require.Equal(t, want, lm, why)
	require.NotEqual(t, algorithms.LinkModel{}, lm)
	for name, c := range map[string]struct {
		hosts, buses []string
		allShm, p2p  bool
		why          string
	}{
		"two hosts":   {[]string{"a", "b"}, buses, true, true, "several hosts"},
		"over TCP":    {[]string{"h", "h"}, buses, false, true, "staged in host memory"},
		"P2P off":     {[]string{"h", "h"}, buses, true, false, "staged in host memory"},
		"no bus id":   {[]string{"h", "h"}, []string{buses[0], ""}, true, true, "rank 1 names no GPU"},
		"unknown GPU": {[]string{"h", "h"}, []string{buses[0], "0000:77:00.0"}, true, true, "not in the topology"},
	} {
		lm, why := collective.DeviceLinkOfJob(multi, c.hosts, c.buses, c.allShm, c.p2p)
		require.Equal(t, algorithms.LinkModel{}, lm, name)
		require.Contains(t, why, c.why, name)
	}
	got, ok := collective.GPUBusRoundTrip("0000:21:00.0")
	require.True(t, ok)
	require.Equal(t, "0000:21:00.0", got)
}
