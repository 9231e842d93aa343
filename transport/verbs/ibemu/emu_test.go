//go:build linux

package ibemu

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// end is one side of a test connection: a NIC, a CQ, a QP and a region.
type end struct {
	ctx ibv.Context
	cq  ibv.CQ
	qp  ibv.QP
	mem *ibv.Mem
	mr  ibv.MR
}

type endOpts struct {
	cqe, sendWR, recvWR int
	access              ibv.Access
	size                int
}

func newEnd(t testing.TB, p *Provider, o endOpts) *end {
	t.Helper()
	if o.cqe == 0 {
		o.cqe = 64
	}
	if o.sendWR == 0 {
		o.sendWR = 32
	}
	if o.recvWR == 0 {
		o.recvWR = 32
	}
	if o.access == 0 {
		o.access = ibv.AccessRemoteWriteAll
	}
	if o.size == 0 {
		o.size = 1 << 20
	}
	c, err := p.Open(DeviceName)
	require.NoError(t, err)
	e := &end{ctx: c}
	e.cq, err = c.CreateCQ(o.cqe)
	require.NoError(t, err)
	e.qp, err = c.CreateQP(e.cq, ibv.QPCap{MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	e.mem, err = ibv.Alloc(o.size)
	require.NoError(t, err)
	e.mr, err = c.RegMR(e.mem.B, o.access)
	require.NoError(t, err)
	t.Cleanup(func() {
		e.qp.Destroy()
		e.cq.Destroy()
		e.mr.Dereg()
		e.mem.Free()
		e.ctx.Close()
	})
	return e
}

// connect moves a's QP to RTS toward b's, with NCCL's attributes;
// mod may change the RTR/RTS attributes.
func connect(t *testing.T, a, b *end, mod func(*ibv.QPAttr)) {
	t.Helper()
	gid, _, err := b.ctx.QueryGID(1, 2)
	require.NoError(t, err)
	connectTo(t, a, gid, b.qp.Num(), mod)
}

// connectTo moves a's QP to RTS toward QP qpn of the NIC with GID gid.
func connectTo(t testing.TB, a *end, gid ibv.GID, qpn uint32, mod func(*ibv.QPAttr)) {
	t.Helper()
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 1, Access: ibv.AccessRemoteWriteAll}, ibv.MaskResetToInit))
	at := ibv.QPAttr{State: ibv.QPRTR, PathMTU: ibv.MTU4096, DestQPN: qpn, RQPSN: 7, SQPSN: 7, MinRNRTimer: 12,
		AH:      ibv.AH{IsGlobal: true, DGID: gid, SGIDIdx: 2, HopLimit: 255, Port: 1},
		Timeout: 20, RetryCnt: 7, RNRRetry: 7, MaxDestRdAtomic: 1, MaxRdAtomic: 1}
	if mod != nil {
		mod(&at)
	}
	require.NoError(t, a.qp.Modify(&at, ibv.MaskInitToRTR))
	at.State = ibv.QPRTS
	require.NoError(t, a.qp.Modify(&at, ibv.MaskRTRToRTS))
}

func pair(t *testing.T, o Options, ao, bo endOpts) (*end, *end) {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	p := New(o)
	a, b := newEnd(t, p, ao), newEnd(t, p, bo)
	connect(t, a, b, nil)
	connect(t, b, a, nil)
	return a, b
}

// poll waits for n completions, for at most d.
func poll(t *testing.T, c ibv.CQ, n int, d time.Duration) []ibv.WC {
	t.Helper()
	var got []ibv.WC
	wc := make([]ibv.WC, 16)
	deadline := time.Now().Add(d)
	for len(got) < n {
		k, err := c.Poll(wc)
		require.NoError(t, err)
		got = append(got, wc[:k]...)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions after %v: %+v", len(got), n, d, got)
		}
	}
	return got
}

func write(a, b *end, id uint64, off, n int, imm uint32, signaled bool) ibv.SendWR {
	w := ibv.SendWR{ID: id, Op: ibv.OpWriteImm, Imm: imm,
		SGE:    ibv.SGE{Addr: a.mr.Addr() + uint64(off), Len: uint32(n), LKey: a.mr.LKey()},
		Remote: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}
	if signaled {
		w.Flags = ibv.SendSignaled
	}
	return w
}

func TestWriteWithImmediate(t *testing.T) {
	a, b := pair(t, Options{Adversarial: true, Seed: 1}, endOpts{}, endOpts{})
	for i := range a.mem.B[:100_000] {
		a.mem.B[i] = byte(i * 7)
	}
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 41}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 5, 0, 100_000, 0xdeadbeef, true)})
	require.NoError(t, err)
	rc := poll(t, b.cq, 1, time.Second)
	require.Equal(t, ibv.WC{ID: 41, Status: ibv.Success, Opcode: ibv.WCRecvWriteImm, ByteLen: 100_000, Imm: 0xdeadbeef, HasImm: true, QPNum: b.qp.Num()}, rc[0])
	require.Equal(t, a.mem.B[:100_000], b.mem.B[:100_000])
	sc := poll(t, a.cq, 1, time.Second)
	require.Equal(t, ibv.Status(ibv.Success), sc[0].Status)
	require.Equal(t, uint64(5), sc[0].ID)
}

// A receiver that polls on the data (a flag in the last byte) instead of
// the completion reads messages whose earlier bytes have not landed.
func TestPollingOnDataSeesTornMessages(t *testing.T) {
	a, b := pair(t, Options{Adversarial: true, Seed: 2}, endOpts{}, endOpts{recvWR: 256, cqe: 512})
	// Up to 2000 messages, until one is seen torn (each needs the reader
	// to look during the moment a message is half placed).
	const size, rounds = 64 << 10, 2000
	torn := 0
	ack := make(chan bool)
	stop, readerDone := make(chan struct{}), make(chan struct{})
	defer func() { <-readerDone }() // before the memory goes
	go func() {
		defer close(readerDone)
		for k := 1; k <= rounds; k++ {
			deadline := time.Now().Add(2 * time.Second)
			for b.mem.B[size-1] != byte(k) { // careless: the flag is data
				select {
				case <-stop:
					return
				default:
				}
				if time.Now().After(deadline) {
					close(ack)
					return
				}
			}
			whole := true
			for _, v := range b.mem.B[:size] {
				if v != byte(k) {
					whole = false
					break
				}
			}
			ack <- whole
		}
	}()
	for k := 1; k <= rounds; k++ {
		for i := range a.mem.B[:size] {
			a.mem.B[i] = byte(k)
		}
		_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: uint64(k)}})
		require.NoError(t, err)
		_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, uint64(k), 0, size, uint32(k), true)})
		require.NoError(t, err)
		whole, ok := <-ack
		require.True(t, ok, "message %d never arrived", k)
		if !whole {
			torn++
		}
		poll(t, a.cq, 1, time.Second)
		poll(t, b.cq, 1, time.Second)
		require.Equal(t, byte(k), b.mem.B[0], "the completion came before the data")
		if torn > 0 {
			break
		}
	}
	close(stop)
	require.Positive(t, torn, "no torn message seen in %d: the emulator places messages in order", rounds)
	t.Logf("%d of %d messages read torn by a receiver that polls on data", torn, rounds)
}

// A sender that reuses its buffer before the completion may send the new
// bytes: deferred requests read their source when they run.
func TestReusingASourceBeforeItsCompletionCorrupts(t *testing.T) {
	a, b := pair(t, Options{Adversarial: true, Seed: 3}, endOpts{sendWR: 512, cqe: 1024}, endOpts{recvWR: 512, cqe: 1024})
	const rounds = 200
	recvs := make([]ibv.RecvWR, rounds)
	_, err := b.qp.PostRecv(recvs)
	require.NoError(t, err)
	for k := range rounds {
		a.mem.B[k] = 1
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: uint64(k), Op: ibv.OpWriteImm, Flags: ibv.SendSignaled,
			SGE: ibv.SGE{Addr: a.mr.Addr() + uint64(k), Len: 1, LKey: a.mr.LKey()}, Remote: b.mr.Addr() + uint64(k), RKey: b.mr.RKey()}})
		require.NoError(t, err)
		a.mem.B[k] = 2 // careless: too early
	}
	poll(t, b.cq, rounds, 2*time.Second)
	late := 0
	for k := range rounds {
		if b.mem.B[k] == 2 {
			late++
		}
	}
	require.Positive(t, late, "every request read its source at post time")
}

// Order holds within a QP, never across QPs.
func TestOrderOnlyWithinAQP(t *testing.T) {
	p := New(Options{Dir: t.TempDir(), Adversarial: true, Seed: 4})
	a1, b1 := newEnd(t, p, endOpts{sendWR: 512, cqe: 1024}), newEnd(t, p, endOpts{recvWR: 512, cqe: 1024})
	a2, b2 := newEnd(t, p, endOpts{sendWR: 512, cqe: 1024}), newEnd(t, p, endOpts{recvWR: 512, cqe: 1024})
	for _, pr := range [][2]*end{{a1, b1}, {b1, a1}, {a2, b2}, {b2, a2}} {
		connect(t, pr[0], pr[1], nil)
	}
	const rounds = 200
	_, err := b1.qp.PostRecv(make([]ibv.RecvWR, rounds))
	require.NoError(t, err)
	_, err = b2.qp.PostRecv(make([]ibv.RecvWR, rounds))
	require.NoError(t, err)
	// A queue runs in order, so two queues posted in turn stay within a
	// message of each other unless one overtakes the other: drain both
	// now and then, and compare how far each has come.
	got := [2]int{}
	overtaken := 0
	wc := make([]ibv.WC, 64)
	drain := func() {
		for i, c := range []ibv.CQ{b1.cq, b2.cq} {
			n, err := c.Poll(wc)
			require.NoError(t, err)
			for _, w := range wc[:n] {
				require.Equal(t, uint32(got[i]), w.Imm, "order within QP %d", i+1)
				got[i]++
			}
		}
		if got[0]-got[1] > 1 || got[1]-got[0] > 1 {
			overtaken++
		}
	}
	for k := range rounds {
		_, err := a1.qp.PostSend([]ibv.SendWR{write(a1, b1, 0, 0, 8, uint32(k), false)})
		require.NoError(t, err)
		_, err = a2.qp.PostSend([]ibv.SendWR{write(a2, b2, 0, 0, 8, uint32(k), false)})
		require.NoError(t, err)
		if k%16 == 15 { // retire the unsignaled ones
			_, err = a1.qp.PostSend([]ibv.SendWR{{Op: ibv.OpWrite, Flags: ibv.SendSignaled}})
			require.NoError(t, err)
			_, err = a2.qp.PostSend([]ibv.SendWR{{Op: ibv.OpWrite, Flags: ibv.SendSignaled}})
			require.NoError(t, err)
			poll(t, a1.cq, 1, time.Second)
			poll(t, a2.cq, 1, time.Second)
		}
		drain()
	}
	for deadline := time.Now().Add(3 * time.Second); got[0] < rounds || got[1] < rounds; drain() {
		require.True(t, time.Now().Before(deadline), "completions missing: %v of %d", got, rounds)
	}
	require.Positive(t, overtaken, "one QP never overtook the other")
}

func TestRNR(t *testing.T) {
	t.Run("retries exhausted", func(t *testing.T) {
		p := New(Options{Dir: t.TempDir()})
		a, b := newEnd(t, p, endOpts{}), newEnd(t, p, endOpts{})
		connect(t, a, b, func(at *ibv.QPAttr) { at.RNRRetry = 2 })
		connect(t, b, a, func(at *ibv.QPAttr) { at.MinRNRTimer = 1 })
		_, err := a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 8, 0, false), write(a, b, 2, 0, 8, 0, true)})
		require.NoError(t, err)
		wc := poll(t, a.cq, 2, time.Second)
		require.Equal(t, ibv.RNRRetryExcErr, wc[0].Status, "even an unsignaled request reports its error")
		require.Equal(t, ibv.WRFlushErr, wc[1].Status)
	})
	t.Run("forever until posted", func(t *testing.T) {
		p := New(Options{Dir: t.TempDir()})
		a, b := newEnd(t, p, endOpts{}), newEnd(t, p, endOpts{})
		connect(t, a, b, nil)
		connect(t, b, a, func(at *ibv.QPAttr) { at.MinRNRTimer = 1 })
		_, err := a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 8, 9, true)})
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		n, err := a.cq.Poll(make([]ibv.WC, 1))
		require.NoError(t, err)
		require.Zero(t, n, "a write with immediate completed with no receive posted")
		_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 3}})
		require.NoError(t, err)
		require.Equal(t, ibv.Status(ibv.Success), poll(t, a.cq, 1, time.Second)[0].Status)
		require.Equal(t, uint32(9), poll(t, b.cq, 1, time.Second)[0].Imm)
	})
}

func TestAccessErrors(t *testing.T) {
	cases := []struct {
		name   string
		bo     endOpts
		mutate func(a, b *end, w *ibv.SendWR)
		want   ibv.Status
	}{
		{"wrong rkey", endOpts{}, func(a, b *end, w *ibv.SendWR) { w.RKey ^= 0x1000 }, ibv.RemAccessErr},
		{"past the region", endOpts{}, func(a, b *end, w *ibv.SendWR) { w.Remote = b.mr.Addr() + uint64(b.mr.Len()) - 4 }, ibv.RemAccessErr},
		{"no remote write", endOpts{access: ibv.AccessLocalWrite}, func(a, b *end, w *ibv.SendWR) {}, ibv.RemAccessErr},
		{"wrong lkey", endOpts{}, func(a, b *end, w *ibv.SendWR) { w.SGE.LKey++ }, ibv.LocProtErr},
		{"source past its region", endOpts{}, func(a, b *end, w *ibv.SendWR) { w.SGE.Addr = a.mr.Addr() + uint64(a.mr.Len()) - 4 }, ibv.LocProtErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, Options{}, endOpts{}, c.bo)
			_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1}, {ID: 2}})
			require.NoError(t, err)
			w := write(a, b, 10, 0, 64, 0, false)
			c.mutate(a, b, &w)
			_, err = a.qp.PostSend([]ibv.SendWR{w, write(a, b, 11, 0, 64, 0, true)})
			require.NoError(t, err)
			wc := poll(t, a.cq, 2, time.Second)
			require.Equal(t, c.want, wc[0].Status)
			require.Equal(t, uint64(10), wc[0].ID)
			require.Equal(t, ibv.WRFlushErr, wc[1].Status, "requests after an error are flushed")
			// The QP is in ERR: a later post completes flushed too.
			_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 12, 0, 8, 0, false)})
			require.NoError(t, err)
			require.Equal(t, ibv.WRFlushErr, poll(t, a.cq, 1, time.Second)[0].Status)
			if c.want == ibv.RemAccessErr {
				// The responder fails too: its receives flush, with an event.
				wc := poll(t, b.cq, 2, time.Second)
				require.Equal(t, ibv.WRFlushErr, wc[0].Status)
				require.Equal(t, ibv.WRFlushErr, wc[1].Status)
				ev, ok, err := b.ctx.(ibv.EventSource).WaitEvent(time.Second)
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, ibv.Event{Type: ibv.EventQPAccessErr, QPNum: b.qp.Num()}, ev)
			}
		})
	}
}

func TestStateMachine(t *testing.T) {
	p := New(Options{Dir: t.TempDir()})
	a, b := newEnd(t, p, endOpts{}), newEnd(t, p, endOpts{})
	_, err := a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 8, 0, true)})
	require.ErrorIs(t, err, unix.EINVAL, "post in RESET")
	err = a.qp.Modify(&ibv.QPAttr{State: ibv.QPRTR}, ibv.MaskInitToRTR)
	require.ErrorContains(t, err, "RESET→RTR")
	err = a.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 1}, ibv.AttrState|ibv.AttrPort|ibv.AttrPKeyIndex)
	require.ErrorContains(t, err, "missing attributes ACCESS_FLAGS")
	err = a.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 2}, ibv.MaskResetToInit)
	require.ErrorContains(t, err, "port 2")
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 1}, ibv.MaskResetToInit))
	gid, _, _ := b.ctx.QueryGID(1, 2)
	rtr := ibv.QPAttr{State: ibv.QPRTR, PathMTU: ibv.MTU4096, DestQPN: b.qp.Num(), AH: ibv.AH{IsGlobal: true, DGID: gid, SGIDIdx: 2}}
	err = a.qp.Modify(&rtr, ibv.MaskInitToRTR&^ibv.AttrDestQPN)
	require.ErrorContains(t, err, "missing attributes DEST_QPN")
	err = a.qp.Modify(&rtr, ibv.MaskInitToRTR|ibv.AttrTimeout)
	require.ErrorContains(t, err, "TIMEOUT are not allowed")
	rtr.AH.IsGlobal = false
	require.ErrorContains(t, a.qp.Modify(&rtr, ibv.MaskInitToRTR), "GRH")
	rtr.AH.IsGlobal, rtr.AH.SGIDIdx = true, 5
	require.ErrorContains(t, a.qp.Modify(&rtr, ibv.MaskInitToRTR), "empty entry")
	rtr.AH.SGIDIdx = 2
	require.NoError(t, a.qp.Modify(&rtr, ibv.MaskInitToRTR))
	_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 8, 0, true)})
	require.ErrorIs(t, err, unix.EINVAL, "post in RTR")
	_, err = a.qp.PostRecv([]ibv.RecvWR{{ID: 1}})
	require.NoError(t, err, "receives may be posted from INIT on")
	err = a.qp.Modify(&ibv.QPAttr{State: ibv.QPRTS}, ibv.MaskRTRToRTS&^ibv.AttrSQPSN)
	require.ErrorContains(t, err, "missing attributes SQ_PSN")
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPRTS, Timeout: 20, RetryCnt: 7, RNRRetry: 7}, ibv.MaskRTRToRTS))
}

func TestUnsignaledRequestsHoldTheSendQueue(t *testing.T) {
	a, b := pair(t, Options{}, endOpts{sendWR: 4}, endOpts{recvWR: 64})
	_, err := b.qp.PostRecv(make([]ibv.RecvWR, 64))
	require.NoError(t, err)
	var wrs []ibv.SendWR
	for i := range 4 {
		wrs = append(wrs, write(a, b, uint64(i), 0, 8, 0, false))
	}
	_, err = a.qp.PostSend(wrs)
	require.NoError(t, err)
	poll(t, b.cq, 4, time.Second) // all executed...
	bad, err := a.qp.PostSend([]ibv.SendWR{write(a, b, 9, 0, 8, 0, true)})
	require.ErrorIs(t, err, unix.ENOMEM, "...but unsignaled, so still holding the send queue")
	require.Zero(t, bad)
	// A protocol that signals every few requests keeps going.
	_, err = a.qp.PostSend(wrs[:3])
	require.Error(t, err)
	_ = a.qp.Modify(&ibv.QPAttr{State: ibv.QPErr}, ibv.AttrState)
	a2, b2 := pair(t, Options{}, endOpts{sendWR: 4}, endOpts{recvWR: 64})
	_, err = b2.qp.PostRecv(make([]ibv.RecvWR, 64))
	require.NoError(t, err)
	for i := range 40 {
		_, err := a2.qp.PostSend([]ibv.SendWR{write(a2, b2, uint64(i), 0, 8, 0, i%2 == 1)})
		require.NoError(t, err, "request %d", i)
		if i%2 == 1 {
			poll(t, a2.cq, 1, time.Second)
		}
	}
}

func TestCQOverrun(t *testing.T) {
	a, b := pair(t, Options{}, endOpts{}, endOpts{cqe: 4})
	_, err := b.qp.PostRecv(make([]ibv.RecvWR, 8))
	require.NoError(t, err)
	var wrs []ibv.SendWR
	for i := range 6 {
		wrs = append(wrs, write(a, b, uint64(i), 0, 8, uint32(i), i == 5))
	}
	_, err = a.qp.PostSend(wrs)
	require.NoError(t, err)
	poll(t, a.cq, 1, time.Second)
	_, err = b.cq.Poll(make([]ibv.WC, 16))
	require.ErrorContains(t, err, "overrun")
	ev, ok, err := b.ctx.(ibv.EventSource).WaitEvent(time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, ibv.EventCQErr, ev.Type)
}

func TestUnreachablePeersRetryThenFail(t *testing.T) {
	cases := []struct {
		name string
		mod  func(at *ibv.QPAttr)
	}{
		{"wrong GID", func(at *ibv.QPAttr) { at.AH.DGID[15] ^= 0x55 }},
		{"wrong QPN", func(at *ibv.QPAttr) { at.DestQPN++ }},
		{"PSN mismatch", func(at *ibv.QPAttr) { at.SQPSN++ }},
		{"path MTU above the peer's", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := New(Options{Dir: t.TempDir(), TimeScale: 0.001})
			a, b := newEnd(t, p, endOpts{}), newEnd(t, p, endOpts{})
			connect(t, a, b, c.mod)
			connect(t, b, a, func(at *ibv.QPAttr) {
				if c.mod == nil {
					at.PathMTU = ibv.MTU1024
				}
			})
			_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1}})
			require.NoError(t, err)
			start := time.Now()
			_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 2048, 0, true)})
			require.NoError(t, err)
			wc := poll(t, a.cq, 1, 2*time.Second)
			require.Equal(t, ibv.RetryExcErr, wc[0].Status)
			// 4.096 µs × 2^20 × 8 tries × 0.001 ≈ 34 ms.
			require.Greater(t, time.Since(start), 25*time.Millisecond, "failed before the transport timeout")
		})
	}
}

func TestRegisteringGoMemoryFails(t *testing.T) {
	p := New(Options{Dir: t.TempDir()})
	c, err := p.Open(DeviceName)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.RegMR(make([]byte, 4096), ibv.AccessRemoteWriteAll)
	require.ErrorIs(t, err, unix.EFAULT)
	m, err := ibv.Alloc(4096)
	require.NoError(t, err)
	defer m.Free()
	_, err = c.RegMR(m.B, ibv.AccessRemoteWrite)
	require.ErrorContains(t, err, "without local write")
	mr, err := c.RegMR(m.B, ibv.AccessRemoteWriteAll)
	require.NoError(t, err)
	require.NoError(t, mr.Dereg())
	require.Error(t, mr.Dereg())
}

func TestDeregisteredRegionRefusesWrites(t *testing.T) {
	a, b := pair(t, Options{}, endOpts{}, endOpts{})
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1}, {ID: 2}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 64, 0, true)})
	require.NoError(t, err)
	require.Equal(t, ibv.Status(ibv.Success), poll(t, a.cq, 1, time.Second)[0].Status)
	rkey := b.mr.RKey()
	require.NoError(t, b.mr.Dereg())
	w := write(a, b, 2, 0, 64, 0, true)
	w.RKey = rkey
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	require.Equal(t, ibv.RemAccessErr, poll(t, a.cq, 1, time.Second)[0].Status)
}

// InfiniBand ports are addressed by LID without a GRH; a LID that is not
// unicast is refused at RTR, and writes reach the peer by its LID.
func TestInfiniBandByLID(t *testing.T) {
	p := New(Options{Dir: t.TempDir(), InfiniBand: true})
	a, b := newEnd(t, p, endOpts{}), newEnd(t, p, endOpts{})
	pa, err := b.ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ibv.LinkInfiniBand, pa.LinkLayer)
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 1, Access: ibv.AccessRemoteWriteAll}, ibv.MaskResetToInit))
	rtr := ibv.QPAttr{State: ibv.QPRTR, PathMTU: ibv.MTU4096, DestQPN: b.qp.Num(), RQPSN: 7, MinRNRTimer: 12, MaxDestRdAtomic: 1,
		AH: ibv.AH{DLID: 0xc001, Port: 1}}
	require.ErrorContains(t, a.qp.Modify(&rtr, ibv.MaskInitToRTR), "not a unicast LID")
	rtr.AH.DLID = pa.LID
	require.NoError(t, a.qp.Modify(&rtr, ibv.MaskInitToRTR))
	rtr.State, rtr.SQPSN, rtr.Timeout, rtr.RetryCnt, rtr.RNRRetry, rtr.MaxRdAtomic = ibv.QPRTS, 7, 20, 7, 7, 1
	require.NoError(t, a.qp.Modify(&rtr, ibv.MaskRTRToRTS))
	pb, _ := a.ctx.QueryPort(1)
	require.NoError(t, b.qp.Modify(&ibv.QPAttr{State: ibv.QPInit, Port: 1, Access: ibv.AccessRemoteWriteAll}, ibv.MaskResetToInit))
	back := ibv.QPAttr{State: ibv.QPRTR, PathMTU: ibv.MTU4096, DestQPN: a.qp.Num(), RQPSN: 7, MinRNRTimer: 12, MaxDestRdAtomic: 1,
		AH: ibv.AH{DLID: pb.LID, Port: 1}}
	require.NoError(t, b.qp.Modify(&back, ibv.MaskInitToRTR))
	_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 5}})
	require.NoError(t, err)
	copy(a.mem.B, "over the LID")
	_, err = a.qp.PostSend([]ibv.SendWR{write(a, b, 1, 0, 12, 77, true)})
	require.NoError(t, err)
	require.Equal(t, ibv.Status(ibv.Success), poll(t, a.cq, 1, time.Second)[0].Status)
	require.Equal(t, uint32(77), poll(t, b.cq, 1, time.Second)[0].Imm)
	require.Equal(t, "over the LID", string(b.mem.B[:12]))
}

// The NICs of a fabric have distinct LIDs, as a subnet manager assigns
// them: 15 random bits for 300 NICs collide with probability 0.75, and
// two NICs with one LID would take each other's packets (a CI run saw a
// queue pair reach its own NIC and fail with RETRY_EXC_ERR). A socket
// that no process serves any more does not hold its id.
func TestLIDsAreUnique(t *testing.T) {
	dir := t.TempDir()
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "000001.sock"), Net: "unix"})
	require.NoError(t, err)
	stale.SetUnlinkOnClose(false)
	stale.Close() // as a process that died leaves it
	p := New(Options{Dir: dir, InfiniBand: true})
	// First, so that no random draw below has taken id 1 over already.
	one := func() uint32 { return 1 }
	id, ln, err := p.claimID(one)
	require.NoError(t, err, "the stale socket's id is free")
	t.Cleanup(func() { ln.Close() })
	require.Equal(t, uint32(1), id)
	_, _, err = p.claimID(one)
	require.ErrorContains(t, err, "no free NIC id", "a live NIC's id is not")
	seen := map[uint16]bool{1: true}
	for range 300 {
		c, err := p.Open(DeviceName)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		a, err := c.QueryPort(1)
		require.NoError(t, err)
		require.False(t, seen[a.LID], "LID %#x given twice", a.LID)
		require.NotZero(t, a.LID)
		require.Less(t, a.LID, uint16(0xc000), "a unicast LID")
		seen[a.LID] = true
	}
}
