#!/usr/bin/env bash
# scripts/gpu-check.sh's new parts, end to end on the emulated driver
# (tests/mock), so that the script and its probes (build/tests/gpu_probe)
# work before they meet a GPU:
#   - `gpu-check.sh --mock --probes-only`: the environment log (from the shell
#     and from the driver), every probe under its watchdog, the summary;
#     each probe gives a verdict, and those the emulation fixes are checked
#     (cuMemFree blocks while another stream waits: the control that shows
#     the blocking probe can see blocking; the all-reduces, three stages on
#     one GPU, the capture, destroy and the kernels pass);
#   - the probes see failures: with every stream reporting capture
#     (HCMOCK_CAPTURE=1) the capture probe says FAIL and exits 1; without
#     a GPU the probe skips (77);
#   - scripts/nsys-overlap.py on two synthetic traces: pipelined segments
#     pass, serialised ones fail.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
probe=$build/tests/gpu_probe
for f in "$build/mock/libcuda.so.1" "$build/mock/libnccl.so.2" "$probe"; do
  [ -e "$f" ] || { echo "FAIL: $f not built (make tests)"; exit 1; }
done
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# The script reads build/; another build tree is not what it checks.
if [ "$build" != build ]; then
  echo "SKIP: gpu-check.sh --mock runs on build/, not $build"; exit 77
fi

out=$(HCOLL_GPU_CHECK_BUDGET_S=60 timeout --kill-after=10 240 scripts/gpu-check.sh --mock --probes-only 2>&1)
rc=$?
log=build/gpu-check-mock
echo "$out" | sed -n '/gpu-check summary/,$p' | cut -c1-160
[ $rc -eq 0 ] || fail "gpu-check.sh --mock --probes-only exited $rc"
grep -q '^kernel: ' "$log/env.log" || fail "no shell environment log"
for k in 'cuda driver API version' 'gpu 0: .*compute capability' 'nccl: ' \
         'memory pools' 'writes ordering' 'dma-buf supported' 'CUDA_DEVICE_MAX_CONNECTIONS'; do
  grep -qE "^ENV .*$k" "$log/env.log" || fail "environment log lacks '$k'"
done
want() { # probe name, verdict regex
  grep -hqE "^PROBE $1: ($2) " "$log"/probe_*.log || fail "probe $1: want $2, got: $(grep -h "^PROBE $1:" "$log"/probe_*.log)"
}
want block.cuMemFree INFO
grep -hq '^FIGURE block.cuMemFree: blocks' "$log/probe_block.log" ||
  fail "the blocking probe did not see cuMemFree block (the emulation synchronises it)"
for c in cuMemFreeHost cuModuleUnload; do
  grep -hqE "^FIGURE block.$c: (blocks|returns)" "$log/probe_block.log" || fail "no $c observation"
done
want destroy.app_stream_waiting PASS
want allreduce.cdmc_default.streams_32 PASS
want allreduce.cdmc_1.streams_0 PASS
want allreduce.cdmc_1.streams_32 PASS
want three_stage.one_gpu PASS
want capture.global_other_thread PASS
want 'handles\.[a-z0-9_]+' 'PASS|FAIL'
[ "$(grep -hc '^PROBE handles\.' "$log/probe_handles.log")" -eq 4 ] || fail "want 4 handle verdicts"
want managed.allreduce 'PASS|FAIL|SKIP'
if grep -q '#define HCOLL_BUILD_KERNELS 1' build/gen/hc_build.h; then
  want kernels.misaligned PASS
  grep -hq '^FIGURE kernels.bw float32 sum .*(0,4,8)B' "$log/probe_kernels.log" ||
    fail "no misaligned bandwidth figure"
fi

# The probes report failures.
export LD_LIBRARY_PATH="$PWD/build/mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" HCOLL_SOCKET_IFNAME=lo
o=$(HCMOCK_CAPTURE=1 timeout 60 "$probe" capture 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q '^PROBE capture.global_other_thread: FAIL' <<<"$o" ||
  fail "every stream capturing: want the capture probe to fail (rc $rc): $o"
o=$(HCMOCK_NDEV=0 timeout 60 "$probe" block 2>&1); rc=$?
[ $rc -eq 77 ] && grep -q '^SKIP: no GPU' <<<"$o" || fail "no GPU: want skip 77, rc $rc: $o"

# nsys-overlap.py on synthetic traces (the nsys SQLite tables it reads).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/env python3 - "$tmp" <<'EOF'
import sqlite3, sys
for overlap in (0, 1):
    db = sqlite3.connect(f"{sys.argv[1]}/t{overlap}.sqlite")
    db.execute("CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INT, end INT, streamId INT, "
               "globalPid INT, shortName INT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY(start INT, end INT, streamId INT, "
               "globalPid INT, copyKind INT, bytes INT)")
    db.execute("INSERT INTO StringIds VALUES(1, 'ncclDevKernel_ReduceScatter_Sum_f32_RING_LL')")
    t = 0
    for call in range(4):
        for k in range(4):  # RS(k), then segment k's D2H: during RS(k+1) or after it
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES(?,?,7,?,1)",
                       (t, t + 10**6, 5 << 24))
            c = t + 10**6 + (0 if overlap else 10**6)
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES(?,?,13,?,2,4194304)",
                       (c, c + 4 * 10**5, 5 << 24))
            t += 10**6 if overlap else 6 * 10**6
        t += 10**7
    db.commit()
EOF
o=$(python3 scripts/nsys-overlap.py "$tmp/t1.sqlite" 4)
grep -q '^PROBE nsys.rs_ring_overlap: PASS 12 of 16' <<<"$o" || fail "pipelined trace: $o"
o=$(python3 scripts/nsys-overlap.py "$tmp/t0.sqlite" 4)
grep -q '^PROBE nsys.rs_ring_overlap: FAIL 0 of 16' <<<"$o" || fail "serialised trace: $o"

if [ $fails -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
