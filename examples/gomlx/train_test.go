package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends/simplego"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// A short run on 3 ranks with buckets small enough that each layer has
// its own: the loss falls by half, every rank ends with the same weights,
// and overlapping the all-reduces with the backward pass changes nothing
// in them (the same sums in the same order).
func TestTrainDataParallel(t *testing.T) {
	cfg := Config{Steps: 120, Batch: 32, Hidden: 32, Layers: 2, Bucket: 1 << 10, LR: 0.05}
	var hashes [2]uint64
	for i, overlap := range []bool{true, false} {
		cfg.Overlap = overlap
		collectivetest.Run(t, 3, func(ctx context.Context, c *collective.Comm) error {
			res, err := Train(ctx, c, cfg)
			if err != nil {
				return err
			}
			if err := Check(ctx, c, res); err != nil {
				return err
			}
			if c.Rank() == 0 {
				hashes[i] = res.Hash
			}
			return nil
		})
	}
	if hashes[0] != hashes[1] {
		t.Errorf("overlapping the all-reduces changed the weights: %016x against %016x", hashes[0], hashes[1])
	}
}

// Between processes, as under goccl-run.
func TestTrainDataParallelInProcesses(t *testing.T) {
	collectivetest.RunProcesses(t, 2, func(ctx context.Context, c *collective.Comm) error {
		res, err := Train(ctx, c, Config{Steps: 100, Batch: 32, Hidden: 32, Layers: 2, Bucket: 1 << 10, Overlap: true, LR: 0.05})
		if err != nil {
			return err
		}
		return Check(ctx, c, res)
	})
}

// The matrix-product VJP this example registers gives GoMLX's own
// gradients.
func TestDotGradientAsGoMLXs(t *testing.T) {
	be, err := simplego.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Finalize()
	rng := rand.New(rand.NewPCG(3, 4))
	randT := func(r, c int) *tensors.Tensor {
		v := make([]float32, r*c)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return tensors.FromFlatDataAndDimensions(v, r, c)
	}
	a, b, w := randT(5, 7), randT(7, 3), randT(5, 3)
	grads := func() [][]float32 {
		e, err := NewExec(be, func(a, b, w *Node) []*Node {
			return Gradient(ReduceAllSum(Mul(Tanh(Dot(a, b)), w)), a, b)
		})
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.Exec(a, b, w)
		if err != nil {
			t.Fatal(err)
		}
		return [][]float32{tensors.MustCopyFlatData[float32](out[0]), tensors.MustCopyFlatData[float32](out[1])}
	}
	ours := grads()
	VJPRegistration[NodeTypeDot] = gomlxDotVJP
	theirs := grads()
	VJPRegistration[NodeTypeDot] = matrixDotVJP
	for k := range ours {
		for i := range ours[k] {
			if d := math.Abs(float64(ours[k][i] - theirs[k][i])); d > 1e-5*(1+math.Abs(float64(theirs[k][i]))) {
				t.Fatalf("gradient %d, element %d: %g here, %g by GoMLX's rule", k, i, ours[k][i], theirs[k][i])
			}
		}
	}
}

// Buckets hold every gradient once, last layer first, a new bucket where
// the next layer would overflow it.
func TestBuckets(t *testing.T) {
	for _, tc := range []struct {
		bucket  int64
		buckets int
	}{{1 << 30, 1}, {4, 3}, {(33 + 32*32 + 32) * 4, 2}} {
		m := newModel(Config{Hidden: 32, Layers: 2, Bucket: tc.bucket}, rand.New(rand.NewPCG(1, 2)))
		if len(m.buckets) != tc.buckets {
			t.Errorf("bucket of %d bytes: %d buckets, want %d", tc.bucket, len(m.buckets), tc.buckets)
		}
		total := 0
		for _, b := range m.buckets {
			total += len(b)
			for i := range b {
				b[i] = 1
			}
		}
		want := 0
		for _, ly := range m.layers {
			want += len(ly.w) + len(ly.b)
			for _, g := range [][]float32{ly.gw, ly.gb} {
				for i := range g {
					if g[i] != 1 {
						t.Fatalf("bucket of %d bytes: a gradient outside every bucket", tc.bucket)
					}
					g[i] = 2
				}
			}
		}
		if total != want {
			t.Errorf("bucket of %d bytes: buckets hold %d values, the gradients %d", tc.bucket, total, want)
		}
		if last := m.filled[len(m.filled)-1]; last != len(m.layers)-1 {
			t.Errorf("bucket of %d bytes: the last bucket fills at layer %d from the end, want %d", tc.bucket, last, len(m.layers)-1)
		}
	}
}

func TestBadConfig(t *testing.T) {
	collectivetest.Run(t, 1, func(ctx context.Context, c *collective.Comm) error {
		if _, err := Train(ctx, c, Config{}); err == nil {
			return fmt.Errorf("a zero config trained")
		}
		return nil
	})
}
