package connsetup

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func acceptor(t *testing.T, check func(wire.ConnSetup) error, serve func(net.Conn, wire.ConnSetup) bool) (*Acceptor, string) {
	return start(t, &Acceptor{Check: check, Serve: serve})
}

// start starts a, given the test's name, secret, purpose and timeout, on a
// loopback listener, until the test ends.
func start(t *testing.T, a *Acceptor) (*Acceptor, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a.Name, a.Secret, a.Purpose, a.Timeout = "test", secret, wire.PurposeData, 2*time.Second
	a.Start(ln)
	t.Cleanup(a.Close)
	return a, ln.Addr().String()
}

func TestDialAcceptThen(t *testing.T) {
	got := make(chan wire.ConnSetup, 1)
	_, addr := acceptor(t, func(wire.ConnSetup) error { return nil }, func(c net.Conn, s wire.ConnSetup) bool {
		got <- s
		c.Write([]byte("x")) // what a transport says after the ack
		return false
	})
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: 2 * time.Second}
	s := wire.ConnSetup{From: 1, To: 2, Channel: 3, NSocks: 1}
	var after []byte
	c, err := d.Dial(context.Background(), addr, s, func(c net.Conn) error {
		after = make([]byte, 1)
		_, err := c.Read(after)
		return err
	})
	require.NoError(t, err)
	c.Close()
	require.Equal(t, s, <-got)
	require.Equal(t, "x", string(after))
}

func TestDialRetriesUntilTheListenerIsUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens yet
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return
		}
		a := &Acceptor{Name: "test", Secret: secret, Purpose: wire.PurposeData, Timeout: 2 * time.Second,
			Check: func(wire.ConnSetup) error { return nil }, Serve: func(net.Conn, wire.ConnSetup) bool { return false }}
		a.Start(ln)
		t.Cleanup(a.Close)
	}()
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, addr, wire.ConnSetup{}, nil)
	require.NoError(t, err)
	c.Close()
}

func TestRefusalsAndWrongSecretsEndTheRetries(t *testing.T) {
	served := atomic.Int32{}
	_, addr := acceptor(t, func(s wire.ConnSetup) error {
		if s.Channel == 9 {
			return errors.New("no channel 9 here")
		}
		return nil
	}, func(net.Conn, wire.ConnSetup) bool { served.Add(1); return false })
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: time.Second}
	start := time.Now()
	_, err := d.Dial(context.Background(), addr, wire.ConnSetup{Channel: 9}, nil)
	var rej *handshake.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Contains(t, rej.Reason, "no channel 9 here")
	d.Secret = []byte("another job's secret, 32 bytes..")
	_, err = d.Dial(context.Background(), addr, wire.ConnSetup{}, nil)
	require.ErrorIs(t, err, handshake.ErrAuth)
	d.Secret = secret
	_, err = d.Dial(context.Background(), addr, wire.ConnSetup{}, func(net.Conn) error { return Permanent(errors.New("bad certificate")) })
	require.ErrorContains(t, err, "bad certificate")
	require.Less(t, time.Since(start), time.Second, "none of these is retried")
	// Serve runs on the acceptor's side, after the acknowledgement.
	require.Eventually(t, func() bool { return served.Load() == 1 }, 2*time.Second, time.Millisecond, "the last reaches Serve")
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, int32(1), served.Load(), "only the last reached Serve")
}

func TestDialEndsWithItsContextAndItsEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = d.Dial(ctx, addr, wire.ConnSetup{}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	done := make(chan struct{})
	close(done)
	d.Done = done
	_, err = d.Dial(context.Background(), addr, wire.ConnSetup{}, nil)
	require.ErrorIs(t, err, transport.ErrClosed)
}

func TestStrangersAreDroppedAndCloseDoesNotWaitForThem(t *testing.T) {
	a, addr := acceptor(t, func(wire.ConnSetup) error { return nil }, func(net.Conn, wire.ConnSetup) bool { return false })
	c, err := net.Dial("tcp", addr) // connects, then says nothing
	require.NoError(t, err)
	defer c.Close()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	a.Close()
	require.Less(t, time.Since(start), time.Second)
}

func TestPending(t *testing.T) {
	var p Pending[int]
	k := Key{Peer: 1, Ch: 0}
	require.False(t, p.Has(k))
	require.True(t, p.Deliver(k, 7))
	require.True(t, p.Has(k))
	require.False(t, p.Deliver(k, 8), "one per key")
	v, err := p.Await(context.Background(), k, nil)
	require.NoError(t, err)
	require.Equal(t, 7, v)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = p.Await(ctx, Key{Peer: 2}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "waiting for rank 2")
	require.True(t, p.Deliver(Key{Peer: 3}, 9))
	require.Equal(t, []int{9}, p.Close(), "delivered, never collected")
	require.False(t, p.Deliver(Key{Peer: 4}, 1), "closed")
}

// A stranger that answers every dial with a refusal, before any proof,
// neither ends the retries nor gets its text printed raw (issue 19): the
// dial goes on until its context ends, and the error quotes the text.
func TestUnprovenRefusalsAreRetriedAndQuoted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var answered atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			answered.Add(1)
			handshake.Reject(c, "go away\x1b[2J\x1b[31m")
			c.Close()
		}
	}()
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = d.Dial(ctx, ln.Addr().String(), wire.ConnSetup{From: 1, To: 2}, nil)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 650*time.Millisecond, "retried until the context ended")
	require.Greater(t, answered.Load(), int32(1), "more than one attempt")
	require.Contains(t, err.Error(), `"go away\x1b[2J\x1b[31m"`, "the text, quoted")
	require.NotContains(t, err.Error(), "\x1b", "no raw escape sequence")
	var rej *handshake.RejectedError
	require.ErrorAs(t, err, &rej)
	require.True(t, rej.Unproven)
}

// 144 silent connections from a stranger, held open at a rank's data
// port, do not keep a peer out (issue 19: the first all-reduce timed out).
func TestSilentFloodDoesNotKeepPeersOut(t *testing.T) {
	served := make(chan struct{}, 1)
	_, addr := acceptor(t, func(wire.ConnSetup) error { return nil }, func(c net.Conn, s wire.ConnSetup) bool {
		served <- struct{}{}
		return false
	})
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 144 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		flood = append(flood, c)
	}
	d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, addr, wire.ConnSetup{From: 1, To: 2, NSocks: 1}, nil)
	require.NoError(t, err)
	c.Close()
	<-served
}

// A connection acknowledged and still in Serve when the Connect waiting
// for it gives up (the dialer sent on it and left, and the root's notice
// cut the wait short) is still collected: Await with an ended context
// waits for Serve. One that Serve drops is reported missing once it has.
func TestAwaitCollectsAConnectionStillBeingSetUp(t *testing.T) {
	for _, keep := range []bool{true, false} {
		var p Pending[net.Conn]
		gate := make(chan struct{})
		served := make(chan struct{})
		_, addr := start(t, &Acceptor{Arriving: &p,
			Check: func(wire.ConnSetup) error { return nil },
			Serve: func(c net.Conn, s wire.ConnSetup) bool {
				defer close(served)
				<-gate
				return keep && p.Deliver(Key{Peer: int(s.From), Ch: int(s.Channel)}, c)
			}})
		open := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(open) // before the acceptor's Close, which waits for Serve: a failure must not hang
		d := Dialer{Network: "tcp", Secret: secret, Purpose: wire.PurposeData, Timeout: 2 * time.Second}
		c, err := d.Dial(context.Background(), addr, wire.ConnSetup{From: 1, To: 2, Channel: 3, NSocks: 1}, nil)
		require.NoError(t, err) // acknowledged: Serve is now held at the gate
		ended, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("rank 1 left"))
		type result struct {
			c   net.Conn
			err error
		}
		got := make(chan result, 1)
		go func() {
			v, err := p.Await(ended, Key{Peer: 1, Ch: 3}, nil)
			got <- result{v, err}
		}()
		select {
		case r := <-got:
			t.Fatalf("keep=%v: Await returned (%v, %v) while the connection was still being set up", keep, r.c, r.err)
		case <-time.After(50 * time.Millisecond):
		}
		open()
		<-served
		r := <-got
		if keep {
			require.NoError(t, r.err)
			require.NotNil(t, r.c)
			r.c.Close()
		} else {
			require.ErrorContains(t, r.err, "rank 1 left")
		}
		c.Close()
	}
}
