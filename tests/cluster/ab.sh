#!/usr/bin/env bash
# Benchmark (not a test), as root: hcoll's bytes per NIC against the raw
# TCP goodput G of the same rails, for variants of the library's settings
# run side by side (alternating) on one emulated cluster, so that a change
# to the data path is judged against what this host's TCP delivers at the
# same moment, not against another run's figures:
#   tests/cluster/ab.sh [--nodes 3] [--rails 2] [--rate 500mbit] [--size 64M]
#                       [--coll allreduce,reduce_scatter,allgather,broadcast]
#                       [-n 3] [--reps 3] [--id w1]
#                       [--variant NAME='VAR=VALUE ...'] ...
# Each repetition measures G (goodput.py, as bench.sh does), then runs every
# collective once per variant (hcoll_perf -b SIZE -e SIZE under
# `netcluster.sh run`, no MPI), in the variants' order; the repetitions
# alternate that order. Without --variant one variant, "default", runs.
# A word BIN=PATH in a variant runs that hcoll_perf instead of bin/'s (a
# build of another commit: hcoll_perf links the library statically).
# Prints one line per run and, at the end, per collective and variant the
# NIC / G of every repetition and their spread. hcoll's NIC is the bytes
# one NIC carries per call (2(N-1)/N S/L all-reduce, (N-1)/N S/L
# reduce-scatter and all-gather, S/L broadcast) over the faster of the
# out-of-place and in-place mean times, maximum over ranks (hcoll_perf -J);
# inter/time is the share of the out-of-place call the inter-node ring took
# (--stages), the rest being intra-node stages the ring did not overlap.
# cpu% is the host's CPU in use over the whole run (all cores; set-up
# included), printed also for each G measurement: on the 2-core VM
# goodput.py alone keeps the CPU ~90 % busy in the kernel, so where both
# read ~95-100 % hcoll's own work competes with the same per-packet cost.
set -u
cd "$(dirname "$0")/../.." || exit 1
nodes=3 rails=2 rate=500mbit size=64M iters=3 reps=3 id=w$$
coll=allreduce,reduce_scatter,allgather,broadcast
names=() envs=()
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --id) id=$2; shift 2 ;;
    --variant) names+=("${2%%=*}"); envs+=("${2#*=}"); shift 2 ;;
    *) sed -n '/^#   tests/,/^# Each/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { names=(default); envs=(""); }
[ "$(id -u)" -eq 0 ] || { echo "ab: needs root (network namespaces)" >&2; exit 1; }
IFS=, read -r -a colls <<<"$coll"
nc=tests/cluster/netcluster.sh
export HCC_ID=$id
tmp=$(mktemp -d /tmp/hcc-ab.XXXXXX)
cp bin/hcoll_perf "$tmp/hcoll_perf"
trap '"$nc" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
"$nc" up --nodes "$nodes" --rails "$rails" --rate "$rate" >&2 || exit 1

goodput() {
  local k pids=()
  for ((k = 0; k < nodes; k++)); do
    "$nc" exec "$k" -- python3 tests/cluster/goodput.py --node "$k" --nodes "$nodes" \
      --rails "$rails" --secs 4 --warm 1 >"$tmp/gp$k.txt" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k"; done
  cat "$tmp"/gp*.txt | awk '/^goodput/ { s += $NF; n++ } END { if (n) printf "%.6f\n", s / n }'
}

# A NIC / G below 1 with the CPU busy in both measurements says the bound
# is this host's CPU, not the rails.
. tests/cluster/cpustat.sh

res=$tmp/results.txt
: >"$res"
for ((rep = 0; rep < reps; rep++)); do
  m0=$(cpu_mark)
  g=$(goodput)
  gcpu=$(cpu_busy "$m0" "$(cpu_mark)")
  [ -n "$g" ] || { echo "ab: goodput measurement failed" >&2; cat "$tmp"/gp*.txt >&2; exit 1; }
  echo "rep $rep: G = $g GB/s per NIC, host CPU busy $gcpu % (load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "$gcpu" >>"$tmp/gcpu.txt"
  order=()
  for ((v = 0; v < ${#names[@]}; v++)); do order+=("$v"); done
  if ((rep % 2)); then
    for ((v = 0; v < ${#names[@]}; v++)); do order[v]=$((${#names[@]} - 1 - v)); done
  fi
  for c in "${colls[@]}"; do
    for v in "${order[@]}"; do
      json=$tmp/r.json bin=$tmp/hcoll_perf words=()
      for w in ${envs[v]}; do
        case $w in BIN=*) bin=${w#BIN=} ;; *) words+=("$w") ;; esac
      done
      rm -f "$json"
      m0=$(cpu_mark)
      "$nc" run --deadline 300 --out "$tmp/run" -- env HCOLL_TIMEOUT_MS=120000 "${words[@]}" \
        "$bin" -o "$c" -b "$size" -e "$size" -n "$iters" -w 1 -c 0 --stages -J "$json" \
        >"$tmp/run.log" 2>&1
      rc=$?
      hcpu=$(cpu_busy "$m0" "$(cpu_mark)")
      if [ $rc -ne 0 ] || [ ! -s "$json" ]; then
        echo "ab: $c ${names[v]}: run failed (rc $rc)" >&2
        tail -5 "$tmp"/run/rank0.out "$tmp/run.log" >&2
        continue
      fi
      python3 - "$json" "$g" "$c" "${names[v]}" "$rep" "$hcpu" <<'EOF' | tee -a "$res"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d['rows'] if isinstance(d, dict) else d
r = [x for x in rows if x.get('impl', 'hcoll') == 'hcoll'][-1]
g = float(sys.argv[2])
t = min(r['oop']['time_us'], r['ip']['time_us'])
st = r.get('stages_us') or {}
inter = st.get('inter')
share = f"{inter / t:.3f}" if inter else "-"
print(f"{sys.argv[3]} {sys.argv[4]} rep {sys.argv[5]} time_us {t:.0f} inter/time {share} "
      f"cpu% {sys.argv[6]} nic {r['nic_GBps']:.5f} G {g:.5f} ratio {r['nic_GBps'] / g:.3f}")
EOF
    done
  done
done
echo
echo "summary: NIC / G per repetition (${nodes}x$rails @ $rate, $size, -n $iters)"
echo "host CPU busy while G was measured: $(tr '\n' ' ' <"$tmp/gcpu.txt")%"
python3 - "$res" <<'EOF'
import sys, collections
d, cpu = collections.OrderedDict(), {}
for line in open(sys.argv[1]):
    w = line.split()
    d.setdefault((w[0], w[1]), []).append(float(w[-1]))
    cpu.setdefault((w[0], w[1]), []).append(w[w.index("cpu%") + 1])
for (c, v), xs in d.items():
    print(f"{c:15s} {v:12s} " + " ".join(f"{x:.3f}" for x in xs) +
          f"   mean {sum(xs) / len(xs):.3f}  spread {min(xs):.3f}-{max(xs):.3f}"
          f"  cpu% {' '.join(cpu[(c, v)])}")
EOF
