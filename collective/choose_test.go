package collective_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

// TestChoose: the tuner's pick is reported without moving data, every
// rank gets the same, a forced algorithm shows, and bad questions are
// errors.
func TestChoose(t *testing.T) {
	comms := newGroup(t, 3)
	for _, count := range []int{2, 1 << 20} {
		want, err := comms[0].Choose(algorithms.CollAllReduce, collective.Float32, count)
		require.NoError(t, err)
		require.NotEmpty(t, want.Algorithm)
		require.Positive(t, want.Channels)
		for _, c := range comms[1:] {
			got, err := c.Choose(algorithms.CollAllReduce, collective.Float32, count)
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
	}
	ch, err := comms[0].Choose(algorithms.CollAllGather, collective.Int8, 1000)
	require.NoError(t, err)
	require.Equal(t, "ring", ch.Algorithm)
	_, err = comms[0].Choose(algorithms.CollRecv, collective.Float32, 1)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	_, err = comms[0].Choose(algorithms.CollAllReduce, collective.DataType(99), 1)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	_, err = comms[0].Choose(algorithms.CollAllReduce, collective.Float32, -1)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)

	forced := newGroup(t, 2, collective.WithAlgorithm(algorithms.Tree))
	ch, err = forced[0].Choose(algorithms.CollAllReduce, collective.Float32, 1<<20)
	require.NoError(t, err)
	require.Equal(t, "tree", ch.Algorithm)
	require.Equal(t, fmt.Sprintf("tree/%dch", ch.Channels), ch.String())
}
