package handshake

import (
	"errors"
	"net"
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

func run(t *testing.T, clientSecret, serverSecret []byte, purpose, want wire.Purpose) (clientErr, serverErr error) {
	c, s := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, err := Server(s, serverSecret, want)
		s.Close()
		done <- err
	}()
	clientErr = Client(c, clientSecret, purpose)
	c.Close()
	return clientErr, <-done
}

func TestHandshake(t *testing.T) {
	secret := []byte("0123456789abcdef")
	cErr, sErr := run(t, secret, secret, wire.PurposeData, wire.PurposeData)
	require.NoError(t, cErr)
	require.NoError(t, sErr)
}

func TestWrongSecretFailsOnBothSides(t *testing.T) {
	cErr, sErr := run(t, []byte("client-secret..."), []byte("server-secret..."), wire.PurposeData, wire.PurposeData)
	require.ErrorIs(t, cErr, ErrAuth, "the client catches the impostor server first")
	require.Error(t, sErr, "the server gets no response")
}

func TestClientWithWrongSecretIsRejected(t *testing.T) {
	// A client that does not check the server (a stranger) but answers with
	// a wrong proof.
	c, s := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, err := Server(s, []byte("right"), wire.PurposeBootstrap)
		done <- err
	}()
	h := wire.Hello{Version: wire.ProtocolVersion, Purpose: wire.PurposeBootstrap}
	_, err := c.Write(h.Append(nil))
	require.NoError(t, err)
	_, _, err = ReadFrame(c, 1024)
	require.NoError(t, err)
	resp := wire.Response{Proof: [wire.ProofLen]byte{1, 2, 3}}
	require.NoError(t, WriteFrame(c, wire.FrameResponse, resp.Append(nil)))
	require.ErrorIs(t, <-done, ErrAuth)
}

func TestWrongPurposeAndVersionAreExplained(t *testing.T) {
	secret := []byte("s")
	cErr, sErr := run(t, secret, secret, wire.PurposeData, wire.PurposeBootstrap)
	require.ErrorContains(t, cErr, "a data connection reached a bootstrap listener")
	require.Error(t, sErr)

	c, s := pipe(t)
	done := make(chan error, 1)
	go func() {
		_, err := Server(s, secret, wire.PurposeData)
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
		_, err := Server(s, []byte("s"), wire.PurposeData)
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
		_, err := Server(s, []byte("s"), wire.PurposeData)
		done <- err
	}()
	c.Write([]byte(wire.Magic[:4]))
	err := <-done
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "got %v", err)
}
