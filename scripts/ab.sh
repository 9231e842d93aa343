#!/usr/bin/env bash
# Alternated A/B runs of goccl-perf builds and settings, with a peer beside
# them in every round: the method behind the "alternated" figures in
# docs/performance.md (these machines drift by 10-40% from minute to
# minute, so the variants run in turn, REPS times, and medians are
# compared; scripts/medians.py prints them and their ratios to the peer).
#
#   scripts/ab.sh COLL SIZE REPS NP VARIANT...
#
# A VARIANT is LABEL=BIN or LABEL=ENV=VAL... BIN: a goccl-perf binary and
# the environment it runs with, e.g.
#
#   scripts/ab.sh reduce 1M 5 2 old=/tmp/old/goccl-perf new=/tmp/new/goccl-perf
#   scripts/ab.sh broadcast 1M 5 2 "on=GOCCL_SHM_CMA=on $B" "off=GOCCL_SHM_CMA=off $B"
#
# TR=shm|tcp picks the transport (default shm), PEER=ompi|mpich|none the
# peer (default ompi; its benchmark is compare-out/bin's, built by
# `go run ./bench/compare`), TARGET the seconds each run times (0.3s).
# Each round prints one line: the peer's time, then each variant's out of
# place / in place time in µs (goccl-perf -a 3: the slowest rank's).
#
# The sections of docs/performance.md name the forms they used: ab3.sh
# (Open MPI and builds), binab.sh (builds, PEER=none), envab.sh and
# mix.sh (settings of one build).
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
coll=$1 size=$2 reps=$3 np=$4
shift 4
tr=${TR:-shm} peer=${PEER:-ompi} target=${TARGET:-0.3s}
root=$(cd "$(dirname "$0")/.." && pwd)
declare -A mpiop=([all_reduce]=allreduce [reduce_scatter]=reduce_scatter [all_gather]=allgather [broadcast]=bcast [reduce]=reduce)
op=${mpiop[$coll]:?unknown collective $coll}
case $peer in
ompi)
  btl="self,vader"
  [ "$tr" = tcp ] && btl="self,tcp --mca btl_tcp_if_include lo"
  # shellcheck disable=SC2206
  pcmd=(mpirun.openmpi --allow-run-as-root -np "$np" --oversubscribe --mca pml ob1 --mca btl $btl "$root/compare-out/bin/mpi_allreduce_perf")
  penv=()
  ;;
mpich)
  pcmd=(mpirun.mpich -np "$np" "$root/compare-out/bin/mpi_allreduce_perf.mpich")
  penv=()
  [ "$tr" = tcp ] && penv=(UCX_TLS=tcp,self UCX_NET_DEVICES=lo MPIR_CVAR_NOLOCAL=1)
  ;;
none) ;;
*) echo "PEER must be ompi, mpich or none" >&2; exit 2 ;;
esac
echo "== $coll $size np$np $tr"
for _ in $(seq "$reps"); do
  line="$peer"
  if [ "$peer" != none ]; then
    t=$(env "${penv[@]}" timeout 120 "${pcmd[@]}" -o "$op" -c 0 -T "${target%s}" -b "$size" -e "$size" 2>&1 | awk '/^ +[0-9]/ {print $6}')
    line="$line ${t:-failed}"
  else
    line="$line 1"
  fi
  for v in "$@"; do
    label=${v%%=*} rest=${v#*=}
    read -r -a words <<< "$rest"
    bin=${words[-1]}
    unset 'words[-1]'
    # The JSON's times are unrounded (the table's have two decimals,
    # too coarse below a microsecond).
    j=$(mktemp)
    t=
    if env "${words[@]}" timeout 120 "$bin" "$coll" -np "$np" --transport "$tr" -b "$size" -e "$size" -a 3 -target "$target" -c 0 -J "$j" >/dev/null 2>&1; then
      t=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("%.4g/%.4g" % (r["outOfPlace"]["timeUs"], r["inPlace"]["timeUs"]))' "$j")
    fi
    rm -f "$j"
    line="$line | $label: ${t:-failed}"
  done
  echo "$line"
done
