#!/usr/bin/env bash
# The rendezvous under a flood of stray connections, at full size: RANKS
# ranks (default 16) init on loopback while STRAYS strangers (default 1000:
# idle, garbage, HELLO + AUTH with a bad MAC, from 4 processes) connect to
# rank 0; then the same ranks' clean init in the same run for comparison.
# Runs it RUNS times (default 5) and prints each run's figures: the job
# must succeed every time. Needs `make tests`.
#   scripts/boot-flood.sh [RUNS]      (RANKS=16 STRAYS=1000 by default)
set -u
cd "$(dirname "$0")/.." || exit 1
runs=${1:-5}
bin=${HCOLL_TEST_BUILD:-build}/tests/test_boot_flood
[ -x "$bin" ] || { echo "no $bin: run make tests"; exit 1; }
fails=0
for i in $(seq "$runs"); do
  log=$(mktemp /tmp/hcoll-boot-flood.XXXXXX)
  HCT_FLOOD_RANKS=${RANKS:-16} HCT_FLOOD_STRAYS=${STRAYS:-1000} CK_RUN_CASE=flood \
    CK_DEFAULT_TIMEOUT=240 "$bin" >"$log" 2>&1
  rc=$?
  grep -h '^flood:' "$log" || true
  if [ $rc -ne 0 ]; then
    fails=$((fails + 1))
    grep -v 'dropped connection' "$log" | tail -20
  fi
  rm -f "$log"
done
echo "$((runs - fails)) of $runs runs succeeded"
[ $fails = 0 ]
