// Command zero trains a linear model with sharded data parallelism, as
// ZeRO (stage 2) and PyTorch's FSDP do: each rank holds the full
// parameters for its forward and backward pass but only 1/n of the
// optimizer's state; the gradients are reduce-scattered (each rank gets
// the average of its shard), each rank takes an Adam step on its shard,
// and the parameters are all-gathered back. It checks that the result
// equals plain data parallelism (all-reduce of the whole gradient and an
// Adam step on everything, on every rank), to a relative 1e-12, and that
// the loss fell.
//
//	go build -o /tmp/zero ./examples/zero && go run ./cmd/goccl-run -np 4 /tmp/zero
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

// Config is a run.
type Config struct {
	Params, Batch, Steps int
	LR                   float64
	Sharded              bool // ZeRO; false: plain data parallel
}

// adam is Adam's state for a slice of parameters.
type adam struct{ m, v []float64 }

func (a *adam) step(p, g []float64, lr float64, t int) {
	const b1, b2, eps = 0.9, 0.999, 1e-8
	for i := range p {
		a.m[i] = b1*a.m[i] + (1-b1)*g[i]
		a.v[i] = b2*a.v[i] + (1-b2)*g[i]*g[i]
		mh := a.m[i] / (1 - math.Pow(b1, float64(t)))
		vh := a.v[i] / (1 - math.Pow(b2, float64(t)))
		p[i] -= lr * mh / (math.Sqrt(vh) + eps)
	}
}

// Train fits y = w·x to data from a hidden w* (each rank its own shard of
// samples) and returns the parameters and the first and last loss.
func Train(ctx context.Context, c *collective.Comm, cfg Config) (w []float64, first, last float64, err error) {
	n, r := c.Size(), c.Rank()
	if cfg.Params%n != 0 {
		return nil, 0, 0, fmt.Errorf("zero: %d parameters do not shard over %d ranks", cfg.Params, n)
	}
	truth := rand.New(rand.NewPCG(42, 1)) // the same w* everywhere
	wstar := make([]float64, cfg.Params)
	for i := range wstar {
		wstar[i] = truth.NormFloat64()
	}
	data := rand.New(rand.NewPCG(uint64(r)+7, 3))
	w = make([]float64, cfg.Params) // zeros on every rank: no broadcast needed
	g := make([]float64, cfg.Params)
	shard := cfg.Params / n
	var opt adam
	if cfg.Sharded {
		opt = adam{make([]float64, shard), make([]float64, shard)} // 1/n of the state
	} else {
		opt = adam{make([]float64, cfg.Params), make([]float64, cfg.Params)}
	}
	gShard := make([]float64, shard)
	x := make([]float64, cfg.Params)
	for step := 1; step <= cfg.Steps; step++ {
		clear(g)
		loss := 0.0
		for range cfg.Batch {
			pred, y := 0.0, 0.0
			for i := range x {
				x[i] = data.NormFloat64()
				pred += w[i] * x[i]
				y += wstar[i] * x[i]
			}
			e := pred - y
			loss += e * e / float64(cfg.Batch)
			for i := range g {
				g[i] += 2 * e * x[i] / float64(cfg.Batch)
			}
		}
		if cfg.Sharded {
			// Each rank gets the average of its shard of the gradient,
			// steps its shard of the parameters, and all gather them.
			if err := collective.ReduceScatter(ctx, c, g, gShard, collective.Avg); err != nil {
				return nil, 0, 0, err
			}
			mine := w[r*shard : (r+1)*shard]
			opt.step(mine, gShard, cfg.LR, step)
			own := append([]float64(nil), mine...)
			if err := collective.AllGather(ctx, c, own, w); err != nil {
				return nil, 0, 0, err
			}
		} else {
			if err := collective.AllReduce(ctx, c, g, g, collective.Avg); err != nil {
				return nil, 0, 0, err
			}
			opt.step(w, g, cfg.LR, step)
		}
		l := []float64{loss}
		if err := collective.AllReduce(ctx, c, l, l, collective.Avg); err != nil {
			return nil, 0, 0, err
		}
		if step == 1 {
			first = l[0]
		}
		last = l[0]
	}
	return w, first, last, nil
}

// Compare trains both ways and checks them against each other.
func Compare(ctx context.Context, c *collective.Comm, cfg Config) (first, last, maxRel float64, err error) {
	cfg.Sharded = true
	ws, first, last, err := Train(ctx, c, cfg)
	if err != nil {
		return 0, 0, 0, err
	}
	cfg.Sharded = false
	wd, _, _, err := Train(ctx, c, cfg)
	if err != nil {
		return 0, 0, 0, err
	}
	for i := range ws {
		maxRel = max(maxRel, math.Abs(ws[i]-wd[i])/max(math.Abs(wd[i]), 1e-30))
	}
	if maxRel > 1e-12 {
		return first, last, maxRel, fmt.Errorf("sharded and plain data parallelism differ by a relative %.3g", maxRel)
	}
	if !(last < first/10) {
		return first, last, maxRel, fmt.Errorf("the loss went from %.4g to %.4g: it did not fall tenfold", first, last)
	}
	return first, last, maxRel, nil
}

func main() {
	var cfg Config
	flag.IntVar(&cfg.Params, "params", 1024, "parameters (a multiple of the rank count)")
	flag.IntVar(&cfg.Batch, "batch", 32, "samples per rank per step")
	flag.IntVar(&cfg.Steps, "steps", 200, "steps")
	flag.Float64Var(&cfg.LR, "lr", 0.05, "Adam's learning rate")
	flag.Parse()
	ctx := context.Background()
	c, err := collective.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "zero:", err)
		os.Exit(1)
	}
	defer c.Close()
	first, last, rel, err := Compare(ctx, c, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zero: rank %d: %v\n", c.Rank(), err)
		c.Close()
		os.Exit(1)
	}
	if c.Rank() == 0 {
		fmt.Printf("%d ranks, %d parameters (%d of Adam's state each): loss %.4g -> %.4g; sharded = plain data parallel to a relative %.2g\n",
			c.Size(), cfg.Params, 2*cfg.Params/c.Size(), first, last, rel)
	}
}
