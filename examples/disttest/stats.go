// Package disttest is an example of a package whose code runs on every
// rank of a goccl job, tested with collectivetest: in one process (fast,
// for most cases) and in one process per rank (for what only processes
// show: their own address spaces and the transports between them).
//
//	go test ./examples/disttest
package disttest

import (
	"context"
	"errors"
	"math"

	"github.com/goccl/goccl/collective"
)

// Moments are the mean and the (population) standard deviation of
// values held across every rank.
type Moments struct {
	N         int64
	Mean, Std float64
}

// GlobalMoments computes the moments of the union of every rank's local
// values in one all-reduce of three numbers (count, sum, sum of squares).
// Every rank calls it and gets the same result.
func GlobalMoments(ctx context.Context, c *collective.Comm, local []float64) (Moments, error) {
	var s [3]float64
	s[0] = float64(len(local))
	for _, v := range local {
		s[1] += v
		s[2] += v * v
	}
	if err := collective.AllReduce(ctx, c, s[:], s[:], collective.Sum); err != nil {
		return Moments{}, err
	}
	if s[0] == 0 {
		return Moments{}, errors.New("disttest: no values on any rank")
	}
	mean := s[1] / s[0]
	return Moments{N: int64(s[0]), Mean: mean, Std: math.Sqrt(max(s[2]/s[0]-mean*mean, 0))}, nil
}
