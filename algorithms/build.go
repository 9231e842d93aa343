package algorithms

import (
	"fmt"
	"math/bits"
	"slices"
)

// Params selects a schedule.
type Params struct {
	Coll   Collective
	Algo   Algorithm // must not be AlgoAuto: ask Tune first
	NRanks int
	Rank   int
	Root   int // broadcast/reduce root; peer of send/recv
	// Ring is the ring order for ring schedules (a permutation of 0..NRanks-1,
	// from the topology search); nil means HostRing(Hosts), or 0, 1, ...,
	// NRanks-1 without Hosts.
	Ring []int
	// Hosts labels each rank's host (equal labels, same host); nil means
	// one host. With several hosts the tree is HostTree's, and recursive
	// doubling, Rabenseifner and the one-shot all-reduce run over ring
	// positions (see hosts.go).
	Hosts []int
}

// Build returns rank's schedule. It fails on parameters that are out of
// range or an algorithm that does not implement the collective.
func Build(p Params) (*Schedule, error) {
	n := p.NRanks
	switch {
	case n < 1:
		return nil, fmt.Errorf("algorithms: %d ranks: need at least 1", n)
	case p.Rank < 0 || p.Rank >= n:
		return nil, fmt.Errorf("algorithms: rank %d out of range [0,%d)", p.Rank, n)
	case !p.Coll.Valid():
		return nil, fmt.Errorf("algorithms: invalid collective %v", p.Coll)
	case !p.Algo.Supports(p.Coll):
		return nil, fmt.Errorf("algorithms: %v does not implement %v", p.Algo, p.Coll)
	}
	switch p.Coll {
	case CollBroadcast, CollReduce:
		if p.Root < 0 || p.Root >= n {
			return nil, fmt.Errorf("algorithms: root %d out of range [0,%d)", p.Root, n)
		}
	case CollSend, CollRecv:
		if p.Root < 0 || p.Root >= n || p.Root == p.Rank {
			return nil, fmt.Errorf("algorithms: peer %d invalid for rank %d of %d", p.Root, p.Rank, n)
		}
	}
	if p.Hosts != nil {
		if err := checkHosts(p.Hosts, n); err != nil {
			return nil, err
		}
	}
	ring := p.Ring
	if ring == nil && p.Hosts != nil {
		ring = HostRing(p.Hosts)
	} else if ring == nil {
		ring = make([]int, n)
		for i := range ring {
			ring[i] = i
		}
	} else if err := checkPerm(ring, n); err != nil {
		return nil, err
	}
	s := &Schedule{Coll: p.Coll, Algo: p.Algo, NRanks: n, Rank: p.Rank, Root: p.Root, Minor: 1, MsgBlocks: 1}
	b := builder{s}
	switch p.Coll {
	case CollAllReduce:
		switch p.Algo {
		case Ring:
			ringAllReduce(b, ring)
		case Tree:
			tree := func(t int) (int, []int) { return DoubleBinaryTree(n, p.Rank, t) }
			if p.Hosts != nil && HostCount(p.Hosts) > 1 {
				tree = func(t int) (int, []int) { return HostTree(p.Hosts, p.Rank, t) }
			}
			treeAllReduce(b, tree)
		case RecDoubling:
			s = relabel(p, ring, recDoublingAllReduce)
		case Rabenseifner:
			near := p.Hosts != nil && HostCount(p.Hosts) > 1
			s = relabel(p, ring, func(b builder) { rabenseifnerAllReduce(b, near) })
		case OneShot:
			s = relabel(p, ring, oneShotAllReduce)
		case Hier, HierTree:
			g, err := HostGrid(p.Hosts, n)
			if err != nil {
				return nil, err
			}
			hierAllReduce(b, g, p.Algo == HierTree)
		}
	case CollReduceScatter, CollAllGather:
		rs := p.Coll == CollReduceScatter
		switch p.Algo {
		case OneShot:
			if rs {
				oneShotReduceScatter(b)
			} else {
				oneShotAllGather(b)
			}
		case RecDoubling: // all-gather only (Supports)
			recDoublingAllGather(b)
		case Hier:
			g, err := HostGrid(p.Hosts, n)
			if err != nil {
				return nil, err
			}
			if rs {
				hierReduceScatter(b, g)
			} else {
				hierAllGather(b, g)
			}
		default:
			if rs {
				ringReduceScatter(b, ring)
			} else {
				ringAllGather(b, ring)
			}
		}
	case CollBroadcast:
		chainBroadcast(b, ring)
	case CollReduce:
		if p.Algo == OneShot {
			oneShotReduce(b)
		} else {
			chainReduce(b, ring)
		}
	case CollAllToAll:
		pairwiseAllToAll(b)
	case CollSend:
		b.send(Blocks(Input, 0, 1), p.Root)
	case CollRecv:
		b.recv(p.Root, Blocks(Output, 0, 1))
	}
	return s, nil
}

func checkPerm(ring []int, n int) error {
	if len(ring) != n {
		return fmt.Errorf("algorithms: ring has %d entries, want %d", len(ring), n)
	}
	seen := make([]bool, n)
	for _, r := range ring {
		if r < 0 || r >= n || seen[r] {
			return fmt.Errorf("algorithms: ring %v is not a permutation of 0..%d", ring, n-1)
		}
		seen[r] = true
	}
	return nil
}

func mod(a, n int) int { return ((a % n) + n) % n }

// position returns rank's index in ring.
func position(ring []int, rank int) int {
	for i, r := range ring {
		if r == rank {
			return i
		}
	}
	panic("algorithms: rank not in ring")
}

// ringAllReduce: reduce-scatter then all-gather around the ring, 2(n-1)
// transfers of 1/n of the data each (Patarasuk & Yuan 2009; NCCL
// src/device/all_reduce.h runs the same five primitive kinds in this order).
// At ring position i, step s of the reduce-scatter phase forwards block
// i-s; position i completes block i+1, which then travels n-1 hops.
func ringAllReduce(b builder, ring []int) {
	n := b.s.NRanks
	b.s.Minor = n
	i := position(ring, b.s.Rank)
	prev, next := ring[mod(i-1, n)], ring[mod(i+1, n)]
	blk := func(q int) int { return ring[mod(q, n)] }
	in := func(q int) Ref { return Blocks(Input, blk(q), 1) }
	out := func(q int) Ref { return Blocks(Output, blk(q), 1) }
	if n == 1 {
		b.copy(in(0), out(0), true)
		return
	}
	b.send(in(i), next)
	for s := 1; s < n-1; s++ {
		b.recvReduceSend(prev, in(i-s), next)
	}
	b.recvReduceCopySend(prev, in(i+1), out(i+1), next, true)
	for t := 1; t < n-1; t++ {
		b.recvCopySend(prev, out(i+1-t), next)
	}
	b.recv(prev, out(i+2))
}

// ringReduceScatter: the reduce-scatter half of the ring, shifted by one
// block so that position i finishes with block ring[i], its own rank's.
func ringReduceScatter(b builder, ring []int) {
	n := b.s.NRanks
	i := position(ring, b.s.Rank)
	prev, next := ring[mod(i-1, n)], ring[mod(i+1, n)]
	in := func(q int) Ref { return Blocks(Input, ring[mod(q, n)], 1) }
	own := b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, own, 1), Blocks(Output, own, 1), true)
		return
	}
	b.send(in(i-1), next)
	for s := 1; s < n-1; s++ {
		b.recvReduceSend(prev, in(i-1-s), next)
	}
	b.recvReduceCopy(prev, Blocks(Input, own, 1), Blocks(Output, own, 1), true)
}

// ringAllGather: the all-gather half of the ring. Position i starts with
// its own block and forwards what it receives for n-2 steps.
func ringAllGather(b builder, ring []int) {
	n := b.s.NRanks
	i := position(ring, b.s.Rank)
	prev, next := ring[mod(i-1, n)], ring[mod(i+1, n)]
	out := func(q int) Ref { return Blocks(Output, ring[mod(q, n)], 1) }
	own := b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, own, 1), Blocks(Output, own, 1), false)
		return
	}
	b.copySend(Blocks(Input, own, 1), Blocks(Output, own, 1), next)
	for t := 1; t < n-1; t++ {
		b.recvCopySend(prev, out(i-t), next)
	}
	b.recv(prev, out(i+1))
}

// chainBroadcast: a pipelined chain along the ring starting at the root, as
// NCCL's ring broadcast (src/device/broadcast.h); pipelining comes from the
// engine's pieces and slices.
func chainBroadcast(b builder, ring []int) {
	n := b.s.NRanks
	i := position(ring, b.s.Rank)
	d := mod(i-position(ring, b.s.Root), n) // distance from the root
	prev, next := ring[mod(i-1, n)], ring[mod(i+1, n)]
	in, out := Blocks(Input, 0, 1), Blocks(Output, 0, 1)
	switch {
	case n == 1:
		b.copy(in, out, false)
	case d == 0:
		b.copySend(in, out, next)
	case d < n-1:
		b.recvCopySend(prev, out, next)
	default:
		b.recv(prev, out)
	}
}

// chainReduce: a pipelined chain along the ring that ends at the root, as
// NCCL's ring reduce (src/device/reduce.h).
func chainReduce(b builder, ring []int) {
	n := b.s.NRanks
	i := position(ring, b.s.Rank)
	d := mod(i-position(ring, b.s.Root)-1, n) // 0 starts the chain, n-1 is the root
	prev, next := ring[mod(i-1, n)], ring[mod(i+1, n)]
	in, out := Blocks(Input, 0, 1), Blocks(Output, 0, 1)
	switch {
	case n == 1:
		b.copy(in, out, true)
	case d == 0:
		b.send(in, next)
	case d < n-1:
		b.recvReduceSend(prev, in, next)
	default:
		b.recvReduceCopy(prev, in, out, true)
	}
}

// pairwiseAllToAll: a local copy, then n-1 exchanges; in exchange s rank r
// sends its block for r+s and receives the block of r-s (the pairwise
// exchange of MPICH and Open MPI's basic_linear variants).
func pairwiseAllToAll(b builder) {
	n, r := b.s.NRanks, b.s.Rank
	b.copy(Blocks(Input, r, 1), Blocks(Output, r, 1), false)
	for s := 1; s < n; s++ {
		to, from := mod(r+s, n), mod(r-s, n)
		b.sendRecv(Blocks(Input, to, 1), to, from, Blocks(Output, from, 1))
	}
}

// fold describes how a rank takes part in a power-of-two algorithm over a
// rank count that is not a power of two (Thakur, Rabenseifner & Gropp 2005,
// section 4): with p the largest power of two ≤ n and rem = n-p, each even
// rank below 2·rem hands its data to the odd rank above it and sits out;
// the remaining p ranks run the algorithm as virtual ranks 0..p-1; at the
// end each helper returns the result to its partner.
type fold struct {
	p, rem int
	vrank  int // virtual rank, or -1 for a rank that sits out
}

func newFold(n, rank int) fold {
	p := 1 << (bits.Len(uint(n)) - 1)
	f := fold{p: p, rem: n - p, vrank: -1}
	switch {
	case rank < 2*f.rem && rank%2 == 0:
	case rank < 2*f.rem:
		f.vrank = rank / 2
	default:
		f.vrank = rank - f.rem
	}
	return f
}

// real maps a virtual rank back to its rank.
func (f fold) real(v int) int {
	if v < f.rem {
		return 2*v + 1
	}
	return v + f.rem
}

// prologue runs the fold's first exchange and returns the buffer that holds
// this rank's running value afterwards (Input, or Output once reduced into).
func (f fold) prologue(b builder, all func(Buf) Ref) (cur Buf, active bool) {
	r := b.s.Rank
	switch {
	case f.vrank < 0:
		b.send(all(Input), r+1)
		return NoBuf, false
	case r < 2*f.rem:
		b.recvReduceCopy(r-1, all(Input), all(Output), f.p == 1)
		return Output, true
	}
	return Input, true
}

// epilogue hands the result back to the rank that sat out.
func (f fold) epilogue(b builder, all func(Buf) Ref) {
	r := b.s.Rank
	switch {
	case f.vrank < 0:
		b.recv(r+1, all(Output))
	case r < 2*f.rem:
		b.send(all(Output), r-1)
	}
}

// recDoublingAllReduce: in round k, virtual rank v exchanges its running
// value with v^2^k and reduces; after log2(p) rounds every rank holds the
// full reduction (Thakur, Rabenseifner & Gropp 2005, section 4.4). Partners
// compute a⊕b and b⊕a, which are equal for the commutative operators
// goccl offers, so all ranks end with identical bits.
func recDoublingAllReduce(b builder) {
	n := b.s.NRanks
	all := func(buf Buf) Ref { return Blocks(buf, 0, 1) }
	if n == 1 {
		b.copy(all(Input), all(Output), true)
		return
	}
	f := newFold(n, b.s.Rank)
	cur, active := f.prologue(b, all)
	if active {
		for mask := 1; mask < f.p; mask <<= 1 {
			peer := f.real(f.vrank ^ mask)
			b.sendRecvReduceCopy(all(cur), peer, peer, all(cur), all(Output), mask<<1 == f.p)
			cur = Output
		}
	}
	f.epilogue(b, all)
}

// rabenseifnerAllReduce: recursive-halving reduce-scatter, then
// recursive-doubling all-gather (Rabenseifner 2004; Thakur, Rabenseifner &
// Gropp 2005, section 4.5). The data is cut into p blocks; in halving round
// with distance d, virtual rank v keeps the half of its current range on
// its side of bit d and sends the other half to v^d; after log2(p) rounds
// it holds block v fully reduced, and the doubling rounds retrace the
// exchanges in reverse to gather every block.
//
// The distances run from p/2 down to 1; nearFirst reverses them, so that
// the first halving, which moves half the data, pairs neighbours in the
// ring order (across hosts of an even number of ranks, ranks of one
// host). Any order is correct: the halving keeps, at distance d, the half
// of the range on v's side of bit d, so the block v ends with depends on
// the order, and the doubling retraces the same distances backwards.
func rabenseifnerAllReduce(b builder, nearFirst bool) {
	n := b.s.NRanks
	all := func(buf Buf) Ref { return Blocks(buf, 0, b.s.Minor) }
	if n == 1 {
		b.copy(Blocks(Input, 0, 1), Blocks(Output, 0, 1), true)
		return
	}
	f := newFold(n, b.s.Rank)
	b.s.Minor = f.p
	// The fold moves whole pieces (p blocks); without it the largest
	// message is the first halving's p/2 blocks.
	b.s.MsgBlocks = f.p / 2
	if f.rem > 0 {
		b.s.MsgBlocks = f.p
	}
	cur, active := f.prologue(b, all)
	if active {
		v := f.vrank
		var ds []int // halving distances, in order; doubling retraces them
		for d := f.p / 2; d >= 1; d /= 2 {
			ds = append(ds, d)
		}
		if nearFirst {
			slices.Reverse(ds)
		}
		lo, hi := 0, f.p
		for i, d := range ds {
			peer := f.real(v ^ d)
			mid := (lo + hi) / 2
			keepLo, keepHi, sendLo, sendHi := lo, mid, mid, hi
			if v&d != 0 {
				keepLo, keepHi, sendLo, sendHi = mid, hi, lo, mid
			}
			b.sendRecvReduceCopy(Blocks(cur, sendLo, sendHi-sendLo), peer, peer,
				Blocks(cur, keepLo, keepHi-keepLo), Blocks(Output, keepLo, keepHi-keepLo), i == len(ds)-1)
			cur = Output
			lo, hi = keepLo, keepHi
		}
		for i := len(ds) - 1; i >= 0; i-- {
			d := ds[i]
			peer := f.real(v ^ d)
			// The partner's range is ours mirrored across bit d.
			size := hi - lo
			plo := lo + size
			if v&d != 0 {
				plo = lo - size
			}
			b.sendRecv(Blocks(Output, lo, size), peer, peer, Blocks(Output, plo, size))
			lo, hi = min(lo, plo), max(hi, plo+size)
		}
	}
	f.epilogue(b, all)
}

// oneShotAllReduce: send the input to every other rank, then fold the n
// contributions in rank order, x0 ⊕ x1 ⊕ ... ⊕ x(n-1), the own one from
// Input and the others straight out of their slots. Every rank evaluates
// the same expression (the first pair in either order, which commutative
// operators make equal), so all end with identical bits. Sends go to
// r+1, r+2, ... so that no rank is everybody's first destination.
func oneShotAllReduce(b builder) {
	n, r := b.s.NRanks, b.s.Rank
	all := func(buf Buf) Ref { return Blocks(buf, 0, 1) }
	if n == 1 {
		b.copy(all(Input), all(Output), true)
		return
	}
	// The sends read Input before the fold writes anything. Ranks 0 and 1
	// then fold their own term in their first reduction, element by
	// element (x0 ⊕ x1 from Input and a slot into Output), so in place
	// they need no copy of the input. From rank 2 on, Output holds
	// x0 ⊕ x1 before the own term is read: those ranks fold a copy.
	b.s.CopyInPlace = r >= 2
	for k := 1; k < n; k++ {
		b.send(all(Input), (r+k)%n)
	}
	cur := NoBuf // where the fold's running value is: nowhere yet, Input (own term only) or Output
	for j := 0; j < n; j++ {
		final := j == n-1
		switch {
		case j == r && cur == NoBuf:
			cur = Input
		case j == r:
			b.reduce(all(Input), all(Output), final)
		case cur == NoBuf && j+1 == r:
			// x_j ⊕ x_r in one step.
			b.recvReduceCopy(j, all(Input), all(Output), j+1 == n-1)
			cur = Output
			j++
		case cur == NoBuf:
			b.recv(j, all(Output))
			cur = Output
		default:
			b.recvReduceCopy(j, all(cur), all(Output), final)
			cur = Output
		}
	}
}

// oneShotReduceScatter: every rank sends block j of its input straight
// to rank j, then receives its own block from each peer and reduces it
// into its output: one hop where the ring pays n-1, the same bytes.
// Sends go to r+1, r+2, ..., receipts come from r-1, r-2, ...,
// so a rank first reads the message its nearest predecessor posted
// first. Each block is reduced by its owner alone, in an order of its
// own (own term, then r-1, r-2, ...): no two ranks need the same bits,
// and in place the first reduction reads each element of the own block
// before writing it, so no copy of the input is needed.
func oneShotReduceScatter(b builder) {
	n, r := b.s.NRanks, b.s.Rank
	own := func(buf Buf) Ref { return Blocks(buf, r, 1) }
	if n == 1 {
		b.copy(own(Input), own(Output), true)
		return
	}
	for k := 1; k < n; k++ {
		to := (r + k) % n
		b.send(Blocks(Input, to, 1), to)
	}
	cur := Input
	for k := 1; k < n; k++ {
		b.recvReduceCopy(mod(r-k, n), own(cur), own(Output), k == n-1)
		cur = Output
	}
}

// oneShotReduce: every rank but the root sends its input straight to the
// root, which folds each into its output in turn (Open MPI's
// basic_linear reduce, its choice for few ranks and small messages): one
// hop where the chain pays n-1, and no rank waits for another's data
// before it sends, where the chain's ranks wait for their predecessor.
// The root receives all the bytes, n-1 times the chain's.
func oneShotReduce(b builder) {
	n, r, root := b.s.NRanks, b.s.Rank, b.s.Root
	in, out := Blocks(Input, 0, 1), Blocks(Output, 0, 1)
	switch {
	case n == 1:
		b.copy(in, out, true)
	case r != root:
		b.send(in, root)
	default:
		cur := in
		for k := 1; k < n; k++ {
			b.recvReduceCopy((root+k)%n, cur, out, k == n-1)
			cur = out
		}
	}
}

// oneShotAllGather: every rank sends its block to every peer and receives
// each peer's block straight into its place: one hop where the ring pays
// n-1, the same bytes.
func oneShotAllGather(b builder) {
	n, r := b.s.NRanks, b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, r, 1), Blocks(Output, r, 1), false)
		return
	}
	b.copySend(Blocks(Input, r, 1), Blocks(Output, r, 1), (r+1)%n)
	for k := 2; k < n; k++ {
		b.send(Blocks(Input, r, 1), (r+k)%n)
	}
	for k := 1; k < n; k++ {
		from := mod(r-k, n)
		b.recv(from, Blocks(Output, from, 1))
	}
}

// recDoublingAllGather: in the round at distance d, virtual rank v sends
// the blocks of its group (the d virtual ranks v&^(d-1)...) to v^d and
// receives the partner's group's in their place; after log2(p) rounds
// every rank holds every block (Thakur, Rabenseifner & Gropp 2005,
// section 4.1; Open MPI's coll_tuned allgather algorithm 3). Rank counts
// that are not powers of two use the fold: a rank that sits out hands its
// block to its partner first and receives the whole output from it last.
// A virtual rank's blocks are contiguous (one, or the two of its pair), so
// a group's are too, and every exchange is one range of Output: no
// scratch; for a power of two, log2(n) hops in place of the ring's n-1
// and the ring's bytes (the fold adds two hops and a whole output).
func recDoublingAllGather(b builder) {
	n, r := b.s.NRanks, b.s.Rank
	if n == 1 {
		b.copy(Blocks(Input, 0, 1), Blocks(Output, 0, 1), false)
		return
	}
	f := newFold(n, r)
	b.s.MsgBlocks = f.p / 2
	if f.rem > 0 {
		b.s.MsgBlocks = n // the epilogue's whole output
	}
	if f.vrank < 0 {
		b.send(Blocks(Input, r, 1), r+1)
		b.recv(r+1, Blocks(Output, 0, n))
		return
	}
	// first(v) is the first block of virtual rank v; v's blocks run to
	// first(v+1).
	first := func(v int) int { return v + min(v, f.rem) }
	group := func(v, d int) Ref {
		lo := v &^ (d - 1)
		return Blocks(Output, first(lo), first(lo+d)-first(lo))
	}
	b.copy(Blocks(Input, r, 1), Blocks(Output, r, 1), false)
	if r < 2*f.rem {
		b.recv(r-1, Blocks(Output, r-1, 1))
	}
	v := f.vrank
	for d := 1; d < f.p; d <<= 1 {
		peer := f.real(v ^ d)
		b.sendRecv(group(v, d), peer, peer, group(v^d, d))
	}
	if r < 2*f.rem {
		b.send(Blocks(Output, 0, n), r-1)
	}
}

// DoubleBinaryTree returns the parent and children of rank in each of the two binary
// trees of the double binary tree over n ranks (parent -1 at a root; up to
// two children).
//
// Tree 0 is an in-order binary tree: rank 0 is the root with the single
// child that roots the tree over ranks 1..n-1, and the root of any range of
// ranks is the one with the most trailing zero bits, so odd ranks are the
// leaves. Tree 1 is tree 0 mirrored (rank r plays the role of n-1-r) when n
// is even, so that every rank is a leaf in one tree and an inner node in the
// other, or shifted by one (rank r plays r-1) when n is odd. This is the
// construction of Sanders, Speck & Träff 2009 ("Two-tree algorithms for full
// bandwidth broadcast, reduction and scan") as NCCL uses it (src/graph/trees.cc).
func DoubleBinaryTree(n, rank, tree int) (parent int, children []int) {
	role := rank
	back := func(r int) int { return r }
	if tree == 1 {
		if n%2 == 0 {
			role = n - 1 - rank
			back = func(r int) int { return n - 1 - r }
		} else {
			role = mod(rank-1, n)
			back = func(r int) int { return mod(r+1, n) }
		}
	}
	p, cs := inorderTree(n, role)
	if p >= 0 {
		p = back(p)
	}
	for i := range cs {
		cs[i] = back(cs[i])
	}
	return p, cs
}

// inorderTree returns rank's parent and children in tree 0.
func inorderTree(n, rank int) (parent int, children []int) {
	if rank == 0 {
		if n > 1 {
			return -1, []int{subtreeRoot(1, n)}
		}
		return -1, nil
	}
	// Descend from the root of [1, n) to rank, remembering the parent.
	parent = 0
	lo, hi := 1, n
	for {
		root := subtreeRoot(lo, hi)
		if root == rank {
			if lo < root {
				children = append(children, subtreeRoot(lo, root))
			}
			if root+1 < hi {
				children = append(children, subtreeRoot(root+1, hi))
			}
			return parent, children
		}
		parent = root
		if rank < root {
			hi = root
		} else {
			lo = root + 1
		}
	}
}

// subtreeRoot returns the rank in [lo, hi) with the most trailing zeros.
func subtreeRoot(lo, hi int) int {
	best, bestTZ := lo, -1
	for b := bits.Len(uint(hi)); b >= 0; b-- {
		// The smallest multiple of 2^b that is ≥ lo.
		step := 1 << b
		c := (lo + step - 1) / step * step
		if c < hi {
			if tz := bits.TrailingZeros(uint(c)); tz > bestTZ {
				best, bestTZ = c, tz
			}
			break
		}
	}
	return best
}

// treeAllReduce: the double binary tree. Block t of each piece (t = 0, 1)
// goes up tree t (each child's data reduced into the running value, fused
// with the forward to the parent) and then back down. Every rank runs the
// phases in the same order (up 0, up 1, down 0, down 1), and within one
// phase a pair of ranks shares at most one tree edge, so the messages on
// each connection arrive in the order the receiver expects them.
//
// tree(t) gives the rank's parent and children in tree t: the double
// binary tree over the ranks, or HostTree across hosts.
func treeAllReduce(b builder, tree func(t int) (parent int, children []int)) {
	n := b.s.NRanks
	b.s.Minor = 2
	if n == 1 {
		b.copy(Blocks(Input, 0, 2), Blocks(Output, 0, 2), true)
		return
	}
	treeAllReduceOf(b, tree, func(buf Buf, t int) Ref { return Blocks(buf, t, 1) }, Input)
}

// treeAllReduceOf all-reduces blk(·, 0) up and down tree 0 and blk(·, 1)
// up and down tree 1, starting from the values in src (Input, or Output
// where an earlier phase left them there).
func treeAllReduceOf(b builder, tree func(t int) (parent int, children []int), blk func(buf Buf, t int) Ref, src Buf) {
	type node struct {
		parent   int
		children []int
	}
	var trees [2]node
	for t := range trees {
		trees[t].parent, trees[t].children = tree(t)
	}
	for t, nd := range trees {
		in, out := blk(src, t), blk(Output, t)
		root := nd.parent < 0
		cur := in
		for k, c := range nd.children {
			last := k == len(nd.children)-1
			if last && !root {
				b.recvReduceSend(c, cur, nd.parent)
			} else {
				b.recvReduceCopy(c, cur, out, last && root)
			}
			cur = out
		}
		if len(nd.children) == 0 {
			b.send(in, nd.parent)
		}
	}
	for t, nd := range trees {
		out := blk(Output, t)
		switch {
		case nd.parent < 0:
			for _, c := range nd.children {
				b.send(out, c)
			}
		case len(nd.children) == 0:
			b.recv(nd.parent, out)
		default:
			b.recvCopySend(nd.parent, out, nd.children[0])
			for _, c := range nd.children[1:] {
				b.send(out, c)
			}
		}
	}
}
