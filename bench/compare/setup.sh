#!/bin/bash
# setup.sh DIR - install the peer libraries with apt-get (Debian/Ubuntu,
# as root) and build the peer benchmarks from peers/ into DIR:
#   DIR/mpi_allreduce_perf         Open MPI (mpicc.openmpi)
#   DIR/mpi_allreduce_perf.mpich   MPICH    (mpicc.mpich)
#   DIR/gloo_perf                  Gloo     (g++ -lgloo)
# Packages already present are left alone; a peer whose packages cannot be
# installed is skipped with a message (the comparison then leaves it out).
set -u
dir=${1:?usage: setup.sh DIR}
src=$(cd "$(dirname "$0")/peers" && pwd)
mkdir -p "$dir"

need=()
command -v mpicc.openmpi >/dev/null || need+=(openmpi-bin libopenmpi-dev)
command -v mpicc.mpich >/dev/null || need+=(mpich libmpich-dev)
[ -e /usr/include/gloo/allreduce.h ] || need+=(libgloo-dev)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to apt-get install ${need[*]}" >&2
  else
    echo "setup: apt-get install ${need[*]}" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null ||
      echo "setup: apt-get install failed; building what is there" >&2
    # MPICH must not take over the generic mpicc/mpirun names.
    update-alternatives --set mpi /usr/bin/mpicc.openmpi >/dev/null 2>&1 || true
    update-alternatives --set mpirun /usr/bin/mpirun.openmpi >/dev/null 2>&1 || true
  fi
fi

build() { # name cmd...
  local name=$1
  shift
  if "$@" 2>"$dir/$name.build.log"; then
    echo "setup: built $dir/$name" >&2
  else
    echo "setup: could not build $name (see $dir/$name.build.log)" >&2
  fi
}
command -v mpicc.openmpi >/dev/null && build mpi_allreduce_perf mpicc.openmpi -O3 -o "$dir/mpi_allreduce_perf" "$src/mpi_allreduce_perf.c"
command -v mpicc.mpich >/dev/null && build mpi_allreduce_perf.mpich mpicc.mpich -O3 -o "$dir/mpi_allreduce_perf.mpich" "$src/mpi_allreduce_perf.c"
[ -e /usr/include/gloo/allreduce.h ] && build gloo_perf g++ -O3 -std=c++17 -o "$dir/gloo_perf" "$src/gloo_perf.cc" -lgloo -lpthread
exit 0
