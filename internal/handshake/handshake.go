// Package handshake authenticates a goccl connection before any other
// byte on it is trusted: both ends prove that they know the job's secret.
//
//	client → server  Hello       magic, protocol version, purpose, client nonce
//	server → client  Challenge   server nonce, HMAC(secret, "S" ‖ hello ‖ server nonce)
//	              or Reject      why (wrong protocol version, wrong purpose)
//	client → server  Response    HMAC(secret, "C" ‖ hello ‖ server nonce ‖ first frame)
//	client → server  first frame who the client is and what it wants (PeerInfo, ConnSetup)
//
// The client checks the server's proof before it sends its own, so it
// never talks to an impostor; the server checks the client's before it
// reads anything else. Nonces come from crypto/rand on both sides, so a
// recorded handshake cannot be replayed. NCCL checks a 64-bit magic
// number; a stranger who does not know the 128-bit secret gets nothing
// past this point.
//
// The caller sets deadlines on the connection: a peer that stops mid-way
// must not hold a goroutine forever.
package handshake

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/goccl/goccl/internal/wire"
)

// ErrAuth: the other end does not know the job's secret.
var ErrAuth = errors.New("authentication failed: the peer does not know this job's secret")

// Client runs the client side over rw. Once the server has proved that it
// knows the secret, first builds the client's first frame (who it is, what
// the connection is for); the client's proof covers that frame, which
// follows the response, so the server can trust it and nobody can replay
// it to another rank.
func Client(rw io.ReadWriter, secret []byte, purpose wire.Purpose, first func() (wire.FrameType, []byte)) error {
	h := wire.Hello{Version: wire.ProtocolVersion, Purpose: purpose}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return err
	}
	if _, err := rw.Write(h.Append(nil)); err != nil {
		return err
	}
	typ, payload, err := ReadFrame(rw, 1024)
	if err != nil {
		return fmt.Errorf("reading the challenge: %w", err)
	}
	switch typ {
	case wire.FrameReject:
		r, _, err := wire.ParseReject(payload)
		if err != nil {
			return fmt.Errorf("malformed reject: %w", err)
		}
		// Anyone listening on the port can send this: it proves nothing.
		return &RejectedError{Reason: r.Reason, Unproven: true}
	case wire.FrameChallenge:
	default:
		return fmt.Errorf("expected a challenge, got a %v frame", typ)
	}
	c, _, err := wire.ParseChallenge(payload)
	if err != nil {
		return fmt.Errorf("malformed challenge: %w", err)
	}
	if !wire.CheckProof(secret, wire.RoleServer, &h, c.Nonce, nil, c.Proof) {
		return ErrAuth
	}
	ft, fp := first()
	frame := wire.AppendFrame(nil, ft, fp)
	resp := wire.Response{Proof: wire.Proof(secret, wire.RoleClient, &h, c.Nonce, frame)}
	_, err = rw.Write(append(wire.AppendFrame(nil, wire.FrameResponse, resp.Append(nil)), frame...))
	return err
}

// RejectedError is the reason a server gave for refusing the connection
// (another protocol version, another purpose, a setup it does not take).
// A refusal that came before the server proved it knows the secret is
// Unproven: a stranger who answers on the port can send one, so a dialer
// treats it as a failed attempt and retries, and only a proven refusal
// ends its retries. The reason is the peer's text, quoted when printed.
type RejectedError struct {
	Reason   string
	Unproven bool
}

func (e *RejectedError) Error() string {
	if e.Unproven {
		return "refused before proving it knows this job's secret (another version of goccl, or not a rank of this job): " + Quote(e.Reason)
	}
	return "refused by the peer: " + Quote(e.Reason)
}

// maxQuoted bounds how much of a peer's text an error carries.
const maxQuoted = 256

// Quote makes a peer's text safe to print: quoted, with control
// characters and escape sequences escaped, and cut at maxQuoted bytes.
func Quote(s string) string {
	if len(s) > maxQuoted {
		s = s[:maxQuoted] + "..."
	}
	return strconv.Quote(s)
}

// Server runs the server side over rw and returns the client's Hello and
// its authenticated first frame (of at most maxFirst payload bytes). A
// client that asks for another purpose or speaks another protocol version
// is told why before the error is returned. helloDone, if given, is called
// once the hello has arrived: a caller that gave the hello a short
// deadline (HelloTimeout) extends it there.
func Server(rw io.ReadWriter, secret []byte, want wire.Purpose, maxFirst int, helloDone ...func()) (wire.Hello, wire.FrameType, []byte, error) {
	var buf [64]byte
	b := buf[:0]
	var h wire.Hello
	for {
		var err error
		if h, _, err = wire.ParseHello(b); err == nil {
			break
		} else if !errors.Is(err, wire.ErrShort) {
			if len(b) > 0 && b[0] == tlsHandshakeRecord {
				// A TLS ClientHello: a rank with TLS settings at a listener
				// without. Tell it, in a frame it can still read.
				Reject(rw, "this listener does not use TLS: set GOCCL_TLS_CERT, GOCCL_TLS_KEY and GOCCL_TLS_CA on every rank or on none")
			}
			return h, 0, nil, err
		}
		// Read only what the hello can still need, so that a stranger's
		// garbage is rejected at its first wrong byte.
		n, err := rw.Read(buf[len(b) : len(b)+1+helloRemaining(b)])
		if err != nil {
			return h, 0, nil, fmt.Errorf("reading the hello: %w", err)
		}
		b = buf[:len(b)+n]
	}
	for _, f := range helloDone {
		f()
	}
	reject := func(format string, args ...any) (wire.Hello, wire.FrameType, []byte, error) {
		msg := fmt.Sprintf(format, args...)
		Reject(rw, msg)
		return h, 0, nil, errors.New(msg)
	}
	if h.Version != wire.ProtocolVersion {
		return reject("protocol version %d, this goccl speaks %d: run the same goccl version on every rank", h.Version, wire.ProtocolVersion)
	}
	if h.Purpose != want {
		return reject("a %v connection reached a %v listener", h.Purpose, want)
	}
	c := wire.Challenge{}
	if _, err := rand.Read(c.Nonce[:]); err != nil {
		return h, 0, nil, err
	}
	c.Proof = wire.Proof(secret, wire.RoleServer, &h, c.Nonce, nil)
	if _, err := rw.Write(wire.AppendFrame(nil, wire.FrameChallenge, c.Append(nil))); err != nil {
		return h, 0, nil, err
	}
	typ, payload, err := ReadFrame(rw, 1024)
	if err != nil {
		return h, 0, nil, fmt.Errorf("reading the response: %w", err)
	}
	if typ != wire.FrameResponse {
		return h, 0, nil, fmt.Errorf("expected a response, got a %v frame", typ)
	}
	r, _, err := wire.ParseResponse(payload)
	if err != nil {
		return h, 0, nil, fmt.Errorf("malformed response: %w", err)
	}
	// The first frame is read before the proof can be checked (the proof
	// covers it) but not trusted, nor even parsed, until it has been.
	ft, fp, err := ReadFrame(rw, maxFirst)
	if err != nil {
		return h, 0, nil, fmt.Errorf("reading the first frame: %w", err)
	}
	if !wire.CheckProof(secret, wire.RoleClient, &h, c.Nonce, wire.AppendFrame(nil, ft, fp), r.Proof) {
		return h, 0, nil, ErrAuth
	}
	return h, ft, fp, nil
}

// tlsHandshakeRecord is the first byte of a TLS ClientHello (RFC 8446
// §5.1: content type handshake).
const tlsHandshakeRecord = 22

// helloRemaining returns how many more bytes a hello that starts with b
// needs at most (beyond one).
func helloRemaining(b []byte) int {
	var h wire.Hello
	return h.Len() - len(b) - 1
}

// ReadFrame reads one frame of at most max payload bytes.
func ReadFrame(r io.Reader, max int) (wire.FrameType, []byte, error) {
	var hdr [wire.FrameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	typ, n, err := wire.ParseFrameHeader(hdr[:])
	if err != nil {
		return 0, nil, err
	}
	if n > max {
		return 0, nil, fmt.Errorf("a %v frame of %d bytes exceeds the %d expected here", typ, n, max)
	}
	if n <= readChunk {
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return 0, nil, err
		}
		return typ, payload, nil
	}
	// A large frame grows as its bytes arrive, not as its header says:
	// a stranger's header alone (a first frame is read before its proof
	// can be checked) costs the reader nothing.
	payload := make([]byte, 0, readChunk)
	for len(payload) < n {
		k := min(n-len(payload), readChunk)
		payload = slices.Grow(payload, k)
		m, err := io.ReadFull(r, payload[len(payload):len(payload)+k])
		payload = payload[:len(payload)+m]
		if err != nil {
			return 0, nil, err
		}
	}
	return typ, payload, nil
}

// readChunk is how much of a frame ReadFrame allocates ahead of its bytes.
const readChunk = 64 << 10

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, t wire.FrameType, payload []byte) error {
	_, err := w.Write(wire.AppendFrame(nil, t, payload))
	return err
}

// Reject tells the peer why it is turned away: a reject frame carrying
// reason.
func Reject(w io.Writer, reason string) error {
	r := wire.Reject{Reason: reason}
	return WriteFrame(w, wire.FrameReject, r.Append(nil))
}

// Bounded runs f, a handshake over c, bounded by timeout and by ctx
// (whichever ends first), and leaves c without a deadline.
func Bounded(ctx context.Context, c net.Conn, timeout time.Duration, f func() error) error {
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	err := f()
	stop()
	c.SetDeadline(time.Time{})
	if err != nil && Ended(ctx) {
		cause := context.Cause(ctx)
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// Ended reports whether ctx is done or its deadline has passed. A
// connection whose deadline is ctx's can time out a moment before ctx's
// own timer marks it done; an error from such an attempt is the
// deadline's, not the peer's.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// TLS channel binding (issue 19, finding 1). The secret's proof says who
// is at the other end of the TCP connection; TLS says that the bytes
// after it are private and unaltered. Without a tie between the two, a
// relay holding any certificate of the job's CA could pass the handshake
// on unchanged and run TLS separately with each end. So once TLS is up,
// each end proves again, inside it, that it knows the secret, over the
// TLS session's exported keying material (RFC 8446 §7.5, RFC 5705),
// which differs between a relay's two sessions: the accepting end first,
// then the dialing end, 32 bytes each.

// tlsBindingLabel is the exporter label (RFC 5705 §4: labels that are not
// registered begin with "EXPERIMENTAL"; goccl's is private to it).
const tlsBindingLabel = "EXPERIMENTAL goccl channel binding v1"

// tlsBinding is an end's proof over st's keying material.
func tlsBinding(secret []byte, role byte, st tls.ConnectionState) ([sha256.Size]byte, error) {
	var out [sha256.Size]byte
	ekm, err := st.ExportKeyingMaterial(tlsBindingLabel, nil, 32)
	if err != nil {
		return out, fmt.Errorf("TLS keying material: %w", err)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("goccl tls binding"))
	m.Write([]byte{role})
	m.Write(ekm)
	copy(out[:], m.Sum(nil))
	return out, nil
}

// ErrTLSBinding: the peer's proof does not cover this TLS session.
var ErrTLSBinding = errors.New("TLS channel binding failed: the peer's proof does not cover this TLS session (a relay between the two ends, holding a certificate of the job's CA?)")

// ConfirmTLS runs the binding over rw, the application data of the TLS
// session whose state is st: as the accepting end (client false) it sends
// its proof and checks the dialer's, as the dialing end the other way
// round. The caller bounds it with a deadline.
func ConfirmTLS(rw io.ReadWriter, secret []byte, st tls.ConnectionState, client bool) error {
	mine, theirs := wire.RoleServer, wire.RoleClient
	if client {
		mine, theirs = theirs, mine
	}
	own, err := tlsBinding(secret, mine, st)
	if err != nil {
		return err
	}
	want, err := tlsBinding(secret, theirs, st)
	if err != nil {
		return err
	}
	send := func() error {
		_, err := rw.Write(own[:])
		return err
	}
	recv := func() error {
		var got [sha256.Size]byte
		if _, err := io.ReadFull(rw, got[:]); err != nil {
			return fmt.Errorf("reading the peer's TLS binding: %w", err)
		}
		if !hmac.Equal(got[:], want[:]) {
			return ErrTLSBinding
		}
		return nil
	}
	steps := []func() error{send, recv}
	if client {
		steps = []func() error{recv, send}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
