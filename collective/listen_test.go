package collective_test

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/netif"
)

// The root listens where GOCCL_ROOT says when that is this machine, on
// every interface when it cannot tell, and when a name resolves to
// loopback only here (a hostname in /etc/hosts as 127.0.1.1: the other
// hosts resolve it elsewhere).
func TestRootListenAddr(t *testing.T) {
	ifs := []netif.Iface{{Name: "eth0", Up: true, Addrs: []net.IP{net.ParseIP("10.1.2.3")}}}
	for root, want := range map[string]string{
		"127.0.0.1:29500":            "127.0.0.1:29500",
		"[::1]:29500":                "[::1]:29500",
		"10.1.2.3:29500":             "10.1.2.3:29500",
		"10.9.9.9:29500":             ":29500", // not this machine's (NAT, a service address)
		":29500":                     ":29500",
		"localhost:29500":            "127.0.0.1:29500",
		"no-such-host.invalid:29500": ":29500",
	} {
		require.Equal(t, want, collective.RootListenAddr(root, ifs), root)
	}
}

// A job whose root is on loopback listens on loopback only: the root and
// every rank's data listeners (issue 19: GOCCL_ROOT=127.0.0.1:P listened
// on every interface).
func TestMultiProcessListenOnLoopback(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			res := spawn(t, "listeners", gocclEnvs(t, 2, "GOCCL_TRANSPORT="+tr), nil)
			requireAllOK(t, res)
			for _, r := range res {
				if tr == "tcp" {
					require.Contains(t, r.output, "listening on", "rank %d:\n%s", r.rank, r.output)
				}
				t.Logf("rank %d: %s", r.rank, r.output)
				for _, line := range strings.Split(r.output, "\n") {
					if addr, ok := strings.CutPrefix(line, "listening on "); ok {
						host, _, err := net.SplitHostPort(addr)
						require.NoError(t, err)
						require.True(t, net.ParseIP(host).IsLoopback(), "rank %d listens on %s", r.rank, addr)
					}
				}
			}
		})
	}
}

// Rank 0 of a job whose GOCCL_ROOT is on loopback hosts the root on
// loopback alone (it listened on every interface): looked at while it
// waits for a rank that never comes.
func TestRootListensWhereAsked(t *testing.T) {
	env := gocclEnvs(t, 2)[0]
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(cleanEnv(), append([]string{childEnv + "=missing", "GOCCL_INIT_TIMEOUT=20s"}, env...)...)
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	pid := strconv.Itoa(cmd.Process.Pid)
	var lns []string
	for deadline := time.Now().Add(10 * time.Second); len(lns) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		lns, _ = tcpListeners(pid)
	}
	require.NotEmpty(t, lns, "rank 0 never listened")
	root := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "GOCCL_ROOT="); ok {
			root = v
		}
	}
	require.Contains(t, lns, root, "the root listens at GOCCL_ROOT exactly")
	for _, l := range lns {
		host, _, _ := net.SplitHostPort(l)
		require.True(t, net.ParseIP(host).IsLoopback(), "rank 0 listens on %s (GOCCL_ROOT=%s)", l, root)
	}
}

// ownTCPListeners lists the local addresses of this process's listening
// TCP sockets, from /proc (what `ss -ltnp` shows for it).
func ownTCPListeners() ([]string, error) { return tcpListeners("self") }

// tcpListeners is ownTCPListeners of process pid ("self" for this one).
func tcpListeners(pid string) ([]string, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join("/proc", pid, "fd", fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, f := range []string{"/proc/" + pid + "/net/tcp", "/proc/" + pid + "/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			hostPort := strings.Split(fields[1], ":")
			raw, err := hex.DecodeString(hostPort[0])
			if err != nil {
				continue
			}
			// /proc prints the address as 32-bit words in host order.
			for i := 0; i+4 <= len(raw); i += 4 {
				raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			port, _ := strconv.ParseUint(hostPort[1], 16, 16)
			out = append(out, net.JoinHostPort(net.IP(raw).String(), fmt.Sprint(port)))
		}
		fh.Close()
	}
	return out, nil
}

func TestRootListenAddrOfAHostnameOnLoopback(t *testing.T) {
	name, err := os.Hostname()
	require.NoError(t, err)
	ips, err := net.LookupIP(name)
	if err != nil || len(ips) == 0 {
		t.Skipf("this machine's hostname %q does not resolve: %v", name, err)
	}
	allLoop := true
	for _, ip := range ips {
		allLoop = allLoop && ip.IsLoopback()
	}
	if !allLoop {
		t.Skipf("hostname %q resolves to %v, not to loopback only", name, ips)
	}
	require.Equal(t, ":29500", collective.RootListenAddr(name+":29500", nil), "every interface, not %v", ips)
}
