package kernels

import "github.com/goccl/goccl/memory"

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
	dst, src = dst[:n], src[:n]
	if n < repMovsbMin || forcePortable || memory.HostBuffer(dst).Overlaps(memory.HostBuffer(src)) || !archCopy(dst, src) {
		return copy(dst, src)
	}
	return n
}

// repMovsbMin is where Copy starts to use REP MOVSB: glibc's default
// threshold for 32-byte vectors (2048 * 32/16 bytes), below which its
// start-up costs more than a vector loop.
const repMovsbMin = 4096
