// Command gomlx trains a multi-layer perceptron data-parallel with GoMLX
// (github.com/gomlx/gomlx, its pure-Go backend) computing the forward and
// backward passes and goccl averaging the gradients, the way PyTorch's
// DistributedDataParallel does: every rank holds the whole model and its
// own shard of the data; rank 0's initial weights are broadcast; the
// gradients are all-reduced in buckets, each started asynchronously as
// soon as the backward pass has filled it (last layer first), so that the
// exchange of the later layers' gradients overlaps the backward pass of
// the earlier ones; every rank takes the same optimizer step.
//
// GoMLX differentiates a whole graph at once, and a graph returns all its
// outputs together. To hand gradients over layer by layer, as DDP's hooks
// do, each layer is a graph of its own: forward computes the layer's
// output; backward, given the gradient of the loss with respect to that
// output, returns the gradients with respect to the layer's input, weights
// and bias (GoMLX's autodiff of the vector-Jacobian product
// sum(output · upstream)). The loss and its gradient are a third graph.
//
// This example is a module of its own, so that goccl's go.mod does not
// carry GoMLX:
//
//	cd examples/gomlx && go build -o /tmp/gomlx-ddp . && cd ../.. &&
//	go run ./cmd/goccl-run -np 2 /tmp/gomlx-ddp -steps 300
//
// Rank 0 prints the loss (averaged over the ranks) as it falls, the median
// time per step and the part of it spent waiting for the all-reduces, and
// checks at the end that every rank's weights are bit-identical (their
// hashes all-gathered); the command fails if they are not, or if the loss
// did not fall by half.
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

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX's graph API reads as math
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goccl/goccl/collective"
)

// Config is a training run.
type Config struct {
	Steps  int   // optimizer steps
	Batch  int   // samples per rank per step
	Hidden int   // units in each hidden layer
	Layers int   // hidden layers (tanh); a linear output layer follows
	Bucket int64 // gradient bucket size in bytes (DDP's default is 25 MiB)
	// Overlap starts each bucket's all-reduce as soon as the backward pass
	// has filled it; without it every bucket is all-reduced after the
	// backward pass.
	Overlap bool
	LR      float32
	Log     io.Writer // rank 0's progress; nil: none
}

const inputs = 16

// Result is what a run ends with, on every rank.
type Result struct {
	FirstLoss, LastLoss float32       // averaged over the ranks
	PerStep             time.Duration // median wall time of a step on this rank
	Waiting             time.Duration // median time of a step spent waiting on all-reduces
	Hash                uint64        // of the weights
}

// layer is one dense layer: out = act(in·w + b), w of in×out.
type layer struct {
	in, out int
	tanh    bool
	w, b    []float32
	gw, gb  []float32 // gradients: views into a bucket
}

// graphs are the GoMLX computations a step runs. Each Exec compiles one
// graph per input shape and reuses it.
type graphs struct {
	fwdTanh, fwdLin *Exec // (x, w, b) → y
	bwdTanh, bwdLin *Exec // (x, w, b, dy) → dx, dw, db
	loss            *Exec // (out, target) → loss, dout
}

func dense(x, w, b *Node) *Node { return Add(Dot(x, w), InsertAxes(b, 0)) }

// GoMLX v0.26 differentiates a matrix product a[i,j]·b[j,k] by
// broadcasting both to [i,j,k], multiplying and summing an axis away
// (graph/rev_autodiff.go's dotVJP): i·j·k multiplications and memory, which
// XLA fuses away but the pure-Go backend runs as written; it was 90% of a
// step (pprof). Its table of VJPs is open for this ("for experimentation,
// one can dynamically change this"): the two products v·bᵀ and aᵀ·v give
// the same gradients in matrix products of the original sizes. Other
// ranks keep GoMLX's own rule.
func init() {
	gomlxDotVJP = VJPRegistration[NodeTypeDot]
	VJPRegistration[NodeTypeDot] = matrixDotVJP
}

var gomlxDotVJP VJP // GoMLX's own, for the test that compares them

func matrixDotVJP(node *Node, v []*Node, out shapes.Shape) []*Node {
	in := node.Inputs()
	if in[0].Rank() != 2 || in[1].Rank() != 2 {
		return gomlxDotVJP(node, v, out)
	}
	return []*Node{Dot(v[0], Transpose(in[1], 0, 1)), Dot(Transpose(in[0], 0, 1), v[0])}
}

func newGraphs(be backends.Backend) (*graphs, error) {
	g := &graphs{}
	var errs [5]error
	g.fwdTanh, errs[0] = NewExec(be, func(x, w, b *Node) *Node { return Tanh(dense(x, w, b)) })
	g.fwdLin, errs[1] = NewExec(be, dense)
	// The vector-Jacobian product: the gradient of sum(y · dy) with
	// respect to x, w and b is the backward pass of the layer for an
	// upstream gradient dy.
	vjp := func(act func(*Node) *Node) func(x, w, b, dy *Node) []*Node {
		return func(x, w, b, dy *Node) []*Node {
			return Gradient(ReduceAllSum(Mul(act(dense(x, w, b)), dy)), x, w, b)
		}
	}
	g.bwdTanh, errs[2] = NewExec(be, vjp(Tanh))
	g.bwdLin, errs[3] = NewExec(be, vjp(func(n *Node) *Node { return n }))
	g.loss, errs[4] = NewExec(be, func(out, target *Node) []*Node {
		loss := ReduceAllMean(Square(Sub(out, target)))
		return append([]*Node{loss}, Gradient(loss, out)...)
	})
	return g, errors.Join(errs[:]...)
}

// model is the layers and their gradient buckets.
type model struct {
	layers  []*layer
	buckets [][]float32
	// filled[i] is the layer (counted from the last) whose gradients
	// complete bucket i.
	filled []int
}

func newModel(cfg Config, rng *rand.Rand) *model {
	m := &model{}
	in := inputs
	for l := range cfg.Layers + 1 {
		out := cfg.Hidden
		if l == cfg.Layers {
			out = 1
		}
		ly := &layer{in: in, out: out, tanh: l < cfg.Layers, w: make([]float32, in*out), b: make([]float32, out)}
		s := math.Sqrt(1 / float64(in)) // Xavier-like, for tanh
		for i := range ly.w {
			ly.w[i] = float32(rng.NormFloat64() * s)
		}
		m.layers = append(m.layers, ly)
		in = out
	}
	// Buckets: gradients in backward order (last layer first, its bias
	// then its weights), a new bucket whenever the next layer would
	// overflow the current one (a layer larger than a bucket gets one of
	// its own), as DDP assigns them.
	per := int(max(cfg.Bucket/4, 1))
	type place struct{ bucket, off int }
	places := make([]place, len(m.layers))
	var lens []int
	used := 0
	for k := range m.layers {
		ly := m.layers[len(m.layers)-1-k]
		n := len(ly.w) + len(ly.b)
		if len(lens) == 0 || used > 0 && used+n > per {
			lens = append(lens, 0)
			used = 0
		}
		places[k] = place{len(lens) - 1, used}
		used += n
		lens[len(lens)-1] = used
		m.filled = append(m.filled[:len(lens)-1], k)
	}
	for _, n := range lens {
		m.buckets = append(m.buckets, make([]float32, n))
	}
	for k, p := range places {
		ly := m.layers[len(m.layers)-1-k]
		b := m.buckets[p.bucket][p.off:]
		ly.gb, ly.gw = b[:len(ly.b)], b[len(ly.b):len(ly.b)+len(ly.w)]
	}
	return m
}

// target is the function the network learns.
func target(x []float32) float32 {
	s := 0.0
	for i, v := range x {
		s += math.Sin(float64(v)*float64(i%4+1)) / float64(i+1)
	}
	return float32(s)
}

// copyOut copies a result tensor's elements into dst and frees the tensor.
func copyOut(dst []float32, t *tensors.Tensor) error {
	err := t.ConstFlatData(func(flat any) {
		src, _ := flat.([]float32)
		copy(dst, src)
	})
	return errors.Join(err, t.FinalizeAll())
}

func finalize(ts ...*tensors.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.FinalizeAll()
		}
	}
}

// Train runs cfg on communicator c and returns the result; every rank
// calls it.
func Train(ctx context.Context, c *collective.Comm, cfg Config) (Result, error) {
	if cfg.Steps < 1 || cfg.Batch < 1 || cfg.Hidden < 1 || cfg.Layers < 1 || cfg.Bucket < 4 || !(cfg.LR > 0) {
		return Result{}, fmt.Errorf("gomlx: steps %d, batch %d, hidden %d, layers %d, bucket %d bytes, lr %g: want them all positive (a bucket of at least 4 bytes)",
			cfg.Steps, cfg.Batch, cfg.Hidden, cfg.Layers, cfg.Bucket, cfg.LR)
	}
	be, err := simplego.New("")
	if err != nil {
		return Result{}, fmt.Errorf("gomlx: the pure-Go backend: %w", err)
	}
	defer be.Finalize()
	g, err := newGraphs(be)
	if err != nil {
		return Result{}, fmt.Errorf("gomlx: building the graphs: %w", err)
	}
	rank := c.Rank()
	// Initial weights differ on each rank, until rank 0's are broadcast,
	// as DDP does.
	m := newModel(cfg, rand.New(rand.NewPCG(uint64(rank)+1, 7)))
	for _, ly := range m.layers {
		for _, p := range [][]float32{ly.w, ly.b} {
			if err := collective.Broadcast(ctx, c, p, p, 0); err != nil {
				return Result{}, err
			}
		}
	}
	// DDP averages by scaling each rank's gradients by 1/n inside the
	// all-reduce (ncclRedOpCreatePreMulSum), not with a second pass.
	avg, err := c.PreMulSum(1 / float64(c.Size()))
	if err != nil {
		return Result{}, err
	}
	defer c.DestroyOp(avg)
	data := rand.New(rand.NewPCG(uint64(rank)+100, 11)) // this rank's shard of the data
	x := make([]float32, cfg.Batch*inputs)
	y := make([]float32, cfg.Batch)
	var res Result
	var times, waits []time.Duration
	acts := make([]*tensors.Tensor, len(m.layers)+1) // each layer's input, then the output
	params := make([][2]*tensors.Tensor, len(m.layers))
	for step := range cfg.Steps {
		t0 := time.Now()
		for i := range cfg.Batch {
			row := x[i*inputs : (i+1)*inputs]
			for j := range row {
				row[j] = float32(data.Float64()*4 - 2)
			}
			y[i] = target(row)
		}
		// Forward, layer by layer.
		acts[0] = tensors.FromFlatDataAndDimensions(x, cfg.Batch, inputs)
		for l, ly := range m.layers {
			params[l] = [2]*tensors.Tensor{tensors.FromFlatDataAndDimensions(ly.w, ly.in, ly.out), tensors.FromFlatDataAndDimensions(ly.b, ly.out)}
			fwd := g.fwdLin
			if ly.tanh {
				fwd = g.fwdTanh
			}
			out, err := fwd.Exec(acts[l], params[l][0], params[l][1])
			if err != nil {
				return res, fmt.Errorf("gomlx: forward, layer %d: %w", l, err)
			}
			acts[l+1] = out[0]
		}
		lossOut, err := g.loss.Exec(acts[len(m.layers)], tensors.FromFlatDataAndDimensions(y, cfg.Batch, 1))
		if err != nil {
			return res, fmt.Errorf("gomlx: loss: %w", err)
		}
		loss := tensors.MustCopyFlatData[float32](lossOut[0])[0]
		finalize(lossOut[0])
		// Backward, last layer first, each bucket's all-reduce started as
		// soon as it is complete.
		var reqs []*collective.Request
		dy := lossOut[1]
		for k := range m.layers {
			l := len(m.layers) - 1 - k
			ly := m.layers[l]
			bwd := g.bwdLin
			if ly.tanh {
				bwd = g.bwdTanh
			}
			grads, err := bwd.Exec(acts[l], params[l][0], params[l][1], dy)
			if err != nil {
				return res, fmt.Errorf("gomlx: backward, layer %d: %w", l, err)
			}
			finalize(dy, acts[l+1], params[l][0], params[l][1])
			if err := errors.Join(copyOut(ly.gw, grads[1]), copyOut(ly.gb, grads[2])); err != nil {
				return res, err
			}
			dy = grads[0]
			for b, last := range m.filled {
				if last == k && cfg.Overlap {
					r, err := collective.StartAllReduce(ctx, c, m.buckets[b], m.buckets[b], avg)
					if err != nil {
						return res, err
					}
					reqs = append(reqs, r)
				}
			}
		}
		finalize(dy, acts[0])
		tw := time.Now()
		if !cfg.Overlap {
			for _, b := range m.buckets {
				if err := collective.AllReduce(ctx, c, b, b, avg); err != nil {
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
		waits = append(waits, time.Since(tw))
		// The same step on every rank, from the same averaged gradients.
		for _, ly := range m.layers {
			for i, gr := range ly.gw {
				ly.w[i] -= cfg.LR * gr
			}
			for i, gr := range ly.gb {
				ly.b[i] -= cfg.LR * gr
			}
		}
		times = append(times, time.Since(t0))
		// Every rank takes part in the loss's all-reduce, whether it logs
		// or not: collectives are called alike on every rank.
		if step == 0 || step == cfg.Steps-1 || step%max(cfg.Steps/10, 1) == 0 {
			l := []float32{loss}
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
	slices.Sort(waits)
	res.PerStep, res.Waiting = times[len(times)/2], waits[len(waits)/2]
	f := fnv.New64a()
	for _, ly := range m.layers {
		for _, p := range [][]float32{ly.w, ly.b} {
			f.Write(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(p))), 4*len(p)))
		}
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
	flag.IntVar(&cfg.Steps, "steps", 300, "optimizer steps")
	flag.IntVar(&cfg.Batch, "batch", 64, "samples per rank per step")
	flag.IntVar(&cfg.Hidden, "hidden", 128, "units in each hidden layer")
	flag.IntVar(&cfg.Layers, "layers", 3, "hidden layers")
	bucket := flag.String("bucket", "25M", "gradient bucket size (K, M suffixes; DDP's default is 25 MiB)")
	flag.BoolVar(&cfg.Overlap, "overlap", true, "start each bucket's all-reduce as soon as the backward pass has filled it")
	lr := flag.Float64("lr", 0.05, "learning rate")
	flag.Parse()
	cfg.LR = float32(*lr)
	var err error
	if cfg.Bucket, err = collective.ParseSize(*bucket); err != nil {
		fmt.Fprintln(os.Stderr, "gomlx: -bucket:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gomlx:", err)
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
		fmt.Fprintf(os.Stderr, "gomlx: rank %d: %v\n", c.Rank(), err)
		c.Close()
		os.Exit(1)
	}
	if c.Rank() == 0 {
		fmt.Printf("%d ranks, %d steps: loss %.5f -> %.5f, %v per step (median), %v of it waiting on all-reduces, weights identical on every rank\n",
			c.Size(), cfg.Steps, res.FirstLoss, res.LastLoss, res.PerStep.Round(time.Microsecond), res.Waiting.Round(time.Microsecond))
	}
}
