#!/usr/bin/env bash
# A rail-optimized cluster on one host, made of network namespaces.
#
#   switch namespace hcc-ID-sw          node namespaces hcc-ID-n0 .. hcc-ID-n<N-1>
#   ┌──────────────────────────┐        ┌──────────────────────────────┐
#   │ br0 ── n0r0 n1r0 n2r0 ...│◄─veth─►│ rail0 198.18.0.(k+1)/24      │ local rank 0
#   │ br1 ── n0r1 n1r1 n2r1 ...│◄─veth─►│ rail1 198.18.1.(k+1)/24      │ local rank 1
#   │ ...                      │        │ lo                           │
#   └──────────────────────────┘        └──────────────────────────────┘
#   every veth end shaped by a tbf qdisc at RATE on its egress, so a NIC
#   sends at RATE (node side) and receives at RATE (switch side).
#
# Rail i is its own bridge and its own /24, with no route between rails, so
# a socket bound to rail i's address can only use rail i (strict rp_filter,
# arp_ignore=1 and arp_announce=2 keep ARP on the right interface too).
# Everything lives in namespaces this script creates; the root namespace is
# never touched (the veth pairs are created from inside the switch namespace).
#
# Usage (as root):
#   netcluster.sh [--id ID] up --nodes N --rails L [--rate 1gbit] [--mtu 9000]
#   netcluster.sh [--id ID] run [--deadline S] [--out DIR] [--port P] -- CMD [ARGS...]
#   netcluster.sh [--id ID] mpirun [--deadline S] -- [MPIRUN OPTIONS] PROG [ARGS...]
#   netcluster.sh [--id ID] stats [--raw]
#   netcluster.sh [--id ID] exec NODE -- CMD [ARGS...]
#   netcluster.sh [--id ID] down
#   netcluster.sh list
# ID (default $HCC_ID, else 0) names the cluster: its namespaces are
# hcc-ID-sw and hcc-ID-n<k>, so several clusters can coexist, and `up`
# first removes whatever a crashed run with the same ID left behind.
# `mpirun` runs Open MPI's mpirun inside node 0 with one slot per rail on
# hosts node0..node<N-1>; this script is its rsh agent and starts each
# orted in its node's namespace (and in a UTS namespace named node<k>).
# The cluster's shape (N, L, rate) is read back from the namespaces
# themselves: there is no state file.
set -u

die() { echo "netcluster: $*" >&2; exit 1; }
usage() { sed -n '/^# Usage/,/^# The cluster/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

id=${HCC_ID:-0}
if [ "${1:-}" = --id ]; then
  [ $# -ge 2 ] || usage
  id=$2; shift 2
fi
[[ $id =~ ^[A-Za-z0-9]{1,12}$ ]] || die "--id must be 1-12 letters or digits (got '$id')"
prefix=hcc-$id
sw=$prefix-sw
node_ns() { echo "$prefix-n$1"; }

# Open MPI's rsh agent: called as `AGENT HOST WORDS...`, where the words are
# a command line for a remote shell (as ssh would receive them). HOST
# node<k> is namespace k. A UTS namespace per node gives each orted its own
# host name, so Open MPI (and hcoll's automatic host id) see separate hosts.
if [ "${HCC_MPI_AGENT:-}" = 1 ] && [[ ${1:-} =~ ^node[0-9]+$ ]]; then
  host=$1; shift
  exec ip netns exec "$(node_ns "${host#node}")" unshare --uts \
    sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
fi

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veth, tc)"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  command -v tc >/dev/null || die "tc (iproute2) not found"
}

# Our namespaces only: exactly hcc-ID-sw and hcc-ID-n<digits>.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(sw|n[0-9]+)\$" || true
}

# Nodes and rails, read back from what exists.
shape() {
  nodes=$(our_namespaces | grep -c -- "-n[0-9]*$")
  [ "$nodes" -gt 0 ] || die "no cluster '$id' (run: $0 --id $id up ...)"
  rails=$(ip -n "$(node_ns 0)" -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' |
          grep -cE '^rail[0-9]+$')
}

cmd_down() {
  local ns
  # Deleting a namespace deletes its veth ends and thereby their peers; the
  # switch goes last so that nothing in it is left dangling.
  for ns in $(our_namespaces | grep -v -- "-sw$"); do
    # Processes still inside (a rank that outlived its launcher) hold the
    # namespace's network alive; end them, they are ours by construction.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$sw"; then
    ip netns del "$sw" 2>/dev/null
  fi
  [ -z "$(our_namespaces)" ] || die "could not remove: $(our_namespaces | tr '\n' ' ')"
}

# tbf with a bucket of at least 1 ms at the rate (and several frames), and
# a queue of 20 ms: enough that TCP is never starved by a drop at the
# shaper, small enough that a stalled peer is noticed.
shape_dev() { # ns dev rate_bits mtu
  local ns=$1 dev=$2 bits=$3 mtu=$4
  local burst=$((bits / 8 / 1000)) limit=$((bits / 8 / 50))
  [ $burst -lt $((4 * mtu)) ] && burst=$((4 * mtu))
  [ $limit -lt $((8 * mtu)) ] && limit=$((8 * mtu))
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${bits}bit" \
     burst "$burst" limit "$limit" || return 1
}

# GSO/TSO/GRO make 64 KiB super-packets that leave the shaper in bursts
# and hide the real frame count; off, the tbf sees the wire's frames.
offloads_off() { # ns dev
  if command -v ethtool >/dev/null; then
    ip netns exec "$1" ethtool -K "$2" tso off gso off gro off >/dev/null 2>&1 ||
      echo "netcluster: warning: ethtool -K $2 failed in $1: shaping will be burstier" >&2
  fi
}

# "1gbit", "500mbit", "10gbit", plain bits per second.
rate_bits() {
  local r=${1,,} n mult=1
  case $r in
    *gbit) n=${r%gbit}; mult=1000000000 ;;
    *mbit) n=${r%mbit}; mult=1000000 ;;
    *kbit) n=${r%kbit}; mult=1000 ;;
    *bit) n=${r%bit} ;;
    *) n=$r ;;
  esac
  [[ $n =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 1
  awk -v n="$n" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
}

cmd_up() {
  local nodes=0 rails=0 rate=1gbit mtu=9000
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:-}; shift 2 ;;
      --rails) rails=${2:-}; shift 2 ;;
      --rate) rate=${2:-}; shift 2 ;;
      --mtu) mtu=${2:-}; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 250 ] ||
    die "--nodes must be 1..250"
  [[ $rails =~ ^[0-9]+$ ]] && [ "$rails" -ge 1 ] && [ "$rails" -le 16 ] ||
    die "--rails must be 1..16"
  [[ $mtu =~ ^[0-9]+$ ]] && [ "$mtu" -ge 1280 ] && [ "$mtu" -le 65000 ] ||
    die "--mtu must be 1280..65000"
  local bits
  bits=$(rate_bits "$rate") && [ "$bits" -gt 0 ] || die "--rate: '$rate' (want e.g. 1gbit, 500mbit)"
  need_root
  cmd_down
  # From here on a failure leaves a half-built cluster: remove it.
  trap 'cmd_down 2>/dev/null' EXIT

  ip netns add "$sw" || die "ip netns add $sw"
  ip -n "$sw" link set lo up
  # br_netfilter, where loaded, would send bridged frames through
  # iptables; in this namespace there is nothing to filter.
  ip netns exec "$sw" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do
                               [ -w "$f" ] && echo 0 > "$f"; done' 2>/dev/null
  local i k ns
  for ((i = 0; i < rails; i++)); do
    ip -n "$sw" link add "br$i" type bridge stp_state 0 forward_delay 0 || die "bridge br$i"
    ip -n "$sw" link set "br$i" mtu "$mtu" up
  done
  for ((k = 0; k < nodes; k++)); do
    ns=$(node_ns $k)
    ip netns add "$ns" || die "ip netns add $ns"
    ip -n "$ns" link set lo up
    # One address per rail, each rail its own subnet: the kernel may answer
    # ARP only on the interface that owns the address, announce only that
    # address, and drop what arrives on the wrong rail. IPv6 off so that
    # router solicitations and MLD do not show up in the rail counters.
    ip netns exec "$ns" sh -c '
      for k in all default; do
        echo 1 > /proc/sys/net/ipv4/conf/$k/rp_filter
        echo 1 > /proc/sys/net/ipv4/conf/$k/arp_ignore
        echo 2 > /proc/sys/net/ipv4/conf/$k/arp_announce
        echo 1 > /proc/sys/net/ipv6/conf/$k/disable_ipv6 2>/dev/null
      done' || die "sysctls in $ns"
    for ((i = 0; i < rails; i++)); do
      ip -n "$sw" link add "n${k}r$i" mtu "$mtu" type veth \
         peer name "rail$i" mtu "$mtu" netns "$ns" || die "veth n${k}r$i <-> $ns/rail$i"
      ip netns exec "$ns" sh -c "echo 1 > /proc/sys/net/ipv6/conf/rail$i/disable_ipv6" 2>/dev/null
      ip -n "$sw" link set "n${k}r$i" master "br$i" up
      ip -n "$ns" addr add "198.18.$i.$((k + 1))/24" dev "rail$i"
      ip -n "$ns" link set "rail$i" up
      offloads_off "$sw" "n${k}r$i"
      offloads_off "$ns" "rail$i"
      shape_dev "$ns" "rail$i" "$bits" "$mtu" || die "tc on $ns/rail$i"
      shape_dev "$sw" "n${k}r$i" "$bits" "$mtu" || die "tc on $sw/n${k}r$i"
    done
  done
  trap - EXIT
  echo "netcluster $id: $nodes nodes x $rails rails, ${rate} per rail each way, MTU $mtu"
  echo "  nodes: $(node_ns 0)..$(node_ns $((nodes - 1))), switch $sw; rail i = 198.18.i.0/24, node k = .(k+1)"
}

cmd_exec() {
  [ $# -ge 3 ] && [ "$2" = -- ] || usage
  local k=$1; shift 2
  need_root
  exec ip netns exec "$(node_ns "$k")" "$@"
}

# Launches rank k*L+i as local rank i of node k, in node k's namespace.
# stdout: rank 0's output; per-rank output, pid, exit status and exit time
# in DIR (rank<r>.out, .pid, .rc, .end: seconds since the epoch).
cmd_run() {
  local deadline=600 out="" port=29500
  while [ $# -gt 0 ]; do
    case $1 in
      --deadline) deadline=${2:-}; shift 2 ;;
      --out) out=${2:-}; shift 2 ;;
      --port) port=${2:-}; shift 2 ;;
      --) shift; break ;;
      *) usage ;;
    esac
  done
  [ $# -ge 1 ] || usage
  [[ $deadline =~ ^[0-9]+$ ]] && [ "$deadline" -ge 1 ] || die "--deadline: seconds"
  need_root
  shape
  if [ -z "$out" ]; then
    out=$(mktemp -d "/tmp/$prefix-run.XXXXXX")
  else
    mkdir -p "$out" || die "--out $out"
    rm -f "$out"/rank*.out "$out"/rank*.pid "$out"/rank*.rc "$out"/rank*.end "$out/killed"
  fi
  local nranks=$((nodes * rails)) secret
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  local -a pids=() keepers=()
  local k i r
  for ((k = 0; k < nodes; k++)); do
    for ((i = 0; i < rails; i++)); do
      r=$((k * rails + i))
      # HCOLL_HOSTID: the namespaces share this kernel's boot id and (no
      # UTS namespace) its host name, so the automatic host id would put
      # every rank on one node; the node's namespace name is the id instead.
      # HCOLL_SOCKET_IFNAME=rail lists rail0..rail<L-1> in natural order,
      # so local rank i binds rail i.
      # A small keeper per rank waits for exactly its own rank, so that the
      # exit status and time are recorded the moment the rank ends.
      (
        HCOLL_RANK=$r HCOLL_NRANKS=$nranks HCOLL_ROOT=198.18.0.1:$port HCOLL_SECRET=$secret \
        HCOLL_SOCKET_IFNAME=${HCC_IFNAME:-rail} HCOLL_HOSTID="$(node_ns $k)" \
        HCC_NODE=$k HCC_LOCAL_RANK=$i HCC_OUT=$out \
          ip netns exec "$(node_ns $k)" "$@" >"$out/rank$r.out" 2>&1 </dev/null &
        echo $! >"$out/rank$r.pid"
        wait $!
        rc=$?
        echo "$EPOCHREALTIME" >"$out/rank$r.end"
        echo "$rc" >"$out/rank$r.rc"
      ) 2>/dev/null &
      keepers+=($!)
    done
  done
  echo "netcluster $id: $nranks ranks ($nodes nodes x $rails), output in $out" >&2
  local start=$EPOCHREALTIME rc killed=0 end_at p
  # Every rank has written its pid before the deadline starts.
  for ((r = 0; r < nranks; r++)); do
    while [ ! -s "$out/rank$r.pid" ] && kill -0 "${keepers[r]}" 2>/dev/null; do sleep 0.01; done
    pids[r]=$(cat "$out/rank$r.pid" 2>/dev/null)
  done
  end_at=$(awk -v s="$start" -v d="$deadline" 'BEGIN { printf "%.3f\n", s + d }')
  # The watchdog SIGKILLs whatever rank is still running at the deadline.
  # It sleeps once: a loop of `date` and `sleep 0.2` forked 10 processes a
  # second, which took 5-6 % of this 2-core VM's CPU from the ranks during
  # every benchmark run through here (perf record -a, 3 x 2 reduce-scatter).
  (
    left=$(awk -v e="$end_at" -v now="$EPOCHREALTIME" 'BEGIN { d = e - now; printf "%.3f\n", (d > 0 ? d : 0) }')
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep "$left" &
    nap=$!
    wait "$nap"
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && echo "$p"; done >"$out/killed"
    [ -s "$out/killed" ] &&
      echo "netcluster: deadline of ${deadline}s passed: killing $(wc -l <"$out/killed") rank(s)" >&2
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  ) &
  local watchdog=$!
  # Interrupted: the ranks go with the launcher.
  trap 'kill -KILL "${pids[@]}" "$watchdog" 2>/dev/null; exit 130' INT TERM HUP
  wait "${keepers[@]}"
  trap - INT TERM HUP
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  cat "$out/rank0.out"
  local worst=0 line
  for ((r = 0; r < nranks; r++)); do
    rc=$(cat "$out/rank$r.rc" 2>/dev/null || echo "?")
    line=$(awk -v a="$start" -v b="$(cat "$out/rank$r.end" 2>/dev/null || echo 0)" \
               'BEGIN { printf "%.2f", b - a }')
    if [ "$rc" != 0 ]; then
      printf 'netcluster: rank %d (node %d, rail %d) exit %s after %s s: %s\n' \
        "$r" $((r / rails)) $((r % rails)) "$rc" "$line" \
        "$(grep -v '^#' "$out/rank$r.out" | grep -m1 . | cut -c1-200)" >&2
      [ "$worst" = 0 ] && worst=$rc
    fi
  done
  [ -s "$out/killed" ] && killed=1
  [ $killed -eq 1 ] && return 124
  [[ $worst =~ ^[0-9]+$ ]] || worst=1
  return "$worst"
}

# mpirun inside node 0, ranks k*L..k*L+L-1 on node k (by slot), the
# daemons' control traffic on rail 0. The caller adds the BTL choice.
cmd_mpirun() {
  local deadline=600
  while [ $# -gt 0 ]; do
    case $1 in
      --deadline) deadline=${2:-}; shift 2 ;;
      --) shift; break ;;
      *) usage ;;
    esac
  done
  [ $# -ge 1 ] || usage
  need_root
  shape
  command -v mpirun >/dev/null || die "mpirun not found (Open MPI)"
  local hosts k self
  hosts=$(mktemp "/tmp/$prefix-hosts.XXXXXX")
  for ((k = 0; k < nodes; k++)); do echo "node$k slots=$rails"; done >"$hosts"
  self=$(readlink -f "$0")
  HCC_ID=$id HCC_MPI_AGENT=1 timeout -k 5 "$deadline" \
    ip netns exec "$(node_ns 0)" mpirun --allow-run-as-root -np $((nodes * rails)) \
      --hostfile "$hosts" --map-by slot --mca plm_rsh_agent "$self" \
      --mca oob_tcp_if_include rail0 "$@"
  local rc=$?
  rm -f "$hosts"
  [ $rc -eq 124 ] && echo "netcluster: mpirun: deadline of ${deadline}s passed" >&2
  return $rc
}

# Bytes each rail interface has sent and received since `up`.
cmd_stats() {
  local raw=0
  [ "${1:-}" = --raw ] && raw=1
  need_root
  shape
  [ $raw -eq 1 ] || printf '%-6s %-6s %16s %16s %12s %12s\n' node rail tx_bytes rx_bytes tx_packets drops
  local k i ns d
  for ((k = 0; k < nodes; k++)); do
    ns=$(node_ns $k)
    for ((i = 0; i < rails; i++)); do
      d=/sys/class/net/rail$i/statistics
      # shellcheck disable=SC2016
      read -r tx rx txp drops < <(ip netns exec "$ns" sh -c \
        "echo \$(cat $d/tx_bytes $d/rx_bytes $d/tx_packets) \$((\$(cat $d/tx_dropped) + \$(cat $d/rx_dropped)))")
      if [ $raw -eq 1 ]; then
        echo "$k $i $tx $rx $txp $drops"
      else
        printf '%-6s %-6s %16s %16s %12s %12s\n' "$k" "rail$i" "$tx" "$rx" "$txp" "$drops"
      fi
    done
  done
}

cmd_list() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hcc-[A-Za-z0-9]+-sw$' |
    sed -E 's/^hcc-(.*)-sw$/\1/'
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) need_root; cmd_down ;;
  run) shift; cmd_run "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  stats) shift; cmd_stats "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  list) cmd_list ;;
  *) usage ;;
esac
