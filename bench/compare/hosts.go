package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The hosts transport: two network namespaces as hosts, joined by one
// veth pair shaped with tc tbf on both ends (as ../shared/baselines'
// netns_setup.sh), half of the ranks in each, block placement. Every tool
// is started by MPICH's launcher (hydra), whose PMI travels over an
// inherited descriptor, so ranks may live in other namespaces; goccl
// reads hydra's PMI_RANK and PMI_SIZE. Open MPI cannot run there (its
// PMIx client reaches the launcher over 127.0.0.1 of the launching
// namespace: ../shared/baselines/run.sh tried it), nor Gloo without a
// launcher of its own; both are left out of this transport with a message.
type hostsNet struct {
	ns    [2]string
	addrs [2]string
	port  int
}

const hostsDev = "vx0"

// upHosts builds the namespaces; down deletes them.
func upHosts(rate string) (*hostsNet, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the hosts transport makes network namespaces: run as root")
	}
	h := &hostsNet{ns: [2]string{fmt.Sprintf("cmp%da", os.Getpid()), fmt.Sprintf("cmp%db", os.Getpid())},
		addrs: [2]string{"10.97.0.1", "10.97.0.2"}, port: 29800}
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	steps := [][]string{{"netns", "add", h.ns[0]}, {"netns", "add", h.ns[1]},
		{"link", "add", hostsDev, "netns", h.ns[0], "type", "veth", "peer", "name", hostsDev, "netns", h.ns[1]}}
	for i, n := range h.ns {
		steps = append(steps, []string{"-n", n, "addr", "add", h.addrs[i] + "/24", "dev", hostsDev},
			[]string{"-n", n, "link", "set", "lo", "up"}, []string{"-n", n, "link", "set", hostsDev, "up"})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			h.down()
			return nil, err
		}
	}
	// Both ends must report carrier before anything uses the link: right
	// after creation one may still be down, and UCX then refuses the
	// device (netns_setup.sh waits the same way).
	for i := 0; ; i++ {
		up := true
		for _, n := range h.ns {
			out, _ := exec.Command("ip", "-n", n, "-o", "link", "show", hostsDev).Output()
			up = up && strings.Contains(string(out), "state UP")
		}
		if up {
			break
		}
		if i == 50 {
			h.down()
			return nil, fmt.Errorf("the veth between the hosts did not come up in 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rate != "none" {
		for _, n := range h.ns {
			if out, err := exec.Command("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", hostsDev, "root",
				"tbf", "rate", rate, "burst", "4mb", "latency", "10ms").CombinedOutput(); err != nil {
				h.down()
				return nil, fmt.Errorf("tc tbf rate %s: %v: %s", rate, err, out)
			}
		}
	}
	return h, nil
}

func (h *hostsNet) down() {
	for _, n := range h.ns {
		exec.Command("ip", "netns", "del", n).Run()
	}
}

// argv returns the hydra command line that runs inner with np/2 ranks in
// each namespace. env[i] is extra environment for the ranks of host i.
func (h *hostsNet) argv(np int, inner []string, env [2][]string) []string {
	argv := []string{"mpirun.mpich"}
	for i, n := range h.ns {
		if i > 0 {
			argv = append(argv, ":")
		}
		argv = append(argv, "-np", strconv.Itoa(np/2), "ip", "netns", "exec", n, "env")
		argv = append(argv, env[i]...)
		argv = append(argv, inner...)
	}
	return argv
}

// goccl returns the environment of goccl's ranks for one run: the root on
// host 0 at a fresh port, a fresh secret, and each namespace its host id.
func (h *hostsNet) goccl() [2][]string {
	h.port++
	var b [16]byte
	rand.Read(b[:])
	common := []string{"GOCCL_ROOT=" + h.addrs[0] + ":" + strconv.Itoa(h.port), "GOCCL_SECRET=" + hex.EncodeToString(b[:])}
	var env [2][]string
	for i, n := range h.ns {
		env[i] = append(append([]string(nil), common...), "GOCCL_HOSTID="+n)
	}
	return env
}

// mpich is MPICH's environment: UCX over TCP on the veth for every pair
// (hydra sees one machine, so without MPIR_CVAR_NOLOCAL the two
// namespaces' ranks would share memory across the "hosts").
func (h *hostsNet) mpich() [2][]string {
	e := []string{"UCX_TLS=tcp,self", "UCX_NET_DEVICES=" + hostsDev, "MPIR_CVAR_NOLOCAL=1"}
	return [2][]string{e, e}
}
