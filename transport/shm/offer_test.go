//go:build linux

package shm

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
)

// offered makes the endpoints of a communicator of n whose board rank 0
// offered ahead for capacity members; at says where the others look for
// it (the offer's Ref when nil). Their debug logs go to log.
func offered(t *testing.T, n, capacity int, at func(BoardRef) BoardRef, log *syncBuffer) ([]*Endpoint, *BoardOffer) {
	t.Helper()
	o, err := OfferBoard(capacity)
	require.NoError(t, err)
	ref := o.Ref()
	if at != nil {
		ref = at(ref)
	}
	eps := endpoints(t, n, func(r int, opt *Options) {
		if r == 0 {
			opt.Board = o
		} else {
			opt.BoardAt = ref
		}
		if log != nil {
			opt.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})
	return eps, o
}

// join runs every endpoint's JoinBoard at once, as every rank's Init
// does, and returns their errors.
func join(eps []*Endpoint) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs[r] = ep.JoinBoard(ctx)
		})
	}
	wg.Wait()
	return errs
}

// postAll has every member post and read every other's contribution.
func postAll(t *testing.T, eps []*Endpoint, seq uint64) {
	t.Helper()
	ctx := context.Background()
	for r, ep := range eps {
		require.NoError(t, held{ep.Board()}.Post(ctx, seq, uint32(r), contribution(seq, r)))
	}
	for r, ep := range eps {
		for p := range eps {
			if p == r {
				continue
			}
			sig, data, posted, err := held{ep.Board()}.Read(ctx, p, seq)
			require.NoError(t, err)
			require.True(t, posted)
			require.Equal(t, uint32(p), sig)
			require.Equal(t, string(contribution(seq, p)), string(data), "rank %d reading rank %d", r, p)
		}
	}
}

// boardDescriptors counts this process's open descriptors of boards.
func boardDescriptors(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "/memfd:goccl-board") {
			n++
		}
	}
	return n
}

// TestOfferedBoardIsOpenedThroughProc: the members open rank 0's offer
// where its Ref says, and nobody asks rank 0 for it; a board sized for
// more members than join works as one of their number; Close lets go of
// the mappings and of the offer's descriptor.
func TestOfferedBoardIsOpenedThroughProc(t *testing.T) {
	maps, fds := memfdMappings(t), boardDescriptors(t)
	var log syncBuffer
	eps, _ := offered(t, 3, 7, nil, &log)
	require.Equal(t, fds+1, boardDescriptors(t), "the offer's descriptor")
	require.Equal(t, maps, memfdMappings(t), "an offer is not mapped until it is the board")
	for r, err := range join(eps) {
		require.NoError(t, err, "rank %d", r)
	}
	require.Equal(t, maps+3, memfdMappings(t), "one board, mapped by each rank")
	require.Equal(t, fds+1, boardDescriptors(t), "the members' descriptors are closed once mapped")
	for seq := range uint64(3) {
		postAll(t, eps, seq)
	}
	require.NotContains(t, log.String(), "asking rank 0 for the board")
	require.NoError(t, eps[2].Close(nil))
	_, _, _, err := held{eps[0].Board()}.Read(context.Background(), 2, 3)
	require.ErrorContains(t, err, "rank 2", "a member that leaves is seen to")
	for _, ep := range eps {
		ep.Close(nil)
	}
	require.Equal(t, maps, memfdMappings(t))
	require.Equal(t, fds, boardDescriptors(t))
}

// TestOfferedBoardIsPulledWhereProcRefuses: where the descriptor cannot
// be opened or is not the board (here: a Ref naming another descriptor),
// a member asks rank 0 for the board over its listener and gets the same
// one.
func TestOfferedBoardIsPulledWhereProcRefuses(t *testing.T) {
	var log syncBuffer
	eps, _ := offered(t, 3, 3, func(r BoardRef) BoardRef {
		r.FD = int(os.Stdin.Fd())
		return r
	}, &log)
	for r, err := range join(eps) {
		require.NoError(t, err, "rank %d", r)
	}
	postAll(t, eps, 0)
	require.Equal(t, 2, strings.Count(log.String(), "asking rank 0 for the board"), log.String())
}

// TestOfferedBoardRefusals: a Ref with the wrong nonce maps nothing,
// through /proc or pulled, and says so; an offer too small is refused by
// rank 0; only a member's pull is answered.
func TestOfferedBoardRefusals(t *testing.T) {
	t.Run("nonce", func(t *testing.T) {
		eps, _ := offered(t, 2, 2, func(r BoardRef) BoardRef {
			r.Nonce[0] ^= 1
			return r
		}, nil)
		errs := join(eps)
		require.NoError(t, errs[0])
		require.ErrorContains(t, errs[1], "not the one offered")
	})
	t.Run("capacity", func(t *testing.T) {
		eps, _ := offered(t, 3, 2, nil, nil)
		require.ErrorContains(t, eps[0].JoinBoard(context.Background()), "room for 2 members, not 3")
	})
	t.Run("pulls", func(t *testing.T) {
		eps, _ := offered(t, 3, 3, nil, nil)
		ask := func(s wire.ConnSetup) (wire.FrameType, string) {
			c, err := net.Dial("unix", eps[0].o.Peers[0])
			require.NoError(t, err)
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			require.NoError(t, handshake.Client(c, secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
				return wire.FrameConnSetup, s.Append(nil)
			}))
			typ, payload, err := handshake.ReadFrame(c, 4096)
			require.NoError(t, err)
			r, _, _ := wire.ParseReject(payload)
			return typ, r.Reason
		}
		for _, s := range []wire.ConnSetup{
			{From: 0, To: 0, NSocks: 1, Flags: wire.ConnBoard},
			{From: 3, To: 0, NSocks: 1, Flags: wire.ConnBoard},
			{From: 1, To: 2, NSocks: 1, Flags: wire.ConnBoard},
		} {
			typ, reason := ask(s)
			require.Equal(t, wire.FrameReject, typ, "%+v", s)
			require.Contains(t, reason, fmt.Sprintf("rank %d may not ask for the board", s.From))
		}
		for r, err := range join(eps) {
			require.NoError(t, err, "rank %d", r)
		}
		postAll(t, eps, 0)
	})
	t.Run("size", func(t *testing.T) {
		for _, c := range []int{-1, 1, maxBoardMembers + 1} {
			_, err := OfferBoard(c)
			require.ErrorContains(t, err, fmt.Sprintf("a board for %d members", c))
		}
	})
}

// TestAnotherUserCannotOpenAnOfferedBoard: the /proc path that members
// open is refused to another user's process.
func TestAnotherUserCannotOpenAnOfferedBoard(t *testing.T) {
	o, err := OfferBoard(2)
	require.NoError(t, err)
	defer o.Close()
	r := o.Ref()
	lines, _ := startStranger(t, "open", fmt.Sprintf("/proc/%d/fd/%d", r.PID, r.FD))
	require.Contains(t, nextLine(t, lines), "refused: permission denied")
}
