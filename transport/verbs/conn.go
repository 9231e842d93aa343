package verbs

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// A connection's memory, one host allocation in two regions. The remote
// one is what the peer writes into, at the address it was told
// (wire.VerbsInfo.Addr):
//
//	0        headers    Slots × 64: each message's header (and a payload
//	                    of up to 32 bytes, inline)
//	FIFO     FIFO       Slots × 16: clear-to-send entries the peer posts
//	Pay      slots      Slots × SlotSize: payloads land here (page-aligned)
//
// The local one (local write access only) is what this side sends from:
//
//	L0       staging    Slots × SlotSize: payloads the engine fills
//	L1       headers    Slots × 64
//	L2       CTS        Slots × 16
//	LF       flush      64 bytes: where a flush read lands (gdr.go)
//
// The connections of device operations over GPUDirect RDMA keep their
// payload slots and staging in device memory instead (gdr.go): their
// layout has no Pay and no staging. Each side tells the other where its
// payloads land in every clear-to-send entry, so the two ends need not
// place them alike.
const (
	hdrLen    = 64
	inlineMax = 32 // payloads up to this size travel in the header
	ctsLen    = 16
	flushLen  = 64
	pageSize  = 4096

	// The immediate: bit 31 says a CTS, the rest is the message number
	// (mod 2^31) it is for.
	immCTS  = 1 << 31
	immMask = immCTS - 1
)

type layout struct {
	slots, slotSize       int
	fifo, pay, remote     int
	l0, l1, l2, lf, total int
	hostPayload           bool
}

func pageUp(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

func newLayout(slots, slotSize int, hostPayload bool) layout {
	l := layout{slots: slots, slotSize: slotSize, hostPayload: hostPayload}
	l.fifo = slots * hdrLen
	l.remote = l.fifo + slots*ctsLen
	l.pay = l.remote
	if hostPayload {
		l.pay = pageUp(l.remote)
		l.remote = l.pay + slots*slotSize
	}
	l.l0 = pageUp(l.remote)
	l.l1 = l.l0
	if hostPayload {
		l.l1 += slots * slotSize
	}
	l.l2 = l.l1 + slots*hdrLen
	l.lf = l.l2 + slots*ctsLen
	l.total = l.lf + flushLen
	return l
}

// The header of a message (64 bytes at its slot's header entry):
//
//	0  op, 8  signature, 12 message, 16 slice, 20 size, 24 sequence
//	   (the message number mod 2^32), 28 flags, 32 inline payload
//
// Flag hdrInlined says the payload is in the header; the receiver goes
// by it, not by the size, since a sender whose slots are in device
// memory inlines nothing.
const hdrInlined = 1

func putHeader(b []byte, t transport.Tag, size int, seq uint64, flags uint32) {
	binary.LittleEndian.PutUint64(b[0:], t.Op)
	binary.LittleEndian.PutUint32(b[8:], t.Sig)
	binary.LittleEndian.PutUint32(b[12:], t.Msg)
	binary.LittleEndian.PutUint32(b[16:], t.Slice)
	binary.LittleEndian.PutUint32(b[20:], uint32(size))
	binary.LittleEndian.PutUint32(b[24:], uint32(seq))
	binary.LittleEndian.PutUint32(b[28:], flags)
}

// wrRef names a posted work request: its QP and its number there.
type wrRef struct {
	qp int
	n  uint64 // 0: none
}

// conn is a connection to one peer on one channel. Its calls are made by
// the channel's goroutine, holding use; close takes use before it
// destroys anything, and calls return soon once down is set.
type conn struct {
	e    *Endpoint
	peer int
	ch   int
	ctl  net.Conn
	l    layout

	mem  *ibv.Mem
	rmr  ibv.MR // the remote region
	lmr  ibv.MR // the local region
	rref *mrRef // their holds in the endpoint's cache
	lref *mrRef
	// Where payloads are: the slots peers write into and the staging
	// this side sends from, each Slots × SlotSize, as the engine sees
	// them (host, mapped or device memory) and as the NIC names them
	// (address and key). mapped is the host allocation as the GPU maps
	// it, for device operations staged through host memory (else empty).
	slots  slotMem
	mapped memory.Buffer
	inline int      // payloads up to this size go in the header
	flush  *flusher // the flush read's queue pair (gdr.go), if needed
	cq     ibv.CQ
	qps    []ibv.QP
	qpIdx  map[uint32]int
	remote wire.VerbsInfo
	psn    uint32 // the first PSN of this side's QPs

	use  sync.Mutex
	down atomic.Bool // close has begun

	// Per QP: requests posted and completed (numbered from 1), the
	// latest signaled one, unsignaled requests since it, receives
	// consumed and not yet reposted.
	posted, done, signaled []uint64
	unsignaled, owed       []int
	sqDepth, rqDepth       int
	wcs                    []ibv.WC
	wrs                    []ibv.SendWR
	rwrs                   []ibv.RecvWR

	// Send side: the next message, its reservation, the CTS entries that
	// came (by FIFO index: the message number + 1), and what last used
	// each staging slot and CTS source entry.
	sendSeq  uint64
	reserved int    // bytes reserved, -1 if none
	ctsUpTo  uint64 // messages the peer has cleared (numbers below it)
	staged   []wrRef
	ctsUsed  []wrRef

	// Receive side: the next message, those arrived (by slot: number +
	// 1), whether one is held.
	recvSeq uint64
	arrived []uint64
	holding bool
	// Per QP: messages arrived on it so far; in all.
	dataIn   []uint64
	arrivedN uint64
	// Messages this side has cleared the peer to send (numbers below it).
	cleared uint64
	set     *chanSet // the channel's connections, once established
	brd     *board   // the board, on a board connection (board.go)

	failed   error        // a failed completion: every later call fails with it
	asyncErr atomic.Value // error: a fatal device event
	// What the peer said on the control socket, or that it went away.
	peerGone  atomic.Bool
	peerAbort atomic.Value // string
	peerLost  atomic.Bool
	watched   sync.WaitGroup
	closeOnce sync.Once
}

var _ transport.Conn = (*conn)(nil)

func newConn(e *Endpoint, peer, ch int, ctl net.Conn) (*conn, error) {
	o := e.o
	slots, slotSize := o.Slots, o.SlotSize
	if ch == boardChannel {
		slots, slotSize = boardSources, boardEntryLen // the peer writes entries 0 and 1 only (board.go)
	}
	dev := ch >= transport.DeviceChannels
	gdr := dev && e.gdr.direct()
	c := &conn{e: e, peer: peer, ch: ch, ctl: ctl, l: newLayout(slots, slotSize, !gdr), qpIdx: map[uint32]int{}, reserved: -1, inline: inlineMax}
	n := e.qpsFor(ch)
	c.posted, c.done, c.signaled = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	c.unsignaled, c.owed = make([]int, n), make([]int, n)
	c.dataIn = make([]uint64, n)
	c.arrived = make([]uint64, slots)
	c.staged, c.ctsUsed = make([]wrRef, slots), make([]wrRef, slots)
	c.wcs = make([]ibv.WC, 32)
	// Per QP at most: 2 requests per message in flight and a CTS per slot,
	// fences; receives for the peer's messages and CTS entries.
	c.sqDepth = 4*slots + 8
	c.rqDepth = 2*slots + 16
	var err error
	if c.mem, err = ibv.Alloc(c.l.total); err != nil {
		return nil, err
	}
	ctx := e.port.Ctx
	if c.rref, err = e.mrs.register(c.mem.B[:c.l.remote], ibv.AccessRemoteWriteAll); err != nil {
		c.teardown()
		return nil, fmt.Errorf("verbs: registering %d bytes for the peer's writes: %w", c.l.remote, err)
	}
	c.rmr = c.rref.MR
	if c.lref, err = e.mrs.register(c.mem.B[c.l.l0:c.l.total], ibv.AccessLocalWrite); err != nil {
		c.teardown()
		return nil, fmt.Errorf("verbs: registering %d bytes of staging: %w", c.l.total-c.l.l0, err)
	}
	c.lmr = c.lref.MR
	if !gdr {
		c.slots = slotMem{
			recv: memory.HostBuffer(c.mem.B[c.l.pay:c.l.remote]), recvAddr: ibv.Addr(c.mem.B[c.l.pay:]), recvKey: c.rmr.RKey(),
			send: memory.HostBuffer(c.mem.B[c.l.l0:c.l.l1]), sendAddr: ibv.Addr(c.mem.B[c.l.l0:]), sendKey: c.lmr.LKey(),
		}
	}
	if dev {
		if err := c.deviceMemory(gdr); err != nil {
			c.teardown()
			return nil, err
		}
	}
	if c.cq, err = ctx.CreateCQ(n*(c.sqDepth+c.rqDepth) + 16); err != nil {
		c.teardown()
		return nil, fmt.Errorf("verbs: ibv_create_cq: %w", err)
	}
	for range n {
		q, err := ctx.CreateQP(c.cq, ibv.QPCap{MaxSendWR: c.sqDepth, MaxRecvWR: c.rqDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
		if err != nil {
			c.teardown()
			return nil, fmt.Errorf("verbs: ibv_create_qp: %w", err)
		}
		c.qpIdx[q.Num()] = len(c.qps)
		c.qps = append(c.qps, q)
		a := ibv.QPAttr{State: ibv.QPInit, Port: uint8(e.port.Num), Access: ibv.AccessRemoteWriteAll}
		if err := q.Modify(&a, ibv.MaskResetToInit); err != nil {
			c.teardown()
			return nil, fmt.Errorf("verbs: ibv_modify_qp to INIT: %w", err)
		}
	}
	return c, nil
}

// info is what this side tells the peer.
func (c *conn) info() wire.VerbsInfo {
	p := c.e.port
	v := wire.VerbsInfo{LID: p.Attr.LID, MTU: uint8(p.Attr.ActiveMTU), GID: p.GID, PSN: c.psn,
		Addr: c.rmr.Addr(), RKey: c.rmr.RKey(), Slots: uint32(c.l.slots), SlotSize: uint32(c.l.slotSize)}
	for _, q := range c.qps {
		v.QPNs = append(v.QPNs, q.Num())
	}
	return v
}

// establish exchanges the QP information over the control socket (the
// dialer first), connects the QPs, posts the receives, waits until the
// peer has too, and posts the first clear-to-send entries.
func (c *conn) establish(dialer bool) error {
	var b [4]byte
	rand.Read(b[:])
	c.psn = binary.LittleEndian.Uint32(b[:]) & 0xffffff
	mine := c.info()
	var theirs wire.VerbsInfo
	send := func() error { return handshake.WriteFrame(c.ctl, wire.FrameQPInfo, mine.Append(nil)) }
	recv := func() error {
		var p []byte
		if err := expect(c.ctl, wire.FrameQPInfo, &p); err != nil {
			return fmt.Errorf("reading the peer's queue pairs: %w", err)
		}
		v, _, err := wire.ParseVerbsInfo(p)
		if err != nil {
			return fmt.Errorf("malformed queue-pair information: %w", err)
		}
		theirs = v
		return nil
	}
	steps := []func() error{recv, send}
	if dialer {
		steps = []func() error{send, recv}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	switch {
	case len(theirs.QPNs) != len(c.qps):
		return fmt.Errorf("the peer's connection has %d queue pairs, this rank's %d (set GOCCL_IB_QPS_PER_CONNECTION alike on every rank)", len(theirs.QPNs), len(c.qps))
	case int(theirs.Slots) != c.l.slots || int(theirs.SlotSize) != c.l.slotSize:
		return fmt.Errorf("the peer's connection has %d slots of %d bytes, this rank's %d of %d (set the slot settings alike on every rank)",
			theirs.Slots, theirs.SlotSize, c.l.slots, c.l.slotSize)
	}
	c.remote = theirs
	if err := c.connectQPs(); err != nil {
		handshake.Reject(c.ctl, err.Error())
		return err
	}
	// The receives go in before the peer may write.
	for i := range c.qps {
		if err := c.postRecvs(i, c.rqDepth); err != nil {
			return err
		}
	}
	if _, err := c.ctl.Write([]byte{ctlReady}); err != nil {
		return err
	}
	if _, err := c.ctl.Read(b[:1]); err != nil {
		return fmt.Errorf("waiting for the peer's queue pairs: %w", err)
	}
	if b[0] != ctlReady {
		return fmt.Errorf("the peer's queue pairs failed (control byte %q)", b[0])
	}
	if c.ch == boardChannel {
		return nil // a board's entries need no clearance (board.go)
	}
	return c.clear(uint64(c.l.slots))
}

// connectQPs moves each QP to RTR toward the peer's matching QP, then to
// RTS, with NCCL's attributes.
func (c *conn) connectQPs() error {
	p := c.e.port
	o := c.e.o
	mtu := min(p.Attr.ActiveMTU, ibv.MTU(c.remote.MTU))
	if mtu < ibv.MTU256 {
		return fmt.Errorf("the peer's port reports path MTU %d", c.remote.MTU)
	}
	for i, q := range c.qps {
		a := ibv.QPAttr{State: ibv.QPRTR, PathMTU: mtu, DestQPN: c.remote.QPNs[i], RQPSN: c.remote.PSN,
			MaxDestRdAtomic: 1, MinRNRTimer: minRNRTimer,
			AH: ibv.AH{DLID: c.remote.LID, SL: o.SL, Port: uint8(p.Num)}}
		if p.GIDIdx >= 0 {
			a.AH.IsGlobal = true
			a.AH.DGID = c.remote.GID
			a.AH.SGIDIdx = uint8(p.GIDIdx)
			a.AH.HopLimit = 255
			a.AH.TClass = o.TC
		}
		if err := q.Modify(&a, ibv.MaskInitToRTR); err != nil {
			return fmt.Errorf("verbs: ibv_modify_qp to RTR: %w", err)
		}
		a = ibv.QPAttr{State: ibv.QPRTS, SQPSN: c.psn, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: rnrRetry, MaxRdAtomic: 1}
		if err := q.Modify(&a, ibv.MaskRTRToRTS); err != nil {
			return fmt.Errorf("verbs: ibv_modify_qp to RTS: %w", err)
		}
	}
	return nil
}
