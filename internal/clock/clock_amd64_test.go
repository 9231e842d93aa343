package clock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCounterIsClock: the counter is used only where sysfs names it the
// kernel's clock source.
func TestCounterIsClock(t *testing.T) {
	dir := t.TempDir()
	for src, want := range map[string]bool{"tsc\n": true, "tsc": true, "kvm-clock\n": false, "hpet\n": false, "": false} {
		p := filepath.Join(dir, "cs")
		require.NoError(t, os.WriteFile(p, []byte(src), 0o600))
		require.Equal(t, want, counterIsClock(p), "clock source %q", src)
	}
	require.False(t, counterIsClock(filepath.Join(dir, "missing")))
	b, _ := os.ReadFile(clockSourcePath)
	t.Logf("this machine's clock source: %q; counter used: %v", b, usable)
}
