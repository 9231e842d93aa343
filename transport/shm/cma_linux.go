package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/memory"
	"github.com/goccl/goccl/transport"
)

// Cross-memory attach (issue 17). A slice normally crosses with two
// copies: the sender's into the slot, the receiver's out of it. Where the
// receiver only lands the slice in its output (broadcast, all-gather), it
// can instead copy it straight out of the sender's memory with
// process_vm_readv, which Linux has had since 3.2 (Open MPI's vader BTL
// and MPICH's nemesis do the same, as "CMA"): the sender posts a
// descriptor that says where the slice is, the receiver copies it and
// releases the slot, and the sender's Flush waits for that release before
// the operation returns and the caller may touch its buffer again.
//
// Whether it works is found out, not assumed: the kernel refuses it
// between processes that may not ptrace each other (another user, Yama's
// ptrace_scope, a container's seccomp profile), and pids differ between
// pid namespaces. So each side writes the address it maps the segment at
// into the segment's header, and a receiver, before its first wait,
// reads through process_vm_readv, at the peer's mapping, the word that
// holds its own mapping's address. Only if that reads back right does it
// raise its "can read" flag, and only then does the sender post
// descriptors; otherwise both go on with slots.
//
// Whether it pays is measured, not assumed either. (Blocks, larger than
// a slot, on two ranks, have a choice of their own, measured end to end
// as the operations run: blocks_linux.go.) The slot path's two
// copies are user-space copies that run on two cores at once; the single
// copy is the kernel's, which pins the sender's pages first. On these
// KVM guests process_vm_readv moves 6-7 GB/s where copy moves 20-30
// (docs/performance.md, "Single-copy transfers"), so there it loses at
// every size, and Open MPI pays that too. So, unless Options.CMA says
// otherwise, each process times both once (kernelCopySpeed, about a
// millisecond) and a receiver offers the single copy only when the
// kernel's copy runs at least half as fast as a user-space one: then one
// kernel copy costs less than the two it replaces.
//
// What a peer can do with it: make this rank copy from the peer's own
// memory, at most the bytes the engine expected (the size is checked
// first). A receiver checks, after its copy, that the sender has not
// aborted meanwhile: an aborted sender's operation returns, and its
// caller may rewrite the buffer, only after it has raised its abort flag,
// so a copy that ends before the flag is seen read the buffer intact.

const (
	sideBase = 16 // uint64: the address this side maps the segment at
	sideCMA  = 24 // uint32: whether this side reads the other's memory (cma*)
	sideMaps = 28 // uint32: whether this side maps the other's shared allocations (cma*; shared_linux.go)

	cmaUnknown = 0
	cmaYes     = 1 // reads the other's memory, in slices of any size
	cmaNo      = 2
	cmaBlocks  = 3 // reads the other's memory, but only blocks pay (blocks_linux.go)

	// refFlag, in a descriptor's size, says that the slice is not in the
	// slot but in the sender's memory, at the address and length inline.
	refFlag = 1 << 31

	// refBlock, in a refCMA descriptor's inline bytes, is the block size
	// the sender cut the step into (transport.BlockCopier; 0: slot-sized
	// slices), at most MaxBlockSize.
	refBlock = 20
	// refBusy, in refBlock's word, says that the sender has work of its
	// own after the post (its copy into its output) and would take a
	// share of the block's copy late (split_linux.go).
	refBusy = 1 << 31

	// DefaultBlockSize is Options.BlockSize's default. Measured on these
	// VMs (docs/performance.md, "Blocks by reference"): process_vm_readv
	// of a MiB from another process took 44 µs in one call, 52 in 256 KiB
	// ones, 80 in 64 KiB ones and 165 in 16 KiB ones; larger blocks gain
	// little more and keep the receiver waiting longer for the first.
	DefaultBlockSize = 1 << 20

	// DefaultBlockMax is Options.BlockMax's default, a bound on the
	// reductions that go in blocks. Measured (docs/performance.md, "Blocks
	// by reference"): a 16 MiB reduce took twice as long in blocks, and
	// at 64 MiB a reduce 1.11 times, where a choice by measurement pays
	// for its exploring with operations that take milliseconds.
	// Operations that land what they receive have no bound: forced into
	// blocks a 2-rank broadcast and all-gather of 64 MiB took 0.77-0.91 of
	// the slots' time, since a copy-and-send step streams its own copy
	// ("Blocks above 16 MiB, again").
	DefaultBlockMax = 16 << 20

	// cmaWorthIt is the least ratio of the kernel's copy speed to a
	// user-space copy's at which the single copy pays (see above).
	cmaWorthIt = 0.5

	// cmaSliceMin is the smallest operation whose slot-sized slices go by
	// the receiver's copy under CMAAuto, where the kernel copies fast
	// enough at all. The kernel's copy costs a system call and pins pages
	// per slice, and a chain's middle rank passes a slice on only once it
	// is read: with the probe at 0.55, 3- and 4-rank broadcasts of 64 and
	// 128 KiB took 1.3-2.0 times as long by reference as through the
	// slots, at 192 and 256 KiB they were level, at 512 KiB faster
	// (0.7-0.8); all-gathers were level at 128 KiB and faster from 192 KiB
	// (0.8-0.85; docs/performance.md, thirteenth session). Blocks (2
	// ranks) have their own, measured choice.
	cmaSliceMin = 192 << 10

	// cmaSliceMax is the largest operation whose slot-sized slices go by
	// the receiver's copy under CMAAuto. Above it the kernel's copy, out
	// of a peer's whole buffer rather than a ring that stays in cache,
	// loses to the slots' two copies: on 3 and 4 ranks broadcasts of 16
	// and 32 MiB took 1.3-1.6 times as long by reference, all-gathers of
	// 32 MiB 1.25-1.4 times; at 8 MiB all-gathers were faster by
	// reference (0.8-0.9) and broadcasts level (docs/performance.md,
	// fifteenth session).
	cmaSliceMax = 8 << 20

	// DefaultCMAMin and DefaultCMAMax bound the operations whose slices
	// go by the receiver's copy (Options.CMAMin, CMAMax); measured in
	// docs/performance.md ("Single-copy broadcast and all-gather").
	DefaultCMAMin = 64 << 10
	DefaultCMAMax = 0 // no upper bound
)

func (s *segment) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[off]))
}

// publishBase writes where this side maps the segment, for the peer's
// probe.
func (s *segment) publishBase() {
	s.u64(sideOff(s.side) + sideBase).Store(uint64(uintptr(unsafe.Pointer(&s.mem[0]))))
}

// readPeer copies len(dst) bytes at addr in process pid's memory into dst.
func readPeer(pid int, dst []byte, addr uint64) error { return movePeer(pid, dst, addr, false) }

// movePeer copies between b in this process and addr in process pid's
// memory: into b (process_vm_readv), or out of it with write
// (process_vm_writev), going on after a partial copy or an interrupt.
func movePeer(pid int, b []byte, addr uint64, write bool) error {
	call, name, dir, short := unix.ProcessVMReadv, "process_vm_readv", "from", io.ErrUnexpectedEOF
	if write {
		call, name, dir, short = unix.ProcessVMWritev, "process_vm_writev", "to", io.ErrShortWrite
	}
	for len(b) > 0 {
		local := []unix.Iovec{{Base: &b[0]}}
		local[0].SetLen(len(b))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
		n, err := call(pid, local, remote, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s of %d bytes %s pid %d: %w", name, len(b), dir, pid, err)
		}
		if n <= 0 {
			return fmt.Errorf("%s %s pid %d: %w", name, dir, pid, short)
		}
		b, addr = b[n:], addr+uint64(n)
	}
	return nil
}

// kernelCopySpeed is the ratio of process_vm_readv's copy speed to
// copy's, measured once per process on 256 KiB (the best of five runs
// of each, so that a preempted run does not decide); 0 when the kernel
// refuses it.
var kernelCopySpeed = sync.OnceValue(func() float64 {
	const n = 256 << 10
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	pid := unix.Getpid()
	best := func(f func() error) (time.Duration, error) {
		b := time.Duration(1 << 62)
		for range 5 {
			t0 := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			b = min(b, time.Since(t0))
		}
		return b, nil
	}
	kernel, err := best(func() error { return readPeer(pid, dst, uint64(uintptr(unsafe.Pointer(&src[0])))) })
	if err != nil || kernel <= 0 {
		return 0
	}
	user, _ := best(func() error { copy(dst, src); return nil })
	return float64(user) / float64(kernel)
})

// cmaPays reports whether this process's receivers offer the single copy.
func (o *Options) cmaPays() bool {
	switch o.CMA {
	case CMAOn:
		return true
	case CMAOff:
		return false
	}
	return kernelCopySpeed() >= cmaWorthIt
}

// peerPid is the pid of the process at the other end of the control
// socket, as this process's pid namespace numbers it (SO_PEERCRED); 0 if
// unknown.
func peerPid(ctl int) int {
	cred, err := unix.GetsockoptUcred(ctl, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0
	}
	return int(cred.Pid)
}

// probe finds out, once, whether this side can read the peer's memory,
// and says so in the segment for the peer's sends. It needs the peer's
// mapping address, which the peer writes when it maps the segment. The
// caller holds the segment.
func (c *conn) probe() {
	if c.probed {
		return
	}
	c.probeMaps()
	c.probed = true
	res := uint32(cmaNo)
	me, peer := c.seg.side, 1-c.seg.side
	if c.e.o.CMAMin >= 0 && c.pid > 0 && c.e.o.CMA != CMAOff {
		base := c.seg.u64(sideOff(peer) + sideBase).Load()
		if base == 0 {
			c.probed = false // not mapped yet: look again at the next wait
			return
		}
		{
			var got [8]byte
			err := readPeer(c.pid, got[:], base+uint64(sideOff(me)+sideBase))
			if err == nil && binary.LittleEndian.Uint64(got[:]) == c.seg.u64(sideOff(me)+sideBase).Load() {
				res = cmaBlocks
				if c.e.o.cmaPays() {
					res = cmaYes
				}
				c.initBlocks()
			} else if c.e.o.Logger != nil {
				c.e.o.Logger.Debug("goccl: shm: the receiver's single copy (process_vm_readv) is not available; slices go through slots",
					"peer", c.peer, "channel", c.ch, "err", err)
			}
		}
	}
	c.seg.u32(sideOff(me) + sideCMA).Store(res)
}

// PeerMaps implements transport.PeerMapper.
func (c *conn) PeerMaps(opBytes int64, send bool) bool {
	return c.byRefFits(opBytes, c.e.o.SharedMax) && c.maps(c.reader(send))
}

// PeerCopies implements transport.PeerCopier: slot-sized slices go by
// reference only where the reader found that they pay (cmaYes) and,
// unless Options.CMA forces it, in operations of cmaSliceMin to
// cmaSliceMax bytes; blocks have their own choice (BlockSlice).
func (c *conn) PeerCopies(opBytes int64, send bool) bool {
	return c.byRefFits(opBytes, c.e.o.CMAMax) && (c.e.o.CMA == CMAOn || opBytes >= cmaSliceMin && opBytes <= cmaSliceMax) && c.cma(c.reader(send)) == cmaYes
}

// byRefFits reports whether an operation of opBytes may send its slices
// by reference: from CMAMin (< 0: never) up to max (<= 0: no bound), on
// a connection whose slots are not in device memory.
func (c *conn) byRefFits(opBytes, max int64) bool {
	min := c.e.o.CMAMin
	return min >= 0 && opBytes >= min && (max <= 0 || opBytes <= max) && c.mapped.Len() == 0
}

// reader is the side that reads the slices by reference: the peer's
// when this side sends.
func (c *conn) reader(send bool) int {
	if send {
		return 1 - c.seg.side
	}
	return c.seg.side
}

// reads reports whether side has found that it can read the other side's
// memory; false once the segment is being torn down.
func (c *conn) reads(side int) bool {
	v := c.cma(side)
	return v == cmaYes || v == cmaBlocks
}

// cma is side's finding (cma*); cmaUnknown once the segment is being torn
// down.
func (c *conn) cma(side int) uint32 {
	if !c.seg.acquire() {
		return cmaUnknown
	}
	defer c.seg.release()
	return c.seg.u32(sideOff(side) + sideCMA).Load()
}

// PostFrom implements transport.DirectSender. Slices the peer can read
// from here go by reference; others are copied into a slot.
func (c *conn) PostFrom(ctx context.Context, src memory.Buffer, tag transport.Tag) error {
	return c.postFrom(ctx, src, tag, 0)
}

// BlockSlice implements transport.BlockCopier: blocks of BlockSize bytes
// wherever the peer reads this rank's slices by reference.
func (c *conn) BlockSlice(opBytes int64, reduces bool) int {
	if !c.blocksFit(opBytes, reduces) || !c.wantsBlocks(1-c.seg.side, opBytes, reduces) {
		return 0
	}
	return c.e.o.BlockSize
}

// blocksFit reports whether an operation of opBytes may go in blocks at
// all: blocks larger than a slot, the size from CMAMin to CMAMax and, for
// a reduction, BlockMax.
func (c *conn) blocksFit(opBytes int64, reduces bool) bool {
	return c.e.o.BlockSize > c.tx.slotSize && c.byRefFits(opBytes, c.e.o.CMAMax) && (!reduces || c.e.o.BlockMax <= 0 || opBytes <= c.e.o.BlockMax)
}

// PostBlock implements transport.BlockCopier.
func (c *conn) PostBlock(ctx context.Context, src memory.Buffer, tag transport.Tag, block int) error {
	if block <= 0 || block > MaxBlockSize || src.Len() > block {
		return fmt.Errorf("shm: post of %d bytes in blocks of %d (blocks hold at most %d)", src.Len(), block, MaxBlockSize)
	}
	return c.postFrom(ctx, src, tag, block)
}

// PeekBlock implements transport.BlockCopier.
func (c *conn) PeekBlock(ctx context.Context) (int, error) {
	if c.holding {
		return 0, errors.New("shm: peek while holding a slot")
	}
	if !c.seg.enter(&c.e.down) {
		return 0, c.fail("recv", c.e.closedErr())
	}
	defer c.seg.release()
	_, _, byRef, _, err := c.next(ctx)
	if err != nil || !byRef || c.rx.refKind(c.head) != refCMA {
		return 0, err
	}
	return int(binary.LittleEndian.Uint32(c.rx.descOf(c.head)[descInline+refBlock:]) &^ refBusy), nil
}

// postFrom is PostFrom for a step cut into blocks of block bytes (0: into
// slot-sized slices).
func (c *conn) postFrom(ctx context.Context, src memory.Buffer, tag transport.Tag, block int) error {
	n := src.Len()
	if c.mapped.Len() > 0 {
		// The engine sends only host operations' slices from the user's
		// memory; a device connection's slots may be device memory.
		return fmt.Errorf("shm: PostFrom on a connection for device operations")
	}
	b := src.Bytes()
	if block > 0 {
		// A block goes by the peer's copy whatever its size, so that the
		// peer, which cuts its side of the step by what the first slice
		// says, finds every slice of it the same way.
		if !c.reads(1 - c.seg.side) {
			return fmt.Errorf("shm: a block of %d bytes for rank %d, which does not read this rank's memory", n, c.peer)
		}
		return c.postRef(ctx, b, tag, block)
	}
	if n > c.tx.slotSize {
		return fmt.Errorf("shm: post of %d bytes, slots hold %d", n, c.tx.slotSize)
	}
	if n > inlineMax && c.maps(1-c.seg.side) {
		if ref, ok := memory.SharedOf(b); ok {
			return c.postShared(ctx, ref, tag)
		}
	}
	byRef := n > inlineMax && c.cma(1-c.seg.side) == cmaYes
	if !byRef {
		slot, err := c.Reserve(ctx, n)
		if err != nil {
			return err
		}
		copy(slot.Bytes(), b)
		return c.Post(n, tag)
	}
	return c.postRef(ctx, b, tag, 0)
}

// postRef posts b by reference, for the peer's process_vm_readv, as a
// slice of a step cut into blocks of block bytes (0: slot-sized slices).
func (c *conn) postRef(ctx context.Context, b []byte, tag transport.Tag, block int) error {
	n := len(b)
	if _, err := c.Reserve(ctx, 0); err != nil {
		return err
	}
	d := c.tx.descOf(c.tail)
	var addr uintptr
	if n > 0 {
		addr = uintptr(unsafe.Pointer(&b[0]))
	}
	binary.LittleEndian.PutUint64(d[descInline:], uint64(addr))
	binary.LittleEndian.PutUint64(d[descInline+8:], uint64(n))
	binary.LittleEndian.PutUint32(d[descInline+refKind:], refCMA)
	v := uint32(block)
	if c.busyAfter {
		v |= refBusy
	}
	binary.LittleEndian.PutUint32(d[descInline+refBlock:], v)
	c.recordRef(b)
	c.lastRef, c.hasRef = c.tail, true
	c.byRef.Add(1)
	c.publish(tag, uint32(n)|refFlag)
	return nil
}

// Flush implements transport.Flusher: it waits until the peer has
// released every slice it reads from this rank's memory.
func (c *conn) Flush(ctx context.Context) error {
	if !c.hasRef {
		return nil
	}
	if !c.seg.enter(&c.e.down) {
		return c.fail("send", c.e.closedErr())
	}
	defer c.seg.release()
	done := func() bool {
		c.serveSplit()
		return int32(c.tx.head.Load()-(c.lastRef+1)) >= 0
	}
	if !done() {
		if err := c.await(ctx, "send", c.tx.head, c.tx.swait, done); err != nil {
			return err
		}
	}
	c.hasRef = false
	clear(c.sent) // the caller's buffers are its own again
	return nil
}

// fetch copies a slice posted by reference (descriptor d, n bytes) into
// dst, and checks that the sender was still in its operation when the
// copy ended.
func (c *conn) fetch(ctx context.Context, d []byte, dst []byte) error {
	if err := c.refLen(d, len(dst)); err != nil {
		return err
	}
	var err error
	switch kind := binary.LittleEndian.Uint32(d[descInline+refKind:]); kind {
	case refCMA:
		addr := binary.LittleEndian.Uint64(d[descInline:])
		v := binary.LittleEndian.Uint32(d[descInline+refBlock:])
		block := v &^ refBusy
		if block != 0 && v&refBusy == 0 && c.splits(len(dst)) {
			err = c.fetchSplit(ctx, dst, addr)
		} else {
			err = readPeer(c.pid, dst, addr)
		}
		if err == nil && block != 0 {
			blocksReceived.Add(1)
		}
	case refShared:
		err = c.copyShared(d, dst)
	default:
		return &transport.PeerError{Peer: c.peer, Op: "recv", Err: fmt.Errorf("protocol error: rank %d posted a slice by a reference of kind %d", c.peer, kind)}
	}
	if err != nil {
		return c.refFailed(err)
	}
	return c.senderAborted()
}

// refLen checks that descriptor d's reference is of the n bytes its size
// says.
func (c *conn) refLen(d []byte, n int) error {
	if l := binary.LittleEndian.Uint64(d[descInline+8:]); l != uint64(n) {
		return &transport.PeerError{Peer: c.peer, Op: "recv", Err: fmt.Errorf("protocol error: rank %d posted a %d-byte slice that says it is %d bytes", c.peer, n, l)}
	}
	return nil
}

// refFailed is the error of a read by reference that failed: err itself
// where it already names the peer (a protocol error), else the reason
// the connection gives (the peer gone or aborted), else err.
func (c *conn) refFailed(err error) error {
	var pe *transport.PeerError
	if errors.As(err, &pe) {
		return err
	}
	if cerr := c.check(context.Background(), true); cerr != nil {
		return c.fail("recv", cerr)
	}
	return c.fail("recv", err)
}

// senderAborted fails once the peer has aborted: a slice read out of its
// memory after that may not be what it sent (its caller may be writing
// the buffer again).
func (c *conn) senderAborted() error {
	if reason, ok := c.seg.abortReason(1 - c.seg.side); ok {
		return c.fail("recv", &transport.PeerAbortedError{Peer: c.peer, Cause: errors.New(reason)})
	}
	return nil
}

// WaitInto implements transport.DirectReceiver: a slice by reference is
// copied from the sender's memory straight into dst, one in a slot out of
// it.
func (c *conn) WaitInto(ctx context.Context, dst memory.Buffer) (transport.Tag, int, error) {
	if c.holding {
		return transport.Tag{}, 0, errors.New("shm: wait while holding a slot")
	}
	if !c.seg.enter(&c.e.down) {
		return transport.Tag{}, 0, c.fail("recv", c.e.closedErr())
	}
	defer c.seg.release()
	tag, n, byRef, dev, err := c.next(ctx)
	if err != nil {
		return tag, n, err
	}
	if dev {
		// Host memory cannot take a slice in device memory: the engine
		// lands only host operations' slices (whose connections have no
		// device slots).
		return tag, n, c.fail("recv", errors.New("a slice in device memory, received into host memory"))
	}
	if n != dst.Len() {
		return tag, n, transport.ErrSizeMismatch
	}
	out := dst.Bytes()
	if byRef {
		if err := c.fetch(ctx, c.rx.descOf(c.head), out); err != nil {
			return tag, n, err
		}
	} else {
		copy(out, c.rx.payload(c.head, n))
	}
	c.advance()
	return tag, n, nil
}
