package tlsrec

import (
	"encoding/binary"
	"slices"
)

// Content types and handshake message types, for tests that build their
// own records.
const (
	TypeAlert           = typeAlert
	TypeHandshake       = typeHandshake
	TypeAppData         = typeAppData
	MsgKeyUpdate        = msgKeyUpdate
	MsgNewSessionTicket = msgNewSessionTicket
)

// SealInner seals one record whose TLSInnerPlaintext (RFC 8446 §5.2) is
// content, then inner as its content type, then pad zero bytes, under the
// session's sending keys. Unlike Seal it checks nothing, so tests can
// build records this package never sends: oversized, padded, or with
// handshake messages packed as a peer might. A KeyUpdate sealed here does
// not move the sending keys on; UpdateSendKeys does.
func (s *Session) SealInner(dst []byte, inner byte, content []byte, pad int) []byte {
	dst = slices.Grow(dst, headerLen+len(content)+1+pad+s.out.aead.Overhead())
	start := len(dst)
	dst = append(dst, typeAppData, 3, 3, 0, 0)
	dst = append(dst, content...)
	dst = append(dst, inner)
	dst = append(dst, make([]byte, pad)...)
	body := start + headerLen
	binary.BigEndian.PutUint16(dst[start+3:], uint16(len(dst)-body+s.out.aead.Overhead()))
	sealed := s.out.aead.Seal(dst[body:body], s.out.nextNonce(), dst[body:], dst[start:body])
	return dst[:body+len(sealed)]
}

// UpdateSendKeys moves the sending keys on, as a KeyUpdate sent does.
func (s *Session) UpdateSendKeys() {
	if err := s.out.update(); err != nil {
		panic(err)
	}
}
