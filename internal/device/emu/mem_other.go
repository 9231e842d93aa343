//go:build !unix

package emu

// mapAnon allocates n bytes. Without mmap they are Go heap memory, kept
// alive by the allocation that holds them (the Go collector does not move
// objects).
func mapAnon(n int) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}
