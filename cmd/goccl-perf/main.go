// Command goccl-perf measures goccl's collectives the way nccl-tests'
// all_reduce_perf and its siblings measure NCCL's: a sweep over sizes,
// time per operation, algorithm and bus bandwidth out of place and in
// place, every result checked, in nccl-tests' table layout, and under it
// the algorithm and channel count goccl's tuner chose at each size.
//
//	goccl-perf -np 2                                  # 2 local ranks, all_reduce, 8 B to 64 MiB
//	goccl-perf reduce_scatter -np 4 -b 1K -e 1G -f 4   # another collective
//	goccl-perf -np 3 -b 8 -e 4M -f 16 -d all -o all    # every type and operator
//	goccl-run -np 4 goccl-perf -b 1M -e 1G             # or under any launcher
//	goccl-perf -np 2 -J run.json --plot run.png        # machine-readable results and a plot
//	goccl-perf plot a.json b.json -o cmp.png           # overlay runs (or nccl-tests text tables)
//
// Without -np it joins the job its launcher describes (collective.InitFromEnv),
// so it runs unchanged under goccl-run, mpirun, srun, torchrun or a
// Kubernetes Job. See the README and `goccl-perf -h` for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/bench"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/cuda"
	"github.com/goccl/goccl/internal/launch"
	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/topology"
	"github.com/goccl/goccl/topology/gonvml"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// progressEnv tells ranks started by -np to draw progress on the terminal.
const progressEnv = "GOCCL_PERF_PROGRESS"

type config struct {
	np       int
	local    bool
	opts     bench.Options
	coll     []collective.Option
	params   bench.Params
	jsonPath string
	plotPath string
	cpuProf  string
	tls      bool // -np: make a throwaway CA and turn TLS on in the children
	gpu      bool // --device gpu: buffers in CUDA device memory
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "plot" {
		return plotCmd(args[1:])
	}
	coll := "all_reduce"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		coll, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("goccl-perf", flag.ContinueOnError)
	fs.Usage = func() { usage(fs) }
	var (
		np       = fs.Int("np", 0, "start this many local ranks (processes; goroutines with -local)")
		local    = fs.Bool("local", false, "run the -np ranks as goroutines in this process")
		collF    = fs.String("C", "", "collective: all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, sendrecv (or give it first, as a subcommand)")
		minB     = fs.String("b", "8", "smallest size in bytes (K, M, G suffixes)")
		maxB     = fs.String("e", "64M", "largest size in bytes (K, M, G suffixes)")
		factor   = fs.Int64("f", 2, "multiply the size by this from one row to the next (1: add -i instead)")
		step     = fs.String("i", "1M", "add this many bytes from one row to the next when -f is 1")
		iters    = fs.Int("n", 20, "timed iterations per size and placement")
		warmup   = fs.Int("w", 5, "untimed warmup iterations per size and placement")
		checkN   = fs.Int("c", 1, "check each result this many times (0: no checking)")
		ops      = fs.String("o", "sum", "reduction: sum, prod, min, max, avg, a comma-separated list, or all")
		types    = fs.String("d", "float", "data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2, a list, or all")
		root     = fs.String("r", "0", "root of broadcast and reduce, or all (-1) for every rank in turn")
		blocking = fs.Int("z", 1, "1: each operation completes before the next starts; 0: start them asynchronously, wait once")
		agg      = fs.Int("a", 1, "how the ranks' times combine: 0 rank 0, 1 average, 2 minimum, 3 maximum")
		timeout  = fs.Int("T", 0, "fail an operation that takes longer than this many seconds (0: goccl's default, GOCCL_TIMEOUT)")
		target   = fs.Duration("target", 0, "time each size for about this long instead of -n iterations (e.g. 0.5s)")
		jsonPath = fs.String("J", "", "write the results as JSON to this file")
		plotPath = fs.String("plot", "", "draw busbw and time against size into this PNG file")
		tr       = fs.String("transport", "", "force the transport: shm, tcp or verbs (default: GOCCL_TRANSPORT, else auto)")
		tlsF     = fs.Bool("tls", false, "with -np: mutual TLS on the TCP connections, with a throwaway CA made for this run (a launched job sets GOCCL_TLS_CERT, _KEY and _CA instead)")
		algo     = fs.String("algo", "", "force the all-reduce algorithm: ring, tree, recdoubling, rabenseifner, oneshot, hier, hiertree (reduce-scatter and all-gather follow ring, oneshot and hier; all-gather recdoubling too; reduce ring and oneshot)")
		channels = fs.Int("channels", 0, "force the number of channels (1..32)")
		chunk    = fs.String("chunk", "", "force the pipelining chunk size (K, M suffixes)")
		oop      = fs.Bool("out-of-place-only", false, "skip the in-place runs (their columns print N/A)")
		cpuProf  = fs.String("cpuprofile", "", "write each rank's CPU profile to this file with .RANK appended (go tool pprof reads it)")
		regF     = fs.Int("R", 0, "1: host buffers from collective.MemAlloc, which the ranks of a host map (one copy over shared memory; as nccl-tests' -R registers NCCL's); 2: Go memory registered with collective.Register (its whole pages mapped alike); 0: Go memory")
		devF     = fs.String("device", "host", "where the buffers live: host, or gpu (CUDA device memory, rank r on GPU r modulo their count; results checked on the host after a copy back)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected argument %q (a collective goes first: goccl-perf reduce_scatter -np 2)", fs.Arg(0)))
	}
	if *collF != "" {
		coll = *collF
	}
	cfg := config{np: *np, local: *local, jsonPath: *jsonPath, plotPath: *plotPath, cpuProf: *cpuProf, tls: *tlsF}
	switch *devF {
	case "host":
	case "gpu", "cuda":
		cfg.gpu = true
	default:
		return fail(fmt.Errorf("--device %q: want host or gpu", *devF))
	}
	o := &cfg.opts
	var err error
	if o.Coll, err = bench.ParseColl(coll); err != nil {
		return fail(err)
	}
	if o.MinBytes, err = collective.ParseSize(*minB); err != nil {
		return fail(fmt.Errorf("-b: %w", err))
	}
	if o.MaxBytes, err = collective.ParseSize(*maxB); err != nil {
		return fail(fmt.Errorf("-e: %w", err))
	}
	if o.Step, err = collective.ParseSize(*step); err != nil {
		return fail(fmt.Errorf("-i: %w", err))
	}
	o.Factor = *factor
	o.Iters, o.Warmup, o.Check, o.Target = *iters, *warmup, *checkN, *target
	if o.Warmup == 0 {
		o.Warmup = -1 // none (bench's zero means its default)
	}
	if o.Iters == 0 && o.Target == 0 {
		return fail(errors.New("-n 0 times nothing; give -n ≥ 1 or -target"))
	}
	if o.Types, err = bench.ParseTypes(*types); err != nil {
		return fail(fmt.Errorf("-d: %w", err))
	}
	if o.Ops, err = bench.ParseOps(*ops); err != nil {
		return fail(fmt.Errorf("-o: %w", err))
	}
	if o.Root, err = bench.ParseRoot(*root); err != nil {
		return fail(fmt.Errorf("-r: %w", err))
	}
	if *blocking != 0 && *blocking != 1 {
		return fail(fmt.Errorf("-z %d: want 0 or 1", *blocking))
	}
	o.Blocking = *blocking == 1
	o.OutOfPlaceOnly = *oop
	switch {
	case *regF < 0 || *regF > 2:
		return fail(fmt.Errorf("-R %d: want 0, 1 or 2", *regF))
	case *regF != 0 && cfg.gpu:
		return fail(fmt.Errorf("-R %d shares host buffers: drop --device gpu", *regF))
	}
	o.Shared = *regF == 1
	o.Registered = *regF == 2
	o.Agg = bench.Aggregation(*agg)
	cfg.params = bench.ParamsOf(*o)
	if *timeout < 0 {
		return fail(fmt.Errorf("-T %d: want seconds ≥ 0", *timeout))
	} else if *timeout > 0 {
		cfg.coll = append(cfg.coll, collective.WithTimeout(time.Duration(*timeout)*time.Second))
	}
	if *tr != "" {
		cfg.coll = append(cfg.coll, collective.WithTransport(*tr))
		cfg.params.Transport = *tr
	}
	switch {
	case *tlsF && cfg.local:
		return fail(errors.New("--tls protects connections between processes: drop -local"))
	case *tlsF && cfg.np == 0 && os.Getenv(collective.EnvTLSCert) == "":
		return fail(errors.New("--tls makes certificates only for the ranks it starts (-np N); a launched job sets GOCCL_TLS_CERT, GOCCL_TLS_KEY and GOCCL_TLS_CA"))
	}
	cfg.params.TLS = *tlsF || os.Getenv(collective.EnvTLSCert) != ""
	if cfg.gpu {
		// Fail here, before any rank starts, when there is no GPU to use.
		if _, err := gpus(); err != nil {
			return fail(fmt.Errorf("--device gpu: %w", err))
		}
		cfg.params.Device = "gpu"
	}
	if *algo != "" && *algo != "auto" {
		a, err := algorithms.ParseAlgorithm(*algo)
		if err != nil {
			return fail(fmt.Errorf("-algo: %w", err))
		}
		cfg.coll = append(cfg.coll, collective.WithAlgorithm(a))
		cfg.params.Algo = a.String()
	}
	if *channels != 0 {
		cfg.coll = append(cfg.coll, collective.WithChannels(*channels))
		cfg.params.Channels = *channels
	}
	if *chunk != "" {
		b, err := collective.ParseSize(*chunk)
		if err != nil {
			return fail(fmt.Errorf("-chunk: %w", err))
		}
		cfg.coll = append(cfg.coll, collective.WithChunkSize(b))
		cfg.params.Chunk = b
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch {
	case cfg.np > 0 && cfg.local:
		return runLocal(ctx, cfg)
	case cfg.np > 0:
		return runProcesses(ctx, cfg, args)
	case cfg.local:
		return fail(errors.New("-local needs -np N"))
	}
	if cfg.gpu {
		devs, err := gpus()
		if err != nil {
			return fail(err)
		}
		d := devs[localRank()%len(devs)]
		s, err := d.NewStream()
		if err != nil {
			return fail(err)
		}
		defer s.Close()
		cfg.opts.Stream = s
		cfg.coll = append(cfg.coll, collective.WithDevice(d))
		cfg.coll = append(cfg.coll, topologyOption()...)
	}
	c, err := collective.InitFromEnv(ctx, cfg.coll...)
	if errors.Is(err, launch.ErrNoLauncher) {
		return fail(fmt.Errorf("%w\n(run under a launcher, or give -np N to start N local ranks)", err))
	}
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	if cfg.cpuProf != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", cfg.cpuProf, c.Rank()))
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	return sweep(ctx, c, cfg)
}

// runProcesses starts np copies of this program as the ranks.
func runProcesses(ctx context.Context, cfg config, args []string) int {
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	var env []string
	if isTerminal(os.Stderr) {
		env = append(env, progressEnv+"=tty")
	}
	if cfg.tls {
		dir, err := os.MkdirTemp("", "goccl-perf-tls-")
		if err != nil {
			return fail(err)
		}
		defer os.RemoveAll(dir)
		ca, err := tlsrec.NewCA("goccl-perf throwaway CA")
		if err != nil {
			return fail(err)
		}
		f, err := ca.WriteFiles(dir, "rank")
		if err != nil {
			return fail(err)
		}
		env = append(env, collective.EnvTLSCert+"="+f.Cert, collective.EnvTLSKey+"="+f.Key, collective.EnvTLSCA+"="+f.CA)
	}
	coll := string(cfg.opts.Coll)
	err = launch.Run(ctx, launch.Options{NP: cfg.np, Program: self, Args: append([]string{coll}, withoutNP(args)...),
		Env: env, Stdout: os.Stdout, Stderr: os.Stderr, PlainStdout: true})
	var ee *launch.ExitError
	if errors.As(err, &ee) && ee.Code > 0 {
		fmt.Fprintln(os.Stderr, "goccl-perf:", err)
		return ee.Code
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// topologyOption gives the communicator this machine's topology, so that
// the GPUs' links (NVLink, PCI) tune its device operations: best effort,
// as goccl-topo discovers it (NVML and sysfs).
func topologyOption() []collective.Option {
	d, err := topology.Discover("/", gonvml.System())
	if err != nil {
		return nil
	}
	return []collective.Option{collective.WithTopology(d.System)}
}

// runLocal runs the ranks as goroutines over in-process connections.
func runLocal(ctx context.Context, cfg config) int {
	var streams []collective.Stream
	if cfg.gpu {
		devs, err := gpus()
		if err != nil {
			return fail(err)
		}
		mine := make([]collective.Device, cfg.np)
		for r := range mine {
			mine[r] = devs[r%len(devs)]
			s, err := devs[r%len(devs)].NewStream()
			if err != nil {
				return fail(err)
			}
			defer s.Close()
			streams = append(streams, s)
		}
		cfg.coll = append(cfg.coll, collective.WithDevice(mine...))
		cfg.coll = append(cfg.coll, topologyOption()...)
	}
	comms, err := collective.NewLocalGroup(cfg.np, cfg.coll...)
	if err != nil {
		return fail(err)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	codes := make(chan int, len(comms))
	for r, c := range comms {
		cfg := cfg
		if streams != nil {
			cfg.opts.Stream = streams[r]
		}
		go func() { codes <- sweep(ctx, c, cfg) }()
	}
	code := 0
	for range comms {
		if c := <-codes; c != 0 && code == 0 {
			code = c
		}
	}
	return code
}

// sweep runs the benchmark on c; rank 0 prints the table and writes the
// files. It returns the exit status.
func sweep(ctx context.Context, c *collective.Comm, cfg config) int {
	rep := &bench.Report{Tool: "goccl-perf", Collective: cfg.opts.Coll, NRanks: c.Size(), Ranks: c.Ranks(), Params: cfg.params,
		Date: time.Now().UTC()}
	var sink bench.Sink
	var prog *progress
	if c.Rank() == 0 {
		bench.Table{}.Header(os.Stdout, rep)
		prog = newProgress()
		sink = bench.Printer{W: os.Stdout, OnProgress: prog.show}
	}
	start := time.Now()
	rows, err := bench.Run(ctx, c, cfg.opts, sink)
	prog.clear()
	rep.Rows = rows
	rep.Summarise()
	if err != nil && !errors.Is(err, bench.ErrWrong) {
		rep.Error = err.Error()
	}
	if c.Rank() != 0 {
		if err != nil && !errors.Is(err, bench.ErrWrong) {
			fmt.Fprintln(os.Stderr, "goccl-perf:", err)
		}
		return exitCode(err)
	}
	bench.Table{}.Footer(os.Stdout, rep)
	printPicks(os.Stdout, c, cfg.opts.Coll, rep.Rows)
	fmt.Fprintf(os.Stdout, "# Total time %.1fs\n", time.Since(start).Seconds())
	if cfg.jsonPath != "" {
		if werr := rep.WriteJSON(cfg.jsonPath); werr != nil {
			fmt.Fprintln(os.Stderr, "goccl-perf: -J:", werr)
			return 1
		}
	}
	if cfg.plotPath != "" && len(rows) > 0 {
		rep.Label = fmt.Sprintf("goccl %d ranks", c.Size())
		if perr := bench.Plot(cfg.plotPath, fmt.Sprintf("goccl %s, %d ranks", cfg.opts.Coll, c.Size()), []*bench.Report{rep}, true); perr != nil {
			fmt.Fprintln(os.Stderr, "goccl-perf: --plot:", perr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "goccl-perf:", err)
	}
	return exitCode(err)
}

// benchColls maps goccl-perf's collectives to the schedules'.
var benchColls = map[bench.Coll]algorithms.Collective{bench.AllReduce: algorithms.CollAllReduce,
	bench.ReduceScatter: algorithms.CollReduceScatter, bench.AllGather: algorithms.CollAllGather,
	bench.Broadcast: algorithms.CollBroadcast, bench.Reduce: algorithms.CollReduce,
	bench.AllToAll: algorithms.CollAllToAll, bench.SendRecv: algorithms.CollSend}

// printPicks writes, under the table, the algorithm and channel count the
// tuner chose at each size measured (Comm.Choose), so that its crossovers
// can be read off a sweep, and records each in its rows' Pick (the JSON's
// "pick", which bench/fit reads).
func printPicks(w io.Writer, c *collective.Comm, coll bench.Coll, rows []bench.Row) {
	bc, ok := benchColls[coll]
	if !ok || len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "# Algorithm per size (the tuner's pick; GOCCL_ALGO or -algo forces one):")
	seen := map[[2]any]string{}
	for i := range rows {
		r := &rows[i]
		k := [2]any{r.Bytes, r.Type}
		if pick, ok := seen[k]; ok {
			r.Pick = pick
			continue
		}
		seen[k] = ""
		dts, err := bench.ParseTypes(r.Type)
		if err != nil || len(dts) != 1 {
			continue
		}
		ch, err := c.Choose(bc, dts[0], r.Count)
		if err != nil {
			fmt.Fprintf(w, "#  %12d %8s  ? (%v)\n", r.Bytes, r.Type, err)
			continue
		}
		r.Pick, seen[k] = ch.String(), ch.String()
		fmt.Fprintf(w, "#  %12d %8s  %s\n", r.Bytes, r.Type, ch)
	}
}

// gpus opens every CUDA device, once per process.
var gpus = sync.OnceValues(func() ([]*cuda.Device, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	return drv.Devices()
})

// localRank is this process's index among the job's ranks on its host, as
// its launcher says (else its rank, else 0), which picks its GPU.
func localRank() int {
	e, err := launch.FromEnv(os.LookupEnv)
	switch {
	case err != nil:
		return 0
	case e.LocalRank >= 0:
		return e.LocalRank
	}
	return e.Rank
}

func exitCode(err error) int {
	if err != nil {
		return 1
	}
	return 0
}

// plotCmd is `goccl-perf plot [-o out.png] [-title T] [-inplace] FILE...`.
func plotCmd(args []string) int {
	fs := flag.NewFlagSet("goccl-perf plot", flag.ContinueOnError)
	out := fs.String("o", "goccl-perf.png", "PNG file to write")
	title := fs.String("title", "", "plot title (default: the collective)")
	inPlace := fs.Bool("inplace", false, "also draw the in-place results, dashed")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: goccl-perf plot [-o out.png] [-title T] [-inplace] FILE...\n\n"+
			"Overlays runs: each FILE is a goccl-perf -J file, or a text table in nccl-tests' layout\n"+
			"(goccl-perf's, nccl-tests' or the baseline tools' output), labelled by its name.")
		fs.PrintDefaults()
	}
	// Flags may follow the files (goccl-perf plot a.json b.json -o c.png):
	// move them first, for the flag package.
	var flagArgs, files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" || a == "--o" || a == "-title" || a == "--title":
			flagArgs = append(flagArgs, a)
			if i+1 < len(args) {
				flagArgs = append(flagArgs, args[i+1])
				i++
			}
		case strings.HasPrefix(a, "-") && a != "-":
			flagArgs = append(flagArgs, a)
		default:
			files = append(files, a)
		}
	}
	if err := fs.Parse(append(flagArgs, files...)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	var reps []*bench.Report
	for _, p := range fs.Args() {
		r, err := bench.ReadReport(p)
		if err != nil {
			return fail(err)
		}
		if r.Label == p {
			r.Label = strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
		}
		reps = append(reps, r)
	}
	t := *title
	if t == "" {
		t = string(reps[0].Collective)
		if t == "" {
			t = "comparison"
		}
	}
	if err := bench.Plot(*out, t, reps, *inPlace); err != nil {
		return fail(err)
	}
	fmt.Println("wrote", *out)
	return 0
}

// progress draws "[i/total] what" on the terminal while rank 0 sweeps:
// on stderr when it is a terminal, or on /dev/tty when the launching
// goccl-perf -np said its stderr was one.
type progress struct {
	w    io.WriteCloser
	last time.Time
}

func newProgress() *progress {
	switch {
	case os.Getenv(progressEnv) == "tty":
		if f, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			return &progress{w: f}
		}
	case isTerminal(os.Stderr):
		return &progress{w: nopCloser{os.Stderr}}
	}
	return nil
}

func (p *progress) show(i, total int, label string) {
	if p == nil || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s", i+1, total, label)
}

func (p *progress) clear() {
	if p == nil {
		return
	}
	io.WriteString(p.w, "\r\033[K")
	p.w.Close()
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// withoutNP drops -np N (and -np=N), and a leading collective name, from
// the arguments for the children.
func withoutNP(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-np" || a == "--np":
			i++
		case strings.HasPrefix(a, "-np=") || strings.HasPrefix(a, "--np="):
		default:
			out = append(out, a)
		}
	}
	return out
}

func usage(fs *flag.FlagSet) {
	fmt.Fprintln(fs.Output(), `usage: goccl-perf [COLLECTIVE] [-np N [-local]] [flags]
       goccl-perf plot [-o out.png] FILE...

Measures a collective over a sweep of sizes, out of place and in place,
checking every result, and prints nccl-tests' table. COLLECTIVE is
all_reduce (default), reduce_scatter, all_gather, broadcast, reduce,
alltoall or sendrecv. Exits non-zero when any element is wrong.

Flags:`)
	fs.PrintDefaults()
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "goccl-perf:", err)
	return 1
}
