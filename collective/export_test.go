package collective

import "github.com/goccl/goccl/transport/mem"

// NewLocalGroupNet is NewLocalGroup that also returns the in-process
// network, so that tests can inject faults.
func NewLocalGroupNet(n int, opts ...Option) ([]*Comm, *mem.Network, error) {
	return newLocalGroup(n, opts)
}

// GDRAllowedIn is gdrAllowed on a fake sysfs tree.
var GDRAllowedIn = gdrAllowedIn

// RootListenAddr is rootListenAddr on the given interfaces.
var RootListenAddr = rootListenAddr
