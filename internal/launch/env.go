package launch

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Env is what the process environment says about this rank's job.
type Env struct {
	Rank, Size int
	// LocalRank is the rank among the processes on this host, -1 if no
	// launcher said.
	LocalRank int
	// LocalSize is the number of the job's processes on this host, -1 if
	// unknown.
	LocalSize int
	// ID is GOCCL_ID verbatim (an opaque unique-id string), "" if unset.
	ID string
	// Root is the "host:port" of the rendezvous root: GOCCL_ROOT, else
	// MASTER_ADDR:MASTER_PORT (IPv6 hosts bracketed). GOCCL_ROOT=":port"
	// takes its host from MASTER_ADDR. Root is "" only when ID is set and
	// no root variable is.
	Root string
	// Secret is GOCCL_SECRET verbatim (32 hex digits), "" if unset.
	Secret string
	// Source names whose variables gave Rank and Size: "goccl",
	// "torchrun", "openmpi", "mpich" or "slurm".
	Source string
}

// ErrNoLauncher is wrapped by FromEnv's error when no set of rank and size
// variables is present at all.
var ErrNoLauncher = errors.New("goccl: no launcher variables found")

// Variable names read by FromEnv and set by Run.
const (
	VarID        = "GOCCL_ID"
	VarRoot      = "GOCCL_ROOT"
	VarSecret    = "GOCCL_SECRET"
	VarRank      = "GOCCL_RANK"
	VarWorldSize = "GOCCL_WORLD_SIZE"
	VarLocalRank = "GOCCL_LOCAL_RANK"
	VarLocalSize = "GOCCL_LOCAL_SIZE"

	varMasterAddr = "MASTER_ADDR"
	varMasterPort = "MASTER_PORT"
)

// SecretHexDigits is the length of a GOCCL_SECRET: 128 bits in hex.
const SecretHexDigits = 32

// varSet is one launcher's rank and size variables.
type varSet struct {
	source string // Env.Source
	label  string // for people, in error messages
	rank   string
	size   string
	local  string // local rank
	lsize  string // local size; "" when it needs special parsing (Slurm)
}

// launchers lists the sets in order of precedence; the first one whose rank
// or size variable is present decides.
var launchers = []varSet{
	{"goccl", "goccl", VarRank, VarWorldSize, VarLocalRank, VarLocalSize},
	{"torchrun", "torchrun/Kubeflow", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"openmpi", "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
	{"mpich", "MPICH/Hydra/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
	{"slurm", "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""},
}

// FromEnv reads the rank, size, local rank and size, rendezvous root and
// secret that a launcher (goccl-run, torchrun, Kubeflow, Open MPI's mpirun,
// MPICH/Hydra/Intel MPI, Slurm's srun) left in the environment; lookup is
// os.LookupEnv or a fake. See docs/launchers.md for the variables and
// their precedence.
//
// A variable that is set counts as present even when its value is empty
// (an empty value is then reported as invalid), so that a typo or a failed
// `$(...)` never silently falls back to another launcher or to no secret.
//
// On failure FromEnv returns the zero Env and an error sentence naming the
// variables it found (with their values, never the secret's or the ID's)
// and the ones that were missing or invalid. When no launcher's variables
// are present at all the error wraps ErrNoLauncher. FromEnv has no side
// effects and is safe for concurrent use if lookup is.
func FromEnv(lookup func(string) (string, bool)) (Env, error) {
	e := Env{LocalRank: -1, LocalSize: -1}
	id, hasID := lookup(VarID)
	if hasID && id == "" {
		return Env{}, fmt.Errorf("goccl: %s is set but empty; expected the string from NewUniqueID on rank 0, or unset it and set %s=host:port", VarID, VarRoot)
	}
	e.ID = id

	set, found, err := rankSize(lookup, &e)
	if err != nil {
		return Env{}, err
	}
	e.Source = set.source
	where := fmt.Sprintf("found %s (%s)", strings.Join(found, ", "), set.label)

	root, err := rootAddr(lookup, hasID, where)
	if err != nil {
		return Env{}, err
	}
	e.Root = root

	if s, ok := lookup(VarSecret); ok {
		if err := checkSecret(s); err != nil {
			return Env{}, err
		}
		e.Secret = s
	}
	return e, nil
}

// rankSize fills e's rank fields from the first launcher set present and
// returns that set and its variables as "NAME=value".
func rankSize(lookup func(string) (string, bool), e *Env) (varSet, []string, error) {
	for _, s := range launchers {
		rv, hasR := lookup(s.rank)
		sv, hasS := lookup(s.size)
		if !hasR && !hasS {
			continue
		}
		var found []string
		if hasR {
			found = append(found, s.rank+"="+rv)
		}
		if hasS {
			found = append(found, s.size+"="+sv)
		}
		if !hasR || !hasS {
			present, missing := s.rank, s.size
			if !hasR {
				present, missing = s.size, s.rank
			}
			return s, nil, fmt.Errorf("goccl: found %s (%s); missing %s: a launcher sets rank and size together, so set both or unset %s",
				found[0], s.label, missing, present)
		}
		lv, hasL := lookup(s.local)
		if hasL {
			found = append(found, s.local+"="+lv)
		}
		var lsv, lsName string
		var hasLS bool
		if s.lsize != "" {
			lsName = s.lsize
			lsv, hasLS = lookup(s.lsize)
			if hasLS {
				found = append(found, s.lsize+"="+lsv)
			}
		}
		where := fmt.Sprintf("found %s (%s)", strings.Join(found, ", "), s.label)

		size, err := parseCount(s.size, sv, 1, where, "a world size of at least 1")
		if err != nil {
			return s, nil, err
		}
		rank, err := parseCount(s.rank, rv, 0, where, fmt.Sprintf("a rank in 0..%d", size-1))
		if err != nil {
			return s, nil, err
		}
		if rank >= size {
			return s, nil, fmt.Errorf("goccl: %s; %s=%d is not less than %s=%d: expected a rank in 0..%d",
				where, s.rank, rank, s.size, size, size-1)
		}
		e.Rank, e.Size = rank, size

		if hasLS {
			ls, err := parseCount(lsName, lsv, 1, where, "a local size of at least 1")
			if err != nil {
				return s, nil, err
			}
			e.LocalSize = ls
		} else if s.source == "slurm" {
			e.LocalSize, lsName = slurmLocalSize(lookup)
		}
		if hasL {
			lr, err := parseCount(s.local, lv, 0, where, "a local rank of at least 0")
			if err != nil {
				return s, nil, err
			}
			if e.LocalSize >= 0 && lr >= e.LocalSize {
				return s, nil, fmt.Errorf("goccl: %s; %s=%d is not less than the local size %s=%d: expected a local rank in 0..%d",
					where, s.local, lr, lsName, e.LocalSize, e.LocalSize-1)
			}
			e.LocalRank = lr
		}
		return s, found[:2], nil
	}
	return varSet{}, nil, noLauncherError(e.ID != "")
}

// parseCount parses a decimal integer variable that must be at least min.
func parseCount(name, v string, min int, where, expected string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("goccl: %s; %s=%q is not an integer: expected %s", where, name, v, expected)
	}
	if n < 0 {
		return 0, fmt.Errorf("goccl: %s; %s=%d is negative: expected %s", where, name, n, expected)
	}
	if n < min {
		return 0, fmt.Errorf("goccl: %s; %s=%d is too small: expected %s", where, name, n, expected)
	}
	return n, nil
}

// slurmLocalSize returns the number of tasks of this job step on this node,
// or -1 when Slurm's variables do not say, and the variable it came from.
// SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE list per-node counts
// in node order, compressed as "2(x3),1"; SLURM_NODEID indexes them.
// SLURM_NTASKS_PER_NODE is the requested --ntasks-per-node. Values Slurm
// wrote in a form this does not understand give -1, not an error: the local
// size is advisory.
func slurmLocalSize(lookup func(string) (string, bool)) (int, string) {
	nodeID := -1
	if v, ok := lookup("SLURM_NODEID"); ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			nodeID = n
		}
	}
	for _, name := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"} {
		v, ok := lookup(name)
		if !ok {
			continue
		}
		if n := tasksOnNode(v, nodeID); n > 0 {
			return n, name
		}
	}
	if v, ok := lookup("SLURM_NTASKS_PER_NODE"); ok {
		if n := leadingInt(v); n > 0 {
			return n, "SLURM_NTASKS_PER_NODE"
		}
	}
	return -1, ""
}

// tasksOnNode reads Slurm's compressed per-node task counts ("4(x2),3") and
// returns node's count; with node -1 it answers only when every node has
// the same count. It returns -1 when v does not parse or node is past the
// end.
func tasksOnNode(v string, node int) int {
	first, idx := -1, 0
	for _, part := range strings.Split(v, ",") {
		count, reps := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			count, reps = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || c < 1 || r < 1 {
			return -1
		}
		if node >= 0 && node < idx+r {
			return c
		}
		if first == -1 {
			first = c
		} else if c != first {
			first = -2 // counts differ: unknown without SLURM_NODEID
		}
		idx += r
	}
	if node >= 0 || first < 0 {
		return -1
	}
	return first
}

// leadingInt parses the decimal number at the start of v, or returns -1.
func leadingInt(v string) int {
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(v[:i])
	if err != nil {
		return -1
	}
	return n
}

// noLauncherError lists what FromEnv looked for, in order.
func noLauncherError(hasID bool) error {
	var looked []string
	for _, s := range launchers {
		looked = append(looked, fmt.Sprintf("%s and %s (%s)", s.rank, s.size, s.label))
	}
	note := ""
	if hasID {
		note = fmt.Sprintf("; %s is set, but it carries only the root address and secret, so rank and size must still come from one of these", VarID)
	}
	return fmt.Errorf("%w; looked for %s%s. Run under a launcher (goccl-run, torchrun, mpirun, srun), or set %s, %s and %s=host:port yourself",
		ErrNoLauncher, strings.Join(looked, ", "), note, VarRank, VarWorldSize, VarRoot)
}

// rootAddr returns the rendezvous root from GOCCL_ROOT or MASTER_ADDR and
// MASTER_PORT. Without any of them it is an error unless hasID. Values that
// are set are checked even when hasID.
func rootAddr(lookup func(string) (string, bool), hasID bool, where string) (string, error) {
	if v, ok := lookup(VarRoot); ok {
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			return "", fmt.Errorf("goccl: %s; %s=%q is not host:port (%v): expected e.g. node1:29500 or [fd00::1]:29500", where, VarRoot, v, err)
		}
		p, err := parsePort(port)
		if err != nil {
			return "", fmt.Errorf("goccl: %s; %s=%q: %v", where, VarRoot, v, err)
		}
		if host == "" {
			// ":port": rank 0's host from MASTER_ADDR, a port of goccl's
			// own. torchrun's agent listens on MASTER_PORT itself.
			addr, ok := lookup(varMasterAddr)
			if !ok {
				return "", fmt.Errorf("goccl: %s; %s=%q has no host and %s is not set: expected the address other ranks reach rank 0 at, e.g. node1:29500",
					where, VarRoot, v, varMasterAddr)
			}
			host, err = masterHost(addr, where)
			if err != nil {
				return "", err
			}
		}
		return net.JoinHostPort(host, strconv.Itoa(p)), nil
	}
	addr, hasAddr := lookup(varMasterAddr)
	port, hasPort := lookup(varMasterPort)
	switch {
	case !hasAddr && !hasPort:
		if hasID {
			return "", nil
		}
		return "", fmt.Errorf("goccl: %s; missing the rendezvous address: set %s=host:port (rank 0 listens there), or %s and %s, or %s (a unique ID made on one rank)",
			where, VarRoot, varMasterAddr, varMasterPort, VarID)
	case !hasPort:
		return "", fmt.Errorf("goccl: %s and %s=%s; missing %s: set it to the port rank 0 listens on (1..65535), or set %s=host:port",
			where, varMasterAddr, addr, varMasterPort, VarRoot)
	case !hasAddr:
		return "", fmt.Errorf("goccl: %s and %s=%s; missing %s: set it to rank 0's host name or address, or set %s=host:port",
			where, varMasterPort, port, varMasterAddr, VarRoot)
	}
	p, err := parsePort(port)
	if err != nil {
		return "", fmt.Errorf("goccl: %s; %s=%q: %v", where, varMasterPort, port, err)
	}
	host, err := masterHost(addr, where)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// masterHost checks MASTER_ADDR and returns it without IPv6 brackets.
func masterHost(addr, where string) (string, error) {
	host := strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
	if host == "" || strings.ContainsAny(host, " \t\n/") {
		return "", fmt.Errorf("goccl: %s; %s=%q is not a host name or IP address: expected rank 0's host, e.g. node1 or 10.0.0.1", where, varMasterAddr, addr)
	}
	if strings.Contains(host, ":") {
		if _, err := netip.ParseAddr(host); err != nil {
			return "", fmt.Errorf("goccl: %s; %s=%q is not a host name or IP address: expected a host without a port (the port goes in %s)", where, varMasterAddr, addr, varMasterPort)
		}
	}
	return host, nil
}

// parsePort parses a TCP port number for a listener others connect to.
func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("port %q is not a number: expected 1..65535", s)
	}
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %d is out of range: expected 1..65535", p)
	}
	return p, nil
}

// checkSecret checks a GOCCL_SECRET without ever echoing it.
func checkSecret(s string) error {
	bad := len(s) != SecretHexDigits
	for i := 0; !bad && i < len(s); i++ {
		c := s[i]
		bad = !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F')
	}
	if !bad {
		return nil
	}
	what := fmt.Sprintf("has %d characters", len(s))
	if len(s) == SecretHexDigits {
		what = "has a character that is not a hex digit"
	}
	if s == "" {
		what = "is empty"
	}
	return fmt.Errorf("goccl: %s %s: expected %d hex digits (128 bits), the same on every rank; make one with `openssl rand -hex 16`, or unset it to run without authentication",
		VarSecret, what, SecretHexDigits)
}
