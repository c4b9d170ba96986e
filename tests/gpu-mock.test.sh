#!/usr/bin/env bash
# The device-buffer path on hosts without a GPU, under the driver
# emulations of tests/mock (a libcuda.so.1 and a libnccl.so.2 that run
# streams on threads and keep "device" memory where the host cannot
# dereference it; see tests/mock/hcmock.h):
#   - test_gpu_devpath, test_gpu_kernels, test_gpu_allreduce, test_gpu_coll,
#     test_gpu_late (a local rank late or dead in a device all-reduce),
#     test_gpu_driver (real drivers' rules: capture modes, memory pools,
#     stream handles): the GPU tests
#     that skip elsewhere, run whole (with 2 emulated GPUs, so the 2 x 2
#     NCCL intra-node case runs too);
#   - hcoll_perf --mem device, 2 emulated nodes x 1, then 2 x 2 with
#     --peer nccl: every #wrong is 0, both implementations have rows, and
#     --stages shows the NCCL stages timed; two ranks on one GPU stop with
#     NCCL's refusal on every rank.
# This checks hcoll's control flow (contexts, streams, the flag protocol,
# staging, NCCL calls, errors), not a GPU: speed figures here mean nothing,
# and scripts/gpu-check.sh is what runs on real hardware.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
bindir=bin
[ "$build" != build ] && [ -d "$build/bin" ] && bindir=$build/bin
mock=$build/mock
for f in "$mock/libcuda.so.1" "$mock/libnccl.so.2" "$bindir/hcoll_perf"; do
  [ -e "$f" ] || { echo "FAIL: $f not built (make tests)"; exit 1; }
done
export LD_LIBRARY_PATH="$PWD/$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HCMOCK_NDEV=${HCMOCK_NDEV:-2} HCOLL_SOCKET_IFNAME=lo HCOLL_TIMEOUT_MS=20000
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# ---- the GPU tests, whole -------------------------------------------------
for t in test_gpu_devpath test_gpu_kernels test_gpu_allreduce test_gpu_coll test_gpu_late \
         test_gpu_driver test_gpu_queues; do
  bin=$build/tests/$t
  [ -x "$bin" ] || { fail "$bin not built"; continue; }
  out=$(timeout --kill-after=10 300 env CK_DEFAULT_TIMEOUT=240 "$bin" 2>&1); rc=$?
  line=$(grep -E '^[0-9]+%: Checks: ' <<<"$out" | tail -1)
  echo "$t: rc $rc: ${line:-no Check summary}"
  grep -E '^(SKIP|BENCH)' <<<"$out" | sed 's/^/  /'
  if [ $rc -ne 0 ]; then
    fail "$t under the mock driver (rc $rc)"
    grep -vE '^[0-9]+%: Checks' <<<"$out" | tail -30 | sed 's/^/    | /'
  elif grep -q '^SKIP: no GPU' <<<"$out"; then
    fail "$t skipped under the mock driver: it did not load it"
  fi
done

# ---- hcoll_perf on device buffers -----------------------------------------
perf_run() { # label, hcoll_perf arguments...
  local label=$1; shift
  out=$(timeout --kill-after=10 180 "$bindir/hcoll_perf" "$@" --deadline 170 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    fail "$label: hcoll_perf $* exited $rc"
    tail -20 <<<"$out" | sed 's/^/    | /'
    return 1
  fi
  grep -q '^# buffers: device memory' <<<"$out" || fail "$label: no '# buffers: device memory' line"
  # Data rows: size count type coll redop impl time algbw busbw #wrong (x2).
  local rows bad
  rows=$(awk '$1 ~ /^[0-9]+$/' <<<"$out")
  [ -n "$rows" ] || fail "$label: no rows"
  bad=$(awk '$1 ~ /^[0-9]+$/ && ($10 != "0" || $14 != "0")' <<<"$rows")
  [ -z "$bad" ] || fail "$label: #wrong not 0 in: $bad"
  echo "$label: $(wc -l <<<"$rows") rows, #wrong all 0"
  return 0
}
perf_run "device 2x1" -np 2 --ranks-per-node 1 --mem device -b 4K -e 1M -f 16 -n 2 -w 1 -c 1 --stages
if perf_run "device 2x2 + nccl peer" -np 4 --ranks-per-node 2 --peer nccl -b 4K -e 1M -f 16 \
     -n 2 -w 1 -c 1 --stages; then
  awk '$1 ~ /^[0-9]+$/ {print $6}' <<<"$out" | sort -u | tr '\n' ' ' | grep -q 'hcoll nccl' ||
    fail "device 2x2: want hcoll and nccl rows"
  # --stages: the NCCL stages of device calls are timed (columns rs, inter, ag).
  untimed=$(awk '$1 ~ /^[0-9]+$/ && $6 == "hcoll" && ($17 !~ /^[0-9.]+$/ || $19 !~ /^[0-9.]+$/)' <<<"$out")
  [ -z "$untimed" ] || fail "device 2x2: stage columns not timed: $untimed"
fi
# Two ranks of one node on one GPU: NCCL refuses the peer communicator, and
# every rank stops with that reason instead of hanging.
out=$(HCMOCK_NDEV=1 timeout 120 "$bindir/hcoll_perf" -np 2 --ranks-per-node 2 --peer nccl \
        -b 4K -e 4K -n 1 --deadline 100 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  [ "$(grep -c -- '--peer nccl: ncclCommInitRankConfig' <<<"$out")" -eq 2 ] ||
  fail "--peer nccl on a shared GPU: rc $rc: $out"
# Refusals a user meets: --peer nccl with host buffers is a usage error.
out=$("$bindir/hcoll_perf" --peer nccl --mem host 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- '--peer nccl needs --mem device' <<<"$out" ||
  fail "--peer nccl --mem host: rc $rc: $out"

if [ $fails -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
