package engine

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/device"
	"github.com/goccl/goccl/internal/kernels"
)

// readyEvent makes an operation a device one (onDevice) without buffers.
type readyEvent struct{ device.Event }

// planKey.is compares field by field what keyOf builds; the two must
// agree, or the plan cache would hand one operation another's plan. A
// field added to planKey fails the count until is compares it too.
func TestPlanKeyIsAgreesWithKeyOf(t *testing.T) {
	require.Equal(t, 7, reflect.TypeFor[planKey]().NumField(), "planKey changed: update keyOf, is and this test")
	e := &Engine{devLink: true}
	base := Op{Coll: 2, Type: kernels.Float32, Red: kernels.Sum, Count: 17, Root: 1}
	k := e.keyOf(&base)
	require.True(t, k.is(e, &base))
	for name, change := range map[string]func(*Op){
		"coll":   func(o *Op) { o.Coll++ },
		"type":   func(o *Op) { o.Type = kernels.Float64 },
		"red":    func(o *Op) { o.Red = kernels.Max },
		"count":  func(o *Op) { o.Count++ },
		"root":   func(o *Op) { o.Root++ },
		"premul": func(o *Op) { o.PreMul = true },
		"dev":    func(o *Op) { o.Ready = readyEvent{} },
	} {
		op := base
		change(&op)
		require.NotEqual(t, k, e.keyOf(&op), name)
		require.False(t, k.is(e, &op), "%s differs, yet is says the key matches", name)
	}
	// What the key leaves out (the buffers, a pre-multiplied sum's scale)
	// does not change it.
	op := base
	op.Scale = 3
	require.True(t, k.is(e, &op))
	// Without a device link, device and host operations share plans.
	h := &Engine{}
	dev := base
	dev.Ready = readyEvent{}
	require.Equal(t, h.keyOf(&base), h.keyOf(&dev))
	hk := h.keyOf(&base)
	require.True(t, hk.is(h, &dev))
}
