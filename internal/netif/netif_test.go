package netif

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

var fake = []Iface{
	{Name: "lo", Up: true, Loopback: true, Addrs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}},
	{Name: "eth0", Up: true, Addrs: []net.IP{net.ParseIP("fe80::1"), net.ParseIP("10.0.0.5"), net.ParseIP("2001:db8::5")}},
	{Name: "eth1", Up: false, Addrs: []net.IP{net.ParseIP("10.1.0.5")}},
	{Name: "docker0", Up: true, Addrs: []net.IP{net.ParseIP("172.17.0.1")}},
	{Name: "ib0", Up: true, Addrs: []net.IP{net.ParseIP("192.168.9.5")}},
}

func names(as []Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Iface+"="+a.Host())
	}
	return out
}

func TestSelect(t *testing.T) {
	for spec, want := range map[string][]string{
		"":          {"eth0=10.0.0.5", "ib0=192.168.9.5", "eth0=2001:db8::5", "eth0=fe80::1%eth0"},
		"ib":        {"ib0=192.168.9.5"},
		"^eth,lo":   {"docker0=172.17.0.1", "ib0=192.168.9.5"},
		"=eth0":     {"eth0=10.0.0.5", "eth0=2001:db8::5", "eth0=fe80::1%eth0"},
		"=eth":      nil,
		"lo":        {"lo=127.0.0.1", "lo=::1"},
		"eth1,ib0 ": {"ib0=192.168.9.5"},
	} {
		got, err := Select(fake, spec)
		if want == nil {
			require.Error(t, err, spec)
			require.Contains(t, err.Error(), "eth0(up,3 addrs)", "the error lists what it saw")
			continue
		}
		require.NoError(t, err, spec)
		require.Equal(t, want, names(got), spec)
	}
}

func TestLoopbackWhenAllThereIs(t *testing.T) {
	got, err := Select(fake[:1], "")
	require.NoError(t, err)
	require.Equal(t, []string{"lo=127.0.0.1", "lo=::1"}, names(got))
}

func TestBadSpec(t *testing.T) {
	_, err := Select(fake, "^")
	require.ErrorContains(t, err, "names no interface")
}

func TestSystemAndHostID(t *testing.T) {
	ifs, err := System()
	require.NoError(t, err)
	got, err := Select(ifs, "")
	require.NoError(t, err, "this machine has at least loopback")
	require.NotEmpty(t, got)
	machine, err := MachineID()
	require.NoError(t, err)
	id, err := HostID(func(string) (string, bool) { return "", false }, machine)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	id, err = HostID(func(k string) (string, bool) { return "ns1", k == "GOCCL_HOSTID" }, machine)
	require.NoError(t, err)
	require.Equal(t, "ns1", id)
}

func TestSpeedFromSysfs(t *testing.T) {
	root := t.TempDir()
	for name, content := range map[string]string{"eth0": "10000\n", "eth1": "-1\n", "eth2": "x", "eth0.100": "25000\n"} {
		require.NoError(t, os.MkdirAll(root+"/"+name, 0o755))
		require.NoError(t, os.WriteFile(root+"/"+name+"/speed", []byte(content), 0o644))
	}
	bw, ok := speedIn(root, "eth0")
	require.True(t, ok)
	require.Equal(t, 1.25e9, bw, "10 Gb/s")
	bw, ok = speedIn(root, "eth0.100")
	require.True(t, ok, "a VLAN interface has a speed")
	require.Equal(t, 3.125e9, bw)
	for _, name := range []string{"eth1", "eth2", "missing", "../eth0", "..", ""} {
		_, ok := speedIn(root, name)
		require.False(t, ok, name)
	}
}
