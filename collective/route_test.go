package collective_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
)

func TestHostSummaryCarriesNICs(t *testing.T) {
	shm, nics, names, ok := collective.HostSummaryRoundTrip("@goccl-1", []string{"10.0.1.2:4000", "10.0.2.2:4001"}, []string{"eth1", "eth2"})
	require.True(t, ok)
	require.Equal(t, "@goccl-1", shm)
	require.Equal(t, []string{"10.0.1.2:4000", "10.0.2.2:4001"}, nics)
	require.Equal(t, []string{"eth1", "eth2"}, names)
	_, nics, _, ok = collective.HostSummaryRoundTrip("", nil, nil)
	require.True(t, ok)
	require.Empty(t, nics)
}

// FuzzHostSummary: a peer's summary comes off the network (through the
// authenticated bootstrap, but still): decoding never panics.
func FuzzHostSummary(f *testing.F) {
	f.Add([]byte{4, 0, 2, 0, 0, 0, 0, 1, 1, 'a', 1, 'b'})
	f.Add([]byte{4, 0, 2, 0, 0, 0, 0, 17})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) { collective.DecodeHostSummary(b) })
}
