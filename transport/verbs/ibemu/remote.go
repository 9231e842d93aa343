package ibemu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// The NIC socket's requests, 9 bytes: a kind and two arguments. Replies
// are 24 bytes (status, size, offset, length) with a descriptor when the
// status is 0.
const (
	reqTable  = 'T' // the region table
	reqQP     = 'Q' // arg: QPN → the QP's segment
	reqRegion = 'R' // arg: key → the memfd holding the region, and where
	reqWatch  = 'W' // no reply; the connection stays open while the NIC lives
	reqLen    = 9
	replyLen  = 24
)

func (n *nic) serve() {
	defer n.wg.Done()
	var conns sync.WaitGroup
	var mu sync.Mutex
	open := map[*net.UnixConn]struct{}{}
	for {
		c, err := n.ln.AcceptUnix()
		if err != nil {
			break
		}
		mu.Lock()
		open[c] = struct{}{}
		mu.Unlock()
		conns.Add(1)
		go func() {
			defer conns.Done()
			n.answer(c)
			mu.Lock()
			delete(open, c)
			mu.Unlock()
			c.Close()
		}()
	}
	mu.Lock()
	for c := range open {
		c.Close()
	}
	mu.Unlock()
	conns.Wait()
}

func (n *nic) answer(c *net.UnixConn) {
	var req [reqLen]byte
	for {
		c.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return
		}
		arg := binary.LittleEndian.Uint32(req[1:])
		var reply [replyLen]byte
		fd := -1
		status := uint32(1)
		n.mu.Lock()
		switch req[0] {
		case reqTable:
			fd, status = n.table.fd, 0
			binary.LittleEndian.PutUint64(reply[4:], uint64(len(n.table.mem)))
		case reqQP:
			if q := n.qps[arg]; q != nil {
				fd, status = q.seg.fd, 0
				binary.LittleEndian.PutUint64(reply[4:], uint64(len(q.seg.mem)))
			}
		case reqRegion:
			if m := n.mrs[arg]; m != nil && !m.dereg.Load() {
				fd, status = m.fd, 0
				binary.LittleEndian.PutUint64(reply[12:], uint64(m.off))
				binary.LittleEndian.PutUint32(reply[20:], uint32(m.len))
			}
		case reqWatch:
			n.mu.Unlock()
			select { // hold the connection open until this NIC closes
			case <-n.done:
			case <-closedOnRead(c):
			}
			return
		}
		n.mu.Unlock()
		binary.LittleEndian.PutUint32(reply[0:], status)
		var oob []byte
		if fd >= 0 {
			oob = unix.UnixRights(fd)
		}
		if _, _, err := c.WriteMsgUnix(reply[:], oob, nil); err != nil {
			return
		}
	}
}

// closedOnRead is closed when c's peer closes (or sends anything).
func closedOnRead(c *net.UnixConn) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		var b [1]byte
		c.Read(b[:])
		close(ch)
	}()
	return ch
}

// remoteNIC is a peer NIC as this one sees it: its region table, the
// regions mapped so far, and whether its process is gone.
type remoteNIC struct {
	id    uint32
	sock  string
	table []byte
	watch *net.UnixConn
	dead  atomic.Int64 // unix nanoseconds when the watch connection broke; 0 while alive

	mu      sync.Mutex
	regions map[uint32]mapping // by key
	maps    [][]byte           // everything mapped, unmapped at close
}

type mapping struct {
	mem  []byte // the whole region
	addr uint64
}

func (r *remoteNIC) deadAt() time.Time {
	if t := r.dead.Load(); t != 0 {
		return time.Unix(0, t)
	}
	return time.Time{}
}

// remoteQP is a connected peer QP, with what its requester last saw of
// the owner's indices, and the region it last wrote into.
type remoteQP struct {
	nic      *remoteNIC
	num      uint32
	view     qpView
	rqTail   uint64
	ringHead uint64
	ringCap  int
	last     mapping
	lastKey  uint32
}

// region is remoteNIC.region, remembering the last region used.
func (r *remoteQP) region(key uint32, addr uint64, n uint32, need ibv.Access) ([]byte, bool) {
	if key == r.lastKey && key != 0 {
		i := int(key&mrSlotMask) * mrEntryLen
		e := r.nic.table[i : i+mrEntryLen]
		base := binary.LittleEndian.Uint64(e[8:])
		size := binary.LittleEndian.Uint64(e[16:])
		access := ibv.Access(binary.LittleEndian.Uint32(e[4:]))
		if atomicU32(e[0:]).Load() == key && access&need == need && addr >= base && addr+uint64(n) <= base+size && base == r.last.addr {
			o := addr - base
			return r.last.mem[o : o+uint64(n) : o+uint64(n)], true
		}
	}
	b, m, ok := r.nic.region(key, addr, n, need)
	if ok {
		r.last, r.lastKey = m, key
	}
	return b, ok
}

func (r *remoteQP) minRNRTimer() int { return int(r.view.u32(segMinRNR) & 31) }

// fail moves the responder's QP to ERR after a remote access error, and
// lets its owner raise the event.
func (r *remoteQP) fail() {
	r.view.setState(ibv.QPErr)
	atomicU32(r.view.mem[segEvents:]).Add(1)
}

// resolve finds QP qpn of NIC id, mapping what it needs of it.
func (n *nic) resolve(id, qpn uint32) (*remoteQP, error) {
	r, err := n.remoteNIC(id)
	if err != nil {
		return nil, err
	}
	fd, size, _, _, err := r.ask(reqQP, qpn)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := mapFD(fd, 0, int(size))
	if err != nil {
		return nil, err
	}
	if binary.LittleEndian.Uint64(mem) != qpMagic || binary.LittleEndian.Uint32(mem[segQPN:]) != qpn {
		unix.Munmap(mem)
		return nil, errors.New("ibemu: malformed QP segment")
	}
	r.mu.Lock()
	r.maps = append(r.maps, mem)
	r.mu.Unlock()
	v := newView(mem)
	if len(mem) < qpSegmentLen(v.rqN, v.ringN) {
		unix.Munmap(mem)
		return nil, errors.New("ibemu: malformed QP segment")
	}
	return &remoteQP{nic: r, num: qpn, view: v, ringCap: v.ringCap()}, nil
}

func (n *nic) remoteNIC(id uint32) (*remoteNIC, error) {
	n.mu.Lock()
	r := n.remotes[id]
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if r != nil {
		return r, nil
	}
	r = &remoteNIC{id: id, sock: filepath.Join(n.p.o.Dir, fmt.Sprintf("%06x.sock", id)), regions: map[uint32]mapping{}}
	fd, size, _, _, err := r.ask(reqTable, 0)
	if err != nil {
		return nil, err
	}
	r.table, err = mapFD(fd, 0, int(size))
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	w, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: r.sock, Net: "unix"})
	if err != nil {
		unix.Munmap(r.table)
		return nil, err
	}
	if _, err := w.Write([]byte{reqWatch, 0, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		w.Close()
		unix.Munmap(r.table)
		return nil, err
	}
	r.watch = w
	go func() {
		var b [1]byte
		w.Read(b[:]) // returns when the peer NIC closes or its process dies
		r.dead.CompareAndSwap(0, time.Now().UnixNano())
	}()
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.remotes[id]; old != nil {
		r.close()
		return old, nil
	}
	n.remotes[id] = r
	return r, nil
}

// ask sends one request and returns the reply's descriptor and fields.
func (r *remoteNIC) ask(kind byte, arg uint32) (fd int, size uint64, off int64, length int, err error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: r.sock, Net: "unix"})
	if err != nil {
		return -1, 0, 0, 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	var req [reqLen]byte
	req[0] = kind
	binary.LittleEndian.PutUint32(req[1:], arg)
	if _, err := c.Write(req[:]); err != nil {
		return -1, 0, 0, 0, err
	}
	var reply [replyLen]byte
	oob := make([]byte, unix.CmsgSpace(4))
	nr, noob, _, _, err := c.ReadMsgUnix(reply[:], oob)
	if err != nil {
		return -1, 0, 0, 0, err
	}
	if nr != replyLen {
		return -1, 0, 0, 0, fmt.Errorf("ibemu: short reply (%d bytes)", nr)
	}
	if binary.LittleEndian.Uint32(reply[0:]) != 0 {
		return -1, 0, 0, 0, fmt.Errorf("ibemu: NIC %06x has no %c %d", r.id, kind, arg)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:noob])
	if err != nil || len(msgs) != 1 {
		return -1, 0, 0, 0, fmt.Errorf("ibemu: reply without a descriptor")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, 0, 0, 0, fmt.Errorf("ibemu: reply without a descriptor")
	}
	return fds[0], binary.LittleEndian.Uint64(reply[4:]), int64(binary.LittleEndian.Uint64(reply[12:])),
		int(binary.LittleEndian.Uint32(reply[20:])), nil
}

// region checks a remote write of n bytes at addr under key against the
// peer's table, as its NIC would, and returns the bytes it lands in.
func (r *remoteNIC) region(key uint32, addr uint64, n uint32, need ibv.Access) ([]byte, mapping, bool) {
	i := int(key&mrSlotMask) * mrEntryLen
	e := r.table[i : i+mrEntryLen]
	if atomicU32(e[0:]).Load() != key {
		return nil, mapping{}, false
	}
	access := ibv.Access(binary.LittleEndian.Uint32(e[4:]))
	base := binary.LittleEndian.Uint64(e[8:])
	size := binary.LittleEndian.Uint64(e[16:])
	if access&need != need || addr < base || addr+uint64(n) > base+size {
		return nil, mapping{}, false
	}
	r.mu.Lock()
	m, ok := r.regions[key]
	r.mu.Unlock()
	if !ok {
		fd, _, off, length, err := r.ask(reqRegion, key)
		if err != nil {
			return nil, mapping{}, false
		}
		page := int64(unix.Getpagesize())
		start := off &^ (page - 1)
		mem, err := mapFD(fd, start, int(off-start)+length)
		unix.Close(fd)
		if err != nil {
			return nil, mapping{}, false
		}
		m = mapping{mem: mem[off-start:], addr: base}
		r.mu.Lock()
		r.regions[key] = m
		r.maps = append(r.maps, mem)
		r.mu.Unlock()
	}
	if atomicU32(e[0:]).Load() != key { // deregistered meanwhile
		return nil, mapping{}, false
	}
	o := addr - m.addr
	return m.mem[o : o+uint64(n) : o+uint64(n)], m, true
}

func (r *remoteNIC) close() {
	if r.watch != nil {
		r.watch.Close()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.maps {
		unix.Munmap(m)
	}
	r.maps = nil
	if r.table != nil {
		unix.Munmap(r.table)
		r.table = nil
	}
}
