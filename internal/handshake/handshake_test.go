package handshake

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/wire"
)

func pipe(t *testing.T) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	dl := time.Now().Add(5 * time.Second)
	a.SetDeadline(dl)
	b.SetDeadline(dl)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

var setup = wire.ConnSetup{From: 1, To: 2, Channel: 3, Socket: 0, NSocks: 4}

func first() (wire.FrameType, []byte) { return wire.FrameConnSetup, setup.Append(nil) }

type serverResult struct {
	typ     wire.FrameType
	payload []byte
	err     error
}

func run(t *testing.T, clientSecret, serverSecret []byte, purpose, want wire.Purpose) (error, serverResult) {
	c, s := pipe(t)
	done := make(chan serverResult, 1)
	go func() {
		_, typ, p, err := Server(s, serverSecret, want, 64)
		s.Close()
		done <- serverResult{typ, p, err}
	}()
	clientErr := Client(c, clientSecret, purpose, first)
	c.Close()
	return clientErr, <-done
}

func TestHandshake(t *testing.T) {
	secret := []byte("0123456789abcdef")
	cErr, s := run(t, secret, secret, wire.PurposeData, wire.PurposeData)
	require.NoError(t, cErr)
	require.NoError(t, s.err)
	require.Equal(t, wire.FrameConnSetup, s.typ)
	got, _, err := wire.ParseConnSetup(s.payload)
	require.NoError(t, err)
	require.Equal(t, setup, got, "the first frame arrives, authenticated")
}

func TestWrongSecretFailsOnBothSides(t *testing.T) {
	cErr, s := run(t, []byte("client-secret..."), []byte("server-secret..."), wire.PurposeData, wire.PurposeData)
	require.ErrorIs(t, cErr, ErrAuth, "the client catches the impostor server first")
	require.Error(t, s.err, "the server gets no response")
}

// stranger plays a client that does not check the server and answers with
// the given proof and first frame.
func stranger(t *testing.T, secret []byte, proof func(h *wire.Hello, sn [wire.NonceLen]byte) [wire.ProofLen]byte, frame []byte) error {
	c, s := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := Server(s, secret, wire.PurposeData, 64)
		done <- err
	}()
	h := wire.Hello{Version: wire.ProtocolVersion, Purpose: wire.PurposeData}
	_, err := c.Write(h.Append(nil))
	require.NoError(t, err)
	_, payload, err := ReadFrame(c, 1024)
	require.NoError(t, err)
	ch, _, err := wire.ParseChallenge(payload)
	require.NoError(t, err)
	resp := wire.Response{Proof: proof(&h, ch.Nonce)}
	require.NoError(t, WriteFrame(c, wire.FrameResponse, resp.Append(nil)))
	c.Write(frame)
	return <-done
}

func TestClientWithWrongSecretIsRejected(t *testing.T) {
	frame := wire.AppendFrame(nil, wire.FrameConnSetup, setup.Append(nil))
	err := stranger(t, []byte("right"), func(*wire.Hello, [wire.NonceLen]byte) [wire.ProofLen]byte {
		return [wire.ProofLen]byte{1, 2, 3}
	}, frame)
	require.ErrorIs(t, err, ErrAuth)
}

func TestAlteredFirstFrameIsRejected(t *testing.T) {
	// A proof made for one connection setup does not carry another: a
	// relay cannot redirect an authenticated client to another rank.
	secret := []byte("right")
	signed := wire.AppendFrame(nil, wire.FrameConnSetup, setup.Append(nil))
	other := setup
	other.To = 5
	sent := wire.AppendFrame(nil, wire.FrameConnSetup, other.Append(nil))
	err := stranger(t, secret, func(h *wire.Hello, sn [wire.NonceLen]byte) [wire.ProofLen]byte {
		return wire.Proof(secret, wire.RoleClient, h, sn, signed)
	}, sent)
	require.ErrorIs(t, err, ErrAuth)
}

func TestWrongPurposeAndVersionAreExplained(t *testing.T) {
	secret := []byte("s")
	cErr, s := run(t, secret, secret, wire.PurposeData, wire.PurposeBootstrap)
	require.ErrorContains(t, cErr, "a data connection reached a bootstrap listener")
	var rej *RejectedError
	require.ErrorAs(t, cErr, &rej)
	require.Error(t, s.err)

	c, srv := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := Server(srv, secret, wire.PurposeData, 64)
		done <- err
	}()
	h := wire.Hello{Version: 99, Purpose: wire.PurposeData}
	c.Write(h.Append(nil))
	typ, payload, err := ReadFrame(c, 1024)
	require.NoError(t, err)
	require.Equal(t, wire.FrameReject, typ)
	r, _, err := wire.ParseReject(payload)
	require.NoError(t, err)
	require.Contains(t, r.Reason, "protocol version 99")
	require.ErrorContains(t, <-done, "protocol version 99")
}

func TestGarbageIsRejectedAtTheFirstWrongByte(t *testing.T) {
	c, s := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := Server(s, []byte("s"), wire.PurposeData, 64)
		done <- err
	}()
	// net.Pipe is unbuffered: if the server read more than the first few
	// bytes, this write would block until the deadline.
	_, err := c.Write([]byte("GET"))
	require.NoError(t, err)
	require.ErrorIs(t, <-done, wire.ErrBadMagic)
}

func TestTruncatedHelloTimesOut(t *testing.T) {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	s.SetDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, _, _, err := Server(s, []byte("s"), wire.PurposeData, 64)
		done <- err
	}()
	c.Write([]byte(wire.Magic[:4]))
	err := <-done
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "got %v", err)
}

// A refusal before the server's proof says so and quotes the peer's text;
// one after it is the peer's word (issue 19).
func TestRefusalsAreQuotedAndUnprovenOnesSaySo(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		buf := make([]byte, 64)
		b.Read(buf) // the hello
		Reject(b, "\x1b]0;owned\x07 stop")
	}()
	err := Client(a, []byte("0123456789abcdef0123456789abcdef"), wire.PurposeData, func() (wire.FrameType, []byte) { return wire.FrameConnSetup, nil })
	var rej *RejectedError
	require.ErrorAs(t, err, &rej)
	require.True(t, rej.Unproven)
	require.Contains(t, err.Error(), "before proving it knows this job's secret")
	require.Contains(t, err.Error(), `"\x1b]0;owned\a stop"`)
	require.NotContains(t, err.Error(), "\x1b")
	long := (&RejectedError{Reason: strings.Repeat("x", 1000)}).Error()
	require.Less(t, len(long), 300, "a long reason is cut")
	require.True(t, strings.HasPrefix(long, "refused by the peer: "))
}

// A frame's header cannot make the reader allocate what its bytes do not
// bring (issue 19: the root allocated about 1 MiB per stranger's
// connection before checking its proof).
func TestReadFrameAllocatesAsBytesArrive(t *testing.T) {
	hdr := wire.AppendFrame(nil, wire.FramePeerInfo, make([]byte, 1<<20))[:wire.FrameHeaderLen]
	r := io.MultiReader(bytes.NewReader(hdr), bytes.NewReader(make([]byte, 1000)))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := ReadFrame(r, 2<<20)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "the frame ends early")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<10), "allocated for 1000 bytes, not the 1 MiB the header claims")
	// A whole frame still arrives whole.
	want := bytes.Repeat([]byte("goccl"), 100_000)
	typ, got, err := ReadFrame(bytes.NewReader(wire.AppendFrame(nil, wire.FramePeerInfo, want)), 1<<20)
	require.NoError(t, err)
	require.Equal(t, wire.FramePeerInfo, typ)
	require.Equal(t, want, got)
}

// lateCtx is a context whose deadline has passed before its timer marked
// it done, as a connection given ctx's deadline can see it.
type lateCtx struct {
	context.Context
	d time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.d, true }

// TestEndedAtTheDeadline: an attempt that fails at ctx's deadline is the
// deadline's, even before ctx says it is done (CI once quoted such an
// attempt's i/o timeout in place of the refusals before it).
func TestEndedAtTheDeadline(t *testing.T) {
	require.False(t, Ended(context.Background()))
	require.False(t, Ended(lateCtx{context.Background(), time.Now().Add(time.Hour)}))
	late := lateCtx{context.Background(), time.Now().Add(-time.Millisecond)}
	require.NoError(t, late.Err(), "the timer has not fired")
	require.True(t, Ended(late))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	require.True(t, Ended(done))

	a, b := pipe(t)
	defer b.Close()
	err := Bounded(late, a, time.Second, func() error { return errors.New("i/o timeout") })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "i/o timeout")
}
