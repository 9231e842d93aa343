package algorithms

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

var testLink = LinkModel{Latency: 5e-6, Bandwidth: 5e9, ReduceRate: 5e9, MaxChannels: 4, ChannelBytes: 1 << 20, ChunkBytes: 512 << 10}

func TestTunePicksLatencyAlgorithmsForSmallAndRingForLarge(t *testing.T) {
	small := Tune(Problem{Coll: CollAllReduce, NRanks: 64, Bytes: 8, Link: testLink}, AlgoAuto, 0, 0)
	require.Equal(t, RecDoubling, small.Algo)
	require.Equal(t, 1, small.Channels)
	// One hop beats recursive doubling where the latter needs its fold
	// (3, 5 ranks), not where it needs two rounds or more (4, 8 ranks);
	// two ranks tie, and the exchange is preferred.
	tiny := func(n int) Algorithm {
		return Tune(Problem{Coll: CollAllReduce, NRanks: n, Bytes: 8, Link: testLink}, AlgoAuto, 0, 0).Algo
	}
	require.Equal(t, RecDoubling, tiny(2))
	require.Equal(t, OneShot, tiny(3))
	require.Equal(t, RecDoubling, tiny(4))
	require.Equal(t, OneShot, tiny(5))
	require.Equal(t, RecDoubling, tiny(8))
	// n-1 whole vectors per rank lose once bytes count.
	require.NotEqual(t, OneShot, Tune(Problem{Coll: CollAllReduce, NRanks: 4, Bytes: 1 << 20, Link: testLink}, AlgoAuto, 0, 0).Algo)
	// Where posting a message costs a tenth of a hop (shared memory), one
	// hop wins for small operations at any of these rank counts, and still
	// loses once bytes count.
	cheap := testLink
	cheap.PostCost = 0.1
	for _, n := range []int{2, 3, 4, 6, 8, 16} {
		want := OneShot
		if n == 2 {
			want = RecDoubling // a tie: the same single exchange
		}
		require.Equal(t, want, Tune(Problem{Coll: CollAllReduce, NRanks: n, Bytes: 8, Link: cheap}, AlgoAuto, 0, 0).Algo, "%d ranks", n)
	}
	require.NotEqual(t, OneShot, Tune(Problem{Coll: CollAllReduce, NRanks: 4, Bytes: 1 << 20, Link: cheap}, AlgoAuto, 0, 0).Algo)
	large := Tune(Problem{Coll: CollAllReduce, NRanks: 8, Bytes: 256 << 20, Link: testLink}, AlgoAuto, 0, 0)
	require.Contains(t, []Algorithm{Ring, Rabenseifner}, large.Algo)
	require.Equal(t, 4, large.Channels)
	if large.Algo == Ring {
		require.Equal(t, int64(512<<10), large.ChunkBytes)
	}
}

func TestTuneHonoursForcedChoices(t *testing.T) {
	p := Problem{Coll: CollAllReduce, NRanks: 8, Bytes: 8, Link: testLink}
	pl := Tune(p, Tree, 3, 4096)
	require.Equal(t, Plan{Algo: Tree, Channels: 3, ChunkBytes: 4096}, pl)
	// A forced algorithm that does not implement the collective leaves the
	// collective's own choice.
	p.Coll = CollAllGather
	require.Equal(t, Ring, Tune(p, Tree, 0, 0).Algo)
}

func TestCost(t *testing.T) {
	p := Problem{Coll: CollAllReduce, NRanks: 4, Bytes: 1 << 20, Link: testLink}
	require.True(t, math.IsInf(Cost(p, Pairwise, 1), 1))
	for _, a := range []Algorithm{Ring, Tree, RecDoubling, Rabenseifner, OneShot} {
		c1 := Cost(p, a, 1)
		q := p
		q.Bytes *= 2
		require.Greater(t, Cost(q, a, 1), c1, "%v cost must grow with bytes", a)
		require.Greater(t, c1, 0.0)
	}
	require.Error(t, LinkModel{}.Validate())
	require.NoError(t, testLink.Validate())
}

func TestPieces(t *testing.T) {
	s, err := Build(Params{Coll: CollAllReduce, Algo: Ring, NRanks: 4})
	require.NoError(t, err)
	pl := Plan{Algo: Ring, Channels: 3, ChunkBytes: 1 << 10}
	for _, k := range []int{0, 1, 100, 1 << 20} {
		p := Pieces(s, pl, k, 4, 8, 256)
		require.Zero(t, p%3, "k=%d: %d pieces not a multiple of the channels", k, p)
		require.GreaterOrEqual(t, p, MinPieces(s, k, 8, 256))
		if k == 1<<20 {
			require.GreaterOrEqual(t, p, (1<<20)*4/4/(1<<10))
		}
	}
}

// TestTuneWeighsHierarchy: across hosts with a slow network and fast
// shared memory, the hierarchical all-reduce wins large sizes (its
// network link carries 2(h-1)/h of the data where a flat ring's carries
// 2(n-1)/n); on one host, or hosts of different sizes, it is never
// picked.
func TestTuneWeighsHierarchy(t *testing.T) {
	net := LinkModel{Latency: 10e-6, Bandwidth: 1.5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 2 << 20}
	shm := LinkModel{Latency: 1e-6, Bandwidth: 8e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 512 << 10}
	p := Problem{Coll: CollAllReduce, NRanks: 4, Bytes: 64 << 20, Link: net, Hosts: 2, PerHost: 2, Intra: shm}
	require.Equal(t, Hier, Tune(p, AlgoAuto, 0, 0).Algo)
	ring, hier := Cost(p, Ring, 2), Cost(p, Hier, 2)
	// 1.5× the bytes on the network; the reductions and hops narrow it.
	require.Greater(t, ring/hier, 1.35, "ring %g s, hier %g s", ring, hier)
	// 8 hosts × 8: the network carries 7/4 against 63/32 of the data.
	p8 := Problem{Coll: CollAllReduce, NRanks: 64, Bytes: 256 << 20, Link: net, Hosts: 8, PerHost: 8, Intra: shm}
	require.Equal(t, Hier, Tune(p8, AlgoAuto, 0, 0).Algo)
	one := p
	one.Hosts, one.PerHost = 1, 4
	require.NotEqual(t, Hier, Tune(one, AlgoAuto, 0, 0).Algo)
	require.True(t, math.IsInf(Cost(one, Hier, 1), 1))
	uneven := p
	uneven.PerHost = 0
	require.True(t, math.IsInf(Cost(uneven, Hier, 1), 1))
	alone := p
	alone.Hosts, alone.PerHost = 4, 1
	require.True(t, math.IsInf(Cost(alone, Hier, 1), 1), "one rank per host: a ring")
	require.True(t, math.IsInf(Cost(alone, HierTree, 1), 1), "one rank per host: a tree")
	// Across many hosts the rings' 2(h-1) network hops cost more than the
	// trees' 2·log2 h until the bytes dominate: 128 hosts × 8, the trees
	// by 10× at 8 B and still ahead at 1 MiB; 2 hosts at 64 MiB, the
	// rings (the trees' host link carries 2S against the rings' S there).
	many := Problem{Coll: CollAllReduce, NRanks: 1024, Bytes: 8, Link: net, Hosts: 128, PerHost: 8, Intra: shm}
	require.Less(t, Cost(many, HierTree, 1), Cost(many, Hier, 1)/10)
	many.Bytes = 1 << 20
	require.Less(t, Cost(many, HierTree, 1), Cost(many, Hier, 1))
	require.NotEqual(t, Hier, Tune(many, AlgoAuto, 0, 0).Algo)
	require.Less(t, Cost(p, Hier, 2), Cost(p, HierTree, 2))

	// Reduce-scatter and all-gather: the host's link carries (h-1)/h of
	// the data instead of (n-1)/n, and n-h of the n-1 hops stay inside
	// the host, so 2 × 2 at 64 MiB is about 1.5× faster by the model and
	// the hierarchy is picked at every size; never on one host, with
	// uneven hosts or one rank per host.
	for _, c := range []Collective{CollReduceScatter, CollAllGather} {
		q := p
		q.Coll = c
		require.Equal(t, Hier, Tune(q, AlgoAuto, 0, 0).Algo, "%v", c)
		ring, hier := Cost(q, Ring, 2), Cost(q, Hier, 2)
		require.Greater(t, ring/hier, 1.3, "%v: ring %g s, hier %g s", c, ring, hier)
		q.Bytes = 8
		require.Equal(t, Hier, Tune(q, AlgoAuto, 0, 0).Algo, "%v at 8 B", c)
		require.True(t, math.IsInf(Cost(q, HierTree, 1), 1), "%v has no tree form", c)
		for _, shape := range []struct{ hosts, per int }{{1, 4}, {2, 0}, {4, 1}} {
			q.Hosts, q.PerHost = shape.hosts, shape.per
			require.True(t, math.IsInf(Cost(q, Hier, 1), 1), "%v, %d hosts × %d", c, shape.hosts, shape.per)
			if shape.hosts > 1 {
				require.Equal(t, Ring, Tune(q, AlgoAuto, 0, 0).Algo, "the one-shot form stays on one host")
			} else {
				require.NotEqual(t, Hier, Tune(q, AlgoAuto, 0, 0).Algo)
			}
		}
	}
}

// Two ranks over a link slower than the reduction (TCP's model): the
// one-shot's reduction hides behind the link and it is picked at every
// size, as measured; over one faster than the reduction (shared
// memory's) both count and the ring keeps the large sizes; with three
// ranks the one-shot's n-1 whole vectors still lose once bytes count.
func TestOneShotWhereTheLinkIsSlower(t *testing.T) {
	slow := LinkModel{Latency: 10e-6, Bandwidth: 1.5e9, ReduceRate: 6e9, MaxChannels: 16, ChannelBytes: 4 << 20, ChunkBytes: 2 << 20}
	fast := LinkModel{Latency: 1e-6, Bandwidth: 8e9, ReduceRate: 6e9, MaxChannels: 16, ChannelBytes: 4 << 20, ChunkBytes: 512 << 10, PostCost: 0.1}
	pick := func(l LinkModel, n int, b int64) Algorithm {
		return Tune(Problem{Coll: CollAllReduce, NRanks: n, Bytes: b, Link: l}, AlgoAuto, 0, 0).Algo
	}
	for b := int64(8); b <= 64<<20; b *= 8 {
		require.Equal(t, OneShot, pick(slow, 2, b), "%d bytes", b)
	}
	require.Equal(t, Ring, pick(fast, 2, 8<<20))
	require.Equal(t, Ring, pick(slow, 3, 8<<20))
	// The cost itself: the link's time alone, not the reduction's on top.
	p := Problem{Coll: CollAllReduce, NRanks: 2, Bytes: 1 << 30, Link: slow}
	require.InDelta(t, float64(1<<30)/1.5e9, Cost(p, OneShot, 1), 0.01)
}

// TestTuneOneShotHalves: the one-shot reduce-scatter and all-gather where
// they were measured ahead of the ring (docs/performance.md, "The one-shot
// reduce-scatter and all-gather"): 3 and 4 ranks on one host, every size
// over TCP and for the all-gather over shared memory, only small sizes
// for the reduce-scatter over shared memory; on 2 ranks only the
// reduce-scatter over TCP (a link slower than the reduction), up to one
// chunk; never beyond 4 ranks, across hosts, or on a link that does not
// allow it (the in-process transport's).
func TestTuneOneShotHalves(t *testing.T) {
	tcp := LinkModel{Latency: 10e-6, Bandwidth: 1.5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 2 << 20, OneShotHalves: true}
	shm := LinkModel{Latency: 1e-6, Bandwidth: 8e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 512 << 10, PostCost: 0.1, OneShotHalves: true}
	pick := func(c Collective, n int, l LinkModel, bytes int64) Algorithm {
		return Tune(Problem{Coll: c, NRanks: n, Bytes: bytes, Link: l}, AlgoAuto, 0, 0).Algo
	}
	for _, n := range []int{3, 4} {
		for _, bytes := range []int64{8, 64 << 10, 1 << 20, 64 << 20} {
			require.Equal(t, OneShot, pick(CollReduceScatter, n, tcp, bytes), "tcp rs n=%d %d B", n, bytes)
			require.Equal(t, OneShot, pick(CollAllGather, n, tcp, bytes), "tcp ag n=%d %d B", n, bytes)
			require.Equal(t, OneShot, pick(CollAllGather, n, shm, bytes), "shm ag n=%d %d B", n, bytes)
		}
		require.Equal(t, OneShot, pick(CollReduceScatter, n, shm, 8), "shm rs n=%d 8 B", n)
		for _, bytes := range []int64{1 << 20, 64 << 20} {
			require.Equal(t, Ring, pick(CollReduceScatter, n, shm, bytes), "shm rs n=%d %d B", n, bytes)
		}
	}
	for _, bytes := range []int64{8, 64 << 10, 1 << 20, 2 << 20} {
		require.Equal(t, OneShot, pick(CollReduceScatter, 2, tcp, bytes), "tcp rs n=2 %d B", bytes)
	}
	require.Equal(t, Ring, pick(CollReduceScatter, 2, tcp, 4<<20), "tcp rs n=2 past a chunk")
	for _, bytes := range []int64{8, 64 << 10, 1 << 20, 64 << 20} {
		require.Equal(t, Ring, pick(CollAllGather, 2, tcp, bytes), "tcp ag n=2 %d B", bytes)
		require.Equal(t, Ring, pick(CollReduceScatter, 2, shm, bytes), "shm rs n=2 %d B", bytes)
		require.Equal(t, Ring, pick(CollAllGather, 2, shm, bytes), "shm ag n=2 %d B", bytes)
	}
	for _, c := range []Collective{CollReduceScatter, CollAllGather} {
		ns := []int{5, 8}
		if c == CollAllGather {
			ns = append(ns, 2)
		}
		for _, n := range ns {
			require.True(t, math.IsInf(Cost(Problem{Coll: c, NRanks: n, Bytes: 1 << 20, Link: tcp}, OneShot, 1), 1), "%v n=%d", c, n)
		}
		across := Problem{Coll: c, NRanks: 4, Bytes: 8, Link: tcp, Hosts: 2, PerHost: 2, Intra: shm}
		require.True(t, math.IsInf(Cost(across, OneShot, 1), 1), "%v across hosts", c)
		off := tcp
		off.OneShotHalves = false
		require.Equal(t, Ring, pick(c, 4, off, 8), "%v on a link without OneShotHalves", c)
	}
}

// TestTuneOneShotReduce: the one-shot reduce where it was measured ahead
// of the chain (docs/performance.md, "The one-shot reduce over TCP"):
// small messages on 3 and 4 ranks over TCP; the chain from 16 KiB, over
// shared memory (no OneShotReduce), on 2 ranks (the same schedule: the
// chain, first in order, wins the tie), beyond 4 ranks and across hosts.
func TestTuneOneShotReduce(t *testing.T) {
	tcp := LinkModel{Latency: 10e-6, Bandwidth: 1.5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 2 << 20, OneShotReduce: true}
	shm := LinkModel{Latency: 1e-6, Bandwidth: 8e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 512 << 10, PostCost: 0.1}
	pick := func(n int, l LinkModel, bytes int64) Algorithm {
		return Tune(Problem{Coll: CollReduce, NRanks: n, Bytes: bytes, Link: l}, AlgoAuto, 0, 0).Algo
	}
	for _, n := range []int{3, 4} {
		for _, bytes := range []int64{8, 1 << 10} {
			require.Equal(t, OneShot, pick(n, tcp, bytes), "tcp n=%d %d B", n, bytes)
			require.Equal(t, Ring, pick(n, shm, bytes), "shm n=%d %d B", n, bytes)
		}
		for _, bytes := range []int64{16 << 10, 1 << 20, 64 << 20} {
			require.Equal(t, Ring, pick(n, tcp, bytes), "tcp n=%d %d B", n, bytes)
		}
	}
	require.Equal(t, Ring, pick(2, tcp, 8), "2 ranks")
	for _, n := range []int{5, 8} {
		require.True(t, math.IsInf(Cost(Problem{Coll: CollReduce, NRanks: n, Bytes: 8, Link: tcp}, OneShot, 1), 1), "n=%d", n)
	}
	across := Problem{Coll: CollReduce, NRanks: 4, Bytes: 8, Link: tcp, Hosts: 2, PerHost: 2, Intra: shm}
	require.True(t, math.IsInf(Cost(across, OneShot, 1), 1), "across hosts")
	require.False(t, OneShot.Supports(CollBroadcast), "no one-shot broadcast: its root's n-1 sends took 1.8 times the chain's time")
}

// TestTuneRecDoublingGather checks the recursive-doubling all-gather's
// picks against the crossovers measured with 4, 6 and 8 ranks
// (docs/performance.md, "Recursive doubling for the all-gather").
func TestTuneRecDoublingGather(t *testing.T) {
	tcp := LinkModel{Latency: 10e-6, Bandwidth: 1.5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 2 << 20,
		OneShotHalves: true, ExchangeEfficiency: 0.9}
	shm := LinkModel{Latency: 1e-6, Bandwidth: 8e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 4 << 20, ChunkBytes: 512 << 10,
		PostCost: 0.1, OneShotHalves: true, ExchangeEfficiency: 0.7}
	pick := func(n int, l LinkModel, bytes int64) Algorithm {
		return Tune(Problem{Coll: CollAllGather, NRanks: n, Bytes: bytes, Link: l}, AlgoAuto, 0, 0).Algo
	}
	cases := []struct {
		n     int
		link  LinkModel
		name  string
		bytes int64
		want  Algorithm
	}{
		// 4 ranks over TCP: ahead of the one-shot to 64 KiB, behind at 16 MiB.
		{4, tcp, "tcp", 8, RecDoubling}, {4, tcp, "tcp", 64 << 10, RecDoubling},
		{4, tcp, "tcp", 1 << 20, OneShot}, {4, tcp, "tcp", 64 << 20, OneShot},
		// 8 ranks over TCP: ahead of the ring to 1 MiB, behind at 16 MiB.
		{8, tcp, "tcp", 8, RecDoubling}, {8, tcp, "tcp", 256 << 10, RecDoubling},
		{8, tcp, "tcp", 16 << 20, Ring}, {8, tcp, "tcp", 64 << 20, Ring},
		// 6 ranks (the fold): ahead at small sizes.
		{6, tcp, "tcp", 48, RecDoubling}, {6, tcp, "tcp", 64 << 20, Ring},
		// 3 ranks: the fold's extra hops lose to the one-shot's one.
		{3, tcp, "tcp", 24, OneShot},
		// Shared memory: 4 ranks keep the one-shot; 8 take it at small sizes.
		{4, shm, "shm", 8, OneShot}, {4, shm, "shm", 1 << 20, OneShot},
		{8, shm, "shm", 64 << 10, RecDoubling}, {8, shm, "shm", 16 << 20, Ring},
	}
	for _, c := range cases {
		require.Equal(t, c.want, pick(c.n, c.link, c.bytes), "%s n=%d %d B", c.name, c.n, c.bytes)
	}
	require.True(t, math.IsInf(Cost(Problem{Coll: CollAllGather, NRanks: 2, Bytes: 8, Link: tcp}, RecDoubling, 1), 1), "2 ranks: the ring")
	across := Problem{Coll: CollAllGather, NRanks: 8, Bytes: 8, Link: tcp, Hosts: 2, PerHost: 4, Intra: shm}
	require.True(t, math.IsInf(Cost(across, RecDoubling, 1), 1), "across hosts")
	uneven := Problem{Coll: CollAllGather, NRanks: 4, Bytes: 8, Link: tcp, Hosts: 2, PerHost: 0, Intra: shm}
	require.True(t, math.IsInf(Cost(uneven, RecDoubling, 1), 1), "across hosts of different sizes")
	require.True(t, math.IsInf(Cost(uneven, OneShot, 1), 1), "across hosts of different sizes")
	off := tcp
	off.ExchangeEfficiency = 0
	require.Equal(t, Ring, pick(8, off, 8), "a link without ExchangeEfficiency")
	require.True(t, math.IsInf(Cost(Problem{Coll: CollReduceScatter, NRanks: 8, Bytes: 8, Link: tcp}, RecDoubling, 1), 1),
		"no recursive-doubling reduce-scatter")
	bad := tcp
	bad.ExchangeEfficiency = math.NaN()
	require.Error(t, bad.Validate())
}
