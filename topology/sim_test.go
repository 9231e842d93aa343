package topology

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// dgx builds a DGX-like host: 2 sockets, 4 PCIe switches each, a GPU and
// a NIC port of nicMbps under every switch, every GPU with links NVLinks
// to the NVSwitches.
func dgx(sm, links, nicMbps int, speed string) *System {
	s := &System{Version: 1}
	for c := 0; c < 2; c++ {
		cpu := &CPU{NUMA: c, Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 0x8F, Affinity: "ffff"}
		for k := 0; k < 4; k++ {
			i := c*4 + k
			sw := &PCI{BusID: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)), Class: "0x060400", LinkSpeed: speed, LinkWidth: 16}
			gpu := &PCI{BusID: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)+1), Class: "0x030200", LinkSpeed: speed, LinkWidth: 16,
				GPU: &GPU{Dev: i, SM: sm, Rank: -1, GDR: true, NVLinks: []*NVLink{{Target: "fffffff:ffff:ff", Count: links, TClass: "0x068000"}}}}
			nic := &PCI{BusID: fmt.Sprintf("0000:%02x:00.0", 0x10*(i+1)+2), Class: "0x020700", LinkSpeed: speed, LinkWidth: 16,
				NIC: &NIC{Nets: []*Net{{Name: fmt.Sprintf("mlx5_%d", i), Dev: i, Speed: nicMbps, Port: 1, GDR: true}}}}
			sw.Children = []*PCI{gpu, nic}
			cpu.PCI = append(cpu.PCI, sw)
		}
		s.CPUs = append(s.CPUs, cpu)
	}
	return s
}

// published all-reduce bus bandwidths (GB/s) from NVIDIA/nccl-tests
// issues 149, 212 and 290, as the issue quotes them.
var published = []struct {
	name   string
	sys    *System
	layout Layout
	want   float64 // busbw at large sizes; per NIC where perNIC
	perNIC bool
}{
	{"8×A100 NVSwitch", dgx(80, 12, 200000, "16.0 GT/s PCIe"), Layout{1, 8}, 230, false},
	{"8×H100 NVSwitch", dgx(90, 18, 400000, "32.0 GT/s PCIe"), Layout{1, 8}, 370, false},
	{"2×8 H100, one 400 Gb/s NIC per GPU", dgx(90, 18, 400000, "32.0 GT/s PCIe"), Layout{2, 8}, 47, true},
}

// TestSimulationAgainstPublishedFigures predicts large all-reduce bus
// bandwidth for systems whose NCCL figures are published, and bounds the
// error (it is quoted in the closing note).
func TestSimulationAgainstPublishedFigures(t *testing.T) {
	for _, p := range published {
		tp := build(t, p.sys)
		m, err := Simulate(tp, p.layout)
		require.NoError(t, err, p.name)
		big := m.Predict(8 << 30)
		got := big.BusBW
		if p.perNIC {
			got /= float64(m.NICs)
		}
		errPct := 100 * (got - p.want) / p.want
		t.Logf("%s: ring %v; predicted busbw at 8 GiB %.1f GB/s%s (%s), published %.0f: error %+.1f%%",
			p.name, m.Ring, got, map[bool]string{true: " per NIC", false: ""}[p.perNIC], big.Algo, p.want, errPct)
		for _, sz := range []int64{8, 1 << 20, 64 << 20, 1 << 30} {
			q, c := m.Predict(sz), m.CorePredict(sz)
			t.Logf("    %10d B: NCCL model %9.1f us busbw %7.2f GB/s (%s); goccl cost model %9.1f us busbw %7.2f GB/s",
				sz, q.TimeUs, q.BusBW, q.Algo, c.TimeUs, c.BusBW)
		}
		require.Less(t, math.Abs(errPct), 10.0, p.name)
		core := m.CorePredict(8 << 30).BusBW
		if p.perNIC {
			core /= float64(m.NICs)
		}
		t.Logf("    goccl's cost model at 8 GiB: %.1f GB/s, error %+.1f%%", core, 100*(core-p.want)/p.want)
		require.Less(t, math.Abs(100*(core-p.want)/p.want), 10.0, p.name)
	}
}

func TestRingSearchOnPCIeAndNVLinkPairs(t *testing.T) {
	// azure-ndv4 without NVLink: the best ring keeps each switch's pair
	// adjacent and crosses sockets only four times.
	tp := build(t, load(t, "azure-ndv4.xml"))
	r, err := tp.SearchRing(tp.GPUs)
	require.NoError(t, err)
	require.Equal(t, SYS, r.Type)
	for i := 0; i < len(r.Order); i += 2 {
		a, b := r.Order[i], r.Order[(i+1)%len(r.Order)]
		if tp.Path(a, b).Type != PIX {
			// The pairs may start at an odd position.
			a, b = r.Order[(i+1)%len(r.Order)], r.Order[(i+2)%len(r.Order)]
			require.Equal(t, PIX, tp.Path(a, b).Type, "ring %v", r)
		}
	}
	require.Greater(t, r.Total(), 0.0)

	// Two GPUs with a direct 4-link NVLink (multihost.xml, host 2).
	tp = build(t, load(t, "multihost.xml"))
	r, err = tp.SearchRing(tp.GPUsOf("0x5678"))
	require.NoError(t, err)
	require.Equal(t, NVL, r.Type)
	require.InDelta(t, 4*20.6, float64(r.Channels)*r.BW+0.4, 2, "4 × 20.6 GB/s, in whole channels of NCCL's speeds")
	_, err = tp.SearchRing(tp.GPUs)
	require.ErrorContains(t, err, "not connected")
}

func TestSimulateRejectsImpossibleLayouts(t *testing.T) {
	tp := build(t, dgx(90, 18, 400000, "32.0 GT/s PCIe"))
	_, err := Simulate(tp, Layout{1, 9})
	require.ErrorContains(t, err, "9 GPUs per node")
	_, err = Simulate(tp, Layout{0, 8})
	require.Error(t, err)
	noNIC := build(t, load(t, "azure-ndv2.xml"))
	_, err = Simulate(noNIC, Layout{2, 8})
	require.ErrorContains(t, err, "network ports")
}

func TestRingFeedsTheTuner(t *testing.T) {
	tp := build(t, dgx(90, 18, 400000, "32.0 GT/s PCIe"))
	r, err := tp.SearchRing(tp.GPUs)
	require.NoError(t, err)
	lm := r.LinkModel()
	require.NoError(t, lm.Validate())
	require.Equal(t, r.Channels, lm.MaxChannels)
	require.InDelta(t, r.BW*1e9, lm.Bandwidth, 1)
	require.InDelta(t, 3.4e-6, lm.Latency, 1e-12, "NVLink hops")
}

// TestHierarchyModel: across hosts the hierarchical all-reduce's network
// share is 2(h-1)/h of the data, so with the ports the bound its busbw
// asymptote is the ports' sum times (n-1)/n · h/(h-1); on one host it is
// not modelled.
func TestHierarchyModel(t *testing.T) {
	tp := build(t, dgx(90, 18, 400000, "32.0 GT/s PCIe"))
	for _, l := range []Layout{{2, 8}, {16, 8}, {1024, 8}} {
		m, err := Simulate(tp, l)
		require.NoError(t, err)
		h, n := float64(l.Nodes), float64(l.Nodes*l.GPUsPerNode)
		net := float64(m.NICs) * m.NetBW * (n - 1) / n * h / (h - 1)
		want := math.Min(net, 2*(n-1)/n/(2*float64(l.GPUsPerNode-1)/float64(l.GPUsPerNode)/m.Ring.Total()))
		require.InDelta(t, want, m.HierBus, want*1e-9, "%v", l)
		each := m.PredictEach(8 << 30)
		require.Equal(t, []string{"ring", "tree", "hier", "hiertree"}, []string{each[0].Algo, each[1].Algo, each[2].Algo, each[3].Algo})
		// Trees of hosts: log2 h network latencies where the rings pay
		// h-1, and the ports carry 2 times the data (h/(h-1) of the rings').
		require.LessOrEqual(t, m.HierTreeLatUs, m.HierLatUs, "%v", l)
		if l.Nodes >= 16 {
			require.Less(t, m.HierTreeLatUs*2, m.HierLatUs, "%v", l)
		}
		require.LessOrEqual(t, m.HierTreeBus, m.HierBus*(1+1e-9), "%v", l)
		require.Greater(t, each[2].BusBW, each[0].BusBW, "%v: the network carries less", l)
		require.Less(t, each[1].TimeUs, each[2].TimeUs*10, "sanity")
	}
	one, err := Simulate(tp, Layout{1, 8})
	require.NoError(t, err)
	require.Zero(t, one.HierBus)
	require.Len(t, one.PredictEach(1<<20), 1)
}
