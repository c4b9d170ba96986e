#!/usr/bin/env bash
# The torch.distributed backend "hcoll" (python/hcoll/_c10d.py, csrc/) under
# a real torchrun: /usr/bin/python3 -m torch.distributed.run starts 4
# workers (--standalone) as 2 emulated nodes x 2, each running
# tests/torch/c10d_ranks.py, which says what it checks: every collective
# through torch.distributed, unsupported ops, DDP with BatchNorm over >= 4
# buckets against gloo (bit for bit on integer-valued gradients, 1e-6 on
# floats), the Megatron TP=2 x DP=2 groups from new_group(backend="hcoll"),
# and the group timeout reaching hcoll. Passes when every rank reports
# every check ok.
# The extension is built once (make python's step; cached in
# build/torch_ext, rebuilt only when its sources change) before the
# workers start, so they only load it.
# Skips (77) when /usr/bin/python3 has no torch or torch's C++ headers
# (apt-get install python3-torch libtorch-dev python3-pybind11).
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
py=/usr/bin/python3
deadline=${HCOLL_C10D_DEADLINE:-240}
[ "$build" != build ] || [ -e lib/libhcoll.so ] || { echo "FAIL: lib/libhcoll.so not built (make)"; exit 1; }
if ! "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null; then
  echo "SKIP: $py cannot import torch (apt-get install python3-torch)"
  exit 77
fi
if [ ! -f /usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp ] &&
   ! "$py" -c 'import torch, os, sys; sys.exit(not os.path.exists(os.path.join(os.path.dirname(torch.__file__), "include/torch/csrc/distributed/c10d/ProcessGroup.hpp")))' 2>/dev/null; then
  echo "SKIP: no torch C++ headers for the extension (apt-get install libtorch-dev)"
  exit 77
fi
if [ "$build" != build ]; then
  # The extension links lib/libhcoll.so; another build tree (ASan) has no
  # torch-side counterpart worth its minutes.
  echo "SKIP: the torch extension is tested against the default build only"
  exit 77
fi

tmp=$(mktemp -d /tmp/hcoll-c10d-test.XXXXXX)
trap '[ -n "${HCOLL_C10D_KEEP:-}" ] || rm -rf "$tmp"' EXIT
start=$SECONDS
if ! PYTHONPATH=$PWD/python timeout 600 "$py" -c 'import hcoll._c10d as c; c.load()' >"$tmp/build.log" 2>&1; then
  echo "FAIL: the extension did not build"
  tail -30 "$tmp/build.log"
  exit 1
fi
echo "extension ready after $((SECONDS - start)) s"

# --standalone serves torchrun's rendezvous on port 29400; when another job
# holds it, an equivalent c10d rendezvous on a free port.
rdzv=(--standalone)
if ! "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 29400))' 2>/dev/null; then
  free=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "note: port 29400 is busy; rendezvous on localhost:$free instead of --standalone"
  rdzv=(--rdzv_backend c10d --rdzv_endpoint "localhost:$free" --rdzv_id hcoll-c10d-test)
fi

start=$SECONDS
# torch 1.13's launcher crashes at exit on Python 3.11 without --redirects
# and --tee.
PYTHONPATH=$PWD/python timeout --kill-after=5 "$deadline" \
  "$py" -m torch.distributed.run "${rdzv[@]}" --nnodes 1 --nproc_per_node 4 \
  --redirects 1 --tee 1 --log_dir "$tmp/torchlogs" tests/torch/c10d_ranks.py \
  >"$tmp/out" 2>&1
rc=$?
echo "torchrun: exit $rc after $((SECONDS - start)) s"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ $rc -eq 124 ] && fail "torchrun did not finish within ${deadline}s"
[ $rc -eq 0 ] || fail "torchrun exited $rc"

# What each rank must report ok (c10d_ranks.py's checks, by name).
required="allreduce_sum allreduce_avg allreduce_product allreduce_min allreduce_max
  allreduce_premul_sum allreduce_premul_sum_tensor allreduce_async_future future_then callback_wait_refused broadcast_root0 broadcast_root3
  broadcast_bool all_gather _all_gather_base reduce_scatter _reduce_scatter_base_max barrier
  unsupported_reduce unsupported_alltoall unsupported_band unsupported_dtype non_contiguous
  usable_after_errors ddp_integer_finite ddp_integer_buffers ddp_integer_buckets
  ddp_integer_bitwise ddp_integer_ranks_agree ddp_float_finite ddp_float_buffers
  ddp_float_buckets ddp_float_1e-6 ddp_float_ranks_agree ddp_backend_name megatron_groups
  megatron_dp_allreduce megatron_tp_allreduce timeout_passed timeout_fires"
# Each worker's own stdout (torchrun --log_dir; --tee's merged copy may
# interleave lines of different workers).
for r in 0 1 2 3; do
  log=$(find "$tmp/torchlogs" -path "*/attempt_0/$r/stdout.log" | head -1)
  if [ -z "$log" ]; then
    fail "rank $r: no stdout log"
    continue
  fi
  grep -qx "RANK $r DONE 0 failures" "$log" || fail "rank $r did not finish cleanly"
  bad=$(grep "^CHECK .* FAIL" "$log")
  [ -n "$bad" ] && fail "rank $r: $bad"
  missing=
  for c in $required; do
    grep -qx "CHECK $c ok" "$log" || missing="$missing $c"
  done
  [ -n "$missing" ] && fail "rank $r: not reported ok:$missing"
  echo "rank $r: $(grep -c "^CHECK .* ok$" "$log") checks ok; $(grep "^PHASE" "$log" | tr '\n' ' ')"
done

if [ $fails -gt 0 ]; then
  echo "--- torchrun output"
  tail -60 "$tmp/out"
  echo "$fails check(s) failed"
  exit 1
fi
echo "c10d backend hcoll: collectives, errors, DDP vs gloo, TP x DP groups, timeout: ok"
