// Command fit holds the tuner's link models against this machine: it
// forces each algorithm the tuner weighs (goccl-perf -algo) over a sweep
// of sizes, for each collective, rank count and transport, alternating
// the runs so that drift hits every algorithm alike; then it fits the
// model's four numbers (hop latency, bandwidth, reduction rate, post
// cost) to the medians, and prints, for the model in the code and for
// the fitted one, how far each predicts the times and how often the
// tuner's pick is the measured fastest algorithm or within 10% of it.
//
//	go run ./bench/fit                                # shm and tcp, 2-4 ranks, 64 B-16 MiB
//	go run ./bench/fit -transports tcp -np 2,4 -reps 5
//	go run ./bench/fit -from /tmp/fit                 # fit again from a run's files
//
// See README.md here for how to read it and what was taken from it.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/gonum/optimize"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/bench"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/transport/shm"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fit:", err)
		os.Exit(1)
	}
}

// weighed lists, per collective, the algorithms the tuner weighs on one
// host (the hierarchical ones need several) and goccl-perf's -algo
// forces. A broadcast has one algorithm: its runs only feed the fit.
var weighed = map[bench.Coll][]algorithms.Algorithm{
	bench.AllReduce:     {algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot},
	bench.ReduceScatter: {algorithms.Ring, algorithms.OneShot},
	bench.AllGather:     {algorithms.Ring, algorithms.OneShot, algorithms.RecDoubling},
	bench.Reduce:        {algorithms.Ring, algorithms.OneShot},
	bench.Broadcast:     {algorithms.Ring},
}

var schedColl = map[bench.Coll]algorithms.Collective{bench.AllReduce: algorithms.CollAllReduce,
	bench.ReduceScatter: algorithms.CollReduceScatter, bench.AllGather: algorithms.CollAllGather,
	bench.Broadcast: algorithms.CollBroadcast, bench.Reduce: algorithms.CollReduce}

// A point is one forced algorithm's median time at one size.
type point struct {
	transport string
	np        int
	coll      bench.Coll
	algo      algorithms.Algorithm
	channels  int
	bytes     int64
	us        float64 // median over the repetitions
	runs      int
}

func run(argv []string, out io.Writer) error {
	fs := flag.NewFlagSet("fit", flag.ContinueOnError)
	transports := fs.String("transports", "shm,tcp", "transports to measure: shm, tcp")
	nps := fs.String("np", "2,3,4", "rank counts")
	colls := fs.String("colls", "all_reduce,reduce_scatter,all_gather,reduce,broadcast", "collectives")
	minB := fs.String("b", "64", "smallest size (nccl-tests' size column)")
	maxB := fs.String("e", "16M", "largest size")
	factor := fs.Int("f", 4, "size factor from one size to the next")
	reps := fs.Int("reps", 3, "runs of each algorithm, alternating")
	target := fs.Float64("T", 0.1, "seconds each size is timed")
	bin := fs.String("bin", "", "goccl-perf binary (default: built into -out)")
	outDir := fs.String("out", "", "directory for the runs' JSON and log (default: a new temporary one)")
	from := fs.String("from", "", "fit from the JSON files of an earlier run's -out instead of measuring")
	check := fs.String("check", "", "also score the models on another run's -out (measured apart from the one fitted)")
	cpus := fs.Int("cpus", runtime.NumCPU(), "the CPUs of the machine measured: runs of more ranks are fitted apart (oversubscribed)")
	varyS := fs.String("vary", "latency,bandwidth,reduce,post", "the numbers the picks fit may move")
	limit := fs.Duration("run-timeout", 2*time.Minute, "kill a run that takes longer")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	var vary [4]bool
	for _, v := range bench.SplitList(*varyS) {
		i := slices.Index([]string{"latency", "bandwidth", "reduce", "post"}, v)
		if i < 0 {
			return fmt.Errorf("-vary %q: latency, bandwidth, reduce, post", v)
		}
		vary[i] = true
	}
	if *cpus < 1 {
		return fmt.Errorf("-cpus %d: at least 1", *cpus)
	}
	var pts []point
	var err error
	if *from != "" {
		pts, err = load(*from)
	} else {
		pts, err = measure(measureArgs{transports: bench.SplitList(*transports), nps: *nps, colls: bench.SplitList(*colls), b: *minB, e: *maxB,
			f: *factor, reps: *reps, target: *target, bin: *bin, dir: *outDir, limit: *limit}, out)
	}
	if err != nil {
		return err
	}
	if len(pts) == 0 {
		return errors.New("no measurements")
	}
	var held []point
	if *check != "" {
		if held, err = load(*check); err != nil {
			return err
		}
	}
	report(out, pts, held, *cpus, vary)
	return nil
}

type measureArgs struct {
	transports []string
	nps        string
	colls      []string
	b, e       string
	f, reps    int
	target     float64
	bin, dir   string
	limit      time.Duration
}

// measure runs the sweeps and returns their medians; each run's JSON
// stays in a.dir for -from.
func measure(a measureArgs, out io.Writer) ([]point, error) {
	if a.reps < 1 || a.f < 2 || a.target <= 0 {
		return nil, fmt.Errorf("-reps %d, -f %d, -T %v: need at least 1 run, a factor of at least 2 and a positive time", a.reps, a.f, a.target)
	}
	var nps []int
	for _, s := range bench.SplitList(a.nps) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			return nil, fmt.Errorf("-np %q: rank counts of at least 2", a.nps)
		}
		nps = append(nps, n)
	}
	var cs []bench.Coll
	for _, s := range a.colls {
		c, err := bench.ParseColl(s)
		if err != nil {
			return nil, err
		}
		if _, ok := weighed[c]; !ok {
			return nil, fmt.Errorf("-colls: %s has no algorithms to weigh", c)
		}
		cs = append(cs, c)
	}
	for _, t := range a.transports {
		if t != collective.TransportShm && t != collective.TransportTCP {
			return nil, fmt.Errorf("-transports: %q (shm or tcp)", t)
		}
	}
	if a.dir == "" {
		d, err := os.MkdirTemp("", "fit")
		if err != nil {
			return nil, err
		}
		a.dir = d
	}
	if err := os.MkdirAll(a.dir, 0o755); err != nil {
		return nil, err
	}
	if old, _ := filepath.Glob(filepath.Join(a.dir, runGlob)); len(old) > 0 {
		// load would take them with the new ones.
		return nil, fmt.Errorf("-out %s already holds %d runs: fit them with -from, or measure into another directory", a.dir, len(old))
	}
	if a.bin == "" {
		a.bin = filepath.Join(a.dir, "goccl-perf")
		b := exec.Command("go", "build", "-o", a.bin, "./cmd/goccl-perf")
		b.Dir, b.Stdout, b.Stderr = bench.ModuleRoot(), os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return nil, fmt.Errorf("building goccl-perf: %w", err)
		}
	}
	log, err := os.Create(filepath.Join(a.dir, "runs.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	fmt.Fprintf(out, "fit: measuring into %s (%d runs of each algorithm)\n", a.dir, a.reps)
	for rep := range a.reps {
		for _, tr := range a.transports {
			for _, np := range nps {
				for _, c := range cs {
					for _, al := range weighed[c] {
						name := filepath.Join(a.dir, fmt.Sprintf("%s_np%d_%s_%s_%d.json", tr, np, c, al, rep))
						argv := []string{a.bin, string(c), "-np", strconv.Itoa(np), "--transport", tr, "-algo", al.String(),
							"-b", a.b, "-e", a.e, "-f", strconv.Itoa(a.f), "-target", fmt.Sprintf("%gs", a.target),
							"-a", "3", "-c", "1", "-out-of-place-only", "-J", name}
						start := time.Now()
						if _, err := bench.RunLimited(context.Background(), argv, nil, a.limit, log); err != nil {
							return nil, fmt.Errorf("%s: %w (log: %s)", strings.Join(argv, " "), err, log.Name())
						}
						fmt.Fprintf(out, "fit: run %d/%d %s %d ranks %s %s (%.1fs)\n", rep+1, a.reps, tr, np, c, al, time.Since(start).Seconds())
					}
				}
			}
		}
	}
	return load(a.dir)
}

// runGlob matches the runs' files in a directory.
const runGlob = "*_np*_*_*_*.json"

// load reads every run's JSON in dir (named TRANSPORT_npN_COLL_ALGO_REP.json)
// and returns the median time per transport, rank count, collective,
// algorithm and size.
func load(dir string) ([]point, error) {
	files, err := filepath.Glob(filepath.Join(dir, runGlob))
	if err != nil {
		return nil, err
	}
	type key struct {
		tr    string
		np    int
		coll  bench.Coll
		algo  algorithms.Algorithm
		bytes int64
	}
	times := map[key][]float64{}
	chans := map[key]int{}
	for _, f := range files {
		tr, np, al, err := parseName(filepath.Base(f))
		if err != nil {
			return nil, err
		}
		rep, err := bench.ReadReport(f)
		if err != nil {
			return nil, err
		}
		if rep.NRanks != np {
			return nil, fmt.Errorf("%s: %d ranks, its name says %d", f, rep.NRanks, np)
		}
		for _, r := range rep.Rows {
			if r.OutOfPlace.Wrong > 0 {
				return nil, fmt.Errorf("%s: %d wrong elements at %d bytes", f, r.OutOfPlace.Wrong, r.Bytes)
			}
			k := key{tr, np, rep.Collective, al, r.Bytes}
			times[k] = append(times[k], r.OutOfPlace.TimeUs)
			chans[k] = channelsOf(r.Pick)
		}
	}
	var pts []point
	for k, ts := range times {
		pts = append(pts, point{transport: k.tr, np: k.np, coll: k.coll, algo: k.algo, channels: chans[k], bytes: k.bytes, us: median(ts), runs: len(ts)})
	}
	slices.SortFunc(pts, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.transport, b.transport), cmp.Compare(a.np, b.np), cmp.Compare(a.coll, b.coll),
			cmp.Compare(a.bytes, b.bytes), cmp.Compare(a.algo, b.algo))
	})
	return pts, nil
}

// parseName reads transport, rank count and algorithm from a run's file
// name.
func parseName(name string) (tr string, np int, al algorithms.Algorithm, err error) {
	f := strings.Split(strings.TrimSuffix(name, ".json"), "_")
	if len(f) < 5 || !strings.HasPrefix(f[1], "np") {
		return "", 0, 0, fmt.Errorf("%s: not a run of bench/fit", name)
	}
	np, err = strconv.Atoi(strings.TrimPrefix(f[1], "np"))
	if err != nil {
		return "", 0, 0, fmt.Errorf("%s: %w", name, err)
	}
	al, err = algorithms.ParseAlgorithm(f[len(f)-2])
	return f[0], np, al, err
}

// channelsOf reads the channel count from a pick such as "ring/2ch" (1
// when it says none).
func channelsOf(pick string) int {
	_, ch, ok := strings.Cut(pick, "/")
	if n, err := strconv.Atoi(strings.TrimSuffix(ch, "ch")); ok && err == nil && n > 0 {
		return n
	}
	return 1
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// problem is the tuner's question for a point on one host.
func problem(p point, m algorithms.LinkModel) algorithms.Problem {
	return algorithms.Problem{Coll: schedColl[p.coll], NRanks: p.np, Bytes: p.bytes, Link: m, Hosts: 1, PerHost: p.np, Intra: m}
}

// predicted is m's time for p in µs; +Inf where m does not weigh p's
// algorithm there (the tuner never picks it).
func predicted(p point, m algorithms.LinkModel) float64 {
	return algorithms.Cost(problem(p, m), p.algo, p.channels) * 1e6
}

// params are the four numbers fitted, as they enter the model.
type params struct{ latency, bandwidth, reduceRate, postCost float64 }

func paramsOf(m algorithms.LinkModel) params {
	post := m.PostCost
	if post == 0 {
		post = algorithms.DefaultPostCost
	}
	return params{m.Latency, m.Bandwidth, m.ReduceRate, post}
}

func (q params) apply(m algorithms.LinkModel) algorithms.LinkModel {
	m.Latency, m.Bandwidth, m.ReduceRate, m.PostCost = q.latency, q.bandwidth, q.reduceRate, q.postCost
	return m
}

// logError is the mean squared log-ratio of m's predictions to the
// points' times (so a prediction off by 2× weighs alike at 8 bytes and
// at 16 MiB), over the points m weighs.
func logError(pts []point, m algorithms.LinkModel) float64 {
	var sum float64
	var n int
	for _, p := range pts {
		if c := predicted(p, m); !math.IsInf(c, 1) && c > 0 {
			d := math.Log(c / p.us)
			sum += d * d
			n++
		}
	}
	if n == 0 {
		return math.Inf(1)
	}
	return sum / float64(n)
}

// fitModel fits m's four numbers to pts by Nelder-Mead on their
// logarithms (each stays positive), starting from m's own.
func fitModel(pts []point, m algorithms.LinkModel) (algorithms.LinkModel, error) {
	q := paramsOf(m)
	x0 := []float64{math.Log(q.latency), math.Log(q.bandwidth), math.Log(q.reduceRate), math.Log(q.postCost)}
	model := func(x []float64) algorithms.LinkModel {
		return params{math.Exp(x[0]), math.Exp(x[1]), math.Exp(x[2]), math.Exp(x[3])}.apply(m)
	}
	res, err := optimize.Minimize(optimize.Problem{Func: func(x []float64) float64 { return logError(pts, model(x)) }},
		x0, &optimize.Settings{FuncEvaluations: 20000}, &optimize.NelderMead{})
	if err != nil && res == nil {
		return m, err
	}
	return model(res.X), nil
}

// fitPicks fits m's numbers that vary names to the choices rather than
// the times: over a grid of multiples of the code's values (2^(k/2),
// |k| ≤ gridSteps), the model whose picks cost least over the
// questions, by the geometric mean of pick/fastest; of models that tie
// (the picks change in steps), the one nearest the code's. This is the
// crossovers fitted: where the code's model already picks the fastest,
// nothing moves. A pick is scored by its algorithm's measured time (at
// the channel count the code's model gave the forced run).
func fitPicks(qs []*question, m algorithms.LinkModel, vary [4]bool) algorithms.LinkModel {
	q0 := paramsOf(m)
	var steps [4]int
	for i, v := range vary {
		if v {
			steps[i] = gridSteps
		}
	}
	mult := func(k int) float64 { return math.Pow(2, float64(k)/2) }
	best, bestGeo, bestDist := m, scoreOf(qs, m).geo, 0
	var k [4]int
	for k[0] = -steps[0]; k[0] <= steps[0]; k[0]++ {
		for k[1] = -steps[1]; k[1] <= steps[1]; k[1]++ {
			for k[2] = -steps[2]; k[2] <= steps[2]; k[2]++ {
				for k[3] = -steps[3]; k[3] <= steps[3]; k[3]++ {
					c := params{q0.latency * mult(k[0]), q0.bandwidth * mult(k[1]), q0.reduceRate * mult(k[2]), q0.postCost * mult(k[3])}.apply(m)
					geo := scoreOf(qs, c).geo
					dist := abs(k[0]) + abs(k[1]) + abs(k[2]) + abs(k[3])
					// 1e-9: ties in the geometric mean are exact in
					// the picks, not in the floating point.
					if geo < bestGeo-1e-9 || geo < bestGeo+1e-9 && dist < bestDist {
						best, bestGeo, bestDist = c, geo, dist
					}
				}
			}
		}
	}
	return best
}

func abs(x int) int { return max(x, -x) }

// gridSteps bounds fitPicks' grid: each number from 1/16 to 16 times the
// code's.
const gridSteps = 8

// A question is one (rank count, collective, size) the tuner answers on
// a transport: the algorithms measured there and their times.
type question struct {
	np    int
	coll  bench.Coll
	bytes int64
	times map[algorithms.Algorithm]float64
	chans map[algorithms.Algorithm]int
	// board: goccl runs it on shared memory's board, without asking the
	// tuner (a post of at most shm.BoardMax bytes, as the engine's
	// onBoard), so no pick is scored.
	board bool
	// best and bestT: the fastest algorithm the code's model weighs here,
	// and its time (+Inf: none measured). Every model is scored against
	// it, so that a candidate cannot leave the fastest out of its own
	// count.
	best  algorithms.Algorithm
	bestT float64
}

// onBoard reports whether goccl runs coll of this size on np ranks on
// the board over transport tr: a rank posts the whole buffer, an
// all-gather's its block.
func onBoard(tr string, np int, coll bench.Coll, bytes int64) bool {
	post := bytes
	if coll == bench.AllGather {
		post = bytes / int64(np)
	}
	return tr == collective.TransportShm && post <= shm.BoardMax
}

// questions gathers pts into questions, each with its fastest algorithm
// among those ref (the code's model) weighs.
func questions(pts []point, ref algorithms.LinkModel) []*question {
	var qs []*question
	idx := map[[3]int64]*question{}
	for _, p := range pts {
		k := [3]int64{int64(p.np), int64(slices.Index(collOrder, p.coll)), p.bytes}
		q := idx[k]
		if q == nil {
			q = &question{np: p.np, coll: p.coll, bytes: p.bytes, times: map[algorithms.Algorithm]float64{}, chans: map[algorithms.Algorithm]int{},
				board: onBoard(p.transport, p.np, p.coll, p.bytes)}
			idx[k] = q
			qs = append(qs, q)
		}
		q.times[p.algo], q.chans[p.algo] = p.us, p.channels
	}
	for _, q := range qs {
		q.best, q.bestT = q.fastest(ref)
	}
	return qs
}

var collOrder = []bench.Coll{bench.AllReduce, bench.ReduceScatter, bench.AllGather, bench.Reduce, bench.Broadcast}

// fastest is q's fastest measured algorithm among those m weighs there,
// and its time (+Inf: none).
func (q *question) fastest(m algorithms.LinkModel) (algorithms.Algorithm, float64) {
	best, bt := algorithms.AlgoAuto, math.Inf(1)
	for _, a := range weighed[q.coll] {
		t, ok := q.times[a]
		if !ok {
			continue
		}
		p := point{np: q.np, coll: q.coll, algo: a, channels: q.chans[a], bytes: q.bytes}
		if math.IsInf(predicted(p, m), 1) {
			continue
		}
		if t < bt {
			best, bt = a, t
		}
	}
	return best, bt
}

// pick is m's choice for q and its measured time over the fastest's (0
// when the pick was not measured).
func (q *question) pick(m algorithms.LinkModel) (algorithms.Algorithm, float64) {
	pl := algorithms.Tune(problem(point{np: q.np, coll: q.coll, bytes: q.bytes}, m), algorithms.AlgoAuto, 0, 0)
	t, measured := q.times[pl.Algo]
	if math.IsInf(q.bestT, 1) || !measured {
		return pl.Algo, 0
	}
	return pl.Algo, t / q.bestT
}

// score counts the questions where m's pick is the fastest or within 10%
// of it, of those with a choice, and the geometric mean of pick/fastest.
type score struct {
	within, of int
	geo        float64
}

func scoreOf(qs []*question, m algorithms.LinkModel) score {
	var s score
	var logSum float64
	for _, q := range qs {
		if len(weighed[q.coll]) < 2 || q.board {
			continue
		}
		_, r := q.pick(m)
		if r == 0 {
			continue
		}
		s.of++
		if r <= 1.1 {
			s.within++
		}
		logSum += math.Log(r)
	}
	if s.of > 0 {
		s.geo = math.Exp(logSum / float64(s.of))
	}
	return s
}

// A group is the runs fitted together: one transport, with the ranks
// fitting the machine's CPUs or outnumbering them (then every hop may be a
// context switch: the code's model differs, collective.TunerLink).
type group struct {
	tr   string
	busy bool
}

func (g group) String() string {
	if g.busy {
		return g.tr + ", more ranks than CPUs"
	}
	return g.tr + ", a CPU per rank"
}

// report fits each group's model and prints the comparison; held, when
// given, is a run apart from pts on which the models are scored too.
func report(w io.Writer, pts, held []point, cpus int, vary [4]bool) {
	byG := map[group][]point{}
	heldG := map[group][]point{}
	var gs []group
	for _, p := range pts {
		g := group{p.transport, p.np > cpus}
		if _, ok := byG[g]; !ok {
			gs = append(gs, g)
		}
		byG[g] = append(byG[g], p)
	}
	for _, p := range held {
		g := group{p.transport, p.np > cpus}
		heldG[g] = append(heldG[g], p)
	}
	for _, g := range gs {
		tr := g.tr
		cur, ok := collective.TunerLink(tr, g.busy)
		if !ok {
			fmt.Fprintf(w, "\n## %s: no tuner model by that name\n", tr)
			continue
		}
		tp := byG[g]
		fitted, err := fitModel(tp, cur)
		if err != nil {
			fmt.Fprintf(w, "\n## %s: the fit failed: %v\n", g, err)
			fitted = cur
		}
		qs := questions(tp, cur)
		picked := fitPicks(qs, cur, vary)
		hq := questions(heldG[g], cur)
		fmt.Fprintf(w, "\n## %s: %d medians (%s)\n\n", g, len(tp), runsText(tp))
		fmt.Fprintf(w, "%-8s %12s %12s %14s %10s %14s %18s %10s", "model", "latency us", "GB/s", "reduce GB/s", "post", "median error", "picks within 10%", "geo mean")
		if len(hq) > 0 {
			fmt.Fprintf(w, " %26s", "on the -check run")
		}
		fmt.Fprintln(w)
		for _, row := range []struct {
			name string
			m    algorithms.LinkModel
		}{{"code", cur}, {"times", fitted}, {"picks", picked}} {
			q := paramsOf(row.m)
			s := scoreOf(qs, row.m)
			fmt.Fprintf(w, "%-8s %12.2f %12s %14s %10.2f %13.0f%% %11d of %-4d %10.3f", row.name, q.latency*1e6, gbps(q.bandwidth),
				gbps(q.reduceRate), q.postCost, 100*medianError(tp, row.m), s.within, s.of, s.geo)
			if len(hq) > 0 {
				h := scoreOf(hq, row.m)
				fmt.Fprintf(w, " %11d of %-4d %9.3f", h.within, h.of, h.geo)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "\ncode: the model in collective/init.go; times: fitted to the medians (least squares on the log of time);")
		fmt.Fprintln(w, "picks: fitted to the choices (the least costly picks on a grid of the code's values × 2^(k/2), |k| ≤ 8, nearest the code's)")
		fitted = picked
		fmt.Fprintf(w, "\nper size: each algorithm's median time (µs), * the fastest the tuner weighs; the picks, and their time over the fastest's\n")
		last := ""
		for _, q := range qs {
			if len(weighed[q.coll]) < 2 {
				continue
			}
			if h := fmt.Sprintf("%d ranks, %s", q.np, q.coll); h != last {
				last = h
				fmt.Fprintf(w, "\n%s\n%10s", h, "size")
				for _, a := range weighed[q.coll] {
					fmt.Fprintf(w, " %13s", a)
				}
				fmt.Fprintf(w, "  %-20s %-20s\n", "code's pick", "picks-fitted pick")
			}
			best := q.best
			fmt.Fprintf(w, "%10s", bench.SizeName(q.bytes))
			for _, a := range weighed[q.coll] {
				mark := " "
				if a == best {
					mark = "*"
				}
				if t, ok := q.times[a]; ok {
					fmt.Fprintf(w, " %12.2f%s", t, mark)
				} else {
					fmt.Fprintf(w, " %13s", "-")
				}
			}
			for _, m := range []algorithms.LinkModel{cur, fitted} {
				a, r := q.pick(m)
				if q.board {
					fmt.Fprintf(w, "  %-20s", "(board)")
					continue
				}
				fmt.Fprintf(w, "  %-20s", fmt.Sprintf("%s %.2f", a, r))
			}
			fmt.Fprintln(w)
		}
	}
}

// gbps prints a rate in GB/s; past 1000 GB/s (a fit that ran off: the
// rate no longer moves any prediction) as "> 1000".
func gbps(r float64) string {
	if r > 1e12 {
		return "> 1000"
	}
	return fmt.Sprintf("%.2f", r/1e9)
}

// medianError is the median of |predicted/measured - 1| over the points
// m weighs.
func medianError(pts []point, m algorithms.LinkModel) float64 {
	var e []float64
	for _, p := range pts {
		if c := predicted(p, m); !math.IsInf(c, 1) {
			e = append(e, math.Abs(c/p.us-1))
		}
	}
	if len(e) == 0 {
		return math.NaN()
	}
	return median(e)
}

func runsText(pts []point) string {
	lo, hi := math.MaxInt, 0
	for _, p := range pts {
		lo, hi = min(lo, p.runs), max(hi, p.runs)
	}
	if lo == hi {
		return fmt.Sprintf("%d runs each", lo)
	}
	return fmt.Sprintf("%d-%d runs each", lo, hi)
}
