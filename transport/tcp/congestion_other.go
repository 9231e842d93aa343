//go:build !linux

package tcp

import (
	"errors"
	"runtime"
)

// setCongestion: choosing a socket's congestion control is built for
// Linux only; elsewhere the default leaves the system's (Reno on loopback
// is best effort) and a named one is refused.
func setCongestion(fd int, name string) error {
	return errors.New("choosing a socket's congestion control is not supported on " + runtime.GOOS)
}

// congestionOf: see setCongestion.
func congestionOf(fd int) (string, error) {
	return "", errors.New("reading a socket's congestion control is not supported on " + runtime.GOOS)
}

// systemCongestion: not known off Linux.
func systemCongestion() string { return "" }
