package mem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
)

// endpoints makes a network of n ranks with small slots and returns its
// endpoints, closed (and the network with them) when t ends.
func endpoints(t *testing.T, n int) []*Endpoint {
	t.Helper()
	nw, err := NewNetwork(n, Options{Slots: 4, SlotSize: 4096})
	require.NoError(t, err)
	eps := make([]*Endpoint, n)
	for r := range eps {
		eps[r] = nw.Endpoint(r)
	}
	t.Cleanup(func() {
		for _, ep := range eps {
			ep.Close(nil)
		}
		require.NoError(t, nw.Close())
	})
	return eps
}

func TestContract(t *testing.T) {
	transporttest.Contract(t, func(t *testing.T, n int) []transport.Endpoint {
		return transporttest.Endpoints(endpoints(t, n))
	}, transporttest.ContractOptions{})
}

func pair(t *testing.T, slots int) (*Network, transport.Conn, transport.Conn) {
	t.Helper()
	nw, err := NewNetwork(2, Options{Slots: slots, SlotSize: 4096})
	require.NoError(t, err)
	ctx := context.Background()
	a, err := nw.Endpoint(0).Connect(ctx, 1, 0)
	require.NoError(t, err)
	b, err := nw.Endpoint(1).Connect(ctx, 0, 0)
	require.NoError(t, err)
	return nw, a, b
}

func send(t *testing.T, c transport.Conn, data []byte, tag transport.Tag) {
	t.Helper()
	buf, err := c.Reserve(context.Background(), len(data))
	require.NoError(t, err)
	copy(buf.Bytes(), data)
	require.NoError(t, c.Post(len(data), tag))
}

func TestSlotsArriveInOrderWithTags(t *testing.T) {
	_, a, b := pair(t, 4)
	for i := 0; i < 20; i++ {
		send(t, a, []byte{byte(i), byte(i + 1)}, transport.Tag{Op: 7, Msg: uint32(i)})
		buf, tag, err := b.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i), byte(i + 1)}, buf.Bytes())
		require.Equal(t, transport.Tag{Op: 7, Msg: uint32(i)}, tag)
		require.NoError(t, b.Release())
	}
}

func TestSenderRunsAtMostSlotsAhead(t *testing.T) {
	_, a, b := pair(t, 3)
	for i := 0; i < 3; i++ {
		send(t, a, []byte{byte(i)}, transport.Tag{Slice: uint32(i)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := a.Reserve(ctx, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a fourth slot must not be free")
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer)
	_, _, err = b.Wait(context.Background())
	require.NoError(t, err)
	require.NoError(t, b.Release())
	send(t, a, []byte{9}, transport.Tag{})
}

func TestGracefulCloseDrainsThenReportsPeerClosed(t *testing.T) {
	nw, a, b := pair(t, 4)
	send(t, a, []byte{1}, transport.Tag{})
	send(t, a, []byte{2}, transport.Tag{})
	require.NoError(t, nw.Endpoint(0).Close(nil))
	for _, want := range []byte{1, 2} {
		buf, _, err := b.Wait(context.Background())
		require.NoError(t, err, "data posted before a graceful close stays readable")
		require.Equal(t, []byte{want}, buf.Bytes())
		require.NoError(t, b.Release())
	}
	_, _, err := b.Wait(context.Background())
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	_, err = b.Reserve(context.Background(), 1)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	_, err = nw.Endpoint(0).Connect(context.Background(), 1, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
}

func TestAbortWakesBlockedCallsWithTheCause(t *testing.T) {
	nw, a, b := pair(t, 2)
	cause := errors.New("out of memory")
	got := make(chan error, 1)
	go func() {
		_, _, err := b.Wait(context.Background())
		got <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block (the test passes either way)
	nw.Kill(0, cause)
	err := <-got
	require.ErrorIs(t, err, cause)
	var pa *transport.PeerAbortedError
	require.ErrorAs(t, err, &pa)
	require.Equal(t, 0, pa.Peer)
	_, err = a.Reserve(context.Background(), 1)
	require.ErrorIs(t, err, transport.ErrClosed, "the aborted side sees its own closure")
	require.ErrorIs(t, err, cause)
	// A link made after the abort is born dead.
	c, err := nw.Endpoint(1).Connect(context.Background(), 0, 5)
	require.NoError(t, err)
	_, err = c.Reserve(context.Background(), 1)
	require.ErrorIs(t, err, cause)
}

func TestFaultHookFailsAndObserves(t *testing.T) {
	nw, a, b := pair(t, 4)
	boom := errors.New("boom")
	var seen []Event
	nw.SetFault(func(ev Event) error {
		seen = append(seen, ev)
		if ev.Kind == EventPost && ev.Tag.Slice == 1 {
			return boom
		}
		return nil
	})
	send(t, a, []byte{1}, transport.Tag{Slice: 0})
	buf, err := a.Reserve(context.Background(), 1)
	require.NoError(t, err)
	buf.Bytes()[0] = 2
	require.ErrorIs(t, a.Post(1, transport.Tag{Slice: 1}), boom)
	_, _, err = b.Wait(context.Background())
	require.NoError(t, err)
	require.NoError(t, b.Release())
	nw.SetFault(nil)
	require.Equal(t, []Event{
		{Kind: EventPost, From: 0, To: 1, Tag: transport.Tag{Slice: 0}},
		{Kind: EventPost, From: 0, To: 1, Tag: transport.Tag{Slice: 1}},
		{Kind: EventWait, From: 0, To: 1},
	}, seen)
	// The failed post gave its slot back: four more fit.
	for i := 0; i < 4; i++ {
		send(t, a, []byte{byte(i)}, transport.Tag{})
	}
}

func TestBadRequests(t *testing.T) {
	nw, a, b := pair(t, 2)
	_, err := a.Reserve(context.Background(), 4097)
	require.Error(t, err, "larger than a slot")
	require.Error(t, a.Post(1, transport.Tag{}), "post without reserve")
	require.Error(t, b.Release(), "release without wait")
	_, err = nw.Endpoint(0).Connect(context.Background(), 0, 0)
	require.Error(t, err, "connect to self")
	_, err = nw.Endpoint(0).Connect(context.Background(), 2, 0)
	require.Error(t, err, "connect to a rank that does not exist")
	_, err = NewNetwork(2, Options{Slots: 1})
	require.Error(t, err)
}
