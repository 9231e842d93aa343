package algorithms

import "fmt"

// Layout maps a schedule's blocks onto a rank's buffers for one element count.
//
// The element space of a collective is Majors major blocks of K elements
// each (Collective.Majors: one per rank for reduce-scatter, all-gather and
// all-to-all, one otherwise). The engine cuts every major block into the
// same number of pieces (for channels and pipelining) and runs the schedule
// once per piece; within a piece, each major block is cut into the
// schedule's Minor blocks. Block b of a schedule is minor block b%Minor of
// major block b/Minor. All cuts are balanced: parts differ by at most one
// element, so any count works with any rank count, piece count and minor
// count, including counts of zero and counts below the rank count.
//
// A buffer holds a contiguous run of major blocks: [InLo, InHi) for Input
// and [OutLo, OutHi) for Output (empty when the rank does not use it).
type Layout struct {
	Majors       int
	K            int // elements per major block
	InLo, InHi   int
	OutLo, OutHi int
	// InOffs and OutOffs, when set (len Majors+1, ascending), place major
	// block m of Input (of Output) at element InOffs[m], with
	// InOffs[m+1]-InOffs[m] elements, in place of m*K with K each: an
	// all-to-all of uneven blocks (AllToAllv). Each block is cut into the
	// same pieces and minor blocks as a uniform one, by its own length, so
	// a sender and its receiver, which agree on the block's length, see
	// the same stream of slices.
	InOffs, OutOffs []int
}

// NewLayout returns the layout of collective c on rank of nranks with k
// elements per major block (the count of all-reduce, broadcast, reduce, send
// and recv; the receive count of reduce-scatter; the send count of
// all-gather; the per-peer block of all-to-all). root is the root of
// broadcast and reduce, and the peer of send and recv.
func NewLayout(c Collective, nranks, rank, root, k int) Layout {
	l := Layout{Majors: c.Majors(nranks), K: k}
	switch c {
	case CollAllReduce, CollAllToAll:
		l.InHi, l.OutHi = l.Majors, l.Majors
	case CollReduceScatter:
		l.InHi = nranks
		l.OutLo, l.OutHi = rank, rank+1
	case CollAllGather:
		l.InLo, l.InHi = rank, rank+1
		l.OutHi = nranks
	case CollBroadcast:
		if rank == root {
			l.InHi = 1
		}
		l.OutHi = 1
	case CollReduce:
		l.InHi = 1
		if rank == root {
			l.OutHi = 1
		}
	case CollSend:
		l.InHi = 1
	case CollRecv:
		l.OutHi = 1
	}
	return l
}

// InLen and OutLen return the buffer lengths in elements.
func (l Layout) InLen() int {
	if l.InOffs != nil {
		return l.InOffs[l.InHi] - l.InOffs[l.InLo]
	}
	return (l.InHi - l.InLo) * l.K
}

func (l Layout) OutLen() int {
	if l.OutOffs != nil {
		return l.OutOffs[l.OutHi] - l.OutOffs[l.OutLo]
	}
	return (l.OutHi - l.OutLo) * l.K
}

// Span is a run of elements [Off, Off+Len) of one buffer.
type Span struct{ Off, Len int }

// split returns the start of part i when n elements are cut into parts
// balanced parts.
func split(n, parts, i int) int { return int(int64(i) * int64(n) / int64(parts)) }

// PieceRange returns the element range [lo, hi) of piece p of pieces within
// one major block.
func (l Layout) PieceRange(p, pieces int) (lo, hi int) {
	return split(l.K, pieces, p), split(l.K, pieces, p+1)
}

// Covers reports whether buffer buf of this layout holds blocks
// [ref.Block, ref.Block+ref.N) of a schedule with minor blocks per major.
func (l Layout) Covers(ref Ref, minor int) bool {
	lo, hi := l.InLo, l.InHi
	if ref.Buf == Output {
		lo, hi = l.OutLo, l.OutHi
	} else if ref.Buf != Input {
		return false
	}
	first, last := int(ref.Block)/minor, int(ref.Block+ref.N-1)/minor
	return ref.N > 0 && ref.Block >= 0 && first >= lo && last < hi
}

// Spans appends to dst the element spans of ref in its buffer for piece p of
// pieces, for a schedule with minor blocks per major block. Adjacent blocks
// of one major block merge into one span; empty blocks yield nothing, on
// sender and receiver alike, so both sides see the same stream of slices.
// It panics if ref is outside the buffer (Validate rules that out).
func (l Layout) Spans(dst []Span, ref Ref, minor, p, pieces int) []Span {
	base, offs := l.InLo, l.InOffs
	if ref.Buf == Output {
		base, offs = l.OutLo, l.OutOffs
	}
	if !l.Covers(ref, minor) {
		panic(fmt.Sprintf("algorithms: %v outside the buffer (layout %+v, minor %d)", ref, l, minor))
	}
	plo, phi := l.PieceRange(p, pieces)
	plen := phi - plo
	last := -1 // index in dst of the span this call may still extend
	for b := int(ref.Block); b < int(ref.Block+ref.N); b++ {
		m, j := b/minor, b%minor
		start := (m - base) * l.K
		if offs != nil {
			// This block's own length and place (uneven blocks).
			k := offs[m+1] - offs[m]
			start = offs[m] - offs[base]
			plo, phi = split(k, pieces, p), split(k, pieces, p+1)
			plen = phi - plo
		}
		lo := start + plo + split(plen, minor, j)
		hi := start + plo + split(plen, minor, j+1)
		if hi == lo {
			continue
		}
		if last >= 0 && dst[last].Off+dst[last].Len == lo {
			dst[last].Len += hi - lo
			continue
		}
		dst = append(dst, Span{Off: lo, Len: hi - lo})
		last = len(dst) - 1
	}
	return dst
}

// SpansLen returns the total number of elements in spans.
func SpansLen(spans []Span) int {
	n := 0
	for _, s := range spans {
		n += s.Len
	}
	return n
}

// Slicer walks spans in slices of at most Max elements that never cross a
// span boundary. Two Slicers over span lists of equal lengths yield slices
// of equal lengths, which is how the engine walks a step's Src, Dst and
// incoming stream in lockstep.
type Slicer struct {
	spans []Span
	i     int
	off   int
	max   int
}

// NewSlicer returns a Slicer over spans with slices of at most max (> 0)
// elements.
func NewSlicer(spans []Span, max int) Slicer {
	if max <= 0 {
		panic("algorithms: slice size must be positive")
	}
	return Slicer{spans: spans, max: max}
}

// Next returns the next slice as a buffer offset and length; ok is false
// when the spans are exhausted.
func (s *Slicer) Next() (off, n int, ok bool) {
	if s.i >= len(s.spans) {
		return 0, 0, false
	}
	sp := s.spans[s.i]
	n = min(sp.Len-s.off, s.max)
	off = sp.Off + s.off
	s.off += n
	if s.off == sp.Len {
		s.i++
		s.off = 0
	}
	return off, n, true
}

// Done reports whether the spans are exhausted.
func (s *Slicer) Done() bool { return s.i >= len(s.spans) }

// MaxMessageBlocks returns the largest number of blocks one step of s sends
// as a single message (0 if s sends nothing).
func (s *Schedule) MaxMessageBlocks() int {
	m := 0
	for _, st := range s.Steps {
		m = max(m, st.sentBlocks())
	}
	return m
}

// sentBlocks is how many blocks step st sends (0 if it sends nothing).
func (st Step) sentBlocks() int {
	switch {
	case !st.Kind.Sends():
		return 0
	case st.Kind.Exchange():
		return int(st.Tx.N)
	case st.Src.Buf == NoBuf:
		return int(st.Dst.N)
	}
	return int(st.Src.N)
}

// MinPieces returns the fewest pieces to cut each major block of k elements
// into so that every message of every rank's schedule (s.MsgBlocks) fits in half of a connection's slots
// (slots ≥ 2, each holding sliceElems elements). The engine never uses
// fewer. Like NCCL, whose ring chunk is half the connection's buffer
// (ALLREDUCE_CHUNKSTEPS = NCCL_STEPS/2 in src/device/common.h), it relies on
// a step's send completing into the link while the receiver is still busy
// with the step before, and on the link still having room for the first
// slice of the next step: without that, a ring whose every rank starts by
// sending, or two ranks forwarding to each other, would deadlock (the
// simulator in package algotest shows it).
func MinPieces(s *Schedule, k, slots, sliceElems int) int {
	if slots < 2 || sliceElems < 1 {
		panic("algorithms: need at least 2 slots and a positive slice size")
	}
	capElems := slots / 2 * sliceElems
	maxN := s.MsgBlocks
	if maxN == 0 || k == 0 {
		return 1
	}
	// A piece of at most ceil(k/p) elements fits whole...
	p := (k + capElems - 1) / capElems
	// ...and a piece cut into Minor blocks has blocks of at most
	// ceil(ceil(k/p)/Minor) elements, maxN of which make a message.
	if per := capElems / maxN; per >= 1 {
		p = min(p, (k+per*s.Minor-1)/(per*s.Minor))
	}
	return max(p, 1)
}
