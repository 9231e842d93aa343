package bench

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/internal/device/emu"
	"github.com/goccl/goccl/memory"
)

// The device sweeps run on the host-emulated device (tests only): every
// collective's results, copied back from device memory, must check out,
// and a wrong element in device memory must be counted.

// countingStream counts the operations ordered on it (each Device form
// makes the stream wait on the communicator's flag once).
type countingStream struct {
	collective.Stream
	waits *atomic.Int64
}

func (c countingStream) WaitValue(flag memory.Buffer, v uint32) error {
	c.waits.Add(1)
	return c.Stream.WaitValue(flag, v)
}

func runDeviceSweep(t *testing.T, n int, o Options) ([]Row, string, error) {
	t.Helper()
	d := emu.New(0, emu.Options{Seed: 3, MaxDelay: 5e3})
	comms, err := collective.NewLocalGroup(n, collective.WithTimeout(time.Minute), collective.WithDevice(d))
	require.NoError(t, err)
	var out bytes.Buffer
	errs := make([]error, n)
	rows := make([][]Row, n)
	var wg sync.WaitGroup
	var waits atomic.Int64
	for r, c := range comms {
		ds, err := d.NewStream()
		require.NoError(t, err)
		s := countingStream{ds, &waits}
		wg.Go(func() {
			defer s.Close()
			var sink Sink
			if r == 0 {
				sink = Printer{W: &out}
			}
			o := o
			o.Stream = s
			rows[r], errs[r] = Run(context.Background(), c, o, sink)
		})
	}
	wg.Wait()
	for _, c := range comms {
		require.NoError(t, c.Close())
	}
	require.Zero(t, d.Live(), "device memory left allocated")
	require.Positive(t, waits.Load(), "no operation was ordered on a stream")
	return rows[0], out.String(), errs[0]
}

func TestDeviceSweepEveryCollective(t *testing.T) {
	for _, c := range Colls {
		t.Run(string(c), func(t *testing.T) {
			o := Options{Coll: c, MinBytes: 8, MaxBytes: 256 << 10, Factor: 16, Iters: 3, Warmup: 1, Check: 1,
				Types: []collective.DataType{collective.Float32, collective.BFloat16Type, collective.Int8}, Ops: AllOps, Root: AllRoots}
			rows, out, err := runDeviceSweep(t, 3, o)
			require.NoError(t, err, out)
			require.NotEmpty(t, rows)
			for _, r := range rows {
				require.EqualValues(t, 0, r.OutOfPlace.Wrong, "%+v", r)
				if r.InPlace != nil {
					require.EqualValues(t, 0, r.InPlace.Wrong, "%+v", r)
				}
				require.Greater(t, r.OutOfPlace.TimeUs, 0.0)
			}
		})
	}
}

func TestDeviceSweepCountsWrongElements(t *testing.T) {
	testCorrupt = func(rank int, out any) {
		if rank == 1 {
			if s, ok := out.([]float32); ok {
				s[0]++
			}
		}
	}
	defer func() { testCorrupt = nil }()
	rows, _, err := runDeviceSweep(t, 2, Options{Coll: AllReduce, MinBytes: 1 << 10, MaxBytes: 1 << 10, Factor: 2, Iters: 2, Check: 1, Blocking: true})
	require.ErrorIs(t, err, ErrWrong)
	require.Len(t, rows, 1)
	require.EqualValues(t, 1, rows[0].OutOfPlace.Wrong)
}
