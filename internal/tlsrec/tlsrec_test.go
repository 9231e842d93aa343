package tlsrec_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b := <-acc
	require.NotNil(t, b)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// reader adapts a blocking net.Conn to Session.Read's raw function.
func reader(c net.Conn) func([]byte) (int, error) {
	return func(b []byte) (int, error) {
		n, err := c.Read(b)
		if n > 0 {
			return n, nil
		}
		return 0, err
	}
}

// feed is Session.Read's raw function over the bytes of w, then io.EOF.
func feed(w []byte) func([]byte) (int, error) {
	return func(p []byte) (int, error) {
		if len(w) == 0 {
			return 0, io.EOF
		}
		n := copy(p, w)
		w = w[n:]
		return n, nil
	}
}

// readFull reads n bytes of application data from s.
func readFull(t *testing.T, s *tlsrec.Session, c net.Conn, n int) []byte {
	t.Helper()
	out := make([]byte, n)
	for got := 0; got < n; {
		m, err := s.Read(out[got:], reader(c))
		require.NoError(t, err)
		got += m
	}
	return out
}

func config(t *testing.T, ca *tlstest.CA, name string) *tls.Config {
	return tlsrec.NewConfig(ca.Issue(t, name), ca.Pool)
}

// both runs the handshake on the two ends at once.
func both(t *testing.T, a, b net.Conn, ca, cb *tls.Config) (*tlsrec.Session, *tlsrec.Session, error, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		s   *tlsrec.Session
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := tlsrec.Handshake(ctx, b, cb, false)
		if err != nil {
			b.Close() // so the client does not wait for a reply that never comes
		}
		ch <- res{s, err}
	}()
	sa, ea := tlsrec.Handshake(ctx, a, ca, true)
	if ea != nil {
		a.Close()
	}
	r := <-ch
	return sa, r.s, ea, r.err
}

// connected returns the two ends of a loopback connection whose TLS
// handshake has run, rank0 the client and rank1 the server, with their
// sessions.
func connected(t *testing.T) (a, b net.Conn, sa, sb *tlsrec.Session) {
	t.Helper()
	ca := tlstest.NewCA(t, "job")
	a, b = pair(t)
	sa, sb, ea, eb := both(t, a, b, config(t, ca, "rank0"), config(t, ca, "rank1"))
	require.NoError(t, ea)
	require.NoError(t, eb)
	return a, b, sa, sb
}

func TestSessionsCarryDataBothWays(t *testing.T) {
	a, b, sa, sb := connected(t)
	require.Equal(t, "rank1", sa.State.PeerCertificates[0].Subject.CommonName)
	require.Equal(t, "rank0", sb.State.PeerCertificates[0].Subject.CommonName)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 100, tlsrec.MaxPlaintext - 1, tlsrec.MaxPlaintext, tlsrec.MaxPlaintext + 1, 300_000} {
		hdr := []byte("header")
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		wire := sa.Seal(nil, hdr, msg)
		require.Len(t, wire, tlsrec.SealedLen(len(hdr)+n), "size %d", n)
		require.False(t, bytes.Contains(wire, msg[:min(n, 64)]) && n >= 16, "plaintext visible on the wire")
		go a.Write(wire)
		got := readFull(t, sb, b, len(hdr)+n)
		require.Equal(t, append(hdr, msg...), got, "size %d", n)
		// And back.
		go b.Write(sb.Seal(nil, msg, nil))
		require.Equal(t, msg, readFull(t, sa, a, n))
	}
}

// TestInteroperatesWithCryptoTLS checks that the records are TLS 1.3's:
// a crypto/tls.Conn reads what a Session seals, and a Session reads what
// a crypto/tls.Conn writes, including across the Session's key updates.
func TestInteroperatesWithCryptoTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	for _, ourSide := range []string{"client", "server"} {
		t.Run("session is "+ourSide, func(t *testing.T) {
			a, b := pair(t)
			ours, theirs := a, b
			std := config(t, ca, "std")
			std.SessionTicketsDisabled = ourSide == "client" // tickets are skipped anyway; test both
			var tc *tls.Conn
			if ourSide == "client" {
				tc = tls.Server(theirs, std)
			} else {
				tc = tls.Client(theirs, std)
			}
			go tc.Handshake()
			s, err := tlsrec.Handshake(context.Background(), ours, config(t, ca, "ours"), ourSide == "client")
			require.NoError(t, err)
			s.SetRecordsPerKey(3)
			msg := make([]byte, 10*tlsrec.MaxPlaintext+7)
			for i := range msg {
				msg[i] = byte(i * 7)
			}
			go ours.Write(s.Seal(nil, []byte("hi"), msg))
			got := make([]byte, len(msg)+2)
			_, err = io.ReadFull(tc, got)
			require.NoError(t, err)
			require.Equal(t, append([]byte("hi"), msg...), got)
			require.GreaterOrEqual(t, s.Stats().KeyUpdates, uint64(3), "the session rekeyed every 3 records")

			wrote := make(chan error, 1)
			go func() { _, err := tc.Write(msg); wrote <- err }()
			require.Equal(t, msg, readFull(t, s, ours, len(msg)))
			require.NoError(t, <-wrote)

			// A close_notify from crypto/tls is the end of the stream. (Its
			// Close sends none while a Write is still in flight, hence the
			// wait above.)
			tc.Close()
			_, err = s.Read(make([]byte, 1), reader(ours))
			require.ErrorIs(t, err, io.EOF)
		})
	}
}

func TestAlteredRecordFailsAuthentication(t *testing.T) {
	a, b, sa, sb := connected(t)
	wire := sa.Seal(nil, []byte("gradients"), nil)
	wire[len(wire)-20] ^= 1
	go a.Write(wire)
	_, err := sb.Read(make([]byte, 16), reader(b))
	require.ErrorIs(t, err, tlsrec.ErrAuth)
	_, err = sb.Read(make([]byte, 16), reader(b))
	require.ErrorIs(t, err, tlsrec.ErrAuth, "the error sticks")
}

func TestReplayedRecordFailsAuthentication(t *testing.T) {
	a, b, sa, sb := connected(t)
	wire := sa.Seal(nil, []byte("step 1"), nil)
	go a.Write(append(slices.Clone(wire), wire...))
	require.Equal(t, []byte("step 1"), readFull(t, sb, b, 6))
	_, err := sb.Read(make([]byte, 16), reader(b))
	require.ErrorIs(t, err, tlsrec.ErrAuth, "a record sent twice must not be accepted twice")
}

func TestPeersOutsideTheCAAreRefused(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	other := tlstest.NewCA(t, "stranger")
	noClientAuth := tlsrec.NewConfig(ca.Issue(t, "server-only", x509.ExtKeyUsageServerAuth), ca.Pool)
	noCert := config(t, ca, "none")
	noCert.Certificates = nil
	for name, c := range map[string]struct{ client, server *tls.Config }{
		"client from another CA":          {config(t, other, "x"), config(t, ca, "rank1")},
		"server from another CA":          {config(t, ca, "rank0"), config(t, other, "x")},
		"client without cert":             {noCert, config(t, ca, "rank1")},
		"client cert not for client auth": {noClientAuth, config(t, ca, "rank1")},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := pair(t)
			_, _, ea, eb := both(t, a, b, c.client, c.server)
			require.True(t, ea != nil || eb != nil, "the handshake must fail")
			t.Logf("client: %v; server: %v", ea, eb)
		})
	}
}

func TestLoadConfigSaysWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	f := tlstest.NewCA(t, "job").WriteFiles(t, dir, "rank")
	_, err := tlsrec.LoadConfig(f.Cert, f.Key, f.CA)
	require.NoError(t, err)
	_, err = tlsrec.LoadConfig(f.Cert, f.Key, dir+"/missing.pem")
	require.ErrorContains(t, err, "missing.pem")
	_, err = tlsrec.LoadConfig(f.Cert, f.Key, f.Key)
	require.ErrorContains(t, err, "no PEM certificate")
	_, err = tlsrec.LoadConfig(f.CA, f.Key, f.CA)
	require.ErrorContains(t, err, "loading certificate")
}

// TestReadResumesAfterWouldBlock checks that Read hands back a
// would-block error when a record is incomplete, and resumes.
func TestReadResumesAfterWouldBlock(t *testing.T) {
	_, _, sa, sb := connected(t)
	wire := sa.Seal(nil, []byte("abcdefgh"), nil)
	errWouldBlock := errors.New("would block")
	var fed, calls int
	raw := func(p []byte) (int, error) { // a byte, then would-block, in turn
		calls++
		if calls%2 == 0 || fed == len(wire) {
			return 0, errWouldBlock
		}
		n := copy(p[:1], wire[fed:])
		fed += n
		return n, nil
	}
	var got []byte
	for range 1000 {
		p := make([]byte, 3)
		n, err := sb.Read(p, raw)
		got = append(got, p[:n]...)
		if err != nil {
			require.ErrorIs(t, err, errWouldBlock)
		}
		if len(got) == 8 {
			break
		}
	}
	require.Equal(t, "abcdefgh", string(got))
}

func FuzzRead(f *testing.F) {
	secret := bytes.Repeat([]byte{7}, 32)
	seal, err := tlsrec.NewSession(tls.TLS_AES_128_GCM_SHA256, secret, secret, tls.ConnectionState{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seal.Seal(nil, []byte("hello"), nil))
	f.Add([]byte{23, 3, 3, 0, 17})
	f.Add([]byte{22, 3, 1, 0, 5, 1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := tlsrec.NewSession(tls.TLS_AES_128_GCM_SHA256, secret, secret, tls.ConnectionState{})
		if err != nil {
			t.Fatal(err)
		}
		raw := feed(b)
		p := make([]byte, 64)
		for range 100 {
			if _, err := s.Read(p, raw); err != nil {
				return
			}
		}
	})
}

// BenchmarkSession seals and opens 512 KiB slices (the TCP transport's
// slot size) with each TLS 1.3 suite.
func BenchmarkSession(b *testing.B) {
	secret := bytes.Repeat([]byte{7}, 48)
	for _, suite := range []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384, tls.TLS_CHACHA20_POLY1305_SHA256} {
		b.Run(tls.CipherSuiteName(suite), func(b *testing.B) {
			tx, err := tlsrec.NewSession(suite, secret, secret, tls.ConnectionState{})
			require.NoError(b, err)
			rx, err := tlsrec.NewSession(suite, secret, secret, tls.ConnectionState{})
			require.NoError(b, err)
			msg := make([]byte, 512<<10)
			out := make([]byte, len(msg))
			var wire []byte
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				wire = tx.Seal(wire[:0], nil, msg)
				raw := feed(wire)
				for got := 0; got < len(out); {
					n, err := rx.Read(out[got:], raw)
					if err != nil {
						b.Fatal(err)
					}
					got += n
				}
			}
		})
	}
}

// TestEverySuiteRoundTrips seals and opens with each TLS 1.3 suite, and
// checks that a session keyed with the other direction's secret cannot
// open what was sealed.
func TestEverySuiteRoundTrips(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 48), bytes.Repeat([]byte{2}, 48)
	for _, suite := range []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384, tls.TLS_CHACHA20_POLY1305_SHA256} {
		t.Run(tls.CipherSuiteName(suite), func(t *testing.T) {
			tx, err := tlsrec.NewSession(suite, a, b, tls.ConnectionState{})
			require.NoError(t, err)
			rx, err := tlsrec.NewSession(suite, b, a, tls.ConnectionState{})
			require.NoError(t, err)
			wrong, err := tlsrec.NewSession(suite, a, b, tls.ConnectionState{})
			require.NoError(t, err)
			msg := bytes.Repeat([]byte("gradient"), 5000)
			wire := tx.Seal(nil, msg[:3], msg[3:])
			got := make([]byte, len(msg))
			raw := feed(wire)
			for n := 0; n < len(got); {
				m, err := rx.Read(got[n:], raw)
				require.NoError(t, err)
				n += m
			}
			require.Equal(t, msg, got)
			_, err = wrong.Read(got, feed(wire))
			require.ErrorIs(t, err, tlsrec.ErrAuth)
		})
	}
	_, err := tlsrec.NewSession(tls.TLS_RSA_WITH_AES_128_GCM_SHA256, a, b, tls.ConnectionState{})
	require.ErrorContains(t, err, "not a TLS 1.3 suite")
}

// withStd returns a Session that has run its handshake with a
// crypto/tls.Conn at the other end of a loopback connection, as the
// client or the server, with the raw sockets of both ends.
func withStd(t *testing.T, ca *tlstest.CA, ourSide string) (ours, theirs net.Conn, tc *tls.Conn, s *tlsrec.Session) {
	t.Helper()
	ours, theirs = pair(t)
	std := config(t, ca, "std")
	if ourSide == "client" {
		tc = tls.Server(theirs, std)
	} else {
		tc = tls.Client(theirs, std)
	}
	go tc.Handshake() // its Read and Write wait for it
	s, err := tlsrec.Handshake(context.Background(), ours, config(t, ca, "ours"), ourSide == "client")
	require.NoError(t, err)
	// A test that fails must not wait for bytes that never come.
	deadline := time.Now().Add(10 * time.Second)
	ours.SetDeadline(deadline)
	theirs.SetDeadline(deadline)
	return ours, theirs, tc, s
}

// pairOfSessions returns two sessions keyed for each other, without a
// handshake.
func pairOfSessions(t *testing.T) (tx, rx *tlsrec.Session) {
	t.Helper()
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	tx, err := tlsrec.NewSession(tls.TLS_AES_128_GCM_SHA256, a, b, tls.ConnectionState{})
	require.NoError(t, err)
	rx, err = tlsrec.NewSession(tls.TLS_AES_128_GCM_SHA256, b, a, tls.ConnectionState{})
	require.NoError(t, err)
	return tx, rx
}

// readAll reads s's application data until Read fails, and returns the
// data and the error.
func readAll(s *tlsrec.Session, raw func([]byte) (int, error)) ([]byte, error) {
	var got []byte
	p := make([]byte, 4096)
	for {
		n, err := s.Read(p, raw)
		got = append(got, p[:n]...)
		if err != nil {
			return got, err
		}
	}
}

// TestCloseNotifyWithCryptoTLS checks closure against crypto/tls (RFC
// 8446 §6.1): its Close sends close_notify, which a Session reads as the
// end of the stream; a Session's close_notify ends a crypto/tls.Conn's
// stream while the socket is still open; and a socket closed under
// crypto/tls, without its close_notify, reads as truncated, not as the
// end.
func TestCloseNotifyWithCryptoTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	msg := bytes.Repeat([]byte("last words "), 3000) // two records
	for _, ourSide := range []string{"client", "server"} {
		t.Run("session is "+ourSide, func(t *testing.T) {
			t.Run("crypto/tls closes", func(t *testing.T) {
				ours, _, tc, s := withStd(t, ca, ourSide)
				_, err := tc.Write(msg)
				require.NoError(t, err)
				require.NoError(t, tc.Close())
				got, err := readAll(s, reader(ours))
				require.Equal(t, msg, got)
				require.ErrorIs(t, err, io.EOF)
				require.NotErrorIs(t, err, tlsrec.ErrTruncated)
				_, err = s.Read(make([]byte, 1), reader(ours))
				require.ErrorIs(t, err, io.EOF, "the end sticks")
			})
			t.Run("session closes", func(t *testing.T) {
				ours, _, tc, s := withStd(t, ca, ourSide)
				_, err := ours.Write(s.SealCloseNotify(s.Seal(nil, msg, nil)))
				require.NoError(t, err)
				// The socket stays open: only the alert can end the stream.
				got, err := io.ReadAll(tc)
				require.NoError(t, err, "crypto/tls's Read returns io.EOF, which ReadAll takes for the end")
				require.Equal(t, msg, got)
			})
			t.Run("socket closed under crypto/tls", func(t *testing.T) {
				ours, theirs, tc, s := withStd(t, ca, ourSide)
				_, err := tc.Write(msg)
				require.NoError(t, err)
				require.NoError(t, theirs.Close()) // a FIN, no close_notify
				got, err := readAll(s, reader(ours))
				require.Equal(t, msg, got)
				require.ErrorIs(t, err, tlsrec.ErrTruncated)
				require.ErrorIs(t, err, io.ErrUnexpectedEOF)
				require.NotErrorIs(t, err, io.EOF, "a cut stream must not read as one that finished")
				_, err = s.Read(make([]byte, 1), reader(ours))
				require.ErrorIs(t, err, tlsrec.ErrTruncated, "the error sticks")
			})
		})
	}
}

// TestStreamEnds checks how a Session's stream may end: with
// close_notify (io.EOF, and nothing after it is read), or without it,
// between records or inside one (ErrTruncated).
func TestStreamEnds(t *testing.T) {
	t.Run("close_notify", func(t *testing.T) {
		tx, rx := pairOfSessions(t)
		wire := tx.SealCloseNotify(tx.Seal(nil, []byte("done"), nil))
		wire = append(wire, tx.SealInner(nil, tlsrec.TypeAppData, []byte("after the end"), 0)...)
		got, err := readAll(rx, feed(wire))
		require.Equal(t, "done", string(got), "§6.1: data after close_notify is ignored")
		require.ErrorIs(t, err, io.EOF)
		require.NotErrorIs(t, err, tlsrec.ErrTruncated)
	})
	t.Run("between records", func(t *testing.T) {
		tx, rx := pairOfSessions(t)
		got, err := readAll(rx, feed(tx.Seal(nil, []byte("done?"), nil)))
		require.Equal(t, "done?", string(got))
		require.ErrorIs(t, err, tlsrec.ErrTruncated)
		require.NotErrorIs(t, err, io.EOF)
	})
	t.Run("inside a record", func(t *testing.T) {
		tx, rx := pairOfSessions(t)
		wire := tx.Seal(nil, []byte("first"), []byte("second"))
		cut := tx.Seal(nil, []byte("cut short"), nil)
		got, err := readAll(rx, feed(append(wire, cut[:len(cut)-3]...)))
		require.Equal(t, "firstsecond", string(got))
		require.ErrorIs(t, err, tlsrec.ErrTruncated)
		require.ErrorContains(t, err, "into a record")
	})
}

// TestKeyUpdateEndsItsRecord checks RFC 8446 §5.1: a KeyUpdate may follow
// other handshake messages in its record, but nothing may follow it
// there, since the records after it are under the next key. crypto/tls
// never packs a KeyUpdate with anything, so the records are built here.
func TestKeyUpdateEndsItsRecord(t *testing.T) {
	keyUpdate := []byte{tlsrec.MsgKeyUpdate, 0, 0, 1, 0}
	ticket := []byte{tlsrec.MsgNewSessionTicket, 0, 0, 4, 1, 2, 3, 4} // skipped: nothing here resumes
	t.Run("last in its record", func(t *testing.T) {
		tx, rx := pairOfSessions(t)
		wire := tx.SealInner(nil, tlsrec.TypeHandshake, append(slices.Clone(ticket), keyUpdate...), 0)
		tx.UpdateSendKeys()
		wire = tx.Seal(wire, []byte("under the next key"), nil)
		got, err := readAll(rx, feed(wire))
		require.Equal(t, "under the next key", string(got))
		require.ErrorIs(t, err, tlsrec.ErrTruncated)
	})
	t.Run("followed by more", func(t *testing.T) {
		tx, rx := pairOfSessions(t)
		wire := tx.SealInner(nil, tlsrec.TypeHandshake, append(slices.Clone(keyUpdate), ticket...), 0)
		tx.UpdateSendKeys()
		wire = tx.Seal(wire, []byte("under the next key"), nil)
		got, err := readAll(rx, feed(wire))
		require.Empty(t, got, "nothing after the misaligned key change is read")
		require.ErrorContains(t, err, "unexpected_message")
		require.ErrorContains(t, err, "KeyUpdate")
		_, err2 := rx.Read(make([]byte, 64), feed(nil))
		require.Equal(t, err, err2, "the error sticks")
	})
}

// TestRecordOverflow checks the record size limits of RFC 8446: at most
// 2^14 bytes of content, and 2^14+1 of TLSInnerPlaintext with the content
// type and padding (§5.4), are accepted; more is record_overflow (§5.2).
// crypto/tls, which cannot send such records, reads the same records and
// must agree on each.
func TestRecordOverflow(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	const max = tlsrec.MaxPlaintext
	for _, c := range []struct {
		name     string
		content  int
		pad      int
		overflow bool
	}{
		{"content=2^14", max, 0, false},
		{"content=2^14-100/pad=100", max - 100, 100, false},
		{"content=2^14+1", max + 1, 0, true},
		{"content=2^14/pad=1", max, 1, true},
		{"content=10/pad=2^14", 10, max, true},
		{"content=2^14+239", max + 239, 0, true}, // the largest body under 2^14+256
	} {
		t.Run(c.name, func(t *testing.T) {
			content := bytes.Repeat([]byte{'x'}, c.content)
			tx, rx := pairOfSessions(t)
			got, err := readAll(rx, feed(tx.SealInner(nil, tlsrec.TypeAppData, content, c.pad)))
			if c.overflow {
				require.Zero(t, len(got), "nothing of an oversized record is read")
				require.ErrorContains(t, err, "record_overflow")
			} else {
				require.True(t, bytes.Equal(content, got), "read %d bytes of %d", len(got), len(content))
				require.ErrorIs(t, err, tlsrec.ErrTruncated, "the record was read, then the stream ended")
			}

			t.Run("crypto/tls agrees", func(t *testing.T) {
				ours, _, tc, s := withStd(t, ca, "server")
				go ours.Write(s.SealInner(nil, tlsrec.TypeAppData, content, c.pad))
				got := make([]byte, c.content)
				_, err := io.ReadFull(tc, got)
				if c.overflow {
					require.ErrorContains(t, err, "record overflow")
				} else {
					require.NoError(t, err)
					require.True(t, bytes.Equal(content, got))
				}
			})
		})
	}
	t.Run("ciphertext=2^14+257", func(t *testing.T) {
		_, rx := pairOfSessions(t)
		_, err := rx.Read(make([]byte, 64), feed([]byte{tlsrec.TypeAppData, 3, 3, 0x41, 0x01}))
		require.ErrorContains(t, err, "record_overflow")
		require.ErrorContains(t, err, "16640")
	})
}
