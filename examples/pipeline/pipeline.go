// Command pipeline trains a network whose layers live on different ranks,
// pipeline-parallel in GPipe's schedule: every step's batch is cut into
// micro-batches; rank s runs layer s, receives each micro-batch's
// activations from rank s-1 and sends its own on to rank s+1 as soon as
// they are computed (StartSend, so that the next micro-batch's receive
// and compute overlap the send), then the gradients flow back the same
// way; each rank updates its own layer. Sends and receives progress
// independently (goccl's lanes), so each stage simply issues them in its
// own order. It checks the trained layers against the same network trained
// on one rank, to a relative 1e-12, and that the loss fell.
//
//	go build -o /tmp/pipeline ./examples/pipeline && go run ./cmd/goccl-run -np 4 /tmp/pipeline
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/goccl/goccl/collective"
)

const width = 8 // every layer is width × width

// Config is a run.
type Config struct {
	Steps, Micro, MicroBatch int
	LR                       float64
}

// layer s: y = tanh(W x), except the last: y = W x.
type layer struct {
	w    []float64
	last bool
}

func newLayer(s, n int) layer {
	r := rand.New(rand.NewPCG(uint64(s)+1, 3))
	l := layer{w: make([]float64, width*width), last: s == n-1}
	for i := range l.w {
		l.w[i] = r.NormFloat64() / math.Sqrt(width)
	}
	return l
}

func (l *layer) forward(x []float64, b int) []float64 {
	y := make([]float64, b*width)
	for s := range b {
		for o := range width {
			v := 0.0
			for i := range width {
				v += l.w[o*width+i] * x[s*width+i]
			}
			if !l.last {
				v = math.Tanh(v)
			}
			y[s*width+o] = v
		}
	}
	return y
}

// backward accumulates the layer's gradient into g and returns the
// gradient with respect to x, given x, y = forward(x) and dy.
func (l *layer) backward(x, y, dy, g []float64, b int) []float64 {
	dx := make([]float64, b*width)
	for s := range b {
		for o := range width {
			d := dy[s*width+o]
			if !l.last {
				d *= 1 - y[s*width+o]*y[s*width+o]
			}
			for i := range width {
				g[o*width+i] += d * x[s*width+i]
				dx[s*width+i] += d * l.w[o*width+i]
			}
		}
	}
	return dx
}

// microBatch is micro-batch m of step's data: inputs and targets.
func microBatch(step, m, b int) (x, y []float64) {
	r := rand.New(rand.NewPCG(uint64(step)*100+uint64(m), 1))
	x, y = make([]float64, b*width), make([]float64, b*width)
	for s := range b {
		for i := range width {
			x[s*width+i] = r.Float64()*2 - 1
		}
		for o := range width {
			y[s*width+o] = 0.5 * math.Sin(x[s*width+o]+x[s*width+(o+1)%width])
		}
	}
	return x, y
}

// lossGrad is the mean squared error over a micro-batch, and its
// gradient, scaled for the whole step (micro micro-batches).
func lossGrad(out, y []float64, micro int) (float64, []float64) {
	d := make([]float64, len(out))
	loss := 0.0
	n := float64(len(out) * micro)
	for i := range out {
		e := out[i] - y[i]
		loss += e * e / n
		d[i] = 2 * e / n
	}
	return loss, d
}

// Train runs the pipeline; rank s holds layer s. It returns the layer and
// the loss of the first and last step (known to the last rank; the others
// get it broadcast).
func Train(ctx context.Context, c *collective.Comm, cfg Config) (layer, float64, float64, error) {
	s, n := c.Rank(), c.Size()
	l := newLayer(s, n)
	b := cfg.MicroBatch
	var first, last float64
	for step := range cfg.Steps {
		xs := make([][]float64, cfg.Micro) // this stage's inputs
		ys := make([][]float64, cfg.Micro) // and outputs, for the backward pass
		var sends []*collective.Request
		// Forward, micro-batch by micro-batch.
		loss := 0.0
		dys := make([][]float64, cfg.Micro)
		for m := range cfg.Micro {
			if s == 0 {
				xs[m], _ = microBatch(step, m, b)
			} else {
				xs[m] = make([]float64, b*width)
				if err := collective.Recv(ctx, c, xs[m], s-1); err != nil {
					return l, 0, 0, err
				}
			}
			ys[m] = l.forward(xs[m], b)
			if s < n-1 {
				r, err := collective.StartSend(ctx, c, ys[m], s+1)
				if err != nil {
					return l, 0, 0, err
				}
				sends = append(sends, r)
			} else {
				_, target := microBatch(step, m, b)
				var lm float64
				lm, dys[m] = lossGrad(ys[m], target, cfg.Micro)
				loss += lm
			}
		}
		// Backward, last micro-batch first.
		g := make([]float64, len(l.w))
		for m := cfg.Micro - 1; m >= 0; m-- {
			if s < n-1 {
				dys[m] = make([]float64, b*width)
				if err := collective.Recv(ctx, c, dys[m], s+1); err != nil {
					return l, 0, 0, err
				}
			}
			dx := l.backward(xs[m], ys[m], dys[m], g, b)
			if s > 0 {
				r, err := collective.StartSend(ctx, c, dx, s-1)
				if err != nil {
					return l, 0, 0, err
				}
				sends = append(sends, r)
			}
		}
		var errs []error
		for _, r := range sends {
			errs = append(errs, r.Wait(ctx))
		}
		if err := errors.Join(errs...); err != nil {
			return l, 0, 0, err
		}
		for i := range l.w {
			l.w[i] -= cfg.LR * g[i]
		}
		if step == 0 || step == cfg.Steps-1 {
			v := []float64{loss}
			if err := collective.Broadcast(ctx, c, v, v, n-1); err != nil {
				return l, 0, 0, err
			}
			if step == 0 {
				first = v[0]
			}
			last = v[0]
		}
	}
	return l, first, last, nil
}

// Reference trains all n layers on one rank, the same way.
func Reference(cfg Config, n int) []layer {
	ls := make([]layer, n)
	for s := range ls {
		ls[s] = newLayer(s, n)
	}
	b := cfg.MicroBatch
	for step := range cfg.Steps {
		gs := make([][]float64, n)
		for s := range gs {
			gs[s] = make([]float64, width*width)
		}
		acts := make([][][]float64, cfg.Micro)
		for m := range cfg.Micro {
			x, _ := microBatch(step, m, b)
			acts[m] = [][]float64{x}
			for s := range ls {
				acts[m] = append(acts[m], ls[s].forward(acts[m][s], b))
			}
		}
		for m := cfg.Micro - 1; m >= 0; m-- {
			_, target := microBatch(step, m, b)
			_, d := lossGrad(acts[m][n], target, cfg.Micro)
			for s := n - 1; s >= 0; s-- {
				d = ls[s].backward(acts[m][s], acts[m][s+1], d, gs[s], b)
			}
		}
		for s := range ls {
			for i := range ls[s].w {
				ls[s].w[i] -= cfg.LR * gs[s][i]
			}
		}
	}
	return ls
}

// Check compares rank s's layer with the reference's layer s.
func Check(c *collective.Comm, cfg Config, l layer, first, last float64) (float64, error) {
	ref := Reference(cfg, c.Size())[c.Rank()]
	rel := 0.0
	for i := range l.w {
		rel = max(rel, math.Abs(l.w[i]-ref.w[i])/max(math.Abs(ref.w[i]), 1e-30))
	}
	if rel > 1e-12 {
		return rel, fmt.Errorf("rank %d's layer differs from the one-rank reference by a relative %.3g", c.Rank(), rel)
	}
	if !(last < first/2) {
		return rel, fmt.Errorf("the loss went from %.4g to %.4g: it did not halve", first, last)
	}
	return rel, nil
}

func main() {
	var cfg Config
	flag.IntVar(&cfg.Steps, "steps", 300, "steps")
	flag.IntVar(&cfg.Micro, "micro", 4, "micro-batches per step")
	flag.IntVar(&cfg.MicroBatch, "micro-batch", 8, "samples per micro-batch")
	flag.Float64Var(&cfg.LR, "lr", 0.5, "learning rate")
	flag.Parse()
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
	defer c.Close()
	l, first, last, err := Train(ctx, c, cfg)
	var rel float64
	if err == nil {
		rel, err = Check(c, cfg, l, first, last)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pipeline: rank %d: %v\n", c.Rank(), err)
		c.Close()
		os.Exit(1)
	}
	fmt.Printf("stage %d of %d: loss %.4g -> %.4g; layer equals the one-rank network to a relative %.2g\n", c.Rank(), c.Size(), first, last, rel)
}
