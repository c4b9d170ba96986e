#!/usr/bin/env bash
# examples/allreduce_env as a user runs it: 4 processes given HCOLL_RANK,
# HCOLL_NRANKS, HCOLL_ROOT and HCOLL_SECRET, 2 emulated nodes x 2 on
# loopback. Every rank must report the 2 x 2 layout and 0 wrong elements
# (the example checks the sum itself and exits 1 otherwise).
# (tests/torchrun.test.sh runs the same program under torchrun.)
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
prog=$build/examples/allreduce_env
[ -x "$prog" ] || { echo "FAIL: $prog not built (make)"; exit 1; }
. tests/examples/ranks.sh
tmp=$(mktemp -d /tmp/hcoll-example-env.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

ex_ranks 4 2 60 "$tmp" "$prog" 100003 || { ex_dump "$tmp" 4; echo "FAIL: a rank failed"; exit 1; }
for r in 0 1 2 3; do
  grep -q "^rank $r of 4 (2 nodes, local rank $((r % 2)) of 2): 100003 floats, 0 wrong" "$tmp/out.$r" ||
    { ex_dump "$tmp" 4; echo "FAIL: rank $r: want 2 nodes x 2 and 0 wrong"; exit 1; }
  cat "$tmp/out.$r"
done
echo "allreduce_env: 4 ranks, 2 x 2, 0 wrong"
