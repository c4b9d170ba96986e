#!/usr/bin/env bash
# Runs every test: each Check binary under build/tests (or $HCOLL_TEST_BUILD)
# and each tests/*.test.sh script, each under a deadline. A program that
# exits 77 is skipped (it prints why). Ends with one line:
#   N passed, N failed, N skipped
# counting Check test cases (and scripts as one case each).
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
per_test_timeout=${HCOLL_TEST_TIMEOUT:-600}
filter=${1:-}

passed=0 failed=0 skipped=0
failed_names=()
log_dir=$build/test-logs
mkdir -p "$log_dir"

run_one() { # name, command...
  local name=$1; shift
  local log=$log_dir/$name.log
  local start=$SECONDS
  timeout --kill-after=10 "$per_test_timeout" "$@" >"$log" 2>&1
  local rc=$? secs=$((SECONDS - start))
  if [ $rc -eq 77 ]; then
    skipped=$((skipped + 1))
    printf '%-28s SKIP  %s\n' "$name" "$(grep -m1 '^SKIP' "$log" | cut -c7-)"
    return
  fi
  # Check prints "NN%: Checks: T, Failures: F, Errors: E".
  local line t f e
  line=$(grep -E '^[0-9]+%: Checks: ' "$log" | tail -1)
  if [ -n "$line" ]; then
    t=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
    e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
    passed=$((passed + t - f - e))
    failed=$((failed + f + e))
    local sk
    sk=$(grep -c '^SKIP' "$log")
    skipped=$((skipped + sk))
  elif [ $rc -eq 0 ]; then
    passed=$((passed + 1))
  fi
  if [ $rc -ne 0 ]; then
    [ -n "$line" ] || failed=$((failed + 1))
    [ $rc -eq 124 ] && echo "$name: timed out after ${per_test_timeout}s" >>"$log"
    failed_names+=("$name")
    printf '%-28s FAIL  (%ss) %s\n' "$name" "$secs" "${line:-exit $rc}"
    sed 's/^/    | /' "$log" | grep -vE '^    \| [0-9]+%: Checks' | tail -40
  else
    printf '%-28s ok    (%ss) %s\n' "$name" "$secs" "${line:-}"
  fi
}

for t in "$build"/tests/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case "$t" in *.d) continue ;; esac
  name=$(basename "$t")
  [ -n "$filter" ] && [[ $name != *$filter* ]] && continue
  run_one "$name" env CK_DEFAULT_TIMEOUT=120 HCOLL_TEST_BUILD="$build" "$t"
done
for s in tests/*.test.sh; do
  [ -f "$s" ] || continue
  name=$(basename "$s" .test.sh)
  [ -n "$filter" ] && [[ $name != *$filter* ]] && continue
  run_one "$name" env HCOLL_TEST_BUILD="$build" bash "$s"
done

echo
# Repeat why each failed, so that the end of the output (often all a CI
# report keeps) says it too.
for n in "${failed_names[@]}"; do
  echo "-- $n:"
  grep -E 'check failed|:[0-9]+:[FE]:|timed out after|Assertion|^FAIL' "$log_dir/$n.log" |
    grep -v ' WARN ' | head -8 |
    sed 's/^/   /'
done
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]} (logs in $log_dir)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ ${#failed_names[@]} -eq 0 ]
