// Command ddp trains a small neural network data-parallel, the way
// PyTorch's DistributedDataParallel does, on goccl: every rank holds the
// whole model and its own shard of the data; after each backward pass the
// gradients are averaged across ranks with all-reduce, in buckets started
// asynchronously as the backward pass produces them (last layer first),
// so that communication overlaps the rest of the backward pass; every
// rank then takes the same optimizer step. The model is a two-layer
// perceptron in gonum (float64), fitting a smooth function of 16 inputs.
//
//	go build -o /tmp/ddp ./examples/ddp && go run ./cmd/goccl-run -np 4 /tmp/ddp
//	go run ./cmd/goccl-run -np 2 /tmp/ddp -steps 300 -bucket 64K -overlap=false
//
// Rank 0 prints the loss (averaged over the ranks) as it falls, the time
// per step, and checks at the end that every rank's weights are
// bit-identical (their hashes all-gathered); the command fails if they are
// not, or if the loss did not fall.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"time"
	"unsafe"

	"gonum.org/v1/gonum/mat"

	"github.com/goccl/goccl/collective"
)

// Config is a training run.
type Config struct {
	Steps  int   // optimizer steps
	Batch  int   // samples per rank per step
	Hidden int   // hidden units
	Bucket int64 // gradient bucket size in bytes (DDP's default is 25 MiB)
	// Overlap starts each bucket's all-reduce as soon as its gradients
	// are ready; without it every bucket is all-reduced after the
	// backward pass.
	Overlap bool
	LR      float64
	Log     io.Writer // rank 0's progress; nil: none
}

const inputs = 16

// Result is what a run ends with, on every rank.
type Result struct {
	FirstLoss, LastLoss float64       // averaged over the ranks
	PerStep             time.Duration // median wall time of a step on this rank
	Hash                uint64        // of the weights
}

// model holds the weights and, as views into the gradient buckets, their
// gradients: all-reducing a bucket averages the gradients in place.
type model struct {
	w1, b1, w2, b2     *mat.Dense // weights
	gw1, gb1, gw2, gb2 *mat.Dense // gradients (views into buckets)
	buckets            [][]float64
	// order is the buckets in the order the backward pass fills them;
	// ready[i] is the layer after which bucket i is complete.
	ready []int
}

// layer sizes, last first (the order backward produces them).
func layerSizes(hidden int) [4]int { return [4]int{1, hidden, hidden, hidden * inputs} } // b2, w2, b1, w1

func newModel(hidden int, bucketBytes int64, rng *rand.Rand) *model {
	m := &model{
		w1: mat.NewDense(hidden, inputs, nil), b1: mat.NewDense(hidden, 1, nil),
		w2: mat.NewDense(1, hidden, nil), b2: mat.NewDense(1, 1, nil),
	}
	for _, w := range []*mat.Dense{m.w1, m.w2} {
		r, c := w.Dims()
		s := math.Sqrt(2 / float64(c))
		for i := range r {
			for j := range c {
				w.Set(i, j, rng.NormFloat64()*s)
			}
		}
	}
	// Buckets: the gradients in backward order, a new bucket whenever the
	// next layer would overflow the current one (a layer larger than a
	// bucket gets one of its own), as DDP assigns them.
	sizes := layerSizes(hidden)
	per := int(max(bucketBytes/8, 1))
	var bucketOf [4]int
	var offs [4]int
	cur, used := -1, 0
	var lens []int
	for l, n := range sizes {
		if used+n > per && used > 0 || cur < 0 {
			cur++
			lens = append(lens, 0)
			used = 0
		}
		bucketOf[l], offs[l] = cur, used
		used += n
		lens[cur] = used
	}
	m.buckets = make([][]float64, len(lens))
	for i, n := range lens {
		m.buckets[i] = make([]float64, n)
	}
	view := func(l, r, c int) *mat.Dense {
		b := m.buckets[bucketOf[l]]
		return mat.NewDense(r, c, b[offs[l]:offs[l]+r*c])
	}
	m.gb2, m.gw2, m.gb1, m.gw1 = view(0, 1, 1), view(1, 1, hidden), view(2, hidden, 1), view(3, hidden, inputs)
	m.ready = make([]int, len(lens))
	for l := range sizes {
		m.ready[bucketOf[l]] = l // the bucket's last layer
	}
	return m
}

// params are the weights' backing arrays, for broadcasts and the hash.
func (m *model) params() [][]float64 {
	return [][]float64{m.w1.RawMatrix().Data, m.b1.RawMatrix().Data, m.w2.RawMatrix().Data, m.b2.RawMatrix().Data}
}

// target is the function the network learns.
func target(x []float64) float64 {
	s := 0.0
	for i, v := range x {
		s += math.Sin(v*float64(i%4+1)) / float64(i+1)
	}
	return s
}

// Train runs cfg on communicator c and returns the result; every rank
// calls it.
func Train(ctx context.Context, c *collective.Comm, cfg Config) (Result, error) {
	if cfg.Steps < 1 || cfg.Batch < 1 || cfg.Hidden < 1 || cfg.Bucket < 8 {
		return Result{}, fmt.Errorf("ddp: steps %d, batch %d, hidden %d, bucket %d bytes: want them all positive (a bucket of at least 8 bytes)", cfg.Steps, cfg.Batch, cfg.Hidden, cfg.Bucket)
	}
	rank := c.Rank()
	// Initial weights differ on each rank, until rank 0's are broadcast,
	// as DDP does.
	m := newModel(cfg.Hidden, cfg.Bucket, rand.New(rand.NewPCG(uint64(rank)+1, 7)))
	for _, p := range m.params() {
		if err := collective.Broadcast(ctx, c, p, p, 0); err != nil {
			return Result{}, err
		}
	}
	data := rand.New(rand.NewPCG(uint64(rank)+100, 11)) // this rank's shard of the data
	x := mat.NewDense(cfg.Batch, inputs, nil)
	y := mat.NewDense(cfg.Batch, 1, nil)
	var h, a, d2, dh mat.Dense
	var res Result
	var times []time.Duration
	for step := range cfg.Steps {
		t0 := time.Now()
		for i := range cfg.Batch {
			row := x.RawRowView(i)
			for j := range row {
				row[j] = data.Float64()*4 - 2
			}
			y.Set(i, 0, target(row))
		}
		// Forward: a = relu(x w1ᵀ + b1), out = a w2ᵀ + b2.
		h.Mul(x, m.w1.T())
		h.Apply(func(_, j int, v float64) float64 { return v + m.b1.At(j, 0) }, &h)
		a.Apply(func(_, _ int, v float64) float64 { return max(v, 0) }, &h)
		var out mat.Dense
		out.Mul(&a, m.w2.T())
		loss := 0.0
		d2.Apply(func(i, _ int, v float64) float64 {
			e := v + m.b2.At(0, 0) - y.At(i, 0)
			loss += e * e / float64(cfg.Batch)
			return 2 * e / float64(cfg.Batch)
		}, &out)
		// Backward, last layer first, each bucket's all-reduce started as
		// soon as it is complete.
		var reqs []*collective.Request
		layer := 0
		done := func() error {
			for b, last := range m.ready {
				if last == layer && cfg.Overlap {
					r, err := collective.StartAllReduce(ctx, c, m.buckets[b], m.buckets[b], collective.Avg)
					if err != nil {
						return err
					}
					reqs = append(reqs, r)
				}
			}
			layer++
			return nil
		}
		m.gb2.Set(0, 0, mat.Sum(&d2))
		if err := done(); err != nil {
			return res, err
		}
		m.gw2.Mul(d2.T(), &a)
		if err := done(); err != nil {
			return res, err
		}
		dh.Mul(&d2, m.w2)
		dh.Apply(func(i, j int, v float64) float64 {
			if h.At(i, j) <= 0 {
				return 0
			}
			return v
		}, &dh)
		for j := range cfg.Hidden {
			m.gb1.Set(j, 0, mat.Sum(dh.ColView(j)))
		}
		if err := done(); err != nil {
			return res, err
		}
		m.gw1.Mul(dh.T(), x)
		if err := done(); err != nil {
			return res, err
		}
		if !cfg.Overlap {
			for _, b := range m.buckets {
				if err := collective.AllReduce(ctx, c, b, b, collective.Avg); err != nil {
					return res, err
				}
			}
		}
		var errs []error
		for _, r := range reqs {
			errs = append(errs, r.Wait(ctx))
		}
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		// The same step on every rank, from the same averaged gradients.
		for _, p := range [][2]*mat.Dense{{m.w1, m.gw1}, {m.b1, m.gb1}, {m.w2, m.gw2}, {m.b2, m.gb2}} {
			p[0].Apply(func(i, j int, v float64) float64 { return v - cfg.LR*p[1].At(i, j) }, p[0])
		}
		times = append(times, time.Since(t0))
		// Every rank takes part in the loss's all-reduce, whether it logs
		// or not: collectives are called alike on every rank.
		if step == 0 || step == cfg.Steps-1 || step%max(cfg.Steps/10, 1) == 0 {
			l := []float64{loss}
			if err := collective.AllReduce(ctx, c, l, l, collective.Avg); err != nil {
				return res, err
			}
			if step == 0 {
				res.FirstLoss = l[0]
			}
			res.LastLoss = l[0]
			if cfg.Log != nil && rank == 0 {
				fmt.Fprintf(cfg.Log, "step %4d  loss %.5f\n", step, l[0])
			}
		}
	}
	slices.Sort(times)
	res.PerStep = times[len(times)/2]
	f := fnv.New64a()
	for _, p := range m.params() {
		f.Write(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(p))), 8*len(p)))
	}
	res.Hash = f.Sum64()
	return res, nil
}

// Check all-gathers every rank's weight hash and fails unless they agree
// and the loss fell by half.
func Check(ctx context.Context, c *collective.Comm, res Result) error {
	hashes := make([]uint64, c.Size())
	if err := collective.AllGather(ctx, c, []uint64{res.Hash}, hashes); err != nil {
		return err
	}
	for r, h := range hashes {
		if h != hashes[0] {
			return fmt.Errorf("rank %d's weights differ from rank 0's (hash %016x, not %016x)", r, h, hashes[0])
		}
	}
	if !(res.LastLoss < res.FirstLoss/2) {
		return fmt.Errorf("the loss went from %.5f to %.5f: it did not fall by half", res.FirstLoss, res.LastLoss)
	}
	return nil
}

func main() {
	cfg := Config{Log: os.Stdout}
	flag.IntVar(&cfg.Steps, "steps", 500, "optimizer steps")
	flag.IntVar(&cfg.Batch, "batch", 64, "samples per rank per step")
	flag.IntVar(&cfg.Hidden, "hidden", 256, "hidden units")
	bucket := flag.String("bucket", "25M", "gradient bucket size (K, M suffixes; DDP's default is 25 MiB)")
	flag.BoolVar(&cfg.Overlap, "overlap", true, "start each bucket's all-reduce as soon as the backward pass has filled it")
	flag.Float64Var(&cfg.LR, "lr", 0.01, "learning rate")
	flag.Parse()
	var err error
	if cfg.Bucket, err = collective.ParseSize(*bucket); err != nil {
		fmt.Fprintln(os.Stderr, "ddp: -bucket:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ddp:", err)
		os.Exit(1)
	}
	defer c.Close()
	if c.Rank() != 0 {
		cfg.Log = nil
	}
	res, err := Train(ctx, c, cfg)
	if err == nil {
		err = Check(ctx, c, res)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ddp: rank %d: %v\n", c.Rank(), err)
		c.Close()
		os.Exit(1)
	}
	if c.Rank() == 0 {
		fmt.Printf("%d ranks, %d steps: loss %.5f -> %.5f, %v per step (median), weights identical on every rank\n",
			c.Size(), cfg.Steps, res.FirstLoss, res.LastLoss, res.PerStep.Round(time.Microsecond))
	}
}
