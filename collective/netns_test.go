//go:build linux

package collective_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/netchaos"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
)

// requireNetns skips the test where it cannot make network namespaces.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: network namespaces need root (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is not installed")
	}
}

// nsTag starts the names of the namespaces this test process makes.
func nsTag() string { return fmt.Sprintf("gc%d", os.Getpid()%100000) }

// ipCmd runs the ip command and fails the test if it fails.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// hosts builds k network namespaces, each a "host" with one veth into a
// bridge that lives in a namespace of its own, so that no traffic leaves
// the namespaces this test made. It returns the namespaces and the
// address of each host, and deletes everything when the test ends.
func hosts(t *testing.T, k int) (ns []string, addrs []string) {
	return hostsWithNICs(t, k, 1)
}

// hostsWithNICs is hosts with nics interfaces per host, eth0, eth1, ...:
// interface j of host i is 10.77.j.i, on a bridge (and subnet) of its own,
// like the rails of a cluster. The addresses returned are eth0's.
func hostsWithNICs(t *testing.T, k, nics int) (ns []string, addrs []string) {
	t.Helper()
	requireNetns(t)
	tag := nsTag()
	hub := tag + "-hub"
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", hub).Run()
		for _, n := range ns {
			exec.Command("ip", "netns", "del", n).Run()
		}
	})
	ipCmd(t, "netns", "add", hub)
	for j := range nics {
		br := fmt.Sprintf("br%d", j)
		ipCmd(t, "-n", hub, "link", "add", br, "type", "bridge")
		ipCmd(t, "-n", hub, "link", "set", br, "up")
	}
	for i := 1; i <= k; i++ {
		n := fmt.Sprintf("%s-h%d", tag, i)
		ns = append(ns, n)
		ipCmd(t, "netns", "add", n)
		for j := range nics {
			a, b := fmt.Sprintf("p%d-%d", i, j), fmt.Sprintf("eth%d", j)
			ipCmd(t, "link", "add", a, "netns", hub, "type", "veth", "peer", "name", b, "netns", n)
			ipCmd(t, "-n", hub, "link", "set", a, "master", fmt.Sprintf("br%d", j), "up")
			addr := fmt.Sprintf("10.77.%d.%d", j, i)
			ipCmd(t, "-n", n, "addr", "add", addr+"/24", "dev", b)
			ipCmd(t, "-n", n, "link", "set", b, "up")
			if j == 0 {
				addrs = append(addrs, addr)
			}
		}
		ipCmd(t, "-n", n, "link", "set", "lo", "up")
	}
	return ns, addrs
}

// rxBytes reads how many bytes interface dev of namespace ns received.
func rxBytes(t *testing.T, ns, dev string) int64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/sys/class/net/"+dev+"/statistics/rx_bytes").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var n int64
	_, err = fmt.Sscan(string(out), &n)
	require.NoError(t, err)
	return n
}

// TestTwoNICsPerHost runs every collective between two hosts joined by
// two interfaces each (two rails), GOCCL_SOCKET_IFNAME naming both: each
// TCP connection's sockets spread over both, so both carry the data.
func TestTwoNICsPerHost(t *testing.T) {
	ns, addrs := hostsWithNICs(t, 2, 2)
	before := [2]int64{rxBytes(t, ns[1], "eth0"), rxBytes(t, ns[1], "eth1")}
	envs := gocclEnvs(t, 2, "GOCCL_SOCKET_IFNAME=eth", "GOCCL_DEBUG=INFO", "GOCCL_DEBUG_SUBSYS=INIT")
	for r := range envs {
		for i, kv := range envs[r] {
			if strings.HasPrefix(kv, "GOCCL_ROOT=") {
				envs[r][i] = "GOCCL_ROOT=" + addrs[0] + ":29500"
			}
		}
		envs[r] = append(envs[r], "GOCCL_HOSTID="+ns[r])
	}
	res := spawn(t, "collectives", envs, func(r int) []string { return []string{"ip", "netns", "exec", ns[r]} })
	requireAllOK(t, res)
	for _, r := range res {
		require.Contains(t, r.output, "nics=eth0:10Gb/s,eth1:10Gb/s", "rank %d (veths report 10 Gb/s)", r.rank)
	}
	// The collectives move megabytes each way (hundreds of kilobytes with
	// GOCCL_TEST_SHORT's counts); each rail must carry a good part of it
	// (slices alternate over the sockets).
	got := [2]int64{rxBytes(t, ns[1], "eth0") - before[0], rxBytes(t, ns[1], "eth1") - before[1]}
	t.Logf("host 2 received %d bytes on eth0, %d on eth1", got[0], got[1])
	require.Greater(t, got[0], int64(256<<10))
	require.Greater(t, got[1], got[0]/4, "eth1 carries its share")
}

// TestMultiHostNamespaces runs every collective with ranks on two or three
// "hosts" (network namespaces with their own GOCCL_HOSTID) joined by veth
// and a bridge: real TCP between separate network stacks, and shared
// memory between the ranks inside each, in one communicator.
func TestMultiHostNamespaces(t *testing.T) {
	// place[r] is rank r's host. Block placements; then round robin, where
	// the ring and the tree must follow the hosts, not the rank numbers
	// (once with the tree forced); and three hosts with uneven ranks,
	// interleaved.
	// The TLS shape also runs TLS on every TCP connection: shared memory
	// inside each host, TLS records across.
	// The verbs shapes give every rank a port of one emulated fabric (a
	// directory the namespaces share): between hosts auto takes RDMA.
	for _, shape := range []struct {
		place      []int
		tls, verbs bool
		algo       string
		ring       string // the INFO summary's ring order, where checked
	}{
		{place: []int{0, 1, 2}}, {place: []int{0, 0, 1, 1, 2, 2}}, {place: []int{0, 0, 1, 1}},
		{place: []int{0, 0, 1, 1}, tls: true}, {place: []int{0, 1}, verbs: true}, {place: []int{0, 0, 1, 1}, verbs: true},
		{place: []int{0, 1, 0, 1}, ring: "0 2 | 1 3"}, {place: []int{0, 1, 0, 1}, algo: "tree"},
		{place: []int{0, 1, 0, 1}, algo: "hier"}, {place: []int{0, 0, 0, 1, 1, 1}, algo: "hier"},
		{place: []int{0, 0, 1, 1}, algo: "ring"},
		{place: []int{0, 0, 1, 1, 2, 2}, algo: "hiertree"},
		{place: []int{0, 1, 2, 1, 2}, ring: "0 | 1 3 | 2 4"},
	} {
		place := shape.place
		nhosts := slices.Max(place) + 1
		name := fmt.Sprintf("place=%v/tls=%v/verbs=%v", strings.Trim(strings.ReplaceAll(fmt.Sprint(place), " ", ","), "[]"), shape.tls, shape.verbs)
		if shape.algo != "" {
			name += "/algo=" + shape.algo
		}
		t.Run(name, func(t *testing.T) {
			ns, addrs := hosts(t, nhosts)
			n := len(place)
			var extra []string
			if shape.verbs {
				extra = []string{"GOCCL_IB_EMULATE=1", "GOCCL_IB_EMULATE_DIR=" + t.TempDir()}
			}
			if shape.algo != "" {
				extra = append(extra, "GOCCL_ALGO="+shape.algo)
			}
			envs := gocclEnvs(t, n, extra...)
			if shape.tls || shape.ring != "" {
				for r := range envs {
					envs[r] = append(envs[r], "GOCCL_DEBUG=INFO", "GOCCL_DEBUG_SUBSYS=INIT")
				}
			}
			if shape.tls {
				tlsEnvs(t, envs, tlstest.NewCA(t, "job"))
			}
			for r := range envs {
				for i, kv := range envs[r] {
					if strings.HasPrefix(kv, "GOCCL_ROOT=") {
						envs[r][i] = "GOCCL_ROOT=" + addrs[place[0]] + ":29500"
					}
				}
				envs[r] = append(envs[r], "GOCCL_HOSTID="+ns[place[r]])
			}
			res := spawn(t, "collectives", envs, func(r int) []string {
				return []string{"ip", "netns", "exec", ns[place[r]]}
			})
			requireAllOK(t, res)
			for _, h := range ns {
				require.Contains(t, res[0].output, h, "rank 0 sees every host")
			}
			// Shared memory inside a host, TCP (or RDMA) across.
			for q := 1; q < n; q++ {
				want := "tcp"
				if shape.verbs {
					want = "verbs"
				}
				if place[q] == place[0] {
					want = "shm"
				}
				require.Contains(t, res[0].output, fmt.Sprintf("rank %d transport %s ", q, want))
			}
			if shape.ring != "" {
				for _, r := range res {
					require.Contains(t, r.output, fmt.Sprintf("ring=\"%s\"", shape.ring), "rank %d", r.rank)
				}
				// Hosts of equal size, a slow network and fast shared
				// memory: the tuner takes the hierarchy for large
				// all-reduces, reduce-scatters and all-gathers; uneven
				// hosts cannot have it.
				for _, pick := range []string{"allreduce_64MiB=hier/", "reducescatter_64MiB=hier/", "allgather_64MiB=hier/"} {
					if slices.Max(place) == 1 {
						require.Contains(t, res[0].output, pick)
					} else {
						require.NotContains(t, res[0].output, pick)
					}
				}
				if slices.Max(place) > 1 {
					require.Contains(t, res[0].output, "reducescatter_64MiB=ring/")
				}
				// The namespaces share this machine's CPUs: its ranks are
				// counted together, whatever hosts they are.
				if n > runtime.NumCPU() {
					require.Contains(t, res[0].output, "oversubscribed=true", "%d ranks on %d CPUs", n, runtime.NumCPU())
				} else {
					require.NotContains(t, res[0].output, "oversubscribed=")
				}
			}
			require.Contains(t, res[0].output, "10.77.0.", "the ranks talk over the veths")
			if shape.tls {
				for _, r := range res {
					require.Contains(t, r.output, "tls=true", "rank %d", r.rank)
				}
			}
		})
	}
}

// netemWorks says whether tc can add a netem qdisc here, trying it on the
// loopback of a scratch namespace, and if not, why.
func netemWorks(t *testing.T) (ok bool, why string) {
	t.Helper()
	if _, err := exec.LookPath("tc"); err != nil {
		return false, "the tc command (iproute2) is not installed"
	}
	probe := nsTag() + "-probe"
	ipCmd(t, "netns", "add", probe)
	defer exec.Command("ip", "netns", "del", probe).Run()
	out, err := exec.Command("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms").CombinedOutput()
	if err != nil && (strings.Contains(string(out), "Operation not supported") || strings.Contains(string(out), "qdisc kind is unknown")) {
		return false, "this kernel has no netem qdisc (sch_netem): " + strings.TrimSpace(string(out))
	}
	require.NoError(t, err, "tc: %s", out)
	return true, ""
}

// tunHosts builds two network namespaces, "hosts" joined by nothing but a
// netchaos link that impairs the packets between them as imp says. It
// returns the namespaces, the address of each host and the link, and
// deletes everything when the test ends.
func tunHosts(t *testing.T, imp netchaos.Impairment) (ns, addrs []string, link *netchaos.Link) {
	t.Helper()
	requireNetns(t)
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: no netem qdisc and no TUN device for netchaos: %v", err)
	}
	for i := 1; i <= 2; i++ {
		n := fmt.Sprintf("%s-t%d", nsTag(), i)
		ipCmd(t, "netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
		ns = append(ns, n)
		addrs = append(addrs, fmt.Sprintf("10.78.0.%d", i))
	}
	link, err := netchaos.New(netchaos.End{Netns: ns[0], Addr: netip.MustParseAddr(addrs[0])},
		netchaos.End{Netns: ns[1], Addr: netip.MustParseAddr(addrs[1])}, imp)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, link.Close()) })
	return ns, addrs, link
}

// TestChaosNamespaces runs every collective between two "hosts" whose
// links lose 1% of packets, delay them 5 ms ± 2 ms and reorder a quarter
// of them (netem's "reorder 25% 50%"): TCP repairs it all, so the results
// must stay exact and nothing may hang. tc netem on both ends of the veths
// does it where the kernel has sch_netem; elsewhere (our development
// machines and CI) netchaos does the same in userspace over TUN devices.
func TestChaosNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: the delays make it take seconds")
	}
	requireNetns(t)
	var ns, addrs []string
	var link *netchaos.Link
	if ok, why := netemWorks(t); ok {
		ns, addrs = hosts(t, 2)
		for _, n := range ns {
			out, err := exec.Command("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
				"loss", "1%", "delay", "5ms", "2ms", "reorder", "25%", "50%").CombinedOutput()
			require.NoError(t, err, "tc: %s", out)
		}
		t.Log("impairing with tc netem on both veths")
	} else {
		// The seed is fixed so that each direction's first drops and
		// reorders fall at the same packets on every run, well inside
		// the thousands of packets the collectives send.
		imp := netchaos.Impairment{Loss: 0.01, Delay: 5 * time.Millisecond, Jitter: 2 * time.Millisecond,
			Reorder: 0.25, ReorderCorrelation: 0.5, Seed: 1}
		ns, addrs, link = tunHosts(t, imp)
		t.Logf("impairing with netchaos over TUN devices (%s): %v", why, imp)
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
	start := time.Now()
	res := spawn(t, "collectives", envs, func(r int) []string {
		return []string{"ip", "netns", "exec", ns[r]}
	})
	requireAllOK(t, res)
	require.Contains(t, res[0].output, "rank 1 transport tcp ")
	require.Contains(t, res[0].output, "addr "+addrs[1]+":", "rank 1 is reached at its host's address")
	t.Logf("took %v (rank 0 %v, rank 1 %v)", time.Since(start), res[0].took, res[1].took)
	if link != nil {
		// Let the last packets (the ranks' goodbyes) leave the delay queue,
		// so the counters add up.
		settled := func() bool { c := link.Stats().Total(); return c.Read == c.Passed+c.Dropped+c.Failed }
		require.Eventually(t, settled, 10*time.Second, time.Millisecond, "packets stuck in the link: %+v", link.Stats())
		s := link.Stats()
		t.Logf("netchaos 0->1: %v", s.AB)
		t.Logf("netchaos 1->0: %v", s.BA)
		// Without drops and reorders this test would prove nothing.
		require.Positive(t, s.Total().Dropped, "no packet was dropped")
		require.Positive(t, s.Total().Reordered, "no packet was reordered")
		require.Zero(t, s.Total().Failed, "the link failed to deliver packets")
	}
}
