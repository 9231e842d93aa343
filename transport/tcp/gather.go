//go:build unix

package tcp

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goccl/goccl/internal/clock"
	"github.com/goccl/goccl/internal/wire"
)

// Gathering: small slices of a one-way stream, written several at a time.
//
// Every slice a sender writes is one writev(2), and on loopback one
// segment, whose transmit and receive both run on the sender's core: for
// an 8-byte slice that is nearly all of the operation's CPU. A stream of
// operations in which a rank only sends (the other ranks of a stream of
// reduces, a broadcast's root) pays it once a slice, where Open MPI's
// senders, their receiver behind, find their sockets full and write
// what piled up in one call: 4 ranks on 2 cores reduced 8 bytes in 3.4-4.4
// µs an operation against Open MPI's 1.9-2.6 (docs/performance.md,
// "The 4-rank 8-byte reduce over TCP"). A sender cannot tell from its
// socket that its receiver is behind (SIOCOUTQ reads non-zero under
// delayed ACKs whether it is or not: "the receiver's window, tried and
// not kept"), so the sender judges by its own traffic instead:
//
//   - a channel gathers once it has sent more than gatherAfter small
//     slices (up to gatherSlice bytes) in a row, each within gatherGap of
//     the one before, with no slice received from any peer in between:
//     a one-way stream, which no operation of this rank waits on;
//   - a gathered slice is copied (its operation returns, and the caller's
//     buffer or the staging slot is free again) into its socket's gather
//     buffer, and the buffer goes out in one write once it holds
//     gatherMax slices;
//   - and, whatever comes next, within gatherFor: the channel's next wait
//     of any kind (every wait moves the channel's outgoing data first,
//     outbox.progress, as another transport's wait does through
//     Endpoint.Progress), any slice that is not gathered (written after
//     the gathered ones, in order), a graceful Close (which waits up to
//     closeFlush for the kernel to take them), or else a timer, which
//     writes what the kernel takes at once and leaves the rest to the
//     channel's next wait or its own next try, so that a peer that reads
//     nothing holds up no other peer's slices.
//
// So a rank never waits on anything while slices it gathered are still
// with it, and no slice waits more than gatherFor for a rank that makes
// no further call. The receiver sees the same stream of slices as ever.
// Operations that receive anything on the channel (all-reduce,
// all-gather, a chain's middle ranks; over this transport or, in a
// communicator that mixes them, another) reset the count at every slice
// they read and never gather; a stream of one-way sends slower than one per
// gatherGap never does either, nor do the point-to-point channels (each
// connection there has a goroutine of its own, which may never wait on
// anything that would flush it), TLS connections or device ones.
const (
	gatherSlice = 512
	gatherAfter = 4
	gatherMax   = 16
)

// gatherGap and gatherFor are variables for the tests' sake only.
var (
	gatherGap = 50 * time.Microsecond
	gatherFor = 50 * time.Microsecond
)

// slicesGathered counts the slices this process has gathered.
var slicesGathered atomic.Int64

// SlicesGathered returns how many small slices this process has gathered
// to write several at a time, for tests and diagnostics.
func SlicesGathered() int64 { return slicesGathered.Load() }

// mayGather counts a slice of n bytes about to be sent and reports
// whether it may be gathered (see above). Channel goroutine only.
func (c *conn) mayGather(n int) bool {
	if !c.gathers {
		return false
	}
	ob := c.ob
	if n > gatherSlice {
		ob.oneWay = 0
		return false
	}
	now := clock.Now()
	gap := now - ob.lastSmall
	ob.lastSmall = now
	ob.oneWay++
	return ob.oneWay > gatherAfter && gap < int64(gatherGap)
}

// gather copies a slice into the socket's gather buffer, unless the socket
// has slices queued (which go first) or has failed, and writes the buffer
// once it is full. It reports whether the slice was taken, and whether it
// is the first the buffer holds (the caller registers the socket with its
// outbox) or it filled the buffer (the caller takes it off). A write that
// the kernel did not take whole leaves the rest queued, listed by the
// caller.
func (s *sock) gather(hdr, data []byte) (taken, first, wrote bool) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.err != nil || len(s.queue) > 0 || s.closed.Load() {
		return false, false, false
	}
	first = s.ngathered == 0
	s.gathered = append(append(s.gathered, hdr...), data...)
	s.ngathered++
	slicesGathered.Add(1)
	if s.ngathered >= gatherMax {
		s.queueGatheredLocked()
		s.pumpLocked()
		wrote = true
	}
	return true, first, wrote
}

// queueGatheredLocked moves the gathered slices into the queue as one job
// of their bytes, which the queue must write before anything pushed
// after; the caller holds wmu. The buffer is reused once written.
func (s *sock) queueGatheredLocked() {
	if s.ngathered == 0 {
		return
	}
	j := job{hoff: wire.SliceHeaderLen, data: s.gathered, slot: -1, gathered: true}
	s.gathered, s.ngathered = nil, 0 // pumpLocked hands the array back once written
	s.enqueueLocked(j)
}

// flushGathered queues and writes what the socket has gathered, and
// reports whether anything is left to write or the socket has failed.
// Channel goroutine only.
func (s *sock) flushGathered() (pending bool) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.queueGatheredLocked()
	s.pumpLocked()
	return len(s.queue) > 0 || s.err != nil
}

// gatherList is a channel's sockets that have gathered slices, for its
// waits and its timer.
type gatherList struct {
	mu    sync.Mutex
	socks []*sock // under mu; a socket may be listed after its slices went
	n     atomic.Int32
	timer *time.Timer // fires gatherFor after a socket joins the list
	armed bool        // timer is set (under mu)
}

// addGathering lists s, whose gather buffer has just taken its first slice.
// Channel goroutine only.
func (ob *outbox) addGathering(s *sock) {
	g := &ob.gather
	g.mu.Lock()
	if !s.gatherListed {
		s.gatherListed = true
		g.socks = append(g.socks, s)
		g.n.Store(int32(len(g.socks)))
		switch {
		case g.timer == nil:
			g.timer = time.AfterFunc(gatherFor, ob.gatherExpired)
		case !g.armed:
			g.timer.Reset(gatherFor)
		}
		g.armed = true
	}
	g.mu.Unlock()
}

// dropGathering takes s off the list once its buffer went out full.
// Channel goroutine only.
func (ob *outbox) dropGathering(s *sock) {
	g := &ob.gather
	g.mu.Lock()
	if s.gatherListed {
		s.gatherListed = false
		for i, t := range g.socks {
			if t == s {
				last := len(g.socks) - 1
				g.socks[i], g.socks[last] = g.socks[last], nil
				g.socks = g.socks[:last]
				break
			}
		}
		g.n.Store(int32(len(g.socks)))
		if len(g.socks) == 0 {
			g.timer.Stop()
			g.armed = false
		}
	}
	g.mu.Unlock()
}

// takeGathering empties the list and returns what it held.
func (ob *outbox) takeGathering() []*sock {
	g := &ob.gather
	g.mu.Lock()
	socks := g.socks
	g.socks = nil
	g.n.Store(0)
	for _, s := range socks {
		s.gatherListed = false
	}
	if g.timer != nil {
		g.timer.Stop()
	}
	g.armed = false
	g.mu.Unlock()
	return socks
}

// flushGathering writes what the channel's sockets have gathered, listing
// those the kernel did not take whole, or that failed, as pending (where
// progress writes the rest, or takes the error as the channel's).
// Channel goroutine only: every wait calls it first (outbox.progress).
func (ob *outbox) flushGathering() {
	for _, s := range ob.takeGathering() {
		if s.flushGathered() {
			ob.list(s)
		}
	}
}

// gatherExpired is the timer's: the channel made no call for gatherFor
// with slices gathered. It writes them from the timer's goroutine,
// without blocking (a peer that reads nothing must not hold up the
// others' slices), and puts a socket it could not finish, or that
// failed, back on the list, with the timer set again: the channel's next
// wait then takes it over (and its error), or the timer tries again.
func (ob *outbox) gatherExpired() {
	var left []*sock
	retry := false
	for _, s := range ob.takeGathering() {
		unwritten, failed := s.writeGathered()
		if unwritten || failed {
			left = append(left, s)
		}
		retry = retry || unwritten
	}
	if len(left) == 0 {
		return
	}
	g := &ob.gather
	g.mu.Lock()
	for _, s := range left {
		if !s.gatherListed && !s.closed.Load() {
			s.gatherListed = true
			g.socks = append(g.socks, s)
		}
	}
	g.n.Store(int32(len(g.socks)))
	if retry && len(g.socks) > 0 {
		// A failed socket waits for the channel's next wait, which
		// takes its error; only unwritten slices need the timer again.
		g.timer.Reset(gatherRetry)
		g.armed = true
	}
	g.mu.Unlock()
}

// gatherRetry is how soon the timer tries again where the kernel did not
// take everything a socket gathered.
const gatherRetry = time.Millisecond

// drainGathered writes what the socket gathered, waiting for the kernel
// to take it, until it is all out, the socket fails or closes, the
// deadline passes, or the queue's head is another job (the channel's
// goroutine then writes the rest, before that job). For a graceful
// Close, on every socket whether listed or not (the timer may have taken
// it off the list).
func (s *sock) drainGathered(deadline time.Time) {
	for {
		if more, _ := s.writeGathered(); !more || time.Now().After(deadline) || s.enter() != nil {
			return
		}
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
		_, err := unix.Poll(fds, int(pollSlice/time.Millisecond))
		s.exit()
		if err != nil && err != unix.EINTR {
			return
		}
	}
}

// writeGathered queues what the socket gathered and writes what the
// kernel takes of it now, and reports whether some of it is left
// unwritten and whether the socket has failed. Any goroutine may call it.
func (s *sock) writeGathered() (unwritten, failed bool) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.queueGatheredLocked()
	s.pumpGatheredLocked()
	failed = s.err != nil
	return !failed && len(s.queue) > 0 && s.queue[0].gathered, failed
}

// pumpGatheredLocked writes the gathered jobs at the head of the queue and
// nothing else, so that goroutines other than the channel's may call it:
// another job's completion touches the channel's own state (its staging
// slots, its credits). The caller holds wmu.
func (s *sock) pumpGatheredLocked() {
	if s.err != nil || len(s.queue) == 0 || !s.queue[0].gathered {
		return
	}
	if err := s.enter(); err != nil {
		s.setErr(err)
		return
	}
	defer s.exit()
	for len(s.queue) > 0 && s.queue[0].gathered {
		if !s.writeJobLocked(&s.queue[0]) {
			return
		}
		s.popLocked() // a gathered job has no slot, nothing of the channel's
	}
	if len(s.queue) == 0 {
		s.queue = s.qbuf[:0]
	}
}

// closeFlush bounds how long a graceful Close waits, over all its
// sockets, for gathered slices to go out: a peer that reads nothing for
// that long loses them, and sees the connection lost rather than closed.
const closeFlush = 10 * time.Second
