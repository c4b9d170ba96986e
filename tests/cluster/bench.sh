#!/usr/bin/env bash
# Benchmark (not a test), as root: hcoll against Open MPI on the emulated
# cluster, N nodes x L rails shaped to RATE, same namespaces, same ranks,
# same buffers (hcoll_perf --peer mpi under mpirun, alternating size by
# size), for one collective, a comma list of them, or all four:
#   allreduce       MPI_Allreduce
#   reduce_scatter  MPI_Reduce_scatter_block
#   allgather       MPI_Allgather
#   broadcast       MPI_Bcast (root 0)
# Open MPI uses its TCP BTL over the same rail interfaces (every rank may
# stripe over all rails of its node) and shared memory (vader) inside a node.
# First, on the same cluster, the raw TCP goodput per NIC (goodput.py: every
# node sends on each rail to the next node's rail, all flows at once, as a
# ring does): what TCP itself delivers through these shapers on this host
# right now, the yardstick for hcoll's bytes per NIC.
#   tests/cluster/bench.sh [--coll allreduce|reduce_scatter|allgather|broadcast[,...]|all]
#                          [--nodes 4] [--rails 2] [--rate 1gbit]
#                          [-b 4K] [-e 256M] [-n 5] [--out bench]
# Writes OUT/cluster-NxL[-COLL].json and .png (gnuplot; the all-reduce's file
# has no -COLL suffix) and the tables (markdown) on stdout, with the exact
# commands.
set -u
cd "$(dirname "$0")/../.." || exit 1
nodes=4 rails=2 rate=1gbit b=4K e=256M iters=5 out=bench coll=allreduce
while [ $# -gt 0 ]; do
  case $1 in
    --coll) coll=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    -b) b=$2; shift 2 ;;
    -e) e=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--coll allreduce|reduce_scatter|allgather|broadcast[,...]|all] [--nodes N] [--rails L] [--rate R] [-b MIN] [-e MAX] [-n ITERS] [--out DIR]" >&2
       exit 2 ;;
  esac
done
[ "$coll" = all ] && coll=allreduce,reduce_scatter,allgather,broadcast
IFS=, read -r -a colls <<<"$coll"
for c in "${colls[@]}"; do
  case $c in
    allreduce|reduce_scatter|allgather|broadcast) ;;
    *) echo "bench: --coll: '$c' is not allreduce, reduce_scatter, allgather, broadcast or all" >&2
       exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (network namespaces)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench: no mpirun (Open MPI)" >&2; exit 1; }
grep -q MPI_Allreduce bin/hcoll_perf || { echo "bench: bin/hcoll_perf built without MPI" >&2; exit 1; }
nc=tests/cluster/netcluster.sh
export HCC_ID=b$$
tmp=$(mktemp -d /tmp/hcc-bench.XXXXXX)
cp bin/hcoll_perf "$tmp/hcoll_perf"
trap '"$nc" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$out"

"$nc" up --nodes "$nodes" --rails "$rails" --rate "$rate" >&2 || exit 1

# ---- raw TCP goodput per NIC, same cluster, same moment -------------------
goodput() {
  local k pids=()
  for ((k = 0; k < nodes; k++)); do
    "$nc" exec "$k" -- python3 tests/cluster/goodput.py --node "$k" --nodes "$nodes" \
      --rails "$rails" --secs 4 --warm 1 >"$tmp/gp$k.txt" 2>&1 &
    pids+=($!)
  done
  local bad=0
  for k in "${pids[@]}"; do wait "$k" || bad=1; done
  cat "$tmp"/gp*.txt >&2
  [ $bad -eq 0 ] || { echo "bench: goodput measurement failed" >&2; exit 1; }
  cat "$tmp"/gp*.txt | awk '/^goodput/ { s += $NF; n++; if (min == "" || $NF < min) min = $NF }
    END { printf "%.6f %.6f %d\n", s / n, min, n }'
}
# The host's CPU in use while G is measured (tests/cluster/cpustat.sh).
. tests/cluster/cpustat.sh
m0=$(cpu_mark)
read -r gp_mean gp_min gp_n < <(goodput)
gp_cpu=$(cpu_busy "$m0" "$(cpu_mark)")
if [ -z "${gp_n:-}" ] || [ "$gp_n" -eq 0 ]; then echo "bench: no goodput figure" >&2; exit 1; fi
echo "raw TCP goodput: mean $gp_mean GB/s per NIC over $gp_n NICs (lowest $gp_min), host CPU busy $gp_cpu %" >&2
gp_cmd="for k in 0..$((nodes - 1)): tests/cluster/netcluster.sh exec \$k -- python3 tests/cluster/goodput.py --node \$k --nodes $nodes --rails $rails --secs 4 --warm 1 &"

# 8 ranks share this host's few cores while mpirun believes each fake host
# has L free slots: without yield_when_idle, ranks waiting in MPI spin and
# starve the others (measured here: MPI_Allreduce of 4 KiB took 21 ms
# without it, 0.5 ms with it).
# shellcheck disable=SC2054 # commas belong to the MCA values
mpi_args=(--mca pml ob1 --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader --mca btl_tcp_if_include
          "$(seq -s, -f 'rail%g' 0 $((rails - 1)))" -x HCOLL_SOCKET_IFNAME=rail
          -x HCOLL_TIMEOUT_MS=120000)

for c in "${colls[@]}"; do
  tag=cluster-${nodes}x$rails
  [ "$c" = allreduce ] || tag=$tag-$c
  json=$out/$tag.json png=$out/$tag.png
  perf_args=(-o "$c" --peer mpi -b "$b" -e "$e" -f 4 -n "$iters" -w 1 -c 0 --stages -J "$json")
  command -v gnuplot >/dev/null && perf_args+=(--plot "$png")
  cmd="tests/cluster/netcluster.sh up --nodes $nodes --rails $rails --rate $rate
$gp_cmd
tests/cluster/netcluster.sh mpirun -- ${mpi_args[*]} bin/hcoll_perf ${perf_args[*]}"
  echo "$cmd" >&2
  start=$SECONDS
  "$nc" mpirun --deadline 1800 -- "${mpi_args[@]}" "$tmp/hcoll_perf" "${perf_args[@]}" \
    >"$tmp/perf-$c.txt" 2>&1
  rc=$?
  cat "$tmp/perf-$c.txt" >&2
  [ $rc -eq 0 ] || { echo "bench: $c: mpirun exit $rc" >&2; exit 1; }
  secs=$((SECONDS - start))
  load=$(cut -d' ' -f1-3 /proc/loadavg)

  python3 tests/cluster/bench_table.py "$json" "$rate" "$nodes" "$rails" "$secs" "$cmd" "$png" \
    "$gp_mean" "$gp_min" "$load" "$gp_cpu"
done
