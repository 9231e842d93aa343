package shm

import (
	"context"
	"sync/atomic"
	"time"
	"unsafe"
)

// Split copies: a block's receiver shares the copy with its sender, which
// writes chunks of the block into the receiver's output with
// process_vm_writev while the receiver reads the others with
// process_vm_readv.
//
// A block (blocks_linux.go) is one kernel copy on the receiver's core
// while its sender waits in Reserve or Flush with nothing to do: in a
// 2-rank broadcast the root's core idles through every copy. Two cores
// copying half each took 22-26 µs for a MiB where one took 60-89, 0.79 ms
// for 16 MiB where one took 1.6, 6.7 ms for 64 MiB where one took 13.5
// (scripts/split-copy.c on these VMs: a MiB of source and a MiB of
// destination overflow one core's 2 MiB L2, half of each does not; above
// that each core has its own stream to memory). Measured end to end in
// docs/performance.md ("The kernel's copy on both cores").
//
// A block is cut into chunks (halves, at least splitChunkMin each)
// that either side claims, one at a time, from a counter in the
// receiver's half of the segment header (sideHelp, a line of its own):
// the receiver from the moment it sees the block, the sender whenever it
// waits on the connection (Reserve, Flush) while the block has chunks
// left. So the two sides share the copy as their time allows: a sender
// busy elsewhere (its own copy of the block into its output, out of
// place) takes few chunks or none, and the receiver never waits for more
// than the one chunk the sender is writing. The receiver waits, after its
// last claim, for the sender's count of chunks done to reach what the
// sender claimed; a sender's copy is one system call that always ends,
// and that wait has the connection's usual checks (the peer's abort or
// exit, this endpoint's close, ctx).
//
// The counter holds the request's number (gen, high 32 bits) and the next
// chunk (low 32 bits; helpClosed while the fields change and after the
// block). A sender reads it, then the fields, then claims with a
// compare-and-swap on the value it read, so a claim succeeds only on the
// fields of that request. It checks the slice against its own record of
// what it posted by reference (not the descriptor, which the receiver
// can write) before it claims. If the kernel refuses a write, the sender
// says so (helpFailed), neither side splits on this connection again,
// and the receiver copies the whole block itself.
//
// What a sender writes is its own data, into memory the receiver named;
// what it reads is only what it posted and has not seen released. Where
// the receiver may read the sender's memory at all (the probe), nothing
// here reaches further than that.
const (
	sideHelp    = 64 // the request: a line of its own in the receiver's half
	helpWordOff = 0  // uint64: gen<<32 | next chunk
	helpSlice   = 8  // uint32: the slice's number (the receiver's head)
	helpChunk   = 12 // uint32: the chunk size
	helpDst     = 16 // uint64: the receiver's address of the block's first byte
	helpLen     = 24 // uint64: the block's length
	helpDone    = 32 // uint32: chunks the sender has copied
	helpFailed  = 36 // uint32: 1 once a sender's write failed
	helpClosed  = 1<<32 - 1

	// splitMinBytes is the smallest block split: below it a chunk's
	// system call and the handshake cost about what they save.
	splitMinBytes = 128 << 10
	splitChunkMin = 64 << 10

	// splitGrace: how long a receiver whose wait failed still waits for
	// the chunks its sender took (awaitHelp).
	splitGrace = time.Second
)

// sentRef is what this side posted by reference in a slot, for the
// peer's requests.
type sentRef struct {
	p     unsafe.Pointer // the slice's first byte (nil: none); cleared by Flush
	n     int
	slice uint32
}

func (c *conn) helpAt(side, off int) unsafe.Pointer {
	return unsafe.Pointer(&c.seg.mem[sideOff(side)+sideHelp+off])
}

func (c *conn) helpWord(side int) *atomic.Uint64 {
	return (*atomic.Uint64)(c.helpAt(side, helpWordOff))
}

func (c *conn) helpU32(side, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(c.helpAt(side, off))
}

// splits reports whether this side offers its sender a share of a block
// of n bytes.
func (c *conn) splits(n int) bool {
	return !c.e.o.NoSplit && !c.noSplit && n >= splitMinBytes && c.pid > 0
}

// splitChunk is the chunk size of a block of n bytes: half of it, so that
// a sender that is there at once takes the second half in one system
// call (quarters took 1.3-1.5 times as long as halves for a MiB in place,
// each chunk a call on each side) and one that comes late finds it taken.
func splitChunk(n int) int {
	return max(splitChunkMin, (n/2+pageSize-1)&^(pageSize-1))
}

// fetchSplit copies a block of len(dst) bytes at addr in the sender's
// memory into dst, sharing the chunks with the sender.
func (c *conn) fetchSplit(ctx context.Context, dst []byte, addr uint64) error {
	me := c.seg.side
	w := c.helpWord(me)
	c.helpGen++
	g := uint64(c.helpGen) << 32
	w.Store(g | helpClosed)
	chunk := splitChunk(len(dst))
	n := uint32((len(dst) + chunk - 1) / chunk)
	c.helpU32(me, helpSlice).Store(c.head)
	c.helpU32(me, helpChunk).Store(uint32(chunk))
	(*atomic.Uint64)(c.helpAt(me, helpDst)).Store(uint64(uintptr(unsafe.Pointer(&dst[0]))))
	(*atomic.Uint64)(c.helpAt(me, helpLen)).Store(uint64(len(dst)))
	done, failed := c.helpU32(me, helpDone), c.helpU32(me, helpFailed)
	done.Store(0)
	failed.Store(0)
	w.Store(g)
	if splitAsked != nil {
		splitAsked(w)
	}
	var mine, claims uint32
	var err error
	for {
		v := w.Load()
		i := uint32(v)
		if i >= n || err != nil {
			// Closed: no more claims, also on this side's failure.
			for !w.CompareAndSwap(v, g|helpClosed) {
				v = w.Load()
			}
			claims = min(uint32(v), n)
			break
		}
		if !w.CompareAndSwap(v, v+1) {
			continue
		}
		off := int(i) * chunk
		err = readPeer(c.pid, dst[off:min(off+chunk, len(dst))], addr+uint64(off))
		mine++
	}
	theirs := claims - mine
	if theirs > 0 {
		if werr := c.awaitHelp(ctx, done, theirs); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if failed.Load() != 0 {
		c.noSplit = true
		return readPeer(c.pid, dst, addr)
	}
	c.splitBy.Add(int64(theirs))
	return nil
}

// awaitHelp waits until the sender has copied want chunks. A sender
// that took a chunk writes it in one system call, so this returns early
// only where that may never end: the peer's process exited, or a failure
// (the peer's abort, this endpoint's close, ctx) has lasted splitGrace,
// which outlasts any write but one of a process stopped mid-way.
func (c *conn) awaitHelp(ctx context.Context, done *atomic.Uint32, want uint32) error {
	var since time.Time
	for i := 1; ; i++ {
		if done.Load() >= want {
			return nil
		}
		pause()
		if i%256 != 0 {
			continue
		}
		if err := c.check(ctx, false); err != nil {
			if since.IsZero() {
				since = time.Now()
			}
			if hungUp(c.ctl) || time.Since(since) >= splitGrace {
				return err
			}
		}
		yieldCPU()
	}
}

// serveSplit copies chunks of the block the peer is receiving from this
// side, while any are left unclaimed: the sender's side of fetchSplit. It
// runs wherever this side waits on the connection.
func (c *conn) serveSplit() {
	peer := 1 - c.seg.side
	w := c.helpWord(peer)
	if c.noSplit || len(c.sent) == 0 {
		return // nothing posted by reference: no line of the peer's to read
	}
	for {
		v := w.Load()
		if uint32(v) == helpClosed || c.noSplit {
			return
		}
		slice := c.helpU32(peer, helpSlice).Load()
		chunk := int(c.helpU32(peer, helpChunk).Load())
		dst := (*atomic.Uint64)(c.helpAt(peer, helpDst)).Load()
		n := int((*atomic.Uint64)(c.helpAt(peer, helpLen)).Load())
		r := &c.sent[slice%uint32(len(c.sent))]
		if r.p == nil || r.slice != slice || r.n != n || c.tail-slice > c.tx.slots || chunk < pageSize || n <= 0 {
			return // not a block of this side's, or the fields are changing: the receiver copies it
		}
		i := uint32(v)
		if uint64(i)*uint64(chunk) >= uint64(n) || !w.CompareAndSwap(v, v+1) {
			return
		}
		off := int(i) * chunk
		err := splitWrite(c.pid, unsafe.Slice((*byte)(r.p), r.n)[off:min(off+chunk, n)], dst+uint64(off))
		if err != nil {
			c.noSplit = true
			if c.e.o.Logger != nil {
				c.e.o.Logger.Debug("goccl: shm: split copies off on this connection", "peer", c.peer, "channel", c.ch, "err", err)
			}
			c.helpU32(peer, helpFailed).Store(1)
		} else {
			c.splitFor.Add(1)
		}
		c.helpU32(peer, helpDone).Add(1)
	}
}

// BusyAfterPosts implements transport.SplitCopier.
func (c *conn) BusyAfterPosts(busy bool) { c.busyAfter = busy }

// recordRef notes that this side posted b by reference as slice number
// c.tail, for serveSplit.
func (c *conn) recordRef(b []byte) {
	if c.sent == nil {
		c.sent = make([]sentRef, c.tx.slots)
	}
	r := &c.sent[c.tail%uint32(len(c.sent))]
	r.p, r.n, r.slice = nil, len(b), c.tail
	if len(b) > 0 {
		r.p = unsafe.Pointer(&b[0])
	}
}

// splitWrite is writePeer; tests make it fail. splitAsked, if set, runs
// when a receiver has published a request (tests hold the receiver there
// until the sender has claimed a chunk, whatever the machine's load).
var (
	splitWrite = writePeer
	splitAsked func(w *atomic.Uint64)
)

// writePeer copies src into process pid's memory at addr.
func writePeer(pid int, src []byte, addr uint64) error { return movePeer(pid, src, addr, true) }
