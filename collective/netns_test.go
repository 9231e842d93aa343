//go:build linux

package collective_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hosts builds k network namespaces, each a "host" with one veth into a
// bridge that lives in a namespace of its own, so that no traffic leaves
// the namespaces this test made. It returns the namespaces and the
// address of each host, and deletes everything when the test ends.
func hosts(t *testing.T, k int) (ns []string, addrs []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: network namespaces need root (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is not installed")
	}
	tag := fmt.Sprintf("gc%d", os.Getpid()%100000)
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	hub := tag + "-hub"
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", hub).Run()
		for _, n := range ns {
			exec.Command("ip", "netns", "del", n).Run()
		}
	})
	run("netns", "add", hub)
	run("-n", hub, "link", "add", "br0", "type", "bridge")
	run("-n", hub, "link", "set", "br0", "up")
	for i := 1; i <= k; i++ {
		n := fmt.Sprintf("%s-h%d", tag, i)
		ns = append(ns, n)
		run("netns", "add", n)
		a, b := fmt.Sprintf("p%d", i), "eth0"
		run("link", "add", a, "netns", hub, "type", "veth", "peer", "name", b, "netns", n)
		run("-n", hub, "link", "set", a, "master", "br0", "up")
		addr := fmt.Sprintf("10.77.0.%d", i)
		run("-n", n, "addr", "add", addr+"/24", "dev", b)
		run("-n", n, "link", "set", b, "up")
		run("-n", n, "link", "set", "lo", "up")
		addrs = append(addrs, addr)
	}
	return ns, addrs
}

// TestMultiHostNamespaces runs every collective with ranks on two or three
// "hosts" (network namespaces with their own GOCCL_HOSTID) joined by veth
// and a bridge: real TCP between separate network stacks, and shared
// memory between the ranks inside each, in one communicator.
func TestMultiHostNamespaces(t *testing.T) {
	for _, shape := range []struct{ hosts, perHost int }{{3, 1}, {3, 2}, {2, 2}} {
		perHost := shape.perHost
		t.Run(fmt.Sprintf("hosts=%d/ranks-per-host=%d", shape.hosts, perHost), func(t *testing.T) {
			ns, addrs := hosts(t, shape.hosts)
			n := shape.hosts * perHost
			envs := gocclEnvs(t, n)
			for r := range envs {
				h := r / perHost
				for i, kv := range envs[r] {
					if strings.HasPrefix(kv, "GOCCL_ROOT=") {
						envs[r][i] = "GOCCL_ROOT=" + addrs[0] + ":29500"
					}
				}
				envs[r] = append(envs[r], "GOCCL_HOSTID="+ns[h])
			}
			res := spawn(t, "collectives", envs, func(r int) []string {
				return []string{"ip", "netns", "exec", ns[r/perHost]}
			})
			requireAllOK(t, res)
			for _, h := range ns {
				require.Contains(t, res[0].output, h, "rank 0 sees every host")
			}
			// Shared memory inside a host, TCP across.
			for q := 1; q < n; q++ {
				want := "tcp"
				if q/perHost == 0 {
					want = "shm"
				}
				require.Contains(t, res[0].output, fmt.Sprintf("rank %d transport %s ", q, want))
			}
			require.Contains(t, res[0].output, "10.77.0.", "the ranks talk over the veths")
		})
	}
}

// TestChaosNamespaces runs every collective between two "hosts" whose
// links lose 1% of packets, delay them 5 ms ± 2 ms and reorder a quarter
// of them (tc netem on both ends): TCP repairs it all, so the results
// must stay exact and nothing may hang.
func TestChaosNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: the netem delays make it take seconds")
	}
	if _, err := exec.LookPath("tc"); err != nil {
		t.Skip("skipping: the tc command (iproute2) is not installed")
	}
	ns, addrs := hosts(t, 2)
	for _, n := range ns {
		out, err := exec.Command("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
			"loss", "1%", "delay", "5ms", "2ms", "reorder", "25%", "50%").CombinedOutput()
		if err != nil && (strings.Contains(string(out), "Operation not supported") || strings.Contains(string(out), "qdisc kind is unknown")) {
			t.Skipf("skipping: this kernel has no netem qdisc (sch_netem): %s", strings.TrimSpace(string(out)))
		}
		require.NoError(t, err, "tc: %s", out)
	}
	envs := gocclEnvs(t, 2, "GOCCL_TEST_SHORT=1")
	for r := range envs {
		for i, kv := range envs[r] {
			if strings.HasPrefix(kv, "GOCCL_ROOT=") {
				envs[r][i] = "GOCCL_ROOT=" + addrs[0] + ":29500"
			}
		}
		envs[r] = append(envs[r], "GOCCL_HOSTID="+ns[r])
	}
	res := spawn(t, "collectives", envs, func(r int) []string {
		return []string{"ip", "netns", "exec", ns[r]}
	})
	requireAllOK(t, res)
	require.Contains(t, res[0].output, "rank 1 transport tcp ")
	t.Logf("took %v and %v", res[0].took, res[1].took)
}
