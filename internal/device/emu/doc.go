// Package emu is a host-emulated GPU behind the device seam
// (internal/device), for tests only. It lets the engine's device path,
// its stream ordering, events, mapped-memory flags and IPC logic run in
// CI on machines without a GPU. It is not GPU support and must never be
// reported, logged or documented as such: Info says Name "emulated device
// (tests only)" and Emulated true, and nothing outside _test.go files
// (and test helpers) should construct one.
//
// # What it emulates
//
// Device memory (Alloc) is off-heap host memory from mmap, described as
// memory.Device buffers whose address is the host address: the CPU code
// that reaches it through memory.Buffer.Bytes panics, as it must for real
// device memory; tests read and fill it with (*Device).Bytes, the
// emulator's cudaMemcpy. Mapped memory (AllocHost) is mmap'd too, with the
// device address equal to the host address, as under UVA. AllocShared
// memory is memfd-backed, so that another process can open it through an
// IPC handle (IPCHandle, OpenIPC, CloseIPC) as with cuIpcGetMemHandle.
//
// A Stream runs its work on one goroutine of its own, in enqueue order and
// asynchronously to the caller; Reduce, Post and Copy compute with the
// host reference kernels (internal/kernels), so the arithmetic is the
// seam's obligation 3 exactly.
//
// # Stricter than hardware
//
// A protocol that passes only because the emulator is kind is a bug in the
// emulator. So:
//
//  1. Every queued item (kernel, copy, event record, wait) runs after a
//     random delay, from a seeded source (Options.Seed, Options.MaxDelay),
//     so the caller never sees work finished unless it waited for it.
//  2. Kernels and copies write their destination in pieces (4 KiB, or
//     halves of shorter buffers) in a random order, yielding between
//     pieces: a reader that does not wait for the stream sees torn data,
//     and one that polls the last byte for completion is wrong too.
//  3. Fresh allocations are filled with Poison (0xFF bytes: NaN in every
//     floating-point type, -1 or the maximum in the integer ones), and so
//     is memory being freed, so reading memory nobody wrote shows up.
//  4. Enqueue methods check the seam's obligations 1 and 2 and return
//     errors (never panic): buffer kinds, the device they belong to
//     (ordinal and emulator instance), that they lie inside live
//     allocations, lengths and element sizes, overlaps. A Host buffer in
//     a kernel is an error, as is a Mapped buffer of another device.
//  5. Memory freed while queued work still uses it: Free returns
//     ErrInUse, and the stream whose work meets the freed memory fails.
//     A failed stream is sticky, like a CUDA sticky error: every later
//     call and Sync return the failure, and events recorded after it fail,
//     as does the work of other streams that waits on them.
//  6. Free rejects buffers it did not allocate, double frees and slices of
//     an allocation; Live counts allocations not freed, for leak checks.
//  7. The seam's obligation 5 is checked: a Stream's methods called by two
//     goroutines at once return ErrConcurrentUse.
//  8. Close waits for queued work and stops the stream's goroutine; a
//     WaitValue or WaitEvent that still waits when Close is called fails
//     the stream rather than hang. No goroutine outlives Close.
//
// # What it does not emulate
//
// Performance (the delays are random, not a model of any GPU), peer
// access between devices, device-side faults (an emulated kernel checks
// its buffers before it runs, it does not fault half-way), alignment
// requirements the seam does not state, and CUDA's own error codes. IPC
// works only between processes on Linux, through /proc/<pid>/fd.
package emu
