// Package algotest executes schedules of package algorithms in memory and
// proves their result: the simulator runs every rank's steps over symbolic
// values, with the engine's slicing and a bounded number of slots per link,
// and checks that each output element holds exactly the right inputs.
//
// A symbolic value records which element it came from and the set of ranks
// whose contributions it holds. Reducing two values checks that they belong
// to the same element, that no rank is counted twice and that neither is
// already final; the step marked Final must hold every rank; and at the end
// every output element must equal what the collective defines, with Input
// untouched. Links are FIFO queues of slices with a capacity of Slots, and
// a rank blocks exactly where the engine would (a full link on send, an
// empty one on receive), so a schedule that can deadlock in the engine
// deadlocks here and is reported.
//
// The package is meant for tests; it imports only the standard library and
// package algorithms.
package algotest

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"

	"github.com/goccl/goccl/algorithms"
)

// Config describes one simulated run.
type Config struct {
	Coll   algorithms.Collective
	Algo   algorithms.Algorithm
	NRanks int // 1..64
	// Root is the root of broadcast and reduce, and the sender of send/recv.
	Root int
	// Peer is the receiver of send/recv.
	Peer int
	// Count is the number of elements per major block (algorithms.NewLayout).
	Count    int
	Channels int // ≥ 1; default 1
	Pieces   int // ≥ Channels; default Channels
	// InPlace aliases the buffers as NCCL's in-place forms do: send == recv
	// for all-reduce, broadcast and reduce; recv inside send at the rank's
	// block for reduce-scatter; send inside recv for all-gather.
	InPlace    bool
	SliceElems int    // elements per slice; default 1
	Slots      int    // slices a link buffers; at least (and default) 2
	Ring       []int  // ring order, nil for identity (or HostRing(Hosts))
	Hosts      []int  // each rank's host label, nil for one host
	Seed       uint64 // seeds the order in which ranks are stepped
}

// val is a symbolic element.
type val struct {
	pos   int32  // global element index it belongs to; -1: never written
	final bool   // post-processing applied
	ranks uint64 // contributing ranks
	// scaled: in a reduction, the value came through a read of Input.
	// The engine's pre-multiplied sum scales the input as a step reads
	// it, so a reduction must read each rank's Input as it was given
	// (never after writing it in place) for every contribution to be
	// scaled exactly once; read checks that.
	scaled bool
}

var undef = val{pos: -1}

func (v val) String() string {
	if v.pos < 0 {
		return "undefined"
	}
	var rs []string
	for b := v.ranks; b != 0; b &= b - 1 {
		rs = append(rs, fmt.Sprint(bits.TrailingZeros64(b)))
	}
	f := ""
	if v.final {
		f = " final"
	}
	if v.scaled {
		f += " scaled"
	}
	return fmt.Sprintf("{elem %d ranks {%s}%s}", v.pos, strings.Join(rs, ","), f)
}

type msg struct {
	vals []val
}

type link struct {
	q []msg
}

type rankSim struct {
	rank   int
	sched  *algorithms.Schedule
	layout algorithms.Layout
	mem    []val
	in     int // offset of Input in mem, -1 if absent
	out    int // offset of Output in mem, -1 if absent
	pieces []int
	pi, si int
	active bool // a step is in progress
	phase  int  // exchange: 0 next does tx, 1 next does rx
	src    algorithms.Slicer
	dst    algorithms.Slicer
	tx     algorithms.Slicer
	spans  [3][]algorithms.Span
	done   bool
}

type sim struct {
	cfg   Config
	all   uint64
	ranks []*rankSim
	links []link // from*n + to
	rng   *rand.Rand
}

// Run builds every rank's schedule for cfg, simulates them and returns the
// first violation found, or nil.
func Run(cfg Config) error { return RunSchedules(cfg, nil) }

// RunSchedules simulates the given schedules (one per rank, nil for ranks
// without one) instead of building them; tests use it to show that broken
// schedules are caught. A nil scheds builds them as Run does.
func RunSchedules(cfg Config, scheds []*algorithms.Schedule) error {
	if cfg.NRanks < 1 || cfg.NRanks > 64 {
		return fmt.Errorf("algotest: %d ranks: the simulator handles 1..64", cfg.NRanks)
	}
	if cfg.Channels < 1 {
		cfg.Channels = 1
	}
	if cfg.Pieces < cfg.Channels {
		cfg.Pieces = cfg.Channels
	}
	if cfg.SliceElems < 1 {
		cfg.SliceElems = 1
	}
	if cfg.Slots < 2 {
		cfg.Slots = 2
	}
	if cfg.InPlace && (cfg.Coll == algorithms.CollAllToAll || cfg.Coll == algorithms.CollSend || cfg.Coll == algorithms.CollRecv) {
		return fmt.Errorf("algotest: %v has no in-place form", cfg.Coll)
	}
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))}
	if cfg.NRanks == 64 {
		s.all = ^uint64(0)
	} else {
		s.all = 1<<cfg.NRanks - 1
	}
	if err := s.setup(scheds); err != nil {
		return err
	}
	// The engine's rule: pieces small enough that every message fits in a
	// link's slots (algorithms.MinPieces). Each rank computes it from its
	// own schedule, as the engine does, and they must agree.
	pieces := -1
	for _, r := range s.ranks {
		if r == nil {
			continue
		}
		p := max(cfg.Pieces, algorithms.MinPieces(r.sched, cfg.Count, cfg.Slots, cfg.SliceElems))
		if pieces >= 0 && p != pieces {
			return fmt.Errorf("%s: rank %d would cut %d pieces, another rank %d", s.describe(), r.rank, p, pieces)
		}
		pieces = p
	}
	cfg.Pieces = max(cfg.Pieces, pieces)
	s.cfg = cfg
	for c := 0; c < cfg.Channels; c++ {
		lo, hi := c*cfg.Pieces/cfg.Channels, (c+1)*cfg.Pieces/cfg.Channels
		for _, r := range s.ranks {
			if r == nil {
				continue
			}
			r.pieces = r.pieces[:0]
			for p := lo; p < hi; p++ {
				r.pieces = append(r.pieces, p)
			}
			r.pi, r.si, r.active, r.done = 0, 0, false, len(r.pieces) == 0 || len(r.sched.Steps) == 0
		}
		s.links = make([]link, cfg.NRanks*cfg.NRanks)
		if err := s.runChannel(c); err != nil {
			return fmt.Errorf("%s: %w", s.describe(), err)
		}
	}
	if err := s.check(); err != nil {
		return fmt.Errorf("%s: %w", s.describe(), err)
	}
	return nil
}

func (s *sim) describe() string {
	c := s.cfg
	return fmt.Sprintf("%v/%v nranks=%d root=%d count=%d channels=%d pieces=%d inplace=%v slice=%d slots=%d",
		c.Coll, c.Algo, c.NRanks, c.Root, c.Count, c.Channels, c.Pieces, c.InPlace, c.SliceElems, c.Slots)
}

func (s *sim) setup(given []*algorithms.Schedule) error {
	c := s.cfg
	n := c.NRanks
	s.ranks = make([]*rankSim, n)
	var err error
	for r := 0; r < n; r++ {
		p := algorithms.Params{Coll: c.Coll, Algo: c.Algo, NRanks: n, Rank: r, Root: c.Root, Ring: c.Ring, Hosts: c.Hosts}
		switch c.Coll {
		case algorithms.CollSend, algorithms.CollRecv:
			switch r {
			case c.Root:
				p.Coll, p.Root = algorithms.CollSend, c.Peer
			case c.Peer:
				p.Coll, p.Root = algorithms.CollRecv, c.Root
			default:
				continue
			}
		}
		var sched *algorithms.Schedule
		if given != nil {
			if sched = given[r]; sched == nil {
				continue
			}
		} else if sched, err = algorithms.Build(p); err != nil {
			return err
		}
		if err := sched.Check(); err != nil {
			return err
		}
		rs := &rankSim{rank: r, sched: sched, layout: algorithms.NewLayout(sched.Coll, n, r, sched.Root, c.Count), in: -1, out: -1}
		l := rs.layout
		inLen, outLen := l.InLen(), l.OutLen()
		switch {
		case !c.InPlace || sched.CopyInPlace || inLen == 0 || outLen == 0:
			// (The engine runs a CopyInPlace schedule on a copy of the
			// input, so its buffers never alias.)
			rs.mem = make([]val, inLen+outLen)
			if inLen > 0 {
				rs.in = 0
			}
			if outLen > 0 {
				rs.out = inLen
			}
		case c.Coll == algorithms.CollReduceScatter:
			rs.mem = make([]val, inLen)
			rs.in, rs.out = 0, r*c.Count
		case c.Coll == algorithms.CollAllGather:
			rs.mem = make([]val, outLen)
			rs.in, rs.out = r*c.Count, 0
		default:
			rs.mem = make([]val, inLen)
			rs.in, rs.out = 0, 0
		}
		for i := range rs.mem {
			rs.mem[i] = undef
		}
		for i := 0; i < inLen; i++ {
			rs.mem[rs.in+i] = val{pos: int32(l.InLo*c.Count + i), ranks: 1 << r}
		}
		s.ranks[r] = rs
	}
	if c.Coll != algorithms.CollSend && c.Coll != algorithms.CollRecv {
		scheds := make([]*algorithms.Schedule, n)
		for r := range scheds {
			if s.ranks[r] == nil {
				return fmt.Errorf("algotest: no schedule for rank %d", r)
			}
			scheds[r] = s.ranks[r].sched
		}
		if err := algorithms.Validate(scheds); err != nil {
			return err
		}
	}
	return nil
}

func (s *sim) link(from, to int) *link { return &s.links[from*s.cfg.NRanks+to] }

func (s *sim) runChannel(ch int) error {
	order := make([]int, 0, len(s.ranks))
	for r, rs := range s.ranks {
		if rs != nil {
			order = append(order, r)
		}
	}
	for {
		progressed, alldone := false, true
		s.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, r := range order {
			rs := s.ranks[r]
			for !rs.done {
				ok, err := s.advance(rs)
				if err != nil {
					return fmt.Errorf("channel %d rank %d piece %d step %d (%v): %w", ch, r, rs.pieces[rs.pi], rs.si, rs.sched.Steps[rs.si], err)
				}
				if !ok {
					break
				}
				progressed = true
				// Let other ranks interleave at random points.
				if s.rng.IntN(3) == 0 {
					break
				}
			}
			alldone = alldone && rs.done
		}
		if alldone {
			break
		}
		if !progressed {
			var b strings.Builder
			fmt.Fprintf(&b, "deadlock in channel %d:", ch)
			for _, r := range order {
				rs := s.ranks[r]
				if !rs.done {
					fmt.Fprintf(&b, "\n  rank %d blocked at piece %d step %d: %v", r, rs.pieces[rs.pi], rs.si, rs.sched.Steps[rs.si])
				}
			}
			return fmt.Errorf("%s", b.String())
		}
	}
	for k, l := range s.links {
		if len(l.q) > 0 {
			n := s.cfg.NRanks
			return fmt.Errorf("channel %d: rank %d sent %d slices to rank %d that were never received", ch, k/n, len(l.q), k%n)
		}
	}
	return nil
}

// start prepares the slicers of the current step.
func (s *sim) start(rs *rankSim) {
	st := &rs.sched.Steps[rs.si]
	p := rs.pieces[rs.pi]
	sp := func(i int, ref algorithms.Ref) algorithms.Slicer {
		rs.spans[i] = rs.spans[i][:0]
		if ref.Buf != algorithms.NoBuf {
			rs.spans[i] = rs.layout.Spans(rs.spans[i], ref, rs.sched.Minor, p, s.cfg.Pieces)
		}
		return algorithms.NewSlicer(rs.spans[i], s.cfg.SliceElems)
	}
	rs.src = sp(0, st.Src)
	rs.dst = sp(1, st.Dst)
	rs.tx = sp(2, st.Tx)
	rs.phase = 0
	rs.active = true
}

func (s *sim) next(rs *rankSim) {
	rs.active = false
	rs.si++
	if rs.si == len(rs.sched.Steps) {
		rs.si = 0
		rs.pi++
		if rs.pi == len(rs.pieces) {
			rs.done = true
		}
	}
}

// read returns element off of rs's buf; in a reduction, a read of Input
// scales the value (see val.scaled).
func (s *sim) read(rs *rankSim, buf algorithms.Buf, off int) (val, error) {
	v := rs.mem[s.addr(rs, buf, off)]
	if buf != algorithms.Input || !s.cfg.Coll.Reduces() {
		return v, nil
	}
	if v.scaled {
		return undef, fmt.Errorf("reads %v from Input, which a step overwrote in place: a pre-multiplied sum would scale it twice", v)
	}
	v.scaled = true
	return v, nil
}

func (s *sim) addr(rs *rankSim, buf algorithms.Buf, off int) int {
	if buf == algorithms.Input {
		return rs.in + off
	}
	return rs.out + off
}

// advance makes one slice of progress on rs's current step; ok is false
// when the rank is blocked.
func (s *sim) advance(rs *rankSim) (ok bool, err error) {
	if !rs.active {
		s.start(rs)
	}
	st := &rs.sched.Steps[rs.si]
	if st.Kind.Exchange() {
		return s.advanceExchange(rs, st)
	}
	// Lockstep: Src and Dst (whichever the kind has) walk equal spans.
	lead := &rs.src
	if st.Src.Buf == algorithms.NoBuf {
		lead = &rs.dst
	}
	if lead.Done() {
		s.next(rs)
		return true, nil
	}
	var in *link
	if st.Kind.Receives() {
		in = s.link(int(st.RecvPeer), rs.rank)
		if len(in.q) == 0 {
			return false, nil
		}
	}
	var out *link
	if st.Kind.Sends() {
		out = s.link(rs.rank, int(st.SendPeer))
		if len(out.q) >= s.cfg.Slots {
			return false, nil
		}
	}
	var srcOff, dstOff, n int
	if st.Src.Buf != algorithms.NoBuf {
		srcOff, n, _ = rs.src.Next()
	}
	if st.Dst.Buf != algorithms.NoBuf {
		var n2 int
		dstOff, n2, _ = rs.dst.Next()
		if st.Src.Buf != algorithms.NoBuf && n2 != n {
			return false, fmt.Errorf("src slice of %d elements against dst slice of %d", n, n2)
		}
		n = n2
	}
	v := make([]val, n)
	var rx []val
	if in != nil {
		rx = in.q[0].vals
		in.q = in.q[1:]
		if len(rx) != n {
			return false, fmt.Errorf("received a slice of %d elements from rank %d, expected %d", len(rx), st.RecvPeer, n)
		}
	}
	for i := 0; i < n; i++ {
		var x, src val
		if st.Src.Buf != algorithms.NoBuf {
			if src, err = s.read(rs, st.Src.Buf, srcOff+i); err != nil {
				return false, err
			}
		}
		switch {
		case in != nil && st.Kind.Reduces():
			x, err = s.reduce(rx[i], src, st.Final)
		case in != nil:
			x = rx[i]
		case st.Kind.Reduces(): // a local reduce into the running value
			x, err = s.reduce(rs.mem[s.addr(rs, algorithms.Output, dstOff+i)], src, st.Final)
		default:
			x, err = s.finish(src, st.Final)
		}
		if err != nil {
			return false, err
		}
		v[i] = x
	}
	if st.Dst.Buf != algorithms.NoBuf {
		copy(rs.mem[s.addr(rs, algorithms.Output, dstOff):], v)
	}
	if out != nil {
		out.q = append(out.q, msg{vals: v})
	}
	return true, nil
}

func (s *sim) advanceExchange(rs *rankSim, st *algorithms.Step) (bool, error) {
	if rs.tx.Done() && rs.dst.Done() {
		s.next(rs)
		return true, nil
	}
	if rs.phase == 0 {
		rs.phase = 1
		if !rs.tx.Done() {
			out := s.link(rs.rank, int(st.SendPeer))
			if len(out.q) >= s.cfg.Slots {
				rs.phase = 0
				return false, nil
			}
			off, n, _ := rs.tx.Next()
			v := make([]val, n)
			for i := range v {
				var err error
				if v[i], err = s.read(rs, st.Tx.Buf, off+i); err != nil {
					return false, err
				}
			}
			out.q = append(out.q, msg{vals: v})
			return true, nil
		}
	}
	if rs.dst.Done() {
		rs.phase = 0
		return true, nil
	}
	in := s.link(int(st.RecvPeer), rs.rank)
	if len(in.q) == 0 {
		return false, nil
	}
	dstOff, n, _ := rs.dst.Next()
	srcOff := 0
	if st.Src.Buf != algorithms.NoBuf {
		var n2 int
		srcOff, n2, _ = rs.src.Next()
		if n2 != n {
			return false, fmt.Errorf("src slice of %d elements against dst slice of %d", n2, n)
		}
	}
	rx := in.q[0].vals
	in.q = in.q[1:]
	if len(rx) != n {
		return false, fmt.Errorf("received a slice of %d elements from rank %d, expected %d", len(rx), st.RecvPeer, n)
	}
	for i := 0; i < n; i++ {
		x := rx[i]
		if st.Kind.Reduces() {
			src, err := s.read(rs, st.Src.Buf, srcOff+i)
			if err == nil {
				x, err = s.reduce(rx[i], src, st.Final)
			}
			if err != nil {
				return false, err
			}
		}
		rs.mem[s.addr(rs, algorithms.Output, dstOff+i)] = x
	}
	rs.phase = 0
	return true, nil
}

func (s *sim) reduce(a, b val, final bool) (val, error) {
	switch {
	case a.pos < 0 || b.pos < 0:
		return undef, fmt.Errorf("reduces %v with %v: reads an element never written", a, b)
	case a.pos != b.pos:
		return undef, fmt.Errorf("reduces %v with %v: different elements", a, b)
	case a.ranks&b.ranks != 0:
		return undef, fmt.Errorf("reduces %v with %v: a rank counted twice", a, b)
	case a.final || b.final:
		return undef, fmt.Errorf("reduces %v with %v: a finished value reduced again", a, b)
	case !a.scaled || !b.scaled:
		return undef, fmt.Errorf("reduces %v with %v: a contribution that never came through a read of Input", a, b)
	}
	return s.finish(val{pos: a.pos, ranks: a.ranks | b.ranks, scaled: true}, final)
}

func (s *sim) finish(v val, final bool) (val, error) {
	if !final {
		return v, nil
	}
	switch {
	case v.final:
		return undef, fmt.Errorf("%v finished twice", v)
	case v.pos < 0 || v.ranks != s.all:
		return undef, fmt.Errorf("final step on %v, which lacks ranks", v)
	}
	v.final = true
	return v, nil
}

// check compares every rank's buffers with the collective's definition.
func (s *sim) check() error {
	c := s.cfg
	k := c.Count
	for r, rs := range s.ranks {
		if rs == nil {
			continue
		}
		l := rs.layout
		if !c.InPlace {
			for i := 0; i < l.InLen(); i++ {
				want := val{pos: int32(l.InLo*k + i), ranks: 1 << r}
				if got := rs.mem[rs.in+i]; got != want {
					return fmt.Errorf("rank %d input element %d changed to %v", r, i, got)
				}
			}
		}
		for i := 0; i < l.OutLen(); i++ {
			g := l.OutLo*k + i
			var want val
			switch c.Coll {
			case algorithms.CollAllReduce, algorithms.CollReduceScatter, algorithms.CollReduce:
				want = val{pos: int32(g), ranks: s.all, final: true, scaled: true}
			case algorithms.CollAllGather:
				want = val{pos: int32(g), ranks: 1 << (g / k)}
			case algorithms.CollBroadcast:
				want = val{pos: int32(g), ranks: 1 << c.Root}
			case algorithms.CollAllToAll:
				from, off := g/k, g%k
				want = val{pos: int32(r*k + off), ranks: 1 << from}
			case algorithms.CollRecv, algorithms.CollSend:
				want = val{pos: int32(g), ranks: 1 << c.Root}
			}
			if got := rs.mem[rs.out+i]; got != want {
				return fmt.Errorf("rank %d output element %d is %v, want %v", r, i, got, want)
			}
		}
	}
	return nil
}
