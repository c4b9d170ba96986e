#!/usr/bin/env bash
# Every GPU test and benchmark in one go, for a machine with >= 1 NVIDIA GPU
# (the development machines have none, so these tests skip there).
#   scripts/gpu-check.sh                build with CUDA, run, print a summary
#   scripts/gpu-check.sh --mock         the same steps on the emulated driver of
#                                       tests/mock (no GPU; uses the existing build;
#                                       every figure meaningless): checks this script
#   scripts/gpu-check.sh --probes-only  only the environment log and the probes
#                                       (no test_gpu_*, sanitizers, hcoll_perf, nsys)
# Aims at under 6 minutes on one GPU: the sanitizers, the nsys trace and the
# extra test run are skipped (and say so) when too little of
# HCOLL_GPU_CHECK_BUDGET_S (default 300) seconds, counted from the start, is left.
# A GPU test that skips here is a failure (this script exists to run them),
# except one that needs more GPUs than the machine has. Exits non-zero on
# any failure.
#
# What runs, in this order:
#   environment log     kernel, page size, memlock limit, nvidia-smi, peermem
#                       (lsmod, /sys/module), RDMA devices, CUDA_DEVICE_MAX_CONNECTIONS;
#                       then from the driver (gpu_probe env): version, compute
#                       capability, NCCL version, memory pools, GPUDirect RDMA
#                       write ordering and flush options, dma-buf, stream memory ops
#   probes (build/tests/gpu_probe, tests/gpu_probe*.c; issue 19), each under
#   a watchdog; each prints PROBE <name>: PASS|FAIL|SKIP|INFO <why>:
#     block             cuMemFree (control), cuMemFreeHost, cuModuleUnload: do
#                       they return while another stream waits on a host flag?
#     destroy           hcoll_comm_destroy while the application's stream waits
#     allreduce         device all-reduce (2 nodes x 1 rank) after 32 extra
#                       application streams, under CUDA_DEVICE_MAX_CONNECTIONS
#                       unset and =1, and =1 without them
#     three-stage       2 nodes x 2 ranks on one GPU (one HCOLL_HOSTID per node,
#                       one NCCL_HOSTID per rank), or why it cannot run
#     handles           stream handles 0x1, 0x2, a blocking stream, and 0
#     managed           cuMemAllocManaged buffers through the all-reduce
#     capture           a global-mode capture on another thread during the
#                       first device call
#     kernels           every kernel at misaligned offsets; their bandwidth there
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
#   test_gpu_driver     a global-mode capture on another thread during the
#                       first device call; stream handles NULL/0x1/0x2; no
#                       memory pools
#   test_gpu_queues     the device all-reduce, reduce-scatter and all-gather
#                       under CUDA_DEVICE_MAX_CONNECTIONS=1 and with 8 streams
#                       sharing 4 queues, each under a watchdog
#   compute-sanitizer   memcheck, racecheck, synccheck on gpu_probe kernels
#                       --quick (every kernel, misaligned), when
#                       $CUDA_HOME/bin/compute-sanitizer exists   [budget]
#   nsys                one 256 MiB three-stage all-reduce traced (when nsys
#                       exists); scripts/nsys-overlap.py counts, per rank, the
#                       NCCL reduce-scatter kernels of segment k+1 that ran
#                       while segment k's staging copies (the ring's D2H/H2D
#                       on hcoll's stream) did                     [budget]
#   test_gpu_allreduce  again, under CUDA_DEVICE_MAX_CONNECTIONS=1  [budget]
#   hcoll_perf          device buffers with the NCCL peer, 1M..256M, checked:
#                       2 emulated nodes x 1 rank on GPU 0 (staged ring vs
#                       NCCL over its socket transport); with >= 2 GPUs also
#                       2 nodes x 2 ranks (NCCL intra-node stages)
# [budget]: skipped, saying so, when too little of HCOLL_GPU_CHECK_BUDGET_S is left.
# Logs in build/gpu-check/.
set -u
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mock=0 probes_only=0
for a in "$@"; do
  case $a in
    --mock) mock=1 ;;
    --probes-only) probes_only=1 ;;
    *) echo "usage: $0 [--mock] [--probes-only]" >&2; exit 2 ;;
  esac
done
budget=${HCOLL_GPU_CHECK_BUDGET_S:-300}
logs=build/gpu-check
[ $mock -eq 1 ] && logs=build/gpu-check-mock
mkdir -p "$logs"
rm -f "$logs"/*.log
probe=build/tests/gpu_probe

# ---- environment log, before anything can hang ---------------------------------
envlog() { # what, command...
  printf '%-28s ' "$1:"; shift
  local out; out=$("$@" 2>&1 | tr '\n' ' ' | sed 's/  */ /g; s/ $//')
  echo "${out:-(nothing)}"
}
{
  echo "== environment ($(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname))"
  envlog "kernel" uname -srm
  envlog "page size" getconf PAGESIZE
  envlog "locked-memory limit" sh -c 'ulimit -l'
  envlog "nvidia-smi" sh -c 'command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total,pci.bus_id --format=csv,noheader 2>&1 || echo none'
  envlog "nvidia-peermem (lsmod)" sh -c 'lsmod 2>/dev/null | grep -E "^(nvidia_peermem|nv_peer_mem)" || echo "not loaded"'
  envlog "nvidia-peermem (/sys)" sh -c 'ls -d /sys/module/nvidia_peermem /sys/module/nv_peer_mem 2>/dev/null || echo absent'
  envlog "dma-buf in this kernel" sh -c 'grep -h "^CONFIG_DMA_SHARED_BUFFER=" /boot/config-$(uname -r) 2>/dev/null || (ls /sys/kernel/debug/dma_buf >/dev/null 2>&1 && echo debugfs present) || echo unknown'
  envlog "RDMA devices" sh -c 'ls /sys/class/infiniband 2>/dev/null || echo none'
  envlog "CUDA_DEVICE_MAX_CONNECTIONS" sh -c 'echo "${CUDA_DEVICE_MAX_CONNECTIONS:-unset}"'
  envlog "CUDA_HOME" sh -c "echo $CUDA_HOME; $CUDA_HOME/bin/nvcc --version 2>/dev/null | tail -1"
  envlog "compute-sanitizer" sh -c "ls $CUDA_HOME/bin/compute-sanitizer 2>/dev/null || echo absent"
  envlog "nsys" sh -c "command -v nsys || ls $CUDA_HOME/bin/nsys 2>/dev/null || echo absent"
} | tee "$logs/env.log"

if [ $mock -eq 1 ]; then
  for f in build/mock/libcuda.so.1 build/mock/libnccl.so.2 "$probe"; do
    [ -e "$f" ] || { echo "gpu-check --mock: $f not built (make tests)"; exit 1; }
  done
  # One emulated GPU, as on the one-GPU machines this script meets first.
  export LD_LIBRARY_PATH="$PWD/build/mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export HCMOCK_NDEV=${HCMOCK_NDEV:-1} HCOLL_SOCKET_IFNAME=lo
  echo "== emulated driver (tests/mock): control flow only, every figure meaningless"
else
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
fi

echo "== environment from the driver"
timeout 60 "$probe" env 2>&1 | tee -a "$logs/env.log"

declare -a names results times
fail=0
# One step: name, watchdog seconds, command... Its output goes to
# $logs/<name>.log and here; a PROBE ... FAIL line fails it.
step() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]} r
  case $rc in
    0) r=ok ;;
    77) r="SKIPPED (a failure here)" ;;
    124|137) r="TIMED OUT after ${limit}s (hang?)" ;;
    *) r="FAILED (exit $rc)" ;;
  esac
  if [ $rc -eq 0 ] && grep -q '^PROBE [^:]*: FAIL' "$logs/$name.log"; then r="FAILED (probe)"; rc=1; fi
  # A whole test that needs more GPUs than this machine has (test_gpu_late
  # on one GPU) is not run here, and the summary says so; any other skip fails.
  if [ $rc -eq 77 ] && grep -qE '^SKIP: .*needs? [0-9]+ GPUs' "$logs/$name.log"; then
    r="skipped: needs more GPUs"; rc=0
  fi
  [ $rc -ne 0 ] && fail=1
  names+=("$name"); results+=("$r"); times+=("$((SECONDS - start))s")
}
skip_step() { # name, why
  echo "== $1: skipped: $2"
  names+=("$1"); results+=("skipped: $2"); times+=("-")
}
in_budget() { [ $((SECONDS + ${1:-0})) -lt "$budget" ]; } # [seconds the step needs]

# ---- issue 19's probes: what the emulation could only guess ---------------------
step probe_block 60 "$probe" block
step probe_destroy 60 "$probe" destroy
step probe_allreduce_streams32 90 "$probe" allreduce --extra-streams 32
step probe_allreduce_cdmc1 90 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$probe" allreduce
step probe_allreduce_cdmc1_streams32 90 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$probe" allreduce \
  --extra-streams 32
step probe_three_stage 120 "$probe" three-stage
step probe_handles 60 "$probe" handles
step probe_managed 60 "$probe" managed
step probe_capture 60 "$probe" capture
step probe_kernels 120 "$probe" kernels --bench $([ $mock -eq 1 ] && echo --quick)

if [ $probes_only -eq 0 ]; then
  for t in test_gpu_devpath test_gpu_kernels test_gpu_allreduce test_gpu_coll test_gpu_late \
           test_gpu_driver test_gpu_queues; do
    step "$t" 240 env CK_DEFAULT_TIMEOUT=240 "build/tests/$t"
  done
  # ---- compute-sanitizer on every kernel --------------------------------------------
  san=$CUDA_HOME/bin/compute-sanitizer
  for tool in memcheck racecheck synccheck; do
    if [ ! -x "$san" ]; then
      skip_step "sanitizer_$tool" "no $san"
    elif ! in_budget 30; then
      skip_step "sanitizer_$tool" "time budget (${budget}s) spent"
    else
      step "sanitizer_$tool" 150 "$san" --tool "$tool" --error-exitcode 99 "$probe" kernels --quick
    fi
  done

  # ---- one nsys trace of a 256 MiB three-stage call ------------------------------------
  nsys=$(command -v nsys || ls "$CUDA_HOME"/bin/nsys 2>/dev/null || true)
  if [ -z "$nsys" ]; then
    skip_step nsys_256m "no nsys on PATH or in $CUDA_HOME/bin"
  elif ! in_budget 60; then
    skip_step nsys_256m "time budget (${budget}s) spent"
  else
    rm -f "$logs"/nsys-256m.*
    step nsys_256m 200 "$nsys" profile --trace=cuda --sample=none --cpuctxsw=none \
      --trace-fork-before-exec=true --force-overwrite=true -o "$logs/nsys-256m" \
      "$probe" three-stage --bytes 268435456 --iters 3
    if [ -e "$logs/nsys-256m.nsys-rep" ]; then
      "$nsys" export --type sqlite --force-overwrite=true -o "$logs/nsys-256m.sqlite" \
        "$logs/nsys-256m.nsys-rep" >"$logs/nsys-export.log" 2>&1
      "$nsys" stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv \
        -o "$logs/nsys-256m" "$logs/nsys-256m.sqlite" >"$logs/nsys-stats.log" 2>&1
      step nsys_overlap 60 python3 scripts/nsys-overlap.py "$logs/nsys-256m.sqlite" 4
    fi
  fi

  if in_budget 90; then
    step test_gpu_allreduce_cdmc1 180 env CUDA_DEVICE_MAX_CONNECTIONS=1 CK_DEFAULT_TIMEOUT=240 \
      build/tests/test_gpu_allreduce
  else
    skip_step test_gpu_allreduce_cdmc1 "time budget (${budget}s) spent"
  fi

  # ---- hcoll_perf on device buffers against NCCL, as a user would run it -----------
  if [ $mock -eq 1 ]; then ngpu=$HCMOCK_NDEV; top=4M; else ngpu=$(nvidia-smi -L | grep -c '^GPU'); top=256M; fi
  perf_case() { # name, hcoll_perf arguments...
    local name=$1; shift
    step "$name" 240 bin/hcoll_perf "$@" --deadline 230
    if ! grep -q 'Out of bounds values : 0 OK' "$logs/$name.log"; then
      results[${#results[@]}-1]="FAILED (#wrong)"; fail=1
    fi
  }
  perf_case perf_2x1_nccl -np 2 --ranks-per-node 1 --peer nccl -b 1M -e $top -f 4 -n 10 -w 2 -c 1 --stages
  if [ "$ngpu" -ge 2 ]; then
    perf_case perf_2x2_nccl -np 4 --ranks-per-node 2 --peer nccl -b 1M -e $top -f 4 -n 10 -w 2 -c 1 --stages
  else
    echo "== perf_2x2_nccl: skipped, needs 2 GPUs (this machine has $ngpu)"
  fi
fi

echo
echo "================ gpu-check summary ================"
[ $mock -eq 1 ] && echo "(emulated driver: control flow only, figures meaningless)"
echo "---- environment"
grep -hE '^(nvidia-smi|nvidia-peermem|RDMA devices|CUDA_DEVICE_MAX|page size|dma-buf in)' "$logs/env.log" |
  sed 's/^/  /'
grep -hE '^ENV (cuda driver|gpu 0 [^:]*(pools|ordering|flush|dma-buf)|gpu [0-9]+: |nccl)' "$logs/env.log" |
  sed 's/^ENV /  /'
echo "---- steps"
for i in "${!names[@]}"; do
  printf '  %-34s %-34s %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
done
echo "---- probes (PASS/FAIL against the contract; INFO: what this driver does)"
grep -h '^PROBE' "$logs"/probe_*.log "$logs"/nsys_overlap.log 2>/dev/null | sed 's/^PROBE /  /' |
  cut -c1-230
grep -h '^SKIP' "$logs"/test_gpu_*.log 2>/dev/null | sed 's/^/  note: /'
echo "---- figures"
grep -h '^FIGURE' "$logs"/probe_*.log 2>/dev/null | sed 's/^FIGURE /  /'
grep -h '^BENCH' "$logs"/test_gpu_*.log 2>/dev/null | sed 's/^BENCH /  /'
for f in "$logs"/perf_*.log; do
  [ -e "$f" ] || continue
  echo "  $(basename "$f" .log): size, then hcoll and nccl busbw (GB/s, out of place), hcoll/nccl"
  awk '$1 ~ /^[0-9]+$/ && $6 == "hcoll" {h[$1] = $9} $1 ~ /^[0-9]+$/ && $6 == "nccl" {
         printf "    %10s  %7s  %7s  %s\n", $1, h[$1], $9, $NF }' "$f"
done
[ -e "$logs/nsys_overlap.log" ] && grep -h '^OVERLAP' "$logs/nsys_overlap.log" | sed 's/^OVERLAP /  nsys: /'
grep -h 'ERROR SUMMARY' "$logs"/sanitizer_*.log 2>/dev/null | sed 's/^/  sanitizer: /'
echo "logs: $logs ($SECONDS s in all)"
[ $fail -eq 0 ] && echo "gpu-check: all passed" || echo "gpu-check: FAILURES"
exit $fail
