package tcp

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// lending configures endpoints that lend every counted slice (those
// over creditMin bytes, LendOn) where lend(rank) says so, and none
// elsewhere.
func lending(lend func(int) bool) func(int, *Options) {
	return func(r int, o *Options) {
		o.NSocks, o.SlotSize, o.Lend = 2, 4*creditSlice, LendOff
		if lend(r) {
			o.Lend = LendOn
		}
	}
}

func always(int) bool { return true }

// pattern fills b with bytes that depend on round and position.
func pattern(b []byte, round int) []byte {
	for i := range b {
		b[i] = byte(i*13 + round*101 + i>>9)
	}
	return b
}

// sendRound posts n slices of size bytes from src, then Flushes.
func sendRound(ctx context.Context, a transport.Conn, src []byte, n, size, round int) error {
	for i := range n {
		if err := a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(src[i*size:(i+1)*size]), transport.Tag{Op: uint64(round), Msg: uint32(i)}); err != nil {
			return err
		}
	}
	return a.(transport.Flusher).Flush(ctx)
}

// TestLentPagesAreReadBeforeFlushReturns: a sender that lends its pages
// overwrites its buffer as soon as Flush returns, and a slow receiver
// still reads every slice as it was when it was posted. Were Flush to
// return before the receiver had read the lent slices, the kernel would
// hand it the overwritten pages.
func TestLentPagesAreReadBeforeFlushReturns(t *testing.T) {
	for _, c := range []struct {
		name       string
		sendLends  bool
		recvLends  bool
		wantLent   bool
		slowReader time.Duration
	}{
		{"both lend", true, true, true, 5 * time.Millisecond},
		{"only the sender lends", true, false, true, 5 * time.Millisecond},
		{"the receiver alone would", false, true, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			eps := endpoints(t, 2, lending(func(r int) bool {
				if r == 0 {
					return c.sendLends
				}
				return c.recvLends
			}))
			a, b := connectPair(t, eps[0], eps[1], 0)
			const n, size, rounds = 5, 3 * creditSlice, 6
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			src := make([]byte, n*size)
			sent := make(chan error, 1)
			go func() {
				for round := range rounds {
					pattern(src, round)
					if err := sendRound(ctx, a, src, n, size, round); err != nil {
						sent <- err
						return
					}
					// The pages are the caller's again: change them at once.
					for i := range src {
						src[i] = 0xee
					}
				}
				sent <- nil
			}()
			got := make([]byte, size)
			for round := range rounds {
				want := pattern(make([]byte, n*size), round)
				for i := range n {
					time.Sleep(c.slowReader)
					tag, m, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(got))
					require.NoError(t, err)
					require.Equal(t, transport.Tag{Op: uint64(round), Msg: uint32(i)}, tag)
					require.Equal(t, size, m)
					require.True(t, bytes.Equal(want[i*size:(i+1)*size], got), "round %d slice %d: changed after it was posted", round, i)
				}
			}
			require.NoError(t, <-sent)
			ca := a.(*conn)
			if c.wantLent {
				require.Positive(t, ca.cr.lent, "slices were lent")
				// Each round's last slice is copied (held back until Flush).
				require.Less(t, ca.cr.lent, ca.cr.sent, "the last slice of a round is not lent")
			} else {
				require.Zero(t, ca.cr.lent, "nothing is lent by a sender that does not lend")
			}
		})
	}
}

// TestFlushWaitsForLentSlices: with every slice in the kernel (socket
// buffers far larger than the slices), Flush still waits until the
// receiver has read the ones lent.
func TestFlushWaitsForLentSlices(t *testing.T) {
	eps := endpoints(t, 2, lending(always))
	a, b := connectPair(t, eps[0], eps[1], 0)
	roomy(t, a)
	roomy(t, b)
	const n, size = 3, creditSlice
	src := pattern(make([]byte, n*size), 1)
	short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	require.ErrorIs(t, sendRound(short, a, src, n, size, 1), context.DeadlineExceeded, "Flush returned with lent slices unread")
	for _, s := range a.(*conn).socks {
		n, err := s.pending()
		require.NoError(t, err)
		require.Zero(t, n, "every slice is in the kernel: what Flush waited for was the credit")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make([]byte, size)
	for i := range n {
		_, _, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(got))
		require.NoError(t, err)
		require.True(t, bytes.Equal(src[i*size:(i+1)*size], got), "slice %d", i)
	}
	require.NoError(t, a.(transport.Flusher).Flush(ctx))
}

// TestHeldSliceGoesWhenTheSenderWaits: the last slice posted is held
// back (it may be its operation's last, to be copied at Flush); a sender
// that then waits for the peer, whose answer needs that slice, must not
// wait forever.
func TestHeldSliceGoesWhenTheSenderWaits(t *testing.T) {
	eps := endpoints(t, 2, lending(always))
	a, b := connectPair(t, eps[0], eps[1], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := pattern(make([]byte, creditSlice), 3)
	require.NoError(t, a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1}))
	require.Equal(t, a.(*conn).socks[0], a.(*conn).held, "the slice is held back")
	echoed := make(chan error, 1)
	go func() {
		got := make([]byte, creditSlice)
		if _, _, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(got)); err != nil {
			echoed <- err
			return
		}
		if !bytes.Equal(src, got) {
			echoed <- context.Canceled
			return
		}
		echoed <- sendRound(ctx, b, []byte("got it"), 1, 6, 2)
	}()
	_, m, err := a.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(make([]byte, 6)))
	require.NoError(t, err, "the sender's wait let the held slice go")
	require.Equal(t, 6, m)
	require.NoError(t, <-echoed)
	require.NoError(t, a.(transport.Flusher).Flush(ctx))
	require.Equal(t, uint64(1), a.(*conn).cr.lent, "released by a wait, the slice was lent")
}

// TestNoLendingWithTLS: records are sealed into a buffer of their own,
// so a TLS endpoint copies whatever Lend says.
func TestNoLendingWithTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	eps := endpoints(t, 2, func(r int, o *Options) { lending(always)(r, o); withTLS(t, ca)(r, o) })
	require.False(t, eps[0].lends())
	a, b := connectPair(t, eps[0], eps[1], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := pattern(make([]byte, 2*creditSlice), 4)
	done := make(chan error, 1)
	go func() { done <- sendRound(ctx, a, src, 2, creditSlice, 1) }()
	got := make([]byte, creditSlice)
	for i := range 2 {
		_, _, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(got))
		require.NoError(t, err)
		require.True(t, bytes.Equal(src[i*creditSlice:(i+1)*creditSlice], got))
	}
	require.NoError(t, <-done)
	require.Zero(t, a.(*conn).cr.lent)
}

// TestLendAutoPicksTheMeasuredCases: LendAuto lends in broadcasts (lands,
// not exchange) below lendAutoMax2 on 2 ranks and in broadcasts and
// all-gathers (lands) from lendAutoMin on more; LendOn in everything; and
// Flush ends an operation's choice.
func TestLendAutoPicksTheMeasuredCases(t *testing.T) {
	// lendingConn is one end of a new pair whose endpoints lend by mode.
	lendingConn := func(mode LendMode) *conn {
		eps := endpoints(t, 2, func(_ int, o *Options) { o.Lend = mode })
		a, _ := connectPair(t, eps[0], eps[1], 0)
		return a.(*conn)
	}
	c := lendingConn(LendAuto)
	require.True(t, c.lends)
	for _, k := range []struct {
		bytes           int64
		n               int
		lands, exchange bool
		want            bool
	}{
		{1 << 20, 2, true, false, true},
		{lendAutoMax2 - 1, 2, true, false, true},
		{lendAutoMax2, 2, true, false, false},
		{1 << 20, 2, false, false, false},
		{1 << 20, 2, true, true, false},
		{lendAutoMax2 - 1, 2, true, true, false},
		{1 << 20, 4, true, false, false},
		{lendAutoMin, 4, true, false, true},
		{lendAutoMin, 4, true, true, true},
		{64 << 20, 8, true, true, true},
		{64 << 20, 8, false, false, false},
	} {
		c.LendFor(k.bytes, k.n, k.lands, k.exchange)
		require.Equal(t, k.want, c.lendOp, "%d bytes, %d ranks, lands %v, exchange %v", k.bytes, k.n, k.lands, k.exchange)
	}
	c.LendFor(1<<20, 2, true, false)
	require.NoError(t, c.Flush(context.Background()))
	require.False(t, c.lendOp, "Flush ends the operation's choice")

	c = lendingConn(LendOn)
	c.LendFor(1<<20, 4, false, false)
	require.True(t, c.lendOp, "on: every operation lends")
	require.NoError(t, c.Flush(context.Background()))
	require.True(t, c.lendOp, "on: and the next, without being asked")

	c = lendingConn(LendOff)
	c.LendFor(1<<20, 2, true, false)
	require.False(t, c.lendOp, "off: never")
}

// TestHeldSliceOnAFailedSocket: a post that fails (the socket's write
// error is sticky) holds nothing back, and the Flush after it reports
// the failure rather than looking for a held slice that was never
// queued.
func TestHeldSliceOnAFailedSocket(t *testing.T) {
	eps := endpoints(t, 2, lending(always))
	a, _ := connectPair(t, eps[0], eps[1], 0)
	c := a.(*conn)
	s := c.socks[0] // the first post's
	s.wmu.Lock()
	s.setErr(errors.New("broken for the test"))
	s.wmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	src := pattern(make([]byte, creditSlice), 5)
	require.ErrorContains(t, a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1}), "broken for the test")
	require.Nil(t, c.held, "nothing was queued, so nothing is held")
	require.Error(t, c.Flush(ctx))
}
