//go:build linux

package shm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

// The stranger is this test binary run again as another user, which
// TestMain hands to stranger.
const (
	strangerEnv     = "GOCCL_SHM_TEST_STRANGER"      // its role: "hold", "listen" or "open"
	strangerAddrEnv = "GOCCL_SHM_TEST_STRANGER_ADDR" // the listener it holds
	strangerUID     = 65534                          // nobody
	// strangerHolds is more connections than may set up at once.
	strangerHolds = handshake.MaxPending + 16
	// patience bounds every wait in these tests.
	patience = 5 * time.Second
	// quickly is how soon the listener must close a refused connection:
	// refused for its credentials, it goes at once, well before any
	// timeout would end a silent connection anyway (setupTimeout, or the
	// acceptor's shorter one for the hello).
	quickly = 500 * time.Millisecond
)

// stranger plays role and returns the exit code; it reports on stdout.
func stranger(role, addr string) int {
	switch role {
	case "hold":
		// Connect many times and say nothing, as a process out to hold
		// all the places of connections being set up would, and count
		// those the listener closes within quickly of their connect;
		// report once the test has moved its data (stdin closes).
		var closed atomic.Int32
		var wg sync.WaitGroup
		for range strangerHolds {
			c, err := net.Dial("unix", addr)
			if err != nil {
				fmt.Println("dial:", err)
				return 1
			}
			c.SetReadDeadline(time.Now().Add(quickly))
			wg.Go(func() {
				if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
					closed.Add(1)
				}
			})
		}
		fmt.Println("held")
		io.Copy(io.Discard, os.Stdin)
		wg.Wait()
		fmt.Printf("closed %d of %d\n", closed.Load(), strangerHolds)
		return 0
	case "listen":
		// Listen like a rank, knowing the job's secret, and see whether
		// a rank hands over a segment.
		ln, err := Listen()
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		fmt.Println(ln.Addr())
		ln.SetDeadline(time.Now().Add(patience))
		c, err := ln.AcceptUnix()
		if err != nil {
			fmt.Println("accept:", err)
			return 1
		}
		c.SetDeadline(time.Now().Add(patience))
		_, _, payload, err := handshake.Server(c, secret, wire.PurposeShm, 64)
		if err == nil {
			err = handshake.WriteFrame(c, wire.FrameConnSetup, payload)
		}
		if err != nil {
			fmt.Println("handshake:", err)
			return 1
		}
		fd, err := readWithFD(c, make([]byte, segMsgLen))
		if err != nil {
			fmt.Println("no descriptor:", err)
			return 0
		}
		unix.Close(fd)
		fmt.Println("got a descriptor")
		handshake.WriteFrame(c, wire.FrameConnSetup, nil) // as if mapped
		return 0
	}
	if role == "open" {
		// Open an offered board through /proc (addr is its path).
		fd, err := unix.Open(addr, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Println("refused:", err)
			return 0
		}
		unix.Close(fd)
		fmt.Println("opened")
		return 0
	}
	fmt.Println("no such role:", role)
	return 1
}

// startStranger runs the stranger as uid 65534 and returns its lines of
// output and its stdin. It is gone when the test ends.
func startStranger(t *testing.T, role, addr string) (<-chan string, io.WriteCloser) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs a process as another user (uid 65534) against the endpoints")
	}
	// /proc/self/exe: the test binary's own directory is private to root,
	// but the kernel follows this link without looking up the path.
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), strangerEnv+"="+role, strangerAddrEnv+"="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: strangerUID, Gid: strangerUID},
		Pdeathsig:  syscall.SIGKILL,
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines, done := make(chan string, 8), make(chan struct{})
	go func() {
		defer close(done)
		for sc := bufio.NewScanner(stdout); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(patience):
			cmd.Process.Kill()
			<-done
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("the stranger: %v; stderr: %s", err, stderr.String())
		}
	})
	return lines, stdin
}

func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(patience):
		t.Fatal("the stranger said nothing")
		return ""
	}
}

// syncBuffer is a log destination that endpoints' goroutines may share.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAnotherUsersConnectionsAreClosed: a process of another user that
// connects many times and holds its connections open silently does not
// hold up the ranks (issue 19, finding 4): the listener closes each of its
// connections at once, and the ranks connect and move data meanwhile.
func TestAnotherUsersConnectionsAreClosed(t *testing.T) {
	var logs syncBuffer
	eps := endpoints(t, 2, func(_ int, o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	lines, stdin := startStranger(t, "hold", eps[1].o.Peers[1])
	require.Equal(t, "held", nextLine(t, lines))

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var a, b transport.Conn
	var aerr, berr error
	var wg sync.WaitGroup
	wg.Go(func() { a, aerr = eps[0].Connect(ctx, 1, 0) })
	wg.Go(func() { b, berr = eps[1].Connect(ctx, 0, 0) })
	wg.Wait()
	if aerr == nil && berr == nil {
		stream(t, a, b, 50, 64<<10)
	}
	stdin.Close()
	require.Equal(t, fmt.Sprintf("closed %d of %d", strangerHolds, strangerHolds), nextLine(t, lines),
		"the listener closes uid %d's connections within %v", strangerUID, quickly)
	require.NoError(t, aerr, "rank 0 connects while the stranger holds its connections")
	require.NoError(t, berr, "rank 1 connects while the stranger holds its connections")
	require.Contains(t, logs.String(), fmt.Sprintf("runs as uid %d", strangerUID), "the drops say why")
}

// TestAnotherUsersListenerGetsNoSegment: a rank that dials a listener of
// another user (one that took a gone rank's name, say, and even knows the
// secret) refuses it before it hands over the segment, and says why.
func TestAnotherUsersListenerGetsNoSegment(t *testing.T) {
	lines, _ := startStranger(t, "listen", "")
	addr := nextLine(t, lines)
	require.True(t, strings.HasPrefix(addr, "@goccl-"), "the stranger's listener: %s", addr)
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.Peers = slices.Clone(o.Peers)
		if r == 0 {
			o.Peers[1] = addr
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.ErrorContains(t, err, fmt.Sprintf("runs as uid %d", strangerUID))
	require.NotErrorIs(t, err, context.DeadlineExceeded, "refused at once, not retried")
	got := nextLine(t, lines)
	require.True(t, strings.HasPrefix(got, "no descriptor"), "the stranger: %s", got)
}

// TestAllowUIDsAdmitsAnotherUser: a user in Options.AllowUIDs is one of
// ours.
func TestAllowUIDsAdmitsAnotherUser(t *testing.T) {
	lines, _ := startStranger(t, "listen", "")
	addr := nextLine(t, lines)
	eps := endpoints(t, 2, func(r int, o *Options) {
		o.Peers = slices.Clone(o.Peers)
		o.AllowUIDs = []int{strangerUID}
		if r == 0 {
			o.Peers[1] = addr
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := eps[0].Connect(ctx, 1, 0)
	require.NoError(t, err)
	require.Equal(t, "got a descriptor", nextLine(t, lines))
}

func TestAllowUIDsMustBeUIDs(t *testing.T) {
	ln, err := Listen()
	require.NoError(t, err)
	defer ln.Close()
	_, err = New(Options{Rank: 0, NRanks: 1, Peers: []string{""}, Listener: ln, AllowUIDs: []int{1000, -1}})
	require.ErrorContains(t, err, "AllowUIDs holds -1, which is not a uid")
}
