#!/usr/bin/env bash
# Every GPU test and benchmark in one go, for a machine with >= 1 NVIDIA GPU
# (the development machines have none, so these tests skip there).
#   scripts/gpu-check.sh            build with CUDA, run, print a summary
# Runs in well under 5 minutes. A GPU test that skips here is a failure:
# this script exists to run them. Exits non-zero on any failure.
#
# What runs:
#   test_gpu_kernels    GPU kernels vs host kernels, every dtype x op, up to
#                       256 MiB; AVG division; kernel bandwidth vs the
#                       device-to-device copy bandwidth (goal >= 0.85x)
#   test_gpu_allreduce  device-buffer all-reduce, 2 and 4 ranks as separate
#                       emulated nodes on GPU 0 over TCP (host-staged ring);
#                       2 nodes x 2 ranks only with >= 2 GPUs (ranks of one
#                       node sharing a GPU cannot form an NCCL communicator);
#                       stream semantics; argument errors; BENCH lines
#   test_gpu_devpath    the CPU-side logic, and the API answers with a driver
#   test_gpu_coll       device broadcast (every root), reduce-scatter and
#                       all-gather, PREMUL_SUM on the single and ring plans;
#                       the 1 x 2 and 2 x 2 cases only with >= 2 GPUs
#   test_gpu_late       a local rank 3 s late in a device all-reduce is
#                       waited for; a dead one fails the others at once
#   hcoll_perf          device buffers with the NCCL peer, 1M..256M, checked:
#                       2 emulated nodes x 1 rank on GPU 0 (staged ring vs
#                       NCCL over its socket transport); with >= 2 GPUs also
#                       2 nodes x 2 ranks (NCCL intra-node stages)
set -u
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
logs=build/gpu-check
mkdir -p "$logs"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU visible (nvidia-smi -L fails); nothing to check" >&2
  exit 1
fi
nvidia-smi -L

# libhcoll loads libnccl.so.2 at run time; the toolkit's copy if nothing else.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_HOME/lib64"

echo "== build (HCOLL_CUDA=1)"
if ! make -j"$(nproc)" HCOLL_CUDA=1 CUDA_HOME="$CUDA_HOME" all tests >"$logs/build.log" 2>&1; then
  tail -30 "$logs/build.log"; echo "gpu-check: build failed"; exit 1
fi
grep -q '#define HCOLL_BUILD_KERNELS 1' build/gen/hc_build.h || {
  echo "gpu-check: the build has no GPU kernels (nvcc missing under $CUDA_HOME?)"; exit 1; }

declare -a names results times
fail=0
for t in test_gpu_devpath test_gpu_kernels test_gpu_allreduce test_gpu_coll test_gpu_late; do
  echo "== $t"
  start=$SECONDS
  timeout --kill-after=10 240 env CK_DEFAULT_TIMEOUT=240 "build/tests/$t" 2>&1 | tee "$logs/$t.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) r=ok ;;
    77) r="SKIPPED (a failure here)"; fail=1 ;;
    124|137) r="TIMED OUT"; fail=1 ;;
    *) r="FAILED (exit $rc)"; fail=1 ;;
  esac
  names+=("$t"); results+=("$r"); times+=("$((SECONDS - start))s")
done

# hcoll_perf on device buffers against NCCL, as a user would run it.
ngpu=$(nvidia-smi -L | grep -c '^GPU')
perf_case() { # name, hcoll_perf arguments...
  local name=$1; shift
  echo "== $name: hcoll_perf $*"
  local start=$SECONDS
  timeout --kill-after=10 240 bin/hcoll_perf "$@" --deadline 230 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]} r=ok
  if [ "$rc" -ne 0 ]; then
    r="FAILED (exit $rc)"; fail=1
  elif ! grep -q 'Out of bounds values : 0 OK' "$logs/$name.log"; then
    r="FAILED (#wrong)"; fail=1
  fi
  names+=("$name"); results+=("$r"); times+=("$((SECONDS - start))s")
}
perf_case perf_2x1_nccl -np 2 --ranks-per-node 1 --peer nccl -b 1M -e 256M -f 4 -n 10 -w 2 -c 1 -p
if [ "$ngpu" -ge 2 ]; then
  perf_case perf_2x2_nccl -np 4 --ranks-per-node 2 --peer nccl -b 1M -e 256M -f 4 -n 10 -w 2 -c 1 -p
else
  echo "== perf_2x2_nccl: skipped, needs 2 GPUs (this machine has $ngpu)"
fi

echo
echo "================ gpu-check summary ================"
for i in "${!names[@]}"; do
  printf '%-22s %-28s %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
done
grep -h '^SKIP' "$logs"/test_gpu_*.log | sed 's/^/  note: /'
echo "---- benchmarks"
grep -h '^BENCH' "$logs"/test_gpu_*.log | sed 's/^BENCH /  /'
for f in "$logs"/perf_*.log; do
  [ -e "$f" ] || continue
  echo "  $(basename "$f" .log): size, then hcoll and nccl busbw (GB/s, out of place), hcoll/nccl"
  awk '$1 ~ /^[0-9]+$/ && $6 == "hcoll" {h[$1] = $9} $1 ~ /^[0-9]+$/ && $6 == "nccl" {
         printf "    %10s  %7s  %7s  %s\n", $1, h[$1], $9, $NF }' "$f"
done
echo "logs: $logs"
[ $fail -eq 0 ] && echo "gpu-check: all passed" || echo "gpu-check: FAILURES"
exit $fail
