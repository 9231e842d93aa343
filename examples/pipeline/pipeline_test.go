package main

import (
	"context"
	"testing"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collectivetest"
)

func check(ctx context.Context, c *collective.Comm) error {
	cfg := Config{Steps: 200, Micro: 4, MicroBatch: 8, LR: 0.5}
	l, first, last, err := Train(ctx, c, cfg)
	if err != nil {
		return err
	}
	_, err = Check(c, cfg, l, first, last)
	return err
}

func TestFourStagesInProcess(t *testing.T) { collectivetest.Run(t, 4, check) }

func TestFourStagesInProcesses(t *testing.T) { collectivetest.RunProcesses(t, 4, check) }
