package handshake

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAcceptLoopAdmission: Drop closes the connection and goes on, Serve
// hands it over, Stop closes it and ends the loop.
func TestAcceptLoopAdmission(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	answers := []Admission{Drop, Serve, Stop}
	served := make(chan net.Conn, 3)
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		AcceptLoop(ln, func(err error) { t.Errorf("unexpected accept error: %v", err) },
			func(net.Conn) Admission { a := answers[n]; n++; return a },
			func(c net.Conn) { served <- c })
	}()
	closedByPeer := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil
	}
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		if answers[i] == Serve {
			s := <-served
			s.Close()
		}
		require.True(t, closedByPeer(c), "connection %d", i)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not end the loop")
	}
	require.Len(t, served, 0)
}

// addrConn is a connection from a given TCP address that records its
// closing.
type addrConn struct {
	net.Conn
	addr   net.Addr
	closed bool
}

func (c *addrConn) RemoteAddr() net.Addr { return c.addr }
func (c *addrConn) Close() error         { c.closed = true; return nil }

func from(ip string, port int) *addrConn {
	return &addrConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
}

// A full table makes room for a newcomer by closing the oldest pending
// connection, of the newcomer's own source once that source holds its
// share, of all otherwise: a stranger's silent connections can no longer
// keep a job's ranks out (issue 19).
func TestAdmit(t *testing.T) {
	var p Pending
	first := from("10.0.0.1", 1)
	require.Equal(t, Stop, Admit(true, &p, first))
	require.Zero(t, p.Len(), "nothing filed while closing")
	require.Equal(t, Serve, Admit(false, &p, first))
	// Fill the table: four sources of MaxPending/4 each.
	var all []*addrConn
	all = append(all, first)
	for i := 1; i < MaxPending; i++ {
		c := from(fmt.Sprintf("10.0.0.%d", 1+i%4), i)
		require.Equal(t, Serve, Admit(false, &p, c))
		all = append(all, c)
	}
	require.Equal(t, MaxPending, p.Len())
	for _, c := range all {
		require.False(t, c.closed)
	}
	// A newcomer from a fifth source: the oldest of all goes.
	n := from("10.0.0.99", 1)
	require.Equal(t, Serve, Admit(false, &p, n))
	require.True(t, first.closed, "the oldest made room")
	require.False(t, p.Has(first))
	require.True(t, p.Has(n))
	require.Equal(t, MaxPending, p.Len())

	// One source at its share: its own oldest makes room, nobody else's.
	var q Pending
	var mine []*addrConn
	other := from("10.1.1.1", 1)
	Admit(false, &q, other)
	for i := range MaxPendingPerSource {
		c := from("10.6.6.6", i)
		Admit(false, &q, c)
		mine = append(mine, c)
	}
	again := from("10.6.6.6", 999)
	require.Equal(t, Serve, Admit(false, &q, again))
	require.True(t, mine[0].closed, "the source's oldest")
	require.False(t, other.closed, "not another source's")
	require.Equal(t, MaxPendingPerSource+1, q.Len())
	q.Remove(again)
	require.False(t, q.Has(again))

	// IPv6: one /64 is one source, whatever addresses in it are used.
	var v6 Pending
	var in64 []*addrConn
	for i := range MaxPendingPerSource {
		c := from(fmt.Sprintf("2001:db8:1:2::%x", i+1), i)
		Admit(false, &v6, c)
		in64 = append(in64, c)
	}
	Admit(false, &v6, from("2001:db8:1:2:ffff::1", 1))
	require.True(t, in64[0].closed, "the /64's oldest made room")
	Admit(false, &v6, from("2001:db8:1:3::1", 1))
	require.False(t, in64[1].closed, "another /64 is another source")

	// Unix sockets say nothing of their sender: only the overall cap.
	var u Pending
	for range MaxPendingPerSource + 5 {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		require.Nil(t, u.Admit(a))
	}
	require.Equal(t, MaxPendingPerSource+5, u.Len())
}

func TestDropLogSamples(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var d DropLog
	for range 250 {
		d.Log(log, "dropped", "rank", 3)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var counts []string
	for _, l := range lines {
		require.Contains(t, l, "rank=3")
		_, n, _ := strings.Cut(l, `"dropped so far"=`)
		counts = append(counts, n)
	}
	require.Equal(t, []string{"1", "2", "3", "4", "5", "100", "200"}, counts)
}
