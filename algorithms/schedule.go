package algorithms

import (
	"fmt"
	"strings"
)

// Collective names the operation a schedule implements.
type Collective uint8

// The collectives goccl schedules.
const (
	CollAllReduce Collective = iota
	CollReduceScatter
	CollAllGather
	CollBroadcast
	CollReduce
	CollAllToAll
	CollSend
	CollRecv
	numCollectives
)

// NumCollectives is the number of collectives; NumAlgorithms the number
// of algorithms, AlgoAuto included. Encodings that carry them (the
// engine's operation signature) check at compile time that they fit.
const (
	NumCollectives = int(numCollectives)
	NumAlgorithms  = int(numAlgorithms)
)

var collNames = [...]string{"allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "send", "recv"}

func (c Collective) String() string {
	if c < numCollectives {
		return collNames[c]
	}
	return fmt.Sprintf("collective(%d)", uint8(c))
}

// Valid reports whether c is one of the defined collectives.
func (c Collective) Valid() bool { return c < numCollectives }

// Reduces reports whether c combines data with a reduction operator.
func (c Collective) Reduces() bool {
	return c == CollAllReduce || c == CollReduceScatter || c == CollReduce
}

// Majors returns the number of major blocks of the collective's element space
// for nranks ranks: nranks for reduce-scatter, all-gather and all-to-all (one
// block per rank), one for the others.
func (c Collective) Majors(nranks int) int {
	switch c {
	case CollReduceScatter, CollAllGather, CollAllToAll:
		return nranks
	}
	return 1
}

// Algorithm names a family of schedules.
type Algorithm uint8

// Algorithms. AlgoAuto lets the tuner choose.
const (
	AlgoAuto Algorithm = iota
	// Ring: reduce-scatter then all-gather around a ring (all-reduce), or the
	// ring's halves (reduce-scatter, all-gather), or a pipelined chain along
	// the ring (broadcast, reduce).
	Ring
	// Tree: NCCL's double binary tree for all-reduce; each tree carries half
	// the data, reduced up and broadcast down, pipelined by chunk.
	Tree
	// RecDoubling: recursive doubling all-reduce (latency-optimal for small
	// messages), or all-gather (log2(n) exchanges of growing groups of
	// blocks, the ring's bytes), with the usual fold for rank counts that
	// are not powers of two.
	RecDoubling
	// Rabenseifner: recursive-halving reduce-scatter followed by
	// recursive-doubling all-gather (Rabenseifner 2004; Thakur, Rabenseifner
	// & Gropp 2005), for mid-size all-reduce.
	Rabenseifner
	// Pairwise: all-to-all by n-1 pairwise exchanges.
	Pairwise
	// P2P: one point-to-point transfer (Send, Recv).
	P2P
	// OneShot: every rank sends its whole input to every other rank and
	// reduces the n contributions locally, in rank order (the "one-shot"
	// all-reduce of TensorRT-LLM's and vLLM's custom all-reduce kernels).
	// One hop, n-1 times the bytes: for small messages on few ranks, where
	// a rank should wait for its peers once per operation rather than once
	// per round (on oversubscribed cores every wait is a context switch).
	// Reduce-scatter and all-gather have the same one-hop form (every rank
	// sends each peer the block the peer needs), with the ring's bytes;
	// reduce's is every rank sending its input straight to the root
	// (Open MPI's basic_linear), which receives n-1 times the chain's.
	OneShot
	// Hier: the hierarchical all-reduce for several ranks per host, every
	// host with as many: a reduce-scatter inside each host, an all-reduce
	// of each shard across hosts (one ring per local rank), and an
	// all-gather inside each host. The network carries 2(h-1)/h of the
	// data per host where a flat ring over n ranks carries 2(n-1)/n.
	// Reduce-scatter and all-gather have a form with the same traffic,
	// (h-1)/h where a ring's is (n-1)/n (hierReduceScatter).
	Hier
	// HierTree: Hier with a double binary tree of hosts for the phase
	// across them (each local rank's shard reduced up two trees and
	// broadcast down): 2·log2 h network latencies where Hier's rings pay
	// 2(h-1), for a host's link carrying 2 shards' worth instead of
	// 2(h-1)/h. For many hosts.
	HierTree
	numAlgorithms
)

var algoNames = [...]string{"auto", "ring", "tree", "recdoubling", "rabenseifner", "pairwise", "p2p", "oneshot", "hier", "hiertree"}

func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algoNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm parses an algorithm name as printed by String (case-insensitive).
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algoNames {
		if strings.EqualFold(s, n) {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, strings.Join(algoNames[:], ", "))
}

// Supports reports whether algorithm a can implement collective c.
func (a Algorithm) Supports(c Collective) bool {
	switch c {
	case CollAllReduce:
		return a == Ring || a == Tree || a == RecDoubling || a == Rabenseifner || a == OneShot || a == Hier || a == HierTree
	case CollReduceScatter:
		return a == Ring || a == Hier || a == OneShot
	case CollAllGather:
		return a == Ring || a == Hier || a == OneShot || a == RecDoubling
	case CollBroadcast:
		return a == Ring
	case CollReduce:
		return a == Ring || a == OneShot
	case CollAllToAll:
		return a == Pairwise
	case CollSend, CollRecv:
		return a == P2P
	}
	return false
}

// Kind is a step primitive. The vocabulary is NCCL's (src/device/prims_*.h):
// each step has at most one incoming stream (from RecvPeer) and at most one
// outgoing stream (to SendPeer), and runs slice by slice so that a step that
// receives and sends forwards each slice as soon as it is ready. Notation:
// recv is the incoming data, src the local operand Src, v the step's value.
type Kind uint8

// Step kinds.
const (
	// Copy: Dst = Src.
	Copy Kind = iota
	// Send: send(Src).
	Send
	// Recv: Dst = recv.
	Recv
	// CopySend: Dst = Src; send(Src).
	CopySend
	// RecvReduceSend: send(recv ⊕ Src).
	RecvReduceSend
	// RecvReduceCopy: Dst = recv ⊕ Src.
	RecvReduceCopy
	// RecvReduceCopySend: Dst = recv ⊕ Src; send(Dst).
	RecvReduceCopySend
	// RecvCopySend: Dst = recv; send(recv).
	RecvCopySend
	// SendRecv is an exchange: send(Tx) while Dst = recv. The two streams
	// may differ in length; slice k of Tx is sent before slice k of the
	// incoming stream is awaited, so two peers exchanging never deadlock.
	SendRecv
	// SendRecvReduceCopy is an exchange with reduction: send(Tx) while
	// Dst = recv ⊕ Src. Tx may overlap Src/Dst (recursive doubling sends
	// the value it is about to replace): slice k of Tx is read before slice
	// k of Dst is written.
	SendRecvReduceCopy
	// Reduce: Dst = Dst ⊕ Src, locally (Src is Input, Dst the running
	// value in Output).
	Reduce
	numKinds
)

type kindInfo struct {
	name                          string
	recv, send, src, dst, tx, red bool
}

var kinds = [numKinds]kindInfo{
	Copy:               {name: "copy", src: true, dst: true},
	Send:               {name: "send", send: true, src: true},
	Recv:               {name: "recv", recv: true, dst: true},
	CopySend:           {name: "copySend", send: true, src: true, dst: true},
	RecvReduceSend:     {name: "recvReduceSend", recv: true, send: true, src: true, red: true},
	RecvReduceCopy:     {name: "recvReduceCopy", recv: true, src: true, dst: true, red: true},
	RecvReduceCopySend: {name: "recvReduceCopySend", recv: true, send: true, src: true, dst: true, red: true},
	RecvCopySend:       {name: "recvCopySend", recv: true, send: true, dst: true},
	SendRecv:           {name: "sendRecv", recv: true, send: true, dst: true, tx: true},
	SendRecvReduceCopy: {name: "sendRecvReduceCopy", recv: true, send: true, src: true, dst: true, tx: true, red: true},
	Reduce:             {name: "reduce", src: true, dst: true, red: true},
}

func (k Kind) String() string {
	if k < numKinds {
		return kinds[k].name
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Receives reports whether a step of kind k has an incoming stream.
func (k Kind) Receives() bool { return k < numKinds && kinds[k].recv }

// Sends reports whether a step of kind k has an outgoing stream.
func (k Kind) Sends() bool { return k < numKinds && kinds[k].send }

// Reduces reports whether a step of kind k combines two values.
func (k Kind) Reduces() bool { return k < numKinds && kinds[k].red }

// Exchange reports whether k's outgoing stream is independent of its
// incoming one (SendRecv, SendRecvReduceCopy).
func (k Kind) Exchange() bool { return k < numKinds && kinds[k].tx }

// Buf names a rank's buffer.
type Buf uint8

// Buffers. A step reads Input (the user's send buffer) and reads and writes
// Output (the user's receive buffer); Input is never written.
const (
	NoBuf Buf = iota
	Input
	Output
)

func (b Buf) String() string {
	switch b {
	case Input:
		return "in"
	case Output:
		return "out"
	}
	return "-"
}

// Ref names N consecutive blocks, starting at Block, of a buffer. Block
// numbers are global: block b covers the same elements of every rank's
// element space, whichever buffer holds it (see Layout).
type Ref struct {
	Buf   Buf
	Block int32
	N     int32
}

// Blocks returns a Ref to n blocks of buf starting at block b.
func Blocks(buf Buf, b, n int) Ref { return Ref{Buf: buf, Block: int32(b), N: int32(n)} }

func (r Ref) String() string {
	if r.Buf == NoBuf {
		return "-"
	}
	if r.N == 1 {
		return fmt.Sprintf("%s[%d]", r.Buf, r.Block)
	}
	return fmt.Sprintf("%s[%d:%d]", r.Buf, r.Block, r.Block+r.N)
}

// Step is one primitive of a rank's schedule. Fields a kind does not use are
// zero (Refs) or -1 (peers).
type Step struct {
	Kind     Kind
	RecvPeer int32 // rank the incoming stream comes from, or -1
	SendPeer int32 // rank the outgoing stream goes to, or -1
	Src      Ref   // local operand
	Dst      Ref   // where the step's value is written (always Output)
	Tx       Ref   // what an exchange sends
	// Final marks the step that completes a reduction: its value holds every
	// rank's contribution, and the operator's post-processing (Avg's
	// division by the rank count) is applied to it, exactly once.
	Final bool
}

func (s Step) String() string {
	var b strings.Builder
	b.WriteString(s.Kind.String())
	if s.Kind.Receives() {
		fmt.Fprintf(&b, " recv<-%d", s.RecvPeer)
	}
	if s.Src.Buf != NoBuf {
		fmt.Fprintf(&b, " src=%s", s.Src)
	}
	if s.Tx.Buf != NoBuf {
		fmt.Fprintf(&b, " tx=%s", s.Tx)
	}
	if s.Dst.Buf != NoBuf {
		fmt.Fprintf(&b, " dst=%s", s.Dst)
	}
	if s.Kind.Sends() {
		fmt.Fprintf(&b, " send->%d", s.SendPeer)
	}
	if s.Final {
		b.WriteString(" final")
	}
	return b.String()
}

// Schedule is one rank's program for one collective: the steps it runs, in
// order, on every piece of the buffer (see Layout.Spans). A Schedule does not
// depend on the element count; it is immutable once built and may be shared.
type Schedule struct {
	Coll   Collective
	Algo   Algorithm
	NRanks int
	Rank   int
	Root   int // broadcast and reduce root; the peer of send and recv; else 0
	// Minor is the number of blocks each major block is cut into per piece
	// (Layout.Spans).
	Minor int
	// MsgBlocks is the largest number of blocks any rank of the
	// communicator sends in one message. It is the same on every rank (the
	// engine derives the piece count from it, and all ranks must agree on
	// that), unlike this rank's own MaxMessageBlocks.
	MsgBlocks int
	// CopyInPlace says the schedule reads Input after it has written the
	// same blocks of Output, so an in-place operation must run on a
	// private copy of the input (the engine makes one; only OneShot, whose
	// messages are small, needs it).
	CopyInPlace bool
	Steps       []Step
}

// Blocks returns the size of the schedule's block space: majors × minor.
func (s *Schedule) Blocks() int { return s.Coll.Majors(s.NRanks) * s.Minor }

// Peers returns the distinct ranks the schedule sends to or receives from,
// in first-use order.
func (s *Schedule) Peers() []int {
	var out []int
	seen := map[int32]bool{}
	add := func(p int32) {
		if p >= 0 && !seen[p] {
			seen[p] = true
			out = append(out, int(p))
		}
	}
	for _, st := range s.Steps {
		if st.Kind.Receives() {
			add(st.RecvPeer)
		}
		if st.Kind.Sends() {
			add(st.SendPeer)
		}
	}
	return out
}

func (s *Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s nranks=%d rank=%d", s.Coll, s.Algo, s.NRanks, s.Rank)
	if s.Coll == CollBroadcast || s.Coll == CollReduce {
		fmt.Fprintf(&b, " root=%d", s.Root)
	}
	if s.Coll == CollSend || s.Coll == CollRecv {
		fmt.Fprintf(&b, " peer=%d", s.Root)
	}
	fmt.Fprintf(&b, " minor=%d", s.Minor)
	if s.CopyInPlace {
		b.WriteString(" copy-in-place")
	}
	b.WriteString("\n")
	for i, st := range s.Steps {
		fmt.Fprintf(&b, "  %3d %s\n", i, st)
	}
	return b.String()
}

// builder accumulates steps; helpers keep the schedule code close to the
// algorithm's description.
type builder struct{ s *Schedule }

func (b builder) add(st Step) { b.s.Steps = append(b.s.Steps, st) }

func none() int32 { return -1 }

func (b builder) copy(src, dst Ref, final bool) {
	b.add(Step{Kind: Copy, RecvPeer: none(), SendPeer: none(), Src: src, Dst: dst, Final: final})
}

func (b builder) send(src Ref, to int) {
	b.add(Step{Kind: Send, RecvPeer: none(), SendPeer: int32(to), Src: src})
}

func (b builder) recv(from int, dst Ref) {
	b.add(Step{Kind: Recv, RecvPeer: int32(from), SendPeer: none(), Dst: dst})
}

func (b builder) copySend(src, dst Ref, to int) {
	b.add(Step{Kind: CopySend, RecvPeer: none(), SendPeer: int32(to), Src: src, Dst: dst})
}

func (b builder) recvReduceSend(from int, src Ref, to int) {
	b.add(Step{Kind: RecvReduceSend, RecvPeer: int32(from), SendPeer: int32(to), Src: src})
}

func (b builder) recvReduceCopy(from int, src, dst Ref, final bool) {
	b.add(Step{Kind: RecvReduceCopy, RecvPeer: int32(from), SendPeer: none(), Src: src, Dst: dst, Final: final})
}

func (b builder) recvReduceCopySend(from int, src, dst Ref, to int, final bool) {
	b.add(Step{Kind: RecvReduceCopySend, RecvPeer: int32(from), SendPeer: int32(to), Src: src, Dst: dst, Final: final})
}

func (b builder) recvCopySend(from int, dst Ref, to int) {
	b.add(Step{Kind: RecvCopySend, RecvPeer: int32(from), SendPeer: int32(to), Dst: dst})
}

func (b builder) sendRecv(tx Ref, to, from int, dst Ref) {
	b.add(Step{Kind: SendRecv, RecvPeer: int32(from), SendPeer: int32(to), Tx: tx, Dst: dst})
}

func (b builder) reduce(src, dst Ref, final bool) {
	b.add(Step{Kind: Reduce, RecvPeer: none(), SendPeer: none(), Src: src, Dst: dst, Final: final})
}

func (b builder) sendRecvReduceCopy(tx Ref, to, from int, src, dst Ref, final bool) {
	b.add(Step{Kind: SendRecvReduceCopy, RecvPeer: int32(from), SendPeer: int32(to), Tx: tx, Src: src, Dst: dst, Final: final})
}
