package cuda

import "unsafe"

// ipcOpen calls cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle
// handle, unsigned int flags), whose handle is a 64-byte struct passed by
// value.
//
// System V amd64 ABI (§3.2.3): an aggregate larger than two eightbytes is
// of class MEMORY and passed on the stack, in eightbytes, in argument
// order; it takes no register, so the arguments after it go on taking the
// integer registers in turn. Hence pdptr in RDI, flags in RSI, RDX..R9
// unused, and the handle's eight words as the first eight stack
// arguments, which is where purego.SyscallN puts its arguments 7 to 14.
// (purego's RegisterFunc does the same for a 64-byte struct: its
// addStruct sends every struct above 16 bytes to placeStack.)
//
// Verified by TestFakeIPCHandleByValue: a fake libcuda built by gcc whose
// cuIpcOpenMemHandle_v2 takes the struct by value (as C code receives it)
// checks all 64 bytes against a pattern, and flags.
func ipcOpen(fn uintptr, dp *uintptr, h *[64]byte, flags uint32) uint32 {
	w := (*[8]uintptr)(unsafe.Pointer(h))
	return callN(fn, uintptr(unsafe.Pointer(dp)), uintptr(flags), 0, 0, 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
}
