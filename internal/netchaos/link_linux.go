//go:build linux

package netchaos

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// End is one end of a link.
type End struct {
	// Netns is the network namespace the end lives in: a name made by
	// `ip netns add` (looked up in /run/netns, then /var/run/netns), or a
	// path such as /proc/PID/ns/net.
	Netns string
	// Addr is the end's IPv4 address; the other end reaches it through
	// the link.
	Addr netip.Addr
	// Dev names the TUN device; "chaos0" when empty.
	Dev string
}

// Counters count what one direction of a link did with the packets it
// read. Read = Passed + Dropped + Failed + the packets still delayed.
type Counters struct {
	Read      uint64 // IP packets read from the sending end's TUN device
	Passed    uint64 // written into the receiving end's TUN device
	Dropped   uint64 // dropped by Impairment.Loss
	Reordered uint64 // sent at once ahead of delayed packets (Impairment.Reorder); also counted in Passed
	Failed    uint64 // writes into the receiving end that failed
}

// Add returns the sum of c and o.
func (c Counters) Add(o Counters) Counters {
	return Counters{Read: c.Read + o.Read, Passed: c.Passed + o.Passed, Dropped: c.Dropped + o.Dropped,
		Reordered: c.Reordered + o.Reordered, Failed: c.Failed + o.Failed}
}

func (c Counters) String() string {
	return fmt.Sprintf("read %d passed %d dropped %d reordered %d failed %d", c.Read, c.Passed, c.Dropped, c.Reordered, c.Failed)
}

// Stats are a link's counters for each direction: AB from end a to end b,
// BA back.
type Stats struct{ AB, BA Counters }

// Total adds up both directions.
func (s Stats) Total() Counters { return s.AB.Add(s.BA) }

// Link forwards packets between two TUN devices in two network namespaces,
// impairing them on the way. Its methods are safe for concurrent use.
type Link struct {
	imp  Impairment
	tuns [2]*os.File // the TUN devices of end a and end b; closed by Close
	dirs [2]*direction
	done chan struct{} // closed by Close to stop the goroutines
	wg   sync.WaitGroup

	closeOnce sync.Once
	closeErr  error // what Close returns; written once, inside closeOnce

	mu  sync.Mutex // guards err
	err error      // the first error that stopped a forwarding goroutine, other than Close
}

// direction is one way through the link: its reader goroutine reads packets
// from src and writes them to dst at once or queues them for its releaser
// goroutine, which writes them when due.
type direction struct {
	src, dst *os.File
	dec      *decider      // owned by the reader goroutine
	wake     chan struct{} // the reader's nudge to the releaser: the queue changed

	mu sync.Mutex // guards q
	q  delayQueue

	read, passed, dropped, reordered, failed atomic.Uint64
}

// DefaultDev is the TUN device's name when End.Dev is empty.
const DefaultDev = "chaos0"

// mtu is the TUN devices' MTU, and readBuf the size of the buffers packets
// are read into: far more than an MTU-sized IP packet needs, so that
// nothing is ever cut short.
const (
	mtu     = 1500
	readBuf = 64 << 10
)

// New makes a TUN device in a's namespace with address a.Addr and one in
// b's with b.Addr, routes each end's packets for the other end's address
// through its device, and starts forwarding between the two with imp
// applied to each direction. It returns once the link is up; on failure it
// returns an error naming the end and the step, and leaves nothing behind.
// The caller must Close the link.
func New(a, b End, imp Impairment) (*Link, error) {
	if err := imp.Validate(); err != nil {
		return nil, err
	}
	ends := [2]End{a, b}
	for i := range ends {
		if ends[i].Dev == "" {
			ends[i].Dev = DefaultDev
		}
		if !ends[i].Addr.Is4() {
			return nil, fmt.Errorf("netchaos: end %d (netns %q) has address %v, want an IPv4 address", i, ends[i].Netns, ends[i].Addr)
		}
	}
	if a.Addr == b.Addr {
		return nil, fmt.Errorf("netchaos: both ends have address %v", a.Addr)
	}
	l := &Link{imp: imp, done: make(chan struct{})}
	for i, e := range ends {
		f, err := openTUN(e, ends[1-i].Addr)
		if err != nil {
			if i == 1 {
				l.tuns[0].Close()
			}
			return nil, err
		}
		l.tuns[i] = f
	}
	for i := range l.dirs {
		d := &direction{src: l.tuns[i], dst: l.tuns[1-i], dec: newDecider(imp, uint64(i)), wake: make(chan struct{}, 1)}
		l.dirs[i] = d
		l.wg.Go(func() { l.forward(d) })
		if imp.Delay > 0 || imp.Jitter > 0 {
			l.wg.Go(func() { l.release(d) })
		}
	}
	return l, nil
}

// Impairment returns what the link does to packets.
func (l *Link) Impairment() Impairment { return l.imp }

// Stats returns the link's counters so far.
func (l *Link) Stats() Stats {
	return Stats{AB: l.dirs[0].counters(), BA: l.dirs[1].counters()}
}

func (d *direction) counters() Counters {
	return Counters{Read: d.read.Load(), Passed: d.passed.Load(), Dropped: d.dropped.Load(),
		Reordered: d.reordered.Load(), Failed: d.failed.Load()}
}

// Close stops forwarding, deletes both TUN devices and returns when the
// link's goroutines have stopped. It returns the first error that stopped
// a forwarding goroutine early, if any, or an error closing the devices.
// Later calls return the same.
func (l *Link) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		// Closing the files wakes the readers blocked in Read (the files
		// are in the runtime's poller).
		err := errors.Join(l.tuns[0].Close(), l.tuns[1].Close())
		l.wg.Wait()
		l.mu.Lock()
		l.closeErr = errors.Join(l.err, err)
		l.mu.Unlock()
	})
	return l.closeErr
}

func (l *Link) closing() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *Link) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
}

// forward is the reader goroutine of d: started by New, it returns when
// reading fails, which Close makes happen.
func (l *Link) forward(d *direction) {
	buf := make([]byte, readBuf)
	for {
		n, err := d.src.Read(buf)
		if err != nil {
			if !l.closing() {
				l.fail(fmt.Errorf("netchaos: reading %s: %w", d.src.Name(), err))
			}
			return
		}
		d.read.Add(1)
		f := d.dec.next()
		switch {
		case f.drop:
			d.dropped.Add(1)
		case f.reordered || f.delay == 0:
			if f.reordered {
				d.reordered.Add(1)
			}
			d.write(buf[:n])
		default:
			pkt := append([]byte(nil), buf[:n]...)
			d.mu.Lock()
			d.q.push(time.Now().Add(f.delay), pkt)
			d.mu.Unlock()
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
	}
}

// release is the releaser goroutine of d: started by New when there is a
// delay, it writes each queued packet when due and returns when Close is
// called.
func (l *Link) release(d *direction) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		due, ok := d.q.peek()
		now := time.Now()
		if ok && !due.After(now) {
			pkt := d.q.pop()
			d.mu.Unlock()
			d.write(pkt)
			continue
		}
		d.mu.Unlock()
		var fire <-chan time.Time
		if ok {
			timer.Reset(due.Sub(now))
			fire = timer.C
		}
		select {
		case <-l.done:
			return
		case <-d.wake:
		case <-fire:
		}
	}
}

// write hands one packet to the receiving end's kernel. A failed write is
// counted rather than fatal: it is one lost packet, and the receiving end
// may be busy or briefly down.
func (d *direction) write(pkt []byte) {
	if _, err := d.dst.Write(pkt); err != nil {
		d.failed.Add(1)
		return
	}
	d.passed.Add(1)
}
