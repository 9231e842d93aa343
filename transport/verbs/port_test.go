package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/transport/verbs/ibv"
)

// Devices are tried nearest first when a rank order is given, ties and
// nil keeping the provider's order.
func TestPreferDevices(t *testing.T) {
	devs := []ibv.DeviceInfo{{Name: "mlx5_0"}, {Name: "mlx5_1"}, {Name: "mlx5_2"}, {Name: "mlx5_3"}}
	names := func(ds []ibv.DeviceInfo) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Name)
		}
		return out
	}
	require.Equal(t, names(devs), names(preferDevices(devs, nil)))
	dist := map[string]int{"mlx5_0": 9, "mlx5_1": 9, "mlx5_2": 5, "mlx5_3": 8}
	got := preferDevices(devs, func(n string) int { return dist[n] })
	require.Equal(t, []string{"mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"}, names(got))
	require.Equal(t, "mlx5_0", devs[0].Name, "the provider's list is left as it was")
}
