//go:build unix && !linux

package tcp

import "runtime"

// yieldCPU lets other goroutines run; sched_yield is Linux's.
func yieldCPU() { runtime.Gosched() }
