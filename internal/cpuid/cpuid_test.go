//go:build amd64

package cpuid

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/cpu"
)

// TestCPUIDAgreesWithXSysCPU: the bits read here match what
// golang.org/x/sys/cpu reports for the same leaf (leaf 1: SSE2, EDX bit
// 26, which every amd64 CPU has; SSE4.1 and POPCNT, ECX bits 19 and 23),
// and a leaf past the CPU's extended range reads as unset.
func TestCPUIDAgreesWithXSysCPU(t *testing.T) {
	require.True(t, Bit(1, 'd', 26), "SSE2")
	require.Equal(t, cpu.X86.HasSSE2, Bit(1, 'd', 26))
	require.Equal(t, cpu.X86.HasSSE41, Bit(1, 'c', 19))
	require.Equal(t, cpu.X86.HasPOPCNT, Bit(1, 'c', 23))
	max, _, _, _ := CPUID(0x80000000, 0)
	require.False(t, Bit(max+1, 'd', 8), "leaf %#x is past the CPU's last (%#x)", max+1, max)
}
