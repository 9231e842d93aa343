package ibv

import "unsafe"

// addrOf is the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Addr is the address of b's first byte, as SGEs and regions name it.
func Addr(b []byte) uint64 { return uint64(addrOf(b)) }
