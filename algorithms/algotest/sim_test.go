package algotest_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/algorithms/algotest"
)

type collAlgo struct {
	coll algorithms.Collective
	algo algorithms.Algorithm
}

var everyAlgorithm = []collAlgo{
	{algorithms.CollAllReduce, algorithms.Ring},
	{algorithms.CollAllReduce, algorithms.Tree},
	{algorithms.CollAllReduce, algorithms.RecDoubling},
	{algorithms.CollAllReduce, algorithms.Rabenseifner},
	{algorithms.CollAllReduce, algorithms.OneShot},
	{algorithms.CollReduceScatter, algorithms.Ring},
	{algorithms.CollReduceScatter, algorithms.OneShot},
	{algorithms.CollAllGather, algorithms.Ring},
	{algorithms.CollAllGather, algorithms.OneShot},
	{algorithms.CollAllGather, algorithms.RecDoubling},
	{algorithms.CollBroadcast, algorithms.Ring},
	{algorithms.CollReduce, algorithms.Ring},
	{algorithms.CollReduce, algorithms.OneShot},
	{algorithms.CollAllToAll, algorithms.Pairwise},
	{algorithms.CollSend, algorithms.P2P},
}

// counts returns the element counts the issue asks for: 0, 1, primes,
// counts below the rank count and counts not divisible by it.
func counts(n int) []int {
	cs := []int{0, 1, 2, 3, 5, 13, 31, 2*n + 3}
	if n > 1 {
		cs = append(cs, n-1)
	}
	return cs
}

// variant is one way of cutting the work: pieces across channels, slice
// size and link capacity (2 slots is the strictest for deadlocks).
type variant struct {
	channels, pieces, slice, slots int
	inPlace                        bool
}

var variants = []variant{
	{channels: 1, pieces: 1, slice: 1, slots: 2},
	{channels: 1, pieces: 3, slice: 2, slots: 3, inPlace: true},
	{channels: 2, pieces: 5, slice: 3, slots: 8},
	{channels: 1, pieces: 1, slice: 1 << 20, slots: 2, inPlace: true},
}

func TestSimulateEveryAlgorithm(t *testing.T) {
	maxRanks := 64
	if testing.Short() {
		maxRanks = 24
	}
	for _, ca := range everyAlgorithm {
		t.Run(fmt.Sprintf("coll=%v/algo=%v", ca.coll, ca.algo), func(t *testing.T) {
			t.Parallel()
			for n := 1; n <= maxRanks; n++ {
				if (ca.coll == algorithms.CollSend) && n < 2 {
					continue
				}
				for _, count := range counts(n) {
					for vi, v := range variants {
						inPlace := v.inPlace && ca.coll != algorithms.CollAllToAll && ca.coll != algorithms.CollSend
						cfg := algotest.Config{
							Coll: ca.coll, Algo: ca.algo, NRanks: n, Count: count,
							Channels: v.channels, Pieces: v.pieces, SliceElems: v.slice, Slots: v.slots,
							InPlace: inPlace, Seed: uint64(n*1000 + count*10 + vi),
						}
						switch ca.coll {
						case algorithms.CollBroadcast, algorithms.CollReduce:
							cfg.Root = (n - 1) * vi / len(variants)
						case algorithms.CollSend:
							cfg.Root, cfg.Peer = vi%n, (vi+1+count)%n
							if cfg.Peer == cfg.Root {
								cfg.Peer = (cfg.Root + 1) % n
							}
						}
						if err := algotest.Run(cfg); err != nil {
							t.Fatalf("seed %d: %v", cfg.Seed, err)
						}
					}
				}
			}
		})
	}
}

// TestSimulateRingOrders runs ring schedules over random ring orders, as a
// topology search would produce them.
func TestSimulateRingOrders(t *testing.T) {
	seed := uint64(20261130)
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)
	for i := 0; i < 200; i++ {
		n := 1 + rng.IntN(17)
		ring := rng.Perm(n)
		for _, c := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter,
			algorithms.CollAllGather, algorithms.CollBroadcast, algorithms.CollReduce} {
			cfg := algotest.Config{Coll: c, Algo: algorithms.Ring, NRanks: n, Ring: ring, Root: rng.IntN(n),
				Count: rng.IntN(40), Pieces: 1 + rng.IntN(3), SliceElems: 1 + rng.IntN(4), Slots: 2 + rng.IntN(3),
				InPlace: rng.IntN(2) == 0, Seed: rng.Uint64()}
			require.NoError(t, algotest.Run(cfg), "seed %d ring %v", seed, ring)
		}
	}
}

// placements returns host labels for n ranks in the shapes launchers
// produce: one host, block, round robin, uneven hosts, every rank alone,
// and a random assignment.
func placements(n int, rng *rand.Rand) map[string][]int {
	out := map[string][]int{}
	fill := func(name string, f func(r int) int) {
		h := make([]int, n)
		for r := range h {
			h[r] = f(r)
		}
		out[name] = h
	}
	fill("one host", func(int) int { return 0 })
	fill("alone", func(r int) int { return r })
	for _, k := range []int{2, 3} {
		if n >= k {
			per := (n + k - 1) / k
			fill(fmt.Sprintf("block/%d", k), func(r int) int { return r / per })
			fill(fmt.Sprintf("round-robin/%d", k), func(r int) int { return r % k })
		}
	}
	// Uneven: host 0 has one rank, host 1 half of the rest, host 2 the
	// others, labels out of order.
	fill("uneven", func(r int) int {
		switch {
		case r == n-1:
			return 7
		case r%2 == 0:
			return 5
		}
		return 9
	})
	k := 1 + rng.IntN(max(1, n/2))
	fill("random", func(int) int { return rng.IntN(k) })
	return out
}

// TestSimulateHostPlacements proves every schedule for the placements the
// tests and launchers use, 1 to 64 ranks: ring orders from HostRing, the
// tree across hosts, and the position-relabelled all-reduces.
func TestSimulateHostPlacements(t *testing.T) {
	seed := uint64(20261201)
	t.Logf("seed %d", seed)
	maxRanks := 64
	if testing.Short() {
		maxRanks = 20
	}
	for _, ca := range everyAlgorithm {
		t.Run(fmt.Sprintf("coll=%v/algo=%v", ca.coll, ca.algo), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, uint64(ca.coll)<<8|uint64(ca.algo)))
			for n := 2; n <= maxRanks; n++ {
				for name, hosts := range placements(n, rng) {
					v := variants[rng.IntN(len(variants))]
					cfg := algotest.Config{
						Coll: ca.coll, Algo: ca.algo, NRanks: n, Hosts: hosts, Count: counts(n)[rng.IntN(len(counts(n)))],
						Channels: v.channels, Pieces: v.pieces, SliceElems: v.slice, Slots: v.slots,
						InPlace: v.inPlace && ca.coll != algorithms.CollAllToAll && ca.coll != algorithms.CollSend,
						Root:    rng.IntN(n), Seed: rng.Uint64(),
					}
					if ca.coll == algorithms.CollSend {
						cfg.Peer = (cfg.Root + 1 + rng.IntN(n-1)) % n
					}
					require.NoError(t, algotest.Run(cfg), "%d ranks, %s placement %v", n, name, hosts)
				}
			}
		})
	}
}

// TestSimulateHierarchical proves the hierarchical all-reduce, with rings
// and with trees across hosts (Hier, HierTree), and the hierarchical
// reduce-scatter and all-gather, for every grid of 1..64 ranks (hosts ×
// ranks per host), in block and round-robin numbering and every variant,
// and that uneven hosts are refused.
func TestSimulateHierarchical(t *testing.T) {
	for _, ca := range []collAlgo{{algorithms.CollAllReduce, algorithms.Hier}, {algorithms.CollAllReduce, algorithms.HierTree},
		{algorithms.CollReduceScatter, algorithms.Hier}, {algorithms.CollAllGather, algorithms.Hier}} {
		t.Run(fmt.Sprintf("coll=%v/algo=%v", ca.coll, ca.algo), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, uint64(ca.coll)<<8|uint64(ca.algo)))
			for n := 1; n <= 64; n++ {
				for h := 1; h <= n; h++ {
					if n%h != 0 || (testing.Short() && n > 24) {
						continue
					}
					m := n / h
					for _, rr := range []bool{false, true} {
						hosts := make([]int, n)
						for r := range hosts {
							hosts[r] = r / m
							if rr {
								hosts[r] = r % h
							}
						}
						for vi, v := range variants {
							count := counts(n)[rng.IntN(len(counts(n)))]
							cfg := algotest.Config{Coll: ca.coll, Algo: ca.algo, NRanks: n, Hosts: hosts, Count: count,
								Channels: v.channels, Pieces: v.pieces, SliceElems: v.slice, Slots: v.slots, InPlace: v.inPlace, Seed: uint64(n*100 + h*10 + vi)}
							require.NoError(t, algotest.Run(cfg), "%d hosts × %d, round robin %v, count %d", h, m, rr, count)
						}
					}
				}
			}
		})
	}
	for _, c := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter, algorithms.CollAllGather} {
		_, err := algorithms.Build(algorithms.Params{Coll: c, Algo: algorithms.Hier, NRanks: 3, Hosts: []int{0, 0, 1}})
		require.ErrorContains(t, err, "same number of ranks on every host; hosts have 2, 1", "%v", c)
	}
}

// TestSimulatorCatchesBrokenSchedules makes sure the simulator is not
// vacuous: each mutation of a correct schedule must be reported.
func TestSimulatorCatchesBrokenSchedules(t *testing.T) {
	p := algorithms.Params{Coll: algorithms.CollAllReduce, Algo: algorithms.Ring, NRanks: 4}
	mutations := map[string]func(s []*algorithms.Schedule){
		"drop final":         func(s []*algorithms.Schedule) { clearFinal(s[2]) },
		"reduce wrong block": func(s []*algorithms.Schedule) { s[1].Steps[1].Src.Block = (s[1].Steps[1].Src.Block + 1) % 4 },
		"swap steps": func(s []*algorithms.Schedule) {
			s[0].Steps[4], s[0].Steps[5] = s[0].Steps[5], s[0].Steps[4]
		},
		"everyone receives first": func(s []*algorithms.Schedule) {
			for _, x := range s {
				x.Steps[0], x.Steps[1] = x.Steps[1], x.Steps[0]
			}
		},
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			scheds, err := algorithms.BuildAll(p)
			require.NoError(t, err)
			mutate(scheds)
			err = algotest.RunSchedules(algotest.Config{Coll: p.Coll, Algo: p.Algo, NRanks: 4, Count: 8}, scheds)
			require.Error(t, err)
			t.Log(err)
		})
	}
}

// TestOneShotNeedsItsCopyInPlace: run in place without the private copy
// of the input, a OneShot rank past the first two overwrites its own
// contribution (with rank 0's) before it folds it in.
func TestOneShotNeedsItsCopyInPlace(t *testing.T) {
	p := algorithms.Params{Coll: algorithms.CollAllReduce, Algo: algorithms.OneShot, NRanks: 4}
	cfg := algotest.Config{Coll: p.Coll, Algo: p.Algo, NRanks: 4, Count: 8, InPlace: true}
	scheds, err := algorithms.BuildAll(p)
	require.NoError(t, err)
	require.NoError(t, algotest.RunSchedules(cfg, scheds))
	for _, s := range scheds {
		s.CopyInPlace = false
	}
	err = algotest.RunSchedules(cfg, scheds)
	require.Error(t, err)
	t.Log(err)
}

func clearFinal(s *algorithms.Schedule) {
	for i := range s.Steps {
		s.Steps[i].Final = false
	}
}

// TestScaledInputReadOnce: the engine's pre-multiplied sum scales the
// input as a step reads it, so a reduction that reads Input after writing
// it in place would scale a value twice. A one-rank all-reduce that
// copies its input to the output twice does that in place only.
func TestScaledInputReadOnce(t *testing.T) {
	p := algorithms.Params{Coll: algorithms.CollAllReduce, Algo: algorithms.Ring, NRanks: 1}
	for _, inPlace := range []bool{false, true} {
		scheds, err := algorithms.BuildAll(p)
		require.NoError(t, err)
		s := scheds[0]
		first := s.Steps[0]
		first.Final = false
		s.Steps = append([]algorithms.Step{first}, s.Steps...)
		err = algotest.RunSchedules(algotest.Config{Coll: p.Coll, Algo: p.Algo, NRanks: 1, Count: 8, InPlace: inPlace}, scheds)
		if !inPlace {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, "scale it twice")
	}
}
