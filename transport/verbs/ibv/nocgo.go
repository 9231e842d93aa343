//go:build !verbs || !cgo || !linux

package ibv

// OpenLibrary would load libibverbs; this build has no verbs layer (it
// needs -tags verbs, cgo and Linux: see cgo.go), so it returns
// ErrNotBuilt.
func OpenLibrary() (Provider, error) { return nil, ErrNotBuilt }
