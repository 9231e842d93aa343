package tcp

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// congestionIs reads fd's TCP congestion control.
func congestionIs(t *testing.T, fd int) string {
	t.Helper()
	name, err := congestionOf(fd)
	require.NoError(t, err)
	return name
}

// sysDefault is the kernel's default congestion control.
func sysDefault(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func TestCongestionFor(t *testing.T) {
	require.Equal(t, "reno", congestionFor("", "bbr"))
	require.Equal(t, "reno", congestionFor("", "bbr2"))
	require.Equal(t, "", congestionFor("", "cubic"), "a congestion control that does not pace is left alone")
	require.Equal(t, "", congestionFor(CongestionSystem, "bbr"))
	require.Equal(t, "cubic", congestionFor("cubic", "bbr"))
	require.Equal(t, "dctcp", congestionFor("dctcp", "cubic"))
	require.NoError(t, ValidCongestion("bbr"))
	require.NoError(t, ValidCongestion(""))
	require.Error(t, ValidCongestion("Reno"))
	require.Error(t, ValidCongestion("reno;x"))
	require.Error(t, ValidCongestion(strings.Repeat("a", 16)))
}

// The data sockets of a connection, dialed and accepted, use Reno where
// the system's default is BBR, and the system's default otherwise;
// "system" leaves them with it.
func TestDataSocketsDoNotPace(t *testing.T) {
	for _, setting := range []string{"", CongestionSystem} {
		t.Run("setting="+setting, func(t *testing.T) {
			sys := sysDefault(t)
			want := sys
			if setting == "" && strings.HasPrefix(sys, "bbr") {
				want = "reno"
			}
			if !strings.HasPrefix(sys, "bbr") {
				t.Logf("the system's default is %s, not BBR: this case cannot tell the settings apart here", sys)
			}
			eps := endpoints(t, 2, func(r int, o *Options) {
				o.Listener.Close()
				ln, err := Listen(o.Listener.Addr().String(), setting)
				require.NoError(t, err)
				o.Listener, o.Congestion = ln, setting
			})
			a, b := connectPair(t, eps[0], eps[1], 0)
			for _, c := range []any{a, b} {
				cn := c.(*conn)
				require.NotEmpty(t, cn.socks)
				for _, s := range cn.socks {
					require.Equal(t, want, congestionIs(t, s.fd))
				}
				if cn.cr.ctl != nil {
					require.Equal(t, want, congestionIs(t, cn.cr.ctl.fd), "the control socket")
				}
			}
		})
	}
}

// A named congestion control the kernel does not have is an error at the
// listener, which says which.
func TestUnknownCongestionIsRefused(t *testing.T) {
	_, err := Listen("127.0.0.1:0", "nosuchcc")
	require.ErrorContains(t, err, `"nosuchcc"`)
	_, err = Listen("127.0.0.1:0", "Bad Name")
	require.ErrorContains(t, err, "Bad Name")
	// A named one the kernel has is set on the listener, and what it
	// accepts inherits it.
	ln, err := Listen("127.0.0.1:0", "reno")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.Accept()
	require.NoError(t, err)
	defer s.Close()
	raw, err := s.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) { require.Equal(t, "reno", congestionIs(t, int(fd))) }))
}

// Congestion says what the sockets of TestDataSocketsDoNotPace use.
func TestCongestionSays(t *testing.T) {
	sys := sysDefault(t)
	want := sys
	if strings.HasPrefix(sys, "bbr") {
		want = "reno"
	}
	require.Equal(t, want, Congestion(""))
	require.Equal(t, sys, Congestion(CongestionSystem))
	require.Equal(t, "dctcp", Congestion("dctcp"))
}
