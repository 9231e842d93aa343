package shm

// pause hints the CPU that this is a spin-wait loop (x86 PAUSE): it frees
// the core's resources for a sibling hyperthread and avoids the memory
// order violation that ends a tight polling loop when the line changes.
//
//go:noescape
func pause()
