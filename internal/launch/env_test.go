package launch

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// vars is a fake environment for FromEnv.
type vars map[string]string

func (v vars) lookup(k string) (string, bool) {
	s, ok := v[k]
	return s, ok
}

// with returns v plus the pairs in kv ("K=V"), without changing v.
func (v vars) with(kv ...string) vars {
	out := vars{}
	for k, s := range v {
		out[k] = s
	}
	for _, p := range kv {
		k, s, _ := strings.Cut(p, "=")
		out[k] = s
	}
	return out
}

const testSecret = "00112233445566778899aabbccddeeff"

func TestFromEnvLaunchers(t *testing.T) {
	tests := []struct {
		name string
		env  vars
		want Env
	}{
		{
			name: "launcher=goccl",
			env: vars{"GOCCL_RANK": "1", "GOCCL_WORLD_SIZE": "4", "GOCCL_LOCAL_RANK": "1", "GOCCL_LOCAL_SIZE": "2",
				"GOCCL_ROOT": "node1:29500", "GOCCL_SECRET": testSecret},
			want: Env{Rank: 1, Size: 4, LocalRank: 1, LocalSize: 2, Root: "node1:29500", Secret: testSecret, Source: "goccl"},
		},
		{
			name: "launcher=goccl/id",
			env:  vars{"GOCCL_RANK": "0", "GOCCL_WORLD_SIZE": "1", "GOCCL_ID": "opaque-id-string"},
			want: Env{Rank: 0, Size: 1, LocalRank: -1, LocalSize: -1, ID: "opaque-id-string", Source: "goccl"},
		},
		{
			name: "launcher=goccl/id+root",
			env:  vars{"GOCCL_RANK": "0", "GOCCL_WORLD_SIZE": "2", "GOCCL_ID": "opaque", "GOCCL_ROOT": "[::1]:29500"},
			want: Env{Rank: 0, Size: 2, LocalRank: -1, LocalSize: -1, ID: "opaque", Root: "[::1]:29500", Source: "goccl"},
		},
		{
			name: "launcher=torchrun",
			env: vars{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
				"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "GROUP_RANK": "1"},
			want: Env{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Root: "node1:29500", Source: "torchrun"},
		},
		{
			name: "launcher=kubeflow",
			env:  vars{"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "train-0.train-svc", "MASTER_PORT": "23456"},
			want: Env{Rank: 2, Size: 3, LocalRank: -1, LocalSize: -1, Root: "train-0.train-svc:23456", Source: "torchrun"},
		},
		{
			name: "launcher=torchrun/ipv6",
			env:  vars{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "fd00::1", "MASTER_PORT": "29500"},
			want: Env{Rank: 0, Size: 2, LocalRank: -1, LocalSize: -1, Root: "[fd00::1]:29500", Source: "torchrun"},
		},
		{
			name: "launcher=torchrun/ipv6-bracketed",
			env:  vars{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "[fd00::1]", "MASTER_PORT": "29500"},
			want: Env{Rank: 0, Size: 2, LocalRank: -1, LocalSize: -1, Root: "[fd00::1]:29500", Source: "torchrun"},
		},
		{
			name: "launcher=torchrun/goccl-port",
			env: vars{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
				"MASTER_ADDR": "fd00::7", "MASTER_PORT": "29500", "GOCCL_ROOT": ":29501"},
			want: Env{Rank: 3, Size: 8, LocalRank: 3, LocalSize: 4, Root: "[fd00::7]:29501", Source: "torchrun"},
		},
		{
			name: "launcher=openmpi",
			env: vars{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
				"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "GOCCL_ROOT": "10.0.0.1:29500", "GOCCL_SECRET": strings.ToUpper(testSecret)},
			want: Env{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, Root: "10.0.0.1:29500", Secret: strings.ToUpper(testSecret), Source: "openmpi"},
		},
		{
			name: "launcher=mpich",
			env: vars{"PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4",
				"GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 6, Size: 8, LocalRank: 2, LocalSize: 4, Root: "node1:29500", Source: "mpich"},
		},
		{
			name: "launcher=mpich/no-local",
			env:  vars{"PMI_RANK": "1", "PMI_SIZE": "2", "GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 1, Size: 2, LocalRank: -1, LocalSize: -1, Root: "node1:29500", Source: "mpich"},
		},
		{
			name: "launcher=slurm/ntasks-per-node",
			env: vars{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4",
				"MASTER_ADDR": "node1", "MASTER_PORT": "29500"},
			want: Env{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Root: "node1:29500", Source: "slurm"},
		},
		{
			name: "launcher=slurm/tasks-per-node-compressed",
			env: vars{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)",
				"GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Root: "node1:29500", Source: "slurm"},
		},
		{
			name: "launcher=slurm/step-tasks-per-node-uneven",
			env: vars{"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
				"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_TASKS_PER_NODE": "2(x4)", "GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 6, Size: 7, LocalRank: 0, LocalSize: 1, Root: "node1:29500", Source: "slurm"},
		},
		{
			name: "launcher=slurm/uneven-without-nodeid",
			env: vars{"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2,1",
				"GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 2, Size: 3, LocalRank: 0, LocalSize: -1, Root: "node1:29500", Source: "slurm"},
		},
		{
			name: "launcher=slurm/unparsable-tasks",
			env: vars{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "what",
				"SLURM_NTASKS_PER_NODE": "2(x1)", "GOCCL_ROOT": "node1:29500"},
			want: Env{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, Root: "node1:29500", Source: "slurm"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(tc.env.lookup)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestFromEnvPrecedence(t *testing.T) {
	goccl := vars{"GOCCL_RANK": "0", "GOCCL_WORLD_SIZE": "2"}
	torch := vars{"RANK": "1", "WORLD_SIZE": "3"}
	ompi := vars{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}
	pmi := vars{"PMI_RANK": "3", "PMI_SIZE": "5"}
	slurm := vars{"SLURM_PROCID": "4", "SLURM_NTASKS": "6"}
	merge := func(vs ...vars) vars {
		out := vars{"GOCCL_ROOT": "node1:29500"}
		for _, v := range vs {
			for k, s := range v {
				out[k] = s
			}
		}
		return out
	}
	tests := []struct {
		name       string
		env        vars
		source     string
		rank, size int
	}{
		{"goccl>torchrun>openmpi>mpich>slurm", merge(goccl, torch, ompi, pmi, slurm), "goccl", 0, 2},
		{"torchrun>openmpi>mpich>slurm", merge(torch, ompi, pmi, slurm), "torchrun", 1, 3},
		{"openmpi>mpich>slurm", merge(ompi, pmi, slurm), "openmpi", 2, 4},
		{"mpich>slurm", merge(pmi, slurm), "mpich", 3, 5},
		{"slurm", merge(slurm), "slurm", 4, 6},
		{"goccl>slurm", merge(goccl, slurm), "goccl", 0, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(tc.env.lookup)
			require.NoError(t, err)
			require.Equal(t, tc.source, got.Source)
			require.Equal(t, tc.rank, got.Rank)
			require.Equal(t, tc.size, got.Size)
		})
	}

	t.Run("root=GOCCL_ROOT>MASTER", func(t *testing.T) {
		got, err := FromEnv(torch.with("MASTER_ADDR=node2", "MASTER_PORT=1234", "GOCCL_ROOT=node3:4321").lookup)
		require.NoError(t, err)
		require.Equal(t, "node3:4321", got.Root)
	})
	t.Run("partial-higher-set-is-not-skipped", func(t *testing.T) {
		_, err := FromEnv(merge(ompi).with("RANK=1").lookup)
		require.ErrorContains(t, err, "found RANK=1 (torchrun/Kubeflow); missing WORLD_SIZE")
	})
}

func TestFromEnvErrors(t *testing.T) {
	root := "GOCCL_ROOT=node1:29500"
	ompi := vars{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
	torch := vars{"RANK": "1", "WORLD_SIZE": "4"}
	tests := []struct {
		name string
		env  vars
		want []string // substrings of the error, in order
	}{
		{"partial/rank-only", vars{"RANK": "1"}.with(root),
			[]string{"goccl: found RANK=1 (torchrun/Kubeflow); missing WORLD_SIZE", "set both or unset RANK"}},
		{"partial/size-only", vars{"GOCCL_WORLD_SIZE": "4"}.with(root),
			[]string{"found GOCCL_WORLD_SIZE=4 (goccl); missing GOCCL_RANK", "unset GOCCL_WORLD_SIZE"}},
		{"partial/slurm", vars{"SLURM_PROCID": "0"}.with(root),
			[]string{"found SLURM_PROCID=0 (Slurm); missing SLURM_NTASKS"}},
		{"rank/not-integer", vars{"GOCCL_RANK": "one", "GOCCL_WORLD_SIZE": "4"}.with(root),
			[]string{"found GOCCL_RANK=one, GOCCL_WORLD_SIZE=4 (goccl)", `GOCCL_RANK="one" is not an integer: expected a rank in 0..3`}},
		{"rank/empty", vars{"GOCCL_RANK": "", "GOCCL_WORLD_SIZE": "4"}.with(root),
			[]string{`GOCCL_RANK="" is not an integer`}},
		{"rank/negative", torch.with("RANK=-1", root),
			[]string{"RANK=-1 is negative: expected a rank in 0..3"}},
		{"rank/too-big", ompi.with("OMPI_COMM_WORLD_RANK=4", root),
			[]string{"OMPI_COMM_WORLD_RANK=4 is not less than OMPI_COMM_WORLD_SIZE=4: expected a rank in 0..3"}},
		{"size/zero", torch.with("RANK=0", "WORLD_SIZE=0", root),
			[]string{"WORLD_SIZE=0 is too small: expected a world size of at least 1"}},
		{"size/negative", vars{"PMI_RANK": "0", "PMI_SIZE": "-2"}.with(root),
			[]string{"found PMI_RANK=0, PMI_SIZE=-2 (MPICH/Hydra/Intel MPI)", "PMI_SIZE=-2 is negative"}},
		{"size/not-integer", vars{"SLURM_PROCID": "0", "SLURM_NTASKS": "4x"}.with(root),
			[]string{`SLURM_NTASKS="4x" is not an integer: expected a world size of at least 1`}},
		{"local/too-big", torch.with("LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4", root),
			[]string{"found RANK=1, WORLD_SIZE=4, LOCAL_RANK=4, LOCAL_WORLD_SIZE=4 (torchrun/Kubeflow)",
				"LOCAL_RANK=4 is not less than the local size LOCAL_WORLD_SIZE=4: expected a local rank in 0..3"}},
		{"local/negative", ompi.with("OMPI_COMM_WORLD_LOCAL_RANK=-1", root),
			[]string{"OMPI_COMM_WORLD_LOCAL_RANK=-1 is negative"}},
		{"local/size-zero", vars{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "0"}.with(root),
			[]string{"MPI_LOCALNRANKS=0 is too small: expected a local size of at least 1"}},
		{"local/not-integer", vars{"GOCCL_RANK": "0", "GOCCL_WORLD_SIZE": "2", "GOCCL_LOCAL_RANK": "first"}.with(root),
			[]string{`GOCCL_LOCAL_RANK="first" is not an integer`}},
		{"local/slurm-too-big", vars{"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}.with(root),
			[]string{"SLURM_LOCALID=2 is not less than the local size SLURM_TASKS_PER_NODE=2"}},
		{"root/missing", ompi,
			[]string{"goccl: found OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=4 (Open MPI); missing the rendezvous address: set GOCCL_ROOT=host:port (rank 0 listens there), or MASTER_ADDR and MASTER_PORT"}},
		{"root/master-port-missing", torch.with("MASTER_ADDR=node1"),
			[]string{"found RANK=1, WORLD_SIZE=4 (torchrun/Kubeflow) and MASTER_ADDR=node1; missing MASTER_PORT"}},
		{"root/master-addr-missing", torch.with("MASTER_PORT=29500"),
			[]string{"MASTER_PORT=29500; missing MASTER_ADDR"}},
		{"root/master-port-zero", torch.with("MASTER_ADDR=node1", "MASTER_PORT=0"),
			[]string{`MASTER_PORT="0": port 0 is out of range: expected 1..65535`}},
		{"root/master-port-big", torch.with("MASTER_ADDR=node1", "MASTER_PORT=65536"),
			[]string{"port 65536 is out of range: expected 1..65535"}},
		{"root/master-port-name", torch.with("MASTER_ADDR=node1", "MASTER_PORT=http"),
			[]string{`port "http" is not a number: expected 1..65535`}},
		{"root/master-addr-with-port", torch.with("MASTER_ADDR=node1:29500", "MASTER_PORT=29500"),
			[]string{`MASTER_ADDR="node1:29500" is not a host name or IP address`, "the port goes in MASTER_PORT"}},
		{"root/master-addr-empty", torch.with("MASTER_ADDR=", "MASTER_PORT=29500"),
			[]string{`MASTER_ADDR="" is not a host name or IP address`}},
		{"root/goccl-no-port", ompi.with("GOCCL_ROOT=node1"),
			[]string{`GOCCL_ROOT="node1" is not host:port`}},
		{"root/goccl-port-name", ompi.with("GOCCL_ROOT=node1:http"),
			[]string{`GOCCL_ROOT="node1:http": port "http" is not a number`}},
		{"root/goccl-port-zero", ompi.with("GOCCL_ROOT=node1:0"),
			[]string{"port 0 is out of range"}},
		{"root/goccl-no-host", ompi.with("GOCCL_ROOT=:29500"),
			[]string{`GOCCL_ROOT=":29500" has no host and MASTER_ADDR is not set`}},
		{"root/goccl-port-only-bad-master", torch.with("GOCCL_ROOT=:29501", "MASTER_ADDR=node1:29500"),
			[]string{`MASTER_ADDR="node1:29500" is not a host name or IP address`}},
		{"root/goccl-bad-with-id", ompi.with("GOCCL_ID=opaque", "GOCCL_ROOT=node1"),
			[]string{`GOCCL_ROOT="node1" is not host:port`}},
		{"secret/short", ompi.with(root, "GOCCL_SECRET=abc123"),
			[]string{"GOCCL_SECRET has 6 characters: expected 32 hex digits (128 bits)", "openssl rand -hex 16"}},
		{"secret/not-hex", ompi.with(root, "GOCCL_SECRET=zz112233445566778899aabbccddeeff"),
			[]string{"GOCCL_SECRET has a character that is not a hex digit: expected 32 hex digits", "openssl rand -hex 16"}},
		{"secret/empty", ompi.with(root, "GOCCL_SECRET="),
			[]string{"GOCCL_SECRET is empty: expected 32 hex digits", "openssl rand -hex 16"}},
		{"id/empty", ompi.with(root, "GOCCL_ID="),
			[]string{"GOCCL_ID is set but empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(tc.env.lookup)
			require.Error(t, err)
			require.Equal(t, Env{}, got)
			msg := err.Error()
			at := 0
			for _, w := range tc.want {
				i := strings.Index(msg[at:], w)
				require.GreaterOrEqual(t, i, 0, "error %q\nlacks %q (after byte %d)", msg, w, at)
				at += i + len(w)
			}
			require.NotErrorIs(t, err, ErrNoLauncher)
		})
	}
}

func TestFromEnvNeverEchoesSecrets(t *testing.T) {
	const secret = "zz11223344556677889900aabbccddee" // not hex: rejected
	const id = "id-with-its-own-secret-inside"
	for _, env := range []vars{
		{"GOCCL_RANK": "0", "GOCCL_WORLD_SIZE": "2", "GOCCL_ID": id, "GOCCL_SECRET": secret},
		{"GOCCL_RANK": "x", "GOCCL_WORLD_SIZE": "2", "GOCCL_ID": id},
		{"GOCCL_ID": id},
	} {
		_, err := FromEnv(env.lookup)
		require.Error(t, err)
		require.NotContains(t, err.Error(), secret)
		require.NotContains(t, err.Error(), id)
	}
}

func TestFromEnvNoLauncher(t *testing.T) {
	_, err := FromEnv(vars{"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "LOCAL_RANK": "0"}.lookup)
	require.ErrorIs(t, err, ErrNoLauncher)
	msg := err.Error()
	at := 0
	for _, w := range []string{
		"GOCCL_RANK and GOCCL_WORLD_SIZE (goccl)",
		"RANK and WORLD_SIZE (torchrun/Kubeflow)",
		"OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI)",
		"PMI_RANK and PMI_SIZE (MPICH/Hydra/Intel MPI)",
		"SLURM_PROCID and SLURM_NTASKS (Slurm)",
		"GOCCL_ROOT=host:port",
	} {
		i := strings.Index(msg[at:], w)
		require.GreaterOrEqual(t, i, 0, "error %q\nlacks %q in order", msg, w)
		at += i + len(w)
	}
	require.NotContains(t, msg, "GOCCL_ID is set")

	_, err = FromEnv(vars{"GOCCL_ID": "opaque"}.lookup)
	require.ErrorIs(t, err, ErrNoLauncher)
	require.ErrorContains(t, err, "GOCCL_ID is set, but it carries only the root address and secret, so rank and size must still come from one of these")
}

func TestTasksOnNode(t *testing.T) {
	tests := []struct {
		v    string
		node int
		want int
	}{
		{"4", -1, 4},
		{"4", 0, 4},
		{"4", 1, -1},
		{"4(x2)", -1, 4},
		{"4(x2)", 1, 4},
		{"4(x2)", 2, -1},
		{"2(x3),1", 0, 2},
		{"2(x3),1", 2, 2},
		{"2(x3),1", 3, 1},
		{"2(x3),1", -1, -1},
		{"2,2(x2)", -1, 2},
		{"", -1, -1},
		{"x", -1, -1},
		{"4(x", -1, -1},
		{"4(x0)", -1, -1},
		{"0", -1, -1},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tasksOnNode(tc.v, tc.node), "tasksOnNode(%q, %d)", tc.v, tc.node)
	}
}
