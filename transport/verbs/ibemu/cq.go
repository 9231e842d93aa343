package ibemu

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// cq is a completion queue: the completions of this process's own
// requests (local), and those peers append to the inbound rings of its
// QPs.
type cq struct {
	n    *nic
	size int

	mu      sync.Mutex // guards the fields below
	local   []localWC
	qps     []*qp
	overrun bool
	gone    bool

	// For idle, read without mu: len(local), overrun or gone, and qps.
	nlocal  atomic.Int32
	flagged atomic.Bool
	snap    atomic.Pointer[[]*qp]
}

type localWC struct {
	wc  ibv.WC
	q   *qp
	seq uint64 // the request's sequence on q
}

var _ ibv.CQ = (*cq)(nil)

func (c *cq) attach(q *qp) {
	c.mu.Lock()
	c.qps = append(c.qps, q)
	c.publish()
	c.mu.Unlock()
}

// publish copies qps for idle; mu is held.
func (c *cq) publish() {
	qs := append([]*qp(nil), c.qps...)
	c.snap.Store(&qs)
}

func (c *cq) detach(q *qp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.qps {
		if x == q {
			c.qps = append(c.qps[:i], c.qps[i+1:]...)
			c.publish()
			return
		}
	}
}

// push appends a completion of q's request seq. Called with q.mu held.
func (c *cq) push(w ibv.WC, q *qp, seq uint64) {
	c.mu.Lock()
	c.local = append(c.local, localWC{w, q, seq})
	c.nlocal.Store(int32(len(c.local)))
	c.mu.Unlock()
}

func (c *cq) Poll(wc []ibv.WC) (int, error) {
	if c.idle() {
		return 0, nil
	}
	// QPs that failed with requests queued flush them now (their timers
	// may be far off).
	c.mu.Lock()
	var failed []*qp
	for _, q := range c.qps {
		if q.sqLen.Load() > 0 && q.view.state() == ibv.QPErr {
			failed = append(failed, q)
		}
	}
	if failed != nil {
		c.mu.Unlock()
		for _, q := range failed {
			q.mu.Lock()
			if !q.gone {
				q.drainLocked()
			}
			q.mu.Unlock()
		}
		c.mu.Lock()
	}
	defer c.mu.Unlock()
	defer func() { c.nlocal.Store(int32(len(c.local))) }()
	if c.gone {
		return 0, fmt.Errorf("ibemu: ibv_poll_cq on a destroyed CQ")
	}
	if c.overrun {
		return 0, fmt.Errorf("ibemu: CQ overrun (more than %d completions were waiting)", c.size)
	}
	pending := len(c.local)
	for _, q := range c.qps {
		v := q.view
		h := v.ringHead().Load()
		for k := uint64(0); k <= uint64(c.size) && v.ringValid(h+k); k++ {
			pending++
		}
		if q.view.state() == ibv.QPErr {
			// Receives still posted on a failed QP complete as flushed.
			for {
				id, ok := v.takeRecv()
				if !ok {
					break
				}
				c.local = append(c.local, localWC{wc: ibv.WC{ID: id, Status: ibv.WRFlushErr, Opcode: ibv.WCRecv, QPNum: q.num}, q: q})
				pending++
			}
		}
		if atomicU32(v.mem[segOverrun:]).Load() != 0 {
			pending = c.size + 1
		}
	}
	if pending > c.size {
		c.overrun = true
		c.flagged.Store(true)
		for _, q := range c.qps {
			q.view.setState(ibv.QPErr)
		}
		c.n.raise(ibv.Event{Type: ibv.EventCQErr})
		return 0, fmt.Errorf("ibemu: CQ overrun: %d completions waiting in a CQ of %d", pending, c.size)
	}
	n := 0
	for n < len(wc) && n < len(c.local) {
		l := c.local[n]
		wc[n] = l.wc
		n++
		if l.q != nil && l.seq > 0 && l.q.retired.Load() < l.seq {
			// A completion retires its request and every unsignaled one
			// before it from the send queue.
			l.q.retired.Store(l.seq)
		}
	}
	// Keep the rest at the front of the array, so that pushes reuse it.
	c.local = c.local[:copy(c.local, c.local[n:])]
	for _, q := range c.qps {
		v := q.view
		for n < len(wc) {
			h := v.ringHead().Load()
			if !v.ringValid(h) {
				break
			}
			wc[n] = v.ringWC(h, q.num)
			v.ringHead().Store(h + 1)
			n++
		}
	}
	return n, nil
}

func (c *cq) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return fmt.Errorf("ibemu: ibv_destroy_cq of a destroyed CQ")
	}
	if len(c.qps) > 0 {
		return fmt.Errorf("ibemu: ibv_destroy_cq with %d QPs still using it", len(c.qps))
	}
	c.gone = true
	c.flagged.Store(true)
	return nil
}

// idle reports, without the lock, that a poll would find nothing: no
// local completion, no inbound one, no failed QP with requests queued,
// no overrun. Polls of an idle queue are the common case, and each must
// not take the lock or read more than the one line a peer writes next.
func (c *cq) idle() bool {
	if c.nlocal.Load() != 0 || c.flagged.Load() {
		return false
	}
	p := c.snap.Load()
	if p == nil {
		return !c.flagged.Load() && c.nlocal.Load() == 0
	}
	for _, q := range *p {
		v := q.view
		if v.ringValid(v.ringHead().Load()) || v.state() == ibv.QPErr || atomicU32(v.mem[segOverrun:]).Load() != 0 {
			return false
		}
	}
	return true
}
