package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The hosts transport: two network namespaces as hosts, joined by one
// veth pair shaped with tc tbf on both ends (as ../shared/baselines'
// netns_setup.sh), half of the ranks in each, block placement. Every tool
// is started by MPICH's launcher (hydra), whose PMI travels over an
// inherited descriptor, so ranks may live in other namespaces; goccl
// reads hydra's PMI_RANK and PMI_SIZE.
//
// Open MPI is started by its own launcher, as on two machines: mpirun runs
// in host 0's namespace and starts its daemon (orted) on host 1 through an
// rsh agent that enters host 1's namespace where ssh would log in. Under
// hydra it cannot run (../shared/baselines/run.sh tried): its PMIx client
// reaches the launching daemon over 127.0.0.1, and the ranks of host 1 sit
// behind another loopback. With a daemon per namespace every rank has a
// local one, the daemons talk over the veth, and Open MPI sees two nodes:
// shared memory (vader) inside each, TCP on the veth between them. Gloo
// has no launcher that reaches into a namespace and is left out with a
// message.
type hostsNet struct {
	ns    [2]string
	addrs [2]string
	port  int
	dir   string // Open MPI's rsh agent and hostfiles
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
	if err := h.writeAgent(); err != nil {
		h.down()
		return nil, err
	}
	return h, nil
}

func (h *hostsNet) down() {
	for _, n := range h.ns {
		exec.Command("ip", "netns", "del", n).Run()
	}
	if h.dir != "" {
		os.RemoveAll(h.dir)
	}
}

// writeAgent writes the rsh agent Open MPI's launcher starts its remote
// daemon with: "agent HOST COMMAND..." runs COMMAND in the namespace that
// owns the address HOST, which is what the hostfile names, under a UTS
// namespace of its own whose host name is the namespace's. Launcher and
// daemon each get a host name of their own, as on two machines: vader names
// its shared-memory segments by host name, job and local rank, so under one
// name the first rank of each host opened the same segment, and ranks
// crashed in vader's receive path.
func (h *hostsNet) writeAgent() error {
	dir, err := os.MkdirTemp("", "compare-hosts-")
	if err != nil {
		return err
	}
	h.dir = dir
	script := "#!/bin/sh\n# Open MPI's rsh agent for bench/compare's hosts transport.\nhost=$1; shift\ncase $host in\n"
	for i, n := range h.ns {
		script += fmt.Sprintf("%s) ns=%s ;;\n", h.addrs[i], n)
	}
	script += "*) echo \"rsh agent: no namespace owns $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec $ns unshare --uts /bin/sh -c \"hostname $ns && $*\"\n"
	return os.WriteFile(filepath.Join(dir, "agent"), []byte(script), 0o755)
}

// ompiArgv returns the command line that runs inner under Open MPI with
// np/2 ranks on each host. Binding is off: each namespace's daemon thinks
// the whole machine is its own and binds its first rank to core 0, so the
// two hosts' first ranks shared one core and an 8-byte all-reduce took 4 ms
// (the other ranks' runs are not bound either). Where the two hosts' ranks
// outnumber the machine's cores, waiting ranks yield (mpi_yield_when_idle),
// as Open MPI does by itself when it knows a node is oversubscribed (the
// shm and tcp runs' --oversubscribe): each daemon sees only its own
// namespace's ranks, and four ranks polling on two cores took 4.4 ms for an
// 8-byte all-reduce, against 64 µs yielding. Open MPI's hierarchical
// collectives (coll/han) are not asked for: in 4.1.4 its barrier crashed in
// ob1's receive path on this setting.
func (h *hostsNet) ompiArgv(np int, inner []string) ([]string, error) {
	hostfile := filepath.Join(h.dir, fmt.Sprintf("hostfile%d", np))
	var hf string
	for _, a := range h.addrs {
		hf += fmt.Sprintf("%s slots=%d\n", a, np/2)
	}
	if err := os.WriteFile(hostfile, []byte(hf), 0o644); err != nil {
		return nil, err
	}
	argv := []string{"ip", "netns", "exec", h.ns[0], "unshare", "--uts", "/bin/sh", "-c", `hostname "$0" && exec "$@"`, h.ns[0],
		"mpirun.openmpi", "--allow-run-as-root", "-np", strconv.Itoa(np),
		"--hostfile", hostfile, "--map-by", fmt.Sprintf("ppr:%d:node", np/2), "--bind-to", "none",
		"--mca", "plm_rsh_agent", filepath.Join(h.dir, "agent"), "--mca", "oob_tcp_if_include", hostsDev,
		"--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", hostsDev}
	if np > runtime.NumCPU() {
		argv = append(argv, "--mca", "mpi_yield_when_idle", "1")
	}
	return append(argv, inner...), nil
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
