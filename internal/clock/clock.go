// Package clock is a monotonic clock in nanoseconds that is cheaper to
// read than the runtime's, for the time stamps an operation takes on its
// way through (when it was issued, when it finished: the flight recorder's
// and the watchdog's).
//
// The runtime's clock (what time.Now and runtime.nanotime read) goes
// through the vDSO's clock_gettime on the system stack: 25-55 ns a read on
// the VMs here, where an 8-byte broadcast over shared memory takes 250-500
// ns and reads it twice (docs/performance.md). Where the kernel itself
// keeps time by the CPU's time-stamp counter (its clock source is "tsc",
// which it chooses only where the counter runs at a constant rate and in
// step on every CPU; or a KVM guest's "kvm-clock" on an invariant counter
// that the vDSO reads, see ticks_amd64.go), Now reads the counter (RDTSC,
// 10-20 ns here) and scales it by its rate against the runtime's clock,
// measured over the first 10 ms it is read and then again about every
// second, over the second just gone (so that it follows the runtime's
// clock where NTP slews it), each time taking the runtime's clock as the
// new anchor.
//
// Readings do not go back. An anchor pairs a reading of the runtime's
// clock with a counter reading taken just before it (the closest pair of a
// few tries), never just after: the counter read after the runtime's
// clock is some 50-90 ns later than the time that clock returned, and a
// scale anchored there would read behind the runtime's clock by that much
// the moment it took over from it (a goroutine that read the runtime's
// clock just before the first scale was stored then saw its next reading
// go back by that gap; CI caught it once). Anchored on the earlier counter
// reading, a scale reads ahead of the runtime's clock by the pair's gap
// instead. A new anchor is the later of the runtime's clock and the old
// scale's reading (so Now may run ahead of the runtime's clock by that gap
// plus what the rate's error adds up to, nanoseconds a second), a
// goroutine that finds another anchoring reads the old scale, and once a
// scale exists no reading comes from the runtime's clock alone. Elsewhere,
// or before the rate is known, Now is the runtime's clock.
package clock

import (
	"math/bits"
	"sync"
	"sync/atomic"
	_ "unsafe" // go:linkname
)

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// scale maps counter readings after t0 to nanoseconds after n0.
type scale struct {
	t0    uint64 // counter at the anchor
	n0    int64  // what Now read at the anchor
	raw   int64  // the runtime's clock at the anchor (n0 is no earlier)
	mult  uint64 // ns per tick, 32.32 fixed point
	limit uint64 // ticks after t0 that this scale serves (about a second)
}

func (s *scale) at(t uint64) int64 {
	hi, lo := bits.Mul64(t-s.t0, s.mult)
	return s.n0 + int64(hi<<32|lo>>32)
}

var (
	cur atomic.Pointer[scale] // nil: the rate is not known yet, or the counter is not used
	// usable: the counter may be read and scaled (set once, by init)
	usable bool

	mu      sync.Mutex // held by slow's sampling
	firstT  uint64     // the first sample, which the first rate is measured from
	firstN  int64
	sampled bool
)

const (
	calibrateAfter = 10_000_000    // ns of the first sample's baseline before the rate is used
	reanchorEvery  = 1_000_000_000 // ns a scale serves before the next anchor
)

// Now returns the time in nanoseconds since an arbitrary origin (the
// runtime's monotonic clock's).
func Now() int64 {
	if s := cur.Load(); s != nil {
		if t := ticks(); t-s.t0 < s.limit {
			return s.at(t)
		}
	}
	return slow()
}

// slow is Now without a scale that serves: it samples the runtime's
// clock and the counter, and measures the rate and anchors a new scale
// when it is time to.
func slow() int64 {
	if !usable {
		return nanotime()
	}
	s := cur.Load()
	if !mu.TryLock() {
		// Another goroutine is anchoring: the old scale past its limit
		// reads better than the runtime's clock, which may be behind what
		// the old scale has returned.
		if s != nil {
			if t := ticks(); int64(t-s.t0) >= 0 {
				return s.at(t)
			}
			return s.n0
		}
		return nanotime()
	}
	defer mu.Unlock()
	if s = cur.Load(); s != nil {
		if t := ticks(); t-s.t0 < s.limit {
			return s.at(t) // anchored while this waited for the lock
		}
	}
	n, t := sample()
	baseN, baseT := firstN, firstT // the rate since the last anchor (the first sample before any)
	if s != nil {
		baseN, baseT = s.raw, s.t0
	}
	if !sampled {
		firstN, firstT, sampled = n, t, true
		return n
	}
	dn, dt := n-baseN, t-baseT
	if dn < calibrateAfter || int64(dt) <= 0 || uint64(dn)>>32 >= dt {
		// Too soon to measure the rate, a counter on this CPU behind the
		// anchor's, or one that ticks slower than a tick per 2^32 ns (not
		// a counter to use).
		return later(n, t, s)
	}
	mult, _ := bits.Div64(uint64(dn)>>32, uint64(dn)<<32, dt)
	if mult == 0 {
		return later(n, t, s)
	}
	next := &scale{t0: t, n0: n, raw: n, mult: mult, limit: uint64(reanchorEvery) << 32 / mult}
	if s != nil {
		next.n0 = max(n, s.at(t))
	}
	cur.Store(next)
	return next.n0
}

// later is what slow returns when it anchors no scale: the runtime's
// clock n, or, where a scale has been read, its reading at counter t if
// that is later (the scale may run ahead of the runtime's clock, and a
// reading must not go back behind what it returned).
func later(n int64, t uint64, s *scale) int64 {
	if s == nil {
		return n
	}
	if int64(t-s.t0) >= 0 {
		return max(n, s.at(t))
	}
	return max(n, s.n0)
}

// samplePairs is how many tries sample makes for its closest pair.
const samplePairs = 4

// sample reads the runtime's clock and the counter as one pair: n, and
// the counter t read just before it. Of a few tries it keeps the one whose
// counter readings before and after n are closest, so that a pair is not
// torn by an interrupt or the goroutine's being descheduled between them
// (which would skew the rate measured between two anchors, and put the
// scale ahead of the runtime's clock by the stall).
func sample() (n int64, t uint64) {
	best := ^uint64(0)
	for range samplePairs {
		t1 := ticks()
		n1 := nanotime()
		t2 := ticks()
		if d := t2 - t1; int64(d) >= 0 && d < best {
			best, n, t = d, n1, t1
		}
	}
	if best == ^uint64(0) {
		// The counter went back between the reads of every pair (a
		// migration between CPUs whose counters differ): take the last.
		t = ticks()
		n = nanotime()
	}
	return n, t
}
