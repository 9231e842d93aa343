package tcp

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// twice, the two-call readv and writev where x/sys has none, returns what
// one vectored call would on a non-blocking descriptor: the whole, a short
// count (b not touched after a short a), or the first call's error.
func TestTwice(t *testing.T) {
	a, b := make([]byte, 4), make([]byte, 6)
	for _, c := range []struct {
		name  string
		moves []int // bytes each call moves; -1: EAGAIN
		want  int
		err   error
		calls int
	}{
		{"both whole", []int{4, 6}, 10, nil, 2},
		{"a short", []int{3}, 3, nil, 1},
		{"b short", []int{4, 2}, 6, nil, 2},
		{"nothing yet", []int{-1}, -1, unix.EAGAIN, 1},
		{"a whole, b would block", []int{4, -1}, 4, nil, 2},
	} {
		calls := 0
		n, err := twice(0, a, b, func(_ int, p []byte) (int, error) {
			m := c.moves[calls]
			calls++
			if m < 0 {
				return -1, unix.EAGAIN
			}
			require.LessOrEqual(t, m, len(p), c.name)
			return m, nil
		})
		require.Equal(t, c.want, n, c.name)
		require.Equal(t, c.err, err, c.name)
		require.Equal(t, c.calls, calls, c.name)
	}
	// An empty a goes straight to b.
	n, err := twice(0, nil, b, func(_ int, p []byte) (int, error) { return len(p), nil })
	require.NoError(t, err)
	require.Equal(t, len(b), n)
}
