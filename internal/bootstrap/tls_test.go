package bootstrap

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/internal/tlsrec"
	"github.com/goccl/goccl/internal/tlsrec/tlstest"
	"github.com/goccl/goccl/internal/wire"
)

// TestTLSWatch runs a watched job with TLS to the root: the table arrives,
// and an abort is relayed through the TLS connections.
func TestTLSWatch(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	r, err := StartRoot("127.0.0.1:0", RootOptions{Secret: secret, Version: "v1", Logger: quiet(), Watch: true,
		TLS: tlsrec.NewConfig(ca.Issue(t, "root"), ca.Pool)})
	require.NoError(t, err)
	defer r.Close()
	const n = 3
	watches, errs := startWatches(r.Addr().String(), n, WithTLS(tlsrec.NewConfig(ca.Issue(t, "rank"), ca.Pool)))()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, watches[0].Abort("out of memory"))
	for _, rank := range []int{1, 2} {
		ev, err := watches[rank].Next()
		a := ev.Abort
		require.NoError(t, err)
		require.Equal(t, wire.Abort{Rank: 0, Reason: "out of memory"}, *a)
	}
	for _, w := range watches {
		w.Bye()
	}
}

// TestTLSMismatchesFail: a rank without TLS at a TLS root, a rank with
// TLS at a root without, and a rank whose certificate another CA signed
// all fail with a reason. A certificate the rank's CA did not sign fails
// at once; the other two are refusals the root sends before it has
// proved it knows the secret, which a stranger on the port could send as
// well (issue 19): they are retried until the deadline, and the error
// then quotes the last one.
func TestTLSMismatchesFail(t *testing.T) {
	ca, other := tlstest.NewCA(t, "job"), tlstest.NewCA(t, "stranger")
	rootTLS := tlsrec.NewConfig(ca.Issue(t, "root"), ca.Pool)
	for name, c := range map[string]struct {
		root *RootOptions
		join []JoinOption
		want string
	}{
		"plain rank, TLS root": {&RootOptions{TLS: rootTLS}, nil, "requires TLS"},
		"TLS rank, plain root": {&RootOptions{}, []JoinOption{WithTLS(tlsrec.NewConfig(ca.Issue(t, "rank"), ca.Pool))}, "does not use TLS"},
		"rank of another CA":   {&RootOptions{TLS: rootTLS}, []JoinOption{WithTLS(tlsrec.NewConfig(other.Issue(t, "rank"), other.Pool))}, "certificate"},
	} {
		unproven := name != "rank of another CA"
		t.Run(name, func(t *testing.T) {
			o := *c.root
			o.Secret, o.Version, o.Logger = secret, "v1", quiet()
			r, err := StartRoot("127.0.0.1:0", o)
			require.NoError(t, err)
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			_, err = Join(ctx, r.Addr().String(), secret, info(0, 2), c.join...)
			require.ErrorContains(t, err, c.want)
			t.Logf("%v after %v", err, time.Since(start))
			if unproven {
				require.ErrorContains(t, err, "before proving it knows this job's secret")
				require.GreaterOrEqual(t, time.Since(start), 1900*time.Millisecond, "an unproven refusal is retried")
			} else {
				require.Less(t, time.Since(start), time.Second, "a certificate refusal is not retried")
			}
		})
	}
}

// A relay holding a certificate of the job's CA between a rank and the
// root, TLS with each on its own, could rewrite the table before (issue
// 19, finding 1): the proofs now cover each end's TLS session, and the
// rank does not join through it.
func TestTLSRelayToTheRootIsRefused(t *testing.T) {
	ca := tlstest.NewCA(t, "job")
	r, err := StartRoot("127.0.0.1:0", RootOptions{Secret: secret, Version: "v1", Logger: quiet(),
		TLS: tlsrec.NewConfig(ca.Issue(t, "root"), ca.Pool)})
	require.NoError(t, err)
	defer r.Close()
	relay := tlstest.NewRelay(t, r.Addr().String(), tlsrec.NewConfig(ca.Issue(t, "relay"), ca.Pool), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = Join(ctx, relay.Addr, secret, info(0, 1), WithTLS(tlsrec.NewConfig(ca.Issue(t, "rank"), ca.Pool)))
	require.Error(t, err)
	require.ErrorContains(t, err, "TLS channel binding failed")
	// The same rank straight to the root joins.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	_, err = Join(ctx2, r.Addr().String(), secret, info(0, 1), WithTLS(tlsrec.NewConfig(ca.Issue(t, "rank"), ca.Pool)))
	require.NoError(t, err)
}
