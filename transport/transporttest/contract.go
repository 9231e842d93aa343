package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Bounds of the contract suite's waits. Every call the suite makes has a
// deadline, so that a broken transport fails a test instead of hanging it.
const (
	// patience bounds a call that should succeed: generous, for a loaded
	// 2-core machine under the race detector.
	patience = 10 * time.Second
	// prompt bounds how long a call may take to notice an abort, a close
	// or the end of its context.
	prompt = 2 * time.Second
	// brief is the deadline of a call that is expected to block: long
	// enough that a slice in flight on loopback arrives, short enough to
	// keep the suite fast.
	brief = 100 * time.Millisecond
)

// ContractOptions says what Contract may expect of a transport where the
// Conn contract leaves it a choice.
type ContractOptions struct {
	// Buffered is how many bytes per direction a connection may hold,
	// beyond its Slots slots, while its receiver does not read: the
	// kernel's socket buffers for TCP ("a sender is at most Slots staged
	// slices plus the kernel's socket buffers ahead of its receiver").
	// Zero means a sender runs exactly Slots slices ahead.
	Buffered int
}

// Endpoints turns a transport's endpoints into transport.Endpoints, for
// the newEndpoints functions this package's suites take.
func Endpoints[E transport.Endpoint](eps []E) []transport.Endpoint {
	out := make([]transport.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = e
	}
	return out
}

// Contract checks, without the engine, that the connections of the
// endpoints newEndpoints makes keep the transport.Conn contract: order
// and tags, back-pressure, graceful drain, aborts, contexts, local
// close, the optional direct paths, and separate channels.
//
// newEndpoints(t, n) returns n fresh endpoints, rank i at index i, that
// know each other, with the same Caps (Slots ≥ 2, SlotSize ≥ 64, host
// slots on channels below transport.DeviceChannels), and closes them when
// t ends. Every sub-test makes its own; those that test closing close
// some earlier. Each connection is driven by one goroutine at a time, as
// the Conn contract says; every call has a deadline, so a broken
// transport fails a sub-test instead of hanging it. Small slots (a few KiB
// to a few hundred) keep the suite to a second or two.
func Contract(t *testing.T, newEndpoints func(t *testing.T, n int) []transport.Endpoint, o ContractOptions) {
	c := &contract{newEndpoints: newEndpoints, o: o}
	for _, s := range []struct {
		name string
		f    func(t *testing.T)
	}{
		{"order", c.order},
		{"backpressure", c.backPressure},
		{"drain", c.drain},
		{"abort", c.abort},
		{"context", c.contextEnds},
		{"localclose", c.localClose},
		{"direct", c.direct},
		{"channels", c.channels},
		{"connect", c.connect},
	} {
		t.Run(s.name, s.f)
	}
}

type contract struct {
	newEndpoints func(t *testing.T, n int) []transport.Endpoint
	o            ContractOptions
}

// pair makes two fresh endpoints and connects them on channel 0.
func (c *contract) pair(t *testing.T) (eps []transport.Endpoint, a, b transport.Conn, caps transport.Caps) {
	t.Helper()
	eps = c.newEndpoints(t, 2)
	require.Len(t, eps, 2)
	caps = eps[0].Caps()
	require.Equal(t, caps.Slots, eps[1].Caps().Slots, "every rank sees the same Slots")
	require.Equal(t, caps.SlotSize, eps[1].Caps().SlotSize, "every rank sees the same SlotSize")
	require.GreaterOrEqual(t, caps.Slots, 2)
	require.GreaterOrEqual(t, caps.SlotSize, 64)
	a, b = ConnectPair(t, eps[0], eps[1], 0, 1, 0)
	require.Equal(t, 1, a.Peer())
	require.Equal(t, 0, b.Peer())
	return eps, a, b, caps
}

// capacity is the most slices of size bytes a sender may post on one
// connection while its receiver does not read, with a margin for what a
// kernel counts loosely.
func (c *contract) capacity(caps transport.Caps, size int) int {
	if c.o.Buffered == 0 {
		return caps.Slots
	}
	// A slice costs at least a small header on the wire; the margin covers
	// the kernel's rounding of its buffers.
	return caps.Slots + c.o.Buffered/max(size, 64) + 2*caps.Slots + 64
}

// pattern returns the content of slice i of a stream with the given seed:
// bytes that differ from slice to slice and, within a slice, from one
// 256-byte block to the next, so that lost, repeated, swapped or shifted
// bytes all show.
func pattern(seed, i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(seed*31 + i*131 + j*7 + j>>8)
	}
	return b
}

// tagOf is the tag of slice i of a stream with the given seed: every
// field distinct and non-zero.
func tagOf(seed, i int) transport.Tag {
	return transport.Tag{Op: uint64(seed)<<32 | uint64(i+1), Sig: 0x5eed0000 ^ uint32(seed<<8) ^ uint32(i), Msg: uint32(1000 + i), Slice: uint32(3*i + 1)}
}

// sizes returns the sizes of a stream's slices for a slot size: empty,
// one byte, odd sizes around the small-message limits transports use
// (shared memory's 32-byte inline payloads, cache lines, pages), and
// whole slots.
func sizes(slotSize int) []int {
	var out []int
	for _, n := range []int{0, 1, slotSize, 7, 31, 32, 33, slotSize - 1, 63, 65, 4093, 4097, slotSize / 3, 2*slotSize/3 + 1} {
		if n >= 0 && n <= slotSize {
			out = append(out, n)
		}
	}
	return out
}

// send reserves, fills and posts slice i of stream seed on conn, of size n.
func send(ctx context.Context, conn transport.Conn, seed, i, n int) error {
	buf, err := conn.Reserve(ctx, n)
	if err != nil {
		return fmt.Errorf("reserve of slice %d (%d bytes): %w", i, n, err)
	}
	if buf.Len() != n {
		return fmt.Errorf("reserve of slice %d: %d bytes, asked for %d", i, buf.Len(), n)
	}
	copy(buf.Bytes(), pattern(seed, i, n))
	if err := conn.Post(n, tagOf(seed, i)); err != nil {
		return fmt.Errorf("post of slice %d (%d bytes): %w", i, n, err)
	}
	return nil
}

// recv waits for slice i of stream seed on conn, checks its size, bytes and
// tag, and releases it.
func recv(ctx context.Context, conn transport.Conn, seed, i, n int) error {
	buf, tag, err := conn.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait for slice %d: %w", i, err)
	}
	if want := tagOf(seed, i); tag != want {
		return fmt.Errorf("slice %d: tag %v, want %v", i, tag, want)
	}
	if buf.Len() != n {
		return fmt.Errorf("slice %d: %d bytes, want %d", i, buf.Len(), n)
	}
	if want := pattern(seed, i, n); !bytes.Equal(buf.Bytes(), want) {
		return fmt.Errorf("slice %d: %d bytes corrupted (first difference at byte %d)", i, n, firstDiff(buf.Bytes(), want))
	}
	if err := conn.Release(); err != nil {
		return fmt.Errorf("release of slice %d: %w", i, err)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// async runs f on a goroutine of its own; its result comes on the channel.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// result returns what the function async started returned, failing the
// test if that takes longer than d.
func result(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return nil
	}
}

// requirePeerError checks that err is a *transport.PeerError naming peer.
func requirePeerError(t *testing.T, err error, peer int, what string) {
	t.Helper()
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe, "%s: the error must be a *transport.PeerError", what)
	require.Equal(t, peer, pe.Peer, "%s: the error names the wrong peer: %v", what, err)
}

// requireAborted checks that err is a *transport.PeerError naming peer and
// wrapping a *transport.PeerAbortedError that names peer and carries
// cause's text.
func requireAborted(t *testing.T, err error, peer int, cause error, what string) {
	t.Helper()
	requirePeerError(t, err, peer, what)
	var pa *transport.PeerAbortedError
	require.ErrorAs(t, err, &pa, "%s: the error must wrap a *transport.PeerAbortedError: %v", what, err)
	require.Equal(t, peer, pa.Peer, "%s: the abort names the wrong rank: %v", what, err)
	require.ErrorContains(t, err, cause.Error(), "%s: the abort's cause is lost", what)
}

// order streams slices of every size, with distinct tags and contents,
// both ways at once, several times round the ring of slots, and checks
// every byte and tag.
func (c *contract) order(t *testing.T) {
	_, a, b, caps := c.pair(t)
	sz := sizes(caps.SlotSize)
	// Bursts of 1 to Slots slices, so that bursts start at every position
	// in the ring: a side posts a burst, then takes the peer's. No burst
	// holds more than Slots slices, which every transport takes without
	// its receiver reading, so both sides posting at once cannot deadlock.
	var bursts []int
	for total, i := 0, 0; total < 4*caps.Slots+len(sz); i++ {
		n := []int{caps.Slots, 1, caps.Slots - 1, 2, caps.Slots}[i%5]
		bursts = append(bursts, n)
		total += n
	}
	// Each connection is driven by one goroutine, as the engine drives it;
	// the other direction's data moves at the same time on the other one.
	side := func(conn transport.Conn, seedOut, seedIn int) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			size := func(seed, i int) int { return sz[(i+seed)%len(sz)] }
			next := 0
			for _, n := range bursts {
				for i := next; i < next+n; i++ {
					if err := send(ctx, conn, seedOut, i, size(seedOut, i)); err != nil {
						return err
					}
				}
				for i := next; i < next+n; i++ {
					if err := recv(ctx, conn, seedIn, i, size(seedIn, i)); err != nil {
						return err
					}
				}
				next += n
			}
			return nil
		}
	}
	ra := async(side(a, 1, 2))
	rb := async(side(b, 2, 1))
	require.NoError(t, result(t, ra, patience+prompt, "rank 0"), "rank 0 (sends stream 1, receives stream 2)")
	require.NoError(t, result(t, rb, patience+prompt, "rank 1"), "rank 1 (sends stream 2, receives stream 1)")
}

// fill posts whole-slot slices of stream seed on conn, numbered from
// from on, until a Reserve blocks past brief, and returns the number of
// the slice that Reserve was for (how many slices are posted now), how
// long it took to give up, and its error. It fails once more than limit
// slices are posted.
func fill(conn transport.Conn, seed, from, size, limit int) (int, time.Duration, error) {
	for i := from; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), brief)
		at := time.Now()
		buf, err := conn.Reserve(ctx, size)
		took := time.Since(at)
		cancel()
		if err != nil {
			return i, took, err
		}
		if i == limit {
			return i, took, fmt.Errorf("sender ran %d slices ahead of a receiver that does not read", i+1)
		}
		copy(buf.Bytes(), pattern(seed, i, size))
		if err := conn.Post(size, tagOf(seed, i)); err != nil {
			return i, took, fmt.Errorf("post of slice %d: %w", i, err)
		}
	}
}

// backPressure checks that a sender whose receiver does not read can post
// at least Slots slices and at most the transport's capacity, that the
// Reserve past that blocks until its context ends, and that the sender
// goes on once the receiver takes slices.
func (c *contract) backPressure(t *testing.T) {
	_, a, b, caps := c.pair(t)
	size := caps.SlotSize
	limit := c.capacity(caps, size)
	start := time.Now()
	posted, _, err := fill(a, 3, 0, size, limit)
	require.ErrorIs(t, err, context.DeadlineExceeded, "after %d slices a Reserve must block until its context ends", posted)
	requirePeerError(t, err, 1, "a Reserve that ran out of time")
	require.GreaterOrEqual(t, posted, caps.Slots, "a sender may fill all Slots slots before its receiver reads")
	t.Logf("%d slices of %d bytes posted before a Reserve blocked (bound %d), in %v", posted, size, limit, time.Since(start))

	// The sender waits for room; the receiver takes slices.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	reserved := make(chan error, 1)
	sent := async(func() error {
		_, err := a.Reserve(ctx, size)
		reserved <- err
		if err != nil {
			return err
		}
		// The slot Reserve returned is posted in turn, after what was
		// there, and flushed: a transport whose sends move only while the
		// sender calls it (TCP) needs that for the receiver to drain.
		if err := a.Post(0, tagOf(3, posted)); err != nil {
			return err
		}
		return flush(ctx, a)
	})
	require.NoError(t, recv(ctx, b, 3, 0, size))
	if c.o.Buffered == 0 {
		// Slots is exact: one released slot is room for one more.
		require.NoError(t, result(t, reserved, prompt, "a Reserve after the receiver released a slot"))
	}
	// A kernel may wait for more room before it takes more: drain.
	for i := 1; i < posted; i++ {
		require.NoError(t, recv(ctx, b, 3, i, size))
	}
	if c.o.Buffered != 0 {
		require.NoError(t, result(t, reserved, prompt, "a Reserve after the receiver drained the connection"))
	}
	require.NoError(t, recv(ctx, b, 3, posted, 0))
	require.NoError(t, result(t, sent, prompt, "the sender"))
}

// flush flushes conn if it is a transport.Flusher.
func flush(ctx context.Context, conn transport.Conn) error {
	if f, ok := conn.(transport.Flusher); ok {
		return f.Flush(ctx)
	}
	return nil
}

// drain checks a graceful close: what the sender posted (and flushed)
// before Close(nil) reaches its receiver intact, then ErrPeerClosed.
func (c *contract) drain(t *testing.T) {
	eps, a, b, caps := c.pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	sz := sizes(caps.SlotSize)
	k := caps.Slots // what any transport holds without its receiver reading
	for i := range k {
		require.NoError(t, send(ctx, a, 4, i, sz[i%len(sz)]))
	}
	// The engine flushes before an operation returns, and so before
	// anyone closes the endpoint.
	require.NoError(t, flush(ctx, a))
	require.NoError(t, eps[0].Close(nil))
	for i := range k {
		require.NoError(t, recv(ctx, b, 4, i, sz[i%len(sz)]), "data posted before a graceful close stays readable")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), prompt)
	defer wcancel()
	_, _, err := b.Wait(wctx)
	require.ErrorIs(t, err, transport.ErrPeerClosed, "once drained, a Wait reports the graceful close")
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	requirePeerError(t, err, 0, "a Wait on a drained connection")
	// Nor does the peer take more: a send fails with ErrPeerClosed, once
	// any room there was is used up.
	err = c.sendUntilFails(t, b, caps)
	require.ErrorIs(t, err, transport.ErrPeerClosed, "a send to a rank that closed")
	requirePeerError(t, err, 0, "a send to a rank that closed")
}

// sendUntilFails posts one-byte slices on conn, whose peer has gone, until
// a call fails, and returns its error. It fails the test if a call waits
// for its context or the sends outrun the transport's capacity.
func (c *contract) sendUntilFails(t *testing.T, conn transport.Conn, caps transport.Caps) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), prompt)
	defer cancel()
	limit := c.capacity(caps, 1)
	for i := 0; ; i++ {
		buf, err := conn.Reserve(ctx, 1)
		if err == nil {
			buf.Bytes()[0] = byte(i)
			err = conn.Post(1, tagOf(5, i))
		}
		if err == nil {
			err = flush(ctx, conn)
		}
		if err != nil {
			require.NotErrorIs(t, err, context.DeadlineExceeded, "a send to a rank that has gone waited for its context")
			return err
		}
		if i == limit {
			t.Fatalf("%d slices posted to a rank that has gone", i+1)
		}
	}
}

// abort checks that Close(cause) reaches the peer at once, as a
// *PeerError wrapping a *PeerAbortedError with the cause: a Wait pending
// when it came, and later calls.
func (c *contract) abort(t *testing.T) {
	eps, _, b, caps := c.pair(t)
	cause := errors.New("contract: rank 0 gives up (a distinctive cause 7f3a)")
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	started := make(chan struct{})
	pending := async(func() error {
		close(started)
		_, _, err := b.Wait(ctx)
		return err
	})
	<-started
	// Let the Wait park, as a rank waiting for a slow peer does; the test
	// holds either way, only what it exercises differs.
	time.Sleep(20 * time.Millisecond)
	at := time.Now()
	require.NoError(t, eps[0].Close(cause))
	err := result(t, pending, prompt, "a Wait pending when the peer aborted")
	require.Less(t, time.Since(at), prompt)
	requireAborted(t, err, 0, cause, "a Wait pending when the peer aborted")

	wctx, wcancel := context.WithTimeout(context.Background(), prompt)
	defer wcancel()
	_, _, err = b.Wait(wctx)
	requireAborted(t, err, 0, cause, "a Wait after the peer aborted")

	// A send may succeed while there is room (a shared-memory ring with
	// free slots, a socket's kernel buffers), but none may wait for its
	// context, and one fails once the room is used up.
	at = time.Now()
	err = c.sendUntilFails(t, b, caps)
	require.Less(t, time.Since(at), prompt)
	requireAborted(t, err, 0, cause, "a send after the peer aborted")
}

// contextEnds checks that a Wait and a Reserve that cannot complete return
// when their contexts end, naming the peer and wrapping the context's
// cause, and that the connection still works afterwards. Each case has
// fresh endpoints.
func (c *contract) contextEnds(t *testing.T) {
	t.Run("wait/deadline", func(t *testing.T) {
		_, a, b, _ := c.pair(t)
		WaitHonoursContext(t, a, 1)
		c.usable(t, a, b)
	})
	t.Run("reserve/deadline", func(t *testing.T) {
		_, a, b, caps := c.pair(t)
		// fill ends with a Reserve that blocked past its deadline. A
		// kernel may take more meanwhile: a second fill goes on from there.
		start := time.Now()
		posted := 0
		for round := range 2 {
			var took time.Duration
			var err error
			posted, took, err = fill(a, 6, posted, caps.SlotSize, c.capacity(caps, caps.SlotSize))
			require.ErrorIs(t, err, context.DeadlineExceeded, "round %d: a Reserve on a full connection, after %d slices", round, posted)
			requirePeerError(t, err, 1, "a Reserve that ran out of time")
			require.Less(t, took, prompt, "a Reserve returns soon after its deadline")
		}
		require.Less(t, time.Since(start), patience)
		// Once the receiver drains the connection, both directions work.
		rctx, rcancel := context.WithTimeout(context.Background(), patience)
		defer rcancel()
		flushed := async(func() error { return flush(rctx, a) })
		for i := range posted {
			require.NoError(t, recv(rctx, b, 6, i, caps.SlotSize))
		}
		require.NoError(t, result(t, flushed, prompt, "the sender's Flush"))
		c.usable(t, a, b)
	})
	t.Run("wait/cancelled", func(t *testing.T) {
		_, a, b, _ := c.pair(t)
		cause := errors.New("contract: the caller lost interest")
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		tctx, tcancel := context.WithTimeout(ctx, patience)
		defer tcancel()
		at := time.Now()
		_, _, err := a.Wait(tctx)
		require.ErrorIs(t, err, cause, "a Wait on a cancelled context reports its cause")
		requirePeerError(t, err, 1, "a Wait on a cancelled context")
		require.Less(t, time.Since(at), prompt)
		c.usable(t, a, b)
	})
	t.Run("wait/cancelledwhilewaiting", func(t *testing.T) {
		_, a, b, _ := c.pair(t)
		cause := errors.New("contract: the caller lost interest later")
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		tctx, tcancel := context.WithTimeout(ctx, patience)
		defer tcancel()
		started := make(chan struct{})
		waited := async(func() error {
			close(started)
			_, _, err := a.Wait(tctx)
			return err
		})
		<-started
		time.Sleep(20 * time.Millisecond) // let it park; the test holds either way
		at := time.Now()
		cancel(cause)
		err := result(t, waited, prompt, "a Wait whose context was cancelled")
		require.ErrorIs(t, err, cause, "a Wait whose context is cancelled reports the cause")
		requirePeerError(t, err, 1, "a Wait whose context was cancelled")
		require.Less(t, time.Since(at), prompt)
		c.usable(t, a, b)
	})
}

// usable checks that a slice goes from a to b and one from b to a: a call
// that ran out of time fails the call, not the connection.
func (c *contract) usable(t *testing.T, a, b transport.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, p := range [][2]transport.Conn{{b, a}, {a, b}} {
		require.NoError(t, send(ctx, p[0], 7, 0, 100))
		require.NoError(t, flush(ctx, p[0]))
		require.NoError(t, recv(ctx, p[1], 7, 0, 100), "the connection works after a call ran out of time")
	}
}

// localClose checks that once this rank's endpoint is closed, gracefully
// or not, calls on its connections fail with ErrClosed, and so does
// Connect.
func (c *contract) localClose(t *testing.T) {
	for _, cause := range []error{nil, errors.New("contract: rank 0 closes (cause 9c21)")} {
		t.Run(fmt.Sprintf("abort=%v", cause != nil), func(t *testing.T) {
			eps, a, _, _ := c.pair(t)
			require.NoError(t, eps[0].Close(cause))
			require.NoError(t, eps[0].Close(cause), "Close is idempotent")
			ctx, cancel := context.WithTimeout(context.Background(), prompt)
			defer cancel()
			check := func(err error, what string) {
				t.Helper()
				require.ErrorIs(t, err, transport.ErrClosed, "%s on a closed endpoint", what)
				if cause != nil {
					require.ErrorContains(t, err, cause.Error(), "%s on an aborted endpoint names the cause", what)
				}
			}
			at := time.Now()
			_, err := a.Reserve(ctx, 1)
			check(err, "Reserve")
			_, _, err = a.Wait(ctx)
			check(err, "Wait")
			if d, ok := a.(transport.DirectReceiver); ok {
				_, _, err = d.WaitInto(ctx, memory.HostBuffer(make([]byte, 1)))
				check(err, "WaitInto")
			}
			if d, ok := a.(transport.DirectSender); ok {
				err = d.PostFrom(ctx, memory.HostBuffer(make([]byte, 1)), tagOf(8, 0))
				check(err, "PostFrom")
			}
			require.Less(t, time.Since(at), prompt, "calls on a closed endpoint fail at once")
			_, err = eps[0].Connect(ctx, 1, 0)
			require.ErrorIs(t, err, transport.ErrClosed, "Connect for an existing connection")
			_, err = eps[0].Connect(ctx, 1, 1)
			require.ErrorIs(t, err, transport.ErrClosed, "Connect for a new connection")
		})
	}
}

// direct checks the optional direct paths, where a connection offers them.
func (c *contract) direct(t *testing.T) {
	eps, a, b, caps := c.pair(t)
	_, recvs := b.(transport.DirectReceiver)
	_, sends := a.(transport.DirectSender)
	_, flushes := a.(transport.Flusher)
	if !recvs && !sends && !flushes {
		t.Skip("the transport offers no direct paths")
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if f, ok := a.(transport.Flusher); ok {
		require.NoError(t, f.Flush(ctx), "Flush with nothing posted")
	}
	sz := []int{0, 1, 777, caps.SlotSize, 33}
	if recvs {
		t.Run("waitinto", func(t *testing.T) {
			d := b.(transport.DirectReceiver)
			const guard = 16
			for i, n := range sz {
				require.NoError(t, send(ctx, a, 9, i, n))
				require.NoError(t, flush(ctx, a))
				// dst sits between guard bytes that must stay as they are.
				mem := bytes.Repeat([]byte{0xee}, n+2*guard)
				tag, got, err := d.WaitInto(ctx, memory.HostBuffer(mem[guard:guard+n]))
				require.NoError(t, err, "slice %d", i)
				require.Equal(t, tagOf(9, i), tag, "slice %d", i)
				require.Equal(t, n, got, "slice %d", i)
				require.True(t, bytes.Equal(pattern(9, i, n), mem[guard:guard+n]), "slice %d: %d bytes corrupted", i, n)
				require.Equal(t, bytes.Repeat([]byte{0xee}, guard), mem[:guard], "slice %d: bytes before dst written", i)
				require.Equal(t, bytes.Repeat([]byte{0xee}, guard), mem[guard+n:], "slice %d: bytes after dst written", i)
			}
			// Wait and WaitInto mix, in order.
			require.NoError(t, send(ctx, a, 9, len(sz), 5))
			require.NoError(t, send(ctx, a, 9, len(sz)+1, 6))
			require.NoError(t, recv(ctx, b, 9, len(sz), 5))
			dst := make([]byte, 6)
			tag, _, err := d.WaitInto(ctx, memory.HostBuffer(dst))
			require.NoError(t, err)
			require.Equal(t, tagOf(9, len(sz)+1), tag)
			require.Equal(t, pattern(9, len(sz)+1, 6), dst)
		})
		t.Run("sizemismatch", func(t *testing.T) {
			// The connection is unusable after a mismatch: each case has a
			// channel of its own.
			for ch, want := range []int{50, 200, 0} {
				a, b := ConnectPair(t, eps[0], eps[1], 0, 1, ch+1)
				d := b.(transport.DirectReceiver)
				require.NoError(t, send(ctx, a, 10, ch, 100))
				require.NoError(t, flush(ctx, a))
				dst := bytes.Repeat([]byte{0xee}, want)
				tag, got, err := d.WaitInto(ctx, memory.HostBuffer(dst))
				require.ErrorIs(t, err, transport.ErrSizeMismatch, "a %d-byte slice into %d bytes", 100, want)
				require.Equal(t, 100, got, "WaitInto reports the slice's size")
				require.Equal(t, tagOf(10, ch), tag, "WaitInto reports the slice's tag")
				require.Equal(t, bytes.Repeat([]byte{0xee}, want), dst, "dst untouched")
			}
		})
	}
	if sends {
		t.Run("postfrom", func(t *testing.T) {
			d := a.(transport.DirectSender)
			// PostFrom and Reserve/Post mix, in order. A receiver runs
			// meanwhile, as the peer's channel goroutine does: PostFrom
			// may wait for a free slot, and Flush waits for room or for
			// the receiver's copy.
			n := 3 * caps.Slots
			size := func(i int) int { return sz[i%len(sz)] }
			got := async(func() error {
				for i := range n {
					if err := recv(ctx, b, 11, i, size(i)); err != nil {
						return err
					}
				}
				return nil
			})
			var srcs [][]byte
			for i := range n {
				if i%3 == 2 {
					require.NoError(t, send(ctx, a, 11, i, size(i)))
					continue
				}
				src := pattern(11, i, size(i))
				srcs = append(srcs, src)
				require.NoError(t, d.PostFrom(ctx, memory.HostBuffer(src), tagOf(11, i)))
			}
			if f, ok := a.(transport.Flusher); ok {
				require.NoError(t, f.Flush(ctx))
				// Once Flush returns, the caller's memory is its own: the
				// receiver must not see what is written there now.
				for _, src := range srcs {
					for j := range src {
						src[j] ^= 0xff
					}
				}
			}
			require.NoError(t, result(t, got, patience+prompt, "the receiver of PostFrom's slices"))
		})
	}
}

// channels checks that the connections of several channels between the
// same two ranks are separate: what one carries never shows on another.
func (c *contract) channels(t *testing.T) {
	eps, a0, b0, caps := c.pair(t)
	a1, b1 := ConnectPair(t, eps[0], eps[1], 0, 1, 1)
	a2, b2 := ConnectPair(t, eps[0], eps[1], 0, 1, 2)
	require.NotSame(t, a0, a1)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	k := caps.Slots
	// Channel 0 full, channel 1 one slice, channel 2 nothing: channel 1's
	// receiver gets its own slice, not channel 0's first.
	for i := range k {
		require.NoError(t, send(ctx, a0, 20, i, 40+i))
	}
	require.NoError(t, send(ctx, a1, 21, 0, 17))
	// And a channel's other direction is separate from both.
	require.NoError(t, send(ctx, b1, 22, 0, 9))
	for _, conn := range []transport.Conn{a0, a1, a2, b0, b1, b2} {
		require.NoError(t, flush(ctx, conn))
	}
	require.NoError(t, recv(ctx, b1, 21, 0, 17), "channel 1 delivers channel 1's slice")
	require.NoError(t, recv(ctx, a1, 22, 0, 9), "channel 1's other direction")
	wctx, wcancel := context.WithTimeout(context.Background(), brief)
	defer wcancel()
	_, _, err := b2.Wait(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "channel 2 carried nothing")
	for i := range k {
		require.NoError(t, recv(ctx, b0, 20, i, 40+i), "channel 0 keeps its own slices")
	}
	wctx, wcancel = context.WithTimeout(context.Background(), brief)
	defer wcancel()
	_, _, err = b1.Wait(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "channel 1 carried one slice")
	// Channel 0 is still in order after channel 1 moved: the rings are not
	// shared.
	require.NoError(t, send(ctx, a0, 20, k, 3))
	require.NoError(t, recv(ctx, b0, 20, k, 3))
}

// connect checks Connect's bookkeeping: the same Conn for the same peer
// and channel, Peer, and refusals of ranks that cannot be peers.
func (c *contract) connect(t *testing.T) {
	eps := c.newEndpoints(t, 3)
	require.Len(t, eps, 3)
	a01, b10 := ConnectPair(t, eps[0], eps[1], 0, 1, 0)
	a02, c20 := ConnectPair(t, eps[0], eps[2], 0, 2, 0)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	again, err := eps[0].Connect(ctx, 1, 0)
	require.NoError(t, err)
	require.Same(t, a01, again, "Connect returns the same Conn for the same peer and channel")
	require.Equal(t, 2, a02.Peer())
	require.Equal(t, 0, c20.Peer())
	// Rank 0's two peers are separate too.
	require.NoError(t, send(ctx, b10, 30, 0, 11))
	require.NoError(t, send(ctx, c20, 31, 0, 12))
	for _, conn := range []transport.Conn{b10, c20} {
		require.NoError(t, flush(ctx, conn))
	}
	require.NoError(t, recv(ctx, a02, 31, 0, 12))
	require.NoError(t, recv(ctx, a01, 30, 0, 11))
	for _, peer := range []int{0, -1, 3} {
		_, err := eps[0].Connect(ctx, peer, 0)
		require.Error(t, err, "rank 0 connecting to rank %d", peer)
	}
}
