package collective_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
)

// Register keeps a Go buffer's contents, shares its whole pages, and
// Deregister gives them back once; a second Deregister says so.
func TestRegisterAndDeregister(t *testing.T) {
	if runtime.GOOS != "linux" {
		_, err := collective.Register(make([]float32, 1<<16))
		require.Error(t, err, "registration needs Linux")
		return
	}
	buf := make([]float32, 1<<18)
	for i := range buf {
		buf[i] = float32(i)
	}
	reg, err := collective.Register(buf)
	require.NoError(t, err)
	require.Greater(t, reg.Bytes(), 4*len(buf)-2*4096, "all but the part-pages at the ends")
	for i, v := range buf {
		if v != float32(i) {
			t.Fatalf("element %d = %v after Register", i, v)
		}
	}
	buf[7] = -1
	require.NoError(t, reg.Deregister())
	require.Equal(t, float32(-1), buf[7], "written while registered, kept after")
	require.ErrorContains(t, reg.Deregister(), "deregistered already")

	_, err = collective.Register([]float32{})
	require.Error(t, err)
	small, err := collective.Register(make([]float32, 10))
	require.NoError(t, err)
	require.Zero(t, small.Bytes(), "no whole page in 40 bytes")
	require.NoError(t, small.Deregister())
}
