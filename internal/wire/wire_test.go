package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// message is what every wire type offers.
type message interface {
	Len() int
	Append([]byte) []byte
}

// codec ties a sample message to its parser.
type codec struct {
	name  string
	msg   message
	parse func([]byte) (message, int, error)
}

func wrap[T any, P interface {
	*T
	message
}](f func([]byte) (T, int, error)) func([]byte) (message, int, error) {
	return func(b []byte) (message, int, error) {
		v, n, err := f(b)
		return P(&v), n, err
	}
}

func samples() []codec {
	hello := &Hello{Version: ProtocolVersion, Purpose: PurposeData, Nonce: [NonceLen]byte{1, 2, 3, 15: 4}}
	info := &PeerInfo{Rank: 3, NRanks: 8, PID: 4242, WaitMillis: 30000, HostID: "node7/0b9c", DataAddr: "[fd00::7]:41234", Version: "0.1.0", Topology: []byte{9, 8, 7}}
	return []codec{
		{"hello", hello, wrap(ParseHello)},
		{"challenge", &Challenge{Nonce: [NonceLen]byte{5}, Proof: [ProofLen]byte{6, 7}}, wrap(ParseChallenge)},
		{"response", &Response{Proof: [ProofLen]byte{8}}, wrap(ParseResponse)},
		{"peerinfo", info, wrap(ParsePeerInfo)},
		{"peerinfo-empty", &PeerInfo{}, wrap(ParsePeerInfo)},
		{"table", &Table{Peers: []PeerInfo{*info, {Rank: 1, NRanks: 8, HostID: "x"}}}, wrap(ParseTable)},
		{"table-empty", &Table{}, wrap(ParseTable)},
		{"reject", &Reject{Reason: "protocol version 2, want 1"}, wrap(ParseReject)},
		{"abort", &Abort{Rank: 3, Died: true, Reason: "rank 3 lost its GPU"}, wrap(ParseAbort)},
		{"silent", &Abort{Rank: 1, Silent: true, Reason: "stopped responding 10.2 s ago"}, wrap(ParseAbort)},
		{"left", &Abort{Rank: 2, Left: true, Reason: "closed its communicator"}, wrap(ParseAbort)},
		{"stall", &Stall{Seq: 216, Timeout: 5e9, Op: "allreduce"}, wrap(ParseStall)},
		{"wait", &Wait{Rank: 2, State: WaitRunning, Seq: 216, Peer: 1, For: 5e9, Op: "allreduce", Detail: "channel 0 piece 3 step 2 (recvReduceSend)"}, wrap(ParseWait)},
		{"wait-device", &Wait{Rank: 1, State: WaitRunning, Seq: 216, Peer: -1, For: 5e9, Op: "allreduce", Detail: "setting up its connections", Device: true}, wrap(ParseWait)},
		{"wait-idle", &Wait{Rank: 3, State: WaitIdle, Seq: 215, Peer: -1, For: 7, Op: "allreduce", Detail: "done"}, wrap(ParseWait)},
		{"diagnosis", &Diagnosis{From: 1, Stall: Stall{Seq: 216, Timeout: 5e9, Op: "allreduce"}, Waits: []Wait{
			{Rank: 0, State: WaitRunning, Seq: 216, Peer: 3, Device: true}, {Rank: 1, State: WaitNoAnswer, Peer: -1, For: 12e9}}}, wrap(ParseDiagnosis)},
		{"diagnosis-empty", &Diagnosis{}, wrap(ParseDiagnosis)},
		{"diagnosis-probe", &Diagnosis{From: 1, Probe: true, Stall: Stall{Seq: 3, Timeout: 6e11, Op: "broadcast"}, Waits: []Wait{
			{Rank: 0, State: WaitRunning, Seq: 3, Peer: 1, Op: "broadcast"}, {Rank: 1, State: WaitRunning, Seq: 3, Peer: -1, Op: "broadcast", Device: true}}}, wrap(ParseDiagnosis)},
		{"diagnosis-silent", &Diagnosis{From: 1, Silent: true, Waits: []Wait{{Rank: 0, Peer: 1}, {Rank: 1, State: WaitNoAnswer}}}, wrap(ParseDiagnosis)},
		{"connsetup", &ConnSetup{From: 1, To: 6, Channel: 2, Socket: 1, NSocks: 4, Flags: ConnTLS}, wrap(ParseConnSetup)},
		{"sliceheader", &SliceHeader{Op: 1 << 40, Sig: 0xdeadbeef, Msg: 7, Slice: 9, Size: 4096}, wrap(ParseSliceHeader)},
		{"verbsinfo", &VerbsInfo{LID: 7, MTU: 5, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 3}, PSN: 0xabcdef,
			QPNs: []uint32{0x1234, 0x1235}, Addr: 1 << 45, RKey: 0x1000a, Slots: 8, SlotSize: 512 << 10}, wrap(ParseVerbsInfo)},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, c := range samples() {
		b := c.msg.Append([]byte("prefix"))[len("prefix"):]
		require.Len(t, b, c.msg.Len(), c.name)
		got, n, err := c.parse(append(b, "trailing"...))
		require.NoError(t, err, c.name)
		require.Equal(t, len(b), n, c.name)
		require.Equal(t, c.msg, got, c.name)
	}
}

// TestEveryPrefixIsShort cuts each encoding at every length: the parser
// must report ErrShort, never succeed or panic.
func TestEveryPrefixIsShort(t *testing.T) {
	for _, c := range samples() {
		b := c.msg.Append(nil)
		for i := 0; i < len(b); i++ {
			_, _, err := c.parse(b[:i])
			require.ErrorIs(t, err, ErrShort, "%s cut at %d of %d", c.name, i, len(b))
		}
	}
}

func TestHelloRejectsStrangers(t *testing.T) {
	_, _, err := ParseHello([]byte("GET / HTTP/1.1\r\n"))
	require.ErrorIs(t, err, ErrBadMagic)
	_, _, err = ParseHello([]byte("gox"))
	require.ErrorIs(t, err, ErrBadMagic, "the first differing byte is enough")
}

func TestLimits(t *testing.T) {
	long := &PeerInfo{HostID: strings.Repeat("h", MaxString+1)}
	require.Error(t, long.Validate())
	_, _, err := ParsePeerInfo(long.Append(nil))
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrShort), "an oversized field is not a short read")

	huge := AppendFrame(nil, FrameTable, nil)
	huge[1], huge[2] = 0xff, 0xff
	_, _, err = ParseFrameHeader(huge)
	require.ErrorContains(t, err, "exceeds")

	// A table claiming many peers in a few bytes is short, and does not
	// allocate for the claim.
	_, _, err = ParseTable([]byte{0, 0, 0xff, 0xff, 1})
	require.ErrorIs(t, err, ErrShort)
	_, _, err = ParseTable([]byte{0xff, 0xff, 0xff, 0xff})
	require.ErrorContains(t, err, "exceeds")
	// So is a diagnosis.
	d := (&Diagnosis{}).Append(nil)
	d[len(d)-2] = 0xff
	_, _, err = ParseDiagnosis(d)
	require.ErrorIs(t, err, ErrShort)
	bad := (&Diagnosis{From: 2, Waits: []Wait{{Rank: 0}, {Rank: 1}}}).Append(nil)
	_, _, err = ParseDiagnosis(bad)
	require.ErrorContains(t, err, "from rank 2 of 2")
	bad = (&Diagnosis{Waits: []Wait{{Rank: 1}}}).Append(nil)
	_, _, err = ParseDiagnosis(bad)
	require.ErrorContains(t, err, "entry 0 is rank 1's")
	w := (&Wait{State: WaitGone}).Append(nil)
	w[4] = 9
	_, _, err = ParseWait(w)
	require.ErrorContains(t, err, "wait state 9")
}

func TestFrames(t *testing.T) {
	info := &PeerInfo{Rank: 1, NRanks: 2, DataAddr: "127.0.0.1:9"}
	b := AppendFrame(nil, FramePeerInfo, info.Append(nil))
	typ, n, err := ParseFrameHeader(b)
	require.NoError(t, err)
	require.Equal(t, FramePeerInfo, typ)
	require.Equal(t, info.Len(), n)
	require.Equal(t, "peer-info", typ.String())
}

func TestProof(t *testing.T) {
	secret := []byte("0123456789abcdef")
	h := &Hello{Version: ProtocolVersion, Purpose: PurposeBootstrap, Nonce: [NonceLen]byte{1}}
	sn := [NonceLen]byte{2}
	first := []byte("conn setup")
	p := Proof(secret, RoleClient, h, sn, first)
	require.True(t, CheckProof(secret, RoleClient, h, sn, first, p))
	require.False(t, CheckProof(secret, RoleServer, h, sn, first, p), "a client proof is no server proof")
	require.False(t, CheckProof([]byte("wrong"), RoleClient, h, sn, first, p))
	require.False(t, CheckProof(secret, RoleClient, h, sn, []byte("conn setuq"), p), "bound to the first frame")
	h2 := *h
	h2.Nonce[0] = 9
	require.False(t, CheckProof(secret, RoleClient, &h2, sn, first, p), "bound to the client nonce")
	require.False(t, CheckProof(secret, RoleClient, h, [NonceLen]byte{3}, first, p), "bound to the server nonce")
}

// fuzzCodec checks one parser on arbitrary input: no panic, and anything
// it accepts re-encodes to the bytes it consumed.
func fuzzCodec(f *testing.F, name string) {
	var c codec
	for _, s := range samples() {
		if s.name == name {
			c = s
		}
	}
	f.Add(c.msg.Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := c.parse(b)
		if err != nil {
			return
		}
		if n < 0 || n > len(b) {
			t.Fatalf("%s: consumed %d of %d bytes", name, n, len(b))
		}
		if got := m.Append(nil); !bytes.Equal(got, b[:n]) {
			t.Fatalf("%s: re-encoding %x differs from input %x", name, got, b[:n])
		}
	})
}

func FuzzHello(f *testing.F)       { fuzzCodec(f, "hello") }
func FuzzChallenge(f *testing.F)   { fuzzCodec(f, "challenge") }
func FuzzResponse(f *testing.F)    { fuzzCodec(f, "response") }
func FuzzPeerInfo(f *testing.F)    { fuzzCodec(f, "peerinfo") }
func FuzzTable(f *testing.F)       { fuzzCodec(f, "table") }
func FuzzReject(f *testing.F)      { fuzzCodec(f, "reject") }
func FuzzAbort(f *testing.F)       { fuzzCodec(f, "abort") }
func FuzzConnSetup(f *testing.F)   { fuzzCodec(f, "connsetup") }
func FuzzSliceHeader(f *testing.F) { fuzzCodec(f, "sliceheader") }
func FuzzVerbsInfo(f *testing.F)   { fuzzCodec(f, "verbsinfo") }
func FuzzWait(f *testing.F)        { fuzzCodec(f, "wait") }
func FuzzDiagnosis(f *testing.F)   { fuzzCodec(f, "diagnosis") }

func FuzzFrameHeader(f *testing.F) {
	f.Add(AppendFrame(nil, FrameTable, []byte("x")))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, n, err := ParseFrameHeader(b)
		if err == nil && (n < 0 || n > MaxFrame) {
			t.Fatalf("length %d outside [0, %d]", n, MaxFrame)
		}
	})
}

// Misplaced, which the root uses to decide whether a probe's diagnosis
// goes out: only ranks running the stalled collective count, and only
// when both placements are among them.
func TestDiagnosisMisplaced(t *testing.T) {
	run := func(op string, seq uint64, dev bool) Wait {
		return Wait{State: WaitRunning, Seq: seq, Op: op, Device: dev, Peer: -1}
	}
	for _, c := range []struct {
		name      string
		stall     Stall
		waits     []Wait
		host, dev []int
	}{
		{"split", Stall{Seq: 3, Op: "allreduce"}, []Wait{run("allreduce", 3, false), run("allreduce", 3, true), run("allreduce", 3, true)}, []int{0}, []int{1, 2}},
		{"alike", Stall{Seq: 3, Op: "allreduce"}, []Wait{run("allreduce", 3, true), run("allreduce", 3, true)}, nil, nil},
		{"another number", Stall{Seq: 3, Op: "allreduce"}, []Wait{run("allreduce", 3, false), run("allreduce", 2, true)}, nil, nil},
		{"not answering", Stall{Seq: 3, Op: "allreduce"}, []Wait{run("allreduce", 3, false), {State: WaitNoAnswer, Seq: 3, Op: "allreduce", Device: true}}, nil, nil},
		{"sends", Stall{Seq: 3, Op: "send"}, []Wait{run("send", 3, false), run("send", 3, true)}, nil, nil},
	} {
		d := Diagnosis{Stall: c.stall, Waits: c.waits}
		host, dev := d.Misplaced()
		require.Equal(t, c.host, host, c.name)
		require.Equal(t, c.dev, dev, c.name)
	}
}
