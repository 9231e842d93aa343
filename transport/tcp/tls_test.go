//go:build unix

package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/transporttest"
)

// withTLS gives every endpoint a certificate from ca.
func withTLS(t *testing.T, ca *tlstest.CA) func(r int, o *Options) {
	cfgs := map[int]*tls.Config{}
	var mu sync.Mutex
	return func(r int, o *Options) {
		mu.Lock()
		defer mu.Unlock()
		if cfgs[r] == nil {
			cfgs[r] = tlsrec.NewConfig(ca.Issue(t, "rank"), ca.Pool)
		}
		o.TLS = cfgs[r]
	}
}

func TestTLSSlicesArriveInOrder(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	eps := endpoints(t, 2, func(r int, o *Options) { withTLS(t, ca)(r, o); o.NSocks = 3 })
	a, b := connectPair(t, eps[0], eps[1], 0)
	sendAndCheck(t, a, b, 200)
	for _, s := range a.(*conn).socks {
		require.NotNil(t, s.tls, "every socket runs TLS")
		require.NotZero(t, s.tls.Stats().Sealed)
	}
}

// sendAndCheck sends n slices of varied sizes from a to b, each direct
// from a's memory or through a staging slot in turn, and checks them
// byte for byte, received in place or into b's memory in turn.
func sendAndCheck(t *testing.T, a, b transport.Conn, n int) {
	ctx := context.Background()
	size := func(i int) int { return (i * 997) % (64 << 10) }
	fill := func(p []byte, i int) {
		for j := range p {
			p[j] = byte(i + j)
		}
	}
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			var err error
			if i%2 == 0 {
				var buf = make([]byte, size(i))
				fill(buf, i)
				err = a.(transport.DirectSender).PostFrom(ctx, memory.HostBuffer(buf), transport.Tag{Op: 1, Msg: uint32(i)})
				if err == nil {
					err = a.(transport.Flusher).Flush(ctx) // buf must stay valid until written
				}
			} else {
				buf, rerr := a.Reserve(ctx, size(i))
				if rerr == nil {
					fill(buf.Bytes(), i)
					err = a.Post(size(i), transport.Tag{Op: 1, Msg: uint32(i)})
				} else {
					err = rerr
				}
			}
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < n; i++ {
		want := make([]byte, size(i))
		fill(want, i)
		if i%2 == 0 {
			got := make([]byte, size(i))
			tag, m, err := b.(transport.DirectReceiver).WaitInto(ctx, memory.HostBuffer(got))
			require.NoError(t, err)
			require.Equal(t, size(i), m)
			require.Equal(t, uint32(i), tag.Msg)
			require.True(t, bytes.Equal(want, got), "slice %d corrupted", i)
			continue
		}
		buf, tag, err := b.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, uint32(i), tag.Msg)
		require.True(t, bytes.Equal(want, buf.Bytes()), "slice %d corrupted", i)
		require.NoError(t, b.Release())
	}
	require.NoError(t, <-errc)
}

func TestTLSAllReduce(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	link := algorithms.LinkModel{Latency: 10e-6, Bandwidth: 2e9, ReduceRate: 6e9, MaxChannels: 2, ChannelBytes: 1 << 20, ChunkBytes: 256 << 10}
	transporttest.AllReduceEveryAlgorithm(t, link, func(t *testing.T, n int) []transport.Endpoint {
		var out []transport.Endpoint
		for _, e := range endpoints(t, n, withTLS(t, ca)) {
			out = append(out, e)
		}
		return out
	})
}

// spy is a TCP relay that keeps a copy of every byte it forwards.
type spy struct {
	ln   net.Listener
	mu   sync.Mutex
	seen bytes.Buffer
}

func newSpy(t *testing.T, to string) *spy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &spy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			t.Cleanup(func() { in.Close(); out.Close() })
			go io.Copy(in, out)
			go io.Copy(io.MultiWriter(out, s), in)
		}
	}()
	return s
}

func (s *spy) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen.Write(p)
}

func (s *spy) contains(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Contains(s.seen.Bytes(), b)
}

// TestTLSHidesTheData relays rank 0's sockets to rank 1 through a spy:
// without TLS the spy sees the payload, with TLS it must not.
func TestTLSHidesTheData(t *testing.T) {
	secretData := []byte("the model's weights, which nobody on the wire may read")
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[useTLS], func(t *testing.T) {
			ca := tlstest.NewCA(t, "job")
			var sp *spy
			eps := endpoints(t, 2, func(r int, o *Options) {
				if useTLS {
					withTLS(t, ca)(r, o)
				}
				if r == 0 { // rank 0 dials rank 1 through the spy
					sp = newSpy(t, o.Peers[1])
					o.Peers = []string{o.Peers[0], sp.ln.Addr().String()}
				}
			})
			a, b := connectPair(t, eps[0], eps[1], 0)
			for i := 0; i < 8; i++ { // one slice per socket and then some
				buf, err := a.Reserve(context.Background(), len(secretData))
				require.NoError(t, err)
				copy(buf.Bytes(), secretData)
				require.NoError(t, a.Post(len(secretData), transport.Tag{Op: 3}))
				got, _, err := b.Wait(context.Background())
				require.NoError(t, err)
				require.Equal(t, secretData, got.Bytes())
				require.NoError(t, b.Release())
			}
			require.Equal(t, !useTLS, sp.contains(secretData))
		})
	}
}

func TestTLSRefusesPeersOfAnotherCA(t *testing.T) {
	ca, other := tlstest.NewCA(t, "job"), tlstest.NewCA(t, "stranger")
	for _, c := range []struct {
		name             string
		dialer, acceptor *tls.Config // ranks 0 and 1
		want             string
	}{
		// Rank 0 refuses rank 1's certificate during its handshake.
		{"the dialer refuses", tlsrec.NewConfig(ca.Issue(t, "rank0"), ca.Pool), tlsrec.NewConfig(other.Issue(t, "rank1"), ca.Pool),
			"signed by unknown authority"},
		// Rank 1 refuses rank 0's (which rank 0 does not even offer, as
		// rank 1 asks for another CA's): in TLS 1.3 rank 0's handshake has
		// finished by then, and it hears of it in an alert.
		{"the acceptor refuses", tlsrec.NewConfig(other.Issue(t, "rank0"), ca.Pool), tlsrec.NewConfig(ca.Issue(t, "rank1"), ca.Pool),
			"certificate required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			eps := endpoints(t, 2, func(r int, o *Options) { o.TLS = []*tls.Config{c.dialer, c.acceptor}[r] })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			_, err := eps[0].Connect(ctx, 1, 0)
			require.ErrorContains(t, err, c.want)
			require.Less(t, time.Since(start), 3*time.Second, "a refused certificate is not retried until the timeout")
		})
	}
}

func TestTLSOnOneSideOnlyIsRefused(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	for _, tlsRank := range []int{0, 1} {
		eps := endpoints(t, 2, func(r int, o *Options) {
			if r == tlsRank {
				withTLS(t, ca)(r, o)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := eps[0].Connect(ctx, 1, 0)
		cancel()
		require.ErrorContains(t, err, "uses TLS and rank")
		require.ErrorContains(t, err, "GOCCL_TLS_CERT")
	}
}

func TestTLSAbortNoticeNamesTheCause(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	eps := endpoints(t, 2, withTLS(t, ca))
	a, _ := connectPair(t, eps[0], eps[1], 0)
	got := make(chan error, 1)
	go func() {
		_, _, err := a.Wait(context.Background())
		got <- err
	}()
	eps[1].Close(errors.New("crashed in the optimizer"))
	err := <-got
	var ab *transport.PeerAbortedError
	require.ErrorAs(t, err, &ab, "the notice went out sealed and was opened: %v", err)
	require.ErrorContains(t, err, "crashed in the optimizer")
}

// TestTLSGracefulCloseEndsWithCloseNotify checks that a rank that closes
// gracefully ends every TLS socket with close_notify after its notice
// (RFC 8446 §6.1), and that the peer reads that end as the close it is.
func TestTLSGracefulCloseEndsWithCloseNotify(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	eps := endpoints(t, 2, func(r int, o *Options) { withTLS(t, ca)(r, o); o.NSocks = 2 })
	a, _ := connectPair(t, eps[0], eps[1], 0)
	require.NoError(t, eps[1].Close(nil))
	// The first Wait reads the notice; the second the end of the stream
	// after it, which must read as the same graceful close.
	for i := range 2 {
		_, _, err := a.Wait(context.Background())
		require.ErrorIs(t, err, transport.ErrPeerClosed, "wait %d", i)
	}
	for i, s := range a.(*conn).socks {
		require.NoError(t, readToEnd(t, s), "socket %d ends with close_notify, not a bare end of file", i)
	}
}

// TestTLSCutConnectionIsALostConnection cuts a TLS socket under rank 1
// (a FIN with no close_notify, as anyone on the path could send): rank 0
// must report a lost connection, not a graceful close.
func TestTLSCutConnectionIsALostConnection(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	eps := endpoints(t, 2, withTLS(t, ca))
	a, b := connectPair(t, eps[0], eps[1], 0)
	require.NoError(t, unix.Shutdown(b.(*conn).socks[0].fd, unix.SHUT_WR))
	_, _, err := a.Wait(context.Background())
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer)
	require.ErrorIs(t, err, tlsrec.ErrTruncated)
	require.ErrorContains(t, err, "connection lost")
	require.NotErrorIs(t, err, transport.ErrPeerClosed)
}

// readToEnd reads and drops what s has until its stream ends, and
// returns what it ended with: nil for a clean end.
func readToEnd(t *testing.T, s *sock) error {
	t.Helper()
	b := make([]byte, 4096)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, err := s.readNB(b)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			unix.Poll([]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}, 100)
		case err != nil:
			return err
		case n == 0:
			return nil
		}
	}
	t.Fatal("the stream did not end")
	return nil
}

// A relay between two ranks that holds a certificate of the job's CA
// passes goccl's handshake on unchanged and runs TLS with each rank on its
// own. It read and altered the data stream before (issue 19, finding 1);
// now each rank's proof covers its own TLS session, and the connection
// fails with the channel binding's error.
func TestTLSRelayIsRefused(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	var relay *tlstest.Relay
	eps := endpoints(t, 2, func(r int, o *Options) {
		withTLS(t, ca)(r, o)
		if r == 0 {
			// Rank 0 dials rank 1 through the relay.
			relay = tlstest.NewRelay(t, o.Peers[1], tlsrec.NewConfig(ca.Issue(t, "relay"), ca.Pool), plainSetup)
			o.Peers = []string{o.Peers[0], relay.Addr}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := eps[1].Connect(ctx, 0, 0)
		errc <- err
	}()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.Error(t, err)
	require.ErrorIs(t, err, handshake.ErrTLSBinding)
	cancel()
	<-errc
	// What may cross is the ends' binding proofs (32 bytes each, the
	// accepting end's first), which the relay copies before the dialer
	// refuses them; no slice, nor anything else, follows.
	require.LessOrEqual(t, relay.Relayed.Load(), int64(2*32), "nothing but the binding proofs crossed the relay")
}

// plainSetup passes the handshake and setup that precede TLS on a data
// socket from dialer to target, frame by frame, unchanged.
func plainSetup(dialer, target net.Conn) error {
	var h wire.Hello
	hello := make([]byte, h.Len())
	if _, err := io.ReadFull(dialer, hello); err != nil {
		return err
	}
	if _, err := target.Write(hello); err != nil {
		return err
	}
	move := func(from, to net.Conn) error {
		typ, p, err := handshake.ReadFrame(from, wire.MaxFrame)
		if err != nil {
			return err
		}
		return handshake.WriteFrame(to, typ, p)
	}
	for _, step := range []struct{ from, to net.Conn }{
		{target, dialer}, // challenge
		{dialer, target}, // response
		{dialer, target}, // the first frame: the setup
		{target, dialer}, // its acknowledgement
	} {
		if err := move(step.from, step.to); err != nil {
			return err
		}
	}
	return nil
}

// An authenticated peer that asks for a channel no communicator uses is
// refused (issue 19, finding 10): connections cannot be set up without
// bound.
func TestUnusedChannelsAreRefused(t *testing.T) {
	eps := endpoints(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ch := range []int{transport.MaxChannel + 1, 1 << 20} {
		s := wire.ConnSetup{From: 0, To: 1, Channel: uint32(ch), NSocks: uint16(eps[0].o.NSocks)}
		_, err := eps[0].dialer.Dial(ctx, eps[0].o.Peers[1], s, nil)
		require.ErrorContains(t, err, fmt.Sprintf("no channel %d here", ch))
	}
}
