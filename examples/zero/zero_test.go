package main

import (
	"context"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

func TestShardedEqualsPlainDataParallel(t *testing.T) {
	collectivetest.Run(t, 4, func(ctx context.Context, c *collective.Comm) error {
		_, _, _, err := Compare(ctx, c, Config{Params: 256, Batch: 16, Steps: 100, LR: 0.05})
		return err
	})
}

func TestShardsMustDivide(t *testing.T) {
	collectivetest.Run(t, 3, func(ctx context.Context, c *collective.Comm) error {
		if _, _, _, err := Train(ctx, c, Config{Params: 256, Batch: 1, Steps: 1, Sharded: true}); err == nil {
			t.Errorf("256 parameters sharded over 3 ranks")
		}
		return nil
	})
}
