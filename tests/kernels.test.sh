#!/usr/bin/env bash
# The host kernel tests under every kernel set this build contains
# (HCOLL_CPU_KERNELS): the rest of the suite only reaches the set the CPU
# picks (auto), so a bug in the fallback (generic) kernels, such as a
# float16 sum that truncates instead of rounding, would pass on any AVX2
# machine. Here test_reduce's kernel cases and test_premul run under each
# set other than auto's (auto's is the suite's own run of them); each run
# also checks that the set asked for is the one that ran (test_impl_name,
# hcoll_info). test_reduce's "conversions" case is left out: it tests the
# scalar conversions, which no set changes.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
case "$build" in build) bin=bin ;; *) bin=$build/bin ;; esac
info=$bin/hcoll_info
[ -x "$info" ] || { echo "FAIL: $info not built"; exit 1; }
fail=0
kset() { HCOLL_CPU_KERNELS=$1 "$info" 2>&1 | sed -n 's/^ *host reduction kernels: //p'; }
auto=$(kset auto)
declare -A name=([generic]=generic [avx2]=avx2+f16c)
ran=0
for s in generic avx2; do
  got=$(kset "$s")
  if [ "$s" = avx2 ] && ! { grep -qw avx2 /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; }; then
    echo "note: this CPU lacks AVX2/F16C: the avx2 set cannot run here"
    continue
  fi
  [ "$got" = "${name[$s]}" ] || { echo "FAIL: HCOLL_CPU_KERNELS=$s runs '$got'"; fail=1; continue; }
  if [ "$got" = "$auto" ]; then
    echo "note: $s is auto's set here: the suite's own test_reduce and test_premul run it"
    continue
  fi
  for run in "test_reduce kernels" "test_reduce values" "test_reduce avg" "test_reduce api" \
             "test_premul"; do
    set -- $run
    exe=$build/tests/$1
    [ -x "$exe" ] || { echo "FAIL: $exe not built"; fail=1; continue; }
    out=$(env ${2:+CK_RUN_CASE=$2} HCOLL_CPU_KERNELS=$s CK_DEFAULT_TIMEOUT=120 "$exe" 2>&1)
    rc=$?
    line=$(grep -E '^[0-9]+%: Checks: ' <<<"$out" | tail -1)
    if [ $rc -ne 0 ] || [ -z "$line" ] || grep -q 'Checks: 0,' <<<"$line"; then
      echo "FAIL: $run with HCOLL_CPU_KERNELS=$s: ${line:-exit $rc}"
      grep -E ':[EF]:' <<<"$out" | head -20
      fail=1
    else
      echo "ok: $run with HCOLL_CPU_KERNELS=$s: $line"
    fi
  done
  ran=$((ran + 1))
done
echo "kernel sets run here besides auto's ($auto): $ran"
exit $fail
