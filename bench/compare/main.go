// Command compare runs goccl-perf side by side with its peers (Open MPI,
// MPICH, Gloo) over the same collectives, sizes and rank counts, on
// shared memory and on TCP, alternating the runs so that drift on a noisy
// machine hits every tool alike, and prints per size the ratio goccl/peer
// of time and of bus bandwidth (medians over the repetitions), with one
// overlay plot per setting. See README.md here for how to read it.
//
//	go run ./bench/compare                                  # Open MPI, 2 ranks, all-reduce, shm and tcp
//	go run ./bench/compare -peers ompi,mpich,gloo -np 2,4 -colls all_reduce,all_gather -reps 5
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccl/goccl/bench"
	"github.com/goccl/goccl/collective"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// A peer is a library goccl is measured against.
type peer struct {
	name   string // as in -peers
	label  string
	binary string   // in the build directory
	source string   // in peers/, what setup.sh builds it from
	shm    []string // command prefix for shared memory (nil: not offered)
	tcp    []string // command prefix for TCP on loopback
	// env is extra environment per transport.
	tcpEnv []string
	// ops maps goccl-perf's collective names to the binary's -o names.
	ops map[bench.Coll]string
	// nArg is how the rank count is passed when the binary forks its own
	// ranks (gloo); empty for MPI, where mpirun's -np does it.
	nArg string
}

var mpiOps = map[bench.Coll]string{bench.AllReduce: "allreduce", bench.ReduceScatter: "reduce_scatter",
	bench.AllGather: "allgather", bench.Broadcast: "bcast", bench.Reduce: "reduce"}

func peers() []peer {
	return []peer{
		{name: "ompi", label: "Open MPI", binary: "mpi_allreduce_perf", source: "mpi_allreduce_perf.c",
			shm: []string{"mpirun.openmpi", "-np", "{np}", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"},
			tcp: []string{"mpirun.openmpi", "-np", "{np}", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"},
			ops: mpiOps},
		{name: "mpich", label: "MPICH", binary: "mpi_allreduce_perf.mpich", source: "mpi_allreduce_perf.c",
			shm:    []string{"mpirun.mpich", "-np", "{np}"},
			tcp:    []string{"mpirun.mpich", "-np", "{np}"},
			tcpEnv: []string{"UCX_TLS=tcp,self", "UCX_NET_DEVICES=lo", "MPIR_CVAR_NOLOCAL=1"},
			ops:    mpiOps},
		{name: "gloo", label: "Gloo", binary: "gloo_perf", source: "gloo_perf.cc", tcp: []string{}, nArg: "-n", ops: mpiOps},
	}
}

type setting struct {
	np        int
	transport string // shm or tcp
	coll      bench.Coll
}

func (s setting) String() string { return fmt.Sprintf("%s, %d ranks, %s", s.coll, s.np, s.transport) }

func (s setting) file() string { return fmt.Sprintf("%s_np%d_%s", s.coll, s.np, s.transport) }

func run() error {
	var (
		peersF = flag.String("peers", "ompi", "peers to compare with: ompi, mpich, gloo (comma-separated)")
		npF    = flag.String("np", "2", "rank counts (comma-separated)")
		trF    = flag.String("transports", "shm,tcp", "transports: shm, tcp, hosts (two network namespaces as hosts, half of the ranks in each; root; Open MPI and MPICH) (comma-separated)")
		rateF  = flag.String("rate", "10gbit", "with -transports hosts: the veth's tc tbf rate between the hosts (none: no limit)")
		collsF = flag.String("colls", "all_reduce", "collectives: all_reduce, reduce_scatter, all_gather, broadcast, reduce (comma-separated)")
		minB   = flag.String("b", "8", "smallest size")
		maxB   = flag.String("e", "256M", "largest size")
		factor = flag.Int64("f", 8, "size factor")
		sizesF = flag.String("sizes", "", "measure exactly these sizes (comma-separated, e.g. 8,1M,64M,256M) instead of -b/-e/-f")
		reps   = flag.Int("reps", 3, "repetitions of every run (medians are reported)")
		target = flag.Float64("T", 0.3, "seconds of timed operations per size and run")
		runMax = flag.Duration("run-timeout", 10*time.Minute, "longest one tool's run may take; past it the run is killed (with its ranks) and reported as failed")
		out    = flag.String("out", "compare-out", "directory for logs, JSON and plots")
		binDir = flag.String("bin", "", "directory with the built peers (default: OUT/bin, built by setup.sh)")
		setup  = flag.Bool("setup", true, "run setup.sh (apt-get install and build the peers) when a peer binary is missing")
		perfF  = flag.String("goccl-perf", "", "goccl-perf binary (default: built from this module into OUT/bin)")
		regF   = flag.Int("R", 0, "goccl-perf's -R: 1 runs goccl on collective.MemAlloc buffers, which the ranks of a host map (the peers run on their own buffers either way)")
	)
	flag.Parse()
	if *reps < 1 {
		return errors.New("-reps must be at least 1")
	}
	if *regF != 0 && *regF != 1 {
		return fmt.Errorf("-R %d: want 0 or 1", *regF)
	}
	lo, err := collective.ParseSize(*minB)
	if err != nil {
		return fmt.Errorf("-b: %w", err)
	}
	hi, err := collective.ParseSize(*maxB)
	if err != nil {
		return fmt.Errorf("-e: %w", err)
	}
	if lo < 1 || hi < lo || *factor < 2 {
		return fmt.Errorf("want 1 ≤ -b ≤ -e and -f ≥ 2, got %d, %d, %d", lo, hi, *factor)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if *binDir == "" {
		*binDir = filepath.Join(*out, "bin")
	}
	var chosen []peer
	for _, name := range bench.SplitList(*peersF) {
		i := slices.IndexFunc(peers(), func(p peer) bool { return p.name == name })
		if i < 0 {
			return fmt.Errorf("unknown peer %q (want ompi, mpich or gloo)", name)
		}
		chosen = append(chosen, peers()[i])
	}
	var settings []setting
	for _, c := range bench.SplitList(*collsF) {
		coll, err := bench.ParseColl(c)
		if err != nil {
			return err
		}
		if _, ok := mpiOps[coll]; !ok {
			return fmt.Errorf("the peers do not measure %s", coll)
		}
		for _, n := range bench.SplitList(*npF) {
			np, err := strconv.Atoi(n)
			if err != nil || np < 2 {
				return fmt.Errorf("bad rank count %q", n)
			}
			for _, tr := range bench.SplitList(*trF) {
				if tr != "shm" && tr != "tcp" && tr != "hosts" {
					return fmt.Errorf("bad transport %q (want shm, tcp or hosts)", tr)
				}
				if tr == "hosts" && np%2 != 0 {
					return fmt.Errorf("-transports hosts puts half of the ranks on each host: -np %d is odd", np)
				}
				settings = append(settings, setting{np: np, transport: tr, coll: coll})
			}
		}
	}

	// Binaries.
	perf := *perfF
	if perf == "" {
		perf = filepath.Join(*binDir, "goccl-perf")
		if err := os.MkdirAll(*binDir, 0o755); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "compare: go build -o", perf, "./cmd/goccl-perf")
		cmd := exec.Command("go", "build", "-o", perf, "./cmd/goccl-perf")
		cmd.Dir = bench.ModuleRoot()
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building goccl-perf: %w", err)
		}
	}
	missing := false
	for _, p := range chosen {
		if stale(filepath.Join(*binDir, p.binary), filepath.Join(bench.ModuleRoot(), "bench", "compare", "peers", p.source)) {
			missing = true
		}
	}
	if missing && *setup {
		cmd := exec.Command(filepath.Join(bench.ModuleRoot(), "bench", "compare", "setup.sh"), *binDir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("setup.sh: %w", err)
		}
	}
	var avail []peer
	for _, p := range chosen {
		if _, err := os.Stat(filepath.Join(*binDir, p.binary)); err != nil {
			fmt.Fprintf(os.Stderr, "compare: %s left out: %s not built\n", p.label, p.binary)
			continue
		}
		avail = append(avail, p)
	}
	var hn *hostsNet
	if slices.ContainsFunc(settings, func(s setting) bool { return s.transport == "hosts" }) {
		if hn, err = upHosts(*rateF); err != nil {
			return err
		}
		defer hn.down()
		for _, p := range avail {
			if p.name == "gloo" {
				fmt.Fprintf(os.Stderr, "compare: %s left out of the hosts transport (it has no launcher that reaches into other namespaces; see bench/compare/hosts.go)\n", p.label)
			}
		}
	}
	logs, err := os.Create(filepath.Join(*out, "runs.log"))
	if err != nil {
		return err
	}
	defer logs.Close()

	// Runs, alternating: every repetition runs every setting with goccl
	// and each peer in turn.
	type key struct {
		s    setting
		tool string
	}
	results := map[key][][]bench.Row{}
	ctx := context.Background()
	sweeps := [][]string{{"-b", *minB, "-e", *maxB, "-f", strconv.FormatInt(*factor, 10)}}
	if *sizesF != "" {
		sweeps = nil
		for _, sz := range bench.SplitList(*sizesF) {
			if _, err := collective.ParseSize(sz); err != nil {
				return fmt.Errorf("-sizes: %w", err)
			}
			sweeps = append(sweeps, []string{"-b", sz, "-e", sz, "-f", "2"})
		}
	}
	jsonTmp := filepath.Join(*out, "last-goccl.json")
	slow := giveUps{}
	for rep := 0; rep < *reps; rep++ {
		for _, s := range settings {
			for _, sweep := range sweeps {
				if why := noCell(s, sweep); why != "" {
					if rep == 0 {
						fmt.Fprintf(os.Stderr, "compare: %s, %s: skipped, %s\n", s, strings.Join(sweep, " "), why)
					}
					continue
				}
				tools := append([]string{"goccl"}, names(avail)...)
				from := sweepFrom(sweep)
				for _, tool := range tools {
					if tool != "goccl" && slow.skip(s, tool, from) {
						continue
					}
					var argv, env []string
					if s.transport == "hosts" {
						switch tool {
						case "goccl":
							argv = hn.argv(s.np, append([]string{perf, string(s.coll), "-target", fmt.Sprintf("%gs", *target), "-a", "3", "-c", "1",
								"-R", strconv.Itoa(*regF), "-J", jsonTmp}, append(placement(s.coll), sweep...)...), hn.goccl())
						case "mpich":
							p := avail[slices.IndexFunc(avail, func(p peer) bool { return p.name == tool })]
							argv = hn.argv(s.np, append([]string{filepath.Join(*binDir, p.binary), "-o", p.ops[s.coll], "-T", fmt.Sprint(*target)}, sweep...), hn.mpich())
						case "ompi":
							p := avail[slices.IndexFunc(avail, func(p peer) bool { return p.name == tool })]
							if argv, err = hn.ompiArgv(s.np, append([]string{filepath.Join(*binDir, p.binary), "-o", p.ops[s.coll], "-T", fmt.Sprint(*target)}, sweep...)); err != nil {
								return err
							}
						default:
							continue
						}
					} else if tool == "goccl" {
						argv = append([]string{perf, string(s.coll), "-np", strconv.Itoa(s.np), "--transport", s.transport,
							"-target", fmt.Sprintf("%gs", *target), "-a", "3", "-c", "1", "-R", strconv.Itoa(*regF), "-J", jsonTmp}, append(placement(s.coll), sweep...)...)
					} else {
						p := avail[slices.IndexFunc(avail, func(p peer) bool { return p.name == tool })]
						prefix := p.shm
						if s.transport == "tcp" {
							prefix, env = p.tcp, p.tcpEnv
						}
						if prefix == nil {
							continue // this peer has no such transport
						}
						for _, a := range prefix {
							argv = append(argv, strings.ReplaceAll(a, "{np}", strconv.Itoa(s.np)))
						}
						argv = append(argv, filepath.Join(*binDir, p.binary))
						if p.nArg != "" {
							argv = append(argv, p.nArg, strconv.Itoa(s.np), "-a", "127.0.0.1")
						}
						argv = append(argv, "-o", p.ops[s.coll], "-T", fmt.Sprint(*target))
						argv = append(argv, sweep...)
					}
					fmt.Fprintf(os.Stderr, "compare: [%d/%d] %s, %s: %s\n", rep+1, *reps, s, strings.Join(sweep, " "), tool)
					rows, err := runTool(ctx, logs, argv, env, *runMax)
					if err == nil && tool == "goccl" {
						// The JSON has full precision (the table rounds
						// bandwidths to 2 decimals).
						var r *bench.Report
						if r, err = bench.ReadReport(jsonTmp); err == nil {
							rows, err = comparable(s.coll, r.Rows)
						}
					}
					if err != nil {
						fmt.Fprintf(os.Stderr, "compare:   %s failed: %v (see %s)\n", tool, err, logs.Name())
						if tool != "goccl" && errors.Is(err, bench.ErrTimedOut) {
							slow.note(s, tool, from)
							fmt.Fprintf(os.Stderr, "compare:   %s is left out of %s from %d bytes up for the rest of this comparison\n", tool, s, from)
						}
						continue
					}
					results[key{s, tool}] = append(results[key{s, tool}], rows)
				}
			}
		}
	}

	// Report.
	if *regF == 1 {
		fmt.Println("# goccl's buffers: collective.MemAlloc (goccl-perf -R 1); the peers' their own")
	}
	var verdict []verdictRow
	for _, s := range settings {
		fmt.Printf("\n## %s (medians of %d runs; ratio < 1 in time and > 1 in busbw favour goccl)\n\n", s, *reps)
		gm := medianRows(results[key{s, "goccl"}], s)
		var reports []*bench.Report
		if len(gm) > 0 {
			reports = append(reports, &bench.Report{Tool: "goccl-perf", Label: "goccl", Collective: s.coll, NRanks: s.np, Rows: gm})
		}
		best := map[int64]verdictRow{}
		for _, p := range avail {
			pm := medianRows(results[key{s, p.name}], s)
			if len(pm) == 0 {
				continue
			}
			for _, g := range gm {
				if q, ok := nearest(pm, g.Bytes); ok {
					if b, seen := best[g.Bytes]; !seen || q.OutOfPlace.TimeUs < b.peerUs {
						best[g.Bytes] = verdictRow{s: s, bytes: g.Bytes, peer: p.name, gUs: g.OutOfPlace.TimeUs, peerUs: q.OutOfPlace.TimeUs,
							ratio:  ratio(g.OutOfPlace.TimeUs, q.OutOfPlace.TimeUs),
							gRange: spread(results[key{s, "goccl"}], g.Bytes), peerRange: spread(results[key{s, p.name}], q.Bytes)}
					}
				}
			}
			reports = append(reports, &bench.Report{Tool: p.name, Label: p.label, Collective: s.coll, NRanks: s.np, Rows: pm})
			fmt.Printf("%-12s %14s %14s %8s %12s %12s %8s\n", "size", "goccl us", p.name+" us", "time x", "goccl GB/s", p.name+" GB/s", "busbw x")
			for _, g := range gm {
				q, ok := nearest(pm, g.Bytes)
				if !ok {
					continue
				}
				fmt.Printf("%-12s %14.2f %14.2f %8.2f %12.3f %12.3f %8.2f\n", bench.SizeName(g.Bytes), g.OutOfPlace.TimeUs, q.OutOfPlace.TimeUs,
					ratio(g.OutOfPlace.TimeUs, q.OutOfPlace.TimeUs), g.OutOfPlace.BusBW, q.OutOfPlace.BusBW, ratio(g.OutOfPlace.BusBW, q.OutOfPlace.BusBW))
			}
			fmt.Println()
		}
		for _, r := range reports {
			r.Summarise()
			if err := r.WriteJSON(filepath.Join(*out, s.file()+"_"+r.Tool+".json")); err != nil {
				return err
			}
		}
		for _, g := range gm {
			b, ok := best[g.Bytes]
			if !ok {
				// Every peer's runs failed here: said in the verdict, so
				// that a missing row is not read as a win.
				b = verdictRow{s: s, bytes: g.Bytes, gUs: g.OutOfPlace.TimeUs}
			}
			verdict = append(verdict, b)
		}
		if len(reports) > 0 {
			png := filepath.Join(*out, s.file()+".png")
			if err := bench.Plot(png, s.String(), reports, false); err != nil {
				return err
			}
			fmt.Printf("plot: %s\n", png)
		}
	}
	printVerdict(os.Stdout, verdict)
	return nil
}

// verdictRow is goccl against the fastest peer at one setting and size.
type verdictRow struct {
	s           setting
	bytes       int64
	ratio       float64 // goccl's time over the fastest peer's
	peer        string  // the fastest peer
	gUs, peerUs float64
	// The fastest and slowest run of each, in µs.
	gRange, peerRange [2]float64
}

// apart reports whether every run of one was faster than every run of
// the other: then the median's verdict is not the machine's noise.
func (r verdictRow) apart() bool {
	return r.gRange[1] < r.peerRange[0] || r.peerRange[1] < r.gRange[0]
}

// spread returns the fastest and slowest out-of-place time among the
// runs at size bytes.
func spread(runs [][]bench.Row, size int64) [2]float64 {
	var s [2]float64
	first := true
	for _, rows := range runs {
		for _, r := range rows {
			if r.Bytes != size {
				continue
			}
			t := r.OutOfPlace.TimeUs
			if first || t < s[0] {
				s[0] = t
			}
			if first || t > s[1] {
				s[1] = t
			}
			first = false
		}
	}
	return s
}

// printVerdict prints, for every setting and size, goccl's time over the
// fastest peer's there, and counts where goccl is ahead.
func printVerdict(w io.Writer, rows []verdictRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Verdict: goccl's time over the fastest peer's (< 1: goccl ahead)\n\n")
	fmt.Fprintf(w, "runs: apart when every run of one was faster than every run of the other,\n")
	fmt.Fprintf(w, "overlap when the medians' order is within the runs' spread\n\n")
	fmt.Fprintf(w, "%-34s %-10s %10s %12s %12s %-10s %-8s\n", "setting", "size", "time x", "goccl us", "best us", "best peer", "runs")
	ahead, behindApart, compared := 0, 0, 0
	var unmatched []string
	for _, r := range rows {
		if r.peer == "" {
			fmt.Fprintf(w, "%-34s %-10s %10s %12.2f %12s   no peer result (their runs failed: see OUT/runs.log)\n", r.s, bench.SizeName(r.bytes), "-", r.gUs, "-")
			unmatched = append(unmatched, fmt.Sprintf("%s %s", r.s, bench.SizeName(r.bytes)))
			continue
		}
		compared++
		runs := "overlap"
		if r.apart() {
			runs = "apart"
		}
		mark := ""
		if r.ratio < 1 {
			ahead++
		} else {
			mark = "  <- behind"
			if runs == "apart" {
				behindApart++
			}
		}
		fmt.Fprintf(w, "%-34s %-10s %10.2f %12.2f %12.2f %-10s %-8s%s\n", r.s, bench.SizeName(r.bytes), r.ratio, r.gUs, r.peerUs, r.peer, runs, mark)
	}
	fmt.Fprintf(w, "\ngoccl ahead of every peer at %d of %d settings and sizes; behind in every run at %d\n", ahead, compared, behindApart)
	if len(unmatched) > 0 {
		fmt.Fprintf(w, "no peer result at %d: %s\n", len(unmatched), strings.Join(unmatched, ", "))
	}
}

// giveUps records, per setting and peer, the smallest size at which a
// run of the peer was killed at -run-timeout. Later rounds skip the peer
// there and at every larger size of the setting: a run that took past the
// limit at one size (MPICH's 4 ranks over TCP on 2 cores took
// milliseconds an 8-byte operation, and most of its runs were killed at
// 30 s) would only cost the limit again, round after round, for a cell it
// cannot fill.
type giveUps map[giveUp]int64

type giveUp struct {
	s    setting
	tool string
}

// note records that tool's run of s from bytes was killed.
func (g giveUps) note(s setting, tool string, bytes int64) {
	if b, ok := g[giveUp{s, tool}]; !ok || bytes < b {
		g[giveUp{s, tool}] = bytes
	}
}

// skip reports whether tool is left out of s from bytes.
func (g giveUps) skip(s setting, tool string, bytes int64) bool {
	b, ok := g[giveUp{s, tool}]
	return ok && bytes >= b
}

// sweepFrom is the smallest size of a sweep (its -b), 0 where it has none.
func sweepFrom(sweep []string) int64 {
	for i := 0; i+1 < len(sweep); i++ {
		if sweep[i] == "-b" {
			if b, err := collective.ParseSize(sweep[i+1]); err == nil {
				return b
			}
		}
	}
	return 0
}

// runTool runs one benchmark command (bench.RunLimited: killed with its
// ranks past limit), logs its output and parses its table.
func runTool(ctx context.Context, log io.Writer, argv, env []string, limit time.Duration) ([]bench.Row, error) {
	out, err := bench.RunLimited(ctx, argv, append([]string{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}, env...), limit, log)
	if err != nil {
		return nil, err
	}
	rows, err := bench.ParseTable(bytes.NewReader(out))
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.OutOfPlace.Wrong > 0 {
			return nil, fmt.Errorf("%d wrong elements at %d bytes", r.OutOfPlace.Wrong, r.Bytes)
		}
	}
	return rows, nil
}

// stale reports whether a peer's binary must be built: it is missing, or
// older than its source (a peer that learnt a collective since).
func stale(binary, source string) bool {
	b, err := os.Stat(binary)
	if err != nil {
		return true
	}
	src, err := os.Stat(source)
	return err == nil && src.ModTime().After(b.ModTime())
}

// noCell says why a single-size sweep has nothing to measure: a
// reduce-scatter's or all-gather's size is every rank's block together,
// and below one float (4 bytes) per rank no tool has a block to move.
func noCell(s setting, sweep []string) string {
	if s.coll != bench.ReduceScatter && s.coll != bench.AllGather || sweep[1] != sweep[3] {
		return ""
	}
	n, err := collective.ParseSize(sweep[1])
	if err != nil || n >= int64(4*s.np) {
		return ""
	}
	return fmt.Sprintf("%d bytes is less than one float per rank for %d ranks", n, s.np)
}

// placement is the goccl-perf flags that measure what the peers do. A
// broadcast has one buffer in MPI (MPI_Bcast) and in Gloo, so it is in
// place there: goccl's in-place broadcast is the like-for-like figure
// (out of place, the root also copies its input into its output, which
// the peers never do), measured with the out-of-place one and taken by
// comparable. Everything else the peers run out of place.
func placement(c bench.Coll) []string {
	if c == bench.Broadcast {
		return nil
	}
	return []string{"-out-of-place-only"}
}

// comparable puts goccl's like-for-like figure (placement) in each
// row's OutOfPlace column, which the report compares.
func comparable(c bench.Coll, rows []bench.Row) ([]bench.Row, error) {
	if c != bench.Broadcast {
		return rows, nil
	}
	for i, r := range rows {
		if r.InPlace == nil {
			return nil, fmt.Errorf("goccl-perf reported no in-place broadcast at %d bytes", r.Bytes)
		}
		rows[i].OutOfPlace, rows[i].InPlace = *r.InPlace, nil
	}
	return rows, nil
}

// medianRows combines repetitions: per size, the median time, and the
// bandwidths recomputed from it with nccl-tests' factor, at full precision
// (the peers print 3 decimals of GB/s, which is 0.001 at 8 bytes).
func medianRows(runs [][]bench.Row, s setting) []bench.Row {
	bySize := map[int64][]bench.Row{}
	for _, rows := range runs {
		for _, r := range rows {
			bySize[r.Bytes] = append(bySize[r.Bytes], r)
		}
	}
	var out []bench.Row
	for size, rs := range bySize {
		sort.Slice(rs, func(i, j int) bool { return rs[i].OutOfPlace.TimeUs < rs[j].OutOfPlace.TimeUs })
		m := rs[len(rs)/2]
		if len(rs)%2 == 0 {
			m.OutOfPlace.TimeUs = (rs[len(rs)/2-1].OutOfPlace.TimeUs + rs[len(rs)/2].OutOfPlace.TimeUs) / 2
		}
		if t := m.OutOfPlace.TimeUs; t > 0 {
			m.OutOfPlace.AlgBW = float64(size) / t / 1e3
			m.OutOfPlace.BusBW = m.OutOfPlace.AlgBW * bench.BusFactor(s.coll, s.np)
		}
		m.Bytes = size
		m.InPlace = nil
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bytes < out[j].Bytes })
	return out
}

// nearest finds the peer's row for a size: the same size, or within 10%
// (the tools round sizes to whole blocks per rank differently).
func nearest(rows []bench.Row, size int64) (bench.Row, bool) {
	for _, r := range rows {
		if d := float64(r.Bytes-size) / float64(size); d > -0.1 && d < 0.1 {
			return r, true
		}
	}
	return bench.Row{}, false
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func names(ps []peer) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.name)
	}
	return out
}
