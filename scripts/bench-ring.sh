#!/usr/bin/env bash
# Side by side on this host's loopback, for 2 and 4 ranks and 64 MiB fp32:
#   (a) the ring's bus bandwidth        (bin/ring_bench)
#   (b) raw TCP ring streaming bound    (bin/ring_bench, same run)
#   (c) Open MPI MPI_Allreduce, btl tcp (bin/mpi_allreduce_bench under mpirun)
# and the goals (a) >= 0.85 (b), (a) >= 1.1 (c).
# usage: scripts/bench-ring.sh [ranks list, default "2 4"] [bytes, default 64M]
# Environment: HCOLL_CHUNK_BYTES etc. reach the ring; ITERS, REPS.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-"2 4"}
bytes=${2:-64M}
iters=${ITERS:-5}
reps=${REPS:-5}
make --no-print-directory -s bin/ring_bench >/dev/null
nbytes=$(numfmt --from=iec "$bytes")

list=$(echo "$ranks" | tr ' ' ',')
echo "== (a)+(b): bin/ring_bench -n $list -b $bytes -i $iters -r $reps"
out=$(bin/ring_bench -n "$list" -b "$bytes" -i "$iters" -r "$reps")
echo "$out" | grep -v '^RESULT'

declare -A ring raw mpi
while read -r _ n _ a b; do
  ring[${n#n=}]=${a#busbw_ring=}; raw[${n#n=}]=${b#bw_raw=}
done < <(echo "$out" | grep '^RESULT ')

if command -v mpirun >/dev/null && [ -x bin/mpi_allreduce_bench ]; then
  for n in $ranks; do
    cmd=(mpirun --allow-run-as-root --oversubscribe -np "$n" --mca pml ob1
         --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
         bin/mpi_allreduce_bench "$nbytes" "$iters" "$reps")
    echo "== (c): ${cmd[*]}"
    m=$("${cmd[@]}" 2>&1) || { echo "$m"; exit 1; }
    echo "$m" | grep '^#' || true
    mpi[$n]=$(echo "$m" | sed -n 's/^RESULT_MPI .*busbw=\([0-9.]*\).*/\1/p')
  done
else
  echo "== (c): skipped (no mpirun or bin/mpi_allreduce_bench; build with mpicc present)"
fi

echo
printf '%6s %12s %12s %12s %10s %10s\n' ranks "(a) ring" "(b) raw" "(c) MPI" "a/b" "a/c"
printf '%6s %12s %12s %12s %10s %10s\n' "" "GB/s" "GB/s" "GB/s" ">=0.85" ">=1.10"
for n in $ranks; do
  a=${ring[$n]:-nan} b=${raw[$n]:-nan} c=${mpi[$n]:-nan}
  ab=$(awk -v a="$a" -v b="$b" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "-" }')
  ac=$(awk -v a="$a" -v c="$c" 'BEGIN{ if (c+0>0) printf "%.2f", a/c; else print "-" }')
  printf '%6s %12s %12s %12s %10s %10s\n' "$n" "$a" "$b" "$c" "$ab" "$ac"
done
