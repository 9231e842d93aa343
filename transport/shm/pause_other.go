//go:build !amd64

package shm

func pause() {}
