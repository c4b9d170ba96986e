#!/usr/bin/env bash
# Replays every fuzz target (tests/fuzz/fuzz_*.c) on its seeds
# (tests/fuzz/corpus/<target>/) and on every crash found so far
# (tests/fuzz/regress/<target>/), built with the ordinary compiler
# (build/fuzz/replay_*; under make test-asan with ASan and UBSan): a fixed
# parser bug that comes back fails here, without clang or libFuzzer.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
fail=0 n=0
for src in tests/fuzz/fuzz_*.c; do
  t=$(basename "$src" .c); t=${t#fuzz_}
  bin=$build/fuzz/replay_$t
  [ -x "$bin" ] || { echo "FAIL: $bin not built"; fail=1; continue; }
  [ -d "tests/fuzz/corpus/$t" ] || { echo "FAIL: target $t has no seed corpus"; fail=1; }
  # UBSan (make test-asan) reports and carries on: its report fails too.
  if out=$(timeout 120 "$bin" "tests/fuzz/corpus/$t" "tests/fuzz/regress/$t" 2>&1) &&
     ! grep -q 'runtime error:' <<<"$out"; then
    echo "ok: $t: $(tail -1 <<<"$out")"
  else
    echo "FAIL: $t"; echo "$out" | grep -v '^replayed' | tail -20; fail=1
  fi
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "FAIL: no fuzz targets"; fail=1; }
exit $fail
