//go:build !amd64 && !arm64

package cuda

// ipcOpen: passing a 64-byte struct by value is written out for amd64 and
// arm64 only; elsewhere OpenIPC fails with CUDA_ERROR_NOT_SUPPORTED.
func ipcOpen(fn uintptr, dp *uintptr, h *[64]byte, flags uint32) uint32 {
	return errNotSupported
}
