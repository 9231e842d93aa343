package netchaos

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Impairment is what a link does to the packets crossing it, in each
// direction; the zero value passes every packet at once. The fields are
// tc-netem(8)'s options of the same names, with probabilities in [0, 1]
// instead of percentages.
type Impairment struct {
	Loss               float64       // probability that a packet is dropped
	Delay              time.Duration // how long a packet is held ...
	Jitter             time.Duration // ... plus a uniform draw from [-Jitter, Jitter], clipped at zero
	Reorder            float64       // probability that a packet is sent at once, ahead of delayed ones; needs Delay
	ReorderCorrelation float64       // weight of the previous reorder draw in the next one, as in netem
	Seed               uint64        // seeds the random streams (one per direction)
}

// String writes the impairment as the netem options it mirrors.
func (imp Impairment) String() string {
	return fmt.Sprintf("loss %g%% delay %v %v reorder %g%% %g%% seed %d",
		100*imp.Loss, imp.Delay, imp.Jitter, 100*imp.Reorder, 100*imp.ReorderCorrelation, imp.Seed)
}

// Validate says what is wrong with imp, or returns nil.
func (imp Impairment) Validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"Loss", imp.Loss}, {"Reorder", imp.Reorder}, {"ReorderCorrelation", imp.ReorderCorrelation}} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
			return fmt.Errorf("netchaos: Impairment.%s = %g, want a probability in [0, 1]", p.name, p.v)
		}
	}
	if imp.Delay < 0 || imp.Jitter < 0 {
		return fmt.Errorf("netchaos: Impairment.Delay = %v, Jitter = %v, want both >= 0", imp.Delay, imp.Jitter)
	}
	if imp.Reorder > 0 && imp.Delay == 0 {
		// As tc says: "reordering not possible without specifying some delay".
		return fmt.Errorf("netchaos: Impairment.Reorder = %g needs a Delay to reorder against, and Delay is 0", imp.Reorder)
	}
	return nil
}

// fate is what happens to one packet.
type fate struct {
	drop      bool
	reordered bool          // sent at once, ahead of the delayed packets
	delay     time.Duration // how long to hold it when neither of the above
}

// A decider draws each packet's fate for one direction, the way
// sch_netem.c's netem_enqueue does: loss first, then reorder-or-delay. It
// is not safe for concurrent use; one forwarding goroutine owns each.
type decider struct {
	imp  Impairment
	rng  *rand.Rand
	last float64 // the previous correlated reorder draw (netem's crndstate.last)
}

func newDecider(imp Impairment, stream uint64) *decider {
	d := &decider{imp: imp, rng: rand.New(rand.NewPCG(imp.Seed, stream))}
	if imp.ReorderCorrelation > 0 {
		// netem's init_crandom starts from a random value, not zero.
		d.last = d.rng.Float64()
	}
	return d
}

func (d *decider) next() fate {
	if d.imp.Loss > 0 && d.rng.Float64() < d.imp.Loss {
		return fate{drop: true}
	}
	if d.imp.Reorder > 0 && d.reorderDraw() < d.imp.Reorder {
		return fate{reordered: true}
	}
	delay := d.imp.Delay
	if j := int64(d.imp.Jitter); j > 0 {
		delay += time.Duration(d.rng.Int64N(2*j+1) - j)
	}
	return fate{delay: max(delay, 0)}
}

// reorderDraw is netem's get_crandom: a uniform draw blended with the
// previous result, weighted by the correlation.
func (d *decider) reorderDraw() float64 {
	u := d.rng.Float64()
	if rho := d.imp.ReorderCorrelation; rho > 0 {
		u = (1-rho)*u + rho*d.last
		d.last = u
	}
	return u
}

// delayQueue holds delayed packets by due time. Packets due at the same
// instant leave in the order they came, as in netem's time-sorted queue.
// It is not safe for concurrent use.
type delayQueue struct {
	h   delayHeap
	seq uint64
}

type delayed struct {
	due time.Time
	seq uint64
	pkt []byte
}

func (q *delayQueue) push(due time.Time, pkt []byte) {
	q.seq++
	heap.Push(&q.h, delayed{due: due, seq: q.seq, pkt: pkt})
}

// peek returns the earliest due time, and false when the queue is empty.
func (q *delayQueue) peek() (time.Time, bool) {
	if len(q.h) == 0 {
		return time.Time{}, false
	}
	return q.h[0].due, true
}

// pop removes and returns the earliest packet; the queue must not be empty.
func (q *delayQueue) pop() []byte {
	return heap.Pop(&q.h).(delayed).pkt
}

func (q *delayQueue) len() int { return len(q.h) }

type delayHeap []delayed

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = delayed{}
	*h = old[:len(old)-1]
	return x
}
