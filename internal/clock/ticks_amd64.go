package clock

import (
	"bytes"
	"os"
)

// ticks reads the CPU's time-stamp counter (RDTSC).
//
//go:noescape
func ticks() uint64

func init() { usable = counterIsClock(clockSourcePath) }

const clockSourcePath = "/sys/devices/system/clocksource/clocksource0/current_clocksource"

// counterIsClock reports whether the kernel keeps time by the time-stamp
// counter, as the file at path (sysfs's current clock source) says.
func counterIsClock(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && string(bytes.TrimSpace(b)) == "tsc"
}
