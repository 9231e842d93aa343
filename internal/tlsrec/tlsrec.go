// Package tlsrec speaks TLS 1.3 on a socket whose reads and writes the
// caller drives itself.
//
// goccl's TCP transport takes each socket out of Go's netpoller and reads
// and writes it without blocking from its own poll loop (transport/tcp).
// A crypto/tls.Conn cannot sit in that loop: it blocks in Read and Write,
// and a write that would block is fatal to it. Kernel TLS (kTLS) splits the
// work the way that loop needs: the handshake runs in user space, then the
// record keys are handed to the socket. This package makes the same split
// in user space:
//
//   - Handshake runs crypto/tls's handshake (TLS 1.3 only; certificates,
//     mutual authentication, key exchange) on the connection,
//   - and returns a Session that seals and opens the application data
//     records (RFC 8446 §5) with the traffic secrets that handshake
//     agreed, on whatever schedule the caller's loop has.
//
// The bytes on the wire are ordinary TLS 1.3: a crypto/tls.Conn at the
// other end reads them and its writes are read here (the tests check both
// ways), and a kernel with CONFIG_TLS could be handed the same keys.
//
// crypto/tls gives the traffic secrets out only through
// Config.KeyLogWriter (NSS key log lines). Handshake points it at a
// private buffer per connection, takes the two application traffic
// secrets from it and wipes the buffer; nothing is written anywhere.
//
// Key lifetime: a sender updates its keys (KeyUpdate, RFC 8446 §4.6.3)
// every 2^24 records, under the 2^24.5 full-size records RFC 8446 §5.5
// allows one AES-GCM key; it answers a peer's update request the same way.
//
// Closure (RFC 8446 §6.1): a writer ends its stream with SealCloseNotify,
// which Read at the other end returns as io.EOF. A stream that ends
// without one (the socket's end of file, between records or inside one)
// reads as ErrTruncated: an attacker who cuts the connection must not
// pass for a peer that finished.
package tlsrec

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/chacha20poly1305"
)

// Record layer constants (RFC 8446 §5).
const (
	typeAlert     = 21
	typeHandshake = 22
	typeAppData   = 23

	headerLen = 5
	// MaxPlaintext is the most application data one record carries.
	MaxPlaintext = 1 << 14
	// maxInner bounds a record's TLSInnerPlaintext: content, content type
	// and padding together (§5.4: padding does not raise the limit).
	maxInner = MaxPlaintext + 1
	// maxCiphertext bounds a record's body: plaintext, content type,
	// padding and tag together (§5.2). With the 16-byte tag of every TLS
	// 1.3 suite, maxInner is the tighter bound.
	maxCiphertext = MaxPlaintext + 256
	// Overhead is what sealing adds per record: header, inner content type
	// and the AEAD tag (16 bytes for every TLS 1.3 suite).
	Overhead = headerLen + 1 + 16

	alertLevelWarning = 1
	alertCloseNotify  = 0

	msgKeyUpdate         = 24
	msgNewSessionTicket  = 4
	defaultRecordsPerKey = 1 << 24
)

// ErrAuth reports a record that failed authentication: the stream was
// altered, or the peer seals with other keys.
var ErrAuth = errors.New("tls: record failed authentication (altered in transit, or sealed with other keys)")

// ErrTruncated reports a stream that ended without the peer's
// close_notify (RFC 8446 §6.1): the peer died or hung up without closing
// its TLS stream, or someone on the path cut it short. It wraps
// io.ErrUnexpectedEOF.
var ErrTruncated = fmt.Errorf("tls: the stream ended without close_notify, so it may have been cut short: %w", io.ErrUnexpectedEOF)

// LoadConfig reads this rank's certificate and key and the CA that signed
// every rank's, and returns the configuration both ends of a connection
// use: TLS 1.3 only; each side presents its certificate and checks the
// other's chain against the CA. Host names are not checked — ranks dial
// addresses, and the CA decides who belongs to the job, as in Gloo's TLS
// transport and etcd's peer TLS. Every rank both dials and accepts, so its
// certificate needs both the serverAuth and clientAuth extended key usages
// (or no extended key usage at all).
func LoadConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: loading certificate %s and key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: reading the CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", caFile)
	}
	return NewConfig(cert, pool), nil
}

// NewConfig is LoadConfig for a certificate and CA pool already loaded.
func NewConfig(cert tls.Certificate, ca *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// As the server: require a client certificate the CA signed.
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  ca,
		// As the client: crypto/tls would check the server's chain and its
		// name; there is no name to check, so the chain is checked here.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the peer presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: ca, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
			if err != nil {
				return fmt.Errorf("tls: the peer's certificate %q: %w", cs.PeerCertificates[0].Subject, err)
			}
			return nil
		},
	}
}

// Handshake runs a TLS 1.3 handshake over c, as the client if client is
// set, and returns the session to protect the rest of the connection's
// bytes with. It reads no byte beyond the handshake's last record, so
// whatever the peer sends next is still in the socket for the caller.
func Handshake(ctx context.Context, c net.Conn, cfg *tls.Config, client bool) (*Session, error) {
	var kl keyLog
	cfg = cfg.Clone()
	cfg.KeyLogWriter = &kl
	cfg.MinVersion = tls.VersionTLS13
	// A TLS 1.3 server sends tickets after the handshake, as records this
	// session would have to skip; nothing here resumes sessions.
	cfg.SessionTicketsDisabled = true
	bc := &recordBounded{Conn: c}
	var tc *tls.Conn
	if client {
		tc = tls.Client(bc, cfg)
	} else {
		tc = tls.Server(bc, cfg)
	}
	defer kl.wipe()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	st := tc.ConnectionState()
	if st.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("tls: negotiated version %#x, need TLS 1.3", st.Version)
	}
	if bc.left != 0 || bc.hn != 0 {
		return nil, errors.New("tls: the handshake ended inside a record")
	}
	cs, ss := kl.get("CLIENT_TRAFFIC_SECRET_0"), kl.get("SERVER_TRAFFIC_SECRET_0")
	if cs == nil || ss == nil {
		return nil, errors.New("tls: the handshake logged no traffic secrets")
	}
	if !client {
		cs, ss = ss, cs
	}
	return NewSession(st.CipherSuite, cs, ss, st)
}

// RecordBounded returns c with reads that never go past the end of the
// TLS record being read. Under crypto/tls it keeps whatever follows a
// record in the socket; a caller whose handshake failed on a header that
// was not TLS can then read the rest of what the peer sent.
func RecordBounded(c net.Conn) net.Conn { return &recordBounded{Conn: c} }

// HandshakeError is a TLS handshake that failed, as the TCP transport and
// the bootstrap report it; Permanent says whether trying again can mend it.
type HandshakeError struct{ Err error }

func (e *HandshakeError) Error() string { return "TLS handshake: " + e.Err.Error() }
func (e *HandshakeError) Unwrap() error { return e.Err }

// Permanent reports a failed handshake that trying again cannot mend: a
// certificate refused by either side, an alert from the peer, or a peer
// that does not speak TLS. Other failures (a connection reset or a
// timeout mid-handshake) may pass.
func Permanent(err error) bool {
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var alert tls.AlertError
	var op *net.OpError
	switch {
	case errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert):
		return true
	case errors.As(err, &op) && op.Op == "remote error": // crypto/tls's wrapping of a received alert
		return true
	}
	return strings.Contains(err.Error(), "certificate")
}

// recordBounded hands crypto/tls the connection's bytes one TLS record at
// a time and never reads past the end of the current one, so the
// handshake leaves the next record in the socket.
type recordBounded struct {
	net.Conn
	left int             // bytes of the current record's body still unread
	hdr  [headerLen]byte // the next record's header, being read
	hn   int             // bytes of hdr read
}

func (r *recordBounded) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.left == 0 {
		for r.hn < headerLen {
			n, err := r.Conn.Read(r.hdr[r.hn:])
			r.hn += n
			if err != nil {
				return 0, err
			}
		}
		n := copy(p, r.hdr[:])
		if n < headerLen { // a caller with a tiny buffer: hand the rest out next
			copy(r.hdr[:], r.hdr[n:])
			r.hn -= n
			return n, nil
		}
		r.hn = 0
		r.left = int(binary.BigEndian.Uint16(r.hdr[3:]))
		return n, nil
	}
	n, err := r.Conn.Read(p[:min(len(p), r.left)])
	r.left -= n
	return n, err
}

// keyLog collects crypto/tls's key log lines.
type keyLog struct{ buf bytes.Buffer }

func (k *keyLog) Write(p []byte) (int, error) { return k.buf.Write(p) }

func (k *keyLog) get(label string) []byte {
	for _, line := range bytes.Split(k.buf.Bytes(), []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) == 3 && string(f[0]) == label {
			s := make([]byte, hex.DecodedLen(len(f[2])))
			if _, err := hex.Decode(s, f[2]); err == nil {
				return s
			}
		}
	}
	return nil
}

func (k *keyLog) wipe() {
	b := k.buf.Bytes()
	clear(b[:cap(b)])
}

// Session protects one connection's application data after the
// handshake. Seal is called by one writer at a time and Read by one
// reader at a time; a writer and a reader may run at once.
type Session struct {
	// State is the handshake's outcome: suite, the peer's certificates.
	State tls.ConnectionState

	out, in        direction
	recordsPerKey  uint64
	updateNeeded   atomic.Bool // the peer asked for a KeyUpdate
	raw            []byte      // ciphertext read: raw[rr:rw] is unopened
	rr, rw         int
	plain          []byte // opened application data not yet read
	err            error  // sticky read error
	sealedRecords  atomic.Uint64
	openedRecords  atomic.Uint64
	keyUpdatesSent atomic.Uint64
}

// direction is one direction's keys.
type direction struct {
	suite  suite
	secret []byte
	aead   cipher.AEAD
	iv     [12]byte
	nonce  [12]byte
	seq    uint64
}

type suite struct {
	hash   func() hash.Hash
	keyLen int
	aead   func(key []byte) (cipher.AEAD, error)
}

func suiteOf(id uint16) (suite, error) {
	gcm := func(key []byte) (cipher.AEAD, error) {
		b, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(b)
	}
	switch id {
	case tls.TLS_AES_128_GCM_SHA256:
		return suite{sha256.New, 16, gcm}, nil
	case tls.TLS_AES_256_GCM_SHA384:
		return suite{sha512.New384, 32, gcm}, nil
	case tls.TLS_CHACHA20_POLY1305_SHA256:
		return suite{sha256.New, chacha20poly1305.KeySize, chacha20poly1305.New}, nil
	}
	return suite{}, fmt.Errorf("tls: cipher suite %s is not a TLS 1.3 suite", tls.CipherSuiteName(id))
}

// NewSession makes a session from a TLS 1.3 suite and the two application
// traffic secrets: the one this end seals with and the one it opens with.
// Handshake calls it; it is exported for tests and for callers that run
// the handshake some other way.
func NewSession(suiteID uint16, sendSecret, recvSecret []byte, st tls.ConnectionState) (*Session, error) {
	su, err := suiteOf(suiteID)
	if err != nil {
		return nil, err
	}
	s := &Session{State: st, recordsPerKey: defaultRecordsPerKey}
	if err := s.out.init(su, sendSecret); err != nil {
		return nil, err
	}
	if err := s.in.init(su, recvSecret); err != nil {
		return nil, err
	}
	return s, nil
}

// expandLabel is HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
func expandLabel(h func() hash.Hash, secret []byte, label string, n int) ([]byte, error) {
	info := make([]byte, 0, 4+6+len(label))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(6+len(label)))
	info = append(info, "tls13 "...)
	info = append(info, label...)
	info = append(info, 0) // context: empty
	return hkdf.Expand(h, secret, string(info), n)
}

func (d *direction) init(su suite, secret []byte) error {
	key, err := expandLabel(su.hash, secret, "key", su.keyLen)
	if err != nil {
		return err
	}
	iv, err := expandLabel(su.hash, secret, "iv", len(d.iv))
	if err != nil {
		return err
	}
	a, err := su.aead(key)
	if err != nil {
		return err
	}
	*d = direction{suite: su, secret: slices.Clone(secret), aead: a}
	copy(d.iv[:], iv)
	return nil
}

// update moves to the next traffic secret (RFC 8446 §7.2).
func (d *direction) update() error {
	next, err := expandLabel(d.suite.hash, d.secret, "traffic upd", d.suite.hash().Size())
	if err != nil {
		return err
	}
	return d.init(d.suite, next)
}

// nextNonce is the per-record nonce: the IV XOR the 64-bit sequence
// number, right-aligned (RFC 8446 §5.3).
func (d *direction) nextNonce() []byte {
	d.nonce = d.iv
	for i := range 8 {
		d.nonce[4+i] ^= byte(d.seq >> (56 - 8*i))
	}
	d.seq++
	return d.nonce[:]
}

// SetRecordsPerKey changes how many records are sealed under one key
// before a KeyUpdate (tests use a small number).
func (s *Session) SetRecordsPerKey(n uint64) { s.recordsPerKey = max(n, 1) }

// SealedLen is the number of bytes Seal appends for n bytes of data,
// not counting key updates.
func SealedLen(n int) int {
	return n + (n+MaxPlaintext-1)/MaxPlaintext*Overhead
}

// Seal appends to dst the records carrying a followed by b, and returns
// the extended slice.
func (s *Session) Seal(dst, a, b []byte) []byte {
	dst = slices.Grow(dst, SealedLen(len(a)+len(b)))
	for len(a)+len(b) > 0 {
		if s.out.seq >= s.recordsPerKey || s.updateNeeded.Load() {
			dst = s.sealKeyUpdate(dst)
		}
		n := min(MaxPlaintext, len(a)+len(b))
		ka := min(n, len(a))
		kb := n - ka
		dst = slices.Grow(dst, n+Overhead)
		start := len(dst)
		dst = append(dst, typeAppData, 3, 3, 0, 0)
		dst = append(dst, a[:ka]...)
		dst = append(dst, b[:kb]...)
		a, b = a[ka:], b[kb:]
		dst = s.sealRecord(dst, start, typeAppData)
	}
	return dst
}

// SealCloseNotify appends to dst a close_notify alert (RFC 8446 §6.1),
// which tells the peer that this end sends nothing more and that its
// stream was not cut short, and returns the extended slice. It is the
// last record the session seals: the writer calls it, as Seal, and sends
// it before closing; Seal must not be called after it.
func (s *Session) SealCloseNotify(dst []byte) []byte {
	// The key's record limit holds for alerts too. A peer's update
	// request need not be answered: §4.6.3 asks for the KeyUpdate before
	// the next application data, and none follows.
	if s.out.seq >= s.recordsPerKey {
		dst = s.sealKeyUpdate(dst)
	}
	dst = slices.Grow(dst, 2+Overhead)
	start := len(dst)
	dst = append(dst, typeAppData, 3, 3, 0, 0)
	// §6: TLS 1.3 implies an alert's severity by its description; the
	// level byte says warning, as for close_notify in earlier versions.
	dst = append(dst, alertLevelWarning, alertCloseNotify)
	return s.sealRecord(dst, start, typeAlert)
}

// sealRecord seals in place the record begun at dst[start:]: a header
// whose length is still zero, then the content.
func (s *Session) sealRecord(dst []byte, start int, inner byte) []byte {
	dst = append(dst, inner)
	body := start + headerLen
	binary.BigEndian.PutUint16(dst[start+3:], uint16(len(dst)-body+s.out.aead.Overhead()))
	sealed := s.out.aead.Seal(dst[body:body], s.out.nextNonce(), dst[body:], dst[start:body])
	s.sealedRecords.Add(1)
	return dst[:body+len(sealed)]
}

// sealKeyUpdate appends a KeyUpdate record under the current keys and
// moves this end's sending keys on.
func (s *Session) sealKeyUpdate(dst []byte) []byte {
	dst = slices.Grow(dst, 5+Overhead)
	start := len(dst)
	dst = append(dst, typeAppData, 3, 3, 0, 0)
	dst = append(dst, msgKeyUpdate, 0, 0, 1, 0) // update_not_requested
	dst = s.sealRecord(dst, start, typeHandshake)
	if err := s.out.update(); err != nil {
		panic("tlsrec: key update: " + err.Error()) // HKDF of a valid length cannot fail
	}
	s.updateNeeded.Store(false)
	s.keyUpdatesSent.Add(1)
	return dst
}

// Read fills p with application data, opening the records raw reads.
// raw must read what the socket has without blocking and return at least
// one byte or an error: io.EOF at the end, or a would-block error, which
// Read passes back once it has nothing to return. Read returns as soon as
// it has some data, without calling raw again.
//
// Once the peer's application data is all read, Read returns io.EOF if
// the peer ended with close_notify, and an error wrapping ErrTruncated if
// raw reached the end without one. Those, and a record refused (one that
// fails authentication or breaks RFC 8446), stick: later calls return the
// same error. raw's other errors are passed back as they come.
func (s *Session) Read(p []byte, raw func([]byte) (int, error)) (int, error) {
	n := 0
	for n < len(p) {
		if len(s.plain) > 0 {
			c := copy(p[n:], s.plain)
			s.plain = s.plain[c:]
			n += c
			continue
		}
		if s.err != nil {
			break
		}
		m, opened, err := s.open(p[n:])
		n += m
		if err != nil {
			s.err = err
			break
		}
		if opened {
			continue
		}
		if n > 0 {
			return n, nil
		}
		if s.raw == nil {
			s.raw = make([]byte, 4*(headerLen+maxCiphertext))
		}
		switch {
		case s.rr == s.rw:
			s.rr, s.rw = 0, 0
		case len(s.raw)-s.rw < headerLen+maxCiphertext:
			s.rw = copy(s.raw, s.raw[s.rr:s.rw])
			s.rr = 0
		}
		m, err = raw(s.raw[s.rw:])
		s.rw += m
		if m > 0 {
			continue
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		if err == io.EOF {
			// The socket's end is never the stream's clean end: a peer
			// that finished sent close_notify before it, which open
			// returned as io.EOF (§6.1).
			s.err = ErrTruncated
			if s.rw > s.rr {
				s.err = fmt.Errorf("%w (%d bytes into a record)", ErrTruncated, s.rw-s.rr)
			}
			err = s.err
		}
		return 0, err
	}
	if n > 0 {
		return n, nil
	}
	return 0, s.err
}

// open opens the next record if it has arrived whole and acts on control
// records. Application data goes straight into dst when the record fits
// (its length is returned), else it stays in s.plain: the first saves a
// copy of every full record a large read asks for.
func (s *Session) open(dst []byte) (int, bool, error) {
	if s.rw-s.rr < headerLen {
		return 0, false, nil
	}
	hdr := s.raw[s.rr : s.rr+headerLen]
	if hdr[0] != typeAppData || hdr[1] != 3 {
		return 0, false, fmt.Errorf("tls: a record of type %d, version %#x: the stream is not TLS 1.3 application data", hdr[0], binary.BigEndian.Uint16(hdr[1:]))
	}
	l := int(binary.BigEndian.Uint16(hdr[3:]))
	// The inner plaintext is the body less the tag, so its limit is
	// checked here, before the body is opened.
	if l > maxInner+s.in.aead.Overhead() || l < s.in.aead.Overhead()+1 {
		return 0, false, s.lengthErr(l)
	}
	if s.rw-s.rr < headerLen+l {
		return 0, false, nil
	}
	body := s.raw[s.rr+headerLen : s.rr+headerLen+l]
	out := body[:0] // in place
	direct := len(dst) >= l-s.in.aead.Overhead()
	if direct {
		out = dst[:0]
	}
	pt, err := s.in.aead.Open(out, s.in.nextNonce(), body, hdr)
	if err != nil {
		return 0, false, ErrAuth
	}
	s.rr += headerLen + l
	s.openedRecords.Add(1)
	i := len(pt) - 1
	for i >= 0 && pt[i] == 0 {
		i--
	}
	if i < 0 {
		return 0, false, errors.New("tls: a record with no content type")
	}
	typ, pt := pt[i], pt[:i]
	switch typ {
	case typeAppData:
		if direct {
			return len(pt), true, nil
		}
		s.plain = pt
		return 0, true, nil
	case typeAlert:
		if len(pt) == 2 && pt[1] == 0 {
			return 0, false, io.EOF // close_notify
		}
		if len(pt) == 2 {
			return 0, false, fmt.Errorf("tls: the peer sent an alert: %w", tls.AlertError(pt[1]))
		}
		return 0, false, fmt.Errorf("tls: a malformed alert %v", pt)
	case typeHandshake:
		return 0, true, s.postHandshake(pt)
	}
	return 0, false, fmt.Errorf("tls: a record of content type %d", typ)
}

// lengthErr says why a record of l bytes is refused.
func (s *Session) lengthErr(l int) error {
	tag := s.in.aead.Overhead()
	switch {
	case l > maxCiphertext:
		return fmt.Errorf("tls: record_overflow: a record of %d bytes, the limit is %d (RFC 8446 §5.2)", l, maxCiphertext)
	case l > maxInner+tag:
		return fmt.Errorf("tls: record_overflow: a record of %d bytes of plaintext with its content type and padding, the limit is %d (RFC 8446 §5.4)", l-tag, maxInner)
	}
	return fmt.Errorf("tls: a record of %d bytes, the least is %d", l, tag+1)
}

// postHandshake handles handshake messages after the handshake: key
// updates, and session tickets (ignored: nothing here resumes).
func (s *Session) postHandshake(b []byte) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return errors.New("tls: a truncated handshake message")
		}
		l := int(b[1])<<16 | int(b[2])<<8 | int(b[3])
		if len(b) < 4+l {
			return errors.New("tls: a handshake message split across records")
		}
		switch b[0] {
		case msgKeyUpdate:
			if l != 1 || b[4] > 1 {
				return errors.New("tls: a malformed KeyUpdate")
			}
			// The records after a KeyUpdate are under the next key, so it
			// must end its record (§5.1: a key change aligns with a record
			// boundary, else unexpected_message).
			if len(b) > 4+l {
				return errors.New("tls: unexpected_message: a KeyUpdate followed by more handshake data in its record (RFC 8446 §5.1)")
			}
			if err := s.in.update(); err != nil {
				return err
			}
			if b[4] == 1 {
				s.updateNeeded.Store(true)
			}
		case msgNewSessionTicket:
		default:
			return fmt.Errorf("tls: unexpected handshake message type %d after the handshake", b[0])
		}
		b = b[4+l:]
	}
	return nil
}

// Stats counts records sealed and opened and key updates sent.
type Stats struct{ Sealed, Opened, KeyUpdates uint64 }

// Stats returns the session's counters. Any goroutine may call it.
func (s *Session) Stats() Stats {
	return Stats{s.sealedRecords.Load(), s.openedRecords.Load(), s.keyUpdatesSent.Load()}
}
