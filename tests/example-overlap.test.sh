#!/usr/bin/env bash
# examples/dp_overlap: 2 ranks as 2 emulated nodes x 1 on loopback, each a
# real CPU backward of an MLP whose 8 per-layer buckets are all-reduced
# (AVG) as soon as they are full. Checks:
#   - every rank exits 0 and the averaged gradients match the serial
#     reference ("gradients: ... ok");
#   - the communication left after backward with overlap (exposed) is below
#     a third of the communication after backward without it, both measured
#     by the program in the same run (medians of alternating steps; per
#     step, the rank whose backward ended last). Ideally it is an eighth
#     (the last bucket); a run without overlap sits near 1 and fails;
#   - hcoll_plan's prediction for the same sizes is printed beside it.
# Why 2 x 1: the host has 2 cores shared with other jobs; 2 processes leave
# the ring thread room to run during backward, while 4 make the figures
# here mostly scheduler noise. A timing miss is run again once before it
# counts (a wrong gradient never is).
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
bindir=bin
[ "$build" != build ] && [ -d "$build/bin" ] && bindir=$build/bin
prog=$build/examples/dp_overlap
for f in "$prog" "$bindir/hcoll_plan"; do
  [ -x "$f" ] || { echo "FAIL: $f not built (make)"; exit 1; }
done
. tests/examples/ranks.sh
tmp=$(mktemp -d /tmp/hcoll-example-overlap.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for try in 1 2; do
  ex_ranks 2 1 120 "$tmp" "$prog" "$PWD/$bindir/hcoll_plan" ||
    { ex_dump "$tmp" 2; echo "FAIL: a rank failed"; exit 1; }
  out=$(cat "$tmp/out.0")
  echo "$out"
  grep -q '^gradients: largest relative error .* against the serial average: ok$' <<<"$out" ||
    { echo "FAIL: gradients not checked ok"; exit 1; }
  grep -qE '^exposed: measured [0-9.]+ ms, hcoll_plan predicts [0-9.]+ ms' <<<"$out" ||
    { echo "FAIL: no prediction from hcoll_plan beside the measurement"; exit 1; }
  # comm. after backward  <no overlap> ms  <overlap> ms
  read -r comm exposed < <(awk '/^comm\. after backward/ { print $4, $6 }' <<<"$out")
  [ -n "${exposed:-}" ] || { echo "FAIL: no 'comm. after backward' row"; exit 1; }
  if awk -v e="$exposed" -v c="$comm" 'BEGIN { exit !(3 * e < c) }'; then
    echo "dp_overlap: exposed $exposed ms < a third of the no-overlap communication $comm ms: ok"
    exit 0
  fi
  echo "note: try $try: exposed $exposed ms is not below a third of the no-overlap $comm ms"
done
echo "FAIL: overlap did not hide two thirds of the communication after backward, twice"
exit 1
