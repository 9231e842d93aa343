package transport_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/transport"
)

type fakeEndpoint struct{ transport.Endpoint }

type progressing struct {
	fakeEndpoint
	calls   []int
	pending bool
	err     error
}

func (p *progressing) Progress(ch int) (bool, error) {
	p.calls = append(p.calls, ch)
	return p.pending, p.err
}

func TestProgressOf(t *testing.T) {
	require.Nil(t, transport.ProgressOf(fakeEndpoint{}), "no Progresser, no function")
	a, b := &progressing{}, &progressing{pending: true}
	f := transport.ProgressOf(fakeEndpoint{}, a, b)
	pending, err := f(3)
	require.NoError(t, err)
	require.True(t, pending, "pending if any is")
	require.Equal(t, []int{3}, a.calls)
	require.Equal(t, []int{3}, b.calls)
	a.err = errors.New("socket gone")
	_, err = f(1)
	require.ErrorIs(t, err, a.err)
	one := transport.ProgressOf(a)
	_, err = one(2)
	require.ErrorIs(t, err, a.err)
	require.Equal(t, []int{3, 1, 2}, a.calls)
}

// The channel numbers a communicator uses, and no others (issue 19: a
// peer's setup could name any of 2^32 channels).
func TestValidChannel(t *testing.T) {
	for _, ch := range []int{0, 1, 31, transport.MaxChannel, transport.DeviceChannels - 1, transport.DeviceChannels, transport.DeviceChannels + transport.MaxChannel} {
		if !transport.ValidChannel(ch) {
			t.Errorf("channel %d refused", ch)
		}
	}
	for _, ch := range []int{-1, transport.MaxChannel + 1, 5000, transport.DeviceChannels - 2, transport.DeviceChannels + transport.MaxChannel + 1, 1 << 30} {
		if transport.ValidChannel(ch) {
			t.Errorf("channel %d accepted", ch)
		}
	}
}
