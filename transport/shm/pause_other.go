//go:build !amd64

package shm

import "unsafe"

func pause() {}

func prefetchw(unsafe.Pointer) {}

const hasPrefetchw = false
