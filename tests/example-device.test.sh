#!/usr/bin/env bash
# examples/device_side_stream: device buffers all-reduced on a side stream,
# ordered with events against the compute stream.
#   - on the emulated CUDA driver and NCCL (tests/mock, as gpu-mock.test.sh
#     uses them), 4 ranks as 2 emulated nodes x 2 on 2 emulated GPUs, with
#     the mock's race detector failing any unordered access of two streams
#     (HCMOCK_RACE=2) and 5 ms random delays on queued work, which make a
#     missing event wait show (checked by hand: without either wait the
#     sums come out wrong): every rank 0 wrong, no async error, no RACE;
#   - with no GPU: the example says "SKIP: no GPU" and exits 77;
#   - on a machine with a GPU (nvidia-smi -L works), the same on the real
#     driver: 2 nodes x 1 rank on GPU 0, and 2 x 2 with two GPUs or more.
# Skips (77) only where the build has no CUDA headers (the example is then
# not built).
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
prog=$build/examples/device_side_stream
mock=$build/mock
if grep -q '^#define HCOLL_BUILD_CUDA 0' "$build/gen/hc_build.h" 2>/dev/null; then
  echo "SKIP: this build has no CUDA (no headers, or HCOLL_CUDA=0): device_side_stream not built"
  exit 77
fi
for f in "$prog" "$mock/libcuda.so.1" "$mock/libnccl.so.2"; do
  [ -e "$f" ] || { echo "FAIL: $f not built (make all tests)"; exit 1; }
done
. tests/examples/ranks.sh
tmp=$(mktemp -d /tmp/hcoll-example-device.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

check_ranks() { # label n
  local r
  for ((r = 0; r < $2; r++)); do
    grep -q "^rank $r of $2 on GPU [0-9]*: 3 steps of 1048576 floats on a side stream, 0 wrong, HCOLL_SUCCESS$" \
      "$tmp/out.$r" || { fail "$1: rank $r"; ex_dump "$tmp" "$2"; return; }
  done
  grep -l 'RACE' "$tmp"/out.* >/dev/null 2>&1 && { fail "$1: the mock saw a race"; ex_dump "$tmp" "$2"; return; }
  cat "$tmp"/out.*
  echo "$1: ok"
}

# ---- the emulated driver --------------------------------------------------
LD_LIBRARY_PATH="$PWD/$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" HCMOCK_NDEV=2 HCMOCK_RACE=2 \
  HCMOCK_DELAY_US=5000 ex_ranks 4 2 120 "$tmp" "$prog"
check_ranks "emulated driver, 2 x 2" 4

# ---- a real GPU, or none ----------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1 && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') &&
   [ "$ngpu" -gt 0 ]; then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_HOME/lib64"
  ex_ranks 2 1 120 "$tmp" "$prog"
  check_ranks "GPU, 2 x 1" 2
  if [ "$ngpu" -ge 2 ]; then
    ex_ranks 4 2 120 "$tmp" "$prog"
    check_ranks "GPU, 2 x 2" 4
  fi
else
  out=$("$prog" 2>&1); rc=$?
  [ $rc -eq 77 ] && grep -q '^SKIP: no GPU' <<<"$out" ||
    fail "without a GPU: want 'SKIP: no GPU' and exit 77, got $rc: $out"
  echo "no GPU here: the real-driver run is not done (exit 77: $out)"
fi
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
