package collective_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

func env(kv map[string]string) collective.Option {
	return collective.WithEnv(func(k string) (string, bool) { v, ok := kv[k]; return v, ok })
}

func TestConfigDefaults(t *testing.T) {
	comms := newGroup(t, 1)
	cfg := comms[0].Config()
	require.Equal(t, collective.DefaultTimeout, cfg.Timeout)
	require.Equal(t, algorithms.AlgoAuto, cfg.Algorithm)
	require.Equal(t, collective.DefaultMaxChannels, cfg.MaxChannels)
}

func TestConfigFromEnvironment(t *testing.T) {
	comms, err := collective.NewLocalGroup(2, env(map[string]string{
		"GOCCL_ALGO": "Tree", "GOCCL_NCHANNELS": "3", "GOCCL_CHUNK_SIZE": "256K", "GOCCL_TIMEOUT": "90",
	}))
	require.NoError(t, err)
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	cfg := comms[0].Config()
	require.Equal(t, algorithms.Tree, cfg.Algorithm)
	require.Equal(t, 3, cfg.Channels)
	require.Equal(t, 3, cfg.MaxChannels, "MaxChannels grows to a forced channel count")
	require.Equal(t, int64(256<<10), cfg.ChunkSize)
	require.Equal(t, 90*time.Second, cfg.Timeout)
}

func TestTCPWindowFromEnvironment(t *testing.T) {
	for v, want := range map[string]int{"off": -1, "12": 12, "0": 0} {
		comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_TCP_WINDOW": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, comms[0].Config().TCPWindow, v)
		comms[0].Close()
	}
}

func TestTCPLendFromEnvironment(t *testing.T) {
	for v, want := range map[string]string{"off": "off", " On ": "on", "auto": "auto"} {
		comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_TCP_LEND": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, comms[0].Config().TCPLend, v)
		comms[0].Close()
	}
	_, err := collective.NewLocalGroup(1, collective.WithEnv(nil), collective.WithConfig(collective.Config{TCPLend: "sometimes"}))
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
	require.ErrorContains(t, err, "TCPLend")
}

// The on/off switches read from the environment: 1, true or yes sets
// one, 0, false, no or nothing leaves it off, anything else is an error
// that names the variable.
func TestSwitchesFromEnvironment(t *testing.T) {
	for _, sw := range []struct {
		name string
		get  func(collective.Config) bool
	}{
		{"GOCCL_TCP_GATHER_DISABLE", func(c collective.Config) bool { return c.TCPGatherDisable }},
		{"GOCCL_SLOT_STREAM_DISABLE", func(c collective.Config) bool { return c.SlotStreamDisable }},
	} {
		for v, want := range map[string]bool{"1": true, "yes": true, "true": true, "0": false, "": false} {
			comms, err := collective.NewLocalGroup(1, env(map[string]string{sw.name: v}))
			require.NoError(t, err, "%s=%s", sw.name, v)
			require.Equal(t, want, sw.get(comms[0].Config()), "%s=%s", sw.name, v)
			comms[0].Close()
		}
		_, err := collective.NewLocalGroup(1, env(map[string]string{sw.name: "maybe"}))
		require.ErrorIs(t, err, collective.ErrInvalidArgument)
		require.ErrorContains(t, err, sw.name)
	}
}

// A congestion control the kernel does not know fails Init with its name,
// where the TCP listener is made.
func TestUnknownTCPCongestionFailsInit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("choosing a socket's congestion control is built for Linux only")
	}
	e := env(map[string]string{"GOCCL_TCP_CONGESTION": "nosuchcc", "GOCCL_TRANSPORT": "tcp"})
	// The rank fails before it joins, so the root serves out its (short)
	// init timeout and ends.
	id, err := collective.NewUniqueID(e, collective.WithInitTimeout(300*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = collective.Init(ctx, id, 1, 0, e)
	require.ErrorContains(t, err, `"nosuchcc"`)
}

func TestOptionsOverrideEnvironment(t *testing.T) {
	comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_ALGO": "tree", "GOCCL_TIMEOUT": "5m"}),
		collective.WithAlgorithm(algorithms.Ring))
	require.NoError(t, err)
	defer comms[0].Close()
	require.Equal(t, algorithms.Ring, comms[0].Config().Algorithm)
	require.Equal(t, 5*time.Minute, comms[0].Config().Timeout, "unset options leave the environment's value")
}

func TestInvalidEnvironmentIsAnError(t *testing.T) {
	for k, v := range map[string]string{
		"GOCCL_ALGO":              "fastest",
		"GOCCL_NCHANNELS":         "0",
		"GOCCL_MAX_NCHANNELS":     "99",
		"GOCCL_CHUNK_SIZE":        "12",
		"GOCCL_TIMEOUT":           "-3s",
		"GOCCL_NET_GDR_LEVEL":     "nearby",
		"GOCCL_GDR_FLUSH_DISABLE": "maybe",
		"GOCCL_SHM_ALLOW_UIDS":    "1000,root",
		"GOCCL_SHM_CMA":           "sometimes",
		"GOCCL_SHM_BLOCK":         "512M",
		"GOCCL_INSECURE":          "sure",
		"GOCCL_P2P_DISABLE":       "please",
		"GOCCL_HEARTBEAT_TIMEOUT": "-5s",
		"GOCCL_TCP_WINDOW":        "lots",
		"GOCCL_TCP_CONGESTION":    "BBR v2",
		"GOCCL_TCP_LEND":          "always",
	} {
		_, err := collective.NewLocalGroup(2, env(map[string]string{k: v}))
		require.ErrorIs(t, err, collective.ErrInvalidArgument, "%s=%s", k, v)
		require.ErrorContains(t, err, k, "the error must name the variable")
		require.ErrorContains(t, err, "want")
	}
	_, err := collective.NewLocalGroup(2, env(map[string]string{"GOCCL_ALGO": "pairwise"}))
	require.ErrorContains(t, err, "GOCCL_ALGO")
}

func TestInvalidOptions(t *testing.T) {
	for _, o := range []collective.Option{
		collective.WithChannels(33),
		collective.WithChunkSize(10),
		collective.WithTimeout(-time.Second),
		collective.WithSlots(1, 1<<20),
		collective.WithAlgorithm(algorithms.Pairwise),
	} {
		_, err := collective.NewLocalGroup(2, collective.WithEnv(nil), o)
		require.ErrorIs(t, err, collective.ErrInvalidArgument)
	}
	_, err := collective.NewLocalGroup(0)
	require.ErrorIs(t, err, collective.ErrInvalidArgument)
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"8": 8, "1K": 1024, "512k": 512 << 10, "4M": 4 << 20, "1G": 1 << 30, "2KiB": 2048, "3MB": 3 << 20} {
		got, err := collective.ParseSize(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "K", "-1", "1T", "x"} {
		_, err := collective.ParseSize(s)
		require.Error(t, err, s)
	}
}

func TestTypesAndOps(t *testing.T) {
	require.Equal(t, collective.Float32, collective.TypeOf[float32]())
	require.Equal(t, collective.BFloat16Type, collective.TypeOf[collective.BFloat16]())
	require.Equal(t, 2, collective.Float16Type.Size())
	require.Equal(t, "bfloat16", collective.BFloat16Type.String())
	require.True(t, collective.DataType(11).Valid())
	require.False(t, collective.DataType(12).Valid())
	require.False(t, collective.DataType(-1).Valid())
	require.Equal(t, "avg", collective.Avg.String())
	require.False(t, collective.Op(5).Valid())
	require.Equal(t, float32(1.5), collective.Float16From(1.5).Float32())
	require.Equal(t, float32(-2), collective.BFloat16From(-2).Float32())
	require.True(t, errors.Is(&collective.ArgError{}, collective.ErrInvalidArgument))
}

func TestDebugLevelAndSubsystems(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	_, err := collective.NewLocalGroup(1, collective.WithEnv(env("GOCCL_DEBUG", "LOUD")))
	require.ErrorContains(t, err, "GOCCL_DEBUG")
	_, err = collective.NewLocalGroup(1, collective.WithEnv(env("GOCCL_DEBUG_SUBSYS", "INIT,DISK")))
	require.ErrorContains(t, err, "DISK")
	for _, v := range []string{"WARN", "info", "TRACE", "NONE"} {
		comms, err := collective.NewLocalGroup(1, collective.WithEnv(env("GOCCL_DEBUG", v, "GOCCL_DEBUG_SUBSYS", "^NET")))
		require.NoError(t, err, v)
		comms[0].Close()
	}
}

func TestShmAllowUIDsFromEnvironment(t *testing.T) {
	comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_SHM_ALLOW_UIDS": "1000, 1001", "GOCCL_INSECURE": "1"}))
	require.NoError(t, err)
	defer comms[0].Close()
	require.Equal(t, []int{1000, 1001}, comms[0].Config().ShmAllowUIDs)
	require.True(t, comms[0].Config().Insecure)
}

func TestHeartbeatTimeoutFromEnvironment(t *testing.T) {
	for v, want := range map[string]time.Duration{"": collective.DefaultHeartbeatTimeout, "30s": 30 * time.Second, "0": -1} {
		comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_HEARTBEAT_TIMEOUT": v}))
		require.NoError(t, err)
		require.Equal(t, want, comms[0].Config().HeartbeatTimeout, "GOCCL_HEARTBEAT_TIMEOUT=%q", v)
		comms[0].Close()
	}
}

// WithConfig sets every field, DebugLevel and the newer ones included
// (issue 15: it used to keep a list of field names, which DebugLevel and
// the heartbeat were missing from); options win over the environment, in
// the order given.
func TestWithConfigSetsEveryField(t *testing.T) {
	want := collective.Config{DebugLevel: slog.LevelDebug, HeartbeatTimeout: 7 * time.Second, Timeout: time.Minute,
		Insecure: true, ShmAllowUIDs: []int{1234}, HostID: "h1", Spin: time.Millisecond, DebugDump: t.TempDir(),
		IB: collective.IBConfig{TC: 106, SL: 3}}
	comms, err := collective.NewLocalGroup(1, env(map[string]string{"GOCCL_DEBUG": "TRACE", "GOCCL_TIMEOUT": "5s"}), collective.WithConfig(want))
	require.NoError(t, err)
	got := comms[0].Config()
	comms[0].Close()
	require.Equal(t, slog.LevelDebug, got.DebugLevel)
	require.Equal(t, 7*time.Second, got.HeartbeatTimeout)
	require.Equal(t, time.Minute, got.Timeout, "the option wins over GOCCL_TIMEOUT")
	require.True(t, got.Insecure)
	require.Equal(t, []int{1234}, got.ShmAllowUIDs)
	require.Equal(t, "h1", got.HostID)
	require.Equal(t, 106, got.IB.TC)
	require.Equal(t, 3, got.IB.SL)
	require.Equal(t, want.DebugDump, got.DebugDump)
	// A later option wins over WithConfig.
	comms, err = collective.NewLocalGroup(1, collective.WithEnv(nil), collective.WithConfig(want), collective.WithTimeout(time.Hour))
	require.NoError(t, err)
	require.Equal(t, time.Hour, comms[0].Config().Timeout)
	require.Equal(t, slog.LevelDebug, comms[0].Config().DebugLevel)
	comms[0].Close()
}
