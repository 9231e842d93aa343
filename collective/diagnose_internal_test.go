package collective

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/wire"
)

// misplaced names host and device ranks only among those running the
// stalled operation itself.
func TestMisplaced(t *testing.T) {
	run := func(seq uint64, op string, dev bool) wire.Wait {
		return wire.Wait{State: wire.WaitRunning, Seq: seq, Op: op, Device: dev, Peer: -1}
	}
	stall := wire.Stall{Seq: 7, Op: "allgather"}
	for _, c := range []struct {
		name  string
		waits []wire.Wait
		want  string
	}{
		{"alike, host", []wire.Wait{run(7, "allgather", false), run(7, "allgather", false)}, ""},
		{"alike, device", []wire.Wait{run(7, "allgather", true), run(7, "allgather", true)}, ""},
		{"one device rank", []wire.Wait{run(7, "allgather", false), run(7, "allgather", true)},
			"the ranks placed allgather#7's buffers differently: rank 0 in host memory, rank 1 in device memory"},
		{"three host ranks", []wire.Wait{run(7, "allgather", false), run(7, "allgather", false), run(7, "allgather", true), run(7, "allgather", false)},
			"ranks 0, 1 and 3 in host memory, rank 2 in device memory"},
		// A device rank at another operation, or idle, is not a
		// misplacement of this one.
		{"other operation", []wire.Wait{run(7, "allgather", false), run(6, "allgather", true)}, ""},
		{"other collective", []wire.Wait{run(7, "allgather", false), run(7, "broadcast", true)}, ""},
		{"idle", []wire.Wait{run(7, "allgather", false), {State: wire.WaitIdle, Seq: 7, Op: "allgather", Device: true}}, ""},
	} {
		m := misplaced(&wire.Diagnosis{Stall: stall, Waits: c.waits})
		if c.name == "one device rank" {
			// The same waits on a send: not one operation.
			s := c.waits[:0:0]
			for _, w := range c.waits {
				w.Op = "send"
				s = append(s, w)
			}
			require.Nil(t, misplaced(&wire.Diagnosis{Stall: wire.Stall{Seq: 7, Op: "send"}, Waits: s}), "sends")
		}
		require.Equal(t, c.want != "", m != nil, c.name)
		if m != nil {
			require.Contains(t, m.Error(), c.want, c.name)
			require.ErrorIs(t, m, ErrMismatch)
		}
	}
}
