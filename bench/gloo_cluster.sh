#!/usr/bin/env bash
# The sweep of bench/gloo_sweep.sh on the emulated cluster (root): N nodes x
# L rails shaped to RATE (tests/cluster/netcluster.sh, its own id g<pid>),
# bin/gloo_bench under the cluster's mpirun, so hcoll (local rank i on rail
# i), MPI_Allreduce (TCP BTL striped over every rail, vader in a node) and
# Gloo (TCP over rail 0 only: its full mesh needs one routed subnet, as in
# the torch.distributed runs of RESULTS.md) alternate call by call on the
# same ranks. First the raw TCP goodput per NIC G on the same cluster
# (tests/cluster/goodput.py, as tests/cluster/bench.sh does); at the end
# hcoll's bytes per NIC, 2(N-1)/N · S/L per call, over G.
#
#   bench/gloo_cluster.sh [--nodes 3] [--rails 2] [--rate 500mbit] [--reps 3]
#                         [--out bench/sweep-3x2-500mbit] [GLOO_BENCH FLAGS...]
#
# Per repetition: 4 KiB .. 1 MiB with 50 timed calls, 4 MiB .. 64 MiB with
# 5; -A hcoll,mpi,gloo (the other Gloo variants cost minutes per size on a
# shaped link); flags given here override. Writes OUT-goodput.txt,
# OUT-repK-{small,large}.json, OUT.md and OUT.png.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
nodes=3 rails=2 rate=500mbit reps=3 out=
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) break ;;
  esac
done
out=${out:-bench/sweep-${nodes}x$rails-$rate}
case $out in /*) ;; *) out=$PWD/$out ;; esac # -J goes to ranks started elsewhere
mkdir -p "$(dirname "$out")" || exit 1
[ "$(id -u)" -eq 0 ] || { echo "gloo_cluster: needs root (network namespaces)" >&2; exit 1; }
[ -x bin/gloo_bench ] && grep -q MPI_Allreduce bin/gloo_bench ||
  { echo "gloo_cluster: bin/gloo_bench not built with MPI (libgloo-dev, Open MPI, make)" >&2; exit 1; }
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
nc=tests/cluster/netcluster.sh
export HCC_ID=g$(($$ % 100000))
trap '"$nc" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM HUP
"$nc" up --nodes "$nodes" --rails "$rails" --rate "$rate" >&2 || exit 1

pids=()
for ((k = 0; k < nodes; k++)); do
  "$nc" exec "$k" -- python3 tests/cluster/goodput.py --node "$k" --nodes "$nodes" --rails "$rails" \
    --secs 4 --warm 1 >"$out-gp$k.tmp" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$out"-gp*.tmp >&2; echo "gloo_cluster: goodput failed" >&2; exit 1; }; done
cat "$out"-gp*.tmp >"$out-goodput.txt" && rm -f "$out"-gp*.tmp
G=$(awk '/^goodput/ { s += $NF; n++ } END { if (n) printf "%.6f", s / n }' "$out-goodput.txt")
[ -n "$G" ] || { echo "gloo_cluster: no goodput figure" >&2; exit 1; }
echo "raw TCP goodput G = $G GB/s per NIC (mean over NICs; $out-goodput.txt)"

# shellcheck disable=SC2054 # commas belong to the MCA values
mpi_args=(--mca pml ob1 --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader --mca btl_tcp_if_include
          "$(seq -s, -f 'rail%g' 0 $((rails - 1)))" -x HCOLL_SOCKET_IFNAME=rail -x HCOLL_TIMEOUT_MS=120000)
jsons=()
for k in $(seq 1 "$reps"); do
  echo "== repetition $k of $reps ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  for part in "small -b 4K -e 1M -n 50" "large -b 4M -e 64M -n 5"; do
    read -r name sizes <<<"$part"
    # shellcheck disable=SC2086
    "$nc" mpirun --deadline 1800 -- "${mpi_args[@]}" "$PWD/bin/gloo_bench" $sizes -f 4 -w 2 \
      -A hcoll,mpi,gloo --iface rail0 "$@" -J "$out-rep$k-$name.json" || exit 1
    jsons+=("$out-rep$k-$name.json")
  done
done
"$py" bench/plot_sweep.py --table "${jsons[@]}" | tee "$out.md"
"$py" - "$nodes" "$rails" "$G" "${jsons[@]}" <<'EOF' | tee -a "$out.md"
import json, statistics, sys
N, L, G = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
nic = {}
for p in sys.argv[4:]:
    for r in json.load(open(p))["rows"]:
        if r["lib"] == "hcoll" and r["bytes"] >= 64 << 20:
            nic.setdefault(r["bytes"], []).append(2 * (N - 1) / N * r["bytes"] / L / (r["mean_us"] * 1e3))
for b, v in sorted(nic.items()):
    f = [x / G for x in v]
    print(f"hcoll NIC at {b >> 20} MiB: {statistics.median(v):.4f} GB/s = "
          f"{statistics.median(f):.2f} G [{min(f):.2f}–{max(f):.2f}] (G = {G:.4f} GB/s per NIC)")
EOF
"$py" bench/plot_sweep.py -o "$out.png" \
  --title "all-reduce, float32 sum, emulated cluster $nodes nodes x $rails rails at $rate, $reps runs" \
  "${jsons[@]}" || echo "gloo_cluster: no picture (see above); the table is in $out.md"
