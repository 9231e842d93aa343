//go:build unix

package tcp

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// gatherTimes sets gatherGap and gatherFor for one test: a gap no
// scheduler reaches, so that every slice after the first gatherAfter is
// gathered, and the timer's wait.
func gatherTimes(t *testing.T, forTimer time.Duration) {
	gap, f := gatherGap, gatherFor
	gatherGap, gatherFor = time.Hour, forTimer
	t.Cleanup(func() { gatherGap, gatherFor = gap, f })
}

// gatherPair sets the gathering's timer (gatherTimes), connects channel 0
// of two endpoints made with mod, and returns the pair, the endpoints and
// a context that ends after 30 s or with the test.
func gatherPair(t *testing.T, forTimer time.Duration, mod func(r int, o *Options)) (a, b transport.Conn, eps []*Endpoint, ctx context.Context) {
	t.Helper()
	gatherTimes(t, forTimer)
	eps = endpoints(t, 2, mod)
	a, b = connectPair(t, eps[0], eps[1], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return a, b, eps, ctx
}

// sendSmall sends n small slices, numbered from first, each from a buffer
// that is overwritten once its operation has flushed (a gathered slice
// must have been copied), each its own operation.
func sendSmall(ctx context.Context, c transport.Conn, first, n int) error {
	ds, fl := c.(transport.DirectSender), c.(transport.Flusher)
	buf := make([]byte, gatherSlice)
	for i := first; i < first+n; i++ {
		size := (i * 37) % (gatherSlice + 1)
		for j := range size {
			buf[j] = byte(i*7 + j)
		}
		if err := ds.PostFrom(ctx, memory.HostBuffer(buf[:size]), transport.Tag{Op: uint64(i), Sig: 3, Msg: 1}); err != nil {
			return err
		}
		if err := fl.Flush(ctx); err != nil {
			return err
		}
		for j := range size {
			buf[j] = 0xee
		}
	}
	return nil
}

// recvSmall receives what sendSmall sent and checks every byte.
func recvSmall(ctx context.Context, c transport.Conn, first, n int) error {
	for i := first; i < first+n; i++ {
		buf, tag, err := c.Wait(ctx)
		if err != nil {
			return fmt.Errorf("slice %d: %w", i, err)
		}
		if want := (transport.Tag{Op: uint64(i), Sig: 3, Msg: 1}); tag != want {
			return fmt.Errorf("slice %d: tag %v, want %v", i, tag, want)
		}
		size := (i * 37) % (gatherSlice + 1)
		if buf.Len() != size {
			return fmt.Errorf("slice %d: %d bytes, want %d", i, buf.Len(), size)
		}
		for j, b := range buf.Bytes() {
			if b != byte(i*7+j) {
				return fmt.Errorf("slice %d: byte %d is %#x, want %#x", i, j, b, byte(i*7+j))
			}
		}
		if err := c.Release(); err != nil {
			return err
		}
	}
	return nil
}

// A one-way stream of small slices is gathered from its gatherAfter+1-th
// slice on, every byte arrives as sent (the caller's buffer is reused
// after each operation), and a large slice posted after gathered ones
// arrives after them.
func TestGatheredSlicesArriveInOrder(t *testing.T) {
	a, b, _, ctx := gatherPair(t, time.Hour, func(_ int, o *Options) { o.NSocks = 2 }) // by count, waits and order alone
	before := SlicesGathered()
	const n = 5 * gatherMax
	errc := make(chan error, 1)
	go func() { errc <- recvSmall(ctx, b, 0, n) }()
	require.NoError(t, sendSmall(ctx, a, 0, n))
	// The stream ends with a large slice: the gathered ones go first.
	large := make([]byte, 3*gatherSlice)
	for i := range large {
		large[i] = byte(i)
	}
	require.NoError(t, a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(large), transport.Tag{Op: 9999}))
	require.NoError(t, a.(transport.Flusher).Flush(ctx))
	require.NoError(t, <-errc)
	buf, tag, err := b.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, transport.Tag{Op: 9999}, tag)
	require.Equal(t, large, buf.Bytes())
	require.NoError(t, b.Release())
	require.EqualValues(t, n-gatherAfter, SlicesGathered()-before, "every slice after the first gatherAfter of the stream is gathered")
}

// Slices gathered by a rank that then makes no further call go out within
// gatherFor, on the timer: the receiver gets them all.
func TestGatheredSlicesGoOnTheTimer(t *testing.T) {
	a, b, _, ctx := gatherPair(t, 100*time.Microsecond, nil)
	before := SlicesGathered()
	const n = gatherAfter + 3 // 3 gathered, fewer than gatherMax
	require.NoError(t, sendSmall(ctx, a, 0, n))
	require.EqualValues(t, 3, SlicesGathered()-before)
	require.NoError(t, recvSmall(ctx, b, 0, n))
}

// A rank that waits writes what it gathered first: with the timer out of
// the way, a reply that needs the gathered slices still comes.
func TestAWaitWritesWhatWasGathered(t *testing.T) {
	a, b, _, ctx := gatherPair(t, time.Hour, nil)
	before := SlicesGathered()
	const n = gatherAfter + 3
	errc := make(chan error, 1)
	go func() {
		if err := recvSmall(ctx, b, 0, n); err != nil {
			errc <- err
			return
		}
		errc <- sendSmall(ctx, b, 100, 1) // the reply
	}()
	require.NoError(t, sendSmall(ctx, a, 0, n))
	require.EqualValues(t, 3, SlicesGathered()-before)
	require.NoError(t, recvSmall(ctx, a, 100, 1), "the wait for the reply wrote the gathered slices")
	require.NoError(t, <-errc)
}

// A graceful Close writes what was gathered before its notice: the
// receiver reads every slice, then the close.
func TestCloseWritesWhatWasGathered(t *testing.T) {
	a, b, eps, ctx := gatherPair(t, time.Hour, nil)
	const n = gatherAfter + 3
	require.NoError(t, sendSmall(ctx, a, 0, n))
	require.NoError(t, eps[0].Close(nil))
	require.NoError(t, recvSmall(ctx, b, 0, n))
	_, _, err := b.Wait(ctx)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
}

// Nothing is gathered with NoGather, on a point-to-point channel, or
// where the channel receives between its sends.
func TestWhereNothingIsGathered(t *testing.T) {
	gatherTimes(t, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 3 * gatherMax
	oneWay := func(t *testing.T, mod func(int, *Options), ch int) {
		eps := endpoints(t, 2, mod)
		a, b := connectPair(t, eps[0], eps[1], ch)
		before := SlicesGathered()
		require.NoError(t, sendSmall(ctx, a, 0, n))
		require.NoError(t, recvSmall(ctx, b, 0, n))
		require.Equal(t, before, SlicesGathered())
	}
	t.Run("NoGather", func(t *testing.T) {
		oneWay(t, func(_ int, o *Options) { o.NoGather = true }, 0)
	})
	t.Run("point-to-point", func(t *testing.T) { oneWay(t, nil, transport.P2PChannel) })
	t.Run("receiving", func(t *testing.T) {
		eps := endpoints(t, 2, nil)
		a, b := connectPair(t, eps[0], eps[1], 0)
		before := SlicesGathered()
		for i := range n {
			require.NoError(t, sendSmall(ctx, a, i, 1))
			require.NoError(t, recvSmall(ctx, b, i, 1))
			require.NoError(t, sendSmall(ctx, b, i, 1))
			require.NoError(t, recvSmall(ctx, a, i, 1))
		}
		require.Equal(t, before, SlicesGathered())
	})
}

// fillSock writes header-only slices (Op from first, Sig 3, Msg 1)
// straight into s until the kernel has taken nothing for 300 ms, and
// returns how many; a slice the kernel took part of has its rest put at
// the head of the gather buffer, where the next gathered slices follow it.
func fillSock(t *testing.T, s *sock, first int) int {
	t.Helper()
	n := 0
	idle := time.Now()
	var rest []byte
	for time.Since(idle) < 300*time.Millisecond {
		b := rest
		if b == nil {
			h := wire.SliceHeader{Op: uint64(first + n), Sig: 3, Msg: 1}
			b = h.Append(nil)
		}
		m, err := unix.Write(s.fd, b)
		if err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
			continue
		}
		require.NoError(t, err)
		idle = time.Now()
		if rest == nil {
			n++
		}
		rest = nil
		if m != len(b) {
			rest = b[m:]
		}
	}
	if rest != nil {
		s.wmu.Lock()
		s.gathered = append(s.gathered[:0], rest...)
		s.wmu.Unlock()
	}
	return n
}

// smallBuffers makes a connection's socket buffers small, so that a
// receiver that reads nothing fills them soon.
func smallBuffers(t *testing.T, send, recv transport.Conn) *sock {
	s := send.(*conn).socks[0]
	require.NoError(t, unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 8192))
	require.NoError(t, unix.SetsockoptInt(recv.(*conn).socks[0].fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8192))
	return s
}

// A graceful Close while the timer's write waits on a full socket still
// delivers every gathered slice, then the close notice.
func TestCloseWhileTheTimerWrites(t *testing.T) {
	a, b, eps, ctx := gatherPair(t, time.Hour, func(_ int, o *Options) { o.NSocks = 1 })
	require.NoError(t, sendSmall(ctx, a, 0, gatherAfter))
	s := smallBuffers(t, a, b)
	nfill := fillSock(t, s, gatherAfter)
	before := SlicesGathered()
	require.NoError(t, sendSmall(ctx, a, 1000, 3))
	require.EqualValues(t, 3, SlicesGathered()-before)
	go a.(*conn).ob.gatherExpired() // as the timer would
	time.Sleep(20 * time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // a receiver a little behind
		if err := recvSmall(ctx, b, 0, gatherAfter); err != nil {
			errc <- err
			return
		}
		for i := range nfill {
			if _, tag, err := b.Wait(ctx); err != nil || tag.Op != uint64(gatherAfter+i) {
				errc <- fmt.Errorf("filler %d: %v %w", i, tag, err)
				return
			}
			b.Release()
		}
		if err := recvSmall(ctx, b, 1000, 3); err != nil {
			errc <- err
			return
		}
		_, _, err := b.Wait(ctx)
		if !errors.Is(err, transport.ErrPeerClosed) {
			err = fmt.Errorf("no close notice: %w", err)
		} else {
			err = nil
		}
		errc <- err
	}()
	require.NoError(t, eps[0].Close(nil))
	require.NoError(t, <-errc)
}

// The timer does not wait on a peer that reads nothing: another peer of
// the channel gets its gathered slice at once.
func TestTheTimerDoesNotWaitOnOnePeer(t *testing.T) {
	gatherTimes(t, time.Hour)
	eps := endpoints(t, 3, func(_ int, o *Options) { o.NSocks = 1 })
	rp, p := connectPair(t, eps[0], eps[1], 0)
	rq, q := connectPair(t, eps[0], eps[2], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, sendSmall(ctx, rp, 0, gatherAfter))
	sP := smallBuffers(t, rp, p)
	fillSock(t, sP, gatherAfter)
	before := SlicesGathered()
	require.NoError(t, sendSmall(ctx, rp, 5000, 1)) // gathered for P, listed first
	require.NoError(t, sendSmall(ctx, rq, 7000, 1)) // and for Q
	require.EqualValues(t, 2, SlicesGathered()-before)
	go rp.(*conn).ob.gatherExpired() // as the timer would
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	defer qcancel()
	require.NoError(t, recvSmall(qctx, q, 7000, 1), "Q's slice waited behind P's")
	// P reads at last, so that everything ends.
	go func() {
		for {
			if _, _, err := p.Wait(ctx); err != nil {
				return
			}
			p.Release()
		}
	}()
}

// A socket that joins the list sets the timer even where the list already
// holds one the timer left there without setting itself again (a failed
// socket, kept for the channel's next wait to take its error).
func TestTheTimerIsSetForEverySocketThatGathers(t *testing.T) {
	gatherTimes(t, 100*time.Microsecond)
	eps := endpoints(t, 3, func(_ int, o *Options) { o.NSocks = 1 })
	rp, _ := connectPair(t, eps[0], eps[1], 0)
	rq, q := connectPair(t, eps[0], eps[2], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ob := rp.(*conn).ob
	require.Same(t, ob, rq.(*conn).ob, "one outbox per channel")
	// Written at once, and then one gathered that the timer writes (so
	// that the timer exists, and has fired).
	require.NoError(t, sendSmall(ctx, rq, 0, gatherAfter+1))
	require.NoError(t, recvSmall(ctx, q, 0, gatherAfter+1))
	sP := rp.(*conn).socks[0]
	sP.wmu.Lock()
	sP.setErr(errors.New("a failed socket"))
	sP.wmu.Unlock()
	g := &ob.gather
	g.mu.Lock()
	sP.gatherListed = true
	g.socks = append(g.socks, sP)
	g.n.Store(1)
	g.mu.Unlock()
	before := SlicesGathered()
	require.NoError(t, sendSmall(ctx, rq, gatherAfter+1, 1)) // gathered, and no call after it
	require.EqualValues(t, 1, SlicesGathered()-before)
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	defer qcancel()
	require.NoError(t, recvSmall(qctx, q, gatherAfter+1, 1), "the gathered slice waited for a timer that was not set")
}
