#!/usr/bin/env bash
# The emulated rail-optimized cluster, end to end (root only):
#   1. correctness   N=3 x L=2, hcoll_perf -c 1 over a size sweep: #wrong all 0,
#                    for the all-reduce and (-o) the other three collectives
#   2. separation    during a large all-reduce every rail's tx bytes are
#                    within +-10% of the mean, and every rank's data sockets
#                    sit on its own rail (ss: bytes sent per socket, by owner)
#   3. bandwidth     each rail shaped to R: NIC bandwidth at 64 MiB >= 0.9 G
#                    with L=1 and with L=2 (the node's aggregate doubles), G
#                    the raw TCP goodput per NIC measured just before on the
#                    same cluster (goodput.py), so that the bound follows what
#                    this host can deliver now, not the nominal rate
#   2b. split      hcoll_comm_split by local rank: each data-parallel group's
#                  bytes on its own rail (+-10%); by node: nothing on the rails
#   4. faults        a rail set down mid-operation: every survivor exits with
#                    an error within HCOLL_LIVENESS_MS + 1 s of the fault (the
#                    set-up timeout is far longer, so liveness must find it),
#                    and a survivor's message names the rail; a rank SIGKILLed
#                    mid-operation: every survivor fails within 1 s; teardown
#                    is clean
# --small (what `make test` runs): fewer iterations and sizes, same checks,
#   but a bandwidth bar CI can hold on a loaded host: 70% of G per NIC, and
#   two rails carrying at least 1.6x what one does (each against its own G).
# Exit 77 with "SKIP: reason" when not root or namespaces are unavailable.
set -u
cd "$(dirname "$0")/../.." || exit 1
here=tests/cluster
nc=$here/netcluster.sh
build=${HCOLL_TEST_BUILD:-build}
bindir=bin
[ "$build" != build ] && [ -d "$build/bin" ] && bindir=$build/bin

small=0
[ "${1:-}" = --small ] && small=1
rate=${HCC_RATE:-1gbit}
timeout_ms=20000
liveness_ms=2000

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the emulated cluster needs root (network namespaces, veth, tc)"; exit 77
fi
for t in ip tc ss unshare; do
  command -v $t >/dev/null || { echo "SKIP: '$t' not installed"; exit 77; }
done
[ -x "$bindir/hcoll_perf" ] || { echo "FAIL: $bindir/hcoll_perf not built (make)"; exit 1; }

# A cluster id of our own, so that parallel runs and other clusters never
# collide; the trap removes it on every exit path.
id=t$$
export HCC_ID=$id
tmp=$(mktemp -d /tmp/hcc-test.XXXXXX)
# The binary under test, copied: a concurrent `make` may replace bin/.
cp "$bindir/hcoll_perf" "$tmp/hcoll_perf"
perf=$tmp/hcoll_perf
cleanup() { "$nc" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

probe=hcc-$id-probe
if ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (ip netns add failed)"; exit 77
fi
ip netns del "$probe"

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
t_start=$SECONDS
phase() { echo; echo "== [$((SECONDS - t_start))s] $*"; }
export HCOLL_TIMEOUT_MS=20000

up() { # nodes rails
  "$nc" up --nodes "$1" --rails "$2" --rate "$rate" || { fail "netcluster up $*"; exit 1; }
}

# nic_pct of the largest row, and every #wrong, from a -J file.
json_get() { # file expr
  python3 - "$1" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d['rows'] if r['impl'] == 'hcoll']
print(eval(sys.argv[2]))
EOF
}

# ---- 1. correctness -------------------------------------------------------
phase "correctness: 3 nodes x 2 rails, hcoll_perf -c 1"
up 3 2
if [ $small -eq 1 ]; then sweep=(-b 4K -e 4M -f 8 -n 2 -w 1); else sweep=(-b 1K -e 64M -f 4 -n 3 -w 1); fi
"$nc" run --deadline 120 --out "$tmp/c" -- "$perf" "${sweep[@]}" -c 1 -J "$tmp/c.json" \
  >"$tmp/c.txt"; rc=$?
cat "$tmp/c.txt"
[ $rc -eq 0 ] || fail "correctness run: exit $rc"
grep -q '3 nodes x 2 ranks/node' "$tmp/c.txt" || fail "hcoll did not see 3 nodes x 2 (HCOLL_HOSTID?)"
if [ -s "$tmp/c.json" ]; then
  wrong=$(json_get "$tmp/c.json" "sum(r['oop']['wrong'] + r['ip']['wrong'] for r in rows)")
  nrows=$(json_get "$tmp/c.json" "len(rows)")
  echo "correctness: $nrows sizes, #wrong total $wrong"
  [ "$wrong" = 0 ] || fail "#wrong = $wrong"
  [ "$nrows" -ge 3 ] || fail "only $nrows rows"
else
  fail "no JSON from the correctness run"
fi
# The other collectives on the same cluster, checked (hcoll_perf -o; a
# collective this library does not have yet exits 3 and is noted, not run).
for coll in reduce_scatter allgather broadcast; do
  "$nc" run --deadline 120 --out "$tmp/c-$coll" -- "$perf" -o $coll "${sweep[@]}" -c 1 \
    -J "$tmp/c-$coll.json" >"$tmp/c-$coll.txt"; rc=$?
  if [ $rc -eq 3 ]; then echo "correctness: -o $coll not in this library, not run"; continue; fi
  [ $rc -eq 0 ] || { fail "correctness run -o $coll: exit $rc"; continue; }
  wrong=$(json_get "$tmp/c-$coll.json" "sum(r['oop']['wrong'] + r['ip']['wrong'] for r in rows)")
  nrows=$(json_get "$tmp/c-$coll.json" "len(rows)")
  echo "correctness: -o $coll: $nrows sizes, #wrong total $wrong"
  [ "$wrong" = 0 ] || fail "-o $coll: #wrong = $wrong"
  [ "$nrows" -ge 3 ] || fail "-o $coll: only $nrows rows"
done
# rank i binds rail i: the library says so at INFO; cheaper to check the
# line rate source, read by rank 0 from tc inside its namespace.
grep -q 'line rate: 0.12 GB/s per NIC (tc tbf rate of rail' "$tmp/c.txt" ||
  [ "$rate" != 1gbit ] || fail "line rate not read from tc in the namespace"

# ---- 2. rail separation ---------------------------------------------------
phase "rail separation: a large all-reduce, bytes per rail and per socket"
if [ $small -eq 1 ]; then iters=4; else iters=10; fi
"$nc" stats --raw >"$tmp/s0"
# Sample every rank's TCP sockets while the all-reduce runs: owner pid,
# local address, bytes sent. Every sample is kept and each socket counts with
# its largest figure: ranks finish at different moments, so no single sample
# holds every socket at its end.
(
  while :; do
    for k in 0 1 2; do
      ip netns exec "hcc-$id-n$k" ss -tnpiH state established 2>/dev/null
    done >>"$tmp/ss.all"
    sleep 0.3
  done
) &
sampler=$!
"$nc" run --deadline 120 --out "$tmp/s" -- "$perf" -b 64M -e 64M -n $iters -w 1 -c 0 \
  >"$tmp/s.txt"; rc=$?
kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
"$nc" stats --raw >"$tmp/s1"
grep -E '^ +[0-9]+ ' "$tmp/s.txt"
[ $rc -eq 0 ] || fail "separation run: exit $rc"
python3 - "$tmp/s0" "$tmp/s1" <<'EOF' || fail "rail byte counts not within +-10% of the mean"
import sys
def load(p):
    return {(int(a[0]), int(a[1])): int(a[2]) for a in (l.split() for l in open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
d = {k: b[k] - a[k] for k in b}
mean = sum(d.values()) / len(d)
ok = True
for (node, rail), v in sorted(d.items()):
    dev = (v - mean) / mean * 100
    print(f"  node {node} rail{rail}: {v / 1e6:9.1f} MB sent ({dev:+.1f}% of mean)")
    ok &= abs(dev) <= 10
print(f"  mean {mean / 1e6:.1f} MB per rail")
sys.exit(0 if ok else 1)
EOF
# Each rank's sockets: bytes sent from an address not on its own rail must be
# only the bootstrap's (all ranks reach the root over rail 0): < 1 %.
python3 - "$tmp/ss.all" "$tmp/s" 3 2 <<'EOF' || fail "a rank's traffic crossed onto another rank's rail"
import re, sys
ss, out, nodes, rails = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pid_rank = {}
for r in range(nodes * rails):
    pid_rank[int(open(f"{out}/rank{r}.pid").read())] = r
own, other = {}, {}
# ss -i: a socket's line "RecvQ SendQ LOCAL:PORT PEER:PORT users:((...pid=P..))",
# then its details on the next, indented line (bytes_sent:N).
best = {}  # (local, peer, pid) -> largest bytes_sent seen
cur = None
for line in open(ss):
    m = re.match(r'\s*\d+\s+\d+\s+((\d+\.\d+\.\d+\.\d+):\d+)\s+(\S+)\s+users:\(\("[^"]*",pid=(\d+)', line)
    if m:
        cur = (m.group(1), m.group(3), int(m.group(4)), m.group(2))
        continue
    sent = re.search(r'bytes_sent:(\d+)', line)
    if cur and sent and cur[2] in pid_rank:
        best[cur] = max(best.get(cur, 0), int(sent.group(1)))
    cur = None
for (_, _, pid, addr), v in best.items():
    r = pid_rank[pid]
    d = own if int(addr.split('.')[2]) == r % rails else other
    d[r] = d.get(r, 0) + v
ok = bool(own)
for r in range(nodes * rails):
    o, x = own.get(r, 0), other.get(r, 0)
    share = 100.0 * x / (o + x) if o + x else 0
    print(f"  rank {r} (node {r // rails}, local rank {r % rails}): {o / 1e6:8.1f} MB on rail{r % rails}, "
          f"{x / 1e3:8.1f} kB on other rails ({share:.3f}%)")
    ok &= o > 0 and share < 1.0
sys.exit(0 if ok else 1)
EOF

# ---- 2b. split communicators keep their rails ----------------------------
# color = local rank: two communicators of one rank per node all-reduce at
# once, local rank 0's group 8 MiB, local rank 1's group 4 MiB, so each
# rail's counter shows which group ran on it (a group left on rail 0 would
# double rail0 and leave rail1 empty). color = node: intra-node only, the
# rails carry nothing but set-up bytes. ~2 s.
phase "split: data-parallel groups keep their rails; node groups stay off them"
cp "$build/tests/split_ranks" "$tmp/split_ranks" 2>/dev/null ||
  fail "$build/tests/split_ranks not built (make tests)"
split_check() { # mode
  "$nc" stats --raw >"$tmp/p0"
  # HCOLL_ALGO_MODEL=table: no init probe, whose rd bytes (about 1 MB per
  # rail and communicator) the counters would add to the groups'.
  HCOLL_ALGO_MODEL=table "$nc" run --deadline 60 --out "$tmp/sp-$1" -- "$tmp/split_ranks" "$1" 8388608 4194304 3 \
    >"$tmp/sp-$1.txt"; local rc=$?
  "$nc" stats --raw >"$tmp/p1"
  cat "$tmp/sp-$1"/rank*.out
  [ $rc -eq 0 ] || { fail "split $1: exit $rc"; return; }
  python3 - "$tmp/p0" "$tmp/p1" "$1" <<'EOF' || fail "split $1: rail bytes not as expected"
import sys
def load(p):
    return {(int(a[0]), int(a[1])): int(a[2]) for a in (l.split() for l in open(p))}
a, b, mode = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
n = 3  # a ring of one rank per node: each rank sends 2(n-1)/n of its vector
want = {0: 2 * (n - 1) / n * 8388608 * 3, 1: 2 * (n - 1) / n * 4194304 * 3}
ok = True
for (node, rail), v in sorted((k, b[k] - a[k]) for k in b):
    if mode == "rail":
        dev = (v - want[rail]) / want[rail] * 100
        good = abs(dev) <= 10
        print(f"  node {node} rail{rail}: {v / 1e6:7.2f} MB, expected {want[rail] / 1e6:.2f} ({dev:+.1f}%)")
    else:
        good = v < 0.02 * want[1]  # set-up only: a few kB
        print(f"  node {node} rail{rail}: {v / 1e3:8.1f} kB (intra-node groups: set-up bytes only)")
    ok &= good
sys.exit(0 if ok else 1)
EOF
}
split_check rail
split_check node

# ---- 3. bandwidth adds up -------------------------------------------------
if [ $small -eq 1 ]; then iters=3; else iters=8; fi
# The full run holds the design goal, 90% per NIC. The small run is part of
# `make test`, where a speed goal must not make CI flaky on a loaded 2-core
# host: it asks 70% per NIC and, below, that the node's aggregate grows by
# 1.6x with the second rail, which still fails if two ranks ever share a
# rail. Both against G, the raw TCP goodput per NIC measured right before
# each try on the same cluster (every node sending on each rail to the next
# node, all flows at once, as the ring does): the shaped rate R is what the
# wire allows, G what TCP on this host delivers through it at the moment.
if [ $small -eq 1 ]; then min_frac=0.70; else min_frac=0.90; fi
goodput() { # nodes rails: mean GB/s per NIC
  local k pids=()
  for ((k = 0; k < $1; k++)); do
    "$nc" exec "$k" -- python3 "$here/goodput.py" --node "$k" --nodes "$1" --rails "$2" \
      --secs 2 --warm 0.5 >"$tmp/gp$k.txt" 2>&1 &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k"; done
  cat "$tmp"/gp*.txt | awk '/^goodput/ { s += $NF; n++ } END { if (n) printf "%.6f\n", s / n }'
}
declare -A frac
for L in 1 2; do
  phase "bandwidth: 3 nodes x $L rail(s), each rail $rate, 64 MiB"
  up 3 $L
  best=0
  # The host has few cores and other work: one retry, reported as such.
  for try in 1 2; do
    rm -f "$tmp"/gp*.txt
    gp=$(goodput 3 $L)
    [ -n "$gp" ] || { fail "L=$L: goodput.py measured nothing: $(cat "$tmp"/gp*.txt)"; break; }
    "$nc" run --deadline 120 --out "$tmp/b$L" -- "$perf" -b 64M -e 64M -n $iters -w 1 -c 0 \
      -J "$tmp/b$L.json" >"$tmp/b$L.txt"; rc=$?
    grep -E '^ +[0-9]+ |line rate' "$tmp/b$L.txt"
    [ $rc -eq 0 ] || { fail "bandwidth run L=$L: exit $rc"; break; }
    pct=$(json_get "$tmp/b$L.json" "'%.1f' % rows[-1]['nic_pct']")
    gbs=$(json_get "$tmp/b$L.json" "'%.4f' % rows[-1]['nic_GBps']")
    best=$(awk -v g="$gbs" -v p="$gp" 'BEGIN { printf "%.3f", g / p }')
    echo "L=$L try $try: NIC ${gbs} GB/s = ${best} G (raw TCP goodput ${gp} GB/s per NIC) = ${pct}% of line rate; node aggregate $(awk -v g="$gbs" -v l=$L 'BEGIN{printf "%.3f", g*l}') GB/s"
    awk -v f="$best" -v m=$min_frac 'BEGIN { exit !(f >= m) }' && break
  done
  frac[$L]=$best
  awk -v f="$best" -v m=$min_frac 'BEGIN { exit !(f >= m) }' ||
    fail "L=$L: NIC bandwidth ${best} G < ${min_frac} G"
done
# Two rails carry twice what one does (per-NIC share of G x rails).
if awk -v a="${frac[1]}" -v b="${frac[2]}" 'BEGIN { exit !(a > 0 && 2 * b >= 1.6 * a) }'; then
  echo "aggregate: 2 rails carry $(awk -v a="${frac[1]}" -v b="${frac[2]}" 'BEGIN{printf "%.2f", 2*b/a}')x what 1 rail does"
else
  fail "aggregate: 2 rails carry only $(awk -v a="${frac[1]}" -v b="${frac[2]}" 'BEGIN{printf "%.2f", (a > 0 ? 2*b/a : 0)}')x what 1 rail does (want >= 1.6x)"
fi

# ---- 4. faults ------------------------------------------------------------
# The all-reduce must be running when the fault comes: wait until node 0's
# rail 0 has sent 40 MB more than before the run (the set-up sends a few kB;
# one 64 MiB all-reduce sends ~45 MB per rail).
rail_tx() { ip netns exec "hcc-$id-n0" cat /sys/class/net/rail0/statistics/tx_bytes; }
fault_run() { # name; then the fault command in "$@" after the run starts
  local name=$1; shift
  local base waited=0
  base=$(rail_tx)
  HCOLL_TIMEOUT_MS=$timeout_ms HCOLL_LIVENESS_MS=$liveness_ms \
    "$nc" run --deadline 60 --out "$tmp/$name" -- \
    "$perf" -b 64M -e 64M -n 200 -w 0 -c 0 >"$tmp/$name.txt" 2>&1 &
  local runner=$!
  until [ $(($(rail_tx) - base)) -gt 40000000 ]; do
    sleep 0.1; waited=$((waited + 1))
    [ $waited -gt 300 ] && { fail "$name: no all-reduce traffic after 30 s"; break; }
  done
  local t_fault=$EPOCHREALTIME
  "$@"
  wait $runner
  echo "$t_fault" >"$tmp/$name.fault"
}
check_survivors() { # name victim_rank|-1 limit_ms [text one survivor's first error must hold]
  python3 - "$tmp/$1" "$(cat "$tmp/$1.fault")" "$2" "$3" 6 "${4:-}" <<'EOF'
import sys
out, t_fault, victim, limit, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
want = sys.argv[6]
ok = True
worst = 0
named = not want
for r in range(n):
    rc = open(f"{out}/rank{r}.rc").read().strip()
    dt = float(open(f"{out}/rank{r}.end").read()) - t_fault
    if r == victim:
        print(f"  rank {r}: killed (exit {rc})")
        continue
    first = next((l.strip() for l in open(f"{out}/rank{r}.out") if 'WARN' in l or 'hcoll_perf:' in l), '')
    good = rc not in ('0', '137') and dt <= limit / 1000
    worst = max(worst, dt)
    print(f"  rank {r}: exit {rc} {dt:.2f} s after the fault {'ok' if good else 'LATE/WRONG'}: {first[:220]}")
    ok &= good
    named |= bool(want) and want in first
print(f"  slowest survivor: {worst:.2f} s after the fault (limit {limit / 1000:.1f} s)")
if not named:
    print(f"  no survivor's first error says '{want}'")
sys.exit(0 if ok and named else 1)
EOF
}

phase "fault: rail1 of node 1 set down mid-operation (HCOLL_LIVENESS_MS=$liveness_ms, HCOLL_TIMEOUT_MS=$timeout_ms)"
up 3 2
fault_run raildown ip -n "hcc-$id-n1" link set rail1 down
check_survivors raildown -1 $((liveness_ms + 1000)) "rail 1 (rail1" ||
  fail "rail down: a survivor did not fail within liveness + 1 s, or none named the rail"

phase "fault: rank 3 (node 1, local rank 1) SIGKILLed mid-operation"
up 3 2
kill_rank() { kill -KILL "$(cat "$tmp/rankkill/rank3.pid")"; }
fault_run rankkill kill_rank
check_survivors rankkill 3 1000 || fail "rank kill: a survivor did not fail within 1 s"

phase "teardown"
"$nc" down || fail "netcluster down"
left=$(ip netns list | awk '{print $1}' | grep -c "^hcc-$id-")
[ "$left" -eq 0 ] || fail "$left namespace(s) left after down"
left_procs=$(pgrep -f "$tmp/hcoll_perf" | wc -l)
[ "$left_procs" -eq 0 ] || fail "$left_procs hcoll_perf process(es) left"

echo
echo "summary: NIC bandwidth at 64 MiB over raw TCP goodput: L=1 ${frac[1]:-?} G, L=2 ${frac[2]:-?} G; $((SECONDS - t_start)) s"
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "cluster: all good"
