//go:build linux

package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// sharedPair is a connection between two endpoints of this process with
// the kernel's copy off, so that a slice goes by reference only out of a
// shared allocation (this process stands for the peer: its /proc/<pid>/fd
// opens as a peer's does).
func sharedPair(t *testing.T) (a, b *conn) {
	eps := endpoints(t, 2, func(r int, o *Options) { o.CMA = CMAOff })
	ca, cb := connectPair(t, eps[0], eps[1], 0)
	return ca.(*conn), cb.(*conn)
}

// sendShared posts the slices srcs with PostFrom while b lands them with
// WaitInto, flushes, then overwrites the sources: what b got must be
// what they held before Flush returned.
func sendShared(t *testing.T, a, b *conn, srcs [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := make([][]byte, len(srcs))
	for i, s := range srcs {
		copy(s, pattern(i, len(s)))
		want[i] = bytes.Clone(s)
	}
	got := make(chan error, 1)
	dsts := make([][]byte, len(srcs))
	go func() {
		for i := range srcs {
			dsts[i] = make([]byte, len(srcs[i]))
			if _, _, err := b.WaitInto(ctx, memory.HostBuffer(dsts[i])); err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	for i, s := range srcs {
		require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(s), transport.Tag{Op: 9, Msg: uint32(i)}))
	}
	require.NoError(t, a.Flush(ctx))
	for _, s := range srcs {
		for j := range s {
			s[j] = ^s[j]
		}
	}
	require.NoError(t, <-got)
	for i := range srcs {
		require.True(t, bytes.Equal(want[i], dsts[i]), "slice %d corrupted", i)
	}
}

func sharedAlloc(t *testing.T, n int) []byte {
	b, err := memory.AllocShared(n)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, memory.FreeShared(b)) })
	return b
}

func TestSharedAllocationSlicesGoByReference(t *testing.T) {
	a, b := sharedPair(t)
	buf := sharedAlloc(t, 1<<20)
	require.False(t, a.PeerMaps(1<<20, true), "the receiver has not probed yet")
	sendShared(t, a, b, [][]byte{buf[:1000]}) // the receiver probes on its first wait
	require.True(t, a.PeerMaps(1<<20, true), "the receiver has found it can map this process's allocations")
	require.True(t, b.PeerMaps(1<<20, false))
	require.False(t, a.PeerCopies(1<<20, true), "the kernel's copy stays off")
	require.False(t, a.PeerMaps(DefaultCMAMin-1, true), "small operations keep their slots")
	require.False(t, a.PeerMaps(DefaultSharedMax+1, true), "large operations keep their slots: two cores copy them faster")

	// Ten slices, more than the ring's slots, from two places of the
	// allocation: each goes by reference, from one mapping.
	before := a.byMap.Load()
	srcs := make([][]byte, 10)
	for i := range srcs {
		srcs[i] = buf[i*50000+i : i*50000+i+40000]
	}
	sendShared(t, a, b, srcs)
	require.EqualValues(t, before+10, a.byMap.Load())
	require.Len(t, b.seg.peerMaps, 1, "one mapping of the one allocation")

	// Go memory and slices of at most 32 bytes go as ever.
	sendShared(t, a, b, [][]byte{make([]byte, 40000), buf[:inlineMax]})
	require.EqualValues(t, before+10, a.byMap.Load())

	// A plain Wait hands out the slice where it is, in the sender's
	// buffer (transport.Lender): what the sender writes there shows.
	require.NoError(t, a.PostFrom(context.Background(), memory.HostBuffer(buf[5:9005]), transport.Tag{Op: 3}))
	got, _, err := b.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, buf[5:9005], got.Bytes())
	buf[5] ^= 0xff
	require.Equal(t, buf[5], got.Bytes()[0], "a view of the sender's buffer, not a copy")
	require.NoError(t, b.Intact())
	require.NoError(t, b.Release())
	require.NoError(t, a.Flush(context.Background()))
}

// A slice lent out of the sender's buffer is no longer intact once the
// sender aborts: its caller may be writing the buffer again.
func TestSharedAllocationLentSliceAndAbort(t *testing.T) {
	a, b := sharedPair(t)
	buf := sharedAlloc(t, 1<<20)
	sendShared(t, a, b, [][]byte{buf[:1000]})
	ctx := context.Background()
	require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(buf[:60000]), transport.Tag{Op: 1}))
	got, _, err := b.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 60000, got.Len())
	require.NoError(t, b.Intact())
	require.NoError(t, a.e.Close(errors.New("rank 0 gave up")))
	err = b.Intact()
	var pa *transport.PeerAbortedError
	require.ErrorAs(t, err, &pa)
	require.ErrorContains(t, err, "rank 0 gave up")
	b.Release()
}

func TestSharedAllocationMappingsAreBounded(t *testing.T) {
	a, b := sharedPair(t)
	var srcs [][]byte
	for range peerSharedMax + 3 {
		srcs = append(srcs, sharedAlloc(t, 8192))
	}
	sendShared(t, a, b, srcs[:1])
	sendShared(t, a, b, srcs)
	require.Len(t, b.seg.peerMaps, peerSharedMax, "the oldest mappings let go")
	require.Len(t, b.seg.peerOrder, peerSharedMax)
}

// A reference the receiver cannot honour fails its wait with the reason
// (a peer that lies about the nonce, or about the slice's place).
func TestSharedAllocationBadReferences(t *testing.T) {
	buf := sharedAlloc(t, 64<<10)
	ref, ok := memory.SharedOf(buf)
	require.True(t, ok)
	for _, tc := range []struct {
		name string
		bend func(d []byte)
		want string
	}{
		{"wrong nonce", func(d []byte) { binary.LittleEndian.PutUint64(d[descInline+refNonce:], ref.Nonce^4) }, "nonce"},
		{"past the end", func(d []byte) { binary.LittleEndian.PutUint64(d[descInline:], uint64(len(buf)-100)) }, "shorter"},
		{"unknown kind", func(d []byte) { binary.LittleEndian.PutUint32(d[descInline+refKind:], 7) }, "kind 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := sharedPair(t)
			sendShared(t, a, b, [][]byte{buf[:1000]})
			ctx := context.Background()
			slot := a.tail
			require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(buf[:4000]), transport.Tag{Op: 1}))
			tc.bend(a.tx.descOf(slot))
			_, _, err := b.WaitInto(ctx, memory.HostBuffer(make([]byte, 4000)))
			require.ErrorContains(t, err, tc.want)

			// The same through a plain Wait, which would lend the slice.
			a, b = sharedPair(t)
			sendShared(t, a, b, [][]byte{buf[:1000]})
			slot = a.tail
			require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(buf[:4000]), transport.Tag{Op: 1}))
			tc.bend(a.tx.descOf(slot))
			_, _, err = b.Wait(ctx)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
