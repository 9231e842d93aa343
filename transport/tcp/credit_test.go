//go:build unix

package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// creditSlice is a slice size the window counts (over creditMin).
const creditSlice = creditMin + 4096

// largeSlices configures endpoints whose slots hold counted slices.
func largeSlices(nsocks, window int) func(int, *Options) {
	return func(_ int, o *Options) { o.NSocks, o.SlotSize, o.Window = nsocks, creditSlice, window }
}

// roomy gives c's data sockets 2 MiB kernel buffers each way, more
// than any window in these tests, so that what stops a sender is its
// window and not the kernel.
func roomy(t *testing.T, c transport.Conn) {
	for _, s := range c.(*conn).socks {
		require.NoError(t, unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 2<<20))
		require.NoError(t, unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 2<<20))
	}
}

// stalled posts n counted slices from a to b without b reading, waits
// until a's sends stop moving, and returns how many of them went out
// (whole or in part).
func stalled(t *testing.T, a, b transport.Conn, n int) int {
	t.Helper()
	roomy(t, a)
	roomy(t, b)
	src := make([]byte, n*creditSlice)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for i := range n {
		require.NoError(t, a.(transport.DirectSender).PostFrom(context.Background(),
			memory.HostBuffer(src[i*creditSlice:(i+1)*creditSlice]), transport.Tag{Op: 1, Msg: uint32(i)}))
	}
	out := func() int {
		waiting := 0
		for _, s := range a.(*conn).socks {
			s.wmu.Lock()
			for _, j := range s.queue {
				if j.hoff == 0 && j.doff == 0 {
					waiting++
				}
			}
			s.wmu.Unlock()
		}
		return n - waiting
	}
	last := -1
	for still := 0; still < 5; {
		time.Sleep(20 * time.Millisecond)
		a.(*conn).ob.progress()
		if got := out(); got == last {
			still++
		} else {
			last, still = got, 0
		}
	}
	return last
}

// TestCreditsBoundWhatIsInFlight: with credits, a sender whose receiver
// reads nothing writes Window counted slices and no more, where the
// kernel would take more (it does without credits); once the receiver
// reads, the rest follow, intact and in order.
func TestCreditsBoundWhatIsInFlight(t *testing.T) {
	const n = 24
	ca := tlstest.NewCA(t, "job")
	for _, c := range []struct {
		name string
		mod  func(int, *Options)
	}{
		{"plain", largeSlices(2, 0)},
		{"tls", func(r int, o *Options) { largeSlices(2, 0)(r, o); withTLS(t, ca)(r, o) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			eps := endpoints(t, 2, c.mod)
			a, b := connectPair(t, eps[0], eps[1], 0)
			window := eps[0].window
			require.Equal(t, 4, window, "the window defaults to the slot count")
			require.Equal(t, window, stalled(t, a, b, n), "a full window goes out, no more")
			// Slices wait in the queue: Flush must wait for them (its
			// lock-free check says so), not report them gone.
			short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
			require.ErrorIs(t, a.(transport.Flusher).Flush(short), context.DeadlineExceeded, "Flush with slices still queued")
			stop()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			flushed := make(chan error, 1)
			go func() { flushed <- a.(transport.Flusher).Flush(ctx) }()
			dst := make([]byte, creditSlice)
			for i := range n {
				tag, size, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(dst))
				require.NoError(t, err)
				require.Equal(t, creditSlice, size)
				require.Equal(t, uint32(i), tag.Msg)
				want := make([]byte, creditSlice)
				for j := range want {
					want[j] = byte((i*creditSlice + j) * 7)
				}
				require.True(t, bytes.Equal(want, dst), "slice %d", i)
			}
			require.NoError(t, <-flushed)
		})
	}
	t.Run("off", func(t *testing.T) {
		eps := endpoints(t, 2, largeSlices(2, -1))
		a, b := connectPair(t, eps[0], eps[1], 0)
		require.Nil(t, a.(*conn).cr.ctl, "no control socket without credits")
		require.Greater(t, stalled(t, a, b, n), 4, "the kernel alone takes more than the window")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		go a.(transport.Flusher).Flush(ctx)
		for range n {
			_, _, err := b.Wait(ctx)
			require.NoError(t, err)
			require.NoError(t, b.Release())
		}
	})
}

// TestCreditsComeEveryFewSlices: a receiver credits every Window -
// Slots/2 counted slices, and never for small ones, so small operations
// pay no system call for them.
func TestCreditsComeEveryFewSlices(t *testing.T) {
	eps := endpoints(t, 2, func(_ int, o *Options) { largeSlices(1, 0)(0, o); o.Slots = 6 })
	a, b := connectPair(t, eps[0], eps[1], 0)
	require.Equal(t, 6, eps[0].window)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(size int) {
		buf, err := a.Reserve(ctx, size)
		require.NoError(t, err)
		require.NoError(t, a.Post(buf.Len(), transport.Tag{Op: 1}))
		_, _, err = b.Wait(ctx)
		require.NoError(t, err)
		require.NoError(t, b.Release())
	}
	for range 50 {
		send(creditMin) // not counted
	}
	require.Zero(t, a.(*conn).cr.sent)
	require.Zero(t, b.(*conn).cr.told)
	for i := 1; i <= 7; i++ {
		send(creditMin + 1)
		require.Equal(t, uint64(i), a.(*conn).cr.sent)
		require.Equal(t, uint64(i/3*3), b.(*conn).cr.told, "after %d counted slices", i)
	}
	require.Equal(t, uint64(3), b.(*conn).cr.every, "learnt from the peer's window, 6 - 6/2")
}

// TestRanksMayDifferInWindowAndSlots: each end credits by its peer's
// window and slots, learnt when the connection is made, so two ranks with
// different settings still keep each other's room: streams both ways go
// through, where crediting by one's own settings stalled one direction.
func TestRanksMayDifferInWindowAndSlots(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.NSocks, o.SlotSize = 1, creditSlice
		if r == 0 {
			o.Slots, o.Window = 4, 3
		} else {
			o.Slots, o.Window = 8, 64
		}
	})
	a, b := connectPair(t, eps[0], eps[1], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 40
	stream := func(from, to transport.Conn, errc chan<- error) {
		go func() {
			src := make([]byte, creditSlice)
			for i := range n {
				src[0] = byte(i)
				if err := from.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1, Msg: uint32(i)}); err != nil {
					errc <- err
					return
				}
				// PostFrom sends from src until it is written: wait.
				if err := from.(transport.Flusher).Flush(ctx); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		go func() {
			dst := make([]byte, creditSlice)
			for i := range n {
				tag, _, err := to.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(dst))
				if err == nil && (tag.Msg != uint32(i) || dst[0] != byte(i)) {
					err = fmt.Errorf("slice %d arrived as %d (%d)", i, tag.Msg, dst[0])
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	// One direction at a time: a connection's sides are driven by one
	// goroutine each.
	for _, pair := range [][2]transport.Conn{{a, b}, {b, a}} {
		errc := make(chan error, 2)
		stream(pair[0], pair[1], errc)
		require.NoError(t, <-errc)
		require.NoError(t, <-errc)
	}
	require.Equal(t, uint64(64-4), a.(*conn).cr.every, "rank 0 credits by rank 1's window and slots")
	require.Equal(t, uint64(3-2), b.(*conn).cr.every, "rank 1 credits by rank 0's")
}

// TestWindowBelowWhatSchedulesNeedIsRefused: a window smaller than half
// the slots and one more could deadlock a schedule, so New refuses it.
func TestWindowBelowWhatSchedulesNeedIsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = New(Options{Rank: 0, NRanks: 2, Peers: []string{"a", "b"}, Listener: ln, Slots: 8, Window: 4})
	require.ErrorContains(t, err, "a window of 4 slices is less than the 5 a link of 8 slots must hold")
}

// TestCreditsMismatchIsRefused: a rank with credits and one without
// cannot share a connection; the refusal says which paces and how to
// agree.
func TestCreditsMismatchIsRefused(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) {
		if r == 1 {
			o.Window = -1
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go eps[1].Connect(ctx, 0, 0)
	_, err := eps[0].Connect(ctx, 1, 0)
	require.ErrorContains(t, err, "rank 0 paces its TCP sends by the receiver's credits and rank 1 does not")
	require.ErrorContains(t, err, "GOCCL_TCP_WINDOW")
}

// TestWaitingForCreditFromADeadPeer: a sender waiting for credit from a
// peer that aborts fails, naming the peer and its reason, instead of
// waiting for credit that never comes.
func TestWaitingForCreditFromADeadPeer(t *testing.T) {
	eps := endpoints(t, 2, largeSlices(1, 0))
	a, b := connectPair(t, eps[0], eps[1], 0)
	stalled(t, a, b, 12)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	flushed := make(chan error, 1)
	go func() { flushed <- a.(transport.Flusher).Flush(ctx) }()
	eps[1].Close(errors.New("out of memory"))
	err := <-flushed
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer)
	require.NoError(t, ctx.Err(), "failed before the deadline")
}

// TestForgedCreditIsAProtocolError: a control socket that credits more
// slices than were sent, or carries anything but credits, fails the
// sender's next counted slice with a protocol error rather than letting
// it run past its window on a lie.
func TestForgedCreditIsAProtocolError(t *testing.T) {
	for _, forged := range []wire.SliceHeader{
		wire.CreditHeader(1 << 40),
		{Op: 7, Size: 0},
	} {
		eps := endpoints(t, 2, largeSlices(1, 0))
		a, b := connectPair(t, eps[0], eps[1], 0)
		_, err := unix.Write(b.(*conn).cr.ctl.fd, forged.Append(nil))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		src := make([]byte, creditSlice)
		for i := 0; err == nil && i < 8; i++ {
			err = a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1})
		}
		if err == nil {
			err = a.(transport.Flusher).Flush(ctx)
		}
		cancel()
		require.ErrorIs(t, err, errBadCredit)
		require.ErrorContains(t, err, "rank 1 ")
	}
}
