package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/transport/verbs/ibemu"
	"github.com/goccl/goccl/transport/verbs/ibv"
)

func TestMRCacheSharesPagesAndCountsUsers(t *testing.T) {
	ctx, err := ibemu.New(ibemu.Options{Dir: t.TempDir()}).Open(ibemu.DeviceName)
	require.NoError(t, err)
	defer ctx.Close()
	mem, err := ibv.Alloc(3 * pageSize)
	require.NoError(t, err)
	defer mem.Free()
	c := newMRCache(ctx)

	a, err := c.register(mem.B[100:200], ibv.AccessRemoteWriteAll)
	require.NoError(t, err)
	b, err := c.register(mem.B[300:4000], ibv.AccessRemoteWriteAll) // the same page
	require.NoError(t, err)
	require.Equal(t, a.MR.RKey(), b.MR.RKey(), "one region for one page range")
	require.Equal(t, 1, c.len())
	require.Equal(t, ibv.Addr(mem.B), a.MR.Addr(), "the region starts at the page")
	require.Equal(t, pageSize, a.MR.Len())

	d, err := c.register(mem.B[100:5000], ibv.AccessRemoteWriteAll) // two pages: another range
	require.NoError(t, err)
	require.NotEqual(t, a.MR.RKey(), d.MR.RKey())
	l, err := c.register(mem.B[100:200], ibv.AccessLocalWrite) // another access
	require.NoError(t, err)
	require.NotEqual(t, a.MR.RKey(), l.MR.RKey())
	require.Equal(t, 3, c.len())

	require.NoError(t, a.release())
	require.Equal(t, 3, c.len(), "b still holds it")
	require.NoError(t, a.release(), "a second release of one hold is a no-op")
	require.NoError(t, b.release())
	require.Equal(t, 2, c.len(), "deregistered with its last user")
	require.NoError(t, d.release())
	require.NoError(t, l.release())
	require.Zero(t, c.len())
	_, err = c.register(nil, ibv.AccessLocalWrite)
	require.Error(t, err)
}
