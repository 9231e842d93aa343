// Package flight is goccl's flight recorder format and its analyzer. Each
// communicator keeps its last operations (sequence number, collective,
// type, count, root, operator, state, times, and for the running one how
// far each channel got and on which rank it waits); it writes them as a
// Dump on a timeout or an abort, on demand (collective's Comm.DebugDump)
// and on SIGUSR1 when GOCCL_DEBUG_DUMP names a directory. Analyze reads
// every rank's dump of one job and names the first operation where the
// ranks disagree, or the rank that never arrived, and follows the chain
// of waits (each stuck rank waits on a peer, which may wait on another)
// to the rank at its end, even one that left no dump because its process
// was stopped: what NCCL users otherwise reconstruct by hand from a hang
// (NVIDIA/nccl issues 1324, 968, 1260). A live job does the same through
// its bootstrap root when an operation times out (collective.StallError).
package flight

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Dump is one rank's flight recorder.
type Dump struct {
	Rank   int     `json:"rank"`
	Size   int     `json:"size"`
	PID    int     `json:"pid"`
	Host   string  `json:"host,omitempty"`
	Reason string  `json:"reason"` // why it was written: timeout, abort, request, signal
	Error  string  `json:"error,omitempty"`
	Ops    []Entry `json:"ops"` // oldest first
	// Dropped is how many older operations the ring no longer holds.
	Dropped uint64 `json:"dropped"`
}

// Entry is one operation.
type Entry struct {
	Seq   uint64 `json:"seq"`
	Op    string `json:"op"`   // allreduce, broadcast, send, ...
	Type  string `json:"type"` // element type
	Count int    `json:"count"`
	Bytes int64  `json:"bytes"`
	Root  int    `json:"root"` // -1 where there is none; the peer of send/recv
	// P2P is "send" or "recv" for point-to-point operations (Op is then
	// what the caller called: send, recv, alltoallv, gather, scatter),
	// numbered per peer and direction rather than like collectives.
	P2P   string `json:"p2p,omitempty"`
	RedOp string `json:"redop,omitempty"`
	// Device: the operation's buffers are in device memory. Every rank of
	// an operation places them alike, so What tells the two apart.
	Device   bool   `json:"device,omitempty"`
	Algo     string `json:"algo,omitempty"`
	Channels int    `json:"channels,omitempty"`
	State    string `json:"state"` // issued, running, done, failed
	// Times in µs since the communicator was created; 0 when not yet.
	// A blocking operation's finish time may be when its end was seen
	// (its successor's issue, or the watchdog's next round) rather
	// than when it ended, as PyTorch's recorder has it.
	IssuedUs   float64    `json:"issuedUs"`
	StartedUs  float64    `json:"startedUs,omitempty"`
	FinishedUs float64    `json:"finishedUs,omitempty"`
	Err        string     `json:"error,omitempty"`
	Progress   []Progress `json:"progress,omitempty"`
}

// Progress is where one channel of a running operation is.
type Progress struct {
	Channel int    `json:"channel"`
	Piece   int    `json:"piece"`
	Step    int    `json:"step"`
	Kind    string `json:"kind,omitempty"` // the step's primitive
	Peer    int    `json:"peer"`           // the rank the step receives from (or sends to), -1 none
	Done    bool   `json:"done,omitempty"` // the channel has finished its part
}

// States.
const (
	Issued  = "issued"
	Running = "running"
	Done    = "done"
	Failed  = "failed"
)

// What describes the operation as the ranks must agree on it.
func (e Entry) What() string {
	s := fmt.Sprintf("%s(%s×%d", e.Op, e.Type, e.Count)
	if e.RedOp != "" {
		s += ", " + e.RedOp
	}
	if e.Root >= 0 {
		s += fmt.Sprintf(", root %d", e.Root)
	}
	if e.Device {
		s += ", device memory"
	}
	return s + ")"
}

// Write writes d as JSON.
func (d *Dump) Write(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(d)
}

// FileName is the name a rank's dump gets in a dump directory.
func FileName(rank, pid int) string { return fmt.Sprintf("goccl-flight-rank%d-pid%d.json", rank, pid) }

// WriteFile writes d into dir under FileName and returns the path.
func (d *Dump) WriteFile(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Write a temporary file and rename it: a rank may write its dump
	// twice (on its abort, then on the launcher's SIGUSR1) while the
	// launcher reads the directory, which must never see half a file.
	p := filepath.Join(dir, FileName(d.Rank, d.PID))
	f, err := os.CreateTemp(dir, ".goccl-flight-*.tmp")
	if err != nil {
		return "", err
	}
	err = f.Chmod(0o644) // as os.Create gave, under the usual umask
	if err == nil {
		err = d.Write(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return p, nil
}

// ReadDir reads every dump in dir (the latest per rank when a rank wrote
// several).
func ReadDir(dir string) ([]*Dump, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "goccl-flight-rank*.json"))
	if err != nil {
		return nil, err
	}
	byRank := map[int]*Dump{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var d Dump
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if old := byRank[d.Rank]; old == nil || lastSeq(&d) >= lastSeq(old) {
			byRank[d.Rank] = &d
		}
	}
	var out []*Dump
	for _, d := range byRank {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

func lastSeq(d *Dump) uint64 {
	if len(d.Ops) == 0 {
		return 0
	}
	return d.Ops[len(d.Ops)-1].Seq
}

// Finding is what Analyze concludes.
type Finding struct {
	// Kind: "diverge" (ranks issued different operations with the same
	// sequence number), "missing" (ranks never issued an operation others
	// are running), "silent" (ranks that did not finish an operation
	// wait, along a chain, on a rank that left no dump: stopped or
	// killed), "stuck" (all issued it, some never finished), "p2p" (sends
	// or receives never finished), "none".
	Kind    string
	Seq     uint64
	Ranks   []int // the ranks at fault: the odd ones out, the absent, the silent, the unfinished
	Summary string
	// Chain is the longest chain of waits at Seq, from the progress of
	// the ranks' running operations: each rank waits on the next.
	Chain []int
}

// rankOps is one rank's collectives, by sequence number.
type rankOps struct {
	rank int
	ops  map[uint64]Entry
	max  uint64
	has  bool
}

// chainAt is the longest chain of waits at operation s: a rank whose
// entry runs waits on the peer of its first unfinished channel.
func chainAt(rs []rankOps, s uint64) ([]int, bool) {
	return chainOf(rs, func(r rankOps) (Entry, bool) { e, ok := r.ops[s]; return e, ok })
}

// chainNow is the longest chain of waits across operations: each rank
// waits where its latest running operation does, so that a rank still
// in an earlier operation, waiting on another, leads on to that one.
func chainNow(rs []rankOps) ([]int, bool) {
	return chainOf(rs, func(r rankOps) (Entry, bool) {
		var last Entry
		var ok bool
		for _, e := range r.ops {
			if e.State == Running && (!ok || e.Seq > last.Seq) {
				last, ok = e, true
			}
		}
		return last, ok
	})
}

// chainOf is the longest chain of waits where each rank waits on the
// peer of the first unfinished channel of the entry at(rank) picks, if
// that runs.
func chainOf(rs []rankOps, at func(rankOps) (Entry, bool)) ([]int, bool) {
	next := map[int]int{}
	for _, r := range rs {
		next[r.rank] = -1
		if e, ok := at(r); ok && e.State == Running {
			for _, p := range e.Progress {
				if !p.Done && p.Peer >= 0 {
					next[r.rank] = p.Peer
					break
				}
			}
		}
	}
	var waiting []int
	for _, r := range rs {
		if next[r.rank] >= 0 {
			waiting = append(waiting, r.rank)
		}
	}
	return longestChain(waiting, func(q int) int {
		if n, ok := next[q]; ok {
			return n
		}
		return -1 // no dump: the end
	})
}

// longestChain is the longest of the chains of waits from the ranks in
// from (the first of them when several are as long), and whether it runs
// into a cycle.
func longestChain(from []int, next func(int) int) ([]int, bool) {
	var best []int
	var bestCycle bool
	for _, r := range from {
		c, cyc := Chain(r, next)
		if len(c) > len(best) {
			best, bestCycle = c, cyc
		}
	}
	return best, bestCycle
}

// chainText is "; the chain of waits: 2 → 1 → 0" for chains of two ranks
// or more.
func chainText(c []int, cycle bool) string {
	if len(c) < 2 {
		return ""
	}
	if cycle {
		return "; the ranks wait on each other in a cycle: " + Arrows(Cycle(c))
	}
	return "; the chain of waits: " + Arrows(c)
}

// Analyze compares the dumps of one job's ranks (collectives only:
// point-to-point operations are numbered per peer and are left out) and
// returns the first problem: the earliest sequence number at which the
// ranks' operations differ, else the earliest operation some rank has not
// reached while others have, else an operation some ranks have not
// finished.
func Analyze(dumps []*Dump) Finding {
	if len(dumps) == 0 {
		return Finding{Kind: "none", Summary: "no dumps"}
	}
	var rs []rankOps
	for _, d := range dumps {
		ro := rankOps{rank: d.Rank, ops: map[uint64]Entry{}}
		for _, e := range d.Ops {
			if e.isP2P() {
				continue
			}
			ro.ops[e.Seq] = e
			if !ro.has || e.Seq > ro.max {
				ro.max, ro.has = e.Seq, true
			}
		}
		rs = append(rs, ro)
	}
	dumped := map[int]bool{}
	for _, d := range dumps {
		dumped[d.Rank] = true
	}
	// Sequence numbers every rank could report (the rings overlap).
	var seqs []uint64
	seen := map[uint64]bool{}
	for _, r := range rs {
		for s := range r.ops {
			if !seen[s] {
				seen[s] = true
				seqs = append(seqs, s)
			}
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for _, s := range seqs {
		// Divergence: the same sequence number, different operations.
		groups := map[string][]int{}
		var order []string
		for _, r := range rs {
			e, ok := r.ops[s]
			if !ok {
				continue
			}
			w := e.What()
			if _, ok := groups[w]; !ok {
				order = append(order, w)
			}
			groups[w] = append(groups[w], r.rank)
		}
		if len(groups) > 1 {
			sort.Slice(order, func(i, j int) bool { return len(groups[order[i]]) > len(groups[order[j]]) })
			var parts []string
			for _, w := range order {
				parts = append(parts, fmt.Sprintf("ranks %v called %s", groups[w], w))
			}
			var odd []int
			for _, w := range order[1:] {
				odd = append(odd, groups[w]...)
			}
			sort.Ints(odd)
			return Finding{Kind: "diverge", Seq: s, Ranks: odd,
				Summary: fmt.Sprintf("ranks diverge at operation #%d: %s", s, strings.Join(parts, "; "))}
		}
	}
	for _, s := range seqs {
		// Missing: some ranks are at s, others have not issued it.
		var present, absent []int
		var what string
		for _, r := range rs {
			if e, ok := r.ops[s]; ok {
				present = append(present, r.rank)
				what = e.What()
			} else if !r.has || r.max < s {
				absent = append(absent, r.rank)
			}
		}
		if len(absent) > 0 && len(present) > 0 {
			var last []string
			for _, a := range absent {
				for _, r := range rs {
					if r.rank == a {
						if r.has {
							last = append(last, fmt.Sprintf("rank %d's last was #%d %s (%s)", a, r.max, r.ops[r.max].What(), r.ops[r.max].State))
						} else {
							last = append(last, fmt.Sprintf("rank %d recorded no operation", a))
						}
					}
				}
			}
			// An absent rank still in an earlier operation may itself
			// wait on a rank that left no flight recorder: that one is
			// the cause.
			chain, cycle := chainNow(rs)
			if n := len(chain); n > 1 && !cycle && !dumped[chain[n-1]] {
				end := chain[n-1]
				return Finding{Kind: "silent", Seq: s, Ranks: []int{end}, Chain: chain,
					Summary: fmt.Sprintf("rank(s) %v never arrived at operation #%d %s, which ranks %v issued; %s; they wait on rank %d, which left no flight recorder (its process stopped, deadlocked, swapping or killed?)%s", absent, s, what, present, strings.Join(last, "; "), end, chainText(chain, cycle))}
			}
			if len(chain) < 2 {
				chain, cycle = chainAt(rs, s)
			}
			return Finding{Kind: "missing", Seq: s, Ranks: absent, Chain: chain,
				Summary: fmt.Sprintf("rank(s) %v never arrived at operation #%d %s, which ranks %v issued; %s%s", absent, s, what, present, strings.Join(last, "; "), chainText(chain, cycle))}
		}
	}
	for _, s := range seqs {
		var stuck []int
		var what string
		for _, r := range rs {
			if e, ok := r.ops[s]; ok && e.State != Done {
				stuck = append(stuck, r.rank)
				what = e.What()
			}
		}
		if len(stuck) == 0 {
			continue
		}
		chain, cycle := chainAt(rs, s)
		if n := len(chain); n > 1 && !cycle && !dumped[chain[n-1]] {
			// The chain ends at a rank that wrote nothing: a stopped
			// process cannot (it runs no signal handler), a killed one
			// did not.
			end := chain[n-1]
			return Finding{Kind: "silent", Seq: s, Ranks: []int{end}, Chain: chain,
				Summary: fmt.Sprintf("ranks %v did not finish operation #%d %s and wait on rank %d, which left no flight recorder (its process stopped, deadlocked, swapping or killed?)%s", stuck, s, what, end, chainText(chain, cycle))}
		}
		return Finding{Kind: "stuck", Seq: s, Ranks: stuck, Chain: chain,
			Summary: fmt.Sprintf("every rank issued operation #%d %s; ranks %v did not finish it%s", s, what, stuck, chainText(chain, cycle))}
	}
	if f, ok := analyzeP2P(dumps); ok {
		return f
	}
	return Finding{Kind: "none", Summary: "the ranks agree on every recorded operation, and all finished"}
}

func (e Entry) isP2P() bool { return e.P2P != "" || e.Op == "send" || e.Op == "recv" }

// analyzeP2P reports point-to-point operations that never finished: each
// rank's oldest one waits on its peer, and the chain of those waits
// (around a cycle, for a send/recv deadlock).
func analyzeP2P(dumps []*Dump) (Finding, bool) {
	oldest := map[int]Entry{}
	var stuck []int
	for _, d := range dumps {
		for _, e := range d.Ops {
			if e.isP2P() && e.State != Done && e.State != Failed {
				oldest[d.Rank] = e
				stuck = append(stuck, d.Rank)
				break
			}
		}
	}
	if len(stuck) == 0 {
		return Finding{}, false
	}
	var parts []string
	for _, r := range stuck {
		e := oldest[r]
		dir := e.P2P
		if dir == "" {
			dir = e.Op
		}
		what := fmt.Sprintf("rank %d's %s #%d %s rank %d (%s×%d, %s)", r, e.Op, e.Seq, map[string]string{"send": "to", "recv": "from"}[dir], e.Root, e.Type, e.Count, e.State)
		parts = append(parts, what)
	}
	next := func(r int) int {
		if e, ok := oldest[r]; ok {
			return e.Root
		}
		return -1
	}
	best, bestCycle := longestChain(stuck, next)
	summary := "point-to-point operations never finished: " + strings.Join(parts, "; ") + chainText(best, bestCycle)
	if bestCycle {
		summary += " (a send/recv deadlock: each waits for the other to start its half)"
	}
	return Finding{Kind: "p2p", Seq: oldest[stuck[0]].Seq, Ranks: stuck, Chain: best, Summary: summary}, true
}

// Chain follows a chain of waits from rank from: next(r) is the rank r
// waits on, or -1 when it waits on none. It returns the ranks from from to
// the end of the chain, and whether the chain runs into itself (a cycle:
// the last rank is then the first one met twice).
func Chain(from int, next func(rank int) int) (ranks []int, cycle bool) {
	seen := map[int]bool{}
	for r := from; ; {
		ranks = append(ranks, r)
		if seen[r] {
			return ranks, true
		}
		seen[r] = true
		n := next(r)
		if n < 0 {
			return ranks, false
		}
		r = n
	}
}

// Cycle returns the cycle a chain that runs into itself ends in: from
// the first rank met twice to its second visit ("0 → 1 → 2 → 1" gives
// "1 → 2 → 1"); a chain without one is returned as it is.
func Cycle(chain []int) []int {
	if len(chain) < 2 {
		return chain
	}
	last := chain[len(chain)-1]
	for i, r := range chain[:len(chain)-1] {
		if r == last {
			return chain[i:]
		}
	}
	return chain
}

// Arrows writes a chain of ranks as "2 → 1 → 0".
func Arrows(ranks []int) string {
	var b strings.Builder
	for i, r := range ranks {
		if i > 0 {
			b.WriteString(" → ")
		}
		fmt.Fprint(&b, r)
	}
	return b.String()
}
