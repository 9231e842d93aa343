//go:build unix

package collective_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/handshake"
	"github.com/goccl/goccl/internal/launch"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/internal/wire"
	"github.com/goccl/goccl/transport/shm"
	"github.com/goccl/goccl/transport/tcp"
)

// The multi-process tests start this test binary again as each rank, with
// childEnv naming what the rank does (see childMain) and the launcher's
// variables telling it where it stands.
const childEnv = "GOCCL_TEST_CHILD"

// procTimeout bounds a multi-process test; ranks that hang fail it.
const procTimeout = 90 * time.Second

type procResult struct {
	rank   int
	code   int
	output string
	took   time.Duration
}

// spawn starts one process per env (each a rank's extra environment) and
// waits for all of them. Processes are independent: one's death does not
// stop the others, so tests can watch how the survivors react.
func spawn(t *testing.T, scenario string, envs [][]string, wrap func(rank int) []string) []procResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), procTimeout)
	defer cancel()
	res := make([]procResult, len(envs))
	var wg sync.WaitGroup
	for r, env := range envs {
		args := []string{os.Args[0], "-test.run=^$"}
		if wrap != nil {
			args = append(wrap(r), args...)
		}
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(cleanEnv(), append([]string{childEnv + "=" + scenario, "GORACE=atexit_sleep_ms=0"}, env...)...)
		if testing.Short() {
			cmd.Env = append(cmd.Env, "GOCCL_TEST_SHORT=1")
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		require.NoError(t, cmd.Start())
		wg.Go(func() {
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				code = -1
			}
			res[r] = procResult{rank: r, code: code, output: out.String(), took: time.Since(start)}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("ranks still running after %v: %+v", procTimeout, res)
	}
	return res
}

// cleanEnv is this process's environment without any launcher's variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GOCCL_") || strings.HasPrefix(k, "OMPI_") || strings.HasPrefix(k, "PMI_") ||
			strings.HasPrefix(k, "SLURM_") || k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" ||
			k == "MASTER_ADDR" || k == "MASTER_PORT" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// freePort is launch.FreePort: below the kernel's own port range, so that
// no connection of a test running beside takes it before the root listens.
func freePort(t *testing.T) int {
	port, err := launch.FreePort()
	require.NoError(t, err)
	return port
}

func secret() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return fmt.Sprintf("%x", b)
}

// gocclEnvs is goccl-run's environment for n ranks on loopback.
func gocclEnvs(t *testing.T, n int, extra ...string) [][]string {
	port, sec := freePort(t), secret()
	envs := make([][]string, n)
	for r := range envs {
		envs[r] = append([]string{
			"GOCCL_RANK=" + strconv.Itoa(r), "GOCCL_WORLD_SIZE=" + strconv.Itoa(n),
			"GOCCL_ROOT=127.0.0.1:" + strconv.Itoa(port), "GOCCL_SECRET=" + sec, "GOCCL_INIT_TIMEOUT=60s",
		}, extra...)
	}
	return envs
}

func requireAllOK(t *testing.T, res []procResult) {
	t.Helper()
	for _, r := range res {
		if r.code != 0 {
			t.Fatalf("rank %d exited %d:\n%s", r.rank, r.code, r.output)
		}
	}
}

func TestMultiProcessEveryCollective(t *testing.T) {
	trs := allTransports()
	if slices.Contains(trs, "shm") {
		// Broadcasts and all-gathers landed by the receiver's single copy
		// out of the sender's memory, whatever this host's kernel copy
		// costs (auto leaves it off where it does not pay).
		trs = append(trs, "shm+cma")
		// Ranks whose settings differ: rank 0 asks for blocks by
		// reference at every size and cuts its own into 256 KiB ones, the
		// others measure which way pays (auto) and start on the slots. On
		// 2 ranks the sender cuts a broadcast's, all-gather's, reduce's or
		// reduce-scatter's step and the receiver follows what arrives, so
		// an all-gather goes one way in blocks and the other through
		// slots, and every result must still be right.
		trs = append(trs, "shm+mixed")
	}
	// Recursive doubling forced: the all-reduce's and the all-gather's
	// (with the fold on 3 ranks), whatever the tuner would pick.
	trs = append(trs, "tcp+recdoubling")
	// One-shot forced: the reduce's (every rank straight to the root),
	// which the tuner picks over TCP for small messages only, at every
	// size here; and the all-reduce's, reduce-scatter's and all-gather's.
	trs = append(trs, "tcp+oneshot")
	// Every large slice sent from the caller's buffers lent (vmsplice)
	// in every collective, by every rank but the last, whose receives
	// still credit what was lent and whose sends copy.
	trs = append(trs, "tcp+lend")
	for _, tr := range trs {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("transport=%s/nranks=%d", tr, n), func(t *testing.T) {
				tr, name := tr, tr
				env := transportEnv(t, tr)
				switch tr {
				case "shm+cma":
					tr, env = "shm", append(transportEnv(t, "shm"), "GOCCL_SHM_CMA=on")
				case "shm+mixed":
					tr, env = "shm", transportEnv(t, "shm")
				case "tcp+recdoubling":
					tr, env = "tcp", append(transportEnv(t, "tcp"), "GOCCL_ALGO=recdoubling")
				case "tcp+oneshot":
					tr, env = "tcp", append(transportEnv(t, "tcp"), "GOCCL_ALGO=oneshot")
				case "tcp+lend":
					tr, env = "tcp", append(transportEnv(t, "tcp"), "GOCCL_TCP_LEND=on")
				}
				envs := gocclEnvs(t, n, env...)
				if name == "tcp+lend" {
					envs[n-1] = append(envs[n-1], "GOCCL_TCP_LEND=off") // the later setting wins
				}
				if name == "shm+mixed" {
					envs[0] = append(envs[0], "GOCCL_SHM_CMA=on", "GOCCL_SHM_BLOCK=256K")
				}
				res := spawn(t, "collectives", envs, nil)
				requireAllOK(t, res)
				if n == 2 && (name == "shm+cma" || name == "shm+mixed") {
					// Forced on, both ranks landed blocks; mixed, rank 0
					// (rank 1 measures, and these few operations of each
					// size end before its first comparison asks for them).
					for _, r := range res {
						if r.rank == 0 || name == "shm+cma" {
							require.Regexp(t, fmt.Sprintf(`rank %d blocks [1-9]`, r.rank), r.output)
						}
					}
				}
				for q := 1; q < n; q++ {
					require.Contains(t, res[0].output, fmt.Sprintf("rank %d transport %s ", q, tr))
				}
			})
		}
	}
}

// A root that rewrites its buffer as soon as each broadcast returns
// sends what it had when it called, over TCP where its pages are lent
// (GOCCL_TCP_LEND's default, auto, lends in 2-rank broadcasts) and where
// they are copied; on 3 ranks auto copies at this size, and on forces
// lending through the chain.
func TestMultiProcessRootReusesItsBuffer(t *testing.T) {
	for _, c := range []struct {
		n        int
		lend     string
		wantLent bool
	}{{2, "auto", runtime.GOOS == "linux"}, {2, "off", false}, {3, "on", runtime.GOOS == "linux"}} {
		t.Run(fmt.Sprintf("nranks=%d/lend=%s", c.n, c.lend), func(t *testing.T) {
			res := spawn(t, "reuse", gocclEnvs(t, c.n, append(transportEnv(t, "tcp"), "GOCCL_TCP_LEND="+c.lend)...), nil)
			requireAllOK(t, res)
			if c.wantLent {
				require.Regexp(t, `rank 0 lent [1-9]`, res[0].output)
			} else {
				require.Contains(t, res[0].output, "rank 0 lent 0")
			}
		})
	}
}

// Buffers from MemAlloc, or Go buffers registered in place: over shared
// memory, the receivers of all-gathers (and of broadcasts on 3 ranks or
// more) copy the slices straight out of the senders' buffers (with the kernel's copy off, that
// is the only way a slice goes by reference), and every result is right.
func TestMultiProcessSharedAllocations(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared allocations (memfd) and the shared-memory transport need Linux")
	}
	for _, c := range []struct {
		n   int
		pin string // "": unbound; "one": every rank bound to CPU 0; "own": rank r to CPU r (taskset)
		// reg: Go buffers registered in place (Register), not MemAlloc's.
		reg bool
	}{{2, "", false}, {3, "", false}, {2, "one", false}, {2, "own", false}, {2, "", true}, {3, "", true}} {
		name := fmt.Sprintf("nranks=%d/pin=%q", c.n, c.pin)
		if c.reg {
			name += "/registered"
		}
		t.Run(name, func(t *testing.T) {
			var wrap func(int) []string
			cpus := runtime.NumCPU()
			if c.pin != "" {
				if _, err := exec.LookPath("taskset"); err != nil {
					t.Skip("no taskset (util-linux) to bind the ranks to CPUs")
				}
				var allowed []string // the CPUs this process may run on
				for i, b := range collective.CPUMask() {
					for j := range 8 {
						if b&(1<<j) != 0 {
							allowed = append(allowed, strconv.Itoa(8*i+j))
						}
					}
				}
				if c.pin == "own" && len(allowed) < c.n {
					t.Skipf("%d CPUs: too few to bind %d ranks to one each", len(allowed), c.n)
				}
				require.NotEmpty(t, allowed)
				wrap = func(int) []string { return []string{"taskset", "-c", allowed[0]} }
				cpus = 1
				if c.pin == "own" {
					// Bound to cores of their own, the ranks do not share
					// them, though each can use only one (summarize).
					wrap = func(r int) []string { return []string{"taskset", "-c", allowed[r]} }
					cpus = c.n
				}
			}
			env := []string{"GOCCL_TRANSPORT=shm", "GOCCL_SHM_CMA=off"}
			if c.reg {
				env = append(env, "GOCCL_TEST_REGISTER=1")
			}
			res := spawn(t, "shared", gocclEnvs(t, c.n, env...), wrap)
			requireAllOK(t, res)
			count := func(r procResult, what string) int {
				i := strings.LastIndex(r.output, what)
				require.GreaterOrEqual(t, i, 0, "rank %d printed no %q: %s", r.rank, what, r.output)
				var got int
				_, err := fmt.Sscanf(r.output[i+len(what):], " %d", &got)
				require.NoError(t, err, "rank %d: %s", r.rank, r.output)
				return got
			}
			for _, r := range res {
				require.Positive(t, count(r, "rank "+strconv.Itoa(r.rank)+" shared slices"), "rank %d copied nothing out of its peers' buffers", r.rank)
				// Above shm.DefaultSharedMax, by reference only where the
				// ranks outnumber their CPUs.
				got := count(r, "by reference above 4 MiB")
				if c.n > cpus {
					require.Positive(t, got, "rank %d, %d ranks on %d CPUs: an all-gather of %d MiB went through slots", r.rank, c.n, cpus, 4*c.n)
				} else {
					require.Zero(t, got, "rank %d, %d ranks on %d CPUs: an all-gather of %d MiB went by reference", r.rank, c.n, cpus, 4*c.n)
				}
			}
		})
	}
}

// transports lists the transports between processes on this machine
// that carry device operations.
func transports() []string {
	if runtime.GOOS == "linux" {
		return []string{"shm", "tcp"}
	}
	return []string{"tcp"}
}

// allTransports adds RDMA verbs, over the emulated test device (there is
// no RDMA hardware here).
func allTransports() []string {
	if runtime.GOOS == "linux" {
		return append(transports(), "verbs")
	}
	return transports()
}

// transportEnv forces transport tr: for verbs, on an emulated fabric of
// the test's own.
func transportEnv(t *testing.T, tr string) []string {
	env := []string{"GOCCL_TRANSPORT=" + tr}
	if tr == "verbs" {
		env = append(env, "GOCCL_IB_EMULATE=1", "GOCCL_IB_EMULATE_DIR="+t.TempDir())
	}
	return env
}

func TestMultiProcessDefaultTransport(t *testing.T) {
	// Without GOCCL_TRANSPORT, ranks on one host share memory; with their
	// own host identities they use TCP; forcing shared memory between
	// "hosts" is refused with a reason.
	want := "tcp"
	if runtime.GOOS == "linux" {
		want = "shm"
	}
	res := spawn(t, "transports", gocclEnvs(t, 2), nil)
	requireAllOK(t, res)
	require.Contains(t, res[0].output, "rank 1 transport "+want+" ")
	envs := gocclEnvs(t, 2)
	for r := range envs {
		envs[r] = append(envs[r], fmt.Sprintf("GOCCL_HOSTID=box%d", r))
	}
	res = spawn(t, "transports", envs, nil)
	requireAllOK(t, res)
	require.Contains(t, res[0].output, "rank 1 transport tcp ")
	envs = gocclEnvs(t, 2, "GOCCL_TRANSPORT=shm")
	for r := range envs {
		envs[r] = append(envs[r], fmt.Sprintf("GOCCL_HOSTID=box%d", r))
	}
	res = spawn(t, "transports", envs, nil)
	for _, r := range res {
		require.NotEqual(t, 0, r.code, "rank %d", r.rank)
		require.Contains(t, r.output, `GOCCL_TRANSPORT=shm, but rank`)
		require.Contains(t, r.output, `is on host "box0", rank 1 on "box1"`)
	}
}

// launcherSets are the variables each launcher gives rank r of a job of
// two whose root is on port, without a secret.
func launcherSets(port string) map[string]func(r int) []string {
	return map[string]func(r int) []string{
		"torchrun": func(r int) []string {
			return []string{"RANK=" + strconv.Itoa(r), "WORLD_SIZE=2", "LOCAL_RANK=" + strconv.Itoa(r), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
		},
		"openmpi": func(r int) []string {
			return []string{"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=" + strconv.Itoa(r), "GOCCL_ROOT=127.0.0.1:" + port}
		},
		"mpich": func(r int) []string {
			return []string{"PMI_RANK=" + strconv.Itoa(r), "PMI_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
		},
		"slurm": func(r int) []string {
			return []string{"SLURM_PROCID=" + strconv.Itoa(r), "SLURM_NTASKS=2", "SLURM_LOCALID=" + strconv.Itoa(r), "GOCCL_ROOT=127.0.0.1:" + port}
		},
		"goccl": func(r int) []string {
			return []string{"GOCCL_RANK=" + strconv.Itoa(r), "GOCCL_WORLD_SIZE=2", "GOCCL_ROOT=127.0.0.1:" + port}
		},
	}
}

func TestMultiProcessLaunchers(t *testing.T) {
	const n = 2
	for name, set := range launcherSets(strconv.Itoa(freePort(t))) {
		t.Run(name, func(t *testing.T) {
			envs := make([][]string, n)
			for r := range envs {
				envs[r] = append(set(r), "GOCCL_INIT_TIMEOUT=60s", "GOCCL_SECRET=0123456789abcdef0123456789abcdef")
			}
			res := spawn(t, "smoke", envs, nil)
			requireAllOK(t, res)
			for _, r := range res {
				require.Contains(t, r.output, "ok", "rank %d", r.rank)
			}
		})
	}
}

// Without GOCCL_SECRET every launcher's ranks refuse to start, saying how
// to set one, and no root listens meanwhile; GOCCL_INSECURE=1 runs them
// unauthenticated, with a warning that says so.
func TestMultiProcessLaunchersNeedASecret(t *testing.T) {
	const n = 2
	for name, set := range launcherSets(strconv.Itoa(freePort(t))) {
		t.Run(name, func(t *testing.T) {
			envs := make([][]string, n)
			for r := range envs {
				envs[r] = append(set(r), "GOCCL_INIT_TIMEOUT=10s")
			}
			start := time.Now()
			res := spawn(t, "smoke", envs, nil)
			require.Less(t, time.Since(start), 8*time.Second, "refused at once, not after a timeout")
			for _, r := range res {
				require.NotEqual(t, 0, r.code, "rank %d started without a secret", r.rank)
				require.Contains(t, r.output, "GOCCL_SECRET is not set", "rank %d", r.rank)
				require.Contains(t, r.output, "export GOCCL_SECRET=$(openssl rand -hex 16)", "rank %d", r.rank)
				require.Contains(t, r.output, "GOCCL_INSECURE=1", "rank %d", r.rank)
			}
			for r := range envs {
				envs[r] = append(envs[r], "GOCCL_INSECURE=1")
			}
			res = spawn(t, "smoke", envs, nil)
			requireAllOK(t, res)
			for _, r := range res {
				require.Contains(t, r.output, "connections are not authenticated", "rank %d", r.rank)
			}
		})
	}
}

func TestMultiProcessUniqueID(t *testing.T) {
	// A parent-made ID (NewUniqueID's root lives here) handed to two
	// processes through GOCCL_ID.
	id, err := collective.NewUniqueID(collective.WithEnv(nil), collective.WithInitTimeout(60*time.Second))
	require.NoError(t, err)
	envs := [][]string{
		{"GOCCL_ID=" + id.String(), "GOCCL_RANK=0", "GOCCL_WORLD_SIZE=2"},
		{"GOCCL_ID=" + id.String(), "GOCCL_RANK=1", "GOCCL_WORLD_SIZE=2"},
	}
	requireAllOK(t, spawn(t, "smoke", envs, nil))
}

func TestMultiProcessKilledRank(t *testing.T) {
	cases := []struct{ transport, count string }{{"tcp", "2097152"}}
	if runtime.GOOS == "linux" {
		// 8 bytes run on the shared board (transport/shm's JoinBoard).
		cases = append(cases, struct{ transport, count string }{"shm", "2097152"}, struct{ transport, count string }{"shm", "2"},
			struct{ transport, count string }{"verbs", "2097152"})
	}
	for _, tc := range cases {
		t.Run("transport="+tc.transport+"/count="+tc.count, func(t *testing.T) {
			const n, victim = 4, 2
			start := time.Now()
			res := spawn(t, "kill", gocclEnvs(t, n, append(transportEnv(t, tc.transport), "GOCCL_TEST_VICTIM="+strconv.Itoa(victim), "GOCCL_TIMEOUT=10m", "GOCCL_TEST_COUNT="+tc.count)...), nil)
			took := time.Since(start)
			for _, r := range res {
				if r.rank == victim {
					require.NotEqual(t, 0, r.code, "the victim dies")
					continue
				}
				require.Equal(t, 0, r.code, "rank %d must report the dead rank and exit cleanly:\n%s", r.rank, r.output)
				require.Contains(t, r.output, "segments still mapped after Close: 0")
				t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.output))
			}
			require.Less(t, took, 60*time.Second, "well before the 10-minute operation timeout")
		})
	}
}

// TestMultiProcessShrink kills 1 of 4 ranks in the middle of a training
// loop; the other 3 shrink the communicator and finish the loop with
// exact sums.
func TestMultiProcessShrink(t *testing.T) {
	for _, tr := range allTransports() {
		t.Run("transport="+tr, func(t *testing.T) {
			const n, victim = 4, 2
			res := spawn(t, "shrink", gocclEnvs(t, n, append(transportEnv(t, tr), "GOCCL_TEST_VICTIM="+strconv.Itoa(victim))...), nil)
			for _, r := range res {
				if r.rank == victim {
					require.NotEqual(t, 0, r.code)
					continue
				}
				require.Equal(t, 0, r.code, "rank %d:\n%s", r.rank, r.output)
				require.Contains(t, r.output, "finished 20 steps with 3 ranks", "rank %d", r.rank)
				t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.output))
			}
		})
	}
}

// TestMultiProcessIdleRankDeath: a rank dies while every rank is idle;
// the others learn it through the bootstrap root's watch within 3 s.
func TestMultiProcessIdleRankDeath(t *testing.T) {
	const n, victim = 4, 3 // not rank 0, which hosts the root
	res := spawn(t, "idlekill", gocclEnvs(t, n, "GOCCL_TEST_VICTIM="+strconv.Itoa(victim)), nil)
	for _, r := range res {
		if r.rank == victim {
			require.NotEqual(t, 0, r.code)
			continue
		}
		require.Equal(t, 0, r.code, "rank %d:\n%s\nall: %+v", r.rank, r.output, res)
		rest, ok := strings.CutPrefix(strings.TrimSpace(r.output), "learned after ")
		require.True(t, ok, r.output)
		tok, _, _ := strings.Cut(rest, ":")
		d, err := time.ParseDuration(tok)
		require.NoError(t, err, r.output)
		t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.output))
		require.Greater(t, d, 100*time.Millisecond, "the victim sleeps 200 ms before it dies")
		require.Less(t, d, 3*time.Second, "rank %d", r.rank)
	}
}

func TestMultiProcessMissingRank(t *testing.T) {
	envs := gocclEnvs(t, 3)
	for r := range envs {
		envs[r] = append(envs[r], "GOCCL_INIT_TIMEOUT=3s")
	}
	res := spawn(t, "missing", envs[:2], nil) // rank 2 never starts
	requireAllOK(t, res)
	for _, r := range res {
		require.Contains(t, r.output, "ranks 2 of 3 never registered", "rank %d", r.rank)
	}
}

// TestMultiProcessStrangers throws wrong secrets, garbage, truncated and
// replayed handshakes at the root while the ranks start, and (from rank 0,
// see childMain) at every rank's data port while collectives run; the job
// must still finish with exact results.
func TestMultiProcessStrangers(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		want string
	}{
		{"plain", false, "attacking 3 TCP and 3 shared-memory listeners"},
		// Over RDMA the data ports are the verbs transport's control
		// listeners, where the queue pairs are exchanged.
		{"verbs", false, "attacking 3 TCP and 0 shared-memory listeners"},
		// With TLS the data listeners are TCP only, and the root and
		// every data port expect a TLS handshake.
		{"tls", true, "attacking 3 TCP and 0 shared-memory listeners"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envs := gocclEnvs(t, 3)
			if tc.name == "verbs" {
				envs = gocclEnvs(t, 3, transportEnv(t, "verbs")...)
			}
			if tc.tls {
				for r := range envs {
					envs[r] = append(envs[r], "GOCCL_TRANSPORT=tcp")
				}
				tlsEnvs(t, envs, tlstest.NewCA(t, "job"))
			}
			root := strings.TrimPrefix(envs[0][2], "GOCCL_ROOT=")
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < 3; i++ {
				keepAttacking(&wg, stop, root, i)
			}
			res := spawn(t, "strangers", envs, nil)
			close(stop)
			wg.Wait()
			requireAllOK(t, res)
			if runtime.GOOS == "linux" {
				require.Contains(t, res[0].output, tc.want)
			}
		})
	}
}

// shmListeners lists the shared-memory transports' abstract Unix
// sockets of the given processes (shm.Listen names them @goccl-PID-...).
func shmListeners(pids []int) []string {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]bool{} // accepted connections show the listener's name too
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || seen[f[len(f)-1]] {
			continue
		}
		for _, pid := range pids {
			if strings.HasPrefix(f[len(f)-1], fmt.Sprintf("@goccl-%d-", pid)) {
				seen[f[len(f)-1]] = true
				out = append(out, f[len(f)-1])
			}
		}
	}
	return out
}

// keepAttacking attacks addr the how-th way, once a millisecond, on a
// goroutine of wg, until stop is closed.
func keepAttacking(wg *sync.WaitGroup, stop <-chan struct{}, addr string, how int) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			attack(addr, how)
			time.Sleep(time.Millisecond)
		}
	})
}

// attack connects to addr (host:port, or an abstract Unix socket name
// starting with @) and misbehaves in one of a few ways.
func attack(addr string, how int) {
	network := "tcp"
	if strings.HasPrefix(addr, "@") {
		network = "unix"
	}
	c, err := net.DialTimeout(network, addr, 200*time.Millisecond)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	switch how % 5 {
	case 0: // wrong secret
		handshake.Client(c, []byte("not the secret"), wire.PurposeBootstrap, func() (wire.FrameType, []byte) {
			return wire.FramePeerInfo, nil
		})
	case 1: // garbage
		c.Write([]byte("\x16\x03\x01 GET / HTTP/1.1\r\n\r\n garbage"))
	case 2: // a truncated hello
		c.Write([]byte(wire.Magic[:3]))
	case 3: // a replayed handshake with a made-up proof
		h := wire.Hello{Version: wire.ProtocolVersion, Purpose: wire.PurposeData}
		c.Write(h.Append(nil))
		handshake.ReadFrame(c, 1024)
		r := wire.Response{Proof: [wire.ProofLen]byte{1, 2, 3}}
		handshake.WriteFrame(c, wire.FrameResponse, r.Append(nil))
		s := wire.ConnSetup{From: 0, To: 1, NSocks: 4}
		handshake.WriteFrame(c, wire.FrameConnSetup, s.Append(nil))
	case 4: // random bytes, of random length
		b := make([]byte, rand.IntN(300))
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		c.Write(b)
	}
}

// childMain is a rank's main in the multi-process tests.
func childMain(scenario string) int {
	ctx := context.Background()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		return 1
	}
	switch scenario {
	case "device":
		return childDevice(ctx)
	case "misplaced":
		return childMisplaced(ctx)
	}
	c, err := collective.InitFromEnv(ctx)
	if scenario == "missing" {
		if err == nil {
			c.Close()
			return fail("init succeeded with a rank missing")
		}
		fmt.Println(err)
		return 0
	}
	if err != nil {
		return fail("init: %v", err)
	}
	defer c.Close()
	switch scenario {
	case "listeners":
		lns, err := ownTCPListeners()
		if err != nil {
			return fail("%v", err)
		}
		for _, l := range lns {
			fmt.Println("listening on", l)
		}
		v := []int64{1}
		if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil {
			return fail("%v", err)
		}
	case "smoke":
		v := []int64{int64(c.Rank() + 1)}
		if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil {
			return fail("%v", err)
		}
		if want := int64(c.Size() * (c.Size() + 1) / 2); v[0] != want {
			return fail("sum %d, want %d", v[0], want)
		}
		fmt.Println("ok")
	case "collectives", "transports":
		if c.Rank() == 0 {
			for _, ri := range c.Ranks() {
				fmt.Printf("rank %d transport %s pid %d host %s addr %s\n", ri.Rank, ri.Transport, ri.PID, ri.Host, ri.Addr)
			}
		}
		if scenario == "transports" {
			v := []int64{1}
			if err := collective.AllReduce(ctx, c, v, v, collective.Sum); err != nil || v[0] != int64(c.Size()) {
				return fail("all-reduce: %v, sum %d", err, v[0])
			}
			return 0
		}
		if err := childCollectives(ctx, c); err != nil {
			return fail("%v", err)
		}
		fmt.Printf("rank %d blocks %d\n", c.Rank(), shm.BlocksReceived())
	case "reuse":
		if err := childReuse(ctx, c); err != nil {
			return fail("%v", err)
		}
		fmt.Printf("rank %d lent %d\n", c.Rank(), tcp.SlicesLent())
	case "shared":
		if err := childShared(ctx, c); err != nil {
			return fail("%v", err)
		}
		fmt.Printf("rank %d shared slices %d\n", c.Rank(), shm.SharedSlicesReceived())
		// Above shm.DefaultSharedMax slices go by reference only on a
		// host with more ranks than CPUs.
		before := shm.SharedSlicesReceived()
		send, recv, err := sharedGather(ctx, c, 1<<20)
		if send != nil {
			err = errors.Join(err, freeShared(send), freeShared(recv))
		}
		if err != nil {
			return fail("%v", err)
		}
		fmt.Printf("rank %d by reference above 4 MiB %d\n", c.Rank(), shm.SharedSlicesReceived()-before)
	case "strangers":
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if c.Rank() == 0 {
			var pids []int
			var targets []string
			for _, ri := range c.Ranks() {
				targets = append(targets, ri.Addr)
				pids = append(pids, ri.PID)
			}
			shmTargets := shmListeners(pids)
			targets = append(targets, shmTargets...)
			fmt.Printf("attacking %d TCP and %d shared-memory listeners\n", len(targets)-len(shmTargets), len(shmTargets))
			for _, addr := range targets {
				for i := 0; i < 5; i++ {
					keepAttacking(&wg, stop, addr, i)
				}
			}
		}
		err := childCollectives(ctx, c)
		close(stop)
		wg.Wait()
		if err != nil {
			return fail("%v", err)
		}
	case "shrink":
		// A training loop; the victim dies at step 5; the survivors shrink
		// the communicator and finish the remaining steps among themselves.
		victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
		me := c.Rank()
		want := int64(c.Size() * (c.Size() + 1) / 2)
		shrinks := 0
		for step := 0; step < 20; step++ {
			if me == victim && step == 5 {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			v := []int64{int64(me + 1)}
			err := collective.AllReduce(ctx, c, v, v, collective.Sum)
			if err != nil {
				if shrinks > 0 {
					return fail("step %d after the shrink: %v", step, err)
				}
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				nc, serr := c.Shrink(sctx)
				cancel()
				if serr != nil {
					return fail("shrink after %v: %v", err, serr)
				}
				c.Close()
				c = nc
				defer c.Close()
				shrinks++
				want -= int64(victim + 1)
				fmt.Printf("step %d: %v; shrank to %d ranks, now rank %d\n", step, err, c.Size(), c.Rank())
				// The survivors may have failed at different steps: an
				// operation can complete on some ranks before the death
				// reaches another. Like a training loop going back to its
				// last common step, they redo from the earliest.
				at := []int64{int64(step)}
				if err := collective.AllReduce(ctx, c, at, at, collective.Min); err != nil {
					return fail("agreeing on the step to redo: %v", err)
				}
				step = int(at[0]) - 1 // the loop's step++ redoes it
				continue
			}
			if v[0] != want {
				return fail("step %d: sum %d, want %d", step, v[0], want)
			}
		}
		fmt.Printf("finished 20 steps with %d ranks\n", c.Size())
		return 0
	case "sendleave":
		// Rank 0 sends and leaves at once; rank 1 receives after it has
		// gone: what was sent must still arrive (a Send completes without
		// its Recv while it fits in the connection).
		buf := make([]float32, 256)
		if c.Rank() == 0 {
			for i := range buf {
				buf[i] = float32(i)
			}
			if err := collective.Send(ctx, c, buf, 1); err != nil {
				return fail("send: %v", err)
			}
			c.Close()
			return 0
		}
		time.Sleep(700 * time.Millisecond)
		if err := collective.Recv(ctx, c, buf, 0); err != nil {
			return fail("recv after the sender left: %v", err)
		}
		if buf[255] != 255 {
			return fail("received %v", buf[255])
		}
		fmt.Println("received what the departed rank sent")
		return 0
	case "earlyclose":
		// The victim closes its communicator before any operation (the
		// deferred Close is a second, no-op one); the others' first
		// operation needs a connection to it and must fail at once.
		victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
		if c.Rank() == victim {
			c.Close()
			return 0
		}
		time.Sleep(300 * time.Millisecond) // the victim is gone by now
		start := time.Now()
		buf := make([]float32, 1<<16)
		err := collective.AllReduce(ctx, c, buf, buf, collective.Sum)
		if err == nil {
			return fail("the all-reduce without rank %d succeeded", victim)
		}
		if took := time.Since(start); took > 5*time.Second {
			return fail("the all-reduce failed after %v: %v", took, err)
		}
		fmt.Printf("after %v: %v\n", time.Since(start).Round(time.Millisecond), err)
		return 0
	case "idlekill":
		// Every rank is idle when the victim dies; the others must learn
		// it from the root within 3 s (their contexts end, naming it).
		victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
		if err := c.Barrier(ctx); err != nil {
			return fail("barrier: %v", err)
		}
		if c.Rank() == victim {
			time.Sleep(200 * time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		start := time.Now()
		select {
		case <-c.Context().Done():
		case <-time.After(20 * time.Second):
			return fail("no news of rank %d's death after 20 s", victim)
		}
		cause := context.Cause(c.Context())
		if !strings.Contains(cause.Error(), fmt.Sprintf("rank %d", victim)) {
			return fail("the cause does not name rank %d: %v", victim, cause)
		}
		fmt.Printf("learned after %v: %v\n", time.Since(start), cause)
		return 0
	case "freeze":
		return childFreeze(ctx, c)
	case "chain":
		return childChain(ctx, c)
	case "p2p":
		return childP2P(ctx, c)
	case "split":
		return childSplit(ctx, c)
	case "splitclose":
		return childSplitThenClose(ctx, c)
	case "splitidlekill":
		return childSplitIdleDeath(ctx, c)
	case "kill":
		victim, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_VICTIM"))
		count, _ := strconv.Atoi(os.Getenv("GOCCL_TEST_COUNT"))
		buf := make([]float32, count)
		die := 3
		if count < 1000 {
			die = 2000 // small operations take microseconds: die among many
		}
		for i := 0; ; i++ {
			if c.Rank() == victim && i == die {
				// Die in the middle of the next all-reduce, as a crash would.
				go func() {
					time.Sleep(2 * time.Millisecond)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}()
			}
			start := time.Now()
			err := collective.AllReduce(ctx, c, buf, buf, collective.Sum)
			if err == nil {
				if i > 1000*die {
					return fail("the victim never died")
				}
				continue
			}
			fmt.Printf("after %v: %v\n", time.Since(start), err)
			var oe *collective.OpError
			if !errors.As(err, &oe) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", victim)) {
				return fail("error does not name rank %d: %v", victim, err)
			}
			// The dead rank's mappings died with it; the survivors' go
			// with Close: no segment outlives the job.
			c.Close()
			maps, err := os.ReadFile("/proc/self/maps")
			if err != nil && runtime.GOOS == "linux" {
				return fail("%v", err)
			}
			fmt.Printf("segments still mapped after Close: %d\n", strings.Count(string(maps), "/memfd:goccl"))
			return 0
		}
	default:
		return fail("unknown scenario %q", scenario)
	}
	return 0
}

// childCollectives runs every collective with every type at least once on
// a real communicator and checks the results; inputs are seeded by rank,
// so every rank can compute every other rank's input.
// childReuse: rank 0 broadcasts one buffer again and again, rewriting
// it the moment each broadcast returns, while the others, slower (they
// sleep before each), check every round's contents. A sender that lends
// its pages (tcp.Options.Lend) must not return before its receivers have
// read them.
func childReuse(ctx context.Context, c *collective.Comm) error {
	buf := make([]uint32, 1<<20) // 4 MiB
	fill := func(round int) {
		for i := range buf {
			buf[i] = uint32(round*1_000_003 + i)
		}
	}
	for round := range 12 {
		if c.Rank() == 0 {
			fill(round)
		} else {
			time.Sleep(2 * time.Millisecond)
		}
		if err := collective.Broadcast(ctx, c, buf, buf, 0); err != nil {
			return err
		}
		if c.Rank() == 0 {
			clear(buf) // the caller's again
			continue
		}
		for i, v := range buf {
			if want := uint32(round*1_000_003 + i); v != want {
				return fmt.Errorf("round %d: element %d = %d, want %d (changed after the root's broadcast returned?)", round, i, v, want)
			}
		}
	}
	return c.Barrier(ctx)
}

func childCollectives(ctx context.Context, c *collective.Comm) error {
	n, r := c.Size(), c.Rank()
	counts := []int{1, 37, 70_001}
	if os.Getenv("GOCCL_TEST_SHORT") != "" {
		counts = []int{1, 4_099}
	}
	for ti, dt := range allTypes {
		op := allOps[ti%len(allOps)]
		for _, k := range counts {
			for ci, coll := range []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollReduceScatter,
				algorithms.CollAllGather, algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll} {
				s := caseSpec{coll: coll, op: op, count: k, root: (ti + ci) % n, inPlace: (ti+ci)%2 == 0 && coll != algorithms.CollAllToAll, seed: uint64(1000*ti + k + ci)}
				if err := childCheck(ctx, c, dt, s); err != nil {
					return fmt.Errorf("%v %v %v count %d: %w", coll, dt, op, k, err)
				}
			}
		}
	}
	// Send/recv around the ring (ringShift receives from prev).
	prev := (r + n - 1) % n
	out := make([]uint32, 100_003)
	for i := range out {
		out[i] = uint32(r*7 + i)
	}
	in := make([]uint32, len(out))
	if err := ringShift(ctx, c, out, in); err != nil {
		return err
	}
	for i, v := range in {
		if v != uint32(prev*7+i) {
			return fmt.Errorf("recv element %d = %d, want %d", i, v, prev*7+i)
		}
	}
	// Uneven all-to-alls: blocks of a few elements, then of up to 120 000
	// (several slots, pieces and channels), some empty.
	for _, scale := range []int{1, 300} {
		if err := checkAllToAllv(ctx, c, scale); err != nil {
			return err
		}
	}
	return c.Barrier(ctx)
}

// sharedVal is element i of rank q's input in the MemAlloc scenarios.
func sharedVal(q, i int) float32 { return float32(q*1_000_003+i) * 0.5 }

// sharedGather all-gathers k float32 per rank (sharedVal) between buffers
// from MemAlloc, checks the result, and returns both buffers for the
// caller to use further and free.
func sharedGather(ctx context.Context, c *collective.Comm, k int) (send, recv []float32, err error) {
	n, r := c.Size(), c.Rank()
	if send, recv, err = sharedBufs(k, n); err != nil {
		return nil, nil, err
	}
	for i := range send {
		send[i] = sharedVal(r, i)
	}
	if err := collective.AllGather(ctx, c, send, recv); err != nil {
		return send, recv, fmt.Errorf("all-gather of %d: %w", k, err)
	}
	for i, v := range recv {
		if want := sharedVal(i/k, i%k); v != want {
			return send, recv, fmt.Errorf("all-gather of %d: element %d = %v, want %v", k, i, v, want)
		}
	}
	return send, recv, nil
}

// registering: the "shared" child's buffers are Go memory registered in
// place (GOCCL_TEST_REGISTER=1), not MemAlloc's.
var registering = os.Getenv("GOCCL_TEST_REGISTER") == "1"

// sharedRegs holds the registrations of sharedBufs's buffers, by their
// first element, until freeShared.
var sharedRegs = map[*float32]*collective.Registration{}

// sharedBufs returns k and n*k float32s that the ranks of the host map:
// MemAlloc's or, registering, Go memory registered in place, starting
// 100 bytes into a page (so that the part-pages at either end go the
// ordinary way).
func sharedBufs(k, n int) (send, recv []float32, err error) {
	if !registering {
		if send, err = collective.MemAlloc[float32](k); err != nil {
			return nil, nil, err
		}
		if recv, err = collective.MemAlloc[float32](n * k); err != nil {
			return nil, nil, errors.Join(err, collective.MemFree(send))
		}
		return send, recv, nil
	}
	get := func(m int) ([]float32, error) {
		backing := make([]float32, m+2048)
		off := (4096 - int(uintptr(unsafe.Pointer(&backing[0]))%4096) + 100) % 4096 / 4
		b := backing[off : off+m : off+m]
		reg, err := collective.Register(b)
		if err != nil {
			return nil, err
		}
		sharedRegs[&b[0]] = reg
		return b, nil
	}
	if send, err = get(k); err != nil {
		return nil, nil, err
	}
	if recv, err = get(n * k); err != nil {
		return nil, nil, errors.Join(err, freeShared(send))
	}
	return send, recv, nil
}

// freeShared frees what sharedBufs returned.
func freeShared(b []float32) error {
	if !registering {
		return collective.MemFree(b)
	}
	reg := sharedRegs[&b[0]]
	delete(sharedRegs, &b[0])
	return reg.Deregister()
}

// childShared runs all-gathers, broadcasts and all-reduces on buffers
// from sharedBufs, checks every result, and frees them.
func childShared(ctx context.Context, c *collective.Comm) error {
	n, r := c.Size(), c.Rank()
	for _, k := range []int{1, 37, 70_001, 300_000} {
		send, recv, err := sharedGather(ctx, c, k)
		if err != nil {
			return err
		}
		root := k % n
		bc := recv[:k]
		if r == root {
			copy(bc, send)
		}
		if err := collective.Broadcast(ctx, c, bc, bc, root); err != nil {
			return fmt.Errorf("broadcast of %d: %w", k, err)
		}
		for i, v := range bc {
			if want := sharedVal(root, i); v != want {
				return fmt.Errorf("broadcast of %d from %d: element %d = %v, want %v", k, root, i, v, want)
			}
		}
		if err := collective.AllReduce(ctx, c, send, bc, collective.Max); err != nil {
			return fmt.Errorf("all-reduce of %d: %w", k, err)
		}
		for i, v := range bc {
			if want := sharedVal(n-1, i); v != want {
				return fmt.Errorf("all-reduce of %d: element %d = %v, want %v", k, i, v, want)
			}
		}
		// Reduce and reduce-scatter: the leaves' and the ring's first
		// sends go by reference, and the receivers reduce straight out
		// of the sender's buffer. The sums are exact in float32.
		sum := func(i int) float32 {
			var t float32
			for q := range n {
				t += sharedVal(q, i)
			}
			return t
		}
		out := recv[:k]
		big := k*4 >= 64<<10 // from shm.DefaultCMAMin on
		before := shm.SharedSlicesReceived()
		if err := collective.Reduce(ctx, c, send, out, collective.Sum, root); err != nil {
			return fmt.Errorf("reduce of %d: %w", k, err)
		}
		if big && n == 2 && r == root && shm.SharedSlicesReceived() == before {
			return fmt.Errorf("reduce of %d: the root reduced nothing straight out of the leaf's buffer", k)
		}
		if r == root {
			for i, v := range out {
				if want := sum(i); v != want {
					return fmt.Errorf("reduce of %d to %d: element %d = %v, want %v", k, root, i, v, want)
				}
			}
		}
		for i := range recv {
			recv[i] = sharedVal(r, i)
		}
		before = shm.SharedSlicesReceived()
		if err := collective.ReduceScatter(ctx, c, recv, send, collective.Sum); err != nil {
			return fmt.Errorf("reduce-scatter of %d: %w", k, err)
		}
		if big && shm.SharedSlicesReceived() == before {
			return fmt.Errorf("reduce-scatter of %d: the ring's first step reduced nothing straight out of a peer's buffer", k)
		}
		for i, v := range send {
			if want := sum(r*k + i); v != want {
				return fmt.Errorf("reduce-scatter of %d: element %d = %v, want %v", k, i, v, want)
			}
		}
		// An all-reduce from Go memory into a shared output: nothing goes
		// by reference, neither the input nor the all-gather half's
		// output blocks (the slots, written with streaming stores, are
		// faster: engine/exec.go).
		goIn := make([]float32, k)
		for i := range goIn {
			goIn[i] = sharedVal(r, i)
		}
		before = shm.SharedSlicesReceived()
		if err := collective.AllReduce(ctx, c, goIn, out, collective.Sum); err != nil {
			return fmt.Errorf("all-reduce of %d into shared memory: %w", k, err)
		}
		for i, v := range out {
			if want := sum(i); v != want {
				return fmt.Errorf("all-reduce of %d into shared memory: element %d = %v, want %v", k, i, v, want)
			}
		}
		if n := shm.SharedSlicesReceived() - before; n != 0 {
			return fmt.Errorf("all-reduce of %d into shared memory: %d slices read straight out of a peer's output, want them through the slots", k, n)
		}
		// In place it keeps its slots (docs/performance.md), and is right.
		copy(send, goIn)
		if err := collective.AllReduce(ctx, c, send, send, collective.Sum); err != nil {
			return fmt.Errorf("all-reduce in place of %d: %w", k, err)
		}
		for i, v := range send {
			if want := sum(i); v != want {
				return fmt.Errorf("all-reduce in place of %d: element %d = %v, want %v", k, i, v, want)
			}
		}
		if err := errors.Join(freeShared(send), freeShared(recv)); err != nil {
			return err
		}
	}
	return c.Barrier(ctx)
}

// childCheck runs one checked operation on this rank.
func childCheck(ctx context.Context, c *collective.Comm, dt collective.DataType, s caseSpec) error {
	switch dt {
	case collective.Int8:
		return childCheckT[int8](ctx, c, s)
	case collective.Uint8:
		return childCheckT[uint8](ctx, c, s)
	case collective.Int32:
		return childCheckT[int32](ctx, c, s)
	case collective.Uint32:
		return childCheckT[uint32](ctx, c, s)
	case collective.Int64:
		return childCheckT[int64](ctx, c, s)
	case collective.Uint64:
		return childCheckT[uint64](ctx, c, s)
	case collective.Float16Type:
		return childCheckT[collective.Float16](ctx, c, s)
	case collective.Float32:
		return childCheckT[float32](ctx, c, s)
	case collective.Float64:
		return childCheckT[float64](ctx, c, s)
	case collective.BFloat16Type:
		return childCheckT[collective.BFloat16](ctx, c, s)
	}
	return fmt.Errorf("type %v", dt)
}

func childCheckT[T collective.Number](ctx context.Context, c *collective.Comm, s caseSpec) error {
	n, r := c.Size(), c.Rank()
	inputs := make([][]T, n)
	for q := range inputs {
		inputs[q] = gen[T](rand.New(rand.NewPCG(s.seed, uint64(q))), s.op, inputLen(s, n))
	}
	recv, err := runCase(ctx, c, s, append([]T(nil), inputs[r]...))
	if err != nil {
		return err
	}
	want, defined := expected(s, inputs, r)
	if !defined {
		return nil
	}
	if i := firstDiff(recv, want); i >= 0 {
		return fmt.Errorf("rank %d element %d = %v, want %v", r, i, recv[i], want[i])
	}
	return nil
}

// A rank that closes its communicator before its first operation: the
// others' operations that need it fail at once, naming it, instead of
// retrying their connection until the timeout (issue 15).
func TestMultiProcessCloseBeforeFirstOperation(t *testing.T) {
	for _, tr := range transports() {
		for _, victim := range []int{0, 2} { // a lower rank dials, a higher one is awaited
			t.Run(fmt.Sprintf("%s/victim=%d", tr, victim), func(t *testing.T) {
				res := spawn(t, "earlyclose", gocclEnvs(t, 3, "GOCCL_TRANSPORT="+tr, "GOCCL_TIMEOUT=10m", "GOCCL_TEST_VICTIM="+strconv.Itoa(victim)), nil)
				requireAllOK(t, res)
				for _, r := range res {
					t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.output))
					if r.rank != victim {
						// The root's notice, or (when the victim's process
						// hosted the root) the root's end, names it; or the
						// rank learned that another survivor had given up
						// and left (with no root to say so, its listener is
						// gone).
						require.Regexp(t, `rank \d (closed its communicator|has left)|nothing listens at .* any more`, r.output, "rank %d", r.rank)
					}
				}
			})
		}
	}
}

// What a rank sent before it closed its communicator still arrives at a
// receiver that connects after it has gone (review of issue 15's Left
// notices).
func TestMultiProcessSendThenLeave(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			res := spawn(t, "sendleave", gocclEnvs(t, 2, "GOCCL_TRANSPORT="+tr, "GOCCL_TIMEOUT=1m"), nil)
			requireAllOK(t, res)
			require.Contains(t, res[1].output, "received what the departed rank sent")
		})
	}
}
