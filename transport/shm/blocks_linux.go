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
// reference"). So in a 2-rank broadcast or all-gather, whose steps only
// send or only receive, the sender cuts a step it sends by reference into
// blocks of Options.BlockSize and the receiver, which peeks at the first
// slice, cuts its side the same way.
//
// Whether blocks beat the slots is not a property of the host that a
// probe at start-up could find. It flips with where the hypervisor puts
// the two ranks' vCPUs: where a cache line crosses between them in 40-100
// ns the slots move a MiB in about 39 µs and a 64 KiB broadcast in 3;
// where it takes 260-390 ns (most of the time here) they take 150 µs and
// 12, and the kernel's copy, which reads the sender's memory once instead
// of handing every line over twice, wins by 2-3 times
// (docs/performance.md, "Why this machine's small and mid-size figures
// are bimodal"). So, unless Options.CMA says on, each receiving side
// measures both ways, end to end, on the operations it runs:
//
//   - per size class (the operation's size rounded down to a power of
//     two), it asks for slots or blocks in a bit of a mask in its half of
//     the segment's header (sideBlocks), which the sender reads when it
//     starts a step (BlockSlice) and nobody else writes;
//   - the engine tells it, after each operation, how long its channel took
//     and which way the slices came (Received);
//   - from the first operation of a class on, and again every
//     exploreEvery (or exploreOps operations' time, if longer), it takes
//     exploreRuns operations one way, then exploreRuns the other, drops
//     the first of each run (the switch) and any that came the other way
//     (a sender that had already started), and keeps the way with the
//     lower median.
//
// The sender decides alone from the mask and the receiver follows what
// arrives, so a mask that changes while a step is under way costs a
// sample, never a mismatch. Exploring costs exploreRuns operations the
// slower way per period: at most a few per cent where one way is twice
// as slow, nothing where the two are level.
const (
	sideBlocks = 32 // uint64: bit k asks for blocks in operations of [2^k, 2^(k+1)) bytes

	exploreRuns = 4
	exploreMin  = 256
	exploreMax  = 4096
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
	t     [2][exploreRuns - 1]int64
}

// initBlocks sets this side's mask once its probe found that it can read
// the peer's memory: every class asks for blocks with Options.CMA on;
// none at first otherwise, until Received has measured.
func (c *conn) initBlocks() {
	var m uint64
	if c.e.o.CMA == CMAOn {
		m = ^uint64(0)
	}
	c.seg.u64(sideOff(c.seg.side) + sideBlocks).Store(m)
}

// sizeClass is the class of an operation of opBytes.
func sizeClass(opBytes int64) int { return max(bits.Len64(uint64(opBytes))-1, 0) }

// wantsBlocks reports whether side reads the other's memory and asks for
// blocks in operations of opBytes.
func (c *conn) wantsBlocks(side int, opBytes int64) bool {
	if !c.reads(side) || !c.seg.acquire() {
		return false
	}
	defer c.seg.release()
	return c.seg.u64(sideOff(side)+sideBlocks).Load()&(1<<sizeClass(opBytes)) != 0
}

// askBlocks sets or clears this side's bit for class k.
func (c *conn) askBlocks(k int, on bool) {
	if !c.seg.acquire() {
		return
	}
	defer c.seg.release()
	w := c.seg.u64(sideOff(c.seg.side) + sideBlocks)
	m := w.Load()
	if on {
		m |= 1 << k
	} else {
		m &^= 1 << k
	}
	w.Store(m)
}

// Received implements transport.BlockCopier.
func (c *conn) Received(opBytes int64, blocks, steps int, took time.Duration) {
	if c.e.o.CMA == CMAOn || opBytes <= 0 || steps <= 0 || !c.reads(c.seg.side) {
		return
	}
	k := sizeClass(opBytes)
	asked := c.wantsBlocks(c.seg.side, opBytes)
	// A sample counts only if every step came the way this side asked.
	came := blocks == steps
	valid := came == asked && (blocks == 0 || blocks == steps)
	if want := c.choices[k].observe(asked, valid, int64(took)); want != asked {
		c.askBlocks(k, want)
	}
}

// observe counts one operation of the class, which took took ns and came
// the way this side asked (asked: in blocks) if valid, and returns which
// way to ask from now on.
//
// Comparisons start at the first operation and then after exploreMin,
// 2*exploreMin, ... operations, up to every exploreMax. The schedule is a
// function of the count alone, so that the two ranks
// of an all-gather, each the receiver of the other's slices and each
// seeing every operation, compare at the same operations: where one
// compared while the other kept the slow way, each operation would wait
// for that slow direction whichever way the first asked, and the pair
// could stay on the slots where blocks would be faster for both.
func (ch *blockChoice) observe(asked, valid bool, took int64) bool {
	if ch.every == 0 {
		ch.every = exploreMin
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
	if pos > 0 && valid {
		// (The first operation of each run warms the way up, and may have
		// started before the switch.)
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
	if ch.got[0] > 0 && ch.got[1] > 0 && median(ch.t[1][:ch.got[1]]) < median(ch.t[0][:ch.got[0]]) {
		choice = !ch.first
	}
	ch.at = ch.ops + ch.every
	ch.every = min(2*ch.every, exploreMax)
	return choice
}

func median(t []int64) int64 {
	s := slices.Clone(t)
	slices.Sort(s)
	return s[len(s)/2]
}
