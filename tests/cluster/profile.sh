#!/usr/bin/env bash
# Profile (not a test), as root: what each rank of hcoll_perf costs the
# host per call on the emulated cluster, counted by `perf stat` around every
# rank (CPU time, context switches, the data path's system calls):
#   tests/cluster/profile.sh [--nodes 3] [--rails 2] [--rate 500mbit]
#                            [--size 64M] [--coll allreduce] [-n 8]
#                            [--id w2] [--env 'VAR=VALUE ...']
# Two runs per cluster, -n 2 and -n N (+1 warm-up each), so that the
# difference is N-2 timed iterations of out-of-place and in-place calls,
# 2(N-2) calls in all, without set-up and teardown; prints per rank and
# in total the counts per call. Counts, unlike times, do not depend much
# on how loaded the host is.
set -u
cd "$(dirname "$0")/../.." || exit 1
nodes=3 rails=2 rate=500mbit size=64M coll=allreduce iters=8 id=w$$ env=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --coll) coll=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --id) id=$2; shift 2 ;;
    --env) env=$2; shift 2 ;;
    *) sed -n '/^#   tests/,/^# Two/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "profile: needs root" >&2; exit 1; }
command -v perf >/dev/null || { echo "profile: no perf (apt-get install linux-perf)" >&2; exit 1; }
nc=tests/cluster/netcluster.sh
export HCC_ID=$id
tmp=$(mktemp -d /tmp/hcc-prof.XXXXXX)
cp bin/hcoll_perf "$tmp/hcoll_perf"
trap '"$nc" down >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP
"$nc" up --nodes "$nodes" --rails "$rails" --rate "$rate" >&2 || exit 1
ev=task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter
for s in sendmsg sendto recvfrom epoll_wait epoll_ctl futex poll sched_yield clock_nanosleep \
         read write; do
  ev=$ev,syscalls:sys_enter_$s
done
for n in 2 "$iters"; do
  # shellcheck disable=SC2016,SC2086 # expanded by the rank's shell; VAR=VALUE words
  "$nc" run --deadline 600 --out "$tmp/run$n" -- env HCOLL_TIMEOUT_MS=120000 $env sh -c \
    'exec perf stat -x, -e "$0" -o "$1/perf.$HCOLL_RANK" "$2" -o "$3" -b "$4" -e "$4" -n "$5" -w 1 -c 0' \
    "$ev" "$tmp/run$n" "$tmp/hcoll_perf" "$coll" "$size" "$n" >/dev/null 2>&1 ||
    { echo "profile: run -n $n failed" >&2; tail -5 "$tmp/run$n"/rank*.out >&2; exit 1; }
  grep -E "^ +[0-9]+ " "$tmp/run$n/rank0.out" | tail -1 >&2
done
python3 - "$tmp/run2" "$tmp/run$iters" $((2 * (iters - 2))) <<'EOF'
import glob, os, sys
def load(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "perf.*"))):
        r = int(f.rsplit(".", 1)[1])
        c = {}
        for line in open(f):
            w = line.strip().split(",")
            if len(w) > 2 and w[0] and w[0][0].isdigit():
                c[w[2]] = float(w[0])
        out[r] = c
    return out
a, b, calls = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
keys = list(next(iter(b.values())).keys())
short = lambda k: k.replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "syscalls")
print(f"per call ({calls} calls: the -n difference), per rank:")
print("rank " + " ".join(f"{short(k):>14s}" for k in keys))
tot = {k: 0.0 for k in keys}
for r in sorted(b):
    d = {k: (b[r].get(k, 0) - a.get(r, {}).get(k, 0)) / calls for k in keys}
    for k in keys:
        tot[k] += d[k]
    print(f"{r:4d} " + " ".join(f"{d[k]:14.1f}" for k in keys))
print(" all " + " ".join(f"{tot[k]:14.1f}" for k in keys))
print("(task-clock in ms of CPU per call)")
EOF
