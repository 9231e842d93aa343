#!/usr/bin/env bash
# Builds, on a development machine, what scripts/gpu-check.sh runs on a GPU
# machine that has no Go toolchain: static-enough binaries (CGO_ENABLED=0,
# the CUDA driver is loaded at run time) and the torch baseline, in .gpu/
# (ignored by git; carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
mkdir -p .gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
CGO_ENABLED=0 go build -o .gpu/goccl-perf ./cmd/goccl-perf
CGO_ENABLED=0 go test -c -o .gpu/cuda.test ./cuda
baseline=../shared/baselines/torch_cuda_perf.py
if [ -f "$baseline" ]; then
	cp "$baseline" .gpu/
else
	echo "gpu-build: $baseline not found: the torch peers will be skipped" >&2
fi
ls -l .gpu
