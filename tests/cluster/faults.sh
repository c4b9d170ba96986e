#!/usr/bin/env bash
# The fault matrix on the emulated rail-optimized cluster (root only;
# tests/cluster/netcluster.sh): 3 nodes x 2 rails at RATE, hcoll_perf
# all-reducing 64 MiB vectors, and mid-operation one of
#   raildown  node 1's rail 1 set down (ip link set down)
#   kill      rank 3 (node 1, local rank 1) SIGKILLed
#   stop      rank 3 SIGSTOPped (killed once the others have ended)
#   cut       node 1's namespace cut off: every packet to or from its rails
#             dropped silently (tc ingress filters on both ends, see
#             ingress_drop: where gact exists, `action gact drop` does it)
#   drop      1 % of the packets on node 1's rail 0 dropped at random, both
#             ways (the same filters, random; with gact: `gact pass random
#             netrand drop 100`)
# Each failure, each trial: every survivor (every rank but a killed or
# stopped one) exits with an error within HCOLL_LIVENESS_MS + 1 s of the
# fault, and its first error names a peer rank and a rail (or, for shared
# memory, the local rank); at least one survivor names the faulty rank or
# rail itself. The random drop: the run must succeed with every result
# right (hcoll_perf -c), and its time against a run without the drop on the
# same cluster is the slowdown.
#
#   faults.sh [--trials N] [--only KIND[,KIND...]]   (default 20 trials each)
#
# Prints one row per kind: trials, passed, worst and median detection time
# (s after the fault), and for drop the slowdown. Exit 0 when every trial
# passed; 77 (SKIP) when not root or namespaces are unavailable.
set -u
cd "$(dirname "$0")/../.." || exit 1
nc=tests/cluster/netcluster.sh
build=${HCOLL_TEST_BUILD:-build}
bindir=bin
[ "$build" != build ] && [ -d "$build/bin" ] && bindir=$build/bin

trials=20 only="raildown,kill,stop,cut,drop"
while [ $# -gt 0 ]; do
  case $1 in
    --trials) trials=${2:-}; shift 2 ;;
    --only) only=${2:-}; shift 2 ;;
    *) echo "usage: $0 [--trials N] [--only raildown,kill,stop,cut,drop]" >&2; exit 2 ;;
  esac
done
[[ $trials =~ ^[0-9]+$ ]] && [ "$trials" -ge 1 ] || { echo "--trials: a number >= 1" >&2; exit 2; }

rate=${HCC_RATE:-1gbit}
liveness_ms=${HCC_LIVENESS_MS:-2000}
timeout_ms=20000
nodes=3 rails=2 nranks=6 victim=3

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the emulated cluster needs root (network namespaces, veth, tc)"; exit 77
fi
for t in ip tc unshare python3; do
  command -v $t >/dev/null || { echo "SKIP: '$t' not installed"; exit 77; }
done
[ -x "$bindir/hcoll_perf" ] || { echo "FAIL: $bindir/hcoll_perf not built (make)"; exit 1; }

id=f$$
export HCC_ID=$id
tmp=$(mktemp -d /tmp/hcc-faults.XXXXXX)
cp "$bindir/hcoll_perf" "$tmp/hcoll_perf"
perf=$tmp/hcoll_perf
cleanup() { "$nc" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
if ! ip netns add "hcc-$id-probe" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (ip netns add failed)"; exit 77
fi
ip netns del "hcc-$id-probe"

n1=hcc-$id-n1 sw=hcc-$id-sw
up() { "$nc" up --nodes $nodes --rails $rails --rate "$rate" >/dev/null || { echo "FAIL: netcluster up"; exit 1; }; }
say() { [ -z "${HCC_FAULTS_VERBOSE:-}" ] || echo "  [$(date +%T)] $*" >&2; }
rail_tx() { ip netns exec "hcc-$id-n0" cat /sys/class/net/rail0/statistics/tx_bytes; }

# Drop packets arriving on DEV in namespace NS: every one, or 1 in 100 at
# random. tc's gact action (and matchall, netem, nftables, iptables) may be
# missing (this VM's kernel has neither gact nor matchall): a classic-BPF
# classifier matches (every packet, or one whose random word is in the top
# 1 % of its range: `ld rand; jge`), and its action redirects the packet to
# a veth end that is down, which drops it (mirred's "Sent" counts them).
ingress_drop() { # ns dev all|1pct
  local prog
  ip netns exec "$1" ip link show hcbh0 >/dev/null 2>&1 ||
    ip netns exec "$1" ip link add hcbh0 type veth peer name hcbh1 || return 1
  ip netns exec "$1" tc qdisc replace dev "$2" ingress || return 1
  if [ "$3" = all ]; then
    prog="1,6 0 0 4294967295,"
  else # A = random u32; A >= 0.99 * 2^32: match (-1), else no match (0)
    prog="4,32 0 0 4294963256,53 0 1 4252017623,6 0 0 4294967295,6 0 0 0,"
  fi
  ip netns exec "$1" tc filter add dev "$2" parent ffff: protocol all bpf bytecode "$prog" \
    action mirred egress redirect dev hcbh0
}
# Packets those filters took on DEV.
dropped() { # ns dev
  ip netns exec "$1" tc -s filter show dev "$2" parent ffff: 2>/dev/null |
    awk '/Sent [0-9]+ bytes/ { for (i = 1; i < NF; i++) if ($i == "bytes") d += $(i + 1) } END { print d + 0 }'
}

fault_cmd() { # kind out
  case $1 in
    raildown) ip -n "$n1" link set rail1 down ;;
    kill) kill -KILL "$(cat "$2/rank$victim.pid")" ;;
    stop) kill -STOP "$(cat "$2/rank$victim.pid")" ;;
    cut)
      local i
      for ((i = 0; i < rails; i++)); do
        ingress_drop "$n1" "rail$i" all && ingress_drop "$sw" "n1r$i" all || return 1
      done ;;
  esac
}

# Undo a fault, so that the next trial runs on the same cluster.
restore() { # kind
  local i
  case $1 in
    raildown) ip -n "$n1" link set rail1 up ;;
    cut | drop)
      for ((i = 0; i < rails; i++)); do
        ip netns exec "$n1" tc qdisc del dev "rail$i" ingress 2>/dev/null
        ip netns exec "$sw" tc qdisc del dev "n1r$i" ingress 2>/dev/null
      done ;;
  esac
  return 0
}

# One trial of a failure: run, wait for all-reduce traffic, fault, collect.
trial() { # kind n
  local kind=$1 out=$tmp/$1.$2 base waited=0 t0=$SECONDS
  base=$(rail_tx)
  HCOLL_TIMEOUT_MS=$timeout_ms HCOLL_LIVENESS_MS=$liveness_ms \
    "$nc" run --deadline 180 --port $((29500 + $2)) --out "$out" -- \
    "$perf" -b 64M -e 64M -n 400 -w 0 -c 0 >"$out.txt" 2>&1 &
  local runner=$!
  # One 64 MiB all-reduce sends ~45 MB per rail: 40 MB means one is running.
  until [ $(($(rail_tx) - base)) -gt 40000000 ]; do
    sleep 0.05; waited=$((waited + 1))
    [ $waited -gt 2400 ] && { echo "no traffic" >"$out.fault"; kill "$runner"; wait "$runner"; return 1; }
  done
  local t_fault=$EPOCHREALTIME
  say "$kind $2: traffic after $((SECONDS - t0)) s: fault"
  fault_cmd "$kind" "$out" || echo "fault command failed" >&2
  echo "$t_fault" >"$out.fault"
  if [ "$kind" = stop ]; then
    # The stopped rank never ends by itself: once every other rank has, it goes.
    local r left=1 until_s=$((SECONDS + 30))
    while [ $left -gt 0 ] && [ $SECONDS -lt $until_s ]; do
      left=0
      for ((r = 0; r < nranks; r++)); do
        [ $r -eq $victim ] || [ -s "$out/rank$r.rc" ] || left=$((left + 1))
      done
      sleep 0.05
    done
    kill -KILL "$(cat "$out/rank$victim.pid")" 2>/dev/null
  fi
  wait "$runner"
  say "$kind $2: every rank ended after $((SECONDS - t0)) s"
  return 0
}

# Judge a trial: prints "ok|FAIL worst_s detail".
judge() { # kind n
  python3 - "$tmp/$1.$2" "$1" "$victim" "$nranks" "$liveness_ms" "$rails" <<'EOF'
import re, sys
out, kind, victim, n, live, rails = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
try:
    t_fault = float(open(out + ".fault").read())
except ValueError:
    print("FAIL 0 no traffic before the fault"); sys.exit()
victim_rail = 1 if kind == "raildown" else victim % rails
skip = victim if kind in ("kill", "stop") else -1
worst, problems, named_victim = 0.0, [], False
for r in range(n):
    if r == skip:
        continue
    rc = open(f"{out}/rank{r}.rc").read().strip()
    dt = float(open(f"{out}/rank{r}.end").read()) - t_fault
    lines = [l.strip() for l in open(f"{out}/rank{r}.out") if "WARN" in l or "hcoll_perf:" in l]
    first = lines[0] if lines else ""
    worst = max(worst, dt)
    if rc in ("0", "137"):
        problems.append(f"rank {r} exit {rc}")
    if dt > live / 1000 + 1:
        problems.append(f"rank {r} {dt:.2f} s")
    peer = re.search(r"rank \d+|local rank \d+", first)
    rail = re.search(r"rail ?\d|tcp rank|shm|intra-node", first)
    if not (peer and rail):
        problems.append(f"rank {r} names no peer/rail: {first[:160]!r}")
    text = " ".join(lines)
    if kind == "cut" or kind == "raildown":
        named_victim |= bool(re.search(rf"rail ?{victim_rail}|rank [2345]\b|node 1", text))
    else:
        named_victim |= bool(re.search(rf"rank {victim}\b|local rank {victim % rails}\b", text))
if not named_victim:
    problems.append("no survivor names the faulty rank or rail")
print(("ok" if not problems else "FAIL"), f"{worst:.2f}", "; ".join(problems))
EOF
}

# The random drop: the same fixed run without and with it; hcoll_perf's
# time per 64 MiB all-reduce (us, out of place) and its #wrong columns.
timed_run() { # out port -> "rc time_us wrong"
  "$nc" run --deadline 300 --port "$2" --out "$1" -- "$perf" -b 64M -e 64M -n 10 -w 1 -c 1 \
    >"$1.txt" 2>&1
  local rc=$?
  awk -v rc=$rc '$1 == 67108864 && $6 == "hcoll" { t = $7; w = $10 + $14 }
                 END { printf "%d %s %s\n", rc, (t == "" ? 0 : t), (w == "" ? "?" : w) }' "$1.txt"
}
drop_trial() { # n -> prints "ok|FAIL slowdown detail"
  local out=$tmp/drop.$1 rc0 t0 w0 rc1 t1 w1 drops
  read -r rc0 t0 w0 < <(timed_run "$out.clean" $((29700 + 2 * $1)))
  ingress_drop "$n1" rail0 1pct && ingress_drop "$sw" n1r0 1pct || { echo "FAIL 0 tc filter"; return; }
  read -r rc1 t1 w1 < <(timed_run "$out.drop" $((29701 + 2 * $1)))
  drops=$(($(dropped "$n1" rail0) + $(dropped "$sw" n1r0)))
  if [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && [ "$w0" = 0 ] && [ "$w1" = 0 ] && [ "$t0" != 0 ]; then
    awk -v a="$t0" -v b="$t1" -v d="$drops" 'BEGIN { printf "ok %.2f 64 MiB all-reduce %.0f ms clean, %.0f ms with the drop, %d packets dropped\n", b / a, a / 1000, b / 1000, d }'
  else
    echo "FAIL 0 exit $rc0/$rc1, #wrong $w0/$w1: $(grep -m1 -E 'WARN|hcoll_perf:' "$out.drop/rank0.out")"
  fi
}

printf '%-9s %6s %6s %9s %9s  %s\n' fault trials passed worst_s median_s notes
allok=0
for kind in raildown kill stop cut drop; do
  [[ ,$only, == *,$kind,* ]] || continue
  pass=0 times=() notes=""
  up
  for ((t = 1; t <= trials; t++)); do
    if [ $kind = drop ]; then
      res=$(drop_trial $t)
    else
      trial $kind $t
      res=$(judge $kind $t)
    fi
    restore $kind
    read -r verdict val detail <<<"$res"
    [ "$verdict" = ok ] && pass=$((pass + 1))
    times+=("$val")
    [ "$verdict" = ok ] || notes="$notes [trial $t: $detail]"
    [ -n "${HCC_FAULTS_VERBOSE:-}" ] && echo "  $kind $t: $res" >&2
    [ $kind = drop ] && [ "$verdict" = ok ] && [ -z "$notes" ] && notes=$detail
  done
  read -r worst median < <(printf '%s\n' "${times[@]}" | sort -g |
    awk '{ v[NR] = $1 } END { printf "%s %s\n", v[NR], v[int((NR + 1) / 2)] }')
  if [ $kind = drop ]; then
    printf '%-9s %6d %6d %9s %9s  slowdown (x, worst/median) %s\n' $kind $trials $pass "$worst" "$median" "$notes"
  else
    printf '%-9s %6d %6d %9s %9s  limit %.1f s%s\n' $kind $trials $pass "$worst" "$median" \
      "$(awk -v l=$liveness_ms 'BEGIN { print l / 1000 + 1 }')" "$notes"
  fi
  [ $pass -eq $trials ] || allok=1
done
"$nc" down >/dev/null 2>&1
exit $allok
