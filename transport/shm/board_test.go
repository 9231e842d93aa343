//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/fence"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// boards makes n endpoints that have joined their board (each rank's
// JoinBoard runs concurrently, as every rank's Init does).
func boards(t *testing.T, n int, mod func(r int, o *Options)) ([]*Endpoint, []transport.Board) {
	t.Helper()
	eps := endpoints(t, n, mod)
	for _, ep := range eps {
		require.Nil(t, ep.Board(), "no board before JoinBoard")
	}
	errs := join(eps)
	bs := make([]transport.Board, n)
	for r, ep := range eps {
		require.NoError(t, errs[r], "rank %d", r)
		require.NotNil(t, ep.Board())
		bs[r] = held{ep.Board()}
	}
	return eps, bs
}

// held is a board whose every Post and Read runs between a Begin and
// an End of its own, as the tests here use it (the engine holds the board
// for the whole of a collective).
type held struct{ transport.Board }

func (h held) Post(ctx context.Context, seq uint64, sig uint32, data []byte) error {
	if err := h.Begin(); err != nil {
		return err
	}
	defer h.End()
	return h.Board.Post(ctx, seq, sig, data)
}

func (h held) Read(ctx context.Context, r int, seq uint64) (uint32, []byte, bool, error) {
	if err := h.Begin(); err != nil {
		return 0, nil, false, err
	}
	defer h.End()
	return h.Board.Read(ctx, r, seq)
}

func contribution(seq uint64, r int) []byte {
	return []byte(fmt.Sprintf("seq %d from rank %d", seq, r))
}

func TestBoardPostAndRead(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			_, bs := boards(t, n, nil)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, b := range bs {
				wg.Go(func() {
					errs[r] = func() error {
						ctx := context.Background()
						for seq := uint64(0); seq < 200; seq++ {
							if err := b.Post(ctx, seq, uint32(seq)*7, contribution(seq, r)); err != nil {
								return err
							}
							for p := range n {
								if p == r {
									continue
								}
								sig, data, posted, err := b.Read(ctx, p, seq)
								switch {
								case err != nil:
									return err
								case !posted || sig != uint32(seq)*7 || string(data) != string(contribution(seq, p)):
									return fmt.Errorf("seq %d from rank %d: posted %v, sig %d, data %q", seq, p, posted, sig, data)
								}
							}
						}
						return nil
					}()
				})
			}
			wg.Wait()
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
		})
	}
}

func TestBoardMarkAndWentPast(t *testing.T) {
	_, bs := boards(t, 2, nil)
	ctx := context.Background()
	require.NoError(t, bs[0].Post(ctx, 0, 11, []byte("x")))
	bs[1].Mark(0, 42) // rank 1 runs collective 0 on the connections
	sig, data, posted, err := bs[0].Read(ctx, 1, 0)
	require.NoError(t, err)
	require.False(t, posted)
	require.Equal(t, uint32(42), sig, "the mark's signature")
	require.Nil(t, data)

	// Rank 1 marks 1 and goes on to 2: asked about 1 after that, the board
	// can only say that rank 1 went past it.
	bs[1].Mark(1, 43)
	bs[1].Mark(2, 44)
	sig, _, posted, err = bs[0].Read(ctx, 1, 1)
	require.NoError(t, err)
	require.False(t, posted)
	require.Zero(t, sig)
}

func TestBoardPostWaitsUntilTheEntryIsFree(t *testing.T) {
	// An entry is reused boardEntries collectives later, once every
	// member has reached the collective after the one it held: a root
	// posts that many ahead of a reader that reads nothing.
	_, bs := boards(t, 2, nil)
	ctx := context.Background()
	for seq := range uint64(boardEntries) {
		require.NoError(t, bs[0].Post(ctx, seq, 1, []byte("a")))
	}
	done := make(chan error, 1)
	go func() { done <- bs[0].Post(ctx, boardEntries, 1, []byte("c")) }()
	select {
	case err := <-done:
		t.Fatalf("posted over collective 0 before rank 1 reached collective 1: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	bs[1].Mark(0, 1)
	select {
	case err := <-done:
		t.Fatalf("posted over collective 0 with rank 1 at collective 0: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	bs[1].Mark(1, 1)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the post did not go ahead once rank 1 reached collective 1")
	}
	_, data, posted, err := bs[1].Read(ctx, 0, boardEntries)
	require.NoError(t, err)
	require.True(t, posted)
	require.Equal(t, "c", string(data))
}

func TestBoardAbortWakesReaders(t *testing.T) {
	for _, spin := range []time.Duration{time.Millisecond, -1} {
		t.Run(fmt.Sprint("spin=", spin), func(t *testing.T) {
			eps, bs := boards(t, 3, func(_ int, o *Options) { o.SpinFor = spin })
			got := make(chan error, 1)
			go func() {
				_, _, _, err := bs[1].Read(context.Background(), 0, 0) // rank 0 never posts
				got <- err
			}()
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			eps[2].Close(errors.New("disk on fire"))
			select {
			case err := <-got:
				var pa *transport.PeerAbortedError
				require.ErrorAs(t, err, &pa)
				require.Equal(t, 2, pa.Peer)
				require.ErrorContains(t, err, "disk on fire")
				require.Less(t, time.Since(start), time.Second)
			case <-time.After(5 * time.Second):
				t.Fatal("the abort did not reach the waiting reader")
			}
		})
	}
}

func TestBoardGracefulLeave(t *testing.T) {
	eps, bs := boards(t, 2, func(_ int, o *Options) { o.SpinFor = 100 * time.Microsecond })
	ctx := context.Background()
	require.NoError(t, bs[0].Post(ctx, 0, 1, []byte("last words")))
	require.NoError(t, eps[0].Close(nil))
	// What rank 0 posted stays readable; what it never posted is an error.
	_, data, posted, err := bs[1].Read(ctx, 0, 0)
	require.NoError(t, err)
	require.True(t, posted)
	require.Equal(t, "last words", string(data))
	_, _, _, err = bs[1].Read(ctx, 0, 1)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
}

func TestBoardReadHonoursContext(t *testing.T) {
	_, bs := boards(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, _, _, err := bs[0].Read(ctx, 1, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer, "the error names whom it waited for")
}

func TestBoardSleepersAreWoken(t *testing.T) {
	// Readers that sleep on the futex at once (no polling) still get every
	// post: 20 rounds in which rank 0 takes 3 ms before it posts.
	_, bs := boards(t, 2, func(_ int, o *Options) { o.SpinFor = -1 })
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, b := range bs {
		wg.Go(func() {
			for seq := uint64(0); seq < 20 && errs[r] == nil; seq++ {
				if r == 0 {
					time.Sleep(3 * time.Millisecond)
				}
				if errs[r] = b.Post(context.Background(), seq, 0, []byte{byte(r), byte(seq)}); errs[r] != nil {
					break
				}
				_, data, _, err := b.Read(context.Background(), 1-r, seq)
				if err == nil && string(data) != string([]byte{byte(1 - r), byte(seq)}) {
					err = fmt.Errorf("seq %d: read %v", seq, data)
				}
				errs[r] = err
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Positive(t, bs[1].(held).Board.(*board).sleeps.Load(), "rank 1 slept while rank 0 took its time")
}

func TestBoardRefusals(t *testing.T) {
	_, bs := boards(t, 2, nil)
	require.ErrorContains(t, bs[0].Post(context.Background(), 0, 0, make([]byte, BoardMax+1)), "holds 240")
	_, _, _, err := bs[0].Read(context.Background(), 0, 0)
	require.ErrorContains(t, err, "no board member 0")

	eps := endpoints(t, 3, func(r int, o *Options) { o.Peers[2] = "" })
	require.ErrorContains(t, eps[0].JoinBoard(context.Background()), "rank 2 is not a shared-memory peer")
}

func TestBoardCloseUnmaps(t *testing.T) {
	before := memfdMappings(t)
	eps, bs := boards(t, 3, nil)
	require.NoError(t, bs[1].Post(context.Background(), 0, 0, []byte("x")))
	require.Equal(t, before+3, memfdMappings(t), "one board, mapped by each rank")
	for _, ep := range eps {
		ep.Close(nil)
	}
	require.Equal(t, before, memfdMappings(t))
	_, _, _, err := bs[0].Read(context.Background(), 1, 0)
	require.ErrorIs(t, err, transport.ErrClosed)
}

func TestBoardHandOverRefusals(t *testing.T) {
	eps := endpoints(t, 3, nil)
	addr := eps[2].o.Peers[2]
	offer := func(s wire.ConnSetup, msg []byte) string {
		c, err := net.Dial("unix", addr)
		require.NoError(t, err)
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		require.NoError(t, handshake.Client(c, secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
			return wire.FrameConnSetup, s.Append(nil)
		}))
		typ, payload, err := handshake.ReadFrame(c, 4096)
		require.NoError(t, err)
		if typ == wire.FrameConnSetup && msg != nil {
			// Accepted so far: hand over a board of the wrong size.
			fd, err := unix.MemfdCreate("goccl-board-test", unix.MFD_CLOEXEC)
			require.NoError(t, err)
			defer unix.Close(fd)
			require.NoError(t, unix.Ftruncate(fd, int64(boardSize(2))))
			_, _, err = c.(*net.UnixConn).WriteMsgUnix(msg, unix.UnixRights(fd), nil)
			require.NoError(t, err)
			typ, payload, err = handshake.ReadFrame(c, 4096)
			require.NoError(t, err)
		}
		require.Equal(t, wire.FrameReject, typ)
		r, _, err := wire.ParseReject(payload)
		require.NoError(t, err)
		return r.Reason
	}
	require.Contains(t, offer(wire.ConnSetup{From: 1, To: 2, NSocks: 1, Flags: wire.ConnBoard}, nil), "rank 1 may not hand rank 2 a board (rank 0 does)")
	require.Contains(t, offer(wire.ConnSetup{From: 0, To: 2, NSocks: 1, Flags: 0x80}, nil), "unknown connection flags 0x80")
	require.Contains(t, offer(wire.ConnSetup{From: 0, To: 2, NSocks: 1, Flags: wire.ConnBoard}, appendBoardMsg(nil, 2)),
		"the board is for 2 ranks")
	// None of it was taken for the real board.
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Go(func() { errs[r] = ep.JoinBoard(context.Background()) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.NoError(t, held{eps[0].Board()}.Post(context.Background(), 0, 9, []byte("real")))
	_, data, _, err := held{eps[2].Board()}.Read(context.Background(), 0, 0)
	require.NoError(t, err)
	require.Equal(t, "real", string(data))
}

// faults reports whether reading b[0] faults (the memory is not mapped).
func faults(b []byte) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() { faulted = recover() != nil }()
	faultSink = b[0] // a load the compiler keeps
	return false
}

var faultSink byte

// What Read returns is the board's memory: an abort from another
// goroutine (here a Close) while the engine still copies or folds it
// must not unmap it under the engine (Read used to let go of the segment
// before it returned, and a Close then unmapped it). The board stays
// pinned past End, until Unpin, which unmaps it.
func TestBoardReadStaysMappedUntilUnpin(t *testing.T) {
	eps, bs := boards(t, 2, nil)
	ctx := context.Background()
	require.NoError(t, bs[0].Post(ctx, 0, 5, []byte("still here")))
	b := eps[1].Board()
	_, _, _, err := b.Read(ctx, 0, 0)
	require.ErrorIs(t, err, errNotHeld, "a read outside Begin and End")
	require.ErrorIs(t, b.Post(ctx, 0, 5, nil), errNotHeld)

	require.NoError(t, b.Begin())
	_, data, posted, err := b.Read(ctx, 0, 0)
	require.NoError(t, err)
	require.True(t, posted)
	require.NoError(t, eps[1].Close(errors.New("aborted meanwhile")))
	// (Held, the mapping is private zero pages now: the operation reads
	// nothing of use, and fails, but does not crash.)
	require.False(t, faults(data), "the endpoint closed while the data was held")
	_, _, _, err = b.Read(ctx, 0, 1)
	require.Error(t, err, "a read once the endpoint is down")
	b.End()
	require.False(t, faults(data), "End keeps the board pinned")
	require.Error(t, b.Begin(), "Begin once the endpoint is down")
	b.(transport.BoardPinner).Unpin()
	require.True(t, faults(data), "Unpin let go of the last hold: the board is unmapped")
	b.(transport.BoardPinner).Unpin() // twice: nothing more to let go
}

// A pinned board that closes with no collective running is unmapped by
// Unpin, and Begin, End and Mark on it take no reference of their own.
func TestBoardPinnedAcrossCollectives(t *testing.T) {
	eps, bs := boards(t, 2, nil)
	ctx := context.Background()
	b := eps[1].Board()
	var seg *segment
	switch x := b.(type) {
	case *board:
		seg = x.seg
	case *joiningBoard:
		seg = x.b.Load().seg
	}
	require.NotNil(t, seg, "a %T", b)
	for seq := range uint64(3) {
		require.NoError(t, bs[0].Post(ctx, seq, 5, []byte("x")))
		require.NoError(t, b.Begin())
		_, _, posted, err := b.Read(ctx, 0, seq)
		require.NoError(t, err)
		require.True(t, posted)
		b.End()
		b.Mark(seq, 5)
		require.EqualValues(t, 1, seg.refs.Load(), "after collective %d: the pin alone holds the board", seq)
	}
	mem := seg.mem
	require.NoError(t, eps[1].Close(nil))
	require.False(t, faults(mem), "pinned: closing the endpoint leaves private pages in place")
	b.(transport.BoardPinner).Unpin()
	require.True(t, faults(mem), "unpinned: the board is unmapped")
}

// TestBoardPlainPostsWakeSleepers has rank 0 post with plain stores
// (every member has flagBarrier) every 6-13 µs while rank 1 reads each
// entry, polling for about 10 µs and then sleeping on the futex, so that
// posts come around the time it goes to sleep; the sleep is long enough
// that a missed wake-up (a post still in its core's store buffer when
// the poster looked for sleepers and the sleeper looked for the post)
// shows as a read that takes seconds. The window is some tens of
// nanoseconds: runs without the sleeper's barrier did not hit it here
// (internal/fence's test shows the barrier's need in one process).
func TestBoardPlainPostsWakeSleepers(t *testing.T) {
	if !fence.SharedReady() {
		t.Skip("membarrier's global expedited barrier is not available here: posts use locked stores, which need no test of this")
	}
	_, bs := boards(t, 2, func(_ int, o *Options) { o.SpinFor = -1 })
	b0, b1 := bs[0].(held).Board.(*board), bs[1].(held).Board.(*board)
	b1.slice = 20 * time.Second
	rounds := uint64(10000)
	if testing.Short() {
		rounds = 3000
	}
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		for seq := range rounds {
			// 6-13 µs between posts: rank 1 polls for about 10 µs
			// before it sleeps, so the posts come around the time it
			// goes to sleep.
			for t0, gap := time.Now(), time.Duration(6+seq%8)*time.Microsecond; time.Since(t0) < gap; {
			}
			if err := bs[0].Post(ctx, seq, 0, []byte{byte(seq)}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	var slowest time.Duration
	for seq := range rounds {
		start := time.Now()
		_, data, posted, err := bs[1].Read(ctx, 0, seq)
		require.NoError(t, err)
		require.True(t, posted)
		require.Equal(t, []byte{byte(seq)}, data, "seq %d", seq)
		slowest = max(slowest, time.Since(start))
		if seq%markEvery == markEvery-1 {
			b1.Mark(seq, 0)
		}
	}
	require.NoError(t, <-errc)
	require.True(t, b0.plain, "rank 0 posted with plain stores")
	require.Positive(t, b1.sleeps.Load(), "rank 1 slept")
	require.Less(t, slowest, 5*time.Second, "a read waited out most of a sleep: a post's wake-up was missed")
	t.Logf("%d rounds, %d sleeps, the slowest read %v", rounds, b1.sleeps.Load(), slowest)
}
