package topology

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func load(t *testing.T, name string) *System {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	require.NoError(t, err)
	defer f.Close()
	s, err := ReadXML(f)
	require.NoError(t, err)
	return s
}

func build(t *testing.T, s *System) *Topo {
	t.Helper()
	tp, err := Build(s)
	require.NoError(t, err)
	return tp
}

// cells returns the matrix cell of every GPU pair and GPU-NIC pair, keyed
// by bus ids.
func cell(t *testing.T, tp *Topo, a, b string) string {
	t.Helper()
	var na, nb *Node
	for _, n := range tp.Nodes {
		if n.Name == a {
			na = n
		}
		if n.Name == b {
			nb = n
		}
	}
	require.NotNil(t, na, a)
	require.NotNil(t, nb, b)
	return tp.Cell(na, nb)
}

// TestAzureNDv2 checks the facts SOURCES.md lists for azure-ndv2.xml.
func TestAzureNDv2(t *testing.T) {
	s := load(t, "azure-ndv2.xml")
	require.Len(t, s.CPUs, 2)
	require.Equal(t, 85, s.CPUs[0].Model)
	tp := build(t, s)
	require.Len(t, tp.GPUs, 8)
	require.Len(t, tp.NICs, 1)
	for _, g := range tp.GPUs {
		require.True(t, g.Slot)
	}
	numa0 := []string{"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0004:00:00.0"}
	numa1 := []string{"0005:00:00.0", "0006:00:00.0", "0007:00:00.0", "0008:00:00.0"}
	for _, a := range numa0 {
		require.Equal(t, "PHB", cell(t, tp, a, "0101:00:00.0"))
		for _, b := range numa0 {
			if a != b {
				require.Equal(t, "PHB", cell(t, tp, a, b))
			}
		}
		for _, b := range numa1 {
			require.Equal(t, "SYS", cell(t, tp, a, b))
		}
	}
	for _, a := range numa1 {
		require.Equal(t, "SYS", cell(t, tp, a, "0101:00:00.0"))
	}
	// PCI links: 16 GT/s x16 = 24 GB/s; SYS between Skylake sockets: 10.
	p := tp.Path(tp.GPUs[0], tp.GPUs[7])
	require.Equal(t, SYS, p.Type)
	require.InDelta(t, 10.0, p.BW, 1e-9)
	require.InDelta(t, 24.0, tp.Path(tp.GPUs[0], tp.GPUs[1]).BW, 1e-9)
}

// TestAzureNDv4 checks the facts SOURCES.md lists for azure-ndv4.xml,
// including the tied nearest NICs and the bus ids out of NUMA order.
func TestAzureNDv4(t *testing.T) {
	tp := build(t, load(t, "azure-ndv4.xml"))
	require.Len(t, tp.GPUs, 8)
	require.Len(t, tp.NICs, 8)
	groups := [][2][]string{
		{{"0003:00:00.0", "0004:00:00.0"}, {"0103:00:00.0", "0104:00:00.0"}},
		{{"0001:00:00.0", "0002:00:00.0"}, {"0101:00:00.0", "0102:00:00.0"}},
		{{"000d:00:00.0", "000e:00:00.0"}, {"0107:00:00.0", "0108:00:00.0"}},
		{{"000b:00:00.0", "000c:00:00.0"}, {"0105:00:00.0", "0106:00:00.0"}},
	}
	for i, g := range groups {
		require.Equal(t, "PIX", cell(t, tp, g[0][0], g[0][1]))
		for _, gpu := range g[0] {
			for _, nic := range g[1] {
				require.Equal(t, "PIX", cell(t, tp, gpu, nic))
			}
			var node *Node
			for _, n := range tp.GPUs {
				if n.Name == gpu {
					node = n
				}
			}
			var near []string
			for _, n := range tp.NearestNICs(node) {
				near = append(near, n.Name)
			}
			require.ElementsMatch(t, g[1], near, gpu)
			for j, h := range groups {
				if j == i {
					continue
				}
				for _, other := range append(h[0], h[1]...) {
					require.Equal(t, "SYS", cell(t, tp, gpu, other), "%s-%s", gpu, other)
				}
			}
		}
	}
}

// TestXMLRoundTrip: XML → document → XML is stable, and the document
// survives JSON.
func TestXMLRoundTrip(t *testing.T) {
	for _, name := range []string{"azure-ndv2.xml", "azure-ndv4.xml", "multihost.xml"} {
		t.Run(name, func(t *testing.T) {
			s := load(t, name)
			var x1, x2 bytes.Buffer
			require.NoError(t, s.WriteXML(&x1))
			s2, err := ReadXML(bytes.NewReader(x1.Bytes()))
			require.NoError(t, err)
			require.NoError(t, s2.WriteXML(&x2))
			require.Equal(t, x1.String(), x2.String())
			require.Equal(t, clearLines(s), clearLines(s2))

			var j bytes.Buffer
			require.NoError(t, s.WriteJSON(&j))
			s3, err := ReadJSON(&j)
			require.NoError(t, err)
			require.Equal(t, clearLines(s), clearLines(s3))
		})
	}
}

// clearLines zeroes the line numbers, which only XML input has.
func clearLines(s *System) *System {
	for _, c := range s.CPUs {
		c.Line = 0
		for _, n := range c.NICs {
			clearNIC(n)
		}
		c.walk(func(p, _ *PCI) {
			p.Line = 0
			if p.GPU != nil {
				p.GPU.Line = 0
				for _, l := range p.GPU.NVLinks {
					l.Line = 0
				}
			}
			if p.NIC != nil {
				clearNIC(p.NIC)
			}
		})
	}
	return s
}

func clearNIC(n *NIC) {
	n.Line = 0
	for _, t := range n.Nets {
		t.Line = 0
	}
}

// TestMultiHostAndToleratedOddities: two hosts in one file, an unknown
// attribute kept, NVLinks to an NVSwitch and to a GPU that is not there.
func TestMultiHostAndToleratedOddities(t *testing.T) {
	s := load(t, "multihost.xml")
	require.Equal(t, []string{"0x1234", "0x5678"}, s.Hosts())
	require.Equal(t, []Attr{{Name: "future_attr", Value: "42"}}, s.CPUs[0].Extra)
	tp := build(t, s)
	require.Len(t, tp.GPUs, 4)
	require.Len(t, tp.NVS, 1, "one NVSwitch node for the host whose GPUs link to NVSwitches")
	require.Len(t, tp.Warnings, 1)
	require.Contains(t, tp.Warnings[0], "0000:99:00.0")
	a, b := tp.GPUs[0], tp.GPUs[1]
	require.Equal(t, "NV12", tp.Cell(a, b))
	require.InDelta(t, 12*20.0, tp.Path(a, b).BW, 1e-9)
	// Across hosts there is no path in one host's graph.
	require.Equal(t, DIS, tp.Path(a, tp.GPUs[2]).Type)
	// Host 2: a direct NVLink pair, and a net port of 400 Gb/s.
	require.Equal(t, "NV4", tp.Cell(tp.GPUs[2], tp.GPUs[3]))
	nic := tp.NearestNICs(tp.GPUs[2])
	require.Len(t, nic, 1)
	require.Equal(t, "mlx5_0", NICName(nic[0]))
	var netBW float64
	for _, l := range nic[0].Links {
		if l.To == nic[0].NICs[0] {
			netBW = l.BW
		}
	}
	require.InDelta(t, 50.0, netBW, 1e-9, "400 Gb/s")
}

func TestXMLErrorsNameElementAndLine(t *testing.T) {
	for _, c := range []struct{ xml, want string }{
		{`<system version="1"><cpu numaid="x"/></system>`, `line 1: <cpu numaid="x">: want an integer`},
		{"<system version=\"1\">\n  <cpu numaid=\"0\">\n    <gpu dev=\"0\"/>\n  </cpu>\n</system>", "line 3: unexpected <gpu> inside <cpu>"},
		{"<system version=\"1\">\n<cpu numaid=\"0\">\n<pci class=\"0x060400\"/>\n</cpu></system>", "line 3: <pci> without busid"},
		{`<system><cpu numaid="0"><pci busid="zz:00.0"/></cpu></system>`, `<pci busid="zz:00.0">: want dddd:bb:dd.f`},
		{`<topology/>`, "root element <topology>, want <system>"},
		{`<system><cpu numaid="0"><pci busid="0000:01:00.0"><gpu dev="0" sm="90"><nvlink count="2"/></gpu></pci></cpu></system>`, "<nvlink> without target"},
		{`<system><cpu numaid="0"><nic><net name="a" speed="fast"/></nic></cpu></system>`, `<net speed="fast">: want an integer`},
		{`<system><cpu`, "XML"},
	} {
		_, err := ReadXML(strings.NewReader(c.xml))
		require.Error(t, err, c.xml)
		require.Contains(t, err.Error(), c.want, c.xml)
	}
}

func TestPCIBandwidthAndNVLinkGenerations(t *testing.T) {
	require.InDelta(t, 24.0, PCIBW("16 GT/s", 16), 1e-9)
	require.InDelta(t, 24.0, PCIBW("16.0 GT/s PCIe", 0), 1e-9)
	require.InDelta(t, 48.0, PCIBW("32.0 GT/s PCIe", 16), 1e-9)
	require.InDelta(t, 3.0, PCIBW("2.5 GT/s", 16), 1e-9)
	require.InDelta(t, 12.0, PCIBW("", 16), 1e-9)
	require.InDelta(t, 20.6, NVLinkBW(90), 1e-9)
	require.InDelta(t, 20.0, NVLinkBW(80), 1e-9)
	require.InDelta(t, 40.1, NVLinkBW(100), 1e-9)
	require.InDelta(t, 12.0, NVLinkBW(86), 1e-9)
	require.Equal(t, "0000:17:00.0", normBusID("00000000:17:00.0"))
	require.Equal(t, "0000:17:00.0", normBusID("17:00.0"))
}

func TestGPUByBusIDMatchesEverySpelling(t *testing.T) {
	s := load(t, "multihost.xml")
	gpus := s.GPUs()
	require.NotEmpty(t, gpus)
	for _, g := range gpus {
		bus := g.PCI.BusID // dddd:bb:dd.f
		for _, spelling := range []string{bus, strings.ToUpper(bus), "0000" + bus, bus[5:]} {
			got, ok := s.GPUByBusID(g.CPU.HostHash, spelling)
			require.True(t, ok, "%q", spelling)
			require.Same(t, g.Item, got.Item, "%q", spelling)
		}
	}
	_, ok := s.GPUByBusID("", "0000:ff:1f.7")
	require.False(t, ok)
	_, ok = s.GPUByBusID("no such host", gpus[0].PCI.BusID)
	require.False(t, ok)
}
