//go:build unix

package tcp

import (
	"bytes"
	"context"
	"errors"

	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = []byte("0123456789abcdef")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// endpoints makes n endpoints on loopback that know each other.
func endpoints(t *testing.T, n int, mod func(r int, o *Options)) []*Endpoint {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for r := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
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

func TestSlicesArriveInOrderAcrossSockets(t *testing.T) {
	eps := endpoints(t, 2, func(_ int, o *Options) { o.NSocks = 3 })
	a, b := connectPair(t, eps[0], eps[1], 0)
	const n = 200
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			size := (i * 997) % (64 << 10)
			buf, err := a.Reserve(ctx, size)
			if err != nil {
				errc <- err
				return
			}
			for j := range buf.Bytes() {
				buf.Bytes()[j] = byte(i + j)
			}
			if err := a.Post(size, transport.Tag{Op: 1, Sig: 7, Msg: uint32(i), Slice: uint32(i % 5)}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < n; i++ {
		buf, tag, err := b.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, transport.Tag{Op: 1, Sig: 7, Msg: uint32(i), Slice: uint32(i % 5)}, tag)
		size := (i * 997) % (64 << 10)
		require.Equal(t, size, buf.Len())
		want := make([]byte, size)
		for j := range want {
			want[j] = byte(i + j)
		}
		require.True(t, bytes.Equal(want, buf.Bytes()), "slice %d corrupted", i)
		require.NoError(t, b.Release())
	}
	require.NoError(t, <-errc)
}

func TestAllReduceOverTCP(t *testing.T) {
	link := algorithms.LinkModel{Latency: 10e-6, Bandwidth: 2e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 256 << 10}
	for _, c := range []struct {
		name string
		mod  func(int, *Options)
	}{
		{"smallslices", nil},
		// Slices over creditMin, paced by credits: the default window,
		// and the least one (Slots/2 + 1, a credit per slice), where a
		// schedule needing more room than credits leave would hang.
		{"credits", func(_ int, o *Options) { o.SlotSize = 200_003 }},
		{"leastwindow", func(_ int, o *Options) { o.SlotSize, o.Window = 200_003, 3 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			transporttest.AllReduceEveryAlgorithm(t, link, func(t *testing.T, n int) []transport.Endpoint {
				var out []transport.Endpoint
				for _, e := range endpoints(t, n, c.mod) {
					out = append(out, e)
				}
				return out
			})
		})
	}
}

func TestPeerDeathIsNamed(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, _ := connectPair(t, eps[0], eps[1], 0)
	got := make(chan error, 1)
	go func() {
		_, _, err := a.Wait(context.Background())
		got <- err
	}()
	eps[1].Close(errors.New("crashed"))
	err := <-got
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer)
	require.ErrorContains(t, err, "rank 1")
	_, err = a.Reserve(context.Background(), 10)
	if err == nil {
		err = a.Post(10, transport.Tag{})
		for i := 0; err == nil && i < 100; i++ { // the kernel notices the reset after a write or two
			if _, err = a.Reserve(context.Background(), 10); err == nil {
				err = a.Post(10, transport.Tag{})
			}
		}
	}
	require.Error(t, err)
}

// socketBuffers is the most the kernel may hold of one socket's data in
// flight: the largest send buffer plus the largest receive buffer it grows
// them to (the last figures of /proc/sys/net/ipv4/tcp_wmem and tcp_rmem),
// or 64 MiB where those cannot be read.
func socketBuffers(t *testing.T) int {
	total := 0
	for _, f := range []string{"/proc/sys/net/ipv4/tcp_wmem", "/proc/sys/net/ipv4/tcp_rmem"} {
		b, err := os.ReadFile(f)
		fields := strings.Fields(string(b))
		if err != nil || len(fields) != 3 {
			t.Logf("no %s (%v): assuming 64 MiB of socket buffers", f, err)
			return 64 << 20
		}
		n, err := strconv.Atoi(fields[2])
		require.NoError(t, err, f)
		total += n
	}
	return total
}

func TestContract(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	for _, c := range []struct {
		name   string
		nsocks int
		mod    func(r int, o *Options)
	}{
		{"default", DefaultNSocks, nil},
		// Slots larger than a socket's read buffer: payloads land in the
		// landing buffer, or straight in the caller's memory.
		{"onesocket", 1, func(_ int, o *Options) { o.NSocks = 1; o.SlotSize = 200_003 }},
		// Without credits: TCP's own flow control alone.
		{"nocredits", 1, func(_ int, o *Options) { o.NSocks = 1; o.SlotSize = 200_003; o.Window = -1 }},
		{"tls", 2, func(r int, o *Options) { withTLS(t, ca)(r, o); o.NSocks = 2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A sender runs Slots staged slices plus the kernel's buffers
			// ahead of its receiver, on each of its sockets.
			opts := transporttest.ContractOptions{Buffered: c.nsocks * socketBuffers(t)}
			transporttest.Contract(t, func(t *testing.T, n int) []transport.Endpoint {
				return transporttest.Endpoints(endpoints(t, n, c.mod))
			}, opts)
		})
	}
}

func TestWaitHonoursContext(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, _ := connectPair(t, eps[0], eps[1], 0)
	transporttest.WaitHonoursContext(t, a, 1)
}

func TestStrangersAtTheDataPort(t *testing.T) {
	eps := endpoints(t, 2, nil)
	addr := eps[1].o.Peers[1]
	for _, f := range []func(net.Conn){
		func(c net.Conn) {
			handshake.Client(c, []byte("wrong"), wire.PurposeData, func() (wire.FrameType, []byte) {
				s := wire.ConnSetup{From: 0, To: 1, NSocks: 4}
				return wire.FrameConnSetup, s.Append(nil)
			})
		},
		func(c net.Conn) { c.Write([]byte("garbage garbage garbage")) },
		func(c net.Conn) { c.Write([]byte(wire.Magic[:2])) },
		func(c net.Conn) {
			// Right secret, but a rank that may not dial (rank 1 dials 0's
			// listener only), and a bad socket count.
			handshake.Client(c, secret, wire.PurposeData, func() (wire.FrameType, []byte) {
				s := wire.ConnSetup{From: 1, To: 1, NSocks: 9}
				return wire.FrameConnSetup, s.Append(nil)
			})
			handshake.ReadFrame(c, 1024)
		},
	} {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		c.SetDeadline(time.Now().Add(time.Second))
		f(c)
		c.Close()
	}
	a, b := connectPair(t, eps[0], eps[1], 0)
	buf, err := a.Reserve(context.Background(), 3)
	require.NoError(t, err)
	copy(buf.Bytes(), "abc")
	require.NoError(t, a.Post(3, transport.Tag{Op: 9}))
	got, tag, err := b.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, "abc", string(got.Bytes()))
	require.Equal(t, uint64(9), tag.Op)
}

func TestMismatchedSocketCountsAreRefused(t *testing.T) {
	eps := endpoints(t, 2, func(r int, o *Options) { o.NSocks = 1 + r })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.ErrorContains(t, err, "this rank uses 2 sockets per connection")
}

func TestIPv6Loopback(t *testing.T) {
	ln0, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("skipping: no IPv6 loopback here (%v)", err)
	}
	ln1, err := net.Listen("tcp", "[::1]:0")
	require.NoError(t, err)
	addrs := []string{ln0.Addr().String(), ln1.Addr().String()}
	var eps []*Endpoint
	for r, ln := range []net.Listener{ln0, ln1} {
		ep, err := New(Options{Rank: r, NRanks: 2, Peers: addrs, Secret: secret, Listener: ln, Logger: quiet()})
		require.NoError(t, err)
		eps = append(eps, ep)
		t.Cleanup(func() { ep.Close(nil) })
	}
	a, b := connectPair(t, eps[0], eps[1], 0)
	buf, err := a.Reserve(context.Background(), 5)
	require.NoError(t, err)
	copy(buf.Bytes(), "hello")
	require.NoError(t, a.Post(5, transport.Tag{Op: 1}))
	got, _, err := b.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, "hello", string(got.Bytes()))
}

func TestCloseIsNotHeldUpByAStrangerMidHandshake(t *testing.T) {
	eps := endpoints(t, 2, nil)
	c, err := net.Dial("tcp", eps[1].o.Peers[1])
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool { return eps[1].acc.SettingUp() == 1 }, 5*time.Second, 5*time.Millisecond, "the stranger is authenticating")
	start := time.Now()
	eps[1].Close(errors.New("stop"))
	require.Less(t, time.Since(start), time.Second)
}

func TestAbortNoticeDuringSends(t *testing.T) {
	// An abort from another goroutine while the channel's goroutine keeps
	// sending: the race detector checks the notice and the writes do not
	// collide; the peer sees either data or the notice, never garbage.
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	stop := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			buf, err := a.Reserve(context.Background(), 4096)
			if err == nil {
				err = a.Post(buf.Len(), transport.Tag{Op: 1, Msg: uint32(i)})
			}
			if err != nil {
				sent <- err
				return
			}
			select {
			case <-stop:
				sent <- nil
				return
			default:
			}
		}
	}()
	go func() {
		for {
			_, _, err := b.Wait(context.Background())
			if err != nil {
				return
			}
			b.Release()
		}
	}()
	time.Sleep(20 * time.Millisecond) // let data flow; the test holds either way
	eps[0].Close(errors.New("operator stop"))
	close(stop)
	<-sent
}

// countingListener counts the sockets it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestSocketsSpreadOverNICs gives each rank a second listener (a second
// "interface", 127.0.0.2) and checks that a connection's sockets go to
// both of the peer's, in turn, and that slices still arrive in order.
func TestSocketsSpreadOverNICs(t *testing.T) {
	second := make([]*countingListener, 2)
	nics := make([][]string, 2)
	for r := range second {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("skipping: cannot listen on 127.0.0.2 (a second loopback address): %v", err)
		}
		second[r] = &countingListener{Listener: ln}
		nics[r] = []string{ln.Addr().String()}
	}
	var first [2]*countingListener
	eps := endpoints(t, 2, func(r int, o *Options) {
		first[r] = &countingListener{Listener: o.Listener}
		o.Listener, o.Listeners, o.PeerNICs, o.NSocks = first[r], []net.Listener{second[r]}, nics, 4
	})
	a, b := connectPair(t, eps[0], eps[1], 0)
	// Rank 0 dials rank 1: sockets 0 and 2 to its first address, 1 and 3
	// to its second, the control socket to its first.
	require.Equal(t, int32(3), first[1].n.Load())
	require.Equal(t, int32(2), second[1].n.Load())
	require.Zero(t, first[0].n.Load()+second[0].n.Load())
	ctx := context.Background()
	go func() {
		for i := range 20 {
			buf, err := a.Reserve(ctx, 1000)
			if err != nil {
				return
			}
			buf.Bytes()[0] = byte(i)
			if a.Post(1000, transport.Tag{Op: 1, Msg: uint32(i)}) != nil {
				return
			}
		}
	}()
	for i := range 20 {
		buf, tag, err := b.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, uint32(i), tag.Msg)
		require.Equal(t, byte(i), buf.Bytes()[0])
		require.NoError(t, b.Release())
	}
	_, err := New(Options{Rank: 0, NRanks: 2, Peers: []string{"a", "b"}, Listener: second[0], PeerNICs: [][]string{nil}})
	require.ErrorContains(t, err, "interface lists")
}

// TestUnreachableNICFallsBack: a peer's other interface that cannot be
// reached (nothing listens there) costs a socket nicDialTimeout, then it
// goes to the peer's first address; the connection works.
func TestUnreachableNICFallsBack(t *testing.T) {
	old := nicDialTimeout
	nicDialTimeout = 200 * time.Millisecond
	t.Cleanup(func() { nicDialTimeout = old })
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := dead.Addr().String()
	dead.Close() // refused from now on
	var first [2]*countingListener
	eps := endpoints(t, 2, func(r int, o *Options) {
		first[r] = &countingListener{Listener: o.Listener}
		o.Listener, o.PeerNICs, o.NSocks = first[r], [][]string{{deadAddr}, {deadAddr}}, 2
	})
	start := time.Now()
	a, b := connectPair(t, eps[0], eps[1], 0)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, int32(3), first[1].n.Load(), "both data sockets and the control socket on the first address")
	ctx := context.Background()
	go func() {
		if buf, err := a.Reserve(ctx, 10); err == nil {
			buf.Bytes()[0] = 42
			a.Post(10, transport.Tag{Op: 1})
		}
	}()
	buf, _, err := b.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, byte(42), buf.Bytes()[0])
	require.NoError(t, b.Release())
}

// TestWaitIntoLandsStraightInTheBuffer: WaitInto reads a slice's header
// and the start of its payload in the same system call, the payload
// straight into the caller's memory (headerSpill). Every size around the
// read buffer's and spillMin, on two sockets, arrives intact; a slice of
// another size is a mismatch naming its size, and an abort notice where a
// large slice was expected is the peer's abort with its reason, not a
// garbled payload.
func TestWaitIntoLandsStraightInTheBuffer(t *testing.T) {
	eps := endpoints(t, 2, func(_ int, o *Options) { o.NSocks = 2; o.SlotSize = 256 << 10 })
	a, b := connectPair(t, eps[0], eps[1], 0)
	ds, dr := a.(transport.DirectSender), b.(transport.DirectReceiver)
	ctx := context.Background()
	sizes := []int{spillMin - 1, spillMin, 5000, readBufSize - wire.SliceHeaderLen, readBufSize, readBufSize + 1, 200 << 10, 256 << 10, 1, 0}
	fill := func(i, n int) []byte {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*7 + j*13)
		}
		return p
	}
	fl := a.(transport.Flusher)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i, n := range sizes {
			if err := ds.PostFrom(ctx, memory.HostBuffer(fill(i, n)), transport.Tag{Op: 2, Msg: uint32(i)}); err != nil {
				return
			}
		}
		// A 4 KiB slice where 8 KiB is expected, and one more behind it.
		ds.PostFrom(ctx, memory.HostBuffer(fill(99, 4096)), transport.Tag{Op: 3})
		ds.PostFrom(ctx, memory.HostBuffer(fill(98, 4096)), transport.Tag{Op: 4})
		fl.Flush(ctx)
	}()
	for i, n := range sizes {
		dst := make([]byte, n)
		tag, got, err := dr.WaitInto(ctx, memory.HostBuffer(dst))
		require.NoError(t, err, "slice %d (%d bytes)", i, n)
		require.Equal(t, transport.Tag{Op: 2, Msg: uint32(i)}, tag)
		require.Equal(t, n, got)
		require.True(t, bytes.Equal(fill(i, n), dst), "slice %d (%d bytes) corrupted", i, n)
	}
	_, got, err := dr.WaitInto(ctx, memory.HostBuffer(make([]byte, 8192)))
	require.ErrorIs(t, err, transport.ErrSizeMismatch)
	require.Equal(t, 4096, got, "the mismatch names the size that came")
	<-sent

	// An abort notice where a large slice is expected, on a new pair.
	eps2 := endpoints(t, 2, nil)
	_, b2 := connectPair(t, eps2[0], eps2[1], 0)
	aborter := eps2[0]
	go func() {
		time.Sleep(10 * time.Millisecond) // the receiver is waiting
		aborter.Close(errors.New("operator stop"))
	}()
	_, _, err = b2.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(make([]byte, 32<<10)))
	var pa *transport.PeerAbortedError
	require.ErrorAs(t, err, &pa)
	require.ErrorContains(t, err, "operator stop")
}

// A small message sent straight from the caller's buffer, once the
// connection has warmed up, allocates nothing: the socket's queue starts
// over in its array when it empties (it used to drop the array, an
// allocation per message on the 8-byte collectives' path).
func TestSmallSendsDoNotAllocate(t *testing.T) {
	eps := endpoints(t, 2, nil)
	a, b := connectPair(t, eps[0], eps[1], 0)
	ds, dr := a.(transport.DirectSender), b.(transport.DirectReceiver)
	fl := a.(transport.Flusher)
	ctx := context.Background()
	src, dst := []byte("8 bytes!"), make([]byte, 8)
	msg := uint32(0)
	once := func() {
		msg++
		require.NoError(t, ds.PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1, Msg: msg}))
		require.NoError(t, fl.Flush(ctx))
		tag, n, err := dr.WaitInto(ctx, memory.HostBuffer(dst))
		require.NoError(t, err)
		require.Equal(t, transport.Tag{Op: 1, Msg: msg}, tag)
		require.Equal(t, 8, n)
	}
	for range 10 {
		once() // warm up: the queue's array, the read buffers
	}
	send := testing.AllocsPerRun(200, func() {
		msg++
		if err := ds.PostFrom(ctx, memory.HostBuffer(src), transport.Tag{Op: 1, Msg: msg}); err != nil {
			t.Fatal(err)
		}
		if err := fl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dr.WaitInto(ctx, memory.HostBuffer(dst)); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, send, "allocations per 8-byte message, sent and received")
	require.Equal(t, src, dst)
}
