#!/usr/bin/env bash
# Optional parts are detected, never assumed: HCOLL_CUDA=1 without a toolkit
# stops the build with a clear message; =0 and auto without one build.
set -u
cd "$(dirname "$0")/.."
fail=0

out=$(make -n HCOLL_CUDA=1 CUDA_HOME=/nonexistent/cuda 2>&1)
rc=$?
if [ $rc -eq 0 ] || ! grep -q 'HCOLL_CUDA=1 but no CUDA toolkit at CUDA_HOME=/nonexistent/cuda' <<<"$out"; then
  echo "FAIL: HCOLL_CUDA=1 with no toolkit: rc=$rc: $out"; fail=1
fi
out=$(make -n HCOLL_CUDA=maybe 2>&1)
if [ $? -eq 0 ] || ! grep -q 'HCOLL_CUDA must be auto, 0 or 1' <<<"$out"; then
  echo "FAIL: HCOLL_CUDA=maybe accepted: $out"; fail=1
fi
for v in "HCOLL_CUDA=0" "HCOLL_CUDA=auto CUDA_HOME=/nonexistent/cuda"; do
  # shellcheck disable=SC2086
  if ! make -n $v >/dev/null 2>&1; then
    echo "FAIL: 'make $v' refuses to build"; fail=1
  fi
done

# The generated build record says what was found.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make --no-print-directory -s BUILD="$tmp/b" HCOLL_CUDA=0 "$tmp/b/gen/hc_build.h" >/dev/null 2>&1
grep -q '#define HCOLL_BUILD_CUDA 0' "$tmp/b/gen/hc_build.h" || { echo "FAIL: HCOLL_CUDA=0 still records CUDA"; fail=1; }
grep -q '#define HCOLL_BUILD_NCCL 0' "$tmp/b/gen/hc_build.h" || { echo "FAIL: NCCL recorded without CUDA"; fail=1; }

[ $fail -eq 0 ] && echo "build options ok"
exit $fail
