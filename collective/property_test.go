package collective_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/goccl/goccl/algorithms"
	"github.com/goccl/goccl/collective"
)

// TestPropertyRandom draws random operations (ranks 1..16, count
// 0..100000, type, operator, algorithm, collective, in place or not) and
// compares every rank's output with an exact reference. The seed is
// printed; GOCCL_TEST_SEED=N replays a run.
func TestPropertyRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOCCL_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GOCCL_TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with GOCCL_TEST_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	iters := 60
	if testing.Short() {
		iters = 15
	}
	algos := []algorithms.Algorithm{algorithms.AlgoAuto, algorithms.Ring, algorithms.Tree, algorithms.RecDoubling, algorithms.Rabenseifner, algorithms.OneShot}
	colls := []algorithms.Collective{algorithms.CollAllReduce, algorithms.CollAllReduce, algorithms.CollAllReduce,
		algorithms.CollReduceScatter, algorithms.CollAllGather, algorithms.CollBroadcast, algorithms.CollReduce, algorithms.CollAllToAll}
	for i := 0; i < iters; i++ {
		n := 1 + rng.IntN(16)
		coll := colls[rng.IntN(len(colls))]
		count := rng.IntN(100_001)
		if coll.Majors(n) > 1 {
			count /= n // keep the total near the drawn size
		}
		s := caseSpec{
			coll:    coll,
			op:      allOps[rng.IntN(len(allOps))],
			count:   count,
			root:    rng.IntN(n),
			inPlace: coll != algorithms.CollAllToAll && rng.IntN(2) == 0,
			seed:    rng.Uint64(),
		}
		dt := allTypes[rng.IntN(len(allTypes))]
		algo := algos[rng.IntN(len(algos))]
		channels := rng.IntN(3) // 0: tuner's choice
		name := fmt.Sprintf("%d/nranks=%d/%v/%v/%v/count=%d/algo=%v/channels=%d/inplace=%v",
			i, n, coll, dt, s.op, count, algo, channels, s.inPlace)
		ok := t.Run(name, func(t *testing.T) {
			comms := newGroup(t, n, collective.WithAlgorithm(algo), collective.WithChannels(channels))
			checkType(t, dt, comms, s)
		})
		if !ok {
			t.Fatalf("failed at iteration %d; replay with GOCCL_TEST_SEED=%d", i, seed)
		}
	}
}
