//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// useRepMovsb: the CPU has enhanced REP MOVSB/STOSB (ERMS: CPUID leaf 7,
// EBX bit 9), which moves whole lines per step; without it REP MOVSB may
// go a byte at a time.
var useRepMovsb = cpu.X86.HasERMS

//go:noescape
func repMovsb(dst, src *byte, n int)

// archCopy copies src into dst (same length, no overlap) with REP MOVSB,
// or reports false where the CPU does not do that fast.
func archCopy(dst, src []byte) bool {
	if !useRepMovsb {
		return false
	}
	repMovsb(&dst[0], &src[0], len(dst))
	return true
}
