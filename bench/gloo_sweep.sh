#!/usr/bin/env bash
# The all-reduce sweep of bench/RESULTS.md ("hcoll, Open MPI and Gloo"):
# 2 emulated nodes x 2 ranks on loopback, bin/gloo_bench under mpirun, so
# hcoll, MPI_Allreduce and Gloo's algorithms alternate call by call on the
# same 4 processes; REPS runs, each its own JSON; then the table and the
# picture from them (bench/plot_sweep.py).
#
#   bench/gloo_sweep.sh [--reps 3] [--out bench/sweep-2x2-lo] [GLOO_BENCH FLAGS...]
#
# Each repetition is two runs: 4 KiB .. 1 MiB with 200 timed calls per size
# and library (enough calls for a p99), then 4 MiB .. 64 MiB with 20;
# -w 5, --ranks-per-node 2; flags given here override those of both runs.
# Writes OUT-repK-small.json, OUT-repK-large.json, OUT.md (the table) and
# OUT.png.
# Open MPI as in perf-run and RESULTS.md: TCP between ranks over lo, its
# shared memory (vader) within the host, mpi_yield_when_idle 1 (4 ranks on
# fewer cores: it would otherwise spin while it waits).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3 out=bench/sweep-2x2-lo
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -x bin/gloo_bench ] || { echo "gloo_sweep: bin/gloo_bench is not built (libgloo-dev, make)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "gloo_sweep: needs Open MPI's mpirun" >&2; exit 1; }
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
export HCOLL_SOCKET_IFNAME=lo HCOLL_TIMEOUT_MS=${HCOLL_TIMEOUT_MS:-120000}
jsons=()
for k in $(seq 1 "$reps"); do
  echo "== repetition $k of $reps ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  for part in "small -b 4K -e 1M -n 200" "large -b 4M -e 64M -n 20"; do
    read -r name sizes <<<"$part"
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 \
      --mca btl tcp,self,vader --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
      --mca mpi_yield_when_idle 1 -x HCOLL_SOCKET_IFNAME -x HCOLL_TIMEOUT_MS \
      bin/gloo_bench $sizes -f 4 -w 5 --ranks-per-node 2 "$@" -J "$out-rep$k-$name.json"
    jsons+=("$out-rep$k-$name.json")
  done
done
"$py" bench/plot_sweep.py --table "${jsons[@]}" | tee "$out.md"
"$py" bench/plot_sweep.py -o "$out.png" \
  --title "all-reduce, float32 sum, 2 emulated nodes x 2 ranks on loopback, $reps runs" "${jsons[@]}" ||
  echo "gloo_sweep: no picture (see above); the table is in $out.md"
