package collective

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/engine"
	"github.com/goccl/goccl/memory"
)

// issue copies an operation into its Request for the flight recorder
// field by field, leaving the buffers and the device event out (a whole
// copy stalled on store forwarding; the recorder keeps no buffer
// alive). A field added to engine.Op must be
// copied there or left out on purpose: this test lists them.
func TestRecorderCopiesEveryScalarOfTheOp(t *testing.T) {
	var names []string
	for f := range reflect.TypeFor[engine.Op]().Fields() {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"Coll", "Type", "Red", "Count", "Root", "In", "Out", "Ready", "PreMul", "Scale", "InOffs", "OutOffs"}, names,
		"engine.Op changed: update the recorder's copy in Comm.issue, then this list")

	k := call{name: "allreduce", op: engine.Op{Coll: 3, Type: 4, Red: 2, Count: 17, Root: 1, PreMul: true, Scale: 0.5,
		InOffs: []int{0, 1}, OutOffs: []int{0, 2}}}
	buf := make([]byte, 68)
	k.op.In, k.op.Out = memory.HostBuffer(buf), memory.HostBuffer(buf)
	c := &Comm{}
	r, _, err := c.issue(t.Context(), &k, false)
	require.NoError(t, err)
	want := k.op
	want.In, want.Out = memory.Buffer{}, memory.Buffer{}
	require.Equal(t, want, r.op, "every scalar and the offsets copied, the buffers not (the recorder keeps none alive)")
}
