package ibemu

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Options configures the emulator.
type Options struct {
	// Dir is the fabric: the directory where NICs put their sockets.
	// Empty: $GOCCL_IB_EMULATE_DIR, else /tmp/goccl-ibemu-<uid>.
	Dir string
	// Seed seeds the adversarial choices (deferrals, placement order);
	// 0 picks one at random. Each NIC derives its own from it.
	Seed uint64
	// Adversarial defers requests at random and places each message's
	// bytes in a random order of chunks.
	Adversarial bool
	// TimeScale multiplies the transport timeout (retry_cnt and timeout
	// attributes) before a request toward an unreachable peer fails with
	// RETRY_EXC_ERR; 0 means DefaultTimeScale.
	TimeScale float64
	// MTU is the ports' active MTU; 0 means 4096.
	MTU ibv.MTU
	// InfiniBand makes the ports InfiniBand ones, addressed by LID (a GRH
	// is optional), in place of RoCE ones (a GRH and a GID are required).
	InfiniBand bool
}

// DefaultTimeScale brings NCCL's timeout 20, retry_cnt 7 (4.3 s × 8 on
// hardware) to 0.34 s.
const DefaultTimeScale = 0.01

// Provider is the emulated fabric's view from this process.
type Provider struct {
	o    Options
	seed atomic.Uint64
}

var _ ibv.Provider = (*Provider)(nil)

// New returns a provider over the fabric o names.
func New(o Options) *Provider {
	if o.Dir == "" {
		o.Dir = os.Getenv("GOCCL_IB_EMULATE_DIR")
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(os.TempDir(), fmt.Sprintf("goccl-ibemu-%d", os.Getuid()))
	}
	if o.Seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		o.Seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	if o.TimeScale == 0 {
		o.TimeScale = DefaultTimeScale
	}
	if o.MTU == 0 {
		o.MTU = ibv.MTU4096
	}
	p := &Provider{o: o}
	p.seed.Store(o.Seed)
	return p
}

// DeviceName is the emulated device's name.
const DeviceName = "emu0"

// Devices implements ibv.Provider: one device.
func (p *Provider) Devices() ([]ibv.DeviceInfo, error) {
	return []ibv.DeviceInfo{{Name: DeviceName, Ports: 1, Emulated: true}}, nil
}

// Open implements ibv.Provider: every Open is a NIC of its own, with its
// own GIDs, LID and socket.
func (p *Provider) Open(name string) (ibv.Context, error) {
	if name != DeviceName {
		return nil, fmt.Errorf("ibemu: no device %q (the emulator has %s)", name, DeviceName)
	}
	if err := os.MkdirAll(p.o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("ibemu: fabric directory: %w", err)
	}
	id, ln, err := p.claimID(randomID)
	if err != nil {
		return nil, err
	}
	n := &nic{p: p, id: id, rng: mrand.New(mrand.NewPCG(p.seed.Add(0x9e3779b97f4a7c15), uint64(id))),
		mrs: map[uint32]*mr{}, qps: map[uint32]*qp{}, remotes: map[uint32]*remoteNIC{},
		events: make(chan ibv.Event, 64), done: make(chan struct{})}
	n.gen = id & 0xff << 8
	n.nextQPN = (id & 0xfff) << 12
	n.sock = ln.Addr().String()
	if n.table, err = newSegment(mrTableLen); err != nil {
		ln.Close()
		return nil, err
	}
	n.ln = ln
	n.wg.Add(1)
	go n.serve()
	return n, nil
}

// claimID gives a new NIC an id (its LID, and the NIC part of its GIDs)
// that no live NIC of the fabric has, and the socket named by it, as a
// subnet manager hands out unique LIDs: two NICs with one id would each
// take the other's packets. A socket left by a process that died (no
// one accepts on it) is taken over. The fabric's lock file keeps two
// processes from taking over the same one. draw gives the candidates.
func (p *Provider) claimID(draw func() uint32) (uint32, *net.UnixListener, error) {
	lock, err := os.OpenFile(filepath.Join(p.o.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return 0, nil, fmt.Errorf("ibemu: fabric lock: %w", err)
	}
	defer lock.Close() // and with it the lock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return 0, nil, fmt.Errorf("ibemu: fabric lock: %w", err)
	}
	mask := uint32(0xffffff)
	if p.o.InfiniBand {
		mask = 0xbfff // a unicast LID (below 0xc000)
	}
	for range 1000 {
		id := draw() & mask
		if id == 0 {
			continue
		}
		sock := filepath.Join(p.o.Dir, fmt.Sprintf("%06x.sock", id))
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if errors.Is(err, unix.EADDRINUSE) {
			c, derr := net.Dial("unix", sock)
			if derr == nil {
				c.Close()
				continue // a live NIC has this id
			}
			os.Remove(sock) // left by a process that is gone
			ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		}
		if err != nil {
			return 0, nil, fmt.Errorf("ibemu: NIC socket: %w", err)
		}
		return id, ln, nil
	}
	return 0, nil, fmt.Errorf("ibemu: no free NIC id in fabric %s", p.o.Dir)
}

func randomID() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

// nic is one open emulated device.
type nic struct {
	p     *Provider
	id    uint32 // 24 bits: in its GIDs, LID and socket name
	sock  string
	ln    *net.UnixListener
	table *segment // the region table peers read
	wg    sync.WaitGroup

	mu       sync.Mutex // guards the fields below, and rng
	rng      *mrand.Rand
	gen      uint32 // region keys' generation
	nextSlot uint32 // where the search for a free region slot starts
	nextQPN  uint32
	mrs      map[uint32]*mr // by key (lkey = rkey)
	qps      map[uint32]*qp
	remotes  map[uint32]*remoteNIC
	closed   bool
	// deadSegs are destroyed QPs' segments, unmapped at Close.
	deadSegs []*segment
	// deadMRs unmap deregistered dma-buf regions, at Close: a request
	// of this process may still be copying from one.
	deadMRs []func()
	// seenEvents counts, by QPN, the access errors already reported.
	seenEvents map[uint32]uint32

	events chan ibv.Event
	done   chan struct{}
}

var (
	_ ibv.Context     = (*nic)(nil)
	_ ibv.EventSource = (*nic)(nil)
)

func (n *nic) Info() ibv.DeviceInfo {
	return ibv.DeviceInfo{Name: DeviceName, GUID: uint64(n.id), Ports: 1, Emulated: true}
}

// The port's GID table: two link-local entries (RoCE v1 and v2), then
// the IPv4-mapped RoCE v2 entry a transport should choose, then empty
// entries. All name this NIC: its id is in their last three bytes.
const gidTableLen = 8

func (n *nic) gid(index int) (ibv.GID, ibv.GIDType) {
	var g ibv.GID
	if n.p.o.InfiniBand {
		// One entry: the default subnet prefix and the port's GUID.
		if index != 0 {
			return ibv.GID{}, ibv.GIDIB
		}
		g[0], g[1] = 0xfe, 0x80
		g[13], g[14], g[15] = byte(n.id>>16), byte(n.id>>8), byte(n.id)
		return g, ibv.GIDIB
	}
	t := ibv.GIDRoCEv2
	switch index {
	case 0, 1:
		g[0], g[1] = 0xfe, 0x80
		g[11], g[12] = 0xff, 0xfe
		if index == 0 {
			t = ibv.GIDIB
		}
	case 2:
		g[10], g[11], g[12] = 0xff, 0xff, 10
	default:
		return ibv.GID{}, ibv.GIDIB
	}
	g[13], g[14], g[15] = byte(n.id>>16), byte(n.id>>8), byte(n.id)
	return g, t
}

// nicOfGID returns the NIC id a GID of the fabric names.
func nicOfGID(g ibv.GID) uint32 { return uint32(g[13])<<16 | uint32(g[14])<<8 | uint32(g[15]) }

func (n *nic) QueryPort(port int) (ibv.PortAttr, error) {
	if port != 1 {
		return ibv.PortAttr{}, fmt.Errorf("ibemu: ibv_query_port %d: %w (the device has port 1)", port, unix.EINVAL)
	}
	ll := ibv.LinkEthernet
	if n.p.o.InfiniBand {
		ll = ibv.LinkInfiniBand
	}
	return ibv.PortAttr{State: ibv.PortActive, MaxMTU: ibv.MTU4096, ActiveMTU: n.p.o.MTU, LID: uint16(n.id),
		LinkLayer: ll, GIDTblLen: gidTableLen}, nil // no rate: it is no link
}

func (n *nic) QueryGID(port, index int) (ibv.GID, ibv.GIDType, error) {
	if port != 1 || index < 0 || index >= gidTableLen {
		return ibv.GID{}, 0, fmt.Errorf("ibemu: ibv_query_gid port %d index %d: %w", port, index, unix.EINVAL)
	}
	g, t := n.gid(index)
	return g, t, nil
}

// The region table: mrTableLen/mrEntryLen entries, one per key slot
// (key & mrSlotMask), written by the owner and read by peers:
//
//	+0  key     the region's key, 0 when free (written last, atomically)
//	+4  access
//	+8  addr    the region's address in the owner's process
//	+16 len
const (
	mrEntryLen = 32
	mrSlots    = 4096
	mrSlotMask = mrSlots - 1
	mrTableLen = mrSlots * mrEntryLen
)

type mr struct {
	n      *nic
	key    uint32
	addr   uint64
	len    int
	access ibv.Access
	fd     int   // the memfd (or the dma-buf) holding it
	off    int64 // where the region starts in it
	mem    []byte
	dereg  atomic.Bool
	// release unmaps what RegDeviceMR mapped; nil for RegMR's regions,
	// whose memory is the caller's.
	release func()
}

func (m *mr) LKey() uint32 { return m.key }
func (m *mr) RKey() uint32 { return m.key }
func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() int     { return m.len }

func (n *nic) entry(key uint32) []byte {
	i := int(key&mrSlotMask) * mrEntryLen
	return n.table.mem[i : i+mrEntryLen]
}

func (n *nic) RegMR(mem []byte, access ibv.Access) (ibv.MR, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("ibemu: ibv_reg_mr of 0 bytes: %w", unix.EINVAL)
	}
	if err := checkAccess("ibv_reg_mr", access); err != nil {
		return nil, err
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	fd, off, ok := ibv.Lookup(p, len(mem))
	if !ok {
		return nil, fmt.Errorf("ibemu: ibv_reg_mr: the emulated device registers only memory from ibv.Alloc: %w", unix.EFAULT)
	}
	return n.addMR(&mr{n: n, addr: uint64(p), len: len(mem), access: access, fd: fd, off: off, mem: mem})
}

// RegDeviceMR registers a dma-buf, as ibv_reg_dmabuf_mr does: the
// emulator maps Len bytes at Offset of the descriptor (which must be
// shareable memory, as the emulated GPU's exported allocations are), and
// peers and work requests address them as IOVA. It keeps its own
// descriptor, so the caller may close its one. Registration by address
// (peer memory) is refused: the emulated device has no peer-memory
// client.
func (n *nic) RegDeviceMR(d ibv.DeviceMem, access ibv.Access) (ibv.MR, error) {
	if d.FD < 0 {
		return nil, fmt.Errorf("ibemu: ibv_reg_mr of device memory at %#x: the emulated device has no peer-memory client (nvidia-peermem): %w", d.IOVA, ibv.ErrNotSupported)
	}
	if d.Len <= 0 {
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr of %d bytes: %w", d.Len, unix.EINVAL)
	}
	if err := checkAccess("ibv_reg_dmabuf_mr", access); err != nil {
		return nil, err
	}
	page := uint64(unix.Getpagesize())
	if d.Offset%page != 0 || d.IOVA%page != d.Offset%page {
		// The kernel maps a dma-buf by pages; the emulator holds callers
		// to whole pages, as NCCL aligns them.
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr at offset %d, iova %#x: not page-aligned: %w", d.Offset, d.IOVA, unix.EINVAL)
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.FD, &st); err != nil {
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr: descriptor %d: %w", d.FD, err)
	}
	if d.Offset+uint64(d.Len) > uint64(st.Size) {
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr of %d bytes at offset %d of a %d-byte dma-buf: %w", d.Len, d.Offset, st.Size, unix.EINVAL)
	}
	fd, err := unix.FcntlInt(uintptr(d.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr: %w", err)
	}
	mem, err := mapFD(fd, int64(d.Offset), d.Len)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ibemu: ibv_reg_dmabuf_mr: mapping descriptor %d: %w", d.FD, err)
	}
	m := &mr{n: n, addr: d.IOVA, len: d.Len, access: access, fd: fd, off: int64(d.Offset), mem: mem,
		release: func() { unix.Munmap(mem); unix.Close(fd) }}
	r, err := n.addMR(m)
	if err != nil {
		m.release()
	}
	return r, err
}

// checkAccess holds a registration to ibv_reg_mr(3)'s rule: remote write
// (and atomics) need local write.
func checkAccess(verb string, access ibv.Access) error {
	if access&ibv.AccessRemoteWrite != 0 && access&ibv.AccessLocalWrite == 0 {
		return fmt.Errorf("ibemu: %s: remote write access without local write: %w", verb, unix.EINVAL)
	}
	return nil
}

// addMR gives m a key and publishes it in the region table.
func (n *nic) addMR(m *mr) (ibv.MR, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errClosed
	}
	var key uint32
	for i := range uint32(mrSlots) {
		slot := (n.nextSlot + i) & mrSlotMask
		if n.slotFree(slot) {
			n.nextSlot = slot + 1
			n.gen++
			key = n.gen<<12 | slot // a new key per registration: a stale key misses
			break
		}
	}
	if key == 0 {
		return nil, fmt.Errorf("ibemu: ibv_reg_mr: %d regions: %w", mrSlots, unix.ENOMEM)
	}
	m.key = key
	e := n.entry(key)
	binary.LittleEndian.PutUint32(e[4:], uint32(m.access))
	binary.LittleEndian.PutUint64(e[8:], m.addr)
	binary.LittleEndian.PutUint64(e[16:], uint64(m.len))
	atomicU32(e[0:]).Store(key)
	n.mrs[key] = m
	return m, nil
}

func (n *nic) slotFree(key uint32) bool { return atomicU32(n.entry(key)[0:]).Load() == 0 }

func (m *mr) Dereg() error {
	if m.dereg.Swap(true) {
		return fmt.Errorf("ibemu: ibv_dereg_mr of a region already deregistered: %w", unix.EINVAL)
	}
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	atomicU32(m.n.entry(m.key)[0:]).Store(0)
	delete(m.n.mrs, m.key)
	if m.release != nil {
		// Requests of this process that still run against it fail their
		// key check first (dereg is set); a peer's mapping is its own.
		m.n.deadMRs = append(m.n.deadMRs, m.release)
	}
	return nil
}

// localMR checks an SGE against this NIC's regions.
func (n *nic) localMR(s ibv.SGE, write bool) (*mr, bool) {
	n.mu.Lock()
	m := n.mrs[s.LKey]
	n.mu.Unlock()
	if m == nil || m.dereg.Load() || s.Addr < m.addr || s.Addr+uint64(s.Len) > m.addr+uint64(m.len) {
		return nil, false
	}
	if write && m.access&ibv.AccessLocalWrite == 0 {
		return nil, false
	}
	return m, true
}

func (m *mr) covers(addr uint64, n uint32) bool {
	return addr >= m.addr && addr+uint64(n) <= m.addr+uint64(m.len)
}

// bytes is the memory an SGE names (checked by localMR).
func (m *mr) bytes(addr uint64, n uint32) []byte {
	o := int(addr - m.addr)
	return m.mem[o : o+int(n) : o+int(n)]
}

func (n *nic) CreateCQ(cqe int) (ibv.CQ, error) {
	if cqe < 1 || cqe > 1<<20 {
		return nil, fmt.Errorf("ibemu: ibv_create_cq of %d entries: %w", cqe, unix.EINVAL)
	}
	return &cq{n: n, size: cqe}, nil
}

func (n *nic) WaitEvent(timeout time.Duration) (ibv.Event, bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		n.scanEvents()
		select {
		case e := <-n.events:
			return e, true, nil
		case <-n.done:
			return ibv.Event{}, false, errClosed
		default:
		}
		left := time.Until(deadline)
		if left <= 0 {
			return ibv.Event{}, false, nil
		}
		select {
		case e := <-n.events:
			return e, true, nil
		case <-n.done:
			return ibv.Event{}, false, errClosed
		case <-time.After(min(left, time.Millisecond)):
		}
	}
}

// scanEvents raises the access errors peers recorded in this NIC's QP
// segments (a peer's NIC cannot reach this process's event queue).
func (n *nic) scanEvents() {
	n.mu.Lock()
	var raise []uint32
	for num, q := range n.qps {
		c := atomicU32(q.seg.mem[segEvents:]).Load()
		if c != n.seenEvents[num] {
			if n.seenEvents == nil {
				n.seenEvents = map[uint32]uint32{}
			}
			n.seenEvents[num] = c
			raise = append(raise, num)
		}
	}
	n.mu.Unlock()
	for _, num := range raise {
		n.raise(ibv.Event{Type: ibv.EventQPAccessErr, QPNum: num})
	}
}

func (n *nic) raise(e ibv.Event) {
	select {
	case n.events <- e:
	default: // a device drops events nobody reads, too
	}
}

func (n *nic) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return errClosed
	}
	n.closed = true
	busy := len(n.qps) > 0 || len(n.mrs) > 0
	remotes := n.remotes
	n.remotes = map[uint32]*remoteNIC{}
	n.mu.Unlock()
	close(n.done)
	n.ln.Close() // which removes the socket: a later NIC may take its id
	n.wg.Wait()
	if busy {
		// Requests may still run against the peers' memory: leave it
		// mapped.
		return fmt.Errorf("ibemu: ibv_close_device with queue pairs or regions still open: %w", unix.EBUSY)
	}
	for _, r := range remotes {
		r.close()
	}
	for _, s := range n.deadSegs {
		s.unmap()
	}
	for _, f := range n.deadMRs {
		f()
	}
	n.table.unmap()
	return nil
}

var errClosed = errors.New("ibemu: device closed")

// coin is a seeded Bernoulli draw with probability 1/k.
func (n *nic) coin(k int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.IntN(k) == 0
}

func (n *nic) intn(k int) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rng.IntN(k)
}

func atomicU32(b []byte) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[0])) }
func atomicU64(b []byte) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&b[0])) }

// segment is shared memory a NIC's peers map.
type segment struct {
	fd  int
	mem []byte
}

func mapFD(fd int, off int64, n int) ([]byte, error) {
	return unix.Mmap(fd, off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func (s *segment) unmap() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		unix.Close(s.fd)
		s.mem = nil
	}
}
