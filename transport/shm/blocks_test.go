//go:build linux

package shm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// A block larger than a slot goes by reference in one piece: the
// receiver peeks at the block size, lands it with WaitInto, and the
// sender's Flush returns only after that.
func TestBlocksLargerThanASlot(t *testing.T) {
	a, b := cmaPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sendRefs(t, a, b, 1, 1000) // the receiver probes on its first wait
	require.True(t, a.wantsBlocks(1-a.seg.side, 1<<20, false), "CMAOn asks for blocks at every size")
	require.True(t, a.wantsBlocks(1-a.seg.side, 1<<20, true), "in reductions too")
	block := a.BlockSlice(1<<20, false)
	require.Equal(t, DefaultBlockSize, block)
	require.Greater(t, block, a.tx.slotSize)
	require.Zero(t, a.BlockSlice(DefaultBlockMax+1, true), "above BlockMax the slots carry a reduction")
	require.Equal(t, block, a.BlockSlice(4*DefaultBlockMax, false), "and blocks a broadcast or all-gather at any size")

	src := pattern(9, 3*a.tx.slotSize+100)
	done := make(chan error, 1)
	dst := make([]byte, len(src))
	go func() {
		n, err := b.PeekBlock(ctx)
		if err == nil && n != block {
			err = transport.ErrSizeMismatch
		}
		if err == nil {
			var tag transport.Tag
			tag, _, err = b.WaitInto(ctx, memory.HostBuffer(dst))
			if err == nil && tag != (transport.Tag{Op: 8}) {
				err = transport.ErrSizeMismatch
			}
		}
		done <- err
	}()
	require.NoError(t, a.PostBlock(ctx, memory.HostBuffer(src), transport.Tag{Op: 8}, block))
	require.NoError(t, a.Flush(ctx))
	for i := range src {
		src[i] = ^src[i]
	}
	require.NoError(t, <-done)
	require.True(t, bytes.Equal(pattern(9, len(dst)), dst), "the block came whole, read before Flush returned")

	// A slot-sized slice by reference says so to a peek, which leaves it
	// for the wait.
	small := pattern(4, 40<<10)
	require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(small), transport.Tag{Op: 10}))
	n, err := b.PeekBlock(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	got := make([]byte, len(small))
	tag, _, err := b.WaitInto(ctx, memory.HostBuffer(got))
	require.NoError(t, err)
	require.Equal(t, transport.Tag{Op: 10}, tag)
	require.Equal(t, small, got)
	require.NoError(t, a.Flush(ctx))
}

// A block that arrives where the receiver takes slot-sized slices (the
// two ranks disagree about the step) fails with an error that says so,
// instead of overrunning the slot.
func TestBlockIntoAPlainWaitFails(t *testing.T) {
	a, b := cmaPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sendRefs(t, a, b, 1, 1000)
	src := pattern(2, 2*a.tx.slotSize)
	require.NoError(t, a.PostBlock(ctx, memory.HostBuffer(src), transport.Tag{Op: 9}, DefaultBlockSize))
	_, _, err := b.Wait(ctx)
	require.ErrorContains(t, err, "block")
	require.ErrorContains(t, err, "disagree")
}

// A sender refuses to post a block to a peer that cannot read its
// memory, and one larger than the block it names.
func TestPostBlockRefused(t *testing.T) {
	a, b := cmaPair(t, nil)
	b.pid = 1 << 30 // as in another pid namespace: the probe fails
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sendRefs(t, a, b, 2, 40<<10)
	require.Zero(t, a.BlockSlice(1<<20, false), "no blocks where the peer cannot read")
	err := a.PostBlock(ctx, memory.HostBuffer(make([]byte, 300<<10)), transport.Tag{}, DefaultBlockSize)
	require.ErrorContains(t, err, "does not read this rank's memory")
	err = a.PostBlock(ctx, memory.HostBuffer(make([]byte, 300<<10)), transport.Tag{}, 100<<10)
	require.ErrorContains(t, err, "in blocks of")
}

// With CMAAuto a receiver starts reductions on the slots and asks for
// landing operations in blocks from a class's second operation, and keeps
// or leaves each way by what it measures; with CMAOff it never reads at
// all.
func TestBlocksAutoStartingWays(t *testing.T) {
	a, b := cmaPair(t, func(_ int, o *Options) { o.CMA = CMAAuto })
	sendRefs(t, a, b, 1, 1000)
	require.True(t, b.reads(b.seg.side), "the probe found it can read this process")
	require.Zero(t, a.BlockSlice(1<<20, true), "a reduction, nothing measured yet: slots")
	require.Zero(t, a.BlockSlice(1<<20, false), "landing, no operation counted yet: slots (a device-memory receiver never counts one)")
	b.Received(1<<20, false, 0, 1, 100*time.Microsecond)
	require.NotZero(t, a.BlockSlice(1<<20, false), "landing, from the class's second operation: blocks")
	require.Zero(t, a.BlockSlice(64<<20, false), "each class for itself")
	b.Received(64<<20, false, 0, 1, 100*time.Microsecond)
	require.NotZero(t, a.BlockSlice(64<<20, false), "above BlockMax too")
	// feed reports n one-step operations of opBytes to the receiver, each
	// taking us µs and come in blocks or not.
	feed := func(n int, opBytes int64, reduces, inBlocks bool, us time.Duration) {
		blocks := 0
		if inBlocks {
			blocks = 1
		}
		for range n {
			b.Received(opBytes, reduces, blocks, 1, us*time.Microsecond)
		}
	}
	// The receiver measures the reduction: the slots take 100 µs, blocks 40.
	feed(exploreFirst+exploreRuns, 1<<20, true, false, 100)
	require.NotZero(t, a.BlockSlice(1<<20, true), "the comparison's second run asks for blocks")
	feed(exploreRuns, 1<<20, true, true, 40)
	require.NotZero(t, a.BlockSlice(1<<20, true), "blocks were faster: kept")
	require.Zero(t, a.BlockSlice(64<<10, true), "another size class has its own choice")
	// Landing: blocks take 100 µs, the slots 40: the slots are taken.
	feed(1, 4<<20, false, false, 40)
	feed(exploreFirst+exploreRuns-1, 4<<20, false, true, 100)
	require.Zero(t, a.BlockSlice(4<<20, false), "the comparison's second run asks for the slots")
	feed(exploreRuns, 4<<20, false, false, 40)
	require.Zero(t, a.BlockSlice(4<<20, false), "the slots were faster: kept")
	require.NotZero(t, a.BlockSlice(1<<20, false), "the 1 MiB class still starts in blocks")

	a, b = cmaPair(t, func(_ int, o *Options) { o.CMA = CMAOff })
	sendRefs(t, a, b, 1, 1000)
	require.False(t, b.reads(b.seg.side))
	require.Zero(t, a.BlockSlice(1<<20, false))
}

// The choice per size class: a comparison at operation exploreFirst and
// then after exploreMin, 2*exploreMin, ... operations, its runs' first
// operations and samples that came the other way left out, the other way
// taken only where its median is a tenth below.
func TestBlockChoiceSchedule(t *testing.T) {
	type op struct {
		valid bool
		took  int64
	}
	// drive feeds ops one by one, each asking what the last answer said.
	drive := func(ch *blockChoice, asked bool, ops []op) bool {
		for _, o := range ops {
			asked = ch.observe(asked, o.valid, o.took)
		}
		return asked
	}
	run := func(took int64) []op {
		ops := make([]op, exploreRuns)
		for i := range ops {
			ops[i] = op{true, took}
		}
		for i := range exploreWarm {
			ops[i].took = 1e9 // the warm-up: never counted
		}
		return ops
	}

	var ch blockChoice
	for range exploreFirst {
		require.False(t, ch.observe(false, true, 1))
	}
	asked := drive(&ch, false, run(100)[:exploreRuns-1])
	require.False(t, asked, "still timing the first way")
	asked = drive(&ch, asked, run(100)[exploreRuns-1:])
	require.True(t, asked, "then the other")
	asked = drive(&ch, asked, run(40))
	require.True(t, asked, "blocks at 40 beat slots at 100")
	require.EqualValues(t, ch.ops+exploreMin, ch.at, "the next comparison")
	require.EqualValues(t, 2*exploreMin, ch.every, "and the one after comes twice as far on")

	// Until the next comparison nothing changes, whatever the times.
	for ch.ops < ch.at {
		require.True(t, ch.observe(true, true, 1e9))
	}
	// The next: blocks (asked first) at 50 and once 20, then slots at
	// 47, with a sample that came the other way (a sender that started
	// before the switch) that would have tipped it back: within a tenth
	// of the median, the choice stays.
	blocks, slots := run(50), run(47)
	blocks[exploreWarm].took = 20
	slots[exploreWarm] = op{false, 1}
	asked = drive(&ch, true, blocks)
	require.False(t, asked)
	asked = drive(&ch, asked, slots)
	require.True(t, asked, "slots at 47 are not a tenth below blocks at 50")
	for ch.ops < ch.at {
		ch.observe(true, true, 1e9)
	}
	asked = drive(&ch, true, run(50))
	require.False(t, asked)
	asked = drive(&ch, asked, run(30))
	require.False(t, asked, "slots at 30 beat blocks at 50")
	require.EqualValues(t, exploreMax, ch.every, "three comparisons on")

	// Two sides fed the same operations compare at the same ones, even
	// when their times and choices differ; the interval stops growing at
	// exploreMax.
	var x, y blockChoice
	ax, ay := false, true
	for i := range 40000 {
		ax = x.observe(ax, true, int64(100+i%7))
		ay = y.observe(ay, i%3 != 0, int64(90+i%5))
		require.Equal(t, x.at, y.at, "operation %d", i)
	}
	require.EqualValues(t, exploreMax, x.every)
}
