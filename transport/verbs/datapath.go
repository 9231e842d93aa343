package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// The data path. Message s (numbered from 0 on each side) uses slot
// s % Slots on both sides and QP s % QPs:
//
//   - the receiver clears messages to be sent: it writes one 16-byte
//     entry per message into the sender's FIFO (where the payload may
//     land, its key and room), and an RDMA write with immediate of the
//     last entries tells the sender, immediate immCTS | the last message
//     cleared. Clearances are cumulative and go on QP 0, in order;
//   - the sender fills its staging slot (Reserve), then posts one chain:
//     an RDMA write of the payload to where the entry says (none for a
//     payload of up to 32 bytes, which rides in the header), and an RDMA
//     write with immediate of the 64-byte header into the receiver's
//     header entry, immediate s. A QP delivers in order, so when the
//     header's completion arrives, the payload has landed;
//   - the receiver learns of it from the completion, never from the
//     data (placement within a message is unordered), reads the header,
//     and on Release frees the slot for message s + Slots. It tells the
//     sender only once the sender may be running short (fewer than
//     Slots/2 + 2 messages cleared and not arrived): the engine's
//     schedules need half the slots and one more (algorithms.MinPieces),
//     and a clearance per message would cost a request per message.
//
// Messages on QP i arrive in order, so the k-th to arrive on it is
// number k·QPs + i; the immediate checks that. Requests are signaled
// once every Slots on a QP (the send queue holds 4·Slots + 8), and when
// a staging slot or FIFO entry is to be reused before the request that
// last read it is known to be done, a zero-length signaled write fences
// the QP.

// clearAfter is how long a wait lasts (counted from its 64th poll)
// before the clearances Release held back go out: longer than a quick
// exchange takes.
const clearAfter = 10 * time.Microsecond

// sigEvery is how many requests a QP posts per signaled one.
func (c *conn) sigEvery() int { return c.l.slots }

// post posts wrs on QP qi, numbering and signaling them, and returns the
// last one's reference.
func (c *conn) post(qi int, wrs []ibv.SendWR, force bool) (wrRef, error) {
	for i := range wrs {
		c.posted[qi]++
		c.unsignaled[qi]++
		wrs[i].ID = uint64(qi)<<56 | c.posted[qi]
		if c.unsignaled[qi] >= c.sigEvery() || force && i == len(wrs)-1 {
			wrs[i].Flags |= ibv.SendSignaled
			c.signaled[qi] = c.posted[qi]
			c.unsignaled[qi] = 0
		}
	}
	if _, err := c.qps[qi].PostSend(wrs); err != nil {
		c.fail(fmt.Errorf("verbs: ibv_post_send: %w", err))
		return wrRef{}, c.failed
	}
	return wrRef{qi, c.posted[qi]}, nil
}

// fence makes sure a signaled request at or after r.n is posted on r's QP.
func (c *conn) fence(r wrRef) error {
	if r.n == 0 || c.signaled[r.qp] >= r.n {
		return nil
	}
	c.wrs = append(c.wrs[:0], ibv.SendWR{Op: ibv.OpWrite, Remote: c.remote.Addr, RKey: c.remote.RKey})
	_, err := c.post(r.qp, c.wrs, true)
	return err
}

func (c *conn) isDone(r wrRef) bool { return r.n == 0 || c.done[r.qp] >= r.n }

func (c *conn) postRecvs(qi, n int) error {
	if cap(c.rwrs) < n {
		c.rwrs = make([]ibv.RecvWR, n)
	}
	wrs := c.rwrs[:n]
	for i := range wrs {
		wrs[i] = ibv.RecvWR{ID: uint64(qi)}
	}
	if _, err := c.qps[qi].PostRecv(wrs); err != nil {
		c.fail(fmt.Errorf("verbs: ibv_post_recv: %w", err))
		return c.failed
	}
	c.owed[qi] = 0
	return nil
}

// poll takes the completions there are.
func (c *conn) poll() {
	if c.failed != nil {
		return
	}
	n, err := c.cq.Poll(c.wcs)
	if err != nil {
		c.fail(fmt.Errorf("verbs: polling the completion queue: %w", err))
		return
	}
	nq := uint64(len(c.qps))
	for _, wc := range c.wcs[:n] {
		qi, ok := c.qpIdx[wc.QPNum]
		if !ok {
			c.fail(fmt.Errorf("verbs: a completion for QP %#x, which is not this connection's", wc.QPNum))
			return
		}
		if wc.Status != ibv.Success {
			if wc.ID>>56 == uint64(qi) && wc.ID&(1<<56-1) > c.done[qi] && wc.Opcode&ibv.WCRecv == 0 {
				c.done[qi] = wc.ID & (1<<56 - 1) // failed, but no longer reading its source
			}
			if c.peerGone.Load() {
				// Clearances toward a peer that closed gracefully fail
				// once its queue pairs are gone; everything it sent has
				// arrived.
				continue
			}
			c.fail(c.wcError(wc))
			return
		}
		if wc.Opcode&ibv.WCRecv == 0 {
			c.done[qi] = max(c.done[qi], wc.ID&(1<<56-1))
			continue
		}
		c.owed[qi]++
		if !wc.HasImm {
			c.fail(fmt.Errorf("protocol error: rank %d sent a message without an immediate", c.peer))
			return
		}
		if c.brd != nil {
			c.boardWC(wc.Imm)
			continue
		}
		if wc.Imm&immCTS != 0 {
			// Clearances are cumulative: the immediate is the last
			// message cleared, at most Slots past what was cleared
			// before.
			d := uint64((wc.Imm&immMask + 1 - uint32(c.ctsUpTo)) & immMask)
			if qi != 0 || d > uint64(c.l.slots) || c.ctsUpTo+d > c.sendSeq+uint64(c.l.slots) {
				c.fail(fmt.Errorf("protocol error: rank %d cleared up to message %d on queue pair %d, %d were cleared and %d sent", c.peer, wc.Imm&immMask, qi, c.ctsUpTo, c.sendSeq))
				return
			}
			c.ctsUpTo += d
			continue
		}
		s := c.dataIn[qi]*nq + uint64(qi)
		c.dataIn[qi]++
		c.arrivedN++
		if wc.Imm&immMask != uint32(s)&immMask {
			c.fail(fmt.Errorf("protocol error: rank %d's message %d arrived as number %d on queue pair %d", c.peer, wc.Imm&immMask, s, qi))
			return
		}
		c.arrived[s%uint64(c.l.slots)] = s + 1
	}
	for qi, o := range c.owed {
		if o >= 8 {
			if c.postRecvs(qi, o) != nil {
				return
			}
		}
	}
}

func (c *conn) wcError(wc ibv.WC) error {
	err := &ibv.WCError{Status: wc.Status, Op: wc.Opcode, Vendor: wc.Vendor}
	return fmt.Errorf("RDMA with rank %d on %s: %w", c.peer, c.e.port.Device.Name, err)
}

func (c *conn) fail(err error) {
	if c.failed == nil {
		c.failed = err
	}
}

func (c *conn) failAsync(err error) { c.asyncErr.CompareAndSwap(nil, err) }

// broken returns why the connection cannot go on, if it cannot.
func (c *conn) broken(op string) error {
	if c.down.Load() {
		return c.e.closedErr()
	}
	if r, ok := c.peerAbort.Load().(string); ok {
		return &transport.PeerError{Peer: c.peer, Op: op, Err: &transport.PeerAbortedError{Peer: c.peer, Cause: errors.New(r)}}
	}
	if c.failed != nil {
		return &transport.PeerError{Peer: c.peer, Op: op, Err: c.failed}
	}
	if err, ok := c.asyncErr.Load().(error); ok {
		return &transport.PeerError{Peer: c.peer, Op: op, Err: err}
	}
	if c.peerLost.Load() {
		return &transport.PeerError{Peer: c.peer, Op: op, Err: fmt.Errorf("connection lost (did rank %d's process exit or abort?)", c.peer)}
	}
	return nil
}

// waitFor polls until ready holds, the connection breaks, the peer closes
// (ErrPeerClosed once nothing more can come), or ctx ends. It spins for
// SpinFor, then sleeps between polls.
func (c *conn) waitFor(ctx context.Context, op string, ready func() bool) error {
	c.poll()
	if ready() {
		return nil
	}
	// The clock is read only once the wait has lasted 64 polls: most
	// waits end sooner, and a read of it costs as much as a poll.
	var start time.Time
	sleep := time.Duration(0)
	cleared := false
	for i := 1; ; i++ {
		c.poll()
		if ready() {
			return nil
		}
		if err := c.broken(op); err != nil {
			if c.failed == nil && !c.down.Load() {
				c.poll() // what the peer sent before it went has arrived
				if ready() {
					return nil
				}
			}
			return err
		}
		if c.peerGone.Load() {
			c.poll() // what was posted before the notice has completed
			if ready() {
				return nil
			}
			return &transport.PeerError{Peer: c.peer, Op: op, Err: transport.ErrPeerClosed}
		}
		pending := false
		if p := c.e.o.Progress; p != nil {
			var err error
			if pending, err = p(c.ch); err != nil {
				return err
			}
		}
		if i%64 == 0 {
			if ctx.Err() != nil {
				return &transport.PeerError{Peer: c.peer, Op: op, Err: context.Cause(ctx)}
			}
			if start.IsZero() {
				start = time.Now()
				continue
			}
			if !cleared && time.Since(start) > clearAfter {
				// Not a quick exchange: clear every peer of the channel
				// for what this goroutine has released, so that no two
				// ranks wait on each other's clearances.
				cleared = true
				if err := c.clearChannel(); err != nil {
					return &transport.PeerError{Peer: c.peer, Op: op, Err: err}
				}
			}
			if pending || time.Since(start) < c.e.o.SpinFor {
				runtime.Gosched()
				continue
			}
			sleep = min(max(2*sleep, 10*time.Microsecond), 500*time.Microsecond)
			time.Sleep(sleep)
		}
	}
}

func (c *conn) Peer() int { return c.peer }

func (c *conn) Reserve(ctx context.Context, n int) (memory.Buffer, error) {
	c.use.Lock()
	defer c.use.Unlock()
	if n < 0 || n > c.l.slotSize {
		return memory.Buffer{}, fmt.Errorf("verbs: reserve %d bytes of a %d-byte slot", n, c.l.slotSize)
	}
	if c.down.Load() {
		return memory.Buffer{}, c.e.closedErr()
	}
	if c.reserved >= 0 {
		return memory.Buffer{}, errors.New("verbs: reserve before the last reservation was posted")
	}
	s := c.sendSeq
	i := int(s % uint64(c.l.slots))
	if err := c.fence(c.staged[i]); err != nil {
		return memory.Buffer{}, &transport.PeerError{Peer: c.peer, Op: "send", Err: err}
	}
	if err := c.waitFor(ctx, "send", func() bool { return s < c.ctsUpTo && c.isDone(c.staged[i]) }); err != nil {
		return memory.Buffer{}, err
	}
	c.reserved = n
	if n <= c.inline {
		return c.hostView(c.l.l1+i*hdrLen+hdrInline, n), nil
	}
	o := i * c.l.slotSize
	return c.slots.send.Slice(o, o+n), nil
}

func (c *conn) hdrSrc(i int) []byte { o := c.l.l1 + i*hdrLen; return c.mem.B[o : o+hdrLen] }
func (c *conn) hdrIn(i int) []byte  { o := i * hdrLen; return c.mem.B[o : o+hdrLen] }

// hostView is n bytes at offset o of the connection's host memory, as
// the engine sees it: mapped for the GPU on a staged device connection.
func (c *conn) hostView(o, n int) memory.Buffer {
	if c.mapped.Len() > 0 {
		return c.mapped.Slice(o, o+n)
	}
	return memory.HostBuffer(c.mem.B[o : o+n : o+n])
}

const hdrInline = 32

func (c *conn) Post(n int, tag transport.Tag) error {
	c.use.Lock()
	defer c.use.Unlock()
	if err := c.broken("send"); err != nil {
		return err
	}
	if c.reserved < 0 || n > c.reserved {
		return fmt.Errorf("verbs: post of %d bytes without a matching reserve", n)
	}
	c.reserved = -1
	s := c.sendSeq
	i := int(s % uint64(c.l.slots))
	e := c.mem.B[c.l.fifo+i*ctsLen:]
	dst, rkey, room := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
	if n > int(room) {
		return &transport.PeerError{Peer: c.peer, Op: "send", Err: fmt.Errorf("protocol error: rank %d cleared %d bytes for message %d, %d are to go", c.peer, room, s, n)}
	}
	h := c.hdrSrc(i)
	c.wrs = c.wrs[:0]
	hl := uint32(hdrInline)
	if n > c.inline {
		putHeader(h, tag, n, s, 0)
		c.wrs = append(c.wrs, ibv.SendWR{Op: ibv.OpWrite, SGE: ibv.SGE{Addr: c.slots.sendAddr + uint64(i*c.l.slotSize), Len: uint32(n), LKey: c.slots.sendKey},
			Remote: dst, RKey: rkey})
	} else {
		putHeader(h, tag, n, s, hdrInlined)
		hl += uint32(n)
	}
	c.wrs = append(c.wrs, ibv.SendWR{Op: ibv.OpWriteImm, Imm: uint32(s) & immMask, SGE: ibv.SGE{Addr: ibv.Addr(h), Len: hl, LKey: c.lmr.LKey()},
		Remote: c.remote.Addr + uint64(i*hdrLen), RKey: c.remote.RKey})
	ref, err := c.post(int(s%uint64(len(c.qps))), c.wrs, false)
	if err != nil {
		return &transport.PeerError{Peer: c.peer, Op: "send", Err: err}
	}
	c.staged[i] = ref
	c.sendSeq++
	return nil
}

func (c *conn) Wait(ctx context.Context) (memory.Buffer, transport.Tag, error) {
	c.use.Lock()
	defer c.use.Unlock()
	if c.down.Load() {
		return memory.Buffer{}, transport.Tag{}, c.e.closedErr()
	}
	if c.holding {
		return memory.Buffer{}, transport.Tag{}, errors.New("verbs: wait before the last slice was released")
	}
	s := c.recvSeq
	i := int(s % uint64(c.l.slots))
	if err := c.waitFor(ctx, "recv", func() bool { return c.arrived[i] == s+1 }); err != nil {
		return memory.Buffer{}, transport.Tag{}, err
	}
	h := c.hdrIn(i)
	tag := transport.Tag{Op: binary.LittleEndian.Uint64(h), Sig: binary.LittleEndian.Uint32(h[8:]),
		Msg: binary.LittleEndian.Uint32(h[12:]), Slice: binary.LittleEndian.Uint32(h[16:])}
	size := int(binary.LittleEndian.Uint32(h[20:]))
	inlined := binary.LittleEndian.Uint32(h[28:])&hdrInlined != 0
	if seq := binary.LittleEndian.Uint32(h[24:]); seq != uint32(s) || size > c.l.slotSize || inlined && size > inlineMax {
		c.fail(fmt.Errorf("protocol error: rank %d's header for message %d says message %d of %d bytes (slots hold %d)", c.peer, s, seq, size, c.l.slotSize))
		return memory.Buffer{}, transport.Tag{}, &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.failed}
	}
	if inlined {
		c.holding = true
		return c.hostView(i*hdrLen+hdrInline, size), tag, nil
	}
	if c.flush != nil && size > 0 {
		// The NIC wrote into device memory: a read through it makes the
		// writes visible to the GPU before its kernels use them (gdr.go).
		if err := c.flushSlot(ctx, i); err != nil {
			return memory.Buffer{}, transport.Tag{}, err
		}
	}
	c.holding = true
	o := i * c.l.slotSize
	return c.slots.recv.Slice(o, o+size), tag, nil
}

func (c *conn) Release() error {
	c.use.Lock()
	defer c.use.Unlock()
	if err := c.broken("recv"); err != nil {
		return err
	}
	if !c.holding {
		return errors.New("verbs: release without a matching wait")
	}
	c.holding = false
	s := c.recvSeq
	c.recvSeq++
	c.arrived[s%uint64(c.l.slots)] = 0
	if c.peerGone.Load() {
		return nil // it sends nothing more
	}
	if c.cleared-c.arrivedN > uint64(c.l.slots)/2+1 {
		return nil // the sender has room enough: tell it later, with others
	}
	if err := c.clear(c.recvSeq + uint64(c.l.slots)); err != nil {
		return &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
	}
	return nil
}

// clearChannel sends the clearances that this connection, and the
// others of its channel (driven by the same goroutine), hold back.
func (c *conn) clearChannel() error {
	if err := c.clearHeld(); err != nil {
		return err
	}
	if c.set == nil {
		return nil
	}
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	for _, o := range c.set.conns {
		if o == c || !o.use.TryLock() {
			continue // in use elsewhere: Close has it
		}
		if !o.down.Load() && o.failed == nil {
			o.clearHeld()
		}
		o.use.Unlock()
	}
	return nil
}

// clearHeld sends what Release held back.
func (c *conn) clearHeld() error {
	if c.peerGone.Load() || c.failed != nil || c.ch == boardChannel {
		return nil // a board's entries need no clearance (board.go)
	}
	return c.clear(c.recvSeq + uint64(c.l.slots))
}

// clear clears the peer to send every message below upTo: one FIFO
// entry each, the last in a write with immediate, on QP 0.
func (c *conn) clear(upTo uint64) error {
	from := c.cleared
	if upTo <= from {
		return nil
	}
	n := uint64(c.l.slots)
	for t := from; t < upTo; t++ {
		i := int(t % n)
		if !c.isDone(c.ctsUsed[i]) {
			// Its source entry is still being read: rare, since requests
			// are signaled every Slots on a QP.
			if err := c.fence(c.ctsUsed[i]); err != nil {
				return err
			}
			for !c.isDone(c.ctsUsed[i]) {
				if err := c.broken("recv"); err != nil {
					return err
				}
				c.poll()
			}
		}
		e := c.mem.B[c.l.l2+i*ctsLen:]
		binary.LittleEndian.PutUint64(e, c.slots.recvAddr+uint64(i*c.l.slotSize))
		binary.LittleEndian.PutUint32(e[8:], c.slots.recvKey)
		binary.LittleEndian.PutUint32(e[12:], uint32(c.l.slotSize))
	}
	// The entries from..upTo-1, contiguous but for a wrap: up to two
	// writes, the last with the immediate.
	c.wrs = c.wrs[:0]
	for t := from; t < upTo; {
		i := int(t % n)
		k := min(upTo-t, n-uint64(i))
		c.wrs = append(c.wrs, ibv.SendWR{Op: ibv.OpWrite,
			SGE:    ibv.SGE{Addr: ibv.Addr(c.mem.B[c.l.l2+i*ctsLen:]), Len: uint32(k) * ctsLen, LKey: c.lmr.LKey()},
			Remote: c.remote.Addr + uint64(c.l.fifo+i*ctsLen), RKey: c.remote.RKey})
		t += k
	}
	last := &c.wrs[len(c.wrs)-1]
	last.Op, last.Imm = ibv.OpWriteImm, immCTS|uint32(upTo-1)&immMask
	ref, err := c.post(0, c.wrs, false)
	if err != nil {
		return err
	}
	for t := from; t < upTo; t++ {
		c.ctsUsed[t%n] = ref
	}
	c.cleared = upTo
	return nil
}

// watch follows the control socket: the peer's close or abort notice, or
// its loss.
func (c *conn) watch() {
	c.watched.Add(1)
	go func() {
		defer c.watched.Done()
		var b [1]byte
		for {
			if _, err := c.ctl.Read(b[:]); err != nil {
				if !c.peerGone.Load() && c.peerAbort.Load() == nil {
					c.peerLost.Store(true)
				}
				return
			}
			switch b[0] {
			case ctlGone:
				c.peerGone.Store(true)
			case ctlAbort:
				c.peerAbort.Store(readAbort(c.ctl))
			}
		}
	}()
}

// close ends the connection: gracefully (everything posted completes,
// then the peer is told), or with cause (the peer is told why); then it
// destroys the QPs and frees the memory, once no call uses them.
func (c *conn) close(cause error) {
	c.closeOnce.Do(func() {
		c.down.Store(true)
		c.use.Lock()
		defer c.use.Unlock()
		if cause == nil {
			c.drain(2 * time.Second)
			c.ctl.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			c.ctl.Write([]byte{ctlGone})
		} else {
			writeAbort(c.ctl, cause.Error())
		}
		c.teardown()
		c.watched.Wait()
	})
}

// drain waits, at most d, until every request posted has completed.
func (c *conn) drain(d time.Duration) {
	for qi := range c.qps {
		if c.posted[qi] > c.done[qi] {
			c.fence(wrRef{qi, c.posted[qi]})
		}
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && c.failed == nil && !c.peerGone.Load() && !c.peerLost.Load() && c.peerAbort.Load() == nil {
		all := true
		for qi := range c.qps {
			all = all && c.done[qi] >= c.posted[qi]
		}
		if all {
			return
		}
		c.poll()
		runtime.Gosched()
	}
}

// teardown destroys what newConn made.
func (c *conn) teardown() {
	for _, q := range c.qps {
		q.Modify(&ibv.QPAttr{State: ibv.QPErr}, ibv.AttrState)
		q.Destroy()
	}
	c.qps = nil
	if c.cq != nil {
		c.cq.Destroy()
		c.cq = nil
	}
	// The engine may still hold a slot (Wait before Release, Reserve
	// before Post) while another goroutine aborts: the memory then stays
	// until a later Close of the endpoint, when no call uses it, rather
	// than being pulled from under the call.
	held := c.holding || c.reserved >= 0
	dev := c.releaseDevice(held)
	c.rref.release()
	c.lref.release()
	c.rmr, c.lmr, c.rref, c.lref = nil, nil, nil, nil
	if held {
		m := c.mem
		c.e.mu.Lock()
		c.e.leftovers = append(c.e.leftovers, func() {
			if dev != nil {
				dev()
			}
			if m != nil {
				m.Free()
			}
		})
		c.e.mu.Unlock()
	} else if c.mem != nil {
		c.mem.Free()
	}
	c.mem = nil
	c.ctl.Close()
}
