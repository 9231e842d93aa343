package verbs

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// The board (transport.Board) over RDMA, for communicators whose ranks
// all reach each other over this transport: a collective of at most
// BoardMax bytes is one write per peer, straight into the peer's memory,
// and a read of what the peers wrote into this rank's, where the
// connections would take a message, its clearance and the engine's steps
// per peer and direction (transport/doc.go foresaw it).
//
// Each pair has a connection of its own on boardChannel, with one QP and
// two 256-byte entries per direction, for even and odd collectives (and
// boardSources entries to send from, so that few requests are signaled). To
// post collective seq, a rank writes {seq+1, signature, size, data} into
// entry seq%2 of every peer with a write with immediate seq; to mark that
// it runs seq elsewhere, it writes {seq+1, signature} into the peer's
// mark entry seq%2 with immediate immCTS | seq. The peers learn of both
// from completions only.
//
// An entry is written again two collectives later. By then the peer has
// finished reading it: a rank posts seq only once every peer has reached
// seq-1 (posted or marked it, as this rank has seen), and a peer reaches
// seq-1 only after it is done with seq-2.

const (
	// boardChannel carries the board's connections (engine channels are
	// far below it, device channels above).
	boardChannel = transport.DeviceChannels - 1
	// boardEntryLen is an entry: seq+1 (8 bytes), signature (4), size (4),
	// then the data.
	boardEntryLen = 256
	// BoardMax is the largest contribution the board carries.
	BoardMax = boardEntryLen - 16
	// boardSources is how many entries a board connection sends from (its
	// Slots: requests are signaled once every Slots); the peer's memory
	// has two per direction all the same.
	boardSources = 8
)

type board struct {
	e     *Endpoint
	me, n int
	conns []*conn // by rank; nil for this rank
	// Per peer, from its completions: the latest collective it posted
	// (seq+1), the latest it marked (seq+1) and the marks' signatures by
	// parity, the latest of either it reached.
	posted, marked, reached []uint64
	markSig                 [][2]uint32
	bufs                    [][]byte // what Read returned, by peer
}

var _ transport.Board = (*board)(nil)

// JoinBoard connects this rank's board to every other rank's; every rank
// of the communicator calls it, and every pair must reach each other over
// this endpoint. The engine finds the board through Board.
func (e *Endpoint) JoinBoard(ctx context.Context) error {
	b := &board{e: e, me: e.o.Rank, n: e.o.NRanks, conns: make([]*conn, e.o.NRanks),
		posted: make([]uint64, e.o.NRanks), marked: make([]uint64, e.o.NRanks), reached: make([]uint64, e.o.NRanks),
		markSig: make([][2]uint32, e.o.NRanks), bufs: make([][]byte, e.o.NRanks)}
	for r := range b.conns {
		if r == b.me {
			continue
		}
		tc, err := e.Connect(ctx, r, boardChannel)
		if err != nil {
			return fmt.Errorf("joining the board: %w", err)
		}
		c := tc.(*conn)
		c.use.Lock()
		c.brd = b
		c.use.Unlock()
		b.conns[r] = c
	}
	e.mu.Lock()
	e.board = b
	e.mu.Unlock()
	return nil
}

// Board implements transport.BoardHolder: the board once JoinBoard has
// made it, else nil.
func (e *Endpoint) Board() transport.Board {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.board == nil {
		return nil
	}
	return e.board
}

func (b *board) Max() int { return BoardMax }

// Begin implements transport.Board. The board's memory is registered
// with the NIC and goes at close, but Read hands out copies, so there is
// nothing to hold: Begin only says whether the endpoint is closing.
func (b *board) Begin() error {
	for _, c := range b.conns {
		if c != nil && c.down.Load() {
			return c.e.closedErr()
		}
	}
	return nil
}

// End implements transport.Board.
func (b *board) End() {}

// seqOf widens a 31-bit immediate to the sequence after prev (seq+1
// form): a peer's posts and marks arrive in order on its QP.
func seqOf(imm uint32, prev uint64) uint64 {
	return prev + uint64((imm+1-uint32(prev))&immMask)
}

// boardWC takes a board completion of c's peer.
func (c *conn) boardWC(imm uint32) {
	b, r := c.brd, c.peer
	s := seqOf(imm&immMask, b.reached[r]) // seq+1
	if imm&immCTS != 0 {
		b.marked[r] = s
		e := c.mem.B[int((s-1)%2)*hdrLen:]
		b.markSig[r][(s-1)%2] = binary.LittleEndian.Uint32(e[8:])
	} else {
		b.posted[r] = s
	}
	b.reached[r] = s
}

// write posts a board write of data (prefixed by seq+1 and sig) to c's
// peer: into its entry seq%2, or with mark into its mark entry. The
// source is one of boardSources entries here (data and marks each have
// their own), so that a request is signaled only once every
// boardSources: a source is reused only once the request that read it
// has completed.
func (b *board) write(c *conn, seq uint64, sig uint32, data []byte, mark bool) error {
	i, j := int(seq%2), int(seq%boardSources)
	used := &c.staged[j]
	src := c.mem.B[c.l.l0+j*boardEntryLen : c.l.l0+(j+1)*boardEntryLen]
	remote := c.remote.Addr + uint64(c.l.pay+i*boardEntryLen) // the board's layout is the same on both ends
	imm := uint32(seq) & immMask
	n := 16 + len(data)
	if mark {
		used = &c.ctsUsed[j]
		src = c.mem.B[c.l.l1+j*hdrLen : c.l.l1+(j+1)*hdrLen]
		remote = c.remote.Addr + uint64(i*hdrLen)
		imm |= immCTS
		n = 16
	}
	if !c.isDone(*used) {
		// The source entry of seq-boardSources is still being read.
		if err := c.fence(*used); err != nil {
			return err
		}
		for !c.isDone(*used) {
			if err := c.broken("send"); err != nil {
				return err
			}
			c.poll()
		}
	}
	binary.LittleEndian.PutUint64(src, seq+1)
	binary.LittleEndian.PutUint32(src[8:], sig)
	binary.LittleEndian.PutUint32(src[12:], uint32(len(data)))
	copy(src[16:], data)
	c.wrs = append(c.wrs[:0], ibv.SendWR{Op: ibv.OpWriteImm, Imm: imm,
		SGE: ibv.SGE{Addr: ibv.Addr(src), Len: uint32(n), LKey: c.lmr.LKey()}, Remote: remote, RKey: c.remote.RKey})
	ref, err := c.post(0, c.wrs, false)
	if err != nil {
		return err
	}
	*used = ref
	return nil
}

// Post implements transport.Board.
func (b *board) Post(ctx context.Context, seq uint64, sig uint32, data []byte) error {
	if len(data) > BoardMax {
		return fmt.Errorf("verbs: a board contribution of %d bytes (at most %d)", len(data), BoardMax)
	}
	// Every peer must have reached seq-1, so that it is done reading the
	// entry this overwrites.
	for r, c := range b.conns {
		if c == nil || seq < 2 || b.reached[r] >= seq {
			continue
		}
		if err := b.wait(ctx, c, "send", func() bool { return b.reached[r] >= seq }); err != nil {
			return err
		}
	}
	for _, c := range b.conns {
		if c == nil {
			continue
		}
		if err := b.lockWrite(c, seq, sig, data, false); err != nil {
			return &transport.PeerError{Peer: c.peer, Op: "send", Err: err}
		}
	}
	return nil
}

func (b *board) lockWrite(c *conn, seq uint64, sig uint32, data []byte, mark bool) error {
	c.use.Lock()
	defer c.use.Unlock()
	if err := c.broken("send"); err != nil {
		return err
	}
	return b.write(c, seq, sig, data, mark)
}

// Mark implements transport.Board. Errors surface at the next Post or
// Read.
func (b *board) Mark(seq uint64, sig uint32) {
	for _, c := range b.conns {
		if c != nil {
			b.lockWrite(c, seq, sig, nil, true)
			c.use.Lock()
			if c.broken("recv") == nil {
				c.poll() // take the peers' marks as they come
			}
			c.use.Unlock()
		}
	}
}

// Read implements transport.Board. The data is a copy, this rank's
// until its next Read of r: an abort may unmap the board's memory while
// the engine still reduces what it read.
func (b *board) Read(ctx context.Context, r int, seq uint64) (uint32, []byte, bool, error) {
	if r < 0 || r >= b.n || b.conns[r] == nil {
		return 0, nil, false, fmt.Errorf("verbs: no board peer %d", r)
	}
	c := b.conns[r]
	c.use.Lock()
	defer c.use.Unlock()
	if c.down.Load() {
		return 0, nil, false, c.e.closedErr()
	}
	entry := func() []byte { o := c.l.pay + int(seq%2)*boardEntryLen; return c.mem.B[o : o+boardEntryLen] }
	posted := func() bool { return b.posted[r] > seq && binary.LittleEndian.Uint64(entry()) == seq+1 }
	if err := c.waitFor(ctx, "recv", func() bool { return b.marked[r] > seq || posted() }); err != nil {
		return 0, nil, false, err
	}
	if posted() {
		e := entry()
		size := int(binary.LittleEndian.Uint32(e[12:]))
		if size > BoardMax {
			return 0, nil, false, &transport.PeerError{Peer: r, Op: "recv", Err: fmt.Errorf("protocol error: rank %d posted %d bytes on the board", r, size)}
		}
		b.bufs[r] = append(b.bufs[r][:0], e[16:16+size]...)
		return binary.LittleEndian.Uint32(e[8:]), b.bufs[r], true, nil
	}
	sig := uint32(0)
	if b.marked[r] == seq+1 {
		sig = b.markSig[r][seq%2]
	}
	return sig, nil, false, nil
}

// wait polls c until ready holds (conn.waitFor).
func (b *board) wait(ctx context.Context, c *conn, op string, ready func() bool) error {
	c.use.Lock()
	defer c.use.Unlock()
	if c.down.Load() {
		return c.e.closedErr()
	}
	return c.waitFor(ctx, op, ready)
}
