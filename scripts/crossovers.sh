#!/usr/bin/env bash
# Where the all-reduce algorithms cross over, against what the tuner picks.
# For each transport and rank count, every algorithm is forced in turn
# (-algo) over one sweep of sizes, the runs alternating so that drift hits
# all alike, REPS times; per size it prints each algorithm's median time,
# the fastest, and the tuner's own pick (goccl-perf's "Algorithm per size"
# lines from an unforced run), and counts the sizes where the pick is not
# within 10% of the fastest.
#
#   scripts/crossovers.sh [REPS]     # NP="2 4" TRANSPORTS="shm tcp" B=8 E=64M F=4
set -euo pipefail
reps=${1:-3}
nps=${NP:-2 4}
trs=${TRANSPORTS:-shm tcp}
b=${B:-8} e=${E:-64M} f=${F:-4}
algos="ring tree recdoubling rabenseifner oneshot"
cd "$(dirname "$0")/.."
bin=${BIN:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/goccl-perf
  go build -o "$bin" ./cmd/goccl-perf
fi
out=$(mktemp -d)
for tr in $trs; do
  for np in $nps; do
    for i in $(seq "$reps"); do
      for a in $algos auto; do
        args=(-np "$np" --transport "$tr" -b "$b" -e "$e" -f "$f" -target 0.1s -a 3 -c 1 -out-of-place-only)
        [ "$a" = auto ] || args+=(-algo "$a")
        "$bin" "${args[@]}" > "$out/$tr.$np.$a.$i" 2>&1 || { echo "$tr np=$np $a failed:"; tail -5 "$out/$tr.$np.$a.$i"; exit 1; }
      done
    done
    echo "## $tr, $np ranks: median time (us) per size; * the fastest; pick = the tuner's"
    printf "%10s" size; for a in $algos; do printf " %12s" "$a"; done; printf " %12s %14s\n" auto pick
    miss=0
    for size in $(awk '!/^#/ && NF {print $1}' "$out/$tr.$np.ring.1"); do
      declare -A med=()
      best= bt=
      for a in $algos auto; do
        m=$(for i in $(seq "$reps"); do awk -v s="$size" '!/^#/ && $1 == s {print $6}' "$out/$tr.$np.$a.$i"; done |
          sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}')
        med[$a]=$m
        if [ "$a" != auto ] && { [ -z "$bt" ] || awk -v x="$m" -v y="$bt" 'BEGIN {exit !(x < y)}'; }; then best=$a bt=$m; fi
      done
      pick=$(awk -v s="$size" '/^# Algorithm per size/ {p=1; next} p && $2 == s {print $4}' "$out/$tr.$np.auto.1")
      printf "%10s" "$size"
      for a in $algos; do
        mark=" "; [ "$a" = "$best" ] && mark="*"
        printf " %11s%s" "${med[$a]}" "$mark"
      done
      printf " %12s %14s" "${med[auto]}" "$pick"
      if awk -v x="${med[auto]}" -v y="$bt" 'BEGIN {exit !(x > 1.1 * y)}'; then printf "  (auto %.2fx the fastest)" "$(awk -v x="${med[auto]}" -v y="$bt" 'BEGIN {print x/y}')"; miss=$((miss + 1)); fi
      echo
      unset med
    done
    echo "sizes where auto is more than 10% slower than the fastest forced algorithm: $miss"
    echo
  done
done
rm -rf "$out"
