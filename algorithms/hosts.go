package algorithms

import (
	"fmt"
	"slices"
)

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
//     a host, and Rabenseifner halves at the small distances first: where
//     hosts have an even number of ranks and the rank count is a power of
//     two, its first halving, which moves half the data, stays inside
//     hosts (with other shapes the fold's pairs and some partners may
//     straddle a host boundary).
//
//   - Hier (hierAllReduce) is the all-reduce built for hosts: phases
//     inside and across hosts, for hosts with equal rank counts (Grid).
//     Across hosts each local rank's shard goes around a ring of hosts
//     (Hier), or up and down a double binary tree of them (HierTree: the
//     flat tree's construction over host indices, each tree carrying half
//     of the shard), which pays log2 h latencies for h-1 at twice the
//     bytes on the host's link, for many hosts.
//
//   - Hier for reduce-scatter and all-gather (hierReduceScatter,
//     hierAllGather) moves each host's network share from (n-1)/n of the
//     data, a flat ring's, to (h-1)/h, as the hierarchical all-reduce
//     does for its two halves, without a buffer for the partial sums:
//     the blocks go around m rings at once, each host by host but
//     entering every host at a different local rank, so that all m
//     ranks of a host cross to the next host together and every rank
//     sends one block per step.
//
// Reduce-scatter, all-gather and all-to-all tie block j to rank j; the ring
// versions already take any ring order, and all-to-all exchanges with
// every rank whatever the order. Send and recv have one peer.

// hostGroups returns the ranks of each host: hosts in the order of their
// lowest rank, the ranks of each host in rank order. hosts[r] labels rank
// r's host (any integers; equal labels, same host). The ring, the tree and
// the grid across hosts are all read off it.
func hostGroups(hosts []int) [][]int {
	index := map[int]int{} // host label → its group
	var groups [][]int
	for r, h := range hosts {
		g, ok := index[h]
		if !ok {
			g = len(groups)
			index[h] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], r)
	}
	return groups
}

// locate returns rank's group and its index there.
func locate(groups [][]int, rank int) (group, local int) {
	for g, rs := range groups {
		if i := slices.Index(rs, rank); i >= 0 {
			return g, i
		}
	}
	panic("algorithms: rank not in any host")
}

// HostRing returns the ring order that keeps each host's ranks contiguous:
// hosts in the order of their lowest rank, the ranks of each host in rank
// order. hosts[r] labels rank r's host (any integers; equal labels, same
// host). Block placement gives the identity.
func HostRing(hosts []int) []int {
	return slices.Concat(hostGroups(hosts)...)
}

// HostTree returns rank's parent (-1 at the root) and children in tree t
// (0 or 1) of the tree across hosts: a chain through each host's ranks in
// rank order, from the host's head (its lowest rank) down, and the double
// binary tree (DoubleBinaryTree) over the hosts, numbered in the order of
// their lowest rank, joining the heads. A head's children are its child
// hosts' heads and then the next rank of its own chain. On one host the
// tree is a chain, which is why Build uses it only when there are several.
func HostTree(hosts []int, rank, t int) (parent int, children []int) {
	groups := hostGroups(hosts)
	g, i := locate(groups, rank)
	chain := groups[g]
	parent = -1
	if i > 0 {
		parent = chain[i-1]
	} else {
		p, cs := DoubleBinaryTree(len(groups), g, t)
		if p >= 0 {
			parent = groups[p][0]
		}
		for _, c := range cs {
			children = append(children, groups[c][0])
		}
	}
	if i+1 < len(chain) {
		children = append(children, chain[i+1])
	}
	return parent, children
}

// HostCount returns the number of distinct labels in hosts.
func HostCount(hosts []int) int { return len(hostGroups(hosts)) }

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

// Grid is a communicator of Hosts hosts with PerHost ranks each: Ranks[g][i]
// is local rank i of host g, hosts in the order of their lowest rank,
// ranks of a host in rank order.
type Grid struct {
	Hosts, PerHost int
	Ranks          [][]int
}

// HostGrid arranges the ranks by host for the hierarchical schedules. It
// fails unless every host has the same number of ranks (nil hosts: one
// host with all n).
func HostGrid(hosts []int, n int) (Grid, error) {
	if hosts == nil {
		hosts = make([]int, n)
	}
	g := Grid{Ranks: hostGroups(hosts)}
	g.Hosts, g.PerHost = len(g.Ranks), len(g.Ranks[0])
	for _, rs := range g.Ranks {
		if len(rs) != g.PerHost {
			return Grid{}, fmt.Errorf("algorithms: the hierarchical schedules need the same number of ranks on every host; hosts have %s", g.sizes())
		}
	}
	return g, nil
}

func (g Grid) sizes() string {
	s := ""
	for k, rs := range g.Ranks {
		if k > 0 {
			s += ", "
		}
		s += fmt.Sprint(len(rs))
	}
	return s
}

// hierAllReduce: with h hosts of m ranks, the piece is cut into m shards
// of h blocks (shard c is blocks c·h .. c·h+h-1; of 2 blocks with tree,
// one per tree of hosts, which then replace the ring). Inside each host, a
// ring reduce-scatter leaves local rank i with shard i+1 reduced over its
// host; local ranks i of all hosts then all-reduce that shard in a ring
// of hosts (the ring all-reduce over its h blocks), which completes it;
// and a ring all-gather inside each host spreads the m shards. This is
// the SMP-aware all-reduce of MPI libraries (Träff 2009 surveys them;
// NCCL gets the same traffic from its tree and CollNet patterns); each
// phase is an existing ring (or tree), so messages on each connection
// keep order.
func hierAllReduce(b builder, g Grid, tree bool) {
	h, m := g.Hosts, g.PerHost
	// A shard is h blocks for the rings across hosts (one per host), two
	// for the trees (one per tree).
	per := h
	if tree {
		per = 2
	}
	b.s.Minor = per * m
	host, i := locate(g.Ranks, b.s.Rank)
	local := g.Ranks[host]
	lprev, lnext := local[mod(i-1, m)], local[mod(i+1, m)]
	shard := func(buf Buf, c int) Ref { return Blocks(buf, mod(c, m)*per, per) }
	if b.s.NRanks == 1 {
		b.copy(shard(Input, 0), shard(Output, 0), true)
		return
	}
	if m > 1 {
		b.s.MsgBlocks = per
	}
	// 1. Reduce-scatter inside the host: this rank ends with shard own.
	own := mod(i+1, m)
	cur := Input
	if m > 1 {
		b.send(shard(Input, i), lnext)
		for s := 1; s < m-1; s++ {
			b.recvReduceSend(lprev, shard(Input, i-s), lnext)
		}
		b.recvReduceCopy(lprev, shard(Input, own), shard(Output, own), h == 1)
		cur = Output
	}
	// 2. All-reduce of the shard across hosts, among local ranks i: up
	// and down a double binary tree of hosts (each tree carrying one of
	// the shard's two blocks), or around a ring of them.
	if h > 1 && tree {
		rankOf := func(hs int) int { return g.Ranks[hs][i] }
		treeAllReduceOf(b, func(t int) (int, []int) {
			p, cs := DoubleBinaryTree(h, host, t)
			if p >= 0 {
				p = rankOf(p)
			}
			out := make([]int, len(cs))
			for k, c := range cs {
				out[k] = rankOf(c)
			}
			return p, out
		}, func(buf Buf, t int) Ref { return Blocks(buf, own*2+t, 1) }, cur)
	}
	if h > 1 && !tree {
		hprev, hnext := g.Ranks[mod(host-1, h)][i], g.Ranks[mod(host+1, h)][i]
		blk := func(buf Buf, q int) Ref { return Blocks(buf, own*h+mod(q, h), 1) }
		b.send(blk(cur, host), hnext)
		for s := 1; s < h-1; s++ {
			b.recvReduceSend(hprev, blk(cur, host-s), hnext)
		}
		b.recvReduceCopySend(hprev, blk(cur, host+1), blk(Output, host+1), hnext, true)
		for t := 1; t < h-1; t++ {
			b.recvCopySend(hprev, blk(Output, host+1-t), hnext)
		}
		b.recv(hprev, blk(Output, host+2))
	}
	// 3. All-gather inside the host.
	if m > 1 {
		b.send(shard(Output, own), lnext)
		for t := 1; t < m-1; t++ {
			b.recvCopySend(lprev, shard(Output, own-t), lnext)
		}
		b.recv(lprev, shard(Output, own-(m-1)))
	}
}

// hierReduceScatter is the reduce-scatter for h hosts of m ranks whose
// network traffic is the hierarchical one: each host sends m(h-1) blocks
// across (its m ranks h-1 each), (h-1)/h of the data, where a flat ring
// sends n-1 blocks over its one crossing, (n-1)/n of it. It needs no
// memory for partial sums, unlike reducing inside each host first and
// then across (reduce-scatter's output holds one block).
//
// Block (c,i), the block of local rank i of host c, is reduced along a
// chain through all n ranks: host c+1's ranks from local i+1 round to
// local i, then host c+2's the same way, and so on, ending with host c's,
// at (c,i) itself. Position q of that chain is local rank i+1+q of host
// c+1+q/m (mod m and h), so rank (g,j) is position s of exactly one
// chain, and works on it in step s, like a ring reduce-scatter: it
// receives the running sum from (g,j-1), or from (g-1,j-1) when s is a
// multiple of m (its chain just entered this host), adds its own block
// and sends it to (g,j+1), or to (g+1,j+1) when s+1 is a multiple of m.
// Every rank sends one block per step, as in a ring; in the steps s with
// s+1 a multiple of m all ranks of a host send across at once, so each
// host's link carries h-1 of the n-1 steps, m blocks each. With one rank
// per host, or one host, it is the ring reduce-scatter over HostRing.
func hierReduceScatter(b builder, g Grid) {
	n, own := b.s.NRanks, b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, own, 1), Blocks(Output, own, 1), true)
		return
	}
	c := newChains(g, own)
	in := func(s int) Ref { return Blocks(Input, c.at(c.host-1-s/c.m, c.j-1-s), 1) }
	b.send(in(0), c.next(0))
	for s := 1; s < n-1; s++ {
		b.recvReduceSend(c.prev(s), in(s), c.next(s))
	}
	b.recvReduceCopy(c.prev(n-1), Blocks(Input, own, 1), Blocks(Output, own, 1), true)
}

// hierAllGather is hierReduceScatter's mirror: block (c,i) starts at
// (c,i) and goes through the rest of host c (local i+1, ..., i-1), then
// crosses to host c+1, entering at local i, and so on: position q of its
// chain is local rank i+q of host c+q/m. Rank (g,j) is position t of one
// chain in step t; it receives from (g,j-1), or from (g-1,j-1) when t is a
// multiple of m, and forwards to (g,j+1), or to (g+1,j+1) when t+1 is one.
// Each host sends m(h-1) blocks across, (h-1)/h of the data.
func hierAllGather(b builder, g Grid) {
	n, own := b.s.NRanks, b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, own, 1), Blocks(Output, own, 1), false)
		return
	}
	c := newChains(g, own)
	out := func(t int) Ref { return Blocks(Output, c.at(c.host-t/c.m, c.j-t), 1) }
	b.copySend(Blocks(Input, own, 1), Blocks(Output, own, 1), c.next(0))
	for t := 1; t < n-1; t++ {
		b.recvCopySend(c.prev(t), out(t), c.next(t))
	}
	b.recv(c.prev(n-1), out(n-1))
}

// chains is one rank's view of the chains of hierReduceScatter and
// hierAllGather: its host and local index in the grid, and its
// neighbours in each step.
type chains struct {
	g       Grid
	h, m    int
	host, j int
}

func newChains(g Grid, rank int) chains {
	host, j := locate(g.Ranks, rank)
	return chains{g: g, h: g.Hosts, m: g.PerHost, host: host, j: j}
}

// at is local rank l of host hs, both taken round.
func (c chains) at(hs, l int) int { return c.g.Ranks[mod(hs, c.h)][mod(l, c.m)] }

// prev is the rank this one receives from in step s: the local rank
// before it, on the host before when s is a multiple of m (the chain has
// just crossed).
func (c chains) prev(s int) int { return c.at(c.host-boolInt(s%c.m == 0), c.j-1) }

// next is the rank this one sends to in step s: the local rank after it,
// on the next host when s+1 is a multiple of m.
func (c chains) next(s int) int { return c.at(c.host+boolInt((s+1)%c.m == 0), c.j+1) }

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}
