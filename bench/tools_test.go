package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTools(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(ModuleRoot(), "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(b), "module github.com/goccl/goccl\n")
	require.Equal(t, "1 GiB", SizeName(1<<30))
	require.Equal(t, "1536 KiB", SizeName(3<<19))
	require.Equal(t, "1000 B", SizeName(1000))
	require.Empty(t, SplitList(" , "))
}
