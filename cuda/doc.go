// Package cuda is goccl's CUDA layer: the CUDA driver API, loaded at run
// time, and goccl's reduction and copy kernels (package cuda/ptx) run on
// it. It implements the device seam (internal/device): Device, Stream and
// Event.
//
// No cgo and no CUDA toolkit are needed to build it: the driver library
// (libcuda.so.1, installed with the NVIDIA driver) is opened with dlopen
// and called through github.com/ebitengine/purego, so `CGO_ENABLED=0 go
// build` gives one binary that uses a GPU where the driver exists and says
// clearly why not where it does not.
//
//	drv, err := cuda.Load()
//	if err != nil { ... } // errors.Is(err, cuda.ErrNoDriver), cuda.ErrNoDevice
//	dev, err := drv.Open(0)
//	defer dev.Close()
//	buf, err := dev.Alloc(1 << 20)
//	s, err := dev.NewStream()
//	err = s.Reduce(buf, memory.Buffer{}, buf, other, kernels.Float32, kernels.Sum, 0)
//	err = s.Sync(ctx)
//
// # Obligations
//
//  1. Loading. Load opens the library once per process: the path or name
//     in GOCCL_CUDA_LIBRARY (EnvLibrary) if set, else "libcuda.so.1";
//     then cuInit(0) and cuDriverGetVersion. The functions are resolved
//     as NCCL's src/misc/cudawrap.cc resolves them: by base name
//     ("cuMemAlloc") through cuGetProcAddress_v2, for the ABI of CUDA 12.0
//     that this package is written against, so that the driver hands out
//     the right versioned entry point (cuMemAlloc_v2,
//     cuStreamWaitValue32_v2); with drivers older than 12.0, which lack
//     cuGetProcAddress_v2, by dlsym of the exported versioned names. The
//     library is never closed.
//  2. Without a driver or a GPU, Load returns one error that says what was
//     tried and never panics: errors.Is(err, ErrNoDriver) for a library
//     that is missing ("cuda: libcuda.so.1 not found (dlopen: ...; set
//     GOCCL_CUDA_LIBRARY to its path)"), not a CUDA driver, the toolkit's
//     stub library, or lacking a function this package needs (the message
//     names it); errors.Is(err, ErrNoDevice) when cuInit reports
//     CUDA_ERROR_NO_DEVICE. Failed driver calls return *Error, which names
//     the call and the code as cuGetErrorName and cuGetErrorString do:
//     "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)". The
//     package's tests that need a GPU skip without one, saying why.
//  3. Thread safety. Driver and Device are safe for concurrent use. A
//     Stream's methods are called by one goroutine at a time (the seam's
//     obligation 5); an Event's methods may be called concurrently, but
//     not with its Close.
//  4. Contexts. A Device holds a reference on its device's primary context
//     (cuDevicePrimaryCtxRetain) from Driver.Open until Close; the last
//     Device of an ordinal to close releases it, and with it everything
//     made in it: memory, registrations, IPC mappings, streams, events and
//     kernels. A CUDA context is current per OS thread and goroutines move
//     between threads, so every call that needs the context locks its
//     goroutine to its thread (runtime.LockOSThread), makes the context
//     current there when it is not already (cuCtxGetCurrent, then
//     cuCtxSetCurrent), calls the driver and unlocks. The context is left
//     current on that thread, as cudaSetDevice leaves it.
//  5. Memory ownership. Alloc and AllocHost memory is released with Free,
//     Register with Unregister, OpenIPC with CloseIPC: each takes exactly
//     the buffer it returned, not a slice, and refuses others with an
//     error. A buffer's memory must not be in use by queued work when it is
//     released. AllocHost's []byte (memory.Buffer.Bytes) lies over pinned
//     memory outside the Go heap and must not be used after Free. Memory
//     given to Register must stay allocated and mapped until Unregister
//     (shared-memory segments from mmap; a Go slice works only while the
//     caller keeps it reachable). Host (pageable) buffers given to
//     Stream.Copy are read or written during the call (see Copy).
//  6. Kernels. goccl's PTX (package cuda/ptx, for the device's compute
//     capability, 7.0 or later) is compiled by the driver's JIT
//     (cuModuleLoadDataEx) on the first Reduce, Post or two-destination
//     Copy of a device, once; a failure, with the JIT's error log, is
//     returned then and by every later kernel call. Launches take
//     ptx.Grid(nbytes) blocks of ptx.BlockThreads threads. Enqueue methods
//     check the seam's obligations 1 and 2 (memory kinds and devices,
//     lengths, element sizes, overlaps) and return errors rather than let a
//     kernel fault; an empty operation enqueues nothing.
//  7. Errors of the work itself (a kernel that faults) surface from Sync,
//     Event.Sync or Done as the driver's *Error; CUDA makes such errors
//     sticky: the context, and every Device of that ordinal, is unusable
//     afterwards.
//
// # Calls, and what was checked how
//
// Driver functions are called with purego.SyscallN, the cheaper of
// purego's two ways (0.2–0.35 µs a call against 0.45–1.3 µs for
// RegisterLibFunc); every argument is an integer, handle or pointer. The one
// struct passed by value, cuIpcOpenMemHandle_v2's 64-byte CUipcMemHandle,
// is laid out by hand for the System V amd64 ABI (on the stack) and for
// AAPCS64 (by reference); the tests check the amd64 layout against a fake
// libcuda compiled by gcc from testdata/fakecuda.c, which also checks that
// the context is current on the calling thread for every call, the JIT
// options, the kernel parameter block and the symbol resolution. The
// kernels' arithmetic and the real driver's behaviour are checked by the
// TestGPU tests, which need a GPU.
//
// The package builds on every platform; the driver is loaded on Linux
// only, and elsewhere Load returns an error matching ErrNoDriver.
package cuda
