// Package wire holds every message goccl puts on a network connection:
// the handshake that proves both ends know the job's secret, the peer
// information ranks exchange through the root, the setup of a data
// connection, and the header of each data slice.
//
// Each message type T has Len() int, Append(b []byte) []byte and a
// ParseT(b []byte) (T, int, error) that returns the number of bytes used.
// Parsers never panic and never allocate more than the input justifies:
// lengths are checked against the bytes actually present and against the
// limits below. A buffer cut short yields ErrShort, so stream readers can
// tell "read more" from "garbage". All integers are big-endian.
package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic opens every goccl connection.
const Magic = "goccl\x00"

// ProtocolVersion is the version of everything in this package. Peers
// with a different version are refused with a clear error. 2: the
// watchdog's probes (FrameProbe, Diagnosis.Probe, WhereProbe) and
// Wait.Device, which a root of version 1 would take for a malformed
// frame and a reason to drop the rank. 3: SliceLent in TCP slice
// headers, which a receiver of version 2 would take for part of the
// slice number and report as a mismatch.
const ProtocolVersion uint16 = 3

// Limits on variable-length fields.
const (
	MaxString   = 1024
	MaxTopology = 1 << 20
	MaxPeers    = 1 << 16
	MaxFrame    = 64 << 20
	NonceLen    = 16
	ProofLen    = sha256.Size
)

// Errors.
var (
	// ErrShort: the buffer ends before the message does.
	ErrShort = errors.New("wire: message truncated")
	// ErrBadMagic: the bytes are not a goccl connection at all.
	ErrBadMagic = errors.New("wire: not a goccl connection (bad magic)")
)

// Purpose says what a connection is for.
type Purpose uint8

// Purposes.
const (
	PurposeBootstrap Purpose = 1 // a rank registering with the root
	PurposeData      Purpose = 2 // a transport connection between ranks
	PurposeShm       Purpose = 3 // a shared-memory segment handed between ranks
	PurposeVerbs     Purpose = 4 // the control connection of an RDMA connection
)

func (p Purpose) String() string {
	switch p {
	case PurposeBootstrap:
		return "bootstrap"
	case PurposeData:
		return "data"
	case PurposeShm:
		return "shm"
	case PurposeVerbs:
		return "verbs"
	}
	return fmt.Sprintf("purpose(%d)", uint8(p))
}

// Hello is the first message of every connection, client to server.
type Hello struct {
	Version uint16
	Purpose Purpose
	Nonce   [NonceLen]byte
}

const helloLen = len(Magic) + 2 + 1 + NonceLen

func (h *Hello) Len() int { return helloLen }

func (h *Hello) Append(b []byte) []byte {
	b = append(b, Magic...)
	b = binary.BigEndian.AppendUint16(b, h.Version)
	b = append(b, byte(h.Purpose))
	return append(b, h.Nonce[:]...)
}

// ParseHello parses a Hello. The magic is checked first, so a stranger
// speaking another protocol is told apart from a short read as soon as
// its first bytes differ.
func ParseHello(b []byte) (Hello, int, error) {
	var h Hello
	for i := 0; i < len(Magic); i++ {
		if i >= len(b) {
			return h, 0, ErrShort
		}
		if b[i] != Magic[i] {
			return h, 0, ErrBadMagic
		}
	}
	if len(b) < helloLen {
		return h, 0, ErrShort
	}
	p := b[len(Magic):]
	h.Version = binary.BigEndian.Uint16(p)
	h.Purpose = Purpose(p[2])
	copy(h.Nonce[:], p[3:])
	return h, helloLen, nil
}

// Challenge is the server's answer to a Hello: its own nonce, and its
// proof that it knows the secret.
type Challenge struct {
	Nonce [NonceLen]byte
	Proof [ProofLen]byte
}

const challengeLen = NonceLen + ProofLen

func (c *Challenge) Len() int { return challengeLen }

func (c *Challenge) Append(b []byte) []byte {
	b = append(b, c.Nonce[:]...)
	return append(b, c.Proof[:]...)
}

func ParseChallenge(b []byte) (Challenge, int, error) {
	var c Challenge
	if len(b) < challengeLen {
		return c, 0, ErrShort
	}
	copy(c.Nonce[:], b)
	copy(c.Proof[:], b[NonceLen:])
	return c, challengeLen, nil
}

// Response is the client's proof that it knows the secret.
type Response struct {
	Proof [ProofLen]byte
}

func (r *Response) Len() int { return ProofLen }

func (r *Response) Append(b []byte) []byte { return append(b, r.Proof[:]...) }

func ParseResponse(b []byte) (Response, int, error) {
	var r Response
	if len(b) < ProofLen {
		return r, 0, ErrShort
	}
	copy(r.Proof[:], b)
	return r, ProofLen, nil
}

// Roles for Proof.
const (
	RoleServer byte = 'S'
	RoleClient byte = 'C'
)

// Proof returns HMAC-SHA256(secret, role ‖ hello ‖ server nonce ‖ bound):
// what each end sends to show it knows the secret. Both nonces are fresh
// per connection, so a recorded handshake cannot be replayed, and the role
// byte keeps a server's proof from serving as a client's. bound is the
// client's first frame (empty for the server's proof): covering it means
// the frame that says who the client is and what the connection is for
// (PeerInfo, ConnSetup) cannot be altered or relayed to another rank.
func Proof(secret []byte, role byte, h *Hello, serverNonce [NonceLen]byte, bound []byte) [ProofLen]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte{role})
	m.Write(h.Append(make([]byte, 0, helloLen)))
	m.Write(serverNonce[:])
	m.Write(bound)
	var out [ProofLen]byte
	copy(out[:], m.Sum(nil))
	return out
}

// CheckProof reports whether got is the right proof, in constant time.
func CheckProof(secret []byte, role byte, h *Hello, serverNonce [NonceLen]byte, bound []byte, got [ProofLen]byte) bool {
	want := Proof(secret, role, h, serverNonce, bound)
	return hmac.Equal(want[:], got[:])
}

// FrameType names a framed message.
type FrameType uint8

// Frame types.
const (
	FramePeerInfo  FrameType = 1 // rank → root
	FrameTable     FrameType = 2 // root → rank
	FrameReject    FrameType = 3 // either way: why the connection is refused
	FrameConnSetup FrameType = 4 // dialer → listener of a data connection
	FrameChallenge FrameType = 5 // server → client, after a Hello
	FrameResponse  FrameType = 6 // client → server, after a Challenge
	// After the table, a rank's bootstrap connection watches for
	// failures: a rank tells the root it aborts, the root tells every
	// other rank which rank aborted or died (FrameAbort); a rank closing
	// its communicator says goodbye first (FrameBye, empty).
	FrameAbort FrameType = 7
	FrameBye   FrameType = 8
	// FrameShrink carries a surviving rank's new PeerInfo to the root,
	// which answers every survivor with the new table (FrameTable).
	FrameShrink FrameType = 9
	// FrameQPInfo carries one end's queue pairs and memory of an RDMA
	// connection (VerbsInfo), each way, after the ConnSetup.
	FrameQPInfo FrameType = 10
	// FramePing (root → rank) and FramePong (rank → root), both empty,
	// are the watch's heartbeat: a rank whose process is stopped,
	// deadlocked or swapping stops answering, one whose application is
	// merely busy does not (its library answers from a goroutine of its
	// own).
	FramePing FrameType = 11
	FramePong FrameType = 12
	// A rank whose operation timed out asks the root for a diagnosis
	// (FrameStall, a Stall); the root asks every rank where it waits
	// (FrameWhere, a round number), each answers from its library's own
	// goroutine (FrameWait: the round and a Wait), and the root sends
	// every rank what it gathered (FrameDiagnosis), from which each
	// follows the chain of waits to the rank at its end.
	FrameStall     FrameType = 13
	FrameWhere     FrameType = 14
	FrameWait      FrameType = 15
	FrameDiagnosis FrameType = 16
	// FrameProbe (a Stall) asks the same of the root for an operation
	// that has waited long but not timed out: the where-queries of its
	// round carry a flag byte (WhereProbe), and its diagnosis
	// (Diagnosis.Probe) aborts nothing unless it shows a fault the ranks
	// cannot wait out (one operation's buffers placed differently).
	FrameProbe FrameType = 17
)

// WhereProbe is the flag byte after a where-query's round number when
// the round is a probe's.
const WhereProbe = 1

func (t FrameType) String() string {
	switch t {
	case FramePeerInfo:
		return "peer-info"
	case FrameTable:
		return "table"
	case FrameReject:
		return "reject"
	case FrameConnSetup:
		return "conn-setup"
	case FrameChallenge:
		return "challenge"
	case FrameResponse:
		return "response"
	case FrameAbort:
		return "abort"
	case FrameBye:
		return "bye"
	case FrameShrink:
		return "shrink"
	case FrameQPInfo:
		return "qp-info"
	case FramePing:
		return "ping"
	case FramePong:
		return "pong"
	case FrameStall:
		return "stall"
	case FrameWhere:
		return "where"
	case FrameWait:
		return "wait"
	case FrameDiagnosis:
		return "diagnosis"
	case FrameProbe:
		return "probe"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// FrameHeaderLen is the size of a frame header: type (1) and payload
// length (4).
const FrameHeaderLen = 5

// AppendFrame appends a frame holding payload.
func AppendFrame(b []byte, t FrameType, payload []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// ParseFrameHeader parses a frame header and checks the length against
// MaxFrame.
func ParseFrameHeader(b []byte) (FrameType, int, error) {
	if len(b) < FrameHeaderLen {
		return 0, 0, ErrShort
	}
	n := binary.BigEndian.Uint32(b[1:])
	if n > MaxFrame {
		return 0, 0, fmt.Errorf("wire: frame of %d bytes exceeds the %d-byte limit", n, MaxFrame)
	}
	return FrameType(b[0]), int(n), nil
}

// PeerInfo is what a rank tells the root about itself.
type PeerInfo struct {
	Rank   uint32
	NRanks uint32
	PID    uint32
	// WaitMillis is how long the rank will wait for the table: the root
	// reports missing ranks before the first registered rank gives up.
	WaitMillis uint32
	HostID     string // hostname + boot id, or GOCCL_HOSTID
	DataAddr   string // host:port of the rank's data listener
	Version    string // library version
	Topology   []byte // opaque topology summary
}

func (p *PeerInfo) Len() int {
	return 16 + 2 + len(p.HostID) + 2 + len(p.DataAddr) + 2 + len(p.Version) + 4 + len(p.Topology)
}

func (p *PeerInfo) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, p.Rank)
	b = binary.BigEndian.AppendUint32(b, p.NRanks)
	b = binary.BigEndian.AppendUint32(b, p.PID)
	b = binary.BigEndian.AppendUint32(b, p.WaitMillis)
	b = appendString(b, p.HostID)
	b = appendString(b, p.DataAddr)
	b = appendString(b, p.Version)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.Topology)))
	return append(b, p.Topology...)
}

// Validate reports fields over the limits (Append does not check).
func (p *PeerInfo) Validate() error {
	for _, s := range []string{p.HostID, p.DataAddr, p.Version} {
		if len(s) > MaxString {
			return fmt.Errorf("wire: string of %d bytes exceeds the %d-byte limit", len(s), MaxString)
		}
	}
	if len(p.Topology) > MaxTopology {
		return fmt.Errorf("wire: topology of %d bytes exceeds the %d-byte limit", len(p.Topology), MaxTopology)
	}
	return nil
}

func ParsePeerInfo(b []byte) (PeerInfo, int, error) {
	var p PeerInfo
	if len(b) < 16 {
		return p, 0, ErrShort
	}
	p.Rank = binary.BigEndian.Uint32(b)
	p.NRanks = binary.BigEndian.Uint32(b[4:])
	p.PID = binary.BigEndian.Uint32(b[8:])
	p.WaitMillis = binary.BigEndian.Uint32(b[12:])
	off := 16
	var err error
	for _, dst := range []*string{&p.HostID, &p.DataAddr, &p.Version} {
		var n int
		if *dst, n, err = parseString(b[off:]); err != nil {
			return PeerInfo{}, 0, err
		}
		off += n
	}
	if len(b) < off+4 {
		return PeerInfo{}, 0, ErrShort
	}
	tl := binary.BigEndian.Uint32(b[off:])
	off += 4
	if tl > MaxTopology {
		return PeerInfo{}, 0, fmt.Errorf("wire: topology of %d bytes exceeds the %d-byte limit", tl, MaxTopology)
	}
	if uint64(len(b)) < uint64(off)+uint64(tl) {
		return PeerInfo{}, 0, ErrShort
	}
	if tl > 0 {
		p.Topology = append([]byte(nil), b[off:off+int(tl)]...)
	}
	return p, off + int(tl), nil
}

// Table is the root's answer once every rank has registered: every rank's
// PeerInfo, indexed by rank.
type Table struct {
	Peers []PeerInfo
}

func (t *Table) Len() int {
	n := 4
	for i := range t.Peers {
		n += t.Peers[i].Len()
	}
	return n
}

func (t *Table) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(t.Peers)))
	for i := range t.Peers {
		b = t.Peers[i].Append(b)
	}
	return b
}

func ParseTable(b []byte) (Table, int, error) {
	var t Table
	if len(b) < 4 {
		return t, 0, ErrShort
	}
	n := binary.BigEndian.Uint32(b)
	if n > MaxPeers {
		return t, 0, fmt.Errorf("wire: table of %d peers exceeds the %d limit", n, MaxPeers)
	}
	off := 4
	// Every PeerInfo takes at least 26 bytes: do not trust n for the
	// allocation beyond what the input can hold.
	if n > 0 {
		t.Peers = make([]PeerInfo, 0, min(int(n), len(b)/26))
	}
	for i := uint32(0); i < n; i++ {
		p, m, err := ParsePeerInfo(b[off:])
		if err != nil {
			return Table{}, 0, err
		}
		t.Peers = append(t.Peers, p)
		off += m
	}
	return t, off, nil
}

// Reject tells the other end why it is refused, before closing.
type Reject struct {
	Reason string
}

func (r *Reject) Len() int { return 2 + len(r.Reason) }

func (r *Reject) Append(b []byte) []byte {
	s := r.Reason
	if len(s) > MaxString {
		s = s[:MaxString]
	}
	return appendString(b, s)
}

func ParseReject(b []byte) (Reject, int, error) {
	s, n, err := parseString(b)
	return Reject{Reason: s}, n, err
}

// Abort says that a rank failed: it aborted with Reason, or (from the
// root) its process went away without saying goodbye.
type Abort struct {
	Rank uint32
	Died bool // the root lost the rank's connection without a goodbye
	// Silent: the rank stopped answering the root's heartbeat (its
	// process is stopped, deadlocked or swapping); Reason says how long.
	Silent bool
	// Left: the rank closed its communicator (said goodbye); not a
	// failure, but nobody can connect to it any more.
	Left   bool
	Reason string
}

func (a *Abort) Len() int { return 5 + 2 + len(a.Reason) }

func (a *Abort) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, a.Rank)
	kind := byte(0)
	switch {
	case a.Left:
		kind = 3
	case a.Silent:
		kind = 2
	case a.Died:
		kind = 1
	}
	b = append(b, kind)
	s := a.Reason
	if len(s) > MaxString {
		s = s[:MaxString]
	}
	return appendString(b, s)
}

func ParseAbort(b []byte) (Abort, int, error) {
	if len(b) < 5 {
		return Abort{}, 0, ErrShort
	}
	a := Abort{Rank: binary.BigEndian.Uint32(b), Died: b[4] == 1, Silent: b[4] == 2, Left: b[4] == 3}
	if b[4] > 3 {
		return Abort{}, 0, fmt.Errorf("wire: abort kind %d, want 0 to 3", b[4])
	}
	s, n, err := parseString(b[5:])
	if err != nil {
		return Abort{}, 0, err
	}
	a.Reason = s
	return a, 5 + n, nil
}

// Stall is what a rank whose operation timed out tells the root: which
// operation (the collective's name and sequence number) and its timeout.
type Stall struct {
	Seq     uint64
	Timeout int64 // nanoseconds
	Op      string
}

func (s *Stall) Len() int { return 16 + 2 + min(len(s.Op), MaxString) }

func (s *Stall) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, s.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(s.Timeout))
	return appendString(b, truncate(s.Op))
}

func ParseStall(b []byte) (Stall, int, error) {
	if len(b) < 16 {
		return Stall{}, 0, ErrShort
	}
	s := Stall{Seq: binary.BigEndian.Uint64(b), Timeout: int64(binary.BigEndian.Uint64(b[8:]))}
	op, n, err := parseString(b[16:])
	if err != nil {
		return Stall{}, 0, err
	}
	s.Op = op
	return s, 16 + n, nil
}

// WaitState says what a rank is doing, for a diagnosis.
type WaitState uint8

const (
	WaitIdle     WaitState = 0 // no operation running
	WaitRunning  WaitState = 1 // an operation running (Peer: whom it waits on)
	WaitNoAnswer WaitState = 2 // it did not answer the root in time
	WaitGone     WaitState = 3 // it left the job (goodbye, abort or death)
)

// Wait is where one rank is: its answer to a FrameWhere, or the root's
// account of a rank that could not answer.
type Wait struct {
	Rank  uint32
	State WaitState
	// Seq and Op: the running operation, or (idle) the last one issued;
	// Op is "" when it issued none.
	Seq  uint64
	Peer int32 // the rank a running operation waits on; -1 none
	// For is how long the rank has been in State (nanoseconds): since its
	// operation started, since its last one ended, or since the root last
	// heard from it.
	For    int64
	Op     string
	Detail string // where a running operation waits, how the last ended
	// Device: the running operation's buffers are in device memory (sent
	// as the state byte's high bit), so that a diagnosis can tell ranks
	// that placed one operation's buffers differently.
	Device bool
}

// waitDevice is the state byte's bit for Wait.Device.
const waitDevice = 0x80

func (w *Wait) Len() int {
	return 4 + 1 + 8 + 4 + 8 + 2 + min(len(w.Op), MaxString) + 2 + min(len(w.Detail), MaxString)
}

func (w *Wait) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, w.Rank)
	st := byte(w.State)
	if w.Device {
		st |= waitDevice
	}
	b = append(b, st)
	b = binary.BigEndian.AppendUint64(b, w.Seq)
	b = binary.BigEndian.AppendUint32(b, uint32(w.Peer))
	b = binary.BigEndian.AppendUint64(b, uint64(w.For))
	b = appendString(b, truncate(w.Op))
	return appendString(b, truncate(w.Detail))
}

func ParseWait(b []byte) (Wait, int, error) {
	if len(b) < 25 {
		return Wait{}, 0, ErrShort
	}
	w := Wait{Rank: binary.BigEndian.Uint32(b), State: WaitState(b[4] &^ waitDevice), Device: b[4]&waitDevice != 0,
		Seq: binary.BigEndian.Uint64(b[5:]), Peer: int32(binary.BigEndian.Uint32(b[13:])), For: int64(binary.BigEndian.Uint64(b[17:]))}
	if w.State > WaitGone {
		return Wait{}, 0, fmt.Errorf("wire: wait state %d, want 0 to 3", w.State)
	}
	off := 25
	var err error
	var n int
	if w.Op, n, err = parseString(b[off:]); err != nil {
		return Wait{}, 0, err
	}
	off += n
	if w.Detail, n, err = parseString(b[off:]); err != nil {
		return Wait{}, 0, err
	}
	return w, off + n, nil
}

// Diagnosis is what the root gathered after a rank's operation timed
// out: that rank (From), its Stall, and every rank's Wait, by rank.
type Diagnosis struct {
	From uint32
	// Silent: From stopped answering the heartbeat (the root's notice
	// follows), and Stall is empty.
	Silent bool
	// Probe: From's operation has waited long, not timed out (FrameProbe).
	Probe bool
	Stall Stall
	Waits []Wait
}

// Misplaced returns the ranks running d's stalled operation on host
// memory and those running it on device memory, when there are both
// (else nil, nil): ranks that placed one operation's buffers differently,
// which run it on separate connections and would wait for each other
// until the timeout. Point-to-point operations ("send", "recv") are left
// out: they are numbered with every operation, so two ranks' sends of
// one number need not be one transfer.
func (d *Diagnosis) Misplaced() (host, device []int) {
	if d.Stall.Op == "send" || d.Stall.Op == "recv" {
		return nil, nil
	}
	for r, w := range d.Waits {
		if w.State != WaitRunning || w.Seq != d.Stall.Seq || w.Op != d.Stall.Op {
			continue
		}
		if w.Device {
			device = append(device, r)
		} else {
			host = append(host, r)
		}
	}
	if len(host) == 0 || len(device) == 0 {
		return nil, nil
	}
	return host, device
}

// A diagnosis's flags: one of these, or none.
const (
	diagSilent = 1
	diagProbe  = 2
)

func (d *Diagnosis) Len() int {
	n := 4 + 1 + d.Stall.Len() + 4
	for i := range d.Waits {
		n += d.Waits[i].Len()
	}
	return n
}

func (d *Diagnosis) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, d.From)
	flags := byte(0)
	if d.Silent {
		flags = diagSilent
	}
	if d.Probe {
		flags |= diagProbe
	}
	b = append(b, flags)
	b = d.Stall.Append(b)
	b = binary.BigEndian.AppendUint32(b, uint32(len(d.Waits)))
	for i := range d.Waits {
		b = d.Waits[i].Append(b)
	}
	return b
}

func ParseDiagnosis(b []byte) (Diagnosis, int, error) {
	if len(b) < 5 {
		return Diagnosis{}, 0, ErrShort
	}
	d := Diagnosis{From: binary.BigEndian.Uint32(b), Silent: b[4] == diagSilent, Probe: b[4] == diagProbe}
	if b[4] > diagProbe {
		return Diagnosis{}, 0, fmt.Errorf("wire: diagnosis flags %#x, want 0, 1 (silent) or 2 (probe)", b[4])
	}
	s, n, err := ParseStall(b[5:])
	if err != nil {
		return Diagnosis{}, 0, err
	}
	d.Stall = s
	off := 5 + n
	if len(b) < off+4 {
		return Diagnosis{}, 0, ErrShort
	}
	count := binary.BigEndian.Uint32(b[off:])
	off += 4
	if count > MaxPeers {
		return Diagnosis{}, 0, fmt.Errorf("wire: diagnosis of %d ranks exceeds the %d limit", count, MaxPeers)
	}
	// Each Wait takes at least 29 bytes: a count the payload cannot hold
	// is refused before anything is allocated for it.
	if int(count) > (len(b)-off)/29 {
		return Diagnosis{}, 0, ErrShort
	}
	if count > 0 {
		d.Waits = make([]Wait, count)
	}
	for i := range d.Waits {
		w, n, err := ParseWait(b[off:])
		if err != nil {
			return Diagnosis{}, 0, err
		}
		if w.Rank != uint32(i) {
			return Diagnosis{}, 0, fmt.Errorf("wire: diagnosis entry %d is rank %d's", i, w.Rank)
		}
		d.Waits[i] = w
		off += n
	}
	if count > 0 && d.From >= count {
		return Diagnosis{}, 0, fmt.Errorf("wire: diagnosis from rank %d of %d", d.From, count)
	}
	return d, off, nil
}

// truncate cuts s to MaxString bytes (a reason longer than that loses
// its tail rather than failing the message).
func truncate(s string) string {
	if len(s) > MaxString {
		return s[:MaxString]
	}
	return s
}

// ConnSetup opens a data connection: which ranks and channel it joins,
// and which of the connection's sockets this is.
type ConnSetup struct {
	From, To uint32
	Channel  uint32
	Socket   uint16
	NSocks   uint16
	Flags    uint16 // ConnTLS
}

// ConnTLS in ConnSetup.Flags says the dialer runs TLS on the socket next:
// an acceptor that does not (or does, when it is clear) refuses the
// socket with a reason instead of reading a handshake as data.
const ConnTLS uint16 = 1

// ConnBoard in ConnSetup.Flags says the dialer hands over a board, the
// memory all of a host's ranks share (transport/shm), not a pair's
// segment.
const ConnBoard uint16 = 2

// ConnCredits in ConnSetup.Flags says the dialer paces its TCP
// connection's large slices by its receiver's credits: the connection has
// one more socket than NSocks, number NSocks, its control socket, which
// carries credit frames (CreditHeader) and nothing else.
const ConnCredits uint16 = 4

const connSetupLen = 18

func (c *ConnSetup) Len() int { return connSetupLen }

func (c *ConnSetup) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, c.From)
	b = binary.BigEndian.AppendUint32(b, c.To)
	b = binary.BigEndian.AppendUint32(b, c.Channel)
	b = binary.BigEndian.AppendUint16(b, c.Socket)
	b = binary.BigEndian.AppendUint16(b, c.NSocks)
	return binary.BigEndian.AppendUint16(b, c.Flags)
}

func ParseConnSetup(b []byte) (ConnSetup, int, error) {
	var c ConnSetup
	if len(b) < connSetupLen {
		return c, 0, ErrShort
	}
	c.From = binary.BigEndian.Uint32(b)
	c.To = binary.BigEndian.Uint32(b[4:])
	c.Channel = binary.BigEndian.Uint32(b[8:])
	c.Socket = binary.BigEndian.Uint16(b[12:])
	c.NSocks = binary.BigEndian.Uint16(b[14:])
	c.Flags = binary.BigEndian.Uint16(b[16:])
	return c, connSetupLen, nil
}

// SliceHeader precedes every data slice on a TCP connection: the engine's
// tag and the payload length.
type SliceHeader struct {
	Op    uint64
	Sig   uint32
	Msg   uint32
	Slice uint32
	Size  uint32 // payload bytes
}

// SliceHeaderLen is the encoded size of a SliceHeader.
const SliceHeaderLen = 24

// AbortOp marks a SliceHeader that is an abort notice rather than data:
// its payload (Size bytes, at most MaxString) is the reason the sender is
// giving up, sent before it closes the connection so that the peer can
// name the cause rather than just the lost connection.
const AbortOp = ^uint64(0)

// CloseOp marks a SliceHeader that is a close notice rather than data: the
// sender closed its endpoint gracefully after every slice before the
// notice, and sends nothing more. It has no payload (Size 0).
const CloseOp = ^uint64(0) - 1

// CreditOp marks a SliceHeader on a TCP connection's control socket: the
// receiver has read Credit() of the sender's counted slices so far (a
// cumulative count, so a later frame supersedes an earlier one). It has no
// payload (Size 0).
const CreditOp = ^uint64(0) - 2

// WindowOp marks the first SliceHeader on each direction of a TCP
// connection's control socket: the sender's window (Msg) and slot count
// (Slice), from which its receiver works out how often to credit. It has
// no payload (Size 0).
const WindowOp = ^uint64(0) - 3

// SliceLent is a flag in a TCP data slice's SliceHeader.Slice (slice
// numbers stay below it): the sender lent the slice's pages to the
// kernel rather than copying them, and may change them only once the
// receiver has read the slice, so the receiver credits it as soon as it
// has.
const SliceLent = 1 << 31

// CreditHeader is the credit frame for n counted slices read.
func CreditHeader(n uint64) SliceHeader {
	return SliceHeader{Op: CreditOp, Sig: uint32(n >> 32), Msg: uint32(n)}
}

// Credit is the count a credit frame carries.
func (h *SliceHeader) Credit() uint64 { return uint64(h.Sig)<<32 | uint64(h.Msg) }

func (h *SliceHeader) Len() int { return SliceHeaderLen }

func (h *SliceHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, h.Op)
	b = binary.BigEndian.AppendUint32(b, h.Sig)
	b = binary.BigEndian.AppendUint32(b, h.Msg)
	b = binary.BigEndian.AppendUint32(b, h.Slice)
	return binary.BigEndian.AppendUint32(b, h.Size)
}

// Put encodes h into b[:SliceHeaderLen] without allocating.
func (h *SliceHeader) Put(b []byte) {
	binary.BigEndian.PutUint64(b, h.Op)
	binary.BigEndian.PutUint32(b[8:], h.Sig)
	binary.BigEndian.PutUint32(b[12:], h.Msg)
	binary.BigEndian.PutUint32(b[16:], h.Slice)
	binary.BigEndian.PutUint32(b[20:], h.Size)
}

func ParseSliceHeader(b []byte) (SliceHeader, int, error) {
	var h SliceHeader
	if len(b) < SliceHeaderLen {
		return h, 0, ErrShort
	}
	h.Op = binary.BigEndian.Uint64(b)
	h.Sig = binary.BigEndian.Uint32(b[8:])
	h.Msg = binary.BigEndian.Uint32(b[12:])
	h.Slice = binary.BigEndian.Uint32(b[16:])
	h.Size = binary.BigEndian.Uint32(b[20:])
	return h, SliceHeaderLen, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func parseString(b []byte) (string, int, error) {
	if len(b) < 2 {
		return "", 0, ErrShort
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > MaxString {
		return "", 0, fmt.Errorf("wire: string of %d bytes exceeds the %d-byte limit", n, MaxString)
	}
	if len(b) < 2+n {
		return "", 0, ErrShort
	}
	return string(b[2 : 2+n]), 2 + n, nil
}

// MaxQPs is the most queue pairs one RDMA connection stripes over.
const MaxQPs = 16

// VerbsInfo is what one end of an RDMA connection tells the other: how to
// address its port, its queue pairs, and the registered memory the peer
// writes into (slots, slot headers and the clear-to-send FIFO, laid out
// as the verbs transport says, from Addr on).
type VerbsInfo struct {
	LID      uint16
	MTU      uint8 // ibv_mtu of the port
	GID      [16]byte
	PSN      uint32 // first packet sequence number of every QP
	QPNs     []uint32
	Addr     uint64 // base of the region
	RKey     uint32
	Slots    uint32
	SlotSize uint32
}

func (v *VerbsInfo) Len() int { return 2 + 1 + 16 + 4 + 1 + 4*len(v.QPNs) + 8 + 4 + 4 + 4 }

func (v *VerbsInfo) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, v.LID)
	b = append(b, v.MTU)
	b = append(b, v.GID[:]...)
	b = binary.BigEndian.AppendUint32(b, v.PSN)
	b = append(b, byte(len(v.QPNs)))
	for _, q := range v.QPNs {
		b = binary.BigEndian.AppendUint32(b, q)
	}
	b = binary.BigEndian.AppendUint64(b, v.Addr)
	b = binary.BigEndian.AppendUint32(b, v.RKey)
	b = binary.BigEndian.AppendUint32(b, v.Slots)
	return binary.BigEndian.AppendUint32(b, v.SlotSize)
}

// ParseVerbsInfo parses a VerbsInfo with 1 to MaxQPs queue pairs.
func ParseVerbsInfo(b []byte) (VerbsInfo, int, error) {
	var v VerbsInfo
	if len(b) < 24 {
		return v, 0, ErrShort
	}
	v.LID = binary.BigEndian.Uint16(b)
	v.MTU = b[2]
	copy(v.GID[:], b[3:19])
	v.PSN = binary.BigEndian.Uint32(b[19:])
	n := int(b[23])
	if n < 1 || n > MaxQPs {
		return v, 0, fmt.Errorf("%d queue pairs in a connection (1 to %d)", n, MaxQPs)
	}
	need := 24 + 4*n + 20
	if len(b) < need {
		return v, 0, ErrShort
	}
	v.QPNs = make([]uint32, n)
	for i := range v.QPNs {
		v.QPNs[i] = binary.BigEndian.Uint32(b[24+4*i:])
	}
	o := 24 + 4*n
	v.Addr = binary.BigEndian.Uint64(b[o:])
	v.RKey = binary.BigEndian.Uint32(b[o+8:])
	v.Slots = binary.BigEndian.Uint32(b[o+12:])
	v.SlotSize = binary.BigEndian.Uint32(b[o+16:])
	return v, need, nil
}
