package algorithms

import "fmt"

// Schedules across hosts.
//
// A communicator's rank numbers are the launcher's, and launchers number
// ranks in many ways: block (ranks 0..k-1 on the first host), round robin
// (mpirun --map-by node, or a scheduler that interleaves), or in whatever
// order the ranks happened to register. A ring over the rank numbers
// then crosses hosts at every hop when ranks are interleaved, and every
// hop of a ring runs at the speed of its slowest link. So, as NCCL does
// (src/graph/search.cc searches for rings that leave each node once), the
// schedules here are built over the topology's order, not the numbers:
//
//   - HostRing orders the ring host by host (hosts in the order of their
//     lowest rank, each host's ranks in rank order), so a ring over h hosts
//     crosses h host boundaries, each inter-host link once per direction,
//     whatever the numbering. With block placement it is the identity, so
//     those schedules are unchanged.
//   - The tree across hosts is NCCL's (src/graph/trees.cc and
//     connect.cc, the NCCL_TOPO_PATTERN_TREE pattern of src/graph/topo.h):
//     a chain through each host's ranks, and a double binary tree of hosts
//     whose edges join the hosts' first ranks ("heads"), so that all of a
//     host's network traffic is its head's.
//   - Recursive doubling, Rabenseifner and the one-shot all-reduce pair
//     ranks by number; they run over positions in the host ring instead
//     (position p plays rank p), so that partners at small distances share
//     a host, and Rabenseifner halves at the small distances first: its
//     first halving, which moves half the data, stays inside hosts.
//
// Reduce-scatter, all-gather and all-to-all tie block j to rank j; the ring
// versions already take any ring order, and all-to-all exchanges with
// every rank whatever the order. Send and recv have one peer.

// HostRing returns the ring order that keeps each host's ranks contiguous:
// hosts in the order of their lowest rank, the ranks of each host in rank
// order. hosts[r] labels rank r's host (any integers; equal labels, same
// host). Block placement gives the identity.
func HostRing(hosts []int) []int {
	byHost := map[int][]int{}
	var order []int
	for r, h := range hosts {
		if _, ok := byHost[h]; !ok {
			order = append(order, h)
		}
		byHost[h] = append(byHost[h], r)
	}
	ring := make([]int, 0, len(hosts))
	for _, h := range order {
		ring = append(ring, byHost[h]...)
	}
	return ring
}

// HostTree returns rank's parent (-1 at the root) and children in tree t
// (0 or 1) of the tree across hosts: a chain through each host's ranks in
// rank order, from the host's head (its lowest rank) down, and the double
// binary tree (DoubleBinaryTree) over the hosts, numbered in the order of
// their lowest rank, joining the heads. A head's children are its child
// hosts' heads and then the next rank of its own chain. On one host the
// tree is a chain, which is why Build uses it only when there are several.
func HostTree(hosts []int, rank, t int) (parent int, children []int) {
	ring := HostRing(hosts)
	index := map[int]int{} // host label → host number
	var heads []int        // host number → its head rank
	for _, r := range ring {
		if _, ok := index[hosts[r]]; !ok {
			index[hosts[r]] = len(heads)
			heads = append(heads, r)
		}
	}
	pos := position(ring, rank)
	parent = -1
	next := -1 // the next rank of rank's chain
	if pos+1 < len(ring) && hosts[ring[pos+1]] == hosts[rank] {
		next = ring[pos+1]
	}
	if heads[index[hosts[rank]]] != rank {
		parent = ring[pos-1]
	} else {
		p, cs := DoubleBinaryTree(len(heads), index[hosts[rank]], t)
		if p >= 0 {
			parent = heads[p]
		}
		for _, c := range cs {
			children = append(children, heads[c])
		}
	}
	if next >= 0 {
		children = append(children, next)
	}
	return parent, children
}

// hostCount returns the number of distinct hosts.
func hostCount(hosts []int) int {
	seen := map[int]bool{}
	for _, h := range hosts {
		seen[h] = true
	}
	return len(seen)
}

func checkHosts(hosts []int, n int) error {
	if len(hosts) != n {
		return fmt.Errorf("algorithms: hosts has %d entries, want one per rank (%d)", len(hosts), n)
	}
	return nil
}

// relabel builds p's schedule for the rank at ring position
// position(ring, p.Rank), as if the ranks were numbered in ring order, and
// renames its peers back to rank numbers. It is correct for the
// collectives whose blocks are not tied to rank numbers (all-reduce).
func relabel(p Params, ring []int, build func(builder)) *Schedule {
	v := position(ring, p.Rank)
	s := &Schedule{Coll: p.Coll, Algo: p.Algo, NRanks: p.NRanks, Rank: v, Root: p.Root, Minor: 1, MsgBlocks: 1}
	build(builder{s})
	s.Rank = p.Rank
	for i := range s.Steps {
		st := &s.Steps[i]
		if st.RecvPeer >= 0 {
			st.RecvPeer = int32(ring[st.RecvPeer])
		}
		if st.SendPeer >= 0 {
			st.SendPeer = int32(ring[st.SendPeer])
		}
	}
	return s
}
