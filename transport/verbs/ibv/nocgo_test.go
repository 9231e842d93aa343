//go:build !verbs || !cgo || !linux

package ibv

import (
	"errors"
	"testing"
)

func TestOpenLibraryNotBuilt(t *testing.T) {
	p, err := OpenLibrary()
	if p != nil || !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("OpenLibrary() = %v, %v; want nil, ErrNotBuilt", p, err)
	}
}
