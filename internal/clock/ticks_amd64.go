package clock

import (
	"bytes"
	"os"

	"github.com/goccl/goccl/internal/cpuid"
)

// ticks reads the CPU's time-stamp counter (RDTSC).
//
//go:noescape
func ticks() uint64

func init() { usable = counterIsClock(clockSourcePath, invariantCounter, fastRuntimeClock) }

const clockSourcePath = "/sys/devices/system/clocksource/clocksource0/current_clocksource"

// counterIsClock reports whether the kernel keeps time by the time-stamp
// counter, from its current clock source (the file at src, sysfs's):
//
//   - "tsc": the kernel reads the counter itself, and chose it because it
//     runs at a constant rate and in step on every CPU.
//   - "kvm-clock": a KVM guest's clock, which is the guest's counter
//     scaled by a rate the host publishes (pvclock). It is the counter in
//     step on every vCPU only where the host marks it stable, and only
//     then does the vDSO read it without entering the kernel; so this
//     also asks for a counter that is invariant (invariant, called once:
//     CPUID says it runs at one rate through every power state) and a
//     runtime clock that reads fast (fast, called once: a read that
//     enters the kernel costs several times the vDSO's 25-50 ns). Cloud
//     VMs on KVM use this clock source, and the VMs here do.
//
// Anywhere else (hpet, xen, Hyper-V's page, an unreadable file) the
// runtime's clock is used as it is.
func counterIsClock(src string, invariant, fast func() bool) bool {
	b, err := os.ReadFile(src)
	if err != nil {
		return false
	}
	switch string(bytes.TrimSpace(b)) {
	case "tsc":
		return true
	case "kvm-clock":
		return invariant() && fast()
	}
	return false
}

// invariantCounter reports whether CPUID says the counter is invariant
// (leaf 0x80000007, EDX bit 8: what Linux shows as nonstop_tsc and, with
// it, takes as constant_tsc).
func invariantCounter() bool { return cpuid.Bit(0x80000007, 'd', 8) }

// fastRuntimeClock reports whether the runtime's clock reads in under
// fastRead on average, in the best of a few batches (a batch that an
// interrupt or a preemption lands in reads slow, never fast).
func fastRuntimeClock() bool {
	const batches, reads = 4, 32
	best := int64(1 << 62)
	for range batches {
		t0 := nanotime()
		for range reads {
			nanotime()
		}
		best = min(best, (nanotime()-t0)/(reads+1))
	}
	return best < fastRead
}

// fastRead is the read time, in ns, under which the runtime's clock is the
// vDSO's (25-50 ns on the VMs here; a system call costs 100 ns and more,
// 1.6 µs on these PVM guests).
const fastRead = 90
