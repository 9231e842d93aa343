#!/usr/bin/env bash
# The GPU run of the cuda issue, in one go, on a machine with a GPU and no
# Go (an H200 here). Build first, on a development machine:
#
#   scripts/gpu-build.sh          # makes .gpu/: goccl-perf, cuda.test, torch_cuda_perf.py
#
# then, on the GPU machine, from the repository root:
#
#   scripts/gpu-check.sh [.gpu]   # outputs in $OUT (default /tmp/gpu-check)
#
# Sized to end within 8 minutes, so that it can run twice in 15 minutes of
# GPU time; every step has its own time limit and a failed step does not
# stop the others. What each step shows:
#
#  1. the driver loads and both PTX modules (sm_70, sm_90) JIT on the device;
#  2. every kernel type x operator against the host reference, bit for bit;
#  3. reduction-kernel bandwidth against a device-to-device copy, counting
#     bytes read and written (target: the reduction at >= 90% of the copy);
#  4. goccl-perf on device buffers: 2 and 4 ranks in one process, 8 B to
#     1 GiB, every result checked on the host; then 2 processes on the one
#     GPU, each sending into the other's device memory through CUDA IPC
#     (INFO names the path each connection took), and the same through
#     shared memory registered with the GPU (GOCCL_P2P_DISABLE=1);
#  5. the peers in the same run: the copy/add ceiling, torch.distributed
#     with gloo on CUDA tensors, and NCCL through torch where it accepts
#     two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30.3).
set -u
B=${1:-.gpu}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
step() { # name, limit in seconds, command...
	local name=$1 limit=$2
	shift 2
	echo "=== $name (limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
	local t0=$SECONDS
	timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
	local rc=$?
	tail -n 40 "$OUT/$name.txt"
	echo "=== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
}
step gpu 20 nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total,clocks.max.memory --format=csv
# 1-3. The test binary runs in its package directory (it reads nothing from
# there, but go test's convention is to).
step cuda 150 sh -c "cd cuda && ../$B/cuda.test -test.run GPU -test.bench GPU -test.benchtime 20x -test.v"
# 4. goccl-perf on device buffers.
step perf-local2 100 "$B/goccl-perf" all_reduce -np 2 -local --device gpu -b 8 -e 1G -f 4 -target 0.1s -a 3
step perf-local4 100 "$B/goccl-perf" all_reduce -np 4 -local --device gpu -b 8 -e 1G -f 4 -target 0.1s -a 3
step perf-colls2 60 sh -c "for c in reduce_scatter all_gather broadcast; do $B/goccl-perf \$c -np 2 -local --device gpu -b 1K -e 256M -f 16 -target 0.1s -a 3; done"
step perf-procs2 60 env GOCCL_DEBUG=INFO "$B/goccl-perf" all_reduce -np 2 --device gpu -b 8 -e 256M -f 16 -target 0.1s -a 3
step perf-procs2-host 45 env GOCCL_P2P_DISABLE=1 "$B/goccl-perf" all_reduce -np 2 --device gpu -b 8 -e 256M -f 16 -target 0.1s -a 3
# 5. The peers.
if [ -f "$B/torch_cuda_perf.py" ]; then
	step torch-ref 60 python3 "$B/torch_cuda_perf.py" --ref -b 1M -e 1G -f 4
	step torch-gloo 90 python3 "$B/torch_cuda_perf.py" -B gloo -n 2 -o all_reduce -b 8 -e 256M -f 4
	step torch-nccl 90 env NCCL_MULTI_RANK_GPU_ENABLE=1 python3 "$B/torch_cuda_perf.py" -B nccl -n 2 -o all_reduce -b 8 -e 1G -f 4
fi
cat "$OUT/summary.txt"
