package topology

// For the external tests (nvml_ext_test.go, which needs package gonvml,
// itself importing this one).
var (
	ClearLines = clearLines
	BuildT     = build
)
