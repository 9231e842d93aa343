#!/usr/bin/env bash
# Two "hosts" (network namespaces joined by veth pairs, tc tbf at RATE on
# both ends of each, as ../shared/baselines/netns_setup.sh builds them),
# goccl-perf's all-reduce between them, alternating the runs so that drift
# on a noisy machine hits all cases alike. Prints each run's busbw at SIZE
# and the 8 B time, then the medians and the ratio the issue sets.
#
# MODE=placement (default): one veth pair, two ranks per host, in block
# placement (ranks 0,1 on host A, 2,3 on B) and round robin (0,2 on A, 1,3
# on B); target round-robin/block >= 0.9.
# MODE=nics: two veth pairs (two rails, 10.98.0.0/24 and 10.98.1.0/24), one
# rank per host, GOCCL_SOCKET_IFNAME naming one (=vx0) and both (vx);
# target two/one >= 1.8.
# MODE=hier: one veth pair, two ranks per host in block placement, the
# flat ring (-algo ring) against the tuner's choice (the hierarchical
# all-reduce at 64 MiB; the hierarchical reduce-scatter and all-gather at
# every size); prints hier/ring.
# MODE=iperf: one veth pair, one rank per host, against iperf3 -t 3 over
# the same link (GB/s, from its receiver's bits per second); prints
# goccl/iperf3 (target >= 0.95). For 2 ranks busbw = algbw = the bytes
# each direction moves per second. iperf3 moves one direction:
# COLL=broadcast is the like-for-like stream (out of place, so the root
# also copies its buffer), the all-reduce moves both at once.
# Needs root. BIN may name several goccl-perf binaries (A/B of two builds).
# COLL names goccl-perf's collective (default all_reduce).
#
#   sudo scripts/hosts-bench.sh [REPS]        # MODE=placement RATE=10gbit SIZE=64M COLL=all_reduce BIN=...
set -euo pipefail
reps=${1:-5}
mode=${MODE:-placement}
rate=${RATE:-10gbit}
size=${SIZE:-64M}
coll=${COLL:-all_reduce}
# The latency row: 8 B; for reduce-scatter and all-gather, whose size
# counts every rank's block, 32 B (8 B a rank of four).
small=8; case $coll in reduce_scatter|all_gather) small=32 ;; esac
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  BIN=$(mktemp -d)/goccl-perf
  go build -o "$BIN" ./cmd/goccl-perf
fi
a=gbh$$a b=gbh$$b
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
rails=1; [ "$mode" = nics ] && rails=2
for j in $(seq 0 $((rails - 1))); do
  ip link add vx$j netns "$a" type veth peer name vx$j netns "$b"
  ip -n "$a" addr add 10.98.$j.1/24 dev vx$j
  ip -n "$b" addr add 10.98.$j.2/24 dev vx$j
  for ns in "$a" "$b"; do
    ip -n "$ns" link set vx$j up
    [ "$rate" = none ] || ip netns exec "$ns" tc qdisc add dev vx$j root tbf rate "$rate" burst 4mb latency 10ms
  done
done
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
addr() { [ "$1" = "$a" ] && echo 10.98.0.1 || echo 10.98.0.2; }
port=29700
# run BIN PLACEMENT ARGS...: PLACEMENT is each rank's host, "a a b b";
# prints rank 0's table.
run() {
  local bin=$1 place=($2) pids=() r out
  shift 2
  port=$((port + 1))
  local sec root
  sec=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local h0=${place[0]}; h0=${!h0}
  root=$(addr "$h0"):$port
  out=$(mktemp)
  for r in "${!place[@]}"; do
    local h=${place[$r]}; h=${!h}
    ip netns exec "$h" env ${IFNAME:+GOCCL_SOCKET_IFNAME=$IFNAME} GOCCL_RANK="$r" GOCCL_WORLD_SIZE=${#place[@]} GOCCL_ROOT="$root" GOCCL_SECRET="$sec" \
      GOCCL_HOSTID="$h" "$bin" "$@" > "$out.$r" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [ "$rc" != 0 ]; then cat "$out".* >&2; return 1; fi
  cat "$out.0"; rm -f "$out" "$out".*
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
declare -A bw lat
bytes=$(numfmt --from=iec "$size")
cases="block rr"; [ "$mode" = nics ] && cases="one two"; [ "$mode" = hier ] && cases="ring hier"
[ "$mode" = iperf ] && cases="iperf3 goccl"
for i in $(seq "$reps"); do
  for bin in $BIN; do
    for p in $cases; do
      extra=()
      case $p in
      block) place="a a b b" IFNAME= ;;
      rr) place="a b a b" IFNAME= ;;
      one) place="a b" IFNAME==vx0 ;;
      two) place="a b" IFNAME=vx ;;
      ring) place="a a b b" IFNAME= extra=(-algo ring) ;;
      hier) place="a a b b" IFNAME= ;;
      esac
      if [ $p = iperf3 ]; then
        ip netns exec "$b" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
        sleep 0.5
        t=$(ip netns exec "$a" iperf3 -c 10.98.0.2 -p 5299 -t 3 -J | awk -F: '/"sum_received"/ {r=1} r && /bits_per_second/ {gsub(/[ ,]/, "", $2); printf "%.3f\n", $2/8e9; exit}')
        wait
        l=0
        bw[$bin.$p]+="$t "; lat[$bin.$p]+="$l "
        echo "round $i iperf3: $t GB/s"
        continue
      fi
      [ $p = goccl ] && place="a b"
      t=$(run "$bin" "$place" -C "$coll" "${extra[@]}" -b "$size" -e "$size" -n 5 -w 2 -a 3 | awk -v s="$bytes" '$1 == s {print $8}')
      l=$(run "$bin" "$place" -C "$coll" "${extra[@]}" -b "$small" -e "$small" -n 2000 -w 200 -a 3 | awk -v s="$small" '$1 == s {print $6}')
      bw[$bin.$p]+="$t "; lat[$bin.$p]+="$l "
      echo "round $i $(basename "$(dirname "$bin")")/$p: busbw $t GB/s, $small B $l us"
    done
  done
done
set -- $cases
for bin in $BIN; do
  for p in $cases; do
    echo "$bin $p: $coll $size busbw median $(echo "${bw[$bin.$p]}" | median) GB/s; $small B median $(echo "${lat[$bin.$p]}" | median) us"
  done
  target=0.9; [ "$mode" = nics ] && target=1.8; [ "$mode" = iperf ] && target=0.95; [ "$mode" = hier ] && target=
  awk -v r="$(echo "${bw[$bin.$2]}" | median)" -v k="$(echo "${bw[$bin.$1]}" | median)" -v c="$2/$1" -v t=$target \
    'BEGIN {printf "  %s busbw: %.2f", c, r/k; if (t != "") printf " (target >= %s)", t; printf "\n"}'
done
