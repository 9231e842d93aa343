// Package cpuid executes the x86 CPUID instruction, for the feature bits
// golang.org/x/sys/cpu does not report (the invariant time-stamp counter,
// PREFETCHW). Its functions exist on amd64 only; elsewhere the package is
// empty.
package cpuid
