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

// HostSummaryRoundTrip encodes a host summary with the given NICs and
// decodes it back; Decode decodes raw bytes (for the fuzzer).
func HostSummaryRoundTrip(shm string, nics, names []string) (gotShm string, gotNICs, gotNames []string, ok bool) {
	h, ok := decodeHostSummary(hostSummary{CPUs: 3, Shm: shm, NICs: nics, NICNames: names}.encode())
	return h.Shm, h.NICs, h.NICNames, ok
}

// DecodeHostSummary reports whether b decodes as a host summary.
func DecodeHostSummary(b []byte) bool { _, ok := decodeHostSummary(b); return ok }
