#!/usr/bin/env bash
# Benchmark (not a test), as root: hcoll against Open MPI's MPI_Allreduce on
# the emulated cluster, N nodes x L rails shaped to RATE, same namespaces,
# same ranks, same buffers (hcoll_perf --peer mpi under mpirun, alternating
# size by size). Open MPI uses its TCP BTL over the same rail interfaces
# (every rank may stripe over all rails of its node) and shared memory
# (vader) inside a node.
#   tests/cluster/bench.sh [--nodes 4] [--rails 2] [--rate 1gbit]
#                          [-b 4K] [-e 256M] [-n 5] [--out bench]
# Writes OUT/cluster-NxL.json, OUT/cluster-NxL.png (gnuplot) and the table
# (markdown) on stdout, with the exact command.
set -u
cd "$(dirname "$0")/../.." || exit 1
nodes=4 rails=2 rate=1gbit b=4K e=256M iters=5 out=bench
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    -b) b=$2; shift 2 ;;
    -e) e=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--nodes N] [--rails L] [--rate R] [-b MIN] [-e MAX] [-n ITERS] [--out DIR]" >&2
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
tag=cluster-${nodes}x$rails
json=$out/$tag.json png=$out/$tag.png

"$nc" up --nodes "$nodes" --rails "$rails" --rate "$rate" >&2 || exit 1
perf_args=(--peer mpi -b "$b" -e "$e" -f 4 -n "$iters" -w 1 -c 0 -J "$json")
command -v gnuplot >/dev/null && perf_args+=(--plot "$png")
# 8 ranks share this host's few cores while mpirun believes each fake host
# has L free slots: without yield_when_idle, ranks waiting in MPI spin and
# starve the others (measured here: MPI_Allreduce of 4 KiB took 21 ms
# without it, 0.5 ms with it).
# shellcheck disable=SC2054 # commas belong to the MCA values
mpi_args=(--mca pml ob1 --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader --mca btl_tcp_if_include
          "$(seq -s, -f 'rail%g' 0 $((rails - 1)))" -x HCOLL_SOCKET_IFNAME=rail
          -x HCOLL_TIMEOUT_MS=120000)
cmd="tests/cluster/netcluster.sh up --nodes $nodes --rails $rails --rate $rate
tests/cluster/netcluster.sh mpirun -- ${mpi_args[*]} bin/hcoll_perf ${perf_args[*]}"
echo "$cmd" >&2
start=$SECONDS
"$nc" mpirun --deadline 1800 -- "${mpi_args[@]}" "$tmp/hcoll_perf" "${perf_args[@]}" \
  >"$tmp/perf.txt" 2>&1
rc=$?
cat "$tmp/perf.txt" >&2
[ $rc -eq 0 ] || { echo "bench: mpirun exit $rc" >&2; exit 1; }
secs=$((SECONDS - start))

python3 - "$json" "$rate" "$nodes" "$rails" "$secs" "$cmd" "$png" <<'EOF'
import json, os, sys
path, rate, N, L, secs, cmd, png = sys.argv[1:8]
d = json.load(open(path))
N, L = int(N), int(L)
n = d['nranks']
rows = d['rows']
def size(b):
    for u, m in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if b >= m:
            return f"{b // m} {u}"
    return f"{b} B"
def best(x):
    return min(x['oop']['time_us'], x['ip']['time_us'])
line = d['line_rate_GBps']
print(f"{N} nodes x {L} rails, {n} ranks, each rail {rate} each way "
      f"(line rate {line} GB/s per NIC, {d['line_rate_source']}); float32 sum; "
      f"times are the faster of out-of-place and in-place, each the mean of the "
      f"iterations, maximum over ranks. Sweep took {secs} s.\n")
print("```\n" + cmd + "\n```\n")
print("| size | hcoll time (us) | hcoll busbw (GB/s) | hcoll NIC (GB/s) | hcoll NIC % of R "
      "| Open MPI time (us) | Open MPI busbw (GB/s) | hcoll / Open MPI busbw |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
hc = [r for r in rows if r['impl'] == 'hcoll']
mp = {r['size']: r for r in rows if r['impl'] == 'mpi'}
for r in hc:
    m = mp.get(r['size'])
    hb = max(r['oop']['busbw'], r['ip']['busbw'])
    mb = max(m['oop']['busbw'], m['ip']['busbw']) if m else None
    cells = [size(r['size']), f"{best(r):.0f}", f"{hb:.3f}", f"{r['nic_GBps']:.4f}",
             f"{r['nic_pct']:.1f}",
             f"{best(m):.0f}" if m else "-", f"{mb:.3f}" if m else "-",
             f"{hb / mb:.2f}x" if m and mb > 0 else "-"]
    print("| " + " | ".join(cells) + " |")
print()
big = [r for r in hc if r['size'] >= 64 << 20]
if big:
    pct = min(r['nic_pct'] for r in big)
    ratios = [max(r['oop']['busbw'], r['ip']['busbw']) /
              max(mp[r['size']]['oop']['busbw'], mp[r['size']]['ip']['busbw'])
              for r in big if r['size'] in mp]
    print(f"Goals at >= 64 MiB: hcoll NIC >= 95% of R: lowest {pct:.1f}% "
          f"({'met' if pct >= 95 else 'NOT met'}); hcoll busbw >= 1.3x Open MPI's: lowest "
          f"{min(ratios):.2f}x ({'met' if min(ratios) >= 1.3 else 'NOT met'}).")
if os.path.exists(png):
    print(f"\nPlot: `{png}` (busbw and NIC % against size, from hcoll_perf --plot).")
EOF
