package handshake

import (
	"bytes"
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

func TestAdmit(t *testing.T) {
	pending := map[net.Conn]struct{}{}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	require.Equal(t, Stop, Admit(true, pending, a))
	require.Empty(t, pending, "nothing filed while closing")
	require.Equal(t, Serve, Admit(false, pending, a))
	require.Contains(t, pending, a)
	for len(pending) < MaxPending {
		c, d := net.Pipe()
		defer c.Close()
		defer d.Close()
		pending[c] = struct{}{}
	}
	require.Equal(t, Drop, Admit(false, pending, b))
	require.NotContains(t, pending, b)
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
