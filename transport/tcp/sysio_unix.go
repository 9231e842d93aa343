//go:build unix && !linux

package tcp

import "golang.org/x/sys/unix"

// sysRead is read(2) on a non-blocking descriptor.
func sysRead(fd int, b []byte) (int, error) { return unix.Read(fd, b) }

// sysPoll0 is poll(2) with a zero timeout: it never blocks.
func sysPoll0(fds []unix.PollFd) (int, error) { return unix.Poll(fds, 0) }
