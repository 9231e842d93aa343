package launch

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestRunCancelKillsGrandchildren checks that stopping a job reaches the
// processes its ranks started: each rank starts a grandchild that sleeps.
func TestRunCancelKillsGrandchildren(t *testing.T) {
	const np = 2
	o := testOptions(t, np, "grandchild")
	out := newWatchBuffer()
	o.Stdout = out
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := runAsync(ctx, o)
	out.waitCount(t, "rank ready", np)
	out.waitCount(t, "ready pid=", np)

	// Watch the grandchildren through pidfds, opened while they surely
	// live, so that a reused pid cannot fool the test.
	var pidfds []int
	for _, m := range regexp.MustCompile(`ready pid=(\d+)`).FindAllStringSubmatch(out.String(), -1) {
		pid, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ENOSYS) {
			t.Skip("pidfd_open is not supported by this kernel (Linux 5.3+ needed)")
		}
		require.NoError(t, err, "grandchild %d should be alive", pid)
		defer unix.Close(fd)
		pidfds = append(pidfds, fd)
	}
	require.Len(t, pidfds, np)

	cancel()
	require.ErrorIs(t, await(t, errc), context.Canceled)

	for _, fd := range pidfds {
		// A pidfd polls readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(testTimeout.Milliseconds()))
		for errors.Is(err, unix.EINTR) {
			n, err = unix.Poll(fds, int(testTimeout.Milliseconds()))
		}
		require.NoError(t, err)
		require.Equal(t, 1, n, "a grandchild outlived Run by %v", testTimeout)
	}
}
