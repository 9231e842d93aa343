package shm

import (
	"unsafe"

	"github.com/goccl/goccl/internal/cpuid"
)

// pause hints the CPU that this is a spin-wait loop (x86 PAUSE): it frees
// the core's resources for a sibling hyperthread and avoids the memory
// order violation that ends a tight polling loop when the line changes.
//
//go:noescape
func pause()

// prefetchw asks for the line at p in exclusive state ahead of a write
// (x86 PREFETCHW), so that the write does not wait for the other cores'
// copies to be invalidated. A hint: it changes no memory. Call it only
// where hasPrefetchw.
//
//go:noescape
func prefetchw(p unsafe.Pointer)

// hasPrefetchw: the CPU has PREFETCHW (CPUID 0x80000001, ECX bit 8,
// PRFCHW; Intel since Broadwell, AMD since K8), which older ones may
// fault on.
var hasPrefetchw = cpuid.Bit(0x80000001, 'c', 8)
