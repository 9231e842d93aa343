package algorithms

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// randomHosts labels n ranks with up to k hosts, in no particular order.
func randomHosts(rng *rand.Rand, n, k int) []int {
	h := make([]int, n)
	for r := range h {
		h[r] = 10 + rng.IntN(k)
	}
	return h
}

// crossings counts the ring's hops between different hosts.
func crossings(ring, hosts []int) int {
	c := 0
	for i, r := range ring {
		if hosts[r] != hosts[ring[(i+1)%len(ring)]] {
			c++
		}
	}
	return c
}

func TestHostRing(t *testing.T) {
	// Round robin over two hosts: the identity ring crosses at every hop,
	// the host ring twice.
	hosts := []int{0, 1, 0, 1, 0, 1}
	ring := HostRing(hosts)
	require.Equal(t, []int{0, 2, 4, 1, 3, 5}, ring)
	require.Equal(t, 6, crossings([]int{0, 1, 2, 3, 4, 5}, hosts))
	require.Equal(t, 2, crossings(ring, hosts))
	// Block placement: the identity, so single-host and block schedules
	// are the ones they always were.
	require.Equal(t, []int{0, 1, 2, 3}, HostRing([]int{4, 4, 9, 9}))

	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		n := 1 + rng.IntN(40)
		hosts := randomHosts(rng, n, 1+rng.IntN(6))
		ring := HostRing(hosts)
		require.NoError(t, checkPerm(ring, n))
		if k := HostCount(hosts); k > 1 {
			require.Equal(t, k, crossings(ring, hosts), "hosts %v ring %v: each host entered once", hosts, ring)
		}
		// Within a host, rank order.
		for i := 1; i < n; i++ {
			if hosts[ring[i]] == hosts[ring[i-1]] {
				require.Less(t, ring[i-1], ring[i])
			}
		}
	}
}

// TestHostTree checks that each tree of HostTree spans the ranks with
// consistent parent and child links, chains inside hosts, and crosses
// hosts exactly hosts-1 times, only between heads.
func TestHostTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		n := 1 + rng.IntN(40)
		hosts := randomHosts(rng, n, 1+rng.IntN(8))
		head := map[int]int{}
		for r := n - 1; r >= 0; r-- {
			head[hosts[r]] = r
		}
		for tr := range 2 {
			parents := make([]int, n)
			roots, cross := 0, 0
			for r := range n {
				p, cs := HostTree(hosts, r, tr)
				parents[r] = p
				if p < 0 {
					roots++
				} else {
					_, pcs := HostTree(hosts, p, tr)
					require.Contains(t, pcs, r, "hosts %v tree %d: %d's parent %d does not list it", hosts, tr, r, p)
					if hosts[p] != hosts[r] {
						cross++
						require.Equal(t, head[hosts[r]], r, "only heads link across hosts")
						require.Equal(t, head[hosts[p]], p, "only heads link across hosts")
					}
				}
				for _, c := range cs {
					cp, _ := HostTree(hosts, c, tr)
					require.Equal(t, r, cp, "hosts %v tree %d: child %d of %d", hosts, tr, c, r)
				}
			}
			require.Equal(t, 1, roots, "hosts %v tree %d", hosts, tr)
			require.Equal(t, HostCount(hosts)-1, cross, "hosts %v tree %d", hosts, tr)
			// Acyclic: every rank reaches the root.
			for r := range n {
				x := r
				for steps := 0; parents[x] >= 0; steps++ {
					require.Less(t, steps, n, "hosts %v tree %d: cycle from %d", hosts, tr, r)
					x = parents[x]
				}
			}
		}
	}
}

// TestSchedulesAcrossHosts checks which links the schedules use for a
// round-robin placement: the ring and the relabelled all-reduces talk
// across hosts only where the host ring does, and the tree only between
// heads.
func TestSchedulesAcrossHosts(t *testing.T) {
	hosts := []int{0, 1, 0, 1, 0, 1, 0, 1} // 2 hosts × 4 ranks, round robin
	cases := []struct {
		coll Collective
		algo Algorithm
		// the most peers on another host a rank may have
		cross int
	}{
		{CollAllReduce, Ring, 1}, {CollReduceScatter, Ring, 1}, {CollAllGather, Ring, 1},
		{CollBroadcast, Ring, 1}, {CollAllReduce, Tree, 1},
		// log2(8) = 3 rounds, the partner across hosts in the last only.
		{CollAllReduce, RecDoubling, 1}, {CollAllReduce, Rabenseifner, 1},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v/%v", c.coll, c.algo), func(t *testing.T) {
			total := 0
			for r := range hosts {
				s, err := Build(Params{Coll: c.coll, Algo: c.algo, NRanks: len(hosts), Rank: r, Hosts: hosts})
				require.NoError(t, err)
				require.NoError(t, s.Check())
				n := 0
				for _, p := range s.Peers() {
					if hosts[p] != hosts[r] {
						n++
					}
				}
				require.LessOrEqual(t, n, c.cross, "rank %d peers %v", r, s.Peers())
				total += n
			}
			require.Positive(t, total, "the hosts must be joined")
		})
	}
	// Rabenseifner's first halving (half the data) stays on the host.
	for r := range hosts {
		s, err := Build(Params{Coll: CollAllReduce, Algo: Rabenseifner, NRanks: len(hosts), Rank: r, Hosts: hosts})
		require.NoError(t, err)
		require.Equal(t, hosts[r], hosts[s.Steps[0].SendPeer], "rank %d first step %v", r, s.Steps[0])
		require.Equal(t, int32(4), s.Steps[0].Tx.N, "half of 8 blocks")
	}
	// Without hosts the identity ring crosses at every hop: the test above
	// could fail.
	s, err := Build(Params{Coll: CollAllReduce, Algo: Ring, NRanks: 8, Rank: 0})
	require.NoError(t, err)
	require.ElementsMatch(t, []int{1, 7}, s.Peers())
	_, err = Build(Params{Coll: CollAllReduce, Algo: Ring, NRanks: 8, Hosts: []int{0, 1}})
	require.ErrorContains(t, err, "hosts has 2 entries")
}

// TestHierarchicalTraffic counts the blocks each host sends to other
// hosts in one reduce-scatter and one all-gather: m(h-1) of the n blocks
// with Hier, (h-1)/h of the data, where the ring over HostRing sends n-1,
// (n-1)/n of it, over its one crossing; in both every rank sends n-1
// blocks in n-1 steps.
func TestHierarchicalTraffic(t *testing.T) {
	for _, shape := range []struct{ h, m int }{{2, 2}, {2, 4}, {3, 3}, {4, 2}, {2, 1}, {1, 3}} {
		for _, rr := range []bool{false, true} {
			n := shape.h * shape.m
			hosts := make([]int, n)
			for r := range hosts {
				hosts[r] = r / shape.m
				if rr {
					hosts[r] = r % shape.h
				}
			}
			for _, c := range []Collective{CollReduceScatter, CollAllGather} {
				for _, a := range []Algorithm{Ring, Hier} {
					name := fmt.Sprintf("%dx%d/roundrobin=%v/%v/%v", shape.h, shape.m, rr, c, a)
					across := map[int]int{}
					for r := range n {
						s, err := Build(Params{Coll: c, Algo: a, NRanks: n, Rank: r, Hosts: hosts})
						require.NoError(t, err, name)
						total := 0
						for _, st := range s.Steps {
							k := st.sentBlocks()
							total += k
							if k > 0 && hosts[st.SendPeer] != hosts[r] {
								across[hosts[r]] += k
							}
						}
						require.Equal(t, n-1, total, "%s: rank %d sends", name, r)
					}
					want := n - 1
					if a == Hier || shape.m == 1 {
						want = shape.m * (shape.h - 1)
					}
					if shape.h == 1 {
						want = 0
					}
					for hs := range shape.h {
						require.Equal(t, want, across[hs], "%s: blocks host %d sends to other hosts", name, hs)
					}
				}
			}
		}
	}
}

// TestHierarchicalHalvesOnOneAxis: with one rank per host, or one host,
// the hierarchical reduce-scatter and all-gather are the ring's over
// HostRing, step for step.
func TestHierarchicalHalvesOnOneAxis(t *testing.T) {
	for _, hosts := range [][]int{{0, 1, 2, 3, 4}, {3, 1, 0, 2}, {0, 0, 0, 0}, nil} {
		n := max(len(hosts), 3)
		for _, c := range []Collective{CollReduceScatter, CollAllGather} {
			for r := range n {
				ring, err := Build(Params{Coll: c, Algo: Ring, NRanks: n, Rank: r, Hosts: hosts})
				require.NoError(t, err)
				hier, err := Build(Params{Coll: c, Algo: Hier, NRanks: n, Rank: r, Hosts: hosts})
				require.NoError(t, err)
				require.Equal(t, ring.Steps, hier.Steps, "%v hosts %v rank %d", c, hosts, r)
			}
		}
	}
}
