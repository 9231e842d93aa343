package cuda

import (
	"fmt"
	"os"
	"sync"
	"unsafe"
)

// EnvLibrary names the environment variable that overrides where the CUDA
// driver library is loaded from, as NCCL's environment overrides for its
// libraries do: a path ("/usr/lib64/libcuda.so.1") or a file name that the
// dynamic loader looks up. Unset, it is "libcuda.so.1".
const EnvLibrary = "GOCCL_CUDA_LIBRARY"

const defaultLibrary = "libcuda.so.1"

// apiVersion is the CUDA version whose function ABIs this package is written
// against; cuGetProcAddress returns, for a base name, the entry point that
// version defines ("cuMemAlloc" → cuMemAlloc_v2; "cuStreamWaitValue32" →
// cuStreamWaitValue32_v2, which needs 11.7). Asking for the driver's own,
// newer version instead could hand back an entry whose signature changed
// after this code was written.
const apiVersion = 12000

// Driver is the loaded CUDA driver library: its version and the functions
// goccl calls, resolved once. It is safe for concurrent use.
type Driver struct {
	path    string // what was dlopen'ed
	version int    // cuDriverGetVersion: 12080 for CUDA 12.8
	viaProc bool   // symbols came from cuGetProcAddress_v2 (false: dlsym)
	fn      funcs
	// waitValueV2: cuStreamWaitValue32 is the _v2 entry point, which CUDA
	// 11.7 and later support on every device without the kernel module's
	// NVreg_EnableStreamMemOPs=1 (the v1 entry point needs it, and
	// CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS says whether it is set).
	waitValueV2 bool

	mu   sync.Mutex        // guards devs
	devs map[int]*devState // per ordinal, created on first Open
}

// funcs holds the resolved entry points. Each is non-zero after loading,
// except where marked optional.
type funcs struct {
	getErrorName, getErrorString uintptr
	init, driverGetVersion       uintptr

	deviceGetCount, deviceGet, deviceGetName, deviceGetAttribute uintptr
	deviceTotalMem, deviceGetPCIBusID, deviceCanAccessPeer       uintptr
	primaryCtxRetain, primaryCtxRelease                          uintptr
	ctxGetCurrent, ctxSetCurrent                                 uintptr

	memAlloc, memFree, memGetAddressRange                        uintptr
	memHostAlloc, memFreeHost, memHostGetDevicePointer           uintptr
	memHostRegister, memHostUnregister, pointerGetAttribute      uintptr
	memGetHandleForAddressRange                                  uintptr // optional (11.7+)
	ipcGetMemHandle, ipcOpenMemHandle, ipcCloseMemHandle         uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync            uintptr
	streamCreate, streamDestroy, streamQuery, streamSynchronize  uintptr
	streamWaitEvent                                              uintptr
	streamWaitValue32                                            uintptr // optional
	eventCreate, eventRecord, eventQuery, eventSynchronize       uintptr
	eventElapsedTime, eventDestroy                               uintptr
	moduleLoadDataEx, moduleGetFunction, moduleUnload, launchKer uintptr
}

// symbol is one driver function: its base name (what cuGetProcAddress
// takes), the versioned name the library exports for the ABI of
// apiVersion (what dlsym takes when cuGetProcAddress_v2 is absent), and
// where it goes.
type symbol struct {
	base, exported string
	dst            *uintptr
	optional       bool
}

func (d *Driver) symbols() []symbol {
	f := &d.fn
	return []symbol{
		{"cuDeviceGetCount", "cuDeviceGetCount", &f.deviceGetCount, false},
		{"cuDeviceGet", "cuDeviceGet", &f.deviceGet, false},
		{"cuDeviceGetName", "cuDeviceGetName", &f.deviceGetName, false},
		{"cuDeviceGetAttribute", "cuDeviceGetAttribute", &f.deviceGetAttribute, false},
		{"cuDeviceTotalMem", "cuDeviceTotalMem_v2", &f.deviceTotalMem, false},
		{"cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId", &f.deviceGetPCIBusID, false},
		{"cuDeviceCanAccessPeer", "cuDeviceCanAccessPeer", &f.deviceCanAccessPeer, false},
		{"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", &f.primaryCtxRetain, false},
		{"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", &f.primaryCtxRelease, false},
		{"cuCtxGetCurrent", "cuCtxGetCurrent", &f.ctxGetCurrent, false},
		{"cuCtxSetCurrent", "cuCtxSetCurrent", &f.ctxSetCurrent, false},
		{"cuMemAlloc", "cuMemAlloc_v2", &f.memAlloc, false},
		{"cuMemFree", "cuMemFree_v2", &f.memFree, false},
		{"cuMemGetAddressRange", "cuMemGetAddressRange_v2", &f.memGetAddressRange, false},
		{"cuMemHostAlloc", "cuMemHostAlloc", &f.memHostAlloc, false},
		{"cuMemFreeHost", "cuMemFreeHost", &f.memFreeHost, false},
		{"cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2", &f.memHostGetDevicePointer, false},
		{"cuMemHostRegister", "cuMemHostRegister_v2", &f.memHostRegister, false},
		{"cuMemHostUnregister", "cuMemHostUnregister", &f.memHostUnregister, false},
		{"cuPointerGetAttribute", "cuPointerGetAttribute", &f.pointerGetAttribute, false},
		{"cuMemGetHandleForAddressRange", "cuMemGetHandleForAddressRange", &f.memGetHandleForAddressRange, true},
		{"cuIpcGetMemHandle", "cuIpcGetMemHandle", &f.ipcGetMemHandle, false},
		{"cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", &f.ipcOpenMemHandle, false},
		{"cuIpcCloseMemHandle", "cuIpcCloseMemHandle", &f.ipcCloseMemHandle, false},
		{"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", &f.memcpyHtoDAsync, false},
		{"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", &f.memcpyDtoHAsync, false},
		{"cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", &f.memcpyDtoDAsync, false},
		{"cuStreamCreate", "cuStreamCreate", &f.streamCreate, false},
		{"cuStreamDestroy", "cuStreamDestroy_v2", &f.streamDestroy, false},
		{"cuStreamQuery", "cuStreamQuery", &f.streamQuery, false},
		{"cuStreamSynchronize", "cuStreamSynchronize", &f.streamSynchronize, false},
		{"cuStreamWaitEvent", "cuStreamWaitEvent", &f.streamWaitEvent, false},
		{"cuStreamWaitValue32", "cuStreamWaitValue32_v2", &f.streamWaitValue32, true},
		{"cuEventCreate", "cuEventCreate", &f.eventCreate, false},
		{"cuEventRecord", "cuEventRecord", &f.eventRecord, false},
		{"cuEventQuery", "cuEventQuery", &f.eventQuery, false},
		{"cuEventSynchronize", "cuEventSynchronize", &f.eventSynchronize, false},
		{"cuEventElapsedTime", "cuEventElapsedTime", &f.eventElapsedTime, false},
		{"cuEventDestroy", "cuEventDestroy_v2", &f.eventDestroy, false},
		{"cuModuleLoadDataEx", "cuModuleLoadDataEx", &f.moduleLoadDataEx, false},
		{"cuModuleGetFunction", "cuModuleGetFunction", &f.moduleGetFunction, false},
		{"cuModuleUnload", "cuModuleUnload", &f.moduleUnload, false},
		{"cuLaunchKernel", "cuLaunchKernel", &f.launchKer, false},
	}
}

var (
	loadOnce   sync.Once
	loadDriver *Driver
	loadErr    error
)

// Load loads the CUDA driver library once per process (EnvLibrary says
// from where), initialises it (cuInit) and resolves the functions goccl
// uses. Later calls return the same Driver or the same error.
//
// On failure it returns an error matching ErrNoDriver (no library, the
// toolkit's stub library, a function missing) or ErrNoDevice (the driver
// reports no device), whose text says what was tried:
//
//	cuda: libcuda.so.1 not found (dlopen: ...; set GOCCL_CUDA_LIBRARY to its path)
//	cuda: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)
//
// Load never panics for a missing or broken library.
func Load() (*Driver, error) {
	loadOnce.Do(func() {
		path := os.Getenv(EnvLibrary)
		if path == "" {
			path = defaultLibrary
		}
		loadDriver, loadErr = loadLibrary(path)
	})
	return loadDriver, loadErr
}

// loadLibrary does Load's work for one library path; tests call it with fake
// libraries. Each call dlopens anew (the same path yields the same handle).
func loadLibrary(path string) (*Driver, error) {
	lib, err := dlopen(path)
	if err != nil {
		if path == defaultLibrary {
			return nil, wrap(fmt.Sprintf("cuda: %s not found (dlopen: %v; set %s to its path)", path, err, EnvLibrary), ErrNoDriver)
		}
		return nil, wrap(fmt.Sprintf("cuda: %s=%s: cannot load (dlopen: %v)", EnvLibrary, path, err), ErrNoDriver)
	}
	d := &Driver{path: path, devs: map[int]*devState{}}
	// These four are the same in every CUDA version and are needed before
	// (or to report failures of) cuGetProcAddress.
	for _, s := range []symbol{
		{"cuGetErrorName", "cuGetErrorName", &d.fn.getErrorName, false},
		{"cuGetErrorString", "cuGetErrorString", &d.fn.getErrorString, false},
		{"cuInit", "cuInit", &d.fn.init, false},
		{"cuDriverGetVersion", "cuDriverGetVersion", &d.fn.driverGetVersion, false},
	} {
		if *s.dst = dlsym(lib, s.exported); *s.dst == 0 {
			return nil, wrap(fmt.Sprintf("cuda: %s has no %s: not a CUDA driver library", path, s.exported), ErrNoDriver)
		}
	}
	if r := callN(d.fn.init, 0); r != 0 {
		e := d.newError("cuInit", r)
		switch r {
		case errNoDevice:
			return nil, wrap(fmt.Sprintf("cuda: no CUDA device (cuInit: %s)", e.name()), ErrNoDevice, e)
		case errStubLibrary:
			return nil, wrap(fmt.Sprintf("cuda: %s is the CUDA toolkit's stub library, not the driver (cuInit: %s; set %s to the driver's libcuda.so.1)", path, e.name(), EnvLibrary), ErrNoDriver, e)
		}
		return nil, e
	}
	var v int32
	if r := callN(d.fn.driverGetVersion, uintptr(unsafe.Pointer(&v))); r != 0 {
		return nil, d.newError("cuDriverGetVersion", r)
	}
	d.version = int(v)

	// Resolve the rest as NCCL's src/misc/cudawrap.cc does: through
	// cuGetProcAddress by base name and CUDA version, so that the driver
	// picks the versioned entry point; without it (drivers before 12.0),
	// by the exported versioned names.
	getProc := dlsym(lib, "cuGetProcAddress_v2")
	d.viaProc = getProc != 0
	for _, s := range d.symbols() {
		if d.viaProc {
			*s.dst, err = d.getProc(getProc, s.base)
		} else if *s.dst = dlsym(lib, s.exported); *s.dst == 0 {
			err = fmt.Errorf("dlsym %s: not exported", s.exported)
		}
		if err != nil {
			*s.dst = 0
			if s.optional {
				continue
			}
			return nil, wrap(fmt.Sprintf("cuda: %s (CUDA driver %s) has no usable %s (%v)", path, versionString(d.version), s.base, err), ErrNoDriver)
		}
	}
	if d.fn.streamWaitValue32 != 0 {
		// cuGetProcAddress with apiVersion >= 11.7 gives the v2 entry point.
		d.waitValueV2 = true
	} else if p := dlsym(lib, "cuStreamWaitValue32"); p != 0 && !d.viaProc {
		d.fn.streamWaitValue32 = p // v1: supported where the device attribute says so
	}
	return d, nil
}

// getProc resolves one base name through cuGetProcAddress_v2(symbol, &pfn,
// cudaVersion, flags, &symbolStatus).
func (d *Driver) getProc(getProc uintptr, base string) (uintptr, error) {
	var fn uintptr
	var status int32
	name := cString(base)
	const defaultFlags = 0 // CU_GET_PROC_ADDRESS_DEFAULT
	r := callN(getProc, uintptr(unsafe.Pointer(name)), uintptr(unsafe.Pointer(&fn)), apiVersion, defaultFlags, uintptr(unsafe.Pointer(&status)))
	switch {
	case status == 1: // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (with CUDA_ERROR_NOT_FOUND)
		return 0, fmt.Errorf("cuGetProcAddress_v2: symbol not found")
	case status == 2: // CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
		return 0, fmt.Errorf("cuGetProcAddress_v2: needs a CUDA version above %s", versionString(apiVersion))
	case r != 0:
		return 0, d.newError("cuGetProcAddress", r)
	case status != 0 || fn == 0:
		return 0, fmt.Errorf("cuGetProcAddress_v2: status %d, entry point %#x", status, fn)
	}
	return fn, nil
}

// Version returns the CUDA version of the driver (cuDriverGetVersion):
// 12080 for 12.8.
func (d *Driver) Version() int { return d.version }

// Library returns the library path or name that was loaded.
func (d *Driver) Library() string { return d.path }

// String describes the driver: "CUDA driver 12.8 (libcuda.so.1)".
func (d *Driver) String() string {
	return fmt.Sprintf("CUDA driver %s (%s)", versionString(d.version), d.path)
}

func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// DeviceCount returns the number of CUDA devices the driver shows this
// process (after CUDA_VISIBLE_DEVICES).
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if r := callN(d.fn.deviceGetCount, uintptr(unsafe.Pointer(&n))); r != 0 {
		return 0, d.newError("cuDeviceGetCount", r)
	}
	return int(n), nil
}

// newError builds the *Error for a failed call, with the driver's name and
// description of the code.
func (d *Driver) newError(call string, code uint32) *Error {
	e := &Error{Call: call, Code: int(code)}
	var s *byte
	if callN(d.fn.getErrorName, uintptr(code), uintptr(unsafe.Pointer(&s))) == 0 {
		e.Name = goString(s)
	}
	s = nil
	if callN(d.fn.getErrorString, uintptr(code), uintptr(unsafe.Pointer(&s))) == 0 {
		e.Text = goString(s)
	}
	return e
}

// check returns nil for CUDA_SUCCESS and the *Error of call otherwise.
func (d *Driver) check(call string, r uint32) error {
	if r == 0 {
		return nil
	}
	return d.newError(call, r)
}

func (e *Error) name() string {
	if e.Name != "" {
		return e.Name
	}
	return fmt.Sprintf("CUresult %d", e.Code)
}

// cString returns s as a NUL-terminated C string in Go memory.
func cString(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// goString copies the NUL-terminated C string at p (nil: "").
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	const limit = 1 << 16 // the driver's strings are short; stop at garbage
	n := 0
	for n < limit && *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
