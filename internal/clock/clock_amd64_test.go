package clock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCounterIsClock: the counter is used only where sysfs names it the
// kernel's clock source, or names kvm-clock on an invariant counter whose
// clock the vDSO reads fast.
func TestCounterIsClock(t *testing.T) {
	dir := t.TempDir()
	yes := func() bool { return true }
	no := func() bool { return false }
	for _, c := range []struct {
		src             string
		invariant, fast func() bool
		want            bool
	}{
		{"tsc\n", no, no, true},
		{"tsc", no, no, true},
		{"kvm-clock\n", yes, yes, true},
		{"kvm-clock", yes, yes, true},
		{"kvm-clock\n", yes, no, false}, // read through the kernel: the host does not mark it stable
		{"kvm-clock\n", no, yes, false},
		{"hpet\n", yes, yes, false},
		{"", yes, yes, false},
	} {
		p := filepath.Join(dir, "cs")
		require.NoError(t, os.WriteFile(p, []byte(c.src), 0o600))
		require.Equal(t, c.want, counterIsClock(p, c.invariant, c.fast), "clock source %q, invariant %v, fast %v", c.src, c.invariant(), c.fast())
	}
	require.False(t, counterIsClock(filepath.Join(dir, "missing"), yes, yes))
	b, _ := os.ReadFile(clockSourcePath)
	t.Logf("this machine's clock source: %q; counter invariant: %v; runtime clock fast: %v; counter used: %v", b, invariantCounter(), fastRuntimeClock(), usable)
}
