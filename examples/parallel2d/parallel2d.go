// Command parallel2d trains a two-layer perceptron on 4 ranks arranged
// as 2 data-parallel replicas × 2 tensor-parallel shards, as Megatron-LM
// does: Split makes a tensor-parallel communicator of each replica's two
// ranks and a data-parallel one of each shard's two ranks. The first
// layer is split by columns (each shard computes half the hidden units),
// the second by rows (each shard's partial output is all-reduced over the
// tensor-parallel group); the gradients of each shard are averaged over
// the data-parallel group. It checks the trained weights against the same
// model trained on one rank with both replicas' data (to a relative
// 1e-12) and that the loss fell.
//
//	go build -o /tmp/parallel2d ./examples/parallel2d && go run ./cmd/goccl-run -np 4 /tmp/parallel2d
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/goccl/goccl/collective"
)

const (
	in, hidden, out = 8, 16, 4
	tpSize          = 2 // tensor-parallel shards
)

// Config is a run.
type Config struct {
	Steps, Batch int
	LR           float64
}

// weights are a shard: w1 (in × h columns of the hidden layer), w2 (h rows
// × out), with h = hidden/shards.
type weights struct {
	h      int
	w1, w2 []float64
}

func initWeights(shard, shards int) weights {
	h := hidden / shards
	r := rand.New(rand.NewPCG(5, 5)) // the full model, the same everywhere
	full1, full2 := make([]float64, in*hidden), make([]float64, hidden*out)
	for i := range full1 {
		full1[i] = r.NormFloat64() * 0.4
	}
	for i := range full2 {
		full2[i] = r.NormFloat64() * 0.3
	}
	w := weights{h: h, w1: make([]float64, in*h), w2: make([]float64, h*out)}
	for i := range in {
		copy(w.w1[i*h:(i+1)*h], full1[i*hidden+shard*h:i*hidden+(shard+1)*h])
	}
	copy(w.w2, full2[shard*h*out:(shard+1)*h*out])
	return w
}

// batch is replica d's samples for a step: the same on both of its shards.
func batch(d, step, n int) (x, y []float64) {
	r := rand.New(rand.NewPCG(uint64(d)*1000+uint64(step), 9))
	x, y = make([]float64, n*in), make([]float64, n*out)
	for s := range n {
		for i := range in {
			x[s*in+i] = r.Float64()*2 - 1
		}
		for o := range out {
			v := 0.0
			for i := range in {
				v += math.Sin(float64(i+o)) * x[s*in+i]
			}
			y[s*out+o] = math.Tanh(v)
		}
	}
	return x, y
}

// grad computes one shard's part of the forward pass (its hidden units
// and its partial output), then, given the full output (partial outputs
// summed over shards by reduce), the loss and the shard's gradients.
func (w *weights) grad(x, y []float64, n int, reduce func(partial []float64) error) (g1, g2 []float64, loss float64, err error) {
	h := w.h
	a := make([]float64, n*h)
	z := make([]float64, n*out)
	for s := range n {
		for j := range h {
			v := 0.0
			for i := range in {
				v += x[s*in+i] * w.w1[i*h+j]
			}
			a[s*h+j] = math.Tanh(v)
		}
		for o := range out {
			for j := range h {
				z[s*out+o] += a[s*h+j] * w.w2[j*out+o]
			}
		}
	}
	if err := reduce(z); err != nil { // row-parallel: sum the shards' partial outputs
		return nil, nil, 0, err
	}
	g1, g2 = make([]float64, len(w.w1)), make([]float64, len(w.w2))
	for s := range n {
		for o := range out {
			e := z[s*out+o] - y[s*out+o]
			loss += e * e / float64(n)
			dz := 2 * e / float64(n)
			for j := range h {
				g2[j*out+o] += a[s*h+j] * dz
				da := w.w2[j*out+o] * dz * (1 - a[s*h+j]*a[s*h+j])
				for i := range in {
					g1[i*h+j] += x[s*in+i] * da
				}
			}
		}
	}
	return g1, g2, loss, nil
}

func sgd(p, g []float64, lr float64) {
	for i := range p {
		p[i] -= lr * g[i]
	}
}

// Train runs on 4 ranks and returns this rank's shard, and the loss of
// the first and the last step.
func Train(ctx context.Context, c *collective.Comm, cfg Config) (w weights, first, last float64, err error) {
	if c.Size() != 2*tpSize {
		return w, 0, 0, fmt.Errorf("parallel2d: runs on %d ranks (2 replicas × %d shards), not %d", 2*tpSize, tpSize, c.Size())
	}
	r := c.Rank()
	replica, shard := r/tpSize, r%tpSize
	tp, err := c.Split(ctx, replica, shard) // this replica's shards, in shard order
	if err != nil {
		return w, 0, 0, err
	}
	defer tp.Close()
	dp, err := c.Split(ctx, shard, replica) // this shard in every replica
	if err != nil {
		return w, 0, 0, err
	}
	defer dp.Close()
	w = initWeights(tp.Rank(), tp.Size())
	for step := range cfg.Steps {
		x, y := batch(replica, step, cfg.Batch)
		g1, g2, loss, err := w.grad(x, y, cfg.Batch, func(z []float64) error {
			return collective.AllReduce(ctx, tp, z, z, collective.Sum)
		})
		if err != nil {
			return w, 0, 0, err
		}
		// Data parallel: average this shard's gradients over the replicas.
		if err := collective.AllReduce(ctx, dp, g1, g1, collective.Avg); err != nil {
			return w, 0, 0, err
		}
		if err := collective.AllReduce(ctx, dp, g2, g2, collective.Avg); err != nil {
			return w, 0, 0, err
		}
		sgd(w.w1, g1, cfg.LR)
		sgd(w.w2, g2, cfg.LR)
		l := []float64{loss}
		if err := collective.AllReduce(ctx, dp, l, l, collective.Avg); err != nil {
			return w, 0, 0, err
		}
		if step == 0 {
			first = l[0]
		}
		last = l[0]
	}
	return w, first, last, nil
}

// Reference trains the whole model on one rank with both replicas' data
// (their gradients averaged) and returns the shard shard of it.
func Reference(cfg Config, shard int) weights {
	full := initWeights(0, 1)
	for step := range cfg.Steps {
		var g1, g2 []float64
		for d := range 2 {
			x, y := batch(d, step, cfg.Batch)
			a1, a2, _, _ := full.grad(x, y, cfg.Batch, func([]float64) error { return nil })
			if g1 == nil {
				g1, g2 = a1, a2
				continue
			}
			for i := range g1 {
				g1[i] = (g1[i] + a1[i]) / 2
			}
			for i := range g2 {
				g2[i] = (g2[i] + a2[i]) / 2
			}
		}
		sgd(full.w1, g1, cfg.LR)
		sgd(full.w2, g2, cfg.LR)
	}
	h := hidden / tpSize
	w := weights{h: h, w1: make([]float64, in*h), w2: make([]float64, h*out)}
	for i := range in {
		copy(w.w1[i*h:(i+1)*h], full.w1[i*hidden+shard*h:i*hidden+(shard+1)*h])
	}
	copy(w.w2, full.w2[shard*h*out:(shard+1)*h*out])
	return w
}

// Check compares a rank's shard with the reference's.
func Check(c *collective.Comm, cfg Config, w weights, first, last float64) (float64, error) {
	ref := Reference(cfg, c.Rank()%tpSize)
	rel := 0.0
	for _, p := range [][2][]float64{{w.w1, ref.w1}, {w.w2, ref.w2}} {
		for i := range p[0] {
			rel = max(rel, math.Abs(p[0][i]-p[1][i])/max(math.Abs(p[1][i]), 1e-30))
		}
	}
	if rel > 1e-12 {
		return rel, fmt.Errorf("rank %d's shard differs from the one-rank reference by a relative %.3g", c.Rank(), rel)
	}
	if !(last < first/2) {
		return rel, fmt.Errorf("the loss went from %.4g to %.4g: it did not halve", first, last)
	}
	return rel, nil
}

func main() {
	cfg := Config{}
	flag.IntVar(&cfg.Steps, "steps", 300, "steps")
	flag.IntVar(&cfg.Batch, "batch", 16, "samples per replica per step")
	flag.Float64Var(&cfg.LR, "lr", 0.2, "learning rate")
	flag.Parse()
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parallel2d:", err)
		os.Exit(1)
	}
	defer c.Close()
	w, first, last, err := Train(ctx, c, cfg)
	var rel float64
	if err == nil {
		rel, err = Check(c, cfg, w, first, last)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "parallel2d: rank %d: %v\n", c.Rank(), err)
		c.Close()
		os.Exit(1)
	}
	fmt.Printf("rank %d (replica %d, shard %d): loss %.4g -> %.4g; shard equals the one-rank model to a relative %.2g\n",
		c.Rank(), c.Rank()/tpSize, c.Rank()%tpSize, first, last, rel)
}
