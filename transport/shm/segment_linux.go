package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/memory"
)

// Segment layout. All offsets are multiples of the page size; every field
// that one side writes while the other polls has a 128-byte block to
// itself (two cache lines: Intel's adjacent-line prefetcher fetches lines
// in pairs).
//
//	0                header page: magic, version, geometry, and per side
//	                 (0: the rank that created it, 1: the other) a gone
//	                 flag, an aborted flag and the abort's reason
//	pageSize         ring 0 (side 0 sends, side 1 receives)
//	...              ring 1 (side 1 sends, side 0 receives)
//
// A ring is a control block, then Slots 64-byte slot descriptors (one
// cache line each; in the control block's page when they fit, else from
// the next page on), rounded up to pages, then Slots data slots of
// SlotSize bytes each, each starting on a page:
//
//	ctrl+0    head   slices released (the receiver's line; the futex a
//	          sender waiting for a free slot sleeps on)
//	ctrl+128  rwait  the receiver sleeps (waiting for a slice)
//	ctrl+256  swait  the sender sleeps (waiting for a free slot)
//
//	desc+0    seq    slice number + 1 (mod 2³²) once the slot is filled;
//	                 the futex a receiver sleeps on
//	desc+4    size
//	desc+8    tag    op (8 bytes), signature, message, slice (4 each)
//	desc+32   data   slices of up to 32 bytes, inline
//
// The sender's "tail" is thus spread over the descriptors: the receiver
// polls the descriptor of the slot it expects, and one cache line brings
// it the flag, the tag and, for small slices, the data (NCCL's LL
// protocol puts flags next to data for the same reason). The sleep flags
// have lines of their own, written only by a side about to sleep, so that
// checking them costs the other side no cache miss.
const (
	pageSize   = 4096
	magic      = 0x6d6873_6c63636f67 // "gocclshm" little-endian, give or take
	version    = 3                   // 2: descriptors share the control page when they fit; 3: device connections offer IPC slots (ipc_linux.go)
	descLen    = 64
	reasonSize = 1024

	hdrMagic    = 0
	hdrVersion  = 8
	hdrSlots    = 12
	hdrSlotSize = 16
	hdrSide     = 128 // + side*sideStride
	sideStride  = 128 + reasonSize
	sideGone    = 0
	sideAborted = 4
	sideLen     = 8
	sideReason  = 128

	ctrlHead  = 0
	ctrlRWait = 128
	ctrlSWait = 256
	ctrlLen   = 384

	descSeq    = 0
	descSize   = 4
	descOp     = 8
	descSig    = 16
	descMsg    = 20
	descSlice  = 24
	descInline = 32
	// inlineMax is the largest slice carried in its descriptor.
	inlineMax = descLen - descInline
)

func roundPage(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// geometry is the shape of a segment.
type geometry struct {
	slots, slotSize int
}

// stride is the distance between slots.
func (g geometry) stride() int { return roundPage(g.slotSize) }

// descOff is where a ring's descriptors start, from its control block:
// in the control page itself when they fit (fewer pages per ring to touch
// per message: each is a TLB entry), else on the pages after it.
func (g geometry) descOff() int {
	if ctrlLen+g.slots*descLen <= pageSize {
		return ctrlLen
	}
	return pageSize
}

func (g geometry) ringSize() int {
	return roundPage(g.descOff()+g.slots*descLen) + g.slots*g.stride()
}

func (g geometry) size() int { return pageSize + 2*g.ringSize() }

// segment is one mapping of a pair's segment.
type segment struct {
	mem  []byte
	side int // which side this rank is

	// refs counts calls and slots in use (see acquire); the closed bit is
	// set once the segment is being torn down.
	refs    atomic.Int64
	unmapMu sync.Once

	// The peer's shared allocations mapped here (shared_linux.go), oldest
	// first in peerOrder; unmapped with the segment.
	peerMaps  map[peerSharedKey]*memory.PeerShared
	peerOrder []peerSharedKey
}

const closedBit = 1 << 62

// mustSeal are the seals a memfd carries before this rank maps it. A
// holder that shrinks a file under a mapping turns the next access to
// the pages cut off into SIGBUS, and a peer holds every segment it
// created or received (issue 19, finding 5); growing is sealed too, so
// that the size checked before mapping is the size for good.
const mustSeal = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// sealedMemfd makes a memfd of size bytes for other processes to map:
// sized, then sealed with mustSeal and against further seals (the rules
// are then fixed for everyone who holds it), before anyone else sees it.
func sealedMemfd(name string, size int) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sizing the memfd: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, mustSeal|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sealing the memfd: %w", err)
	}
	return fd, nil
}

// sealedSize returns the size of fd, a memfd about to be mapped, once it
// has made sure that no holder can change that size.
func sealedSize(fd int) (int64, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("it is not a sealable memfd (F_GET_SEALS: %w)", err)
	}
	if seals&mustSeal != mustSeal {
		return 0, fmt.Errorf("it is not sealed against shrinking and growing (seals %#x), so its holders could truncate it under the mapping", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return st.Size, nil
}

// mapSegment maps fd, checking its geometry when it came from the peer.
func mapSegment(fd int, g geometry, side int) (*segment, error) {
	size, err := sealedSize(fd)
	if err != nil {
		return nil, fmt.Errorf("shm: refusing to map the segment: %w", err)
	}
	if size != int64(g.size()) {
		return nil, fmt.Errorf("shm: segment is %d bytes, want %d (%d slots of %d bytes): do all ranks use the same slot settings?", size, g.size(), g.slots, g.slotSize)
	}
	mem, err := unix.Mmap(fd, 0, g.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map segment: %w", err)
	}
	s := &segment{mem: mem, side: side}
	s.publishBase() // for the peer's cross-memory attach probe (cma_linux.go)
	if side == 0 {
		binary.LittleEndian.PutUint64(mem[hdrMagic:], magic)
		binary.LittleEndian.PutUint32(mem[hdrVersion:], version)
		binary.LittleEndian.PutUint32(mem[hdrSlots:], uint32(g.slots))
		binary.LittleEndian.PutUint64(mem[hdrSlotSize:], uint64(g.slotSize))
		return s, nil
	}
	switch {
	case binary.LittleEndian.Uint64(mem[hdrMagic:]) != magic:
		err = errors.New("shm: not a goccl segment")
	case binary.LittleEndian.Uint32(mem[hdrVersion:]) != version:
		err = fmt.Errorf("shm: segment version %d, want %d", binary.LittleEndian.Uint32(mem[hdrVersion:]), version)
	case int(binary.LittleEndian.Uint32(mem[hdrSlots:])) != g.slots || int(binary.LittleEndian.Uint64(mem[hdrSlotSize:])) != g.slotSize:
		err = fmt.Errorf("shm: peer's segment has %d slots of %d bytes, this rank uses %d of %d (set the slot settings alike on every rank)",
			binary.LittleEndian.Uint32(mem[hdrSlots:]), binary.LittleEndian.Uint64(mem[hdrSlotSize:]), g.slots, g.slotSize)
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return s, nil
}

// createSegment makes a new segment and returns its descriptor (to hand to
// the peer) and this side's mapping.
func createSegment(g geometry) (int, *segment, error) {
	fd, err := sealedMemfd("goccl", g.size())
	if err != nil {
		return -1, nil, fmt.Errorf("shm: segment: %w", err)
	}
	s, err := mapSegment(fd, g, 0)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, s, nil
}

func (s *segment) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[off]))
}

func sideOff(side int) int { return hdrSide + side*sideStride }

// gone and aborted are side's flags.
func (s *segment) gone(side int) *atomic.Uint32 { return s.u32(sideOff(side) + sideGone) }

func (s *segment) aborted(side int) *atomic.Uint32 {
	return s.u32(sideOff(side) + sideAborted)
}

// setAborted records this side's abort and its reason.
func (s *segment) setAborted(reason string) {
	off := sideOff(s.side)
	if len(reason) > reasonSize {
		reason = reason[:reasonSize]
	}
	n := copy(s.mem[off+sideReason:off+sideReason+reasonSize], reason)
	s.u32(off + sideLen).Store(uint32(n))
	s.aborted(s.side).Store(1)
}

// abortReason returns side's reason, if it aborted.
func (s *segment) abortReason(side int) (string, bool) {
	if s.aborted(side).Load() == 0 {
		return "", false
	}
	off := sideOff(side)
	n := min(int(s.u32(off+sideLen).Load()), reasonSize)
	if n == 0 {
		return "no reason given", true
	}
	return string(s.mem[off+sideReason : off+sideReason+n]), true
}

// acquire marks the segment's memory in use by a call or a held slot; it
// fails once the segment is being torn down. Every successful acquire is
// paired with a release.
func (s *segment) acquire() bool {
	if s.refs.Add(1)&closedBit != 0 {
		s.release()
		return false
	}
	return true
}

// enter acquires the segment for a call on an endpoint that is up. It
// returns false, holding nothing, once the segment is being torn down or
// the endpoint is down (acquiring first and then finding the endpoint
// down must let go again, or the segment stays mapped after close).
func (s *segment) enter(down *atomic.Bool) bool {
	if !s.acquire() {
		return false
	}
	if down.Load() {
		s.release()
		return false
	}
	return true
}

func (s *segment) release() {
	if s.refs.Add(-1) == closedBit {
		s.unmap()
	}
}

// detach tears the mapping down. While calls still use it (another
// goroutine closing the endpoint under a running operation), it is
// replaced by private zero pages, which they may scribble on harmlessly,
// and unmapped when the last one leaves; either way this process lets go
// of the shared memory at once.
func (s *segment) detach() {
	old := s.refs.Or(closedBit)
	if old&closedBit != 0 {
		return
	}
	if old == 0 {
		s.unmap()
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(s.mem))
	_, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(p), uintptr(len(s.mem)), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0)
	_ = errno // on failure the shared mapping stays until the last user leaves
	if s.refs.Load() == closedBit {
		s.unmap()
	}
}

func (s *segment) unmap() {
	s.unmapMu.Do(func() {
		unix.Munmap(s.mem)
		for _, p := range s.peerMaps {
			p.Close()
		}
	})
}

// ring is one direction of a segment, seen from one side.
type ring struct {
	head, rwait, swait *atomic.Uint32
	desc               []byte
	data               []byte
	slots              uint32
	slotSize, stride   int
}

func (s *segment) ring(dir int, g geometry) ring {
	base := pageSize + dir*g.ringSize()
	descs := base + g.descOff()
	data := base + roundPage(g.descOff()+g.slots*descLen)
	return ring{
		head:     s.u32(base + ctrlHead),
		rwait:    s.u32(base + ctrlRWait),
		swait:    s.u32(base + ctrlSWait),
		desc:     s.mem[descs : descs+g.slots*descLen],
		data:     s.mem[data : data+g.slots*g.stride()],
		slots:    uint32(g.slots),
		slotSize: g.slotSize,
		stride:   g.stride(),
	}
}

// slot returns the data slot of slice i.
func (r *ring) slot(i uint32) []byte {
	off := int(i%r.slots) * r.stride
	return r.data[off : off+r.slotSize : off+r.slotSize]
}

// descOf returns the descriptor of slice i.
func (r *ring) descOf(i uint32) []byte {
	off := int(i%r.slots) * descLen
	return r.desc[off : off+descLen : off+descLen]
}

// seq is the flag of slice i's descriptor.
func (r *ring) seq(i uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.desc[int(i%r.slots)*descLen+descSeq]))
}

// payload returns where slice i's n bytes live: inline in its descriptor
// when they fit, else in its data slot.
func (r *ring) payload(i uint32, n int) []byte {
	if n <= inlineMax {
		return r.descOf(i)[descInline : descInline+n]
	}
	return r.slot(i)[:n]
}

// publish fills in slice i's descriptor and then its flag, which makes
// the descriptor and the data visible to the receiver.
func (r *ring) publish(i uint32, op uint64, sig, msg, slice, size uint32) {
	d := r.descOf(i)
	binary.LittleEndian.PutUint32(d[descSize:], size)
	binary.LittleEndian.PutUint64(d[descOp:], op)
	binary.LittleEndian.PutUint32(d[descSig:], sig)
	binary.LittleEndian.PutUint32(d[descMsg:], msg)
	binary.LittleEndian.PutUint32(d[descSlice:], slice)
	r.seq(i).Store(i + 1)
}

// filled reports whether slice i has been published.
func (r *ring) filled(i uint32) bool { return r.seq(i).Load() == i+1 }

func (r *ring) getDesc(i uint32) (op uint64, sig, msg, slice, size uint32) {
	d := r.descOf(i)
	return binary.LittleEndian.Uint64(d[descOp:]), binary.LittleEndian.Uint32(d[descSig:]), binary.LittleEndian.Uint32(d[descMsg:]),
		binary.LittleEndian.Uint32(d[descSlice:]), binary.LittleEndian.Uint32(d[descSize:])
}
