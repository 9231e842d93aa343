package cuda

import "unsafe"

// ipcOpen calls cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle
// handle, unsigned int flags), whose handle is a 64-byte struct passed by
// value.
//
// AAPCS64 (§6.8.2, rule B.4): a composite type larger than 16 bytes is
// copied to memory the caller allocates and replaced by a pointer to the
// copy, which takes the next integer register: pdptr in X0, &copy in X1,
// flags in X2. Untested on arm64 here (TestFakeIPCHandleByValue checks it
// wherever gcc and an arm64 machine meet).
func ipcOpen(fn uintptr, dp *uintptr, h *[64]byte, flags uint32) uint32 {
	c := *h // the callee may write its copy
	return callN(fn, uintptr(unsafe.Pointer(dp)), uintptr(unsafe.Pointer(&c)), uintptr(flags))
}
