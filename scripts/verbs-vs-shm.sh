#!/usr/bin/env bash
# Measures the verbs transport over the emulated RC device (GOCCL_IB_EMULATE=1;
# it is not RDMA hardware) against the shared-memory transport, 2 ranks on
# this host, alternating the runs so that drift on a noisy machine hits both
# alike: all-reduce time at 8 B and bus bandwidth at 64 MiB, medians over
# REPS runs each, and the ratios issue 14 sets (64 MiB busbw verbs/shm ≥ 0.7,
# 8 B time verbs/shm ≤ 2).
#
#   scripts/verbs-vs-shm.sh [REPS]
set -euo pipefail
reps=${1:-7}
cd "$(dirname "$0")/.."
bin=$(mktemp -d)/goccl-perf
go build -o "$bin" ./cmd/goccl-perf
export GOCCL_IB_EMULATE=1 GOCCL_IB_EMULATE_DIR=$(mktemp -d)
declare -A lat bw
for i in $(seq "$reps"); do
  for tr in shm verbs; do
    t=$("$bin" -np 2 --transport "$tr" -b 8 -e 8 -n 20000 -w 1000 | awk '$1 == 8 {print $6}')
    b=$("$bin" -np 2 --transport "$tr" -b 64M -e 64M -n 10 -w 3 | awk '$1 == 67108864 {print $8}')
    lat[$tr]+="$t "; bw[$tr]+="$b "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for tr in shm verbs; do
  echo "$tr  8 B time (us): ${lat[$tr]} median $(echo "${lat[$tr]}" | median)"
  echo "$tr  64 MiB busbw (GB/s): ${bw[$tr]} median $(echo "${bw[$tr]}" | median)"
done
ls=$(echo "${lat[shm]}" | median); lv=$(echo "${lat[verbs]}" | median)
bs=$(echo "${bw[shm]}" | median); bv=$(echo "${bw[verbs]}" | median)
awk -v ls="$ls" -v lv="$lv" -v bs="$bs" -v bv="$bv" 'BEGIN {
  printf "8 B time verbs/shm: %.2f (target <= 2)\n64 MiB busbw verbs/shm: %.2f (target >= 0.7)\n", lv/ls, bv/bs }'
