package shm

import (
	"fmt"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Device slots in device memory (CUDA IPC; NCCL's P2P transport). A
// connection for device operations keeps its flags and descriptors in the
// segment, registered with the device, and its data slots where the
// sender can put them: in the receiver's device memory, which the sender
// maps, or in the segment.
//
// Each side offers the data slots of the ring it receives on as device
// memory (device.IPCExporter.AllocIPC, exported with IPCHandle) in the
// segment's header before the segment changes hands: the rank that
// makes the segment before handing it over, the other before it
// acknowledges it. So each side finds the other's offer when its Connect
// runs, without waiting for the other's Connect (connections are made in
// any order, and a wait there would deadlock a ring). A sender that maps
// the receiver's offer (OpenIPC) writes slices longer than a descriptor's
// inline bytes into it, and marks each such slice in its descriptor
// (devFlag); a sender that cannot (no offer, the same process, GPUs
// without peer access, Options.NoDeviceIPC) writes into the segment's
// slots as before. The receiver goes by the mark, slice by slice, so the
// two sides need not agree. On one GPU, or two with peer access, a slice
// in device memory crosses no PCIe link to host memory.
//
// The header area, per side (hdrIPC + side*ipcStride):
//
//	+0    offer: 1 a handle follows, 2 no offer
//	+8    the handle (64 bytes)
const (
	hdrIPC    = 2560 // after both sides' blocks (hdrSide + 2*sideStride)
	ipcStride = 128
	ipcOffer  = 0
	ipcHandle = 8

	ipcYes = 1
	ipcNo  = 2

	// devFlag, in a descriptor's size, says that the slice is in the
	// receiver's device memory (its offer), at the data slot's offset.
	devFlag = 1 << 30
)

// The header page holds both sides' blocks and IPC areas.
var (
	_ [pageSize - (hdrIPC + 2*ipcStride)]struct{}
	_ [hdrIPC - (hdrSide + 2*sideStride)]struct{}
)

func ipcOff(side int) int { return hdrIPC + side*ipcStride }

// offerIPC makes this side's offer in seg, a new segment of channel ch
// (a device channel; nothing for others): the data slots of the ring this
// side receives on, in device memory, whose handle goes into the header.
// It returns them, or nothing when this side offers none (and says so in
// the header, so that the sender does not look for a handle).
func (e *Endpoint) offerIPC(seg *segment, ch int) memory.Buffer {
	if ch < transport.DeviceChannels {
		return memory.Buffer{}
	}
	off := ipcOff(seg.side)
	if seg.u32(off+ipcOffer).Load() != 0 {
		// A hand-over retried with the same segment: the first attempt's
		// offer stands (and is the pending connection's, or was freed
		// with it).
		return memory.Buffer{}
	}
	x, ok := e.o.Device.(device.IPCExporter)
	if !ok || e.o.NoDeviceIPC {
		seg.u32(off + ipcOffer).Store(ipcNo)
		return memory.Buffer{}
	}
	rx := seg.ring(1-seg.side, e.g)
	own, err := x.AllocIPC(len(rx.data))
	var h [64]byte
	if err == nil {
		if h, err = x.IPCHandle(own); err != nil {
			x.Free(own)
		}
	}
	if err != nil {
		e.log.Info("goccl: shm: no device memory offered for a device connection's slots", "rank", e.o.Rank, "channel", ch-transport.DeviceChannels, "err", err)
		seg.u32(off + ipcOffer).Store(ipcNo)
		return memory.Buffer{}
	}
	copy(seg.mem[off+ipcHandle:off+ipcHandle+64], h[:])
	seg.u32(off + ipcOffer).Store(ipcYes)
	return own
}

// freeOffer releases an offer that no connection took.
func (e *Endpoint) freeOffer(own memory.Buffer) {
	if own.Len() > 0 {
		if err := e.o.Device.(device.IPCExporter).Free(own); err != nil {
			e.log.Warn("goccl: shm: freeing device slots", "rank", e.o.Rank, "err", err)
		}
	}
}

// takeOffer maps the peer's offer, if it made one, for this side's sends;
// own is this side's. It returns why this side's sends stay in the
// segment's slots ("" when they go to the peer's device memory).
func (c *conn) takeOffer(own memory.Buffer) string {
	c.takeOwn(own)
	x, _ := c.e.o.Device.(device.IPCExporter)
	switch peer := ipcOff(1 - c.seg.side); {
	case x == nil:
		return "this rank's device exports and maps no memory of other processes"
	case c.e.o.NoDeviceIPC:
		return "IPC turned off on this rank"
	case c.seg.u32(peer+ipcOffer).Load() != ipcYes:
		return fmt.Sprintf("rank %d offered no device memory", c.peer)
	default:
		var h [64]byte
		copy(h[:], c.seg.mem[peer+ipcHandle:peer+ipcHandle+64])
		m, err := x.OpenIPC(h)
		if err != nil {
			return fmt.Sprintf("this rank cannot map rank %d's device memory: %v", c.peer, err)
		}
		if m.Len() < len(c.tx.data) {
			x.CloseIPC(m)
			return fmt.Sprintf("rank %d offered %d bytes of device slots, want %d", c.peer, m.Len(), len(c.tx.data))
		}
		c.ipc, c.devTxWhole, c.devTx = x, m, m.Slice(0, len(c.tx.data))
		return ""
	}
}

// takeOwn makes c hold this side's offer, to free it at teardown (a
// connection that is torn down without being made).
func (c *conn) takeOwn(own memory.Buffer) {
	if own.Len() > 0 {
		c.devRx, c.ipc = own, c.e.o.Device.(device.IPCExporter)
	}
}

// freeIPC lets go of the connection's device slots: the peer's mapping,
// then this side's offer.
func (c *conn) freeIPC() {
	if c.ipc == nil {
		return
	}
	if c.devTxWhole.Len() > 0 {
		if err := c.ipc.CloseIPC(c.devTxWhole); err != nil {
			c.e.log.Warn("goccl: shm: unmapping a peer's device slots", "rank", c.e.o.Rank, "peer", c.peer, "err", err)
		}
	}
	c.e.freeOffer(c.devRx)
}

// slotOff is where slice i's data slot starts in a ring's data.
func (r *ring) slotOff(i uint32) int { return int(i%r.slots) * r.stride }
