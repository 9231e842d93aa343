package netchaos

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestImpairmentValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		imp  Impairment
		want string // "" when valid
	}{
		{"zero", Impairment{}, ""},
		{"netem-like", Impairment{Loss: 0.01, Delay: 5 * time.Millisecond, Jitter: 2 * time.Millisecond, Reorder: 0.25, ReorderCorrelation: 0.5}, ""},
		{"jitter-alone", Impairment{Jitter: time.Millisecond}, ""},
		{"loss>1", Impairment{Loss: 1.5}, "Impairment.Loss = 1.5, want a probability in [0, 1]"},
		{"loss<0", Impairment{Loss: -0.1}, "Impairment.Loss = -0.1"},
		{"reorder>1", Impairment{Reorder: 2, Delay: time.Millisecond}, "Impairment.Reorder = 2"},
		{"correlation>1", Impairment{ReorderCorrelation: 1.01}, "Impairment.ReorderCorrelation = 1.01"},
		{"negative-delay", Impairment{Delay: -time.Millisecond}, "want both >= 0"},
		{"reorder-without-delay", Impairment{Reorder: 0.25}, "needs a Delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.imp.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// fates draws n fates from a fresh decider.
func fates(imp Impairment, stream uint64, n int) []fate {
	d := newDecider(imp, stream)
	out := make([]fate, n)
	for i := range out {
		out[i] = d.next()
	}
	return out
}

func TestDeciderLoss(t *testing.T) {
	const n = 100_000
	for _, p := range []float64{0, 0.01, 0.3, 1} {
		imp := Impairment{Loss: p, Seed: 7}
		dropped := 0
		for _, f := range fates(imp, 0, n) {
			if f.drop {
				dropped++
			} else {
				require.Zero(t, f.delay, "no delay asked for")
				require.False(t, f.reordered)
			}
		}
		// A binomial's standard deviation is at most 0.0016 of n here.
		require.InDelta(t, p, float64(dropped)/n, 0.01, "loss %g, seed %d", p, imp.Seed)
	}
}

func TestDeciderDelay(t *testing.T) {
	const n = 10_000
	imp := Impairment{Delay: 5 * time.Millisecond, Jitter: 2 * time.Millisecond, Seed: 11}
	lo, hi, sum := time.Hour, time.Duration(0), time.Duration(0)
	for _, f := range fates(imp, 0, n) {
		require.False(t, f.drop || f.reordered)
		lo, hi, sum = min(lo, f.delay), max(hi, f.delay), sum+f.delay
	}
	// Uniform on [3ms, 7ms]: the extremes are reached closely, never passed.
	require.GreaterOrEqual(t, lo, 3*time.Millisecond)
	require.LessOrEqual(t, hi, 7*time.Millisecond)
	require.Less(t, lo, 3100*time.Microsecond)
	require.Greater(t, hi, 6900*time.Microsecond)
	require.InDelta(t, float64(5*time.Millisecond), float64(sum/n), float64(100*time.Microsecond))

	// Jitter larger than the delay clips at zero rather than going negative.
	for _, f := range fates(Impairment{Delay: time.Millisecond, Jitter: 3 * time.Millisecond, Seed: 11}, 0, n) {
		require.GreaterOrEqual(t, f.delay, time.Duration(0))
	}
}

func TestDeciderReorder(t *testing.T) {
	const n = 100_000
	count := func(imp Impairment) float64 {
		k := 0
		for _, f := range fates(imp, 0, n) {
			if f.reordered {
				require.Zero(t, f.delay, "a reordered packet is sent at once")
				k++
			} else {
				require.Equal(t, imp.Delay, f.delay, "the others are delayed")
			}
		}
		return float64(k) / n
	}
	imp := Impairment{Delay: 10 * time.Millisecond, Reorder: 0.25, Seed: 3}
	require.InDelta(t, 0.25, count(imp), 0.01, "seed %d", imp.Seed)
	// netem's correlation pulls each draw towards the previous one, and so
	// towards 0.5: fewer draws fall under 0.25 (see the package doc).
	imp.ReorderCorrelation = 0.5
	frac := count(imp)
	require.Greater(t, frac, 0.01, "seed %d", imp.Seed)
	require.Less(t, frac, 0.2, "seed %d", imp.Seed)
	t.Logf("reorder 25%% 50%%: %.1f%% of packets reordered", 100*frac)
}

func TestDeciderDeterministic(t *testing.T) {
	imp := Impairment{Loss: 0.1, Delay: 5 * time.Millisecond, Jitter: 2 * time.Millisecond, Reorder: 0.25, ReorderCorrelation: 0.5, Seed: 42}
	require.Equal(t, fates(imp, 0, 1000), fates(imp, 0, 1000), "same seed and stream, same fates")
	require.NotEqual(t, fates(imp, 0, 1000), fates(imp, 1, 1000), "the two directions draw differently")
	other := imp
	other.Seed++
	require.NotEqual(t, fates(imp, 0, 1000), fates(other, 0, 1000), "another seed, other fates")
}

func TestDelayQueue(t *testing.T) {
	var q delayQueue
	_, ok := q.peek()
	require.False(t, ok)

	// Equal due times leave in arrival order.
	t0 := time.Unix(1000, 0)
	for i := range 100 {
		q.push(t0, []byte{byte(i)})
	}
	for i := range 100 {
		due, ok := q.peek()
		require.True(t, ok)
		require.Equal(t, t0, due)
		require.Equal(t, []byte{byte(i)}, q.pop())
	}
	require.Zero(t, q.len())

	// Random due times leave sorted, ties in arrival order.
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	type key struct {
		due time.Duration
		i   int
	}
	keys := make([]key, 1000)
	for i := range keys {
		keys[i] = key{time.Duration(rng.IntN(50)) * time.Millisecond, i}
		q.push(t0.Add(keys[i].due), []byte{byte(i >> 8), byte(i)})
	}
	prev := key{-1, -1}
	for range keys {
		pkt := q.pop()
		k := keys[int(pkt[0])<<8|int(pkt[1])]
		require.True(t, k.due > prev.due || k.due == prev.due && k.i > prev.i, "seed %d: %v after %v", seed, k, prev)
		prev = k
	}
}
