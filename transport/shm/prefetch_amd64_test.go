package shm

import (
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestPrefetchwFollowsCPUID: hasPrefetchw agrees with the kernel's
// reading of the same CPUID bit (3dnowprefetch in /proc/cpuinfo), and a
// prefetch changes nothing it touches.
func TestPrefetchwFollowsCPUID(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	require.NoError(t, err)
	kernel := false
	for _, f := range strings.Fields(string(b)) {
		if f == "3dnowprefetch" {
			kernel = true
			break
		}
	}
	require.Equal(t, kernel, hasPrefetchw, "CPUID's PRFCHW against /proc/cpuinfo's 3dnowprefetch")
	if !hasPrefetchw {
		t.Log("this CPU has no PREFETCHW: posts do without it")
		return
	}
	x := []uint64{1, 2, 3}
	prefetchw(unsafe.Pointer(&x[1]))
	require.Equal(t, []uint64{1, 2, 3}, x)
}
