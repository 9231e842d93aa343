package collective_test

import (
	"math"
	"math/bits"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

func TestHostSummaryCarriesNICs(t *testing.T) {
	shm, nics, names, mbps, ok := collective.HostSummaryRoundTrip("@goccl-1", []string{"10.0.1.2:4000", "10.0.2.2:4001"}, []string{"eth1", "eth2"}, 200000)
	require.True(t, ok)
	require.Equal(t, uint32(200000), mbps)
	require.Equal(t, "@goccl-1", shm)
	require.Equal(t, []string{"10.0.1.2:4000", "10.0.2.2:4001"}, nics)
	require.Equal(t, []string{"eth1", "eth2"}, names)
	_, nics, _, _, ok = collective.HostSummaryRoundTrip("", nil, nil, 0)
	require.True(t, ok)
	require.Empty(t, nics)
}

// FuzzHostSummary: a peer's summary comes off the network (through the
// authenticated bootstrap, but still): decoding never panics.
func FuzzHostSummary(f *testing.F) {
	f.Add([]byte{6, 0, 2, 0, 0, 0, 0, 1, 1, 'a', 1, 'b', 0, 0, 39, 16, 0, 3, 13, 64, 1, 'm', 1, 'g'})
	f.Add([]byte{6, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 1, 3})
	f.Add([]byte{6, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0})
	f.Add([]byte{6, 0, 2, 0, 0, 0, 0, 17})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) { collective.DecodeHostSummary(b) })
}

// TestTCPModelBoundedByNICSpeed: the TCP link model's bandwidth is the
// slowest NIC's across the ranks that use TCP, and unbounded when any of
// them cannot say.
func TestTCPModelBoundedByNICSpeed(t *testing.T) {
	require.Equal(t, 1.25e9, collective.TCPNICBound(10000, 25000, 10000))
	require.Equal(t, 2.5e8, collective.TCPNICBound(2000, 25000))
	require.True(t, math.IsInf(collective.TCPNICBound(10000, 0), 1))
}

// TestRDMAModelBoundedByPortRate: the RDMA link model's bandwidth is the
// slowest port's across the ranks that have one (a rank without a port
// does not count), and unbounded when any port's rate is unknown (the
// emulated device's).
func TestRDMAModelBoundedByPortRate(t *testing.T) {
	require.Equal(t, 12.5e9, collective.IBPortBound(200000, 100000, 200000))
	require.Equal(t, 25e9, collective.IBPortBound(200000, -1, 400000))
	require.True(t, math.IsInf(collective.IBPortBound(200000, 0), 1))
	require.True(t, math.IsInf(collective.IBPortBound(-1, -1), 1))
	mbps, ok := collective.IBRateRoundTrip(400000)
	require.True(t, ok)
	require.Equal(t, uint32(400000), mbps)
}

// TestIntraLinkFromTheTable: the tuner's intra-host model is shared
// memory's only when every same-host pair of the job uses it, whichever
// rank asks: a host whose ranks talk TCP makes it the network's for all.
func TestIntraLinkFromTheTable(t *testing.T) {
	require.True(t, collective.IntraLinkIsShm([]string{"a", "a", "b", "b"}, []bool{true, true, true, true}))
	require.False(t, collective.IntraLinkIsShm([]string{"a", "a", "b", "b"}, []bool{true, true, true, false}),
		"host b's pair has no shared memory")
	require.False(t, collective.IntraLinkIsShm([]string{"a", "b"}, []bool{true, true}), "no host has two ranks")
}

// TestOversubscribed: a host's waiting ranks yield at every poll when it
// runs more ranks than it has CPUs, counted per machine.
func TestOversubscribed(t *testing.T) {
	four := []string{"a", "a", "a", "a"}
	require.True(t, collective.Oversubscribed(four, 2, "a"), "4 ranks on 2 CPUs")
	require.False(t, collective.Oversubscribed(four, 4, "a"), "4 ranks on 4 CPUs")
	split := []string{"a", "a", "b", "b"}
	require.False(t, collective.Oversubscribed(split, 2, "a"), "2 ranks a host on 2 CPUs each")
	require.True(t, collective.Oversubscribed([]string{"a", "a", "a", "b"}, 2, "a"), "3 ranks on host a")
	require.False(t, collective.Oversubscribed([]string{"a", "a", "a", "b"}, 2, "b"), "1 rank on host b")
	// Ranks that publish their CPU sets count the CPUs of the sets' union:
	// two ranks bound to cores of their own are not oversubscribed, two
	// bound to one core are; one rank without a set falls back to the
	// fewest CPUs any rank reports.
	require.False(t, collective.OversubscribedSets([]string{"a", "a"}, []uint64{0b01, 0b10}, "a"), "2 ranks on cores of their own")
	require.True(t, collective.OversubscribedSets([]string{"a", "a"}, []uint64{0b01, 0b01}, "a"), "2 ranks bound to one core")
	require.True(t, collective.OversubscribedSets(four, []uint64{0b11, 0b11, 0b11, 0b11}, "a"), "4 ranks on 2 CPUs")
	require.False(t, collective.OversubscribedSets(four, []uint64{1, 2, 4, 1 << 40}, "a"), "4 ranks on 4 cores of their own")
	require.True(t, collective.OversubscribedSets([]string{"a", "a"}, []uint64{0b01, 0}, "a"), "one set unknown: the fewest CPUs, 1")
	// The engine's slicing follows any host's, so that every rank cuts alike.
	require.True(t, collective.AnyOversubscribed([]string{"a", "a", "a", "b"}, 2), "3 ranks on host a")
	require.False(t, collective.AnyOversubscribed(split, 2), "2 ranks a host on 2 CPUs each")
	require.False(t, collective.AnyOversubscribed(four, 4), "4 ranks on 4 CPUs")
	// Hosts of one machine (namespaces, containers) share its CPUs.
	all := []uint64{0b11, 0b11, 0b11, 0b11}
	busy, ch := collective.OversubscribedOn(split, []string{"m", "m", "m", "m"}, all, "b")
	require.True(t, busy, "2 hosts x 2 ranks on one machine of 2 CPUs")
	require.Equal(t, 1, ch, "channels per rank on a shared machine")
	busy, ch = collective.OversubscribedOn(split, []string{"m", "m", "n", "n"}, all, "b")
	require.False(t, busy, "2 hosts x 2 ranks on two machines of 2 CPUs")
	require.Equal(t, 1, ch)
	busy, ch = collective.OversubscribedOn(split, []string{"m", "m", "m", "m"}, []uint64{0b1, 0b10, 0b100, 0b1000}, "a")
	require.False(t, busy, "4 ranks on cores of their own of one machine")
	require.Equal(t, 1, ch)
	busy, _ = collective.OversubscribedOn(split, []string{"", "", "", ""}, all, "a")
	require.False(t, busy, "no machine known: counted by host")
	busy, ch = collective.OversubscribedOn([]string{"a", "b"}, []string{"m", "m"}, []uint64{0b1111, 0b1111}, "a")
	require.False(t, busy, "2 hosts of one machine with 4 CPUs")
	require.Equal(t, 2, ch, "2 ranks share the 4 CPUs: 2 channels each, not 4")
	busy, _ = collective.OversubscribedOn([]string{"a", "a", "a"}, []string{"m", "n", "n"}, []uint64{0b11, 0b11, 0b11}, "a")
	require.False(t, busy, "one host id on two machines, 2 ranks on the busier")
	busy, _ = collective.OversubscribedOn([]string{"a", "a", "b", "b", "c"}, []string{"m", "n", "n", "n", "o"}, []uint64{1, 0b11, 0b11, 0b11, 1}, "a")
	require.True(t, busy, "host a's second rank shares machine n with host b's ranks: 3 ranks on 2 CPUs")
}

// TestCPUMask: the CPU set survives the host summary, and on Linux this
// process's set has as many CPUs as the runtime counts.
func TestCPUMask(t *testing.T) {
	for _, m := range [][]byte{nil, {1}, {0, 0x80}, make([]byte, 128)} {
		got, mbps, ok := collective.CPUMaskRoundTrip(m)
		require.True(t, ok, "%x", m)
		require.Equal(t, uint32(7), mbps)
		if len(m) == 0 {
			require.Empty(t, got)
		} else {
			require.Equal(t, m, got)
		}
	}
	if runtime.GOOS != "linux" {
		t.Skip("CPU sets are read on Linux only")
	}
	n := 0
	for _, b := range collective.CPUMask() {
		n += bits.OnesCount8(b)
	}
	require.Equal(t, runtime.NumCPU(), n)
}

// TestLinkModelsPickTheMeasuredAllGathers: with the models the
// communicator uses, the tuner picks the all-gathers measured fastest on
// one host (docs/performance.md, "Recursive doubling for the all-gather").
func TestLinkModelsPickTheMeasuredAllGathers(t *testing.T) {
	pick := func(n int, l algorithms.LinkModel, bytes int64) algorithms.Algorithm {
		return algorithms.Tune(algorithms.Problem{Coll: algorithms.CollAllGather, NRanks: n, Bytes: bytes, Link: l}, algorithms.AlgoAuto, 0, 0).Algo
	}
	require.Equal(t, algorithms.RecDoubling, pick(4, collective.TCPLinkModel, 64<<10))
	require.Equal(t, algorithms.OneShot, pick(4, collective.TCPLinkModel, 1<<20))
	require.Equal(t, algorithms.RecDoubling, pick(8, collective.TCPLinkModel, 256<<10))
	require.Equal(t, algorithms.Ring, pick(8, collective.TCPLinkModel, 16<<20))
	require.Equal(t, algorithms.OneShot, pick(4, collective.ShmLinkModel, 64<<10))
	require.Equal(t, algorithms.RecDoubling, pick(8, collective.ShmLinkModel, 64<<10))
	require.Equal(t, algorithms.Ring, pick(8, collective.ShmLinkModel, 16<<20))
}
