#!/usr/bin/env bash
# Runs libFuzzer targets (make fuzz builds them in build-fuzz/fuzz):
#   FUZZ_SECONDS=N FUZZ_JOBS=J tests/fuzz/run.sh TARGET...
# Each target runs N seconds on a scratch copy of tests/fuzz/corpus/<target>/
# (new inputs stay in build-fuzz/corpus/<target>/; copy the useful ones into
# the seeds by hand), J targets at a time. Prints one line per target with
# its executions, and exits 1 if any target crashed: the input is then in
# build-fuzz/crashes/<target>/ (copy it into tests/fuzz/regress/<target>/
# with the fix, and make test replays it).
set -u
cd "$(dirname "$0")/../.."
secs=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
out=build-fuzz
mkdir -p "$out/logs"

one() { # target
  local t=$1 bin=$out/fuzz/fuzz_$1
  local corpus=$out/corpus/$t crashes=$out/crashes/$t
  mkdir -p "$corpus" "$crashes"
  [ -d tests/fuzz/corpus/$t ] && cp -n tests/fuzz/corpus/$t/* "$corpus"/ 2>/dev/null
  local dict=()
  [ -f tests/fuzz/$t.dict ] && dict=(-dict=tests/fuzz/$t.dict)
  # rss_limit: a parser must never need more; timeout: nor hang on one input.
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=1024 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "${dict[@]}" "$corpus" \
    >"$out/logs/$t.log" 2>&1
  local rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/logs/$t.log" | tail -1)
  local cov
  cov=$(grep -oE 'cov: [0-9]+' "$out/logs/$t.log" | tail -1)
  if [ $rc -eq 0 ]; then
    printf 'fuzz %-10s ok     %10s executions in %ss (%s, corpus %s)\n' "$t" "${execs:-?}" \
      "$secs" "${cov:-cov: ?}" "$(ls "$corpus" | wc -l)"
  else
    printf 'fuzz %-10s CRASH  after %s executions: %s (log %s)\n' "$t" "${execs:-?}" \
      "$(ls "$crashes" | head -1)" "$out/logs/$t.log"
    grep -m3 -E 'ERROR|FUZZ_CHECK|runtime error' "$out/logs/$t.log" | sed 's/^/    /'
  fi
  return $rc
}

fail=0
pids=()
names=()
for t in "$@"; do
  one "$t" &
  pids+=($!) names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || fail=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
exit $fail
