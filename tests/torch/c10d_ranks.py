"""One rank of tests/c10d.test.sh, started by torchrun (4 workers as 2
emulated nodes x 2: HCOLL_HOSTID from LOCAL_RANK). Phases, each printing
"CHECK <name> ok" or "CHECK <name> FAIL <why>", then "RANK r DONE":

  coll      every supported collective once through torch.distributed on
            the default group, dist.init_process_group("hcoll"): allreduce
            SUM/AVG/PRODUCT/MIN/MAX/PREMUL_SUM (integer-valued, exact),
            async work + future, broadcast, all_gather, _all_gather_base,
            reduce_scatter, _reduce_scatter_base, barrier
  errors    unsupported ops and dtypes raise "not supported by hcoll: <op>"
            or a dtype message
  ddp       DDP, a small model with BatchNorm, >= 4 buckets, 20 steps, over
            the hcoll default group vs gloo's plain run (a gloo group):
            bit for bit with integer-valued gradients, within 1e-6 on floats
  megatron  TP=2 x DP=2: TP groups {0,1},{2,3} and DP groups {0,2},{1,3}
            made with new_group(backend="hcoll"), an all-reduce in each
  timeout   a group made with timeout=2 s: its communicator's operation
            timeout is 2000 ms, and an all-reduce that rank 0 never joins
            fails on the others after it, with HCOLL_ERR_TIMEOUT (or the
            PEER_FAILED that the first timed-out rank's exit causes)
"""
import datetime
import os
import sys
import time
import traceback

local = int(os.environ["LOCAL_RANK"])
os.environ["HCOLL_HOSTID"] = "node%d" % (local // 2)
os.environ.setdefault("HCOLL_SOCKET_IFNAME", "lo")
os.environ.setdefault("HCOLL_TIMEOUT_MS", "20000")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import hcoll.torch  # noqa: E402,F401  (registers "hcoll")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
failures = 0
DEBUG = {}


def check(name, ok, why=""):
    global failures
    if ok:
        print("CHECK %s ok" % name, flush=True)
    else:
        failures += 1
        print("CHECK %s FAIL %s" % (name, why), flush=True)


def expect_error(name, fn, text):
    try:
        fn()
    except RuntimeError as e:
        check(name, text in str(e), "message %r lacks %r" % (str(e)[:300], text))
        return
    check(name, False, "no error")


def values(r, n=10, dtype=torch.float32):
    """Rank r's integer-valued input: r + 1 + i, exact in every dtype here."""
    return torch.arange(n, dtype=torch.float64).add(r + 1).to(dtype)


def phase_coll():
    n = 10
    for name, op, dt, want in [
        ("sum", dist.ReduceOp.SUM, torch.float32, sum(values(r) for r in range(world))),
        ("avg", dist.ReduceOp.AVG, torch.float32, sum(values(r) for r in range(world)) / world),
        ("product", dist.ReduceOp.PRODUCT, torch.int64,
         torch.stack([values(r, dtype=torch.int64) for r in range(world)]).prod(0)),
        ("min", dist.ReduceOp.MIN, torch.int32, values(0, dtype=torch.int32)),
        ("max", dist.ReduceOp.MAX, torch.int32, values(world - 1, dtype=torch.int32)),
        ("premul_sum", dist._make_nccl_premul_sum(0.5), torch.float64,
         sum(values(r, dtype=torch.float64) for r in range(world)) * 0.5),
        # A factor per rank, as a tensor: sum over r of (r + 1) x input_r.
        ("premul_sum_tensor", dist._make_nccl_premul_sum([torch.tensor([rank + 1.0])]),
         torch.float32, sum((r + 1) * values(r) for r in range(world))),
    ]:
        t = values(rank, n, dt)
        dist.all_reduce(t, op=op)
        check("allreduce_" + name, torch.equal(t, want.to(dt)), "%s != %s" % (t, want))

    # Async: the Work and its future (what DDP consumes) both complete.
    t = values(rank)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    got = fut.wait()[0]
    work.wait()
    check("allreduce_async_future", work.is_completed() and torch.equal(got, t) and
          torch.equal(t, sum(values(r) for r in range(world))), "%s" % got)
    # A chained callback runs on hcoll's thread and sees the result.
    t = values(rank)
    chained = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check("future_then", torch.equal(chained.wait(), 2 * sum(values(r) for r in range(world))))

    # From a future callback on hcoll's thread: issuing works, waiting for
    # the new operation is refused (it cannot finish before the callback
    # returns). The last rank issues late, so the others' callbacks run on
    # hcoll's thread; its own may run at once on this thread, where waiting
    # is fine.
    if rank == world - 1:
        time.sleep(0.5)
    t1, t2 = values(rank), values(rank) * 2
    later = {}

    def issue_and_wait(fut):
        later["work"] = dist.all_reduce(t2, async_op=True)
        try:
            later["work"].wait()
            return "waited"
        except RuntimeError as e:
            return str(e)
    said = dist.all_reduce(t1, async_op=True).get_future().then(issue_and_wait).wait()
    later["work"].wait()
    check("callback_wait_refused", (rank == world - 1 or "would deadlock" in said) and
          torch.equal(t2, 2 * sum(values(r) for r in range(world))), "%s; %s" % (said, t2))

    for root in (0, world - 1):
        b = torch.full((7,), rank, dtype=torch.int64)
        dist.broadcast(b, src=root)
        check("broadcast_root%d" % root, torch.equal(b, torch.full((7,), root)), "%s" % b)
    flags = torch.tensor([rank % 2 == 0, True, rank == 0])
    dist.broadcast(flags, src=1)  # bool: moved as bytes
    check("broadcast_bool", flags.tolist() == [False, True, False], "%s" % flags)

    outs = [torch.zeros(3, dtype=torch.float16) for _ in range(world)]
    dist.all_gather(outs, values(rank, 3, torch.float16))
    check("all_gather", all(torch.equal(outs[r], values(r, 3, torch.float16))
                            for r in range(world)), "%s" % outs)
    flat = torch.zeros(world * 5, dtype=torch.int32)
    dist._all_gather_base(flat, values(rank, 5, torch.int32))
    check("_all_gather_base", torch.equal(
        flat, torch.cat([values(r, 5, torch.int32) for r in range(world)])), "%s" % flat)

    # Rank r's block b holds 100 b + r + i: block b's sum over ranks.
    def block(r, b, n):
        return values(r, n) + 100 * b
    out = torch.zeros(4)
    dist.reduce_scatter(out, [block(rank, b, 4) for b in range(world)])
    want = sum(block(r, rank, 4) for r in range(world))
    check("reduce_scatter", torch.equal(out, want), "%s != %s" % (out, want))
    out = torch.zeros(6, dtype=torch.float64)
    dist._reduce_scatter_base(out, torch.cat([block(rank, b, 6) for b in range(world)]).double(),
                              op=dist.ReduceOp.MAX)
    want = block(world - 1, rank, 6).double()
    check("_reduce_scatter_base_max", torch.equal(out, want), "%s != %s" % (out, want))

    # Nobody leaves the barrier before the late rank has entered it (one
    # host, so one clock).
    if rank == world - 1:
        time.sleep(0.5)
    entered = time.time()
    dist.barrier()
    left = time.time()
    late = torch.tensor([entered], dtype=torch.float64)
    dist.broadcast(late, src=world - 1)
    check("barrier", left >= float(late[0]), "left %.3f s before rank %d entered" % (
        float(late[0]) - left, world - 1))


def phase_errors():
    t = torch.zeros(4)
    expect_error("unsupported_reduce", lambda: dist.reduce(t, dst=0),
                 "not supported by hcoll: reduce")
    expect_error("unsupported_alltoall",
                 lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4)),
                 "not supported by hcoll: alltoall_base")
    expect_error("unsupported_band", lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND),
                 "not supported by hcoll: allreduce with ReduceOp")
    expect_error("unsupported_dtype",
                 lambda: dist.all_reduce(torch.zeros(4, dtype=torch.bool)),
                 "dtype Bool is not supported")
    expect_error("non_contiguous", lambda: dist.all_reduce(torch.zeros(4, 4).t()),
                 "must be contiguous")
    # The group is still usable afterwards (nothing was issued).
    t = torch.ones(3)
    dist.all_reduce(t)
    check("usable_after_errors", torch.equal(t, torch.full((3,), float(world))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Linear(64, 8))

    def forward(self, x):
        return self.body(x)


def train(pg, integer):
    """20 DDP steps over pg; returns the final parameters and buffers and the
    number of buckets DDP used."""
    torch.manual_seed(1234)
    model = Net()
    if integer:
        # Integer-valued gradients: every all-reduce is exact in any order.
        for p in model.parameters():
            p.register_hook(lambda g: torch.round(g * 16).clamp(-256, 256))
    # A bucket closes once it reaches the cap, and the first one has a cap
    # of its own (1 MiB by default): 512 bytes each spreads this model's 10
    # parameters over 5 buckets.
    saved_first = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 512
    try:
        ddp = nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                  bucket_cap_mb=512 / 2**20)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved_first
    opt = torch.optim.SGD(ddp.parameters(), lr=2.0**-12 if integer else 0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(20):
        if integer:
            x = torch.randint(-4, 5, (8, 16), generator=gen).float()
            y = torch.randint(-4, 5, (8, 8), generator=gen).float()
        else:
            x = torch.randn(8, 16, generator=gen)
            y = torch.randn(8, 8, generator=gen)
        opt.zero_grad()
        loss = ((ddp(x) - y) ** 2).sum()
        loss.backward()
        opt.step()
    DEBUG.update(ddp._get_ddp_logging_data())
    buckets = len(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "").split(","))
    # Buffers too: DDP broadcasts rank 0's before each forward.
    params = [t.detach().clone() for t in model.parameters()]
    buffers = [t.detach().clone() for t in model.buffers()]
    return params, buffers, buckets


def phase_ddp(gloo):
    for integer in (True, False):
        kind = "integer" if integer else "float"
        ref, ref_buf, _ = train(gloo, integer)
        got, got_buf, buckets = train(None, integer)  # the default group: "hcoll"
        finite = all(bool(torch.isfinite(t).all()) for t in ref)
        check("ddp_%s_finite" % kind, finite, "the reference run diverged")
        # BatchNorm's running statistics, as the parameters: bit for bit, or
        # 1e-6 (they follow parameters that differ in their last bits).
        bdiff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(ref_buf, got_buf))
        check("ddp_%s_buffers" % kind, bdiff <= (0 if integer else 1e-6), "differ by %g" % bdiff)
        check("ddp_%s_buckets" % kind, buckets >= 4, "%d buckets" % buckets)
        if integer:
            bad = [i for i, (a, b) in enumerate(zip(ref, got)) if not torch.equal(a, b)]
            check("ddp_integer_bitwise", not bad, "tensors %s differ, by up to %g" % (
                bad, max([float((ref[i] - got[i]).abs().max()) for i in bad] or [0])))
            if os.environ.get("HCOLL_C10D_DEBUG"):
                print("DEBUG", {k: v for k, v in DEBUG.items()}, flush=True)
        else:
            diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(ref, got))
            check("ddp_float_1e-6", diff <= 1e-6, "max difference %g" % diff)
        # Every rank ends with the same parameters (checked through gloo).
        flat = torch.cat([t.double().flatten() for t in got])
        lo, hi = flat.clone(), flat.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=gloo)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=gloo)
        check("ddp_%s_ranks_agree" % kind, torch.equal(lo, hi))
    check("ddp_backend_name", dist.get_backend() == "hcoll", dist.get_backend())


def phase_megatron():
    tp_size, dp_size = 2, world // 2
    tp_groups = [dist.new_group([d * tp_size + t for t in range(tp_size)], backend="hcoll")
                 for d in range(dp_size)]
    dp_groups = [dist.new_group([d * tp_size + t for d in range(dp_size)], backend="hcoll")
                 for t in range(tp_size)]
    tp_rank, dp_rank = rank % tp_size, rank // tp_size
    dp, tp = dp_groups[tp_rank], tp_groups[dp_rank]
    check("megatron_groups", dist.get_world_size(dp) == dp_size and
          dist.get_world_size(tp) == tp_size and dist.get_backend(dp) == "hcoll")
    g = torch.arange(6, dtype=torch.float32) + 10 * rank
    dist.all_reduce(g, group=dp)
    members = [d * tp_size + tp_rank for d in range(dp_size)]
    want = sum(torch.arange(6, dtype=torch.float32) + 10 * r for r in members)
    check("megatron_dp_allreduce", torch.equal(g, want), "%s != %s" % (g, want))
    a = torch.full((4,), float(rank))
    dist.all_reduce(a, group=tp)
    want = float(sum(dp_rank * tp_size + t for t in range(tp_size)))
    check("megatron_tp_allreduce", torch.equal(a, torch.full((4,), want)), "%s" % a)


def phase_timeout(gloo):
    pg = dist.new_group(list(range(world)), backend="hcoll",
                        timeout=datetime.timedelta(seconds=2))
    check("timeout_passed", pg.op_timeout_ms == 2000, "op_timeout_ms %s" % pg.op_timeout_ms)
    outcome = None
    if rank != 0:
        t0 = time.time()
        try:
            dist.all_reduce(torch.ones(4), group=pg)
            outcome = ("returned", time.time() - t0, "")
        except RuntimeError as e:
            kind = next((k for k in ("HCOLL_ERR_TIMEOUT", "HCOLL_ERR_PEER_FAILED")
                         if k in str(e)), "other")
            outcome = (kind, time.time() - t0, str(e)[:300])
    # The first rank to time out drops its links, so the others may see
    # that (PEER_FAILED) before their own clock runs out: at least one
    # TIMEOUT, none before the 2 s, none returned.
    seen = [None] * world
    dist.all_gather_object(seen, outcome, group=gloo)
    seen = seen[1:]
    check("timeout_fires", any(k == "HCOLL_ERR_TIMEOUT" for k, _, _ in seen) and
          all(k in ("HCOLL_ERR_TIMEOUT", "HCOLL_ERR_PEER_FAILED") and 1.5 < t < 15
              for k, t, _ in seen), "%s" % seen)


def main():
    dist.init_process_group("hcoll")
    gloo = dist.new_group(backend="gloo")
    for name, fn in [("coll", phase_coll), ("errors", phase_errors),
                     ("ddp", lambda: phase_ddp(gloo)), ("megatron", phase_megatron),
                     ("timeout", lambda: phase_timeout(gloo))]:
        only = os.environ.get("HCOLL_C10D_PHASES")
        if only and name not in only.split(","):
            continue
        t0 = time.time()
        try:
            fn()
        except Exception:
            check("phase_" + name, False, traceback.format_exc().replace("\n", " | "))
        print("PHASE %s %.2f s" % (name, time.time() - t0), flush=True)
    print("RANK %d DONE %d failures" % (rank, failures), flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown of the groups: the timeout phase left one
    # communicator failed on some ranks and waiting on others.
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    main()
