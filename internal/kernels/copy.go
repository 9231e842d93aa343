package kernels

// Copy copies src into dst as copy does and returns the number of bytes
// copied; the two must not overlap (where they do, it is copy). From
// repMovsbMin bytes on a CPU with fast string moves (ERMS) it is one REP
// MOVSB, which copies a buffer in cache about a third faster than the
// runtime's memmove (AVX loads and stores): 512 KiB in 4.8 µs against
// 5.7-6.7 on these VMs, 2 MiB in 22 against 28-31 (BenchmarkCopy;
// docs/performance.md, "Copies with REP MOVSB"). glibc's memcpy makes
// the same choice between its vector loop and REP MOVSB (sysdeps/x86,
// rep_movsb_threshold).
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < repMovsbMin || forcePortable || overlap(dst[:n], src[:n]) || !archCopy(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	return n
}

// repMovsbMin is where Copy starts to use REP MOVSB: glibc's default
// threshold for 32-byte vectors (2048 * 32/16 bytes), below which its
// start-up costs more than a vector loop.
const repMovsbMin = 4096

// overlap reports whether a and b (of equal, nonzero length) share a byte.
func overlap(a, b []byte) bool {
	pa, pb := uintptrOf(a), uintptrOf(b)
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
