//go:build !linux

package ibemu

import "errors"

// newSegment fails away from Linux: the emulated NIC's memory is a memfd
// its peers map through /proc (see the Linux build).
func newSegment(n int) (*segment, error) {
	return nil, errors.New("ibemu: the emulated device is Linux only (memfd_create)")
}
