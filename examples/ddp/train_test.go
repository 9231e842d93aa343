package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

// A short run: the loss falls by half, every rank ends with the same
// weights, and overlapping the all-reduces with the backward pass changes
// nothing in them (the same sums in the same order).
func TestTrainDataParallel(t *testing.T) {
	cfg := Config{Steps: 150, Batch: 32, Hidden: 64, Bucket: 1 << 10, LR: 0.01}
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
		res, err := Train(ctx, c, Config{Steps: 100, Batch: 32, Hidden: 64, Bucket: 1 << 10, Overlap: true, LR: 0.01})
		if err != nil {
			return err
		}
		return Check(ctx, c, res)
	})
}

func TestBadConfig(t *testing.T) {
	collectivetest.Run(t, 1, func(ctx context.Context, c *collective.Comm) error {
		if _, err := Train(ctx, c, Config{}); err == nil {
			return fmt.Errorf("a zero config trained")
		}
		return nil
	})
}
