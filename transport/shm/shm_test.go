//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(strangerEnv); role != "" {
		os.Exit(stranger(role, os.Getenv(strangerAddrEnv))) // this binary re-executed as another user
	}
	goleak.VerifyTestMain(m)
}

var secret = []byte("0123456789abcdef")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// endpoints makes n endpoints in this process that know each other.
func endpoints(t *testing.T, n int, mod func(r int, o *Options)) []*Endpoint {
	t.Helper()
	lns := make([]*net.UnixListener, n)
	addrs := make([]string, n)
	for r := range lns {
		ln, err := Listen()
		require.NoError(t, err)
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	eps := make([]*Endpoint, n)
	for r := range eps {
		o := Options{Rank: r, NRanks: n, Peers: addrs, Secret: secret, Listener: lns[r], Slots: 4, SlotSize: 64 << 10, Logger: quiet()}
		if mod != nil {
			mod(r, &o)
		}
		ep, err := New(o)
		require.NoError(t, err)
		eps[r] = ep
	}
	t.Cleanup(func() {
		for _, ep := range eps {
			ep.Close(nil)
		}
	})
	return eps
}

func connectPair(t *testing.T, a, b *Endpoint, ch int) (transport.Conn, transport.Conn) {
	t.Helper()
	return transporttest.ConnectPair(t, a, b, a.o.Rank, b.o.Rank, ch)
}

func pattern(i, size int) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i*7 + j)
	}
	return b
}

// stream sends n slices of varied sizes (0 to a full slot) from a to b and
// checks every byte and tag, in both directions at once.
func stream(t *testing.T, a, b transport.Conn, n, slotSize int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	size := func(i int) int {
		if i%3 == 0 {
			return i % (inlineMax + 9) // around the inline limit
		}
		return (i * 4093) % (slotSize + 1)
	}
	send := func(c transport.Conn) error {
		for i := 0; i < n; i++ {
			buf, err := c.Reserve(ctx, size(i))
			if err != nil {
				return err
			}
			copy(buf.Bytes(), pattern(i, size(i)))
			if err := c.Post(size(i), transport.Tag{Op: 1, Sig: 7, Msg: uint32(i), Slice: uint32(i % 5)}); err != nil {
				return err
			}
		}
		return nil
	}
	recv := func(c transport.Conn) error {
		for i := 0; i < n; i++ {
			buf, tag, err := c.Wait(ctx)
			if err != nil {
				return err
			}
			if want := (transport.Tag{Op: 1, Sig: 7, Msg: uint32(i), Slice: uint32(i % 5)}); tag != want {
				return fmt.Errorf("slice %d: tag %v, want %v", i, tag, want)
			}
			if !bytes.Equal(buf.Bytes(), pattern(i, size(i))) {
				return fmt.Errorf("slice %d: %d bytes, corrupted or wrong size (want %d)", i, buf.Len(), size(i))
			}
			if err := c.Release(); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make(chan error, 4)
	for _, f := range []func() error{func() error { return send(a) }, func() error { return recv(b) },
		func() error { return send(b) }, func() error { return recv(a) }} {
		go func() { errs <- f() }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
}

func TestSlicesArriveIntact(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	stream(t, a, b, 2000, 64<<10)
	// Slots that are not a whole number of pages.
	eps = endpoints(t, 2, func(_ int, o *Options) { o.SlotSize = 5000 })
	a, b = connectPair(t, eps[0], eps[1], 0)
	stream(t, a, b, 200, 5000)
}

func TestSlicesArriveIntactWhenSleeping(t *testing.T) {
	// No polling: every wait sleeps on the futex, and every post and
	// release must wake the other side or the test times out.
	eps := endpoints(t, 2, func(_ int, o *Options) { o.SpinFor = -1; o.Slots = 2 })
	a, b := connectPair(t, eps[0], eps[1], 3)
	stream(t, a, b, 500, 64<<10)
}

func TestChannelsAreSeparate(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a0, b0 := connectPair(t, eps[0], eps[1], 0)
	a1, b1 := connectPair(t, eps[0], eps[1], 1)
	require.NotSame(t, a0, a1)
	var wg sync.WaitGroup
	wg.Go(func() { stream(t, a0, b0, 300, 64<<10) })
	wg.Go(func() { stream(t, a1, b1, 300, 64<<10) })
	wg.Wait()
	again, err := eps[0].Connect(context.Background(), 1, 0)
	require.NoError(t, err)
	require.Same(t, a0, again)
}

func TestAllReduceOverShm(t *testing.T) {
	link := algorithms.LinkModel{Latency: 1e-6, Bandwidth: 5e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 256 << 10}
	transporttest.AllReduceEveryAlgorithm(t, link, func(t *testing.T, n int) []transport.Endpoint {
		var out []transport.Endpoint
		for _, e := range endpoints(t, n, nil) {
			out = append(out, e)
		}
		return out
	})
}

func TestAbortReachesWaitingPeer(t *testing.T) {
	for _, spin := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			eps := endpoints(t, 2, func(_ int, o *Options) { o.SpinFor = spin })
			a, b := connectPair(t, eps[0], eps[1], 0)
			got := make(chan error, 2)
			go func() {
				_, _, err := a.Wait(context.Background())
				got <- err
			}()
			go func() {
				// The sender side: fill the ring, then wait for space.
				var err error
				for err == nil {
					if _, err = a.Reserve(context.Background(), 8); err == nil {
						err = a.Post(8, transport.Tag{})
					}
				}
				got <- err
			}()
			time.Sleep(20 * time.Millisecond) // let both sleep; the test holds either way
			start := time.Now()
			eps[1].Close(errors.New("disk on fire"))
			for range 2 {
				err := <-got
				var pe *transport.PeerError
				require.ErrorAs(t, err, &pe)
				require.Equal(t, 1, pe.Peer)
				var pa *transport.PeerAbortedError
				require.ErrorAs(t, err, &pa)
				require.ErrorContains(t, err, "disk on fire")
			}
			require.Less(t, time.Since(start), time.Second)
			_, _, err := b.Wait(context.Background())
			require.ErrorIs(t, err, transport.ErrClosed)
			require.ErrorContains(t, err, "disk on fire")
		})
	}
}

func TestGracefulCloseDrains(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	for i := range 3 {
		buf, err := a.Reserve(context.Background(), 5)
		require.NoError(t, err)
		copy(buf.Bytes(), fmt.Sprintf("msg %d", i))
		require.NoError(t, a.Post(5, transport.Tag{Msg: uint32(i)}))
	}
	require.NoError(t, eps[0].Close(nil))
	for i := range 3 {
		buf, tag, err := b.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("msg %d", i), string(buf.Bytes()))
		require.Equal(t, uint32(i), tag.Msg)
		require.NoError(t, b.Release())
	}
	_, _, err := b.Wait(context.Background())
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	_, err = b.Reserve(context.Background(), 1)
	if err == nil {
		// There was a free slot: the first full ring reports it.
		for err == nil {
			if err = b.Post(1, transport.Tag{}); err == nil {
				_, err = b.Reserve(context.Background(), 1)
			}
		}
	}
	require.ErrorIs(t, err, transport.ErrPeerClosed)
}

func TestDeadPeerIsNoticed(t *testing.T) {
	// A peer process that dies leaves no flag; its end of the control
	// socket closes. Simulate by closing it behind the endpoint's back.
	eps := endpoints(t, 2, func(_ int, o *Options) { o.SpinFor = 100 * time.Microsecond })
	a, b := connectPair(t, eps[0], eps[1], 0)
	got := make(chan error, 1)
	go func() {
		_, _, err := a.Wait(context.Background())
		got <- err
	}()
	bc := b.(*conn)
	bc.closeCtl.Do(func() { unix.Close(bc.ctl) })
	select {
	case err := <-got:
		var pe *transport.PeerError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 1, pe.Peer)
		require.ErrorContains(t, err, "did rank 1's process exit")
	case <-time.After(5 * time.Second):
		t.Fatal("the dead peer went unnoticed")
	}
}

func TestContract(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(r int, o *Options)
	}{
		{"default", nil},
		// Every wait sleeps on the futex; slots not a whole number of pages.
		{"sleeping", func(_ int, o *Options) { o.SpinFor = -1; o.Slots = 2; o.SlotSize = 5000 }},
		// Receivers copy PostFrom's slices out of the sender's memory,
		// whatever this host's kernel copy costs.
		{"single-copy", func(_ int, o *Options) { o.CMA = CMAOn }},
	} {
		t.Run(c.name, func(t *testing.T) {
			transporttest.Contract(t, func(t *testing.T, n int) []transport.Endpoint {
				return transporttest.Endpoints(endpoints(t, n, c.mod))
			}, transporttest.ContractOptions{})
		})
	}
}

func TestWaitHonoursContext(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, _ := connectPair(t, eps[0], eps[1], 0)
	transporttest.WaitHonoursContext(t, a, 1)
}

// memfdMappings counts this process's mappings of goccl segments.
func memfdMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Count(string(b), "/memfd:goccl")
}

func TestCloseUnmapsEverything(t *testing.T) {
	before := memfdMappings(t)
	eps := endpoints(t, 3, nil)
	for i := range 3 {
		for j := i + 1; j < 3; j++ {
			a, b := connectPair(t, eps[i], eps[j], 0)
			stream(t, a, b, 20, 64<<10)
		}
	}
	require.Equal(t, before+6, memfdMappings(t), "a segment per pair, mapped on both sides")
	// A held slot (a call that never finished) must not keep the shared
	// memory alive either.
	c, err := eps[0].Connect(context.Background(), 1, 0)
	require.NoError(t, err)
	buf, err := c.Reserve(context.Background(), 10)
	require.NoError(t, err)
	for _, ep := range eps {
		ep.Close(nil)
	}
	copy(buf.Bytes(), "harmless") // private zero pages now
	require.Equal(t, before, memfdMappings(t))
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		require.NotContains(t, target, "memfd:goccl", "descriptor %s", fd.Name())
	}
}

// A call that comes while Close has begun (down set) but before it has
// torn the segment down fails, and lets go of the segment: each used to
// keep a reference, so the shared memory stayed mapped after Close.
func TestCallsWhileClosingHoldNothing(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	stream(t, a, b, 2, 64<<10)
	for _, ep := range eps {
		ep.down.Store(true) // Close's first step, as another goroutine would take it
	}
	ctx := context.Background()
	_, err := a.Reserve(ctx, 10)
	require.ErrorIs(t, err, transport.ErrClosed)
	_, _, err = b.Wait(ctx)
	require.ErrorIs(t, err, transport.ErrClosed)
	_, _, err = b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(make([]byte, 10)))
	require.ErrorIs(t, err, transport.ErrClosed)
	for _, c := range []transport.Conn{a, b} {
		require.Zero(t, c.(*conn).seg.refs.Load(), "references left on the segment")
	}
}

func TestCloseUnderRunningOperation(t *testing.T) {
	// Closing the endpoint while its goroutines are mid-transfer: calls
	// fail with ErrClosed, nothing faults.
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			buf, err := a.Reserve(context.Background(), 4096)
			if err != nil {
				return
			}
			clear(buf.Bytes())
			if a.Post(4096, transport.Tag{}) != nil {
				return
			}
		}
	})
	wg.Go(func() {
		for {
			buf, _, err := b.Wait(context.Background())
			if err != nil {
				return
			}
			_ = bytes.Count(buf.Bytes(), []byte{1})
			b.Release()
		}
	})
	time.Sleep(20 * time.Millisecond)
	eps[0].Close(errors.New("stop"))
	eps[1].Close(errors.New("stop"))
	wg.Wait()
}

func TestStrangersAreRefused(t *testing.T) {
	eps := endpoints(t, 2, nil)
	addr := eps[1].o.Peers[1]
	for _, f := range []func(net.Conn){
		func(c net.Conn) {
			handshake.Client(c, []byte("wrong"), wire.PurposeShm, func() (wire.FrameType, []byte) {
				s := wire.ConnSetup{From: 0, To: 1, NSocks: 1}
				return wire.FrameConnSetup, s.Append(nil)
			})
		},
		func(c net.Conn) { c.Write([]byte("garbage garbage garbage")) },
		func(c net.Conn) {
			// Right secret, but rank 1 may not hand itself a segment.
			handshake.Client(c, secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
				s := wire.ConnSetup{From: 1, To: 1, NSocks: 1}
				return wire.FrameConnSetup, s.Append(nil)
			})
			handshake.ReadFrame(c, 1024)
		},
		func(c net.Conn) {
			// Right secret and setup, then no descriptor.
			handshake.Client(c, secret, wire.PurposeShm, func() (wire.FrameType, []byte) {
				s := wire.ConnSetup{From: 0, To: 1, Channel: 5, NSocks: 1}
				return wire.FrameConnSetup, s.Append(nil)
			})
			handshake.ReadFrame(c, 1024)
			c.Write(make([]byte, segMsgLen))
			handshake.ReadFrame(c, 1024)
		},
	} {
		c, err := net.Dial("unix", addr)
		require.NoError(t, err)
		c.SetDeadline(time.Now().Add(time.Second))
		f(c)
		c.Close()
	}
	a, b := connectPair(t, eps[0], eps[1], 0)
	stream(t, a, b, 10, 64<<10)
}

func TestMismatchedSlotsAreRefused(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) { o.Slots = 2 + r })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.ErrorContains(t, err, "set the slot settings alike on every rank")
}

func TestBadOptions(t *testing.T) {
	ln, err := Listen()
	require.NoError(t, err)
	defer ln.Close()
	_, err = New(Options{Rank: 0, NRanks: 1, Peers: []string{""}, Listener: ln, SlotSize: 10})
	require.ErrorContains(t, err, "slots of 64 bytes to under 1 GiB")
	// A full slot's size must not read as a descriptor flag.
	_, err = New(Options{Rank: 0, NRanks: 1, Peers: []string{""}, Listener: ln, SlotSize: 1 << 30})
	require.ErrorContains(t, err, "under 1 GiB")
	_, err = New(Options{Rank: 2, NRanks: 2, Peers: []string{"", ""}, Listener: ln})
	require.Error(t, err)
}

func TestNotAShmPeer(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) { o.Peers = append([]string(nil), o.Peers...); o.Peers[1-r] = "" })
	_, err := eps[0].Connect(context.Background(), 1, 0)
	require.ErrorContains(t, err, "not reachable over shared memory")
}

func TestWaitKeepsOtherTransportsMoving(t *testing.T) {
	// While Progress reports sends pending, a wait polls it instead of
	// sleeping; its error ends the wait.
	// The wait ends when Progress, having reported nothing pending for a
	// while, cancels its context: no timing assumption, so a loaded CI
	// machine cannot make it flaky.
	var mu sync.Mutex
	calls, pendingFor := 0, 200
	var fail error
	var a transport.Conn
	sleptWhilePending := int32(-1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	progress := func(ch int) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if ch != 3 {
			return false, fmt.Errorf("progress for channel %d", ch)
		}
		calls++
		if calls == pendingFor-1 {
			sleptWhilePending = a.(*conn).sleeps.Load()
		}
		if calls == pendingFor+5 {
			cancel()
		}
		return calls < pendingFor, fail
	}
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.SpinFor = -1
		if r == 0 {
			o.Progress = progress
		}
	})
	mu.Lock()
	a, _ = connectPair(t, eps[0], eps[1], 3)
	mu.Unlock()
	_, _, err := a.Wait(ctx)
	require.ErrorIs(t, err, context.Canceled, "ended by Progress's cancel, not the 30 s deadline")
	mu.Lock()
	require.GreaterOrEqual(t, calls, pendingFor, "polled until nothing was pending")
	require.Zero(t, sleptWhilePending, "no futex sleep while sends were pending")
	require.Positive(t, a.(*conn).sleeps.Load(), "it sleeps once nothing is pending (SpinFor < 0)")
	fail = &transport.PeerError{Peer: 7, Op: "send", Err: errors.New("tcp peer gone")}
	mu.Unlock()
	_, _, err = a.Wait(context.Background())
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 7, pe.Peer, "the other transport's failure keeps its peer")
}

// BenchmarkExchange times one 8-byte exchange each way between two
// goroutines (each on its own thread, as two ranks' goroutines are): the
// transport's share of a small all-reduce.
func BenchmarkExchange(b *testing.B) {
	t := &testing.T{}
	eps := endpoints(t, 2, nil)
	defer func() {
		for _, ep := range eps {
			ep.Close(nil)
		}
	}()
	x, y := connectPair(t, eps[0], eps[1], 0)
	ctx := context.Background()
	side := func(c transport.Conn, n int) error {
		for i := 0; i < n; i++ {
			buf, err := c.Reserve(ctx, 8)
			if err != nil {
				return err
			}
			buf.Bytes()[0] = byte(i)
			if err := c.Post(8, transport.Tag{Op: uint64(i)}); err != nil {
				return err
			}
			got, _, err := c.Wait(ctx)
			if err != nil {
				return err
			}
			if got.Bytes()[0] != byte(i) {
				return fmt.Errorf("exchange %d: got %d", i, got.Bytes()[0])
			}
			if err := c.Release(); err != nil {
				return err
			}
		}
		return nil
	}
	b.ResetTimer()
	errc := make(chan error, 1)
	go func() { errc <- side(y, b.N) }()
	if err := side(x, b.N); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
