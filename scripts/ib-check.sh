#!/usr/bin/env bash
# ib-check.sh: the RDMA (verbs) transport on real NICs, two nodes, one command.
#
#   scripts/ib-check.sh NODE_A NODE_B [RANKS_PER_NODE]
#
# Run from a node that reaches both by ssh (without a password), with this
# tree built (`make`) at the same path on both (a shared file system or a
# copy). NODE_A's first address on HCOLL_SOCKET_IFNAME (or the host name) is
# the rendezvous. What it does, stopping at the first failure:
#   1. device listing on both nodes: ibv_devinfo (if installed) and
#      `hcoll_info --rdma` (ports, states, rates, GIDs and the one chosen,
#      NIC per local rank, GPUDirect availability);
#   2. a correctness run over verbs (HCOLL_NET=ib): hcoll_perf from 4 KiB to
#      4 MiB, five checked iterations per size (hcoll_perf exits 1 on any
#      wrong element), with NET/GDR logging so the
#      "NET/IB: rank r -> [i]dev:port/RoCE[/GDRDMA]" lines show which NIC,
#      GID and QP each rank used;
#   3. a bus-bandwidth sweep (1 MiB .. 1 GiB) with the per-stage split and
#      the NIC line-rate verdict, written to ib-check-<date>.json.
# Environment passed through to both nodes: HCOLL_IB_HCA, HCOLL_IB_GID_INDEX,
# HCOLL_IB_TC, HCOLL_IB_SL, HCOLL_IB_TIMEOUT, HCOLL_IB_RETRY_CNT,
# HCOLL_NET_GDR_LEVEL, HCOLL_GDR_FLUSH, HCOLL_SOCKET_IFNAME.
#
# This script has not been run: the machines hcoll is developed on have no
# RDMA NIC. Expect to debug it on first contact with hardware.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,25p' "$0"; exit 2; }
A=$1 B=$2 L=${3:-1}
cd "$(dirname "$0")/.."
TREE=$PWD
PORT=${HCOLL_CHECK_PORT:-29517}
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PASS=""
for v in HCOLL_IB_HCA HCOLL_IB_GID_INDEX HCOLL_IB_TC HCOLL_IB_SL HCOLL_IB_TIMEOUT \
         HCOLL_IB_RETRY_CNT HCOLL_NET_GDR_LEVEL HCOLL_GDR_FLUSH HCOLL_SOCKET_IFNAME; do
  [ -n "${!v:-}" ] && PASS+=" $v=$(printf %q "${!v}")"
done
ROOT_ADDR=$(ssh "$A" "getent hosts $A | awk '{print \$1; exit}'")
N=$((2 * L))

step() { printf '\n=== %s\n' "$*"; }

step "1. RDMA devices"
for h in "$A" "$B"; do
  echo "--- $h"
  ssh "$h" "command -v ibv_devinfo >/dev/null && ibv_devinfo -l; cd $TREE && $PASS bin/hcoll_info --rdma"
done

# run_perf LOGFILE ARGS...: every rank of both nodes, in the background over ssh.
run_perf() {
  local log=$1; shift
  local pids=() r=0
  for h in "$A" "$B"; do
    for ((l = 0; l < L; l++)); do
      ssh "$h" "cd $TREE && env HCOLL_NET=ib HCOLL_RANK=$r HCOLL_NRANKS=$N \
        HCOLL_ROOT=$ROOT_ADDR:$PORT HCOLL_SECRET=$SECRET HCOLL_DEBUG=INFO \
        HCOLL_DEBUG_SUBSYS=INIT,NET,GDR $PASS bin/hcoll_perf $*" >"$log.$r" 2>&1 &
      pids+=($!)
      r=$((r + 1))
    done
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

step "2. correctness over verbs ($N ranks, $L per node)"
log=ib-check-correct
if ! run_perf "$log" -b 4K -e 4M -f 4 -n 5 -c 5; then
  echo "FAILED; the ranks' logs:"; tail -n 30 "$log".*; exit 1
fi
grep -h "NET/IB: rank" "$log".* || { echo "no NET/IB line: did the verbs transport run?"; exit 1; }
grep -h "GPU Direct RDMA" "$log".* || true
cat "$log.0" # hcoll_perf exits 1 on any wrong element: run_perf has failed then

step "3. bus bandwidth sweep"
json=ib-check-$(date +%Y%m%d-%H%M%S).json
run_perf ib-check-sweep -b 1M -e 1G -f 2 -n 20 --stages -J "$TREE/$json" || { tail -n 30 ib-check-sweep.*; exit 1; }
cat ib-check-sweep.0
echo "results: $json"
