//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// cmaPair is a connection between two endpoints of this process
// (process_vm_readv works on one's own pid as on a peer's) and the
// receiving side's first wait, which runs the probe.
func cmaPair(t *testing.T, mod func(r int, o *Options)) (a, b *conn) {
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.CMA = CMAOn // whatever this host's kernel copy costs
		if mod != nil {
			mod(r, o)
		}
	})
	ca, cb := connectPair(t, eps[0], eps[1], 0)
	return ca.(*conn), cb.(*conn)
}

// sendRefs posts k slices of n bytes from src with PostFrom while b lands
// them with WaitInto, flushes, then overwrites src: what b got must be
// what src held before Flush returned.
func sendRefs(t *testing.T, a, b *conn, k, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srcs := make([][]byte, k)
	got := make(chan error, 1)
	dsts := make([][]byte, k)
	go func() {
		for i := range k {
			dsts[i] = make([]byte, n)
			tag, m, err := b.WaitInto(ctx, memory.HostBuffer(dsts[i]))
			if err == nil && (tag != (transport.Tag{Op: 5, Msg: uint32(i)}) || m != n) {
				err = context.DeadlineExceeded
			}
			if err != nil {
				got <- err
				return
			}
		}
		got <- nil
	}()
	for i := range k {
		srcs[i] = pattern(i, n)
		require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(srcs[i]), transport.Tag{Op: 5, Msg: uint32(i)}))
	}
	require.NoError(t, a.Flush(ctx))
	for _, s := range srcs {
		for j := range s {
			s[j] = ^s[j]
		}
	}
	require.NoError(t, <-got)
	for i := range k {
		require.True(t, bytes.Equal(pattern(i, n), dsts[i]), "slice %d corrupted", i)
	}
}

func TestPeerCopyReadsTheSendersMemory(t *testing.T) {
	a, b := cmaPair(t, nil)
	require.False(t, b.PeerCopies(1<<20, false), "the receiver has not probed yet")
	// Before the receiver's first wait nobody knows whether it can read
	// the sender: the first slices go through slots.
	require.False(t, a.PeerCopies(1<<20, true), "no single copy before the receiver has probed")
	sendRefs(t, a, b, 3, 40<<10) // the receiver probes on its first wait
	require.True(t, a.PeerCopies(1<<20, true), "the receiver has found it can read this process")
	require.True(t, b.PeerCopies(1<<20, false), "and lands the slices of a 1 MiB operation")
	require.False(t, a.PeerCopies(DefaultCMAMin-1, true), "small operations keep their slots")
	// Ten slices, more than the ring's four slots: PostFrom waits for
	// room, and every slice goes by reference.
	before := a.byRef.Load()
	sendRefs(t, a, b, 10, 40<<10)
	require.EqualValues(t, before+10, a.byRef.Load())
	// Slices of at most 32 bytes travel in their descriptors, as ever.
	sendRefs(t, a, b, 2, inlineMax)
	require.EqualValues(t, before+10, a.byRef.Load())
}

func TestPeerCopyByReferenceIntoAPlainWait(t *testing.T) {
	a, b := cmaPair(t, nil)
	ctx := context.Background()
	sendRefs(t, a, b, 1, 1000) // the probe
	before := a.byRef.Load()
	src := pattern(3, 5000)
	require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 6}))
	buf, tag, err := b.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, transport.Tag{Op: 6}, tag)
	require.Equal(t, src, buf.Bytes(), "Wait copies a slice sent by reference into its slot")
	require.NoError(t, b.Release())
	require.NoError(t, a.Flush(ctx))
	require.EqualValues(t, before+1, a.byRef.Load())
}

func TestPeerCopyOffOrRefused(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		a, b := cmaPair(t, func(_ int, o *Options) { o.CMAMin = -1 })
		sendRefs(t, a, b, 6, 40<<10)
		require.False(t, b.PeerCopies(1<<20, false))
		require.Zero(t, a.byRef.Load())
	})
	t.Run("refused", func(t *testing.T) {
		// A receiver that cannot read the sender (here: a pid that is not
		// the sender's, as in another pid namespace) says so, and the
		// sender keeps its slots.
		a, b := cmaPair(t, nil)
		b.pid = 1 << 30
		sendRefs(t, a, b, 6, 40<<10)
		require.False(t, a.PeerCopies(1<<20, true))
		require.False(t, b.PeerCopies(1<<20, false))
		require.Zero(t, a.byRef.Load())
	})
}

var errTest = errors.New("shm test: the sender aborts (cause 71c2)")

func TestPeerCopyAbortedSender(t *testing.T) {
	// The receiver's copy fails once the sender has aborted, even when
	// the slice was posted before: its buffer may have been reused.
	eps := endpoints(t, 2, func(_ int, o *Options) { o.CMA = CMAOn })
	ca, cb := connectPair(t, eps[0], eps[1], 0)
	a, b := ca.(*conn), cb.(*conn)
	sendRefs(t, a, b, 1, 1000)
	before := a.byRef.Load()
	ctx := context.Background()
	require.NoError(t, a.PostFrom(ctx, memory.HostBuffer(pattern(1, 9000)), transport.Tag{Op: 7}))
	require.EqualValues(t, before+1, a.byRef.Load())
	require.NoError(t, eps[0].Close(errTest))
	dst := make([]byte, 9000)
	_, _, err := b.WaitInto(ctx, memory.HostBuffer(dst))
	require.Error(t, err)
	require.ErrorContains(t, err, errTest.Error())
}

// By default a receiver offers the single copy only where this host's
// kernel copies at least half as fast as user space (cmaWorthIt), and
// slot-sized slices go that way only from cmaSliceMin to cmaSliceMax.
func TestPeerCopyAutoFollowsTheMeasuredSpeed(t *testing.T) {
	ratio := kernelCopySpeed()
	require.Greater(t, ratio, 0.0, "process_vm_readv on this process works")
	a, b := cmaPair(t, func(_ int, o *Options) { o.CMA = CMAAuto })
	sendRefs(t, a, b, 2, 40<<10)
	t.Logf("kernel copy at %.2f of a user-space copy's speed", ratio)
	require.Equal(t, ratio >= cmaWorthIt, a.PeerCopies(1<<20, true))
	require.False(t, a.PeerCopies(cmaSliceMin-1, true), "below cmaSliceMin the slots carry slot-sized slices")
	require.Equal(t, ratio >= cmaWorthIt, a.PeerCopies(cmaSliceMax, true), "up to cmaSliceMax they go by reference")
	require.False(t, a.PeerCopies(cmaSliceMax+1, true), "above cmaSliceMax the slots carry slot-sized slices")
	a, b = cmaPair(t, func(_ int, o *Options) { o.CMA = CMAOn })
	sendRefs(t, a, b, 2, 40<<10)
	require.True(t, a.PeerCopies(DefaultCMAMin, true), "CMAOn: from CMAMin on, whatever the size")
	require.True(t, a.PeerCopies(4*cmaSliceMax, true), "CMAOn: above cmaSliceMax too")
	a, b = cmaPair(t, func(_ int, o *Options) { o.CMA = CMAOff })
	sendRefs(t, a, b, 2, 40<<10)
	require.False(t, a.PeerCopies(1<<20, true), "CMAOff")
}

// The engine writes a connection's slots with streaming stores unless
// Options.NoStreamSlots says not to (transport.FarSlots).
func TestSlotsFarUnlessTurnedOff(t *testing.T) {
	a, b := cmaPair(t, nil)
	var _ transport.FarSlots = a
	require.True(t, a.SlotsFar())
	require.True(t, b.SlotsFar())
	a, b = cmaPair(t, func(_ int, o *Options) { o.NoStreamSlots = true })
	require.False(t, a.SlotsFar())
	require.False(t, b.SlotsFar())
}
