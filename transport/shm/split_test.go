//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// sendBlocks posts k blocks of n bytes (PostBlock, cut at block) while b
// lands them with WaitInto, flushing after each, and checks that each
// came whole: what src held before Flush returned.
func sendBlocks(t *testing.T, a, b *conn, k, n, block int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range k {
		src, dst := pattern(i+20, n), make([]byte, n)
		done := make(chan error, 1)
		go func() {
			tag, m, err := b.WaitInto(ctx, memory.HostBuffer(dst))
			if err == nil && (tag != (transport.Tag{Op: 7, Msg: uint32(i)}) || m != n) {
				err = transport.ErrSizeMismatch
			}
			done <- err
		}()
		require.NoError(t, a.PostBlock(ctx, memory.HostBuffer(src), transport.Tag{Op: 7, Msg: uint32(i)}, block))
		require.NoError(t, a.Flush(ctx))
		for j := range src {
			src[j] = ^src[j]
		}
		require.NoError(t, <-done)
		require.True(t, bytes.Equal(pattern(i+20, n), dst), "block %d corrupted", i)
	}
}

// holdUntilTaken makes every receiver wait, once it has published a
// request, until a sender has claimed a chunk (or 5 s), so that the
// split's sharing does not depend on how the two goroutines are
// scheduled.
func holdUntilTaken(t *testing.T) {
	splitAsked = func(w *atomic.Uint64) {
		for end := time.Now().Add(5 * time.Second); uint32(w.Load()) == 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Microsecond)
		}
	}
	t.Cleanup(func() { splitAsked = nil })
}

// The sender, waiting in Flush, writes the second half of a block into
// the receiver's output while the receiver reads the first: the output is
// whole, and each side counts the chunks the other does. (The receiver
// is held until its sender claims a chunk: left to the scheduler, CI's
// -race pass once saw the receiver take both chunks of 100 blocks.)
func TestSplitCopiesShareABlock(t *testing.T) {
	a, b := cmaPair(t, nil)
	sendRefs(t, a, b, 1, 1000)    // the receiver probes on its first wait
	n := 1<<20 + 3*pageSize + 100 // an odd length: the second chunk is short
	holdUntilTaken(t)
	for i := 0; i < 3 && b.splitBy.Load() == 0; i++ {
		sendBlocks(t, a, b, 1, n, n)
	}
	require.Positive(t, b.splitBy.Load(), "in 3 blocks the sender, waiting in Flush, took no chunk")
	require.Equal(t, a.splitFor.Load(), b.splitBy.Load(), "chunks the sender wrote against those the receiver counted")
	require.False(t, a.noSplit || b.noSplit)
}

// A sender that says it is busy after its posts (its own copy, out of
// place) is not asked, and neither is one whose Options turn it off.
func TestSplitCopiesNotAsked(t *testing.T) {
	a, b := cmaPair(t, nil)
	sendRefs(t, a, b, 1, 1000)
	a.BusyAfterPosts(true)
	sendBlocks(t, a, b, 5, 512<<10, DefaultBlockSize)
	require.Zero(t, b.helpGen, "a busy sender was asked")
	a.BusyAfterPosts(false)
	holdUntilTaken(t)
	sendBlocks(t, a, b, 5, 512<<10, DefaultBlockSize)
	require.EqualValues(t, 5, b.helpGen, "once not busy, the sender was not asked")
	require.GreaterOrEqual(t, b.splitBy.Load(), int64(5))

	a, b = cmaPair(t, func(_ int, o *Options) { o.NoSplit = true })
	sendRefs(t, a, b, 1, 1000)
	sendBlocks(t, a, b, 5, 512<<10, DefaultBlockSize)
	require.Zero(t, b.helpGen, "NoSplit: the sender was asked")

	// Below splitMinBytes a block is one copy.
	a, b = cmaPair(t, nil)
	sendRefs(t, a, b, 1, 1000)
	sendBlocks(t, a, b, 5, splitMinBytes-pageSize, DefaultBlockSize)
	require.Zero(t, b.helpGen, "asked for a block below splitMinBytes")
}

// Where the kernel refuses the sender's write, the receiver copies the
// whole block itself, and neither side splits again on the connection.
func TestSplitCopyWriteRefused(t *testing.T) {
	a, b := cmaPair(t, nil)
	sendRefs(t, a, b, 1, 1000)
	holdUntilTaken(t)
	refused := 0
	splitWrite = func(int, []byte, uint64) error { refused++; return errors.New("refused (test)") }
	defer func() { splitWrite = writePeer }()
	sendBlocks(t, a, b, 10, 1<<20, DefaultBlockSize)
	require.Equal(t, 1, refused, "the sender tried again after a refusal, or never tried")
	require.EqualValues(t, 1, b.helpGen, "the receiver asked again after a refusal")
	require.True(t, a.noSplit, "the sender splits on after a refusal")
	require.True(t, b.noSplit, "the receiver asks on after a refusal")
	require.Zero(t, b.splitBy.Load())
}

// A sender takes a share only of a block it posted by reference and has
// not seen released, checked against its own record, whatever the
// request in the receiver's half says.
func TestSplitRequestChecked(t *testing.T) {
	a, b := cmaPair(t, nil)
	sendRefs(t, a, b, 1, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := pattern(3, 512<<10)
	require.NoError(t, a.PostBlock(ctx, memory.HostBuffer(src), transport.Tag{Op: 9}, DefaultBlockSize))
	posted := a.tail - 1
	dst := make([]byte, len(src))
	me := b.seg.side
	ask := func(slice uint32, n int) {
		w := b.helpWord(me)
		w.Store(uint64(b.helpGen+1)<<32 | helpClosed)
		b.helpGen++
		b.helpU32(me, helpSlice).Store(slice)
		b.helpU32(me, helpChunk).Store(uint32(splitChunk(n)))
		b.helpU32(me, helpDone).Store(0)
		*(*uint64)(b.helpAt(me, helpDst)) = uint64(uintptr(unsafe.Pointer(&dst[0])))
		*(*uint64)(b.helpAt(me, helpLen)) = uint64(n)
		w.Store(uint64(b.helpGen) << 32)
	}
	for _, c := range []struct {
		name  string
		slice uint32
		n     int
	}{
		{"a slice not posted yet", posted + 1, len(src)},
		{"a slice posted long ago", posted - a.tx.slots, len(src)},
		{"a length other than the post's", posted, len(src) + pageSize},
	} {
		ask(c.slice, c.n)
		a.serveSplit()
		require.Equal(t, uint64(b.helpGen)<<32, b.helpWord(me).Load(), "%s: a chunk was claimed", c.name)
		require.Zero(t, a.splitFor.Load(), "%s: the sender wrote", c.name)
	}
	ask(posted, len(src))
	a.serveSplit()
	require.Equal(t, uint64(b.helpGen)<<32|2, b.helpWord(me).Load(), "the request as posted: both chunks claimed")
	require.EqualValues(t, 2, a.splitFor.Load())
	require.True(t, bytes.Equal(src, dst), "what the sender wrote")
	b.helpWord(me).Store(uint64(b.helpGen)<<32 | helpClosed)
	// The receiver takes the block as ever.
	got := make([]byte, len(src))
	_, _, err := b.WaitInto(ctx, memory.HostBuffer(got))
	require.NoError(t, err)
	require.Equal(t, src, got)
	require.NoError(t, a.Flush(ctx))
}
