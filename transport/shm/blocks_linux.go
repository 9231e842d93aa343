package shm

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"time"
)

// Blocks by reference (transport.BlockCopier), and which way each size
// goes.
//
// The receiver's single copy (cma_linux.go) costs a system call per
// slice, about 1.6 µs on these VMs, so cut into slots it moves a MiB in
// 165 µs where one call moves it in 44 (docs/performance.md, "Blocks by
// reference"). So on two ranks, where a broadcast's, all-gather's,
// reduce's and reduce-scatter's steps only send or only receive, the
// sender cuts a step that sends its input into blocks of
// Options.BlockSize, posted by reference, and the receiver, which peeks
// at the first slice, cuts its side the same way: it lands each block in
// its output (broadcast, all-gather; a reduce or reduce-scatter out of
// place, which then reduces it there) or, in place, in a scratch buffer
// its reduction reads.
//
// Whether blocks beat the slots is not a property of the host that a
// probe at start-up could find. It flips with where the hypervisor puts
// the two ranks' vCPUs: where a cache line crosses between them in 40-100
// ns the slots move a MiB in about 39 µs and a 64 KiB broadcast in 3;
// where it takes 260-390 ns (most of the time here) they take 150 µs and
// 12, and the kernel's copy, which reads the sender's memory once instead
// of handing every line over twice, wins by 2-3 times
// (docs/performance.md, "Why this machine's small and mid-size figures
// are bimodal"). It differs by collective and size too: a 16 MiB reduce
// ran twice as long in blocks. So, unless Options.CMA says on, each
// receiving side measures both ways, end to end, on the operations it
// runs:
//
//   - per size class (the operation's size rounded down to a power of
//     two), for operations that land and for those that reduce, it asks
//     for slots or blocks in a bit of a mask in its half of the segment's
//     header (sideBlocks), which the sender reads when it starts a step
//     (BlockSlice) and nobody else writes; landing goes in blocks from
//     a class's second operation, reducing starts on the slots
//     (initBlocks);
//   - the engine tells it, after each such operation, how long its
//     channel took and which way the slices came (Received);
//   - from the class's operation exploreFirst on, it takes exploreRuns
//     operations the way it asks, then exploreRuns the other, drops the
//     first exploreWarm of each run (the switch: a sender switched to
//     the slots fills them ahead of the receiver at first) and any that
//     came the other way (a sender that had already started), and takes the other way only
//     where its median is below switchBelow of the first's; it compares
//     again exploreMin operations later, then twice as far on each time,
//     up to every exploreMax (at most a few milliseconds of small
//     operations on a way the machine's state has turned against).
//
// The sender decides alone from the mask and the receiver follows what
// arrives, so a mask that changes while a step is under way costs a
// sample, never a mismatch. Exploring costs exploreRuns operations the
// slower way per period: at most a few per cent where one way is twice
// as slow, nothing where the two are level.
const (
	// sideBlocks: two uint64 masks, for operations that land what they
	// receive and for those that reduce it; bit k asks for blocks in
	// operations of [2^k, 2^(k+1)) bytes.
	sideBlocks = 32

	exploreRuns  = 8
	exploreWarm  = 3
	exploreFirst = 16
	exploreMin   = 256
	exploreMax   = 512

	// switchBelow: the other way is taken only where its median is below
	// this fraction of the way asked for, so that noise does not flip a
	// choice back and forth.
	switchBelow = 0.9
)

// blocksReceived counts the blocks this process has landed.
var blocksReceived atomic.Int64

// BlocksReceived returns how many blocks (transport.BlockCopier) this
// process has copied out of its peers' memory, for tests and
// diagnostics.
func BlocksReceived() int64 { return blocksReceived.Load() }

// blockChoice is a receiving side's choice for one size class.
type blockChoice struct {
	ops   int64 // operations of the class so far, every one counted
	at    int64 // ops at which the next comparison starts
	every int64 // operations from one comparison to the next
	first bool  // the way the comparison's first run asked for
	got   [2]int
	t     [2][exploreRuns - exploreWarm]int64
}

// initBlocks sets this side's mask once its probe found that it can read
// the peer's memory: every class asks for blocks with Options.CMA on;
// none otherwise, until Received has counted an operation of the class.
//
// Then (Received) operations that land what they receive go in blocks
// from the class's second operation, and those that reduce it stay on the
// slots until measured: landing in blocks took 0.5-0.66 of the slots'
// time in this machine's usual cross-core state and at most 1.25 times it
// in the fast one, from 64 KiB to 16 MiB, where a 16 MiB reduce took
// twice as long in blocks (docs/performance.md, "Blocks by reference";
// "Landing operations start in blocks"). The start matters for a class's
// first exploreFirst operations and, where a comparison's medians come
// out within a tenth, until the next one: a 16 MiB all-gather runs about
// 200 operations in a 0.3 s benchmark, and started on the slots it stayed
// there in some runs. Not from the first operation: only a side that
// runs host operations, which can take blocks, calls Received, so a
// side whose buffers are device memory never asks a host-memory peer
// for blocks it could not take.
func (c *conn) initBlocks() {
	var m uint64
	if c.e.o.CMA == CMAOn {
		m = ^uint64(0)
	}
	for _, reduces := range []bool{false, true} {
		c.seg.u64(blockMask(c.seg.side, reduces)).Store(m)
	}
}

// kindOf indexes the masks and choices: 0 for operations that land what
// they receive, 1 for those that reduce it.
func kindOf(reduces bool) int {
	if reduces {
		return 1
	}
	return 0
}

// blockMask is the offset of side's mask for operations that reduce or
// land what they receive.
func blockMask(side int, reduces bool) int { return sideOff(side) + sideBlocks + 8*kindOf(reduces) }

// sizeClass is the class of an operation of opBytes.
func sizeClass(opBytes int64) int { return max(bits.Len64(uint64(opBytes))-1, 0) }

// wantsBlocks reports whether side reads the other's memory and asks for
// blocks in operations of opBytes.
func (c *conn) wantsBlocks(side int, opBytes int64, reduces bool) bool {
	return c.reads(side) && c.asks(side, opBytes, reduces)
}

// asks reports whether side's mask asks for blocks in operations of
// opBytes.
func (c *conn) asks(side int, opBytes int64, reduces bool) bool {
	if !c.seg.acquire() {
		return false
	}
	defer c.seg.release()
	return c.seg.u64(blockMask(side, reduces)).Load()&(1<<sizeClass(opBytes)) != 0
}

// askBlocks sets or clears this side's bit for class k.
func (c *conn) askBlocks(k int, reduces, on bool) {
	if !c.seg.acquire() {
		return
	}
	defer c.seg.release()
	w := c.seg.u64(blockMask(c.seg.side, reduces))
	m := w.Load()
	if on {
		m |= 1 << k
	} else {
		m &^= 1 << k
	}
	w.Store(m)
}

// Received implements transport.BlockCopier.
func (c *conn) Received(opBytes int64, reduces bool, blocks, steps int, took time.Duration) {
	if c.e.o.CMA == CMAOn || steps <= 0 || !c.blocksFit(opBytes, reduces) || !c.reads(c.seg.side) {
		return
	}
	k := sizeClass(opBytes)
	asked := c.asks(c.seg.side, opBytes, reduces) // (reads, just checked)
	// A sample counts only if every step came the way this side asked
	// (none in blocks, or all).
	valid := asked && blocks == steps || !asked && blocks == 0
	ch := &c.choices[kindOf(reduces)][k]
	first := ch.ops == 0
	want := ch.observe(asked, valid, int64(took))
	if first && !reduces {
		want = true // landing starts in blocks from the class's second operation (initBlocks)
	}
	if want != asked {
		c.askBlocks(k, reduces, want)
	}
}

// observe counts one operation of the class, which took took ns and came
// the way this side asked (asked: in blocks) if valid, and returns which
// way to ask from now on.
//
// Comparisons start at operation exploreFirst (the first few run while
// the buffers are first touched and the threads start) and then after
// exploreMin, 2*exploreMin, ... operations, up to every exploreMax. The
// schedule is a function of the count alone, so that the two ranks of an
// all-gather, each the receiver of the other's slices and each seeing
// every operation, compare at the same operations: where one compared
// while the other kept the slow way, each operation would wait for that
// slow direction whichever way the first asked, and the pair could stay
// on the slots where blocks would be faster for both.
func (ch *blockChoice) observe(asked, valid bool, took int64) bool {
	if ch.every == 0 {
		ch.every, ch.at = exploreMin, exploreFirst
	}
	i := ch.ops - ch.at
	ch.ops++
	if i < 0 {
		return asked
	}
	run, pos := int(i/exploreRuns), int(i%exploreRuns)
	if i == 0 {
		ch.first, ch.got = asked, [2]int{}
	}
	if pos >= exploreWarm && valid {
		// (The first operations of each run warm the way up: one may have
		// started before the switch, and a sender switched to the slots
		// runs ahead into them, empty, for an operation or two, which
		// makes the slots look faster to the receiver than they will be.)
		ch.t[run][ch.got[run]] = took
		ch.got[run]++
	}
	if pos < exploreRuns-1 {
		return asked
	}
	if run == 0 {
		return !ch.first
	}
	choice := ch.first
	if ch.got[0] > 0 && ch.got[1] > 0 && float64(median(ch.t[1][:ch.got[1]])) < switchBelow*float64(median(ch.t[0][:ch.got[0]])) {
		choice = !ch.first
	}
	ch.at = ch.ops + ch.every
	ch.every = min(2*ch.every, exploreMax)
	return choice
}

// median is the middle of t (the upper one of an even count).
func median(t []int64) int64 {
	s := slices.Clone(t)
	slices.Sort(s)
	return s[len(s)/2]
}
