# Sourced by tests/example-*.test.sh: start an hcoll job of plain
# processes on loopback, as a launcher would, and collect what each rank
# said.
#
#   ex_ranks NRANKS PER_NODE DEADLINE DIR PROGRAM [ARGS...]
#
# Rank r gets HCOLL_RANK=r, HCOLL_NRANKS, HCOLL_ROOT=127.0.0.1:<free port>,
# HCOLL_SECRET (fresh), HCOLL_HOSTID=node<r / PER_NODE> (PER_NODE ranks per
# emulated node) and LOCAL_RANK=r % PER_NODE; its output goes to DIR/out.r
# and its exit status to DIR/rc.r (124: killed at DEADLINE seconds).
# Returns 0 when every rank exited 0.

# A loopback port below the ephemeral range (tests/python/ranks.py says why).
ex_free_port() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import ranks; print(ranks.free_port())' \
    "$(dirname "${BASH_SOURCE[0]}")/../python"
}

ex_ranks() {
  local n=$1 per=$2 deadline=$3 dir=$4; shift 4
  local port secret r pids=() bad=0
  port=$(ex_free_port) || return 1
  secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  for ((r = 0; r < n; r++)); do
    ( HCOLL_RANK=$r HCOLL_NRANKS=$n HCOLL_ROOT=127.0.0.1:$port HCOLL_SECRET=$secret \
      HCOLL_HOSTID=node$((r / per)) LOCAL_RANK=$((r % per)) HCOLL_SOCKET_IFNAME=lo \
      HCOLL_TIMEOUT_MS=${HCOLL_TIMEOUT_MS:-20000} \
      timeout --kill-after=5 "$deadline" "$@" >"$dir/out.$r" 2>&1
      echo $? >"$dir/rc.$r" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for ((r = 0; r < n; r++)); do
    [ "$(cat "$dir/rc.$r" 2>/dev/null)" = 0 ] || bad=1
  done
  return $bad
}

# Print every rank's output, prefixed, for a failure report.
ex_dump() { # dir n
  local r
  for ((r = 0; r < $2; r++)); do
    echo "--- rank $r (exit $(cat "$1/rc.$r" 2>/dev/null))"
    tail -20 "$1/out.$r" | sed 's/^/    | /'
  done
}
