//go:build linux

package netchaos

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor bounds every wait for packets in these tests: long enough for a
// loaded 2-core machine, short enough to fail rather than hang.
const waitFor = 20 * time.Second

var (
	addrA = netip.MustParseAddr("10.79.0.1")
	addrB = netip.MustParseAddr("10.79.0.2")
	nsSeq atomic.Int32
)

// link makes two network namespaces joined by a Link with imp, and removes
// all of it when the test ends. It skips the test where that cannot be
// done.
func link(t *testing.T, imp Impairment) (l *Link, nsA, nsB string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: TUN devices in network namespaces need root (CI runs as root)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: no TUN devices here: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2), which makes the namespaces, is not installed")
	}
	tag := fmt.Sprintf("nc%d-%d", os.Getpid()%100000, nsSeq.Add(1))
	nsA, nsB = tag+"a", tag+"b"
	for _, ns := range []string{nsA, nsB} {
		out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
		require.NoError(t, err, "ip netns add %s: %s", ns, out)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	l, err := New(End{Netns: nsA, Addr: addrA}, End{Netns: nsB, Addr: addrB}, imp)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, l.Close())
		require.NoError(t, l.Close(), "Close is idempotent")
	})
	return l, nsA, nsB
}

// in runs f with the calling thread in the namespace ns, for sockets that
// must live there.
func in(t *testing.T, ns string, f func() error) {
	t.Helper()
	require.NoError(t, inNetns(ns, f))
}

// udpPair returns a UDP socket in nsB bound to addrB and one in nsA
// connected to it.
func udpPair(t *testing.T, nsA, nsB string) (a, b *net.UDPConn) {
	t.Helper()
	in(t, nsB, func() (err error) {
		b, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrB, 0)))
		return err
	})
	t.Cleanup(func() { b.Close() })
	in(t, nsA, func() (err error) {
		a, err = net.DialUDP("udp4", nil, b.LocalAddr().(*net.UDPAddr))
		return err
	})
	t.Cleanup(func() { a.Close() })
	return a, b
}

// receiver counts the sequence numbers arriving at c in arrival order until
// c is closed at the end of the test.
type receiver struct {
	mu  sync.Mutex // guards got
	got []uint32
}

func receive(t *testing.T, c *net.UDPConn) *receiver {
	r := &receiver{}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if n == 4 {
				r.mu.Lock()
				r.got = append(r.got, binary.BigEndian.Uint32(buf))
				r.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return r
}

func (r *receiver) seqs() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.got...)
}

func send(t *testing.T, c *net.UDPConn, seq uint32) {
	_, err := c.Write(binary.BigEndian.AppendUint32(nil, seq))
	require.NoError(t, err)
}

func TestLinkTCPEcho(t *testing.T) {
	l, nsA, nsB := link(t, Impairment{})
	var wg sync.WaitGroup
	defer wg.Wait()
	var ln net.Listener
	in(t, nsB, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(addrB, 0).String())
		return err
	})
	defer ln.Close()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	})
	var c net.Conn
	in(t, nsA, func() (err error) {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), waitFor)
		return err
	})
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	// More than a window's worth, so that it takes many full-sized packets.
	msg := []byte(strings.Repeat("goccl over a TUN link\n", 20_000))
	wg.Go(func() { c.Write(msg) })
	got := make([]byte, len(msg))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
	require.Equal(t, "10.79.0.1", c.LocalAddr().(*net.TCPAddr).IP.String())

	s := l.Stats()
	t.Logf("a->b %v; b->a %v", s.AB, s.BA)
	require.Greater(t, s.AB.Passed, uint64(len(msg)/mtu), "the bytes went through the link")
	require.Positive(t, s.BA.Passed)
	require.Zero(t, s.Total().Dropped+s.Total().Reordered+s.Total().Failed)
}

func TestLinkDelay(t *testing.T) {
	for _, tc := range []struct {
		delay, jitter, minRTT time.Duration
	}{
		{20 * time.Millisecond, 0, 40 * time.Millisecond},
		{20 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("delay=%v/jitter=%v", tc.delay, tc.jitter), func(t *testing.T) {
			l, nsA, nsB := link(t, Impairment{Delay: tc.delay, Jitter: tc.jitter, Seed: 1})
			a, b := udpPair(t, nsA, nsB)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer b.Close()
			wg.Go(func() { // echo
				buf := make([]byte, 64)
				for {
					n, from, err := b.ReadFromUDP(buf)
					if err != nil {
						return
					}
					b.WriteToUDP(buf[:n], from)
				}
			})
			require.NoError(t, a.SetReadDeadline(time.Now().Add(waitFor)))
			buf := make([]byte, 64)
			const pings = 5
			for i := range uint32(pings) {
				start := time.Now()
				send(t, a, i)
				n, err := a.Read(buf)
				require.NoError(t, err)
				rtt := time.Since(start)
				require.Equal(t, i, binary.BigEndian.Uint32(buf[:n]))
				// Only a lower bound: a loaded machine may add any amount.
				require.GreaterOrEqual(t, rtt, tc.minRTT, "ping %d", i)
				t.Logf("ping %d: %v", i, rtt)
			}
			// The last reply can arrive before the link has counted it.
			want := Stats{AB: Counters{Read: pings, Passed: pings}, BA: Counters{Read: pings, Passed: pings}}
			require.Eventually(t, func() bool { return l.Stats() == want }, waitFor, time.Millisecond, "%+v", l.Stats())
		})
	}
}

func TestLinkLoss(t *testing.T) {
	const (
		n     = 2000
		batch = 50 // small enough that no socket buffer overflows
		loss  = 0.3
	)
	imp := Impairment{Loss: loss, Seed: 5}
	l, nsA, nsB := link(t, imp)
	a, b := udpPair(t, nsA, nsB)
	r := receive(t, b)
	settled := func(want int) bool {
		s := l.Stats().AB
		return s.Read == uint64(want) && s.Passed+s.Dropped == s.Read && len(r.seqs()) == int(s.Passed)
	}
	for sent := 0; sent < n; {
		for range batch {
			send(t, a, uint32(sent))
			sent++
		}
		require.Eventually(t, func() bool { return settled(sent) }, waitFor, time.Millisecond,
			"after %d packets: %v, %d received", sent, l.Stats().AB, len(r.seqs()))
	}
	s, got := l.Stats(), r.seqs()
	frac := 1 - float64(len(got))/n
	t.Logf("seed %d: %d of %d received, %.1f%% lost; a->b %v", imp.Seed, len(got), n, 100*frac, s.AB)
	require.InDelta(t, loss, frac, 0.05, "seed %d", imp.Seed)
	require.Equal(t, Counters{Read: n, Passed: uint64(len(got)), Dropped: uint64(n - len(got))}, s.AB)
	require.Zero(t, s.BA.Read, "nothing came back")
	seen := map[uint32]bool{}
	for _, q := range got {
		require.False(t, seen[q], "packet %d arrived twice", q)
		seen[q] = true
	}
}

func TestLinkReorder(t *testing.T) {
	const n = 200
	for _, tc := range []struct {
		reorder float64
		want    string // "in order" or "reordered"
	}{{0, "in order"}, {0.5, "reordered"}} {
		t.Run(fmt.Sprintf("reorder=%g", tc.reorder), func(t *testing.T) {
			imp := Impairment{Delay: 10 * time.Millisecond, Reorder: tc.reorder, Seed: 9}
			l, nsA, nsB := link(t, imp)
			a, b := udpPair(t, nsA, nsB)
			r := receive(t, b)
			for i := range uint32(n) {
				send(t, a, i)
			}
			require.Eventually(t, func() bool { return len(r.seqs()) == n && l.Stats().AB.Passed == n }, waitFor, time.Millisecond,
				"%d of %d arrived; a->b %v", len(r.seqs()), n, l.Stats().AB)
			late := 0 // packets that arrived after one sent later
			var top uint32
			for i, q := range r.seqs() {
				if i > 0 && q < top {
					late++
				}
				top = max(top, q)
			}
			s := l.Stats().AB
			t.Logf("seed %d: %d of %d arrived after a later packet; a->b %v", imp.Seed, late, n, s)
			if tc.want == "in order" {
				require.Zero(t, late, "a fixed delay keeps the order")
				require.Zero(t, s.Reordered)
				return
			}
			require.Positive(t, late, "some packets overtook others")
			require.InDelta(t, tc.reorder*n, float64(s.Reordered), 0.15*n, "seed %d", imp.Seed)
		})
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b End
		imp  Impairment
		want string
	}{
		{"bad-impairment", End{Addr: addrA}, End{Addr: addrB}, Impairment{Loss: 2}, "Impairment.Loss = 2"},
		{"ipv6", End{Addr: netip.MustParseAddr("fd00::1")}, End{Addr: addrB}, Impairment{}, "want an IPv4 address"},
		{"no-address", End{Addr: addrA}, End{}, Impairment{}, "want an IPv4 address"},
		{"same-address", End{Addr: addrA}, End{Addr: addrA}, Impairment{}, "both ends have address 10.79.0.1"},
		{"no-namespace", End{Netns: "goccl-no-such-netns", Addr: addrA}, End{Netns: "goccl-no-such-netns", Addr: addrB}, Impairment{},
			`network namespace "/run/netns/goccl-no-such-netns"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(tc.a, tc.b, tc.imp)
			require.Nil(t, l)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
