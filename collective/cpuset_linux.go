//go:build linux

package collective

import "golang.org/x/sys/unix"

// cpuMask is the set of CPUs this process may run on (sched_getaffinity),
// one bit per CPU, CPU i at bit i%8 of byte i/8, without trailing zero
// bytes; nil where it cannot be read.
func cpuMask() []byte {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var b []byte
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			for len(b) <= i/8 {
				b = append(b, 0)
			}
			b[i/8] |= 1 << (i % 8)
		}
	}
	return b
}
