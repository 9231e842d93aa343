package ibemu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// A QP's segment, which its peer maps:
//
//	0    magic
//	8    qpn
//	12   state       (atomic; the peer sets ERR on a remote access error)
//	16   rq PSN
//	20   dest QPN
//	24   path MTU, bytes
//	28   dest NIC
//	32   RQ capacity
//	36   inbound ring capacity
//	40   events      (atomic counter of access errors the peer caused)
//	44   overrun     (atomic: the peer found the inbound ring full)
//	48   min RNR timer (what a requester waits after an RNR NAK)
//	128  RQ head     (atomic; receives taken, by the peer or by a flush)
//	256  RQ tail     (receives posted, by the owner)
//	384  ring head   (inbound completions the owner has polled)
//	512  ring tail   (inbound completions the peer has appended; the
//	                 peer's line only: the owner polls the entries)
//	1024 RQ entries  (capacity × 8: the receives' work request ids)
//	...  ring entries (capacity × 64, a cache line each: sequence (its
//	                 index + 1, written last), id, byte_len, imm, status,
//	                 opcode, flags)
const (
	qpMagic      = 0x716d65626967_6f67 // "gogibemq"-ish
	segQPN       = 8
	segState     = 12
	segRQPSN     = 16
	segDestQPN   = 20
	segMTU       = 24
	segDestNIC   = 28
	segRQCap     = 32
	segRingCap   = 36
	segEvents    = 40
	segOverrun   = 44
	segMinRNR    = 48
	segRQHead    = 128
	segRQTail    = 256
	segRingHead  = 384
	segRingTail  = 512
	segRQ        = 1024
	ringEntryLen = 64
)

func qpSegmentLen(rqCap, ringCap int) int {
	n := segRQ + pow2(rqCap)*8 + pow2(ringCap)*ringEntryLen
	return (n + 4095) &^ 4095
}

// pow2 is the least power of two ≥ n: the queues' arrays, indexed by a
// mask (their capacities, what fills them, stay as asked).
func pow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}

// qpView is a QP's segment as either side sees it, with its geometry
// read once.
type qpView struct {
	mem              []byte
	rqN, ringN, ring int    // capacities, and where the ring starts
	rqMask, ringMask uint64 // their arrays' lengths - 1
}

func newView(mem []byte) qpView {
	v := qpView{mem: mem}
	v.rqN, v.ringN = int(v.u32(segRQCap)), int(v.u32(segRingCap))
	v.rqMask, v.ringMask = uint64(pow2(v.rqN)-1), uint64(pow2(v.ringN)-1)
	v.ring = segRQ + pow2(v.rqN)*8
	return v
}

func (v qpView) state() ibv.QPState      { return ibv.QPState(atomicU32(v.mem[segState:]).Load()) }
func (v qpView) setState(s ibv.QPState)  { atomicU32(v.mem[segState:]).Store(uint32(s)) }
func (v qpView) u32(off int) uint32      { return binary.LittleEndian.Uint32(v.mem[off:]) }
func (v qpView) put32(off int, x uint32) { binary.LittleEndian.PutUint32(v.mem[off:], x) }
func (v qpView) rqHead() *atomic.Uint64  { return atomicU64(v.mem[segRQHead:]) }
func (v qpView) rqTail() *atomic.Uint64  { return atomicU64(v.mem[segRQTail:]) }
func (v qpView) ringHead() *atomic.Uint64 {
	return atomicU64(v.mem[segRingHead:])
}
func (v qpView) ringTail() *atomic.Uint64 { return atomicU64(v.mem[segRingTail:]) }
func (v qpView) rqCap() int               { return v.rqN }
func (v qpView) ringCap() int             { return v.ringN }
func (v qpView) rqEntry(i uint64) []byte {
	o := segRQ + int(i&v.rqMask)*8
	return v.mem[o : o+8]
}
func (v qpView) ringEntry(i uint64) []byte {
	o := v.ring + int(i&v.ringMask)*ringEntryLen
	return v.mem[o : o+ringEntryLen]
}

// takeRecv takes the oldest posted receive, if there is one.
func (v qpView) takeRecv() (uint64, bool) {
	for {
		h, t := v.rqHead().Load(), v.rqTail().Load()
		if h >= t {
			return 0, false
		}
		id := binary.LittleEndian.Uint64(v.rqEntry(h))
		if v.rqHead().CompareAndSwap(h, h+1) {
			return id, true
		}
	}
}

// takeRecv is qpView.takeRecv for the requester, which reads the
// owner's tail only when the one it saw last is used up (a line the
// owner writes is a cache miss each time).
func (r *remoteQP) takeRecv() (uint64, bool) {
	v := r.view
	for {
		h := v.rqHead().Load()
		if h >= r.rqTail {
			if r.rqTail = v.rqTail().Load(); h >= r.rqTail {
				return 0, false
			}
		}
		id := binary.LittleEndian.Uint64(v.rqEntry(h))
		if v.rqHead().CompareAndSwap(h, h+1) {
			return id, true
		}
	}
}

// appendCompletion appends a completion to the owner's inbound ring;
// false if the ring is full (the owner's CQ is overrun). The owner's
// head is read only when the one seen last says full.
func (r *remoteQP) appendCompletion(w ibv.WC) bool {
	v := r.view
	t := v.ringTail().Load()
	if t-r.ringHead >= uint64(r.ringCap) {
		if r.ringHead = v.ringHead().Load(); t-r.ringHead >= uint64(r.ringCap) {
			atomicU32(v.mem[segOverrun:]).Store(1)
			return false
		}
	}
	e := v.ringEntry(t)
	binary.LittleEndian.PutUint64(e[8:], w.ID)
	binary.LittleEndian.PutUint32(e[16:], w.ByteLen)
	binary.LittleEndian.PutUint32(e[20:], w.Imm)
	binary.LittleEndian.PutUint32(e[24:], uint32(w.Status))
	binary.LittleEndian.PutUint32(e[28:], uint32(w.Opcode))
	var f uint32
	if w.HasImm {
		f = 1
	}
	binary.LittleEndian.PutUint32(e[32:], f)
	atomicU64(e[0:]).Store(t + 1) // the owner polls this
	v.ringTail().Store(t + 1)
	return true
}

// ringValid reports whether entry i of the inbound ring holds completion i.
func (v qpView) ringValid(i uint64) bool { return atomicU64(v.ringEntry(i)[0:]).Load() == i+1 }

// ringWC decodes entry i.
func (v qpView) ringWC(i uint64, qpn uint32) ibv.WC {
	e := v.ringEntry(i)
	return ibv.WC{ID: binary.LittleEndian.Uint64(e[8:]), ByteLen: binary.LittleEndian.Uint32(e[16:]),
		Imm: binary.LittleEndian.Uint32(e[20:]), Status: ibv.Status(binary.LittleEndian.Uint32(e[24:])),
		Opcode: ibv.WCOpcode(binary.LittleEndian.Uint32(e[28:])), HasImm: binary.LittleEndian.Uint32(e[32:]) != 0, QPNum: qpn}
}

// sqEntry is a posted send request.
type sqEntry struct {
	wr        ibv.SendWR
	seq       uint64    // posting order on the QP, from 1
	notBefore time.Time // a deferral (Options.Adversarial)
	since     time.Time // first attempt, for the retry timeout
	rnr       int       // RNR NAKs so far
}

type qp struct {
	n    *nic
	num  uint32
	cq   *cq
	cap  ibv.QPCap
	seg  *segment
	view qpView

	mu      sync.Mutex // guards the fields below
	attr    ibv.QPAttr
	sq      []sqEntry // posted, not yet executed, in order
	sqBuf   []sqEntry // sq's array, MaxSendWR long
	posted  uint64    // sequence of the last request posted
	timer   *time.Timer
	remote  *remoteQP
	lastMR  *mr  // the region of the last request's source
	checked bool // the pair's attributes have been compared
	gone    bool // destroyed

	retired atomic.Uint64 // every request up to this sequence has left the send queue
	sqLen   atomic.Int32  // len(sq), for Poll
}

var _ ibv.QP = (*qp)(nil)

func (n *nic) CreateQP(c ibv.CQ, caps ibv.QPCap) (ibv.QP, error) {
	ec, ok := c.(*cq)
	if !ok || ec.n != n {
		return nil, fmt.Errorf("ibemu: ibv_create_qp with a CQ of another device: %w", unix.EINVAL)
	}
	if caps.MaxSendWR < 1 || caps.MaxSendWR > 1<<15 || caps.MaxRecvWR < 1 || caps.MaxRecvWR > 1<<15 ||
		caps.MaxSendSGE > 1 || caps.MaxRecvSGE > 1 {
		return nil, fmt.Errorf("ibemu: ibv_create_qp: %d send and %d receive requests of %d and %d SGEs (the emulator takes 1..32768 requests of at most 1 SGE): %w",
			caps.MaxSendWR, caps.MaxRecvWR, caps.MaxSendSGE, caps.MaxRecvSGE, unix.EINVAL)
	}
	ringCap := ec.size + 1
	seg, err := newSegment(qpSegmentLen(caps.MaxRecvWR, ringCap))
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		seg.unmap()
		return nil, errClosed
	}
	n.nextQPN++
	q := &qp{n: n, num: n.nextQPN & 0xffffff, cq: ec, cap: caps, seg: seg, sqBuf: make([]sqEntry, 0, caps.MaxSendWR)}
	binary.LittleEndian.PutUint64(seg.mem[0:], qpMagic)
	binary.LittleEndian.PutUint32(seg.mem[segQPN:], q.num)
	binary.LittleEndian.PutUint32(seg.mem[segRQCap:], uint32(caps.MaxRecvWR))
	binary.LittleEndian.PutUint32(seg.mem[segRingCap:], uint32(ringCap))
	q.view = newView(seg.mem)
	q.view.setState(ibv.QPReset)
	n.qps[q.num] = q
	ec.attach(q)
	return q, nil
}

func (q *qp) Num() uint32 { return q.num }

// allowed lists, for each transition of an RC QP, the attributes it
// requires and those it also accepts (IB spec vol. 1 table 91).
var transitions = map[[2]ibv.QPState][2]ibv.AttrMask{
	{ibv.QPReset, ibv.QPInit}: {ibv.MaskResetToInit, 0},
	{ibv.QPInit, ibv.QPInit}:  {ibv.AttrState, ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAccessFlags},
	{ibv.QPInit, ibv.QPRTR}:   {ibv.MaskInitToRTR, ibv.AttrPKeyIndex | ibv.AttrAccessFlags},
	{ibv.QPRTR, ibv.QPRTS}:    {ibv.MaskRTRToRTS, ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrMinRNRTimer},
	{ibv.QPRTS, ibv.QPRTS}:    {ibv.AttrState, ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrMinRNRTimer},
}

func maskNames(m ibv.AttrMask) string {
	names := []string{0: "STATE", 1: "CUR_STATE", 3: "ACCESS_FLAGS", 4: "PKEY_INDEX", 5: "PORT", 6: "QKEY", 7: "AV",
		8: "PATH_MTU", 9: "TIMEOUT", 10: "RETRY_CNT", 11: "RNR_RETRY", 12: "RQ_PSN", 13: "MAX_QP_RD_ATOMIC",
		15: "MIN_RNR_TIMER", 16: "SQ_PSN", 17: "MAX_DEST_RD_ATOMIC", 19: "CAP", 20: "DEST_QPN"}
	s := ""
	for i := range 32 {
		if m&(1<<i) == 0 {
			continue
		}
		if s != "" {
			s += "|"
		}
		if i < len(names) && names[i] != "" {
			s += names[i]
		} else {
			s += fmt.Sprintf("bit%d", i)
		}
	}
	return s
}

func (q *qp) Modify(a *ibv.QPAttr, mask ibv.AttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		return fmt.Errorf("ibemu: ibv_modify_qp on a destroyed QP: %w", unix.EINVAL)
	}
	cur := q.view.state()
	to := cur
	if mask&ibv.AttrState != 0 {
		to = a.State
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("ibemu: ibv_modify_qp %v→%v: %s: %w", cur, to, fmt.Sprintf(format, args...), unix.EINVAL)
	}
	if to == ibv.QPReset || to == ibv.QPErr {
		if mask != ibv.AttrState {
			return fail("only STATE may be given, got %s", maskNames(mask))
		}
		q.view.setState(to)
		if to == ibv.QPReset {
			q.sq, q.remote, q.checked = q.sqBuf[:0], nil, false
			q.sqLen.Store(0)
			q.view.rqHead().Store(q.view.rqTail().Load())
		} else {
			q.drainLocked()
		}
		return nil
	}
	rule, ok := transitions[[2]ibv.QPState{cur, to}]
	if !ok {
		return fail("no such transition for an RC QP")
	}
	if missing := rule[0] &^ mask; missing != 0 {
		return fail("missing attributes %s", maskNames(missing))
	}
	if extra := mask &^ (rule[0] | rule[1]); extra != 0 {
		return fail("attributes %s are not allowed here", maskNames(extra))
	}
	port, _ := q.n.QueryPort(1)
	if mask&ibv.AttrPort != 0 && a.Port != 1 {
		return fail("port %d (the device has port 1)", a.Port)
	}
	if mask&ibv.AttrPathMTU != 0 && (a.PathMTU < ibv.MTU256 || a.PathMTU > port.ActiveMTU) {
		return fail("path MTU %d bytes, the port's active MTU is %d", a.PathMTU.Bytes(), port.ActiveMTU.Bytes())
	}
	if mask&ibv.AttrAV != 0 {
		switch {
		case !a.AH.IsGlobal && !q.n.p.o.InfiniBand:
			return fail("a RoCE port needs a GRH (is_global) in the address vector")
		case !a.AH.IsGlobal && (a.AH.DLID == 0 || a.AH.DLID >= 0xc000):
			return fail("destination LID %#x is not a unicast LID", a.AH.DLID)
		}
		if g, _, _ := q.n.QueryGID(1, int(a.AH.SGIDIdx)); a.AH.IsGlobal && g.IsZero() {
			return fail("source GID index %d is an empty entry", a.AH.SGIDIdx)
		}
		if a.AH.Port != 0 && a.AH.Port != 1 {
			return fail("address vector port %d", a.AH.Port)
		}
	}
	if mask&ibv.AttrTimeout != 0 && a.Timeout > 31 || mask&ibv.AttrRetryCnt != 0 && a.RetryCnt > 7 ||
		mask&ibv.AttrRNRRetry != 0 && a.RNRRetry > 7 || mask&ibv.AttrMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return fail("timeout %d (≤ 31), retry_cnt %d (≤ 7), rnr_retry %d (≤ 7), min_rnr_timer %d (≤ 31)", a.Timeout, a.RetryCnt, a.RNRRetry, a.MinRNRTimer)
	}
	set := func(m ibv.AttrMask, f func()) {
		if mask&m != 0 {
			f()
		}
	}
	set(ibv.AttrPKeyIndex, func() { q.attr.PKeyIndex = a.PKeyIndex })
	set(ibv.AttrPort, func() { q.attr.Port = a.Port })
	set(ibv.AttrAccessFlags, func() { q.attr.Access = a.Access })
	set(ibv.AttrPathMTU, func() { q.attr.PathMTU = a.PathMTU })
	set(ibv.AttrDestQPN, func() { q.attr.DestQPN = a.DestQPN })
	set(ibv.AttrRQPSN, func() { q.attr.RQPSN = a.RQPSN & 0xffffff })
	set(ibv.AttrSQPSN, func() { q.attr.SQPSN = a.SQPSN & 0xffffff })
	set(ibv.AttrMaxDestRdAtomic, func() { q.attr.MaxDestRdAtomic = a.MaxDestRdAtomic })
	set(ibv.AttrMaxQPRdAtomic, func() { q.attr.MaxRdAtomic = a.MaxRdAtomic })
	set(ibv.AttrMinRNRTimer, func() { q.attr.MinRNRTimer = a.MinRNRTimer })
	set(ibv.AttrTimeout, func() { q.attr.Timeout = a.Timeout })
	set(ibv.AttrRetryCnt, func() { q.attr.RetryCnt = a.RetryCnt })
	set(ibv.AttrRNRRetry, func() { q.attr.RNRRetry = a.RNRRetry })
	set(ibv.AttrAV, func() { q.attr.AH = a.AH })
	if to == ibv.QPRTR {
		q.view.put32(segRQPSN, q.attr.RQPSN)
		q.view.put32(segDestQPN, q.attr.DestQPN)
		q.view.put32(segMTU, uint32(q.attr.PathMTU.Bytes()))
		q.view.put32(segDestNIC, q.destNIC())
	}
	q.view.put32(segMinRNR, uint32(q.attr.MinRNRTimer))
	q.view.setState(to)
	return nil
}

// destNIC is the NIC the address vector names: by GID with a GRH, by LID
// without (InfiniBand within a subnet).
func (q *qp) destNIC() uint32 {
	if q.attr.AH.IsGlobal {
		return nicOfGID(q.attr.AH.DGID)
	}
	return uint32(q.attr.AH.DLID)
}

// retryTimeout is how long a request toward a peer that does not answer
// is retried: 4.096 µs × 2^timeout per try, retry_cnt retries (IB spec
// 9.7.6.1.1), scaled by Options.TimeScale. Timeout 0 means forever.
func (q *qp) retryTimeout() time.Duration {
	if q.attr.Timeout == 0 {
		return time.Duration(math.MaxInt64)
	}
	per := 4096 * time.Nanosecond * time.Duration(1<<q.attr.Timeout)
	return time.Duration(float64(per*time.Duration(q.attr.RetryCnt+1)) * q.n.p.o.TimeScale)
}

// rnrDelays is the RNR NAK timer's encoding (IB spec table 45), in µs.
var rnrDelays = [32]float64{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
	3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.view.state()
	if q.gone || st == ibv.QPReset || st == ibv.QPInit || st == ibv.QPRTR {
		return 0, fmt.Errorf("ibemu: ibv_post_send on a QP in state %v: %w", st, unix.EINVAL)
	}
	for i, w := range wrs {
		switch w.Op {
		case ibv.OpWrite, ibv.OpWriteImm, ibv.OpRead:
		default:
			return i, fmt.Errorf("ibemu: ibv_post_send: opcode %v is not emulated: %w", w.Op, unix.EINVAL)
		}
		if w.Flags&ibv.SendInline != 0 {
			return i, fmt.Errorf("ibemu: ibv_post_send: inline data is not emulated: %w", unix.EINVAL)
		}
		if q.posted+1-q.retired.Load() > uint64(q.cap.MaxSendWR) {
			return i, fmt.Errorf("ibemu: ibv_post_send: send queue full (%d requests outstanding; unsignaled ones leave it only when a later signaled completion is polled): %w",
				q.cap.MaxSendWR, unix.ENOMEM)
		}
		q.posted++
		e := sqEntry{wr: w, seq: q.posted}
		if q.n.p.o.Adversarial && q.n.coin(8) {
			e.notBefore = time.Now().Add(time.Duration(q.n.intn(200)) * time.Microsecond)
		}
		q.sq = append(q.sq, e)
	}
	q.sqLen.Store(int32(len(q.sq)))
	if q.timer == nil {
		q.drainLocked()
	}
	return len(wrs), nil
}

// drainLocked executes the send queue in order until it is empty or a
// request must wait; then a timer takes over.
func (q *qp) drainLocked() {
	defer func() {
		// Keep the queue at the front of its array, so that appends do
		// not allocate.
		n := copy(q.sqBuf[:cap(q.sqBuf)], q.sq)
		q.sq = q.sqBuf[:n]
		q.sqLen.Store(int32(n))
	}()
	for len(q.sq) > 0 {
		e := &q.sq[0]
		if q.view.state() == ibv.QPErr {
			q.cq.push(ibv.WC{ID: e.wr.ID, Status: ibv.WRFlushErr, QPNum: q.num}, q, e.seq)
			q.sq = q.sq[1:]
			continue
		}
		var now time.Time
		var wait time.Duration
		if !e.notBefore.IsZero() {
			now = time.Now()
			wait = e.notBefore.Sub(now)
		}
		var st ibv.Status
		if wait <= 0 {
			st, wait = q.execute(e, now)
		}
		if wait > 0 {
			q.timer = time.AfterFunc(wait, func() {
				q.mu.Lock()
				defer q.mu.Unlock()
				q.timer = nil
				if !q.gone {
					q.drainLocked()
				}
			})
			return
		}
		q.sq = q.sq[1:]
		op := ibv.WCWrite
		if e.wr.Op == ibv.OpRead {
			op = ibv.WCRead
		}
		if st != ibv.Success {
			q.cq.push(ibv.WC{ID: e.wr.ID, Status: st, Opcode: op, QPNum: q.num}, q, e.seq)
			q.view.setState(ibv.QPErr)
			continue
		}
		if e.wr.Flags&ibv.SendSignaled != 0 {
			q.cq.push(ibv.WC{ID: e.wr.ID, Status: ibv.Success, Opcode: op, ByteLen: e.wr.SGE.Len, QPNum: q.num}, q, e.seq)
		}
	}
}

// execute carries out one request: a status once it is done, or how long
// to wait before trying again.
func (q *qp) execute(e *sqEntry, now time.Time) (ibv.Status, time.Duration) {
	w := &e.wr
	unanswered := func() (ibv.Status, time.Duration) {
		if now.IsZero() {
			now = time.Now()
		}
		if e.since.IsZero() {
			e.since = now
		}
		left := q.retryTimeout() - now.Sub(e.since)
		if q.remote != nil && !q.remote.nic.deadAt().IsZero() {
			left = q.retryTimeout() - now.Sub(q.remote.nic.deadAt())
		}
		if left <= 0 {
			return ibv.RetryExcErr, 0
		}
		return 0, min(left, 5*time.Millisecond)
	}
	// Where the packets go.
	if q.remote == nil {
		r, err := q.n.resolve(q.destNIC(), q.attr.DestQPN)
		if err != nil {
			return unanswered()
		}
		q.remote = r
	}
	r := q.remote
	if !r.nic.deadAt().IsZero() {
		return unanswered()
	}
	rs := r.view.state()
	if rs != ibv.QPRTR && rs != ibv.QPRTS {
		// A responder in RESET, INIT or ERR drops the packets.
		return unanswered()
	}
	if !q.checked {
		// The pair must name each other, and the PSNs must match, or no
		// packet is accepted.
		if r.view.u32(segDestQPN) != q.num || r.view.u32(segDestNIC) != q.n.id || r.view.u32(segRQPSN) != q.attr.SQPSN {
			return unanswered()
		}
		q.checked = true
	}
	if int(w.SGE.Len) > int(r.view.u32(segMTU)) && q.attr.PathMTU.Bytes() > int(r.view.u32(segMTU)) {
		// Packets larger than the responder's path MTU are dropped.
		return unanswered()
	}
	// The local side of the request: a write's source, a read's
	// destination.
	read := w.Op == ibv.OpRead
	var local []byte
	if w.SGE.Len > 0 {
		m := q.lastMR
		if m == nil || m.key != w.SGE.LKey || m.dereg.Load() || !m.covers(w.SGE.Addr, w.SGE.Len) || read && m.access&ibv.AccessLocalWrite == 0 {
			var ok bool
			if m, ok = q.n.localMR(w.SGE, read); !ok {
				return ibv.LocProtErr, 0
			}
			q.lastMR = m
		}
		local = m.bytes(w.SGE.Addr, w.SGE.Len)
	}
	// The remote side.
	var remote []byte
	if w.SGE.Len > 0 {
		need := ibv.AccessRemoteWrite
		if read {
			need = ibv.AccessRemoteRead
		}
		var ok bool
		if remote, ok = r.region(w.RKey, w.Remote, w.SGE.Len, need); !ok {
			r.fail()
			return ibv.RemAccessErr, 0
		}
	}
	if read {
		// A read's response comes back in packets too: placed in any
		// order, complete only at its completion.
		q.n.place(local, remote)
		return ibv.Success, 0
	}
	dst, src := remote, local
	var recvID uint64
	if w.Op == ibv.OpWriteImm {
		id, ok := r.takeRecv()
		if !ok {
			e.rnr++
			if q.attr.RNRRetry != 7 && e.rnr > int(q.attr.RNRRetry) {
				return ibv.RNRRetryExcErr, 0
			}
			d := time.Duration(rnrDelays[r.minRNRTimer()] * float64(time.Microsecond))
			return 0, max(d, time.Nanosecond)
		}
		recvID = id
	}
	q.n.place(dst, src)
	if w.Op == ibv.OpWriteImm {
		r.appendCompletion(ibv.WC{ID: recvID, Status: ibv.Success, Opcode: ibv.WCRecvWriteImm,
			ByteLen: w.SGE.Len, Imm: w.Imm, HasImm: true, QPNum: r.num})
	}
	return ibv.Success, 0
}

// place copies src into dst, in a random order of chunks when the
// emulator is adversarial.
func (n *nic) place(dst, src []byte) {
	if !n.p.o.Adversarial || len(src) < 2 {
		copy(dst, src)
		return
	}
	chunk := max(64, len(src)/16)
	k := (len(src) + chunk - 1) / chunk
	n.mu.Lock()
	order := n.rng.Perm(k)
	n.mu.Unlock()
	for j, i := range order {
		lo := i * chunk
		hi := min(lo+chunk, len(src))
		copy(dst[lo:hi], src[lo:hi])
		if j == 0 {
			// Leave the message torn for a moment, as a NIC placing
			// packets out of order across PCIe writes would.
			spin(2 * time.Microsecond)
		}
	}
}

func (q *qp) PostRecv(wrs []ibv.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.view.state()
	if q.gone || st == ibv.QPReset {
		return 0, fmt.Errorf("ibemu: ibv_post_recv on a QP in state %v: %w", st, unix.EINVAL)
	}
	v := q.view
	for i, w := range wrs {
		if w.SGE.Len > 0 {
			if _, ok := q.n.localMR(w.SGE, true); !ok {
				return i, fmt.Errorf("ibemu: ibv_post_recv: the receive's buffer is not in a region with local write access: %w", unix.EINVAL)
			}
		}
		t := v.rqTail().Load()
		if t-v.rqHead().Load() >= uint64(v.rqCap()) {
			return i, fmt.Errorf("ibemu: ibv_post_recv: receive queue full (%d): %w", v.rqCap(), unix.ENOMEM)
		}
		binary.LittleEndian.PutUint64(v.rqEntry(t), w.ID)
		v.rqTail().Store(t + 1)
	}
	return len(wrs), nil
}

func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.gone {
		q.mu.Unlock()
		return fmt.Errorf("ibemu: ibv_destroy_qp of a destroyed QP: %w", unix.EINVAL)
	}
	q.gone = true
	if q.timer != nil {
		q.timer.Stop()
	}
	q.view.setState(ibv.QPErr) // the peer's requests are dropped from now on
	q.mu.Unlock()
	q.cq.detach(q)
	q.n.mu.Lock()
	delete(q.n.qps, q.num)
	q.n.mu.Unlock()
	// The segment stays mapped until the device closes: a peer's request
	// may be executing against its own mapping, and ours costs nothing.
	q.n.mu.Lock()
	q.n.deadSegs = append(q.n.deadSegs, q.seg)
	q.n.mu.Unlock()
	return nil
}

func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
	}
}
