package verbs

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Device operations (GPUDirect RDMA and its fallback).
//
// A connection of a device operation (a channel from
// transport.DeviceChannels on) gives the engine slots that the GPU's
// kernels reach, in one of two ways, chosen once per endpoint (New):
//
//   - directly (GPUDirect RDMA): the payload slots and the staging are
//     device memory, registered with the NIC, so that the NIC reads what
//     a kernel reduced into the staging and writes it straight into the
//     peer's GPU. The memory is registered through a dma-buf
//     (cuMemGetHandleForAddressRange, then ibv_reg_dmabuf_mr) where the
//     driver, kernel and library support it, else by address where
//     nvidia-peermem is loaded (ibv_reg_mr on the device pointer), in the
//     order NCCL's net_ib tries them. Headers and the clear-to-send FIFO
//     stay in host memory: the CPU writes and reads them;
//   - staged: the whole host allocation is registered with the GPU
//     (cuMemHostRegister, memory.Mapped), so kernels reduce into the
//     staging and read the slots in host memory, and the NIC moves them
//     as for host operations. This is what a pair gets when GPUDirect is
//     not allowed (Options.GDR: the topology, GOCCL_NET_GDR_LEVEL) or not
//     possible (the probe says why).
//
// Either way nothing is inlined in a header: the GPU of a peer whose
// slots are in device memory could not reach it.
//
// The flush: below compute capability 9.0 a GPU may see the NIC's PCIe
// writes into its memory out of order with the completion the CPU
// polled, so before the engine reads a slot that arrived in device
// memory, a 1-byte RDMA read of it through a queue pair connected to
// itself makes the writes visible (NCCL's ncclIbIflush, needed where
// ncclTopoNeedFlush says so: cudaCompCap < 90).

// gdrMode is how an endpoint's device operations move.
type gdrMode uint8

const (
	gdrNone    gdrMode = iota // no device operations
	gdrStaged                 // through host memory registered with the GPU
	gdrDMABuf                 // GPUDirect RDMA, registered through dma-buf
	gdrPeerMem                // GPUDirect RDMA, registered by address (nvidia-peermem)
)

func (m gdrMode) direct() bool { return m == gdrDMABuf || m == gdrPeerMem }

func (m gdrMode) String() string {
	switch m {
	case gdrStaged:
		return "staged through registered host memory"
	case gdrDMABuf:
		return "GPUDirect RDMA (dma-buf)"
	case gdrPeerMem:
		return "GPUDirect RDMA (nvidia-peermem)"
	}
	return "none"
}

// peerMemFiles say that nvidia-peermem (or the older nv_peer_mem) is
// loaded, as NCCL's net_ib checks.
var peerMemFiles = []string{"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/module/nvidia_peermem/version"}

func peerMemLoaded() bool {
	for _, f := range peerMemFiles {
		if _, err := os.Stat(f); err == nil {
			return true
		}
	}
	return false
}

// slotMem is where a connection's payloads are (see conn.slots).
type slotMem struct {
	recv, send         memory.Buffer
	recvAddr, sendAddr uint64
	recvKey, sendKey   uint32
	// Direct connections: the device allocation holding both, and its
	// regions.
	dev      memory.Buffer
	rmr, smr ibv.MR
}

// chooseDevicePath decides how the endpoint's device operations move.
func (e *Endpoint) chooseDevicePath() {
	d := e.o.Device
	if d == nil {
		e.gdr, e.gdrWhy = gdrNone, "no GPU given to the transport"
		return
	}
	_, canStage := d.(device.Registrar)
	why := "GPUDirect RDMA not allowed for this GPU and NIC (the topology, or GOCCL_NET_GDR_LEVEL)"
	if e.o.GDR {
		var mode gdrMode
		if mode, why = e.probeGDR(d); mode != gdrNone {
			e.gdr, e.gdrWhy = mode, why
			e.flush = d.Info().Major < 9 && !e.o.NoFlush
			return
		}
	}
	if canStage {
		e.gdr, e.gdrWhy = gdrStaged, why
		return
	}
	e.gdr, e.gdrWhy = gdrNone, why+"; and the device cannot map host memory for staging"
}

// probeGDR registers a page of device memory with the NIC each way there
// is, and returns the first that works, or none and why.
func (e *Endpoint) probeGDR(d device.Device) (gdrMode, string) {
	b, err := d.Alloc(pageSize)
	if err != nil {
		return gdrNone, fmt.Sprintf("GPUDirect RDMA: allocating device memory: %v", err)
	}
	defer d.Free(b)
	var whyNot []string
	for _, m := range []gdrMode{gdrDMABuf, gdrPeerMem} {
		if m == gdrPeerMem && !peerMemLoaded() {
			whyNot = append(whyNot, "nvidia-peermem is not loaded (no "+strings.Join(peerMemFiles, " or ")+")")
			continue
		}
		mr, err := e.regDevice(m, b, ibv.AccessRemoteReadWriteAll)
		if err == nil {
			mr.Dereg()
			return m, m.String()
		}
		whyNot = append(whyNot, err.Error())
	}
	return gdrNone, "no GPUDirect RDMA: " + strings.Join(whyNot, "; ")
}

// regDevice registers device memory b, whole pages, with the NIC.
func (e *Endpoint) regDevice(m gdrMode, b memory.Buffer, access ibv.Access) (ibv.MR, error) {
	_, ptr := b.Device()
	dm := ibv.DeviceMem{FD: -1, Len: b.Len(), IOVA: uint64(ptr)}
	if m == gdrDMABuf {
		x, ok := e.o.Device.(device.DMABufExporter)
		if !ok {
			return nil, fmt.Errorf("dma-buf: the device does not export its memory: %w", ibv.ErrNotSupported)
		}
		fd, off, err := x.DMABuf(b)
		if err != nil {
			return nil, fmt.Errorf("dma-buf: %w", err)
		}
		defer unix.Close(fd) // the region holds what it needs
		dm.FD, dm.Offset = fd, off
	}
	mr, err := e.port.Ctx.RegDeviceMR(dm, access)
	if err != nil {
		if m == gdrDMABuf {
			return nil, fmt.Errorf("dma-buf: %w", err)
		}
		return nil, fmt.Errorf("nvidia-peermem: %w", err)
	}
	return mr, nil
}

// deviceMemory gives a device connection its slots: device memory
// registered with the NIC (direct), or its host memory registered with
// the GPU (staged).
func (c *conn) deviceMemory(direct bool) error {
	e := c.e
	// Nothing is inlined on a device connection: a GPU cannot reach the
	// header of a peer whose slots are in device memory, and the two ends
	// may have chosen differently.
	c.inline = 0
	if !direct {
		r := e.o.Device.(device.Registrar) // chooseDevicePath checked
		m, err := r.Register(c.mem.B[:c.l.total])
		if err != nil {
			return fmt.Errorf("verbs: registering %d bytes of slots with the GPU: %w", c.l.total, err)
		}
		c.mapped = m
		c.slots.recv = m.Slice(c.l.pay, c.l.remote)
		c.slots.send = m.Slice(c.l.l0, c.l.l1)
		return nil
	}
	part := pageUp(c.l.slots * c.l.slotSize)
	dev, err := e.o.Device.Alloc(2 * part)
	if err != nil {
		return fmt.Errorf("verbs: allocating %d bytes of device memory for slots: %w", 2*part, err)
	}
	c.slots.dev = dev
	access := ibv.AccessRemoteWriteAll
	if e.flush {
		access = ibv.AccessRemoteReadWriteAll // the flush reads it
	}
	if c.slots.rmr, err = e.regDevice(e.gdr, dev.Slice(0, part), access); err != nil {
		return fmt.Errorf("verbs: registering device memory for the peer's writes: %w", err)
	}
	if c.slots.smr, err = e.regDevice(e.gdr, dev.Slice(part, 2*part), ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("verbs: registering device memory for staging: %w", err)
	}
	n := c.l.slots * c.l.slotSize
	c.slots.recv, c.slots.send = dev.Slice(0, n), dev.Slice(part, part+n)
	c.slots.recvAddr, c.slots.recvKey = c.slots.rmr.Addr(), c.slots.rmr.RKey()
	c.slots.sendAddr, c.slots.sendKey = c.slots.smr.Addr(), c.slots.smr.LKey()
	if e.flush {
		if c.flush, err = newFlusher(c); err != nil {
			return err
		}
	}
	return nil
}

// releaseDevice undoes deviceMemory. With keep, the memory itself stays
// allocated (a call still holds a slot) and the function that frees it
// is returned.
func (c *conn) releaseDevice(keep bool) func() {
	if c.flush != nil {
		c.flush.destroy()
		c.flush = nil
	}
	e := c.e
	for _, m := range []ibv.MR{c.slots.rmr, c.slots.smr} {
		if m != nil {
			m.Dereg()
		}
	}
	c.slots.rmr, c.slots.smr = nil, nil
	var free []func()
	if c.mapped.Len() > 0 {
		m := c.mapped
		free = append(free, func() { e.o.Device.(device.Registrar).Unregister(m) })
	}
	if c.slots.dev.Len() > 0 {
		d := c.slots.dev
		free = append(free, func() { e.o.Device.Free(d) })
	}
	c.mapped, c.slots = memory.Buffer{}, slotMem{}
	f := func() {
		for _, g := range free {
			g()
		}
	}
	if keep {
		return f
	}
	f()
	return nil
}

// flusher is a connection's flush queue pair: connected to itself, with a
// completion queue of its own.
type flusher struct {
	cq     ibv.CQ
	qp     ibv.QP
	posted uint64
	done   uint64
	wc     [4]ibv.WC
}

func newFlusher(c *conn) (*flusher, error) {
	ctx, p := c.e.port.Ctx, c.e.port
	f := &flusher{}
	var err error
	fail := func(what string, err error) (*flusher, error) {
		f.destroy()
		return nil, fmt.Errorf("verbs: the flush queue pair: %s: %w", what, err)
	}
	if f.cq, err = ctx.CreateCQ(8); err != nil {
		return fail("ibv_create_cq", err)
	}
	if f.qp, err = ctx.CreateQP(f.cq, ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return fail("ibv_create_qp", err)
	}
	a := ibv.QPAttr{State: ibv.QPInit, Port: uint8(p.Num), Access: ibv.AccessRemoteReadWriteAll}
	if err := f.qp.Modify(&a, ibv.MaskResetToInit); err != nil {
		return fail("ibv_modify_qp to INIT", err)
	}
	a = ibv.QPAttr{State: ibv.QPRTR, PathMTU: p.Attr.ActiveMTU, DestQPN: f.qp.Num(), RQPSN: 0,
		MaxDestRdAtomic: 1, MinRNRTimer: minRNRTimer, AH: ibv.AH{DLID: p.Attr.LID, SL: c.e.o.SL, Port: uint8(p.Num)}}
	if p.GIDIdx >= 0 {
		a.AH.IsGlobal, a.AH.DGID, a.AH.SGIDIdx, a.AH.HopLimit = true, p.GID, uint8(p.GIDIdx), 255
	}
	if err := f.qp.Modify(&a, ibv.MaskInitToRTR); err != nil {
		return fail("ibv_modify_qp to RTR", err)
	}
	a = ibv.QPAttr{State: ibv.QPRTS, SQPSN: 0, Timeout: c.e.o.Timeout, RetryCnt: c.e.o.RetryCnt, RNRRetry: rnrRetry, MaxRdAtomic: 1}
	if err := f.qp.Modify(&a, ibv.MaskRTRToRTS); err != nil {
		return fail("ibv_modify_qp to RTS", err)
	}
	return f, nil
}

func (f *flusher) destroy() {
	if f.qp != nil {
		f.qp.Destroy()
	}
	if f.cq != nil {
		f.cq.Destroy()
	}
}

// flushSlot reads one byte of receive slot i through the NIC and waits
// for the read to complete.
func (c *conn) flushSlot(ctx context.Context, i int) error {
	f := c.flush
	f.posted++
	wr := []ibv.SendWR{{ID: f.posted, Op: ibv.OpRead, Flags: ibv.SendSignaled,
		SGE:    ibv.SGE{Addr: ibv.Addr(c.mem.B[c.l.lf:]), Len: 1, LKey: c.lmr.LKey()},
		Remote: c.slots.recvAddr + uint64(i*c.l.slotSize), RKey: c.slots.recvKey}}
	if _, err := f.qp.PostSend(wr); err != nil {
		c.fail(fmt.Errorf("verbs: posting the flush read: %w", err))
		return &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.failed}
	}
	c.e.flushes.Add(1)
	for spins := 0; f.done < f.posted; spins++ {
		n, err := f.cq.Poll(f.wc[:])
		if err != nil {
			c.fail(fmt.Errorf("verbs: polling the flush queue: %w", err))
			return &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.failed}
		}
		for _, w := range f.wc[:n] {
			if w.Status != ibv.Success {
				c.fail(fmt.Errorf("verbs: the flush read of a slot from rank %d on %s: %w", c.peer, c.e.port.Device.Name, &ibv.WCError{Status: w.Status, Op: w.Opcode, Vendor: w.Vendor}))
				return &transport.PeerError{Peer: c.peer, Op: "recv", Err: c.failed}
			}
			f.done = max(f.done, w.ID)
		}
		if spins%64 == 63 {
			runtime.Gosched()
			if err := context.Cause(ctx); err != nil {
				return &transport.PeerError{Peer: c.peer, Op: "recv", Err: err}
			}
			if c.down.Load() {
				return c.e.closedErr()
			}
		}
	}
	return nil
}
