//go:build verbs && cgo && linux

package ibv

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The marshalling tests run the wrappers over fakeops.c, a fake ops
// table: no RDMA device is needed, and none is claimed.

const fakeQPN = 0x1a2b

// chain5 is the chain of TestPostSendChain: the shapes goccl posts.
func chain5() []SendWR {
	return []SendWR{
		{ID: 101, Op: OpWrite, SGE: SGE{Addr: 0x7f0000001000, Len: 4096, LKey: 0x11}, Remote: 0x7f1000000000, RKey: 0x22},
		{ID: 102, Op: OpWriteImm, Flags: SendSignaled, SGE: SGE{Addr: 0x7f0000002000, Len: 100, LKey: 0x11},
			Imm: 0x01020304, Remote: 0x7f1000001000, RKey: 0x22},
		{ID: 103, Op: OpSend, Flags: SendSignaled | SendSolicited, SGE: SGE{Addr: 0x7f0000003000, Len: 64, LKey: 0x33}},
		{ID: 104, Op: OpWriteImm, Flags: SendSignaled | SendFence, Imm: 0xa0b0c0d0, Remote: 0x7f1000002000, RKey: 0x44},
		{ID: 105, Op: OpSendImm, SGE: SGE{Addr: 0x7f0000004000, Len: 8, LKey: 0x55}, Imm: 7},
	}
}

func TestPostSendChain(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	wrs := chain5()
	n, err := d.qp.PostSend(wrs)
	require.NoError(t, err)
	require.Equal(t, len(wrs), n)
	require.Empty(t, d.violation())
	_, _, sendCalls, _, _ := d.counts()
	require.Equal(t, 1, sendCalls, "the whole chain in one post_send")

	want := []fakeWR{
		{ID: 101, Op: OpWrite, NumSGE: 1, SGE: wrs[0].SGE, Remote: wrs[0].Remote, RKey: 0x22},
		{ID: 102, Op: OpWriteImm, Flags: SendSignaled, NumSGE: 1, SGE: wrs[1].SGE, Wire: [4]byte{1, 2, 3, 4},
			Remote: wrs[1].Remote, RKey: 0x22},
		{ID: 103, Op: OpSend, Flags: SendSignaled | SendSolicited, NumSGE: 1, SGE: wrs[2].SGE},
		{ID: 104, Op: OpWriteImm, Flags: SendSignaled | SendFence, NumSGE: 0, SGListNil: true,
			Wire: [4]byte{0xa0, 0xb0, 0xc0, 0xd0}, Remote: wrs[3].Remote, RKey: 0x44},
		{ID: 105, Op: OpSendImm, NumSGE: 1, SGE: wrs[4].SGE, Wire: [4]byte{0, 0, 0, 7}},
	}
	for i := range want {
		want[i].Call, want[i].Pos, want[i].Posted = 1, i, true
	}
	require.Equal(t, want, d.sends())
}

func TestPostSendLongChain(t *testing.T) {
	// Longer than the C side's stack array: built in malloc'd memory.
	d := newFakeDevice(fakeQPN)
	defer d.free()
	wrs := make([]SendWR, 100)
	for i := range wrs {
		wrs[i] = SendWR{ID: uint64(1000 + i), Op: OpWrite, SGE: SGE{Addr: uint64(0x1000 * (i + 1)), Len: uint32(i + 1), LKey: 9},
			Remote: uint64(0x10000 + i), RKey: 8}
	}
	wrs[99].Op, wrs[99].Flags, wrs[99].Imm = OpWriteImm, SendSignaled, uint32(99)
	n, err := d.qp.PostSend(wrs)
	require.NoError(t, err)
	require.Equal(t, 100, n)
	require.Empty(t, d.violation())
	got := d.sends()
	require.Len(t, got, 100)
	for i, r := range got {
		require.Equal(t, 1, r.Call)
		require.Equal(t, i, r.Pos)
		require.Equal(t, wrs[i].ID, r.ID)
		require.Equal(t, wrs[i].SGE, r.SGE)
		require.Equal(t, wrs[i].Remote, r.Remote)
	}
	require.Equal(t, [4]byte{0, 0, 0, 99}, got[99].Wire)
}

func TestPostSendRejected(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	d.rejectSend(2, syscall.ENOMEM)
	wrs := chain5()
	bad, err := d.qp.PostSend(wrs)
	require.Error(t, err)
	require.Equal(t, 2, bad)
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.Contains(t, err.Error(), "ibv_post_send")
	require.Contains(t, err.Error(), "request 2 of 5 (SEND, id 0x67)")
	got := d.sends()
	require.Len(t, got, 5)
	for i, r := range got {
		require.Equal(t, i < 2, r.Posted, "request %d", i)
	}

	// The provider's own refusal of a request (an opcode it lacks) also
	// names the request.
	d2 := newFakeDevice(fakeQPN)
	defer d2.free()
	wrs[1].Op = Opcode(9) // IBV_WR_SEND_WITH_INV
	bad, err = d2.qp.PostSend(wrs)
	require.Equal(t, 1, bad)
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Contains(t, err.Error(), "opcode 9")
}

func TestPostRecv(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	wrs := []RecvWR{{ID: 1}, {ID: 2, SGE: SGE{Addr: 0x5000, Len: 256, LKey: 0x77}}, {ID: 3}}
	n, err := d.qp.PostRecv(wrs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Empty(t, d.violation())
	require.Equal(t, []fakeWR{
		{ID: 1, SGListNil: true, Call: 1, Pos: 0, Posted: true},
		{ID: 2, NumSGE: 1, SGE: wrs[1].SGE, Call: 1, Pos: 1, Posted: true},
		{ID: 3, SGListNil: true, Call: 1, Pos: 2, Posted: true},
	}, d.recvs())

	d.rejectRecv(1, syscall.ENOMEM)
	bad, err := d.qp.PostRecv(wrs)
	require.Equal(t, 1, bad)
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.Contains(t, err.Error(), "ibv_post_recv")
	require.Contains(t, err.Error(), "request 1 of 3")
	got := d.recvs()[3:]
	require.Len(t, got, 3)
	require.Equal(t, []bool{true, false, false}, []bool{got[0].Posted, got[1].Posted, got[2].Posted})
	_, _, _, recvCalls, _ := d.counts()
	require.Equal(t, 2, recvCalls)
}

func TestPoll(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	d.script(
		fakeWC{ID: 10, Status: Success, Opcode: WCWrite, ByteLen: 4096, QPNum: fakeQPN},
		// The wire's bytes 01 02 03 04 are 0x01020304 in host order.
		fakeWC{ID: 11, Status: Success, Opcode: WCRecvWriteImm, ByteLen: 4096, Wire: [4]byte{1, 2, 3, 4},
			Flags: wcWithImm, QPNum: fakeQPN},
		fakeWC{ID: 12, Status: RetryExcErr, Opcode: WCOpcode(0x55), QPNum: fakeQPN, Vendor: 0x81},
		fakeWC{ID: 13, Status: WRFlushErr, QPNum: fakeQPN, Vendor: 0xf5},
	)
	wc := make([]WC, 8)
	n, err := d.cq.Poll(wc)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, []WC{
		{ID: 10, Status: Success, Opcode: WCWrite, ByteLen: 4096, QPNum: fakeQPN},
		{ID: 11, Status: Success, Opcode: WCRecvWriteImm, ByteLen: 4096, Imm: 0x01020304, HasImm: true, QPNum: fakeQPN},
		{ID: 12, Status: RetryExcErr, Opcode: WCOpcode(0x55), QPNum: fakeQPN, Vendor: 0x81},
		{ID: 13, Status: WRFlushErr, QPNum: fakeQPN, Vendor: 0xf5},
	}, wc[:n])
	n, err = d.cq.Poll(wc)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = d.cq.Poll(nil)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Empty(t, d.violation())
}

func TestPollBatches(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	for i := range 70 {
		d.script(fakeWC{ID: uint64(i), Status: Success, Opcode: WCRecvWriteImm, Wire: [4]byte{0, 0, 1, byte(i)},
			Flags: wcWithImm, QPNum: fakeQPN})
	}
	wc := make([]WC, 100)
	n, err := d.cq.Poll(wc[:3])
	require.NoError(t, err)
	require.Equal(t, 3, n)
	m, err := d.cq.Poll(wc[3:])
	require.NoError(t, err)
	require.Equal(t, 67, m)
	for i, w := range wc[:70] {
		require.Equal(t, uint64(i), w.ID)
		require.Equal(t, uint32(0x100+i), w.Imm)
	}
	_, _, _, _, polls := d.counts()
	// 3; then 32, 32, 3 (short: the queue is empty): one cgo call each.
	require.Equal(t, 4, polls)
	require.LessOrEqual(t, d.maxPollEntries(), 32)
}

func TestPollFails(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	d.script(fakeWC{ID: 1, Status: Success, Opcode: WCSend, QPNum: fakeQPN},
		fakeWC{ID: 2, Status: Success, Opcode: WCSend, QPNum: fakeQPN})
	d.failPoll(-1)
	wc := make([]WC, 8)
	n, err := d.cq.Poll(wc)
	require.NoError(t, err, "completions polled before the failure are handed over")
	require.Equal(t, 2, n)
	_, err = d.cq.Poll(wc)
	require.ErrorContains(t, err, "ibv_poll_cq: the CQ failed")

	d.failPoll(-int(syscall.EIO))
	_, err = d.cq.Poll(wc)
	require.ErrorIs(t, err, syscall.EIO)
}

func TestDestroyed(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	require.NoError(t, d.qp.Destroy())
	require.NoError(t, d.qp.Destroy(), "Destroy is idempotent")
	_, err := d.qp.PostSend(chain5())
	require.ErrorContains(t, err, "destroyed")
	_, err = d.qp.PostRecv([]RecvWR{{ID: 1}})
	require.ErrorContains(t, err, "destroyed")
	require.ErrorContains(t, d.qp.Modify(&QPAttr{State: QPErr}, AttrState), "ibv_modify_qp to ERR on QP 0x1a2b: the QP is destroyed")
	require.NoError(t, d.cq.Destroy())
	require.NoError(t, d.cq.Destroy())
	_, err = d.cq.Poll(make([]WC, 1))
	require.ErrorContains(t, err, "destroyed")
	_, _, sendCalls, recvCalls, polls := d.counts()
	require.Zero(t, sendCalls+recvCalls+polls, "nothing reached the device")
}

func TestConcurrentUse(t *testing.T) {
	// Posts, receives and polls from many goroutines on one QP and CQ,
	// then a Destroy racing them: run with -race.
	d := newFakeDevice(fakeQPN)
	defer d.free()
	for i := range 100 {
		d.script(fakeWC{ID: uint64(i), Status: Success, Opcode: WCWrite, QPNum: fakeQPN})
	}
	const goroutines, rounds = 8, 50
	var wg sync.WaitGroup
	var polled sync.Map
	for g := range goroutines {
		wg.Go(func() {
			wc := make([]WC, 4)
			for r := range rounds {
				id := uint64(g*rounds + r)
				_, err := d.qp.PostSend([]SendWR{{ID: id, Op: OpWrite, Remote: 1, RKey: 2}, {ID: id, Op: OpWriteImm, Flags: SendSignaled, Imm: uint32(id)}})
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := d.qp.PostRecv([]RecvWR{{ID: id}}); err != nil {
					t.Error(err)
					return
				}
				n, err := d.cq.Poll(wc)
				if err != nil {
					t.Error(err)
					return
				}
				for _, w := range wc[:n] {
					if _, dup := polled.LoadOrStore(w.ID, true); dup {
						t.Errorf("completion %d polled twice", w.ID)
					}
				}
			}
		})
	}
	wg.Wait()
	sends, recvs, sendCalls, recvCalls, _ := d.counts()
	require.Equal(t, 2*goroutines*rounds, sends)
	require.Equal(t, goroutines*rounds, recvs)
	require.Equal(t, goroutines*rounds, sendCalls)
	require.Equal(t, goroutines*rounds, recvCalls)
	require.Empty(t, d.violation())
	for _, r := range d.sends() {
		require.Equal(t, r.Pos == 1, r.Op == OpWriteImm, "chains are not interleaved")
	}

	// Destroy while others post: each post either lands or reports the
	// QP destroyed.
	start := make(chan struct{})
	for range goroutines {
		wg.Go(func() {
			<-start
			for range rounds {
				if _, err := d.qp.PostSend([]SendWR{{ID: 1, Op: OpWrite}}); err != nil && !strings.Contains(err.Error(), "destroyed") {
					t.Error(err)
				}
			}
		})
	}
	close(start)
	require.NoError(t, d.qp.Destroy())
	wg.Wait()
	_, err := d.qp.PostSend([]SendWR{{ID: 1, Op: OpWrite}})
	require.ErrorContains(t, err, "destroyed")
}

func TestModifyAttr(t *testing.T) {
	gid := GID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3}
	for _, a := range []QPAttr{
		{State: QPInit, PKeyIndex: 3, Port: 1, Access: AccessRemoteWriteAll},
		{State: QPRTR, PathMTU: MTU4096, DestQPN: 0xabcdef, RQPSN: 0x123456, MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AH: AH{DLID: 0x1234, SL: 3, IsGlobal: true, DGID: gid, SGIDIdx: 3, HopLimit: 255, TClass: 106, Port: 1}},
		{State: QPRTS, SQPSN: 0x654321, Timeout: 20, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
	} {
		t.Run(fmt.Sprintf("to=%v", a.State), func(t *testing.T) {
			got, rest := modifyAttr(&a)
			require.Equal(t, a, got)
			require.True(t, rest, "the fields QPAttr does not name are zero")
		})
	}
}

func TestQueryPortExtended(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	want := PortAttr{State: PortActive, MaxMTU: MTU4096, ActiveMTU: MTU1024, LID: 0x42, LinkLayer: LinkEthernet,
		GIDTblLen: 256, ActiveWidth: 2, ActiveSpeed: 64}
	d.setPort(want)
	c := d.context()
	got, err := c.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, want, got)
	calls, n := d.queryPortSeen()
	require.Equal(t, 1, calls, "through the extended context's query_port")
	require.Greater(t, n, 0)
	require.Empty(t, d.violation())

	_, err = c.QueryPort(2)
	require.ErrorContains(t, err, "fake0 has ports 1 to 1, not 2")
}

// TestOpenLibrary runs wherever the tests run: with libibverbs and no
// devices (the usual CI machine) it reports that clearly; with devices
// it opens one and makes the objects goccl uses.
func TestOpenLibrary(t *testing.T) {
	p, err := OpenLibrary()
	if err != nil {
		require.ErrorIs(t, err, ErrNoDevice)
		require.Contains(t, err.Error(), "libibverbs.so.1")
		t.Skipf("no libibverbs: %v", err)
	}
	p2, err := OpenLibrary()
	require.NoError(t, err, "loaded once, usable again")
	require.Equal(t, p, p2)

	devs, err := p.Devices()
	if err != nil {
		require.ErrorIs(t, err, ErrNoDevice)
		require.Contains(t, err.Error(), "ibv_get_device_list: no RDMA devices")
		var errno syscall.Errno
		require.ErrorAs(t, err, &errno)
		if errno == syscall.ENOSYS {
			require.Contains(t, err.Error(), "ENOSYS")
		}
		_, oerr := p.Open("mlx5_0")
		require.ErrorIs(t, oerr, ErrNoDevice)
		t.Logf("as expected without RDMA devices: %v", err)
		return
	}
	t.Logf("devices: %+v", devs)
	if len(devs) == 0 {
		_, err := p.Open("mlx5_0")
		require.ErrorIs(t, err, ErrNoDevice)
		return
	}
	smokeTest(t, p, devs[0])
}

// smokeTest opens a real device and makes, moves and destroys what the
// transport uses; it posts nothing.
func smokeTest(t *testing.T, p Provider, info DeviceInfo) {
	ctx, err := p.Open(info.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	require.Equal(t, info.Name, ctx.Info().Name)
	require.Positive(t, ctx.Info().Ports)
	pa, err := ctx.QueryPort(1)
	require.NoError(t, err)
	t.Logf("%s port 1: %+v (%v, %v, %.0f Gbit/s)", info.Name, pa, pa.State, pa.LinkLayer, pa.Rate())
	for i := range min(pa.GIDTblLen, 4) {
		g, typ, err := ctx.QueryGID(1, i)
		require.NoError(t, err)
		t.Logf("GID %d: %v type %d", i, g, typ)
	}
	mem, err := Alloc(1 << 20)
	require.NoError(t, err)
	defer mem.Free()
	mr, err := ctx.RegMR(mem.B, AccessRemoteWriteAll)
	require.NoError(t, err)
	require.Equal(t, Addr(mem.B), mr.Addr())
	require.Equal(t, 1<<20, mr.Len())
	require.Error(t, ctx.Close(), "Close refuses while a region is registered")
	cq, err := ctx.CreateCQ(64)
	require.NoError(t, err)
	qp, err := ctx.CreateQP(cq, QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	require.NoError(t, qp.Modify(&QPAttr{State: QPInit, Port: 1, Access: AccessRemoteWriteAll}, MaskResetToInit))
	err = qp.Modify(&QPAttr{State: QPRTS}, AttrState)
	require.ErrorContains(t, err, "ibv_modify_qp to RTS")
	if es, ok := ctx.(EventSource); ok {
		_, _, err := es.WaitEvent(0)
		require.NoError(t, err)
	}
	require.NoError(t, qp.Destroy())
	require.NoError(t, qp.Destroy())
	require.NoError(t, cq.Destroy())
	require.NoError(t, mr.Dereg())
	require.NoError(t, mr.Dereg())
}

func TestLoadErrors(t *testing.T) {
	err := checkLoad("libibverbs-goccl-absent.so.1")
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorContains(t, err, "libibverbs-goccl-absent.so.1 not found (install rdma-core's libibverbs1)")

	// A library that loads but is not libibverbs names what it lacks.
	err = checkLoad("libc.so.6")
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorContains(t, err, "libc.so.6 has no ibv_get_device_list@IBVERBS_1.1")
}

// The flush read (gdr.go) crosses as an RDMA read: its remote address and
// key in the rdma union, its SGE the local destination, no immediate.
func TestPostSendRead(t *testing.T) {
	d := newFakeDevice(fakeQPN)
	defer d.free()
	wrs := []SendWR{{ID: 7, Op: OpRead, Flags: SendSignaled, SGE: SGE{Addr: 0x7f0000005000, Len: 1, LKey: 0x66},
		Remote: 0x7f2000000000, RKey: 0x77}}
	_, err := d.qp.PostSend(wrs)
	require.NoError(t, err)
	require.Empty(t, d.violation())
	want := []fakeWR{{ID: 7, Op: OpRead, Flags: SendSignaled, NumSGE: 1, SGE: wrs[0].SGE, Remote: 0x7f2000000000, RKey: 0x77,
		Call: 1, Pos: 0, Posted: true}}
	require.Equal(t, want, d.sends())
}

// A failed registration of GPU memory says whether the way tried is
// unsupported here (so the transport tries the next, or stages), or
// failed for another reason.
func TestDeviceMRErrors(t *testing.T) {
	for _, c := range []struct {
		dmabuf      bool
		errno       syscall.Errno
		unsupported bool
	}{
		{true, syscall.EOPNOTSUPP, true},
		{true, syscall.EPROTONOSUPPORT, true},
		{true, syscall.EFAULT, false},
		{true, syscall.ENOMEM, false},
		{false, syscall.EFAULT, true}, // no peer-memory client knows the address
		{false, syscall.EINVAL, true},
		{false, syscall.ENOMEM, false},
	} {
		err := deviceMRErr("ibv_reg_dmabuf_mr", c.dmabuf, c.errno)
		require.ErrorIs(t, err, c.errno)
		require.Equal(t, c.unsupported, errors.Is(err, ErrNotSupported), "dma-buf %v, %v", c.dmabuf, c.errno)
	}
}
