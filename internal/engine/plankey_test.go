package engine

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/kernels"
)

// planKey.is compares field by field what keyOf builds; the two must
// agree, or the plan cache would hand one operation another's plan. A
// field added to planKey fails the count until is compares it too.
func TestPlanKeyIsAgreesWithKeyOf(t *testing.T) {
	require.Equal(t, 6, reflect.TypeFor[planKey]().NumField(), "planKey changed: update keyOf, is and this test")
	base := Op{Coll: 2, Type: kernels.Float32, Red: kernels.Sum, Count: 17, Root: 1}
	k := keyOf(&base)
	require.True(t, k.is(&base))
	for name, change := range map[string]func(*Op){
		"coll":   func(o *Op) { o.Coll++ },
		"type":   func(o *Op) { o.Type = kernels.Float64 },
		"red":    func(o *Op) { o.Red = kernels.Max },
		"count":  func(o *Op) { o.Count++ },
		"root":   func(o *Op) { o.Root++ },
		"premul": func(o *Op) { o.PreMul = true },
	} {
		op := base
		change(&op)
		require.NotEqual(t, k, keyOf(&op), name)
		require.False(t, k.is(&op), "%s differs, yet is says the key matches", name)
	}
	// What the key leaves out (the buffers, a pre-multiplied sum's scale)
	// does not change it.
	op := base
	op.Scale = 3
	require.True(t, k.is(&op))
}
