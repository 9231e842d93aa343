package main

import (
	"context"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

func check(ctx context.Context, c *collective.Comm) error {
	cfg := Config{Steps: 150, Batch: 8, LR: 0.2}
	w, first, last, err := Train(ctx, c, cfg)
	if err != nil {
		return err
	}
	_, err = Check(c, cfg, w, first, last)
	return err
}

func TestTwoByTwoInProcess(t *testing.T) { collectivetest.Run(t, 4, check) }

func TestTwoByTwoInProcesses(t *testing.T) { collectivetest.RunProcesses(t, 4, check) }
