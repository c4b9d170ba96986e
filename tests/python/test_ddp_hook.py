"""hcoll.torch.allreduce_hook in DDP: 4 ranks (2 emulated nodes x 2) on a
gloo process group, 20 steps, each model trained twice from the same
start on the same data: plain DDP (gloo's all-reduce) and DDP with
register_comm_hook(state, allreduce_hook). Final parameters must be
  - bit for bit equal on integer-valued data (float64, integer inputs and
    weights, integer gradients: every sum exact in any order);
  - within 1e-6 on float data (float32 MLP with BatchNorm), for both of
    the hook's averaging modes.
bucket_cap_mb is small enough for at least 4 buckets per step."""
import copy
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402
from hcoll.torch import HcollState, allreduce_hook  # noqa: E402

STEPS = 20
BUCKET_MB = 0.001  # ~1 KB: every layer's gradient in a bucket of its own
# DDP caps its first bucket (the last layers) at this, 1 MiB by default,
# which would hold this whole model; DDP documents it as tunable.
dist._DEFAULT_FIRST_BUCKET_BYTES = 1024


class SumNet(nn.Module):
    """out = sum of 5 linear maps of x: with a loss linear in out, every
    gradient is y^T x, an integer whatever the weights, so each sum is exact
    in any order and the weights stay short dyadic fractions (lr 2^-4)."""

    def __init__(self):
        super().__init__()
        self.maps = nn.ModuleList(nn.Linear(12, 64) for _ in range(5))

    def forward(self, x):
        return sum(m(x) for m in self.maps)


def model(dtype, bn):
    torch.manual_seed(7)
    if dtype == torch.float64:
        m = SumNet().double()
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randint(-2, 3, p.shape, dtype=torch.float64))
        return m
    layers = [nn.Linear(12, 24), nn.ReLU()]
    if bn:
        layers.append(nn.BatchNorm1d(24))
    layers += [nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 16),
               nn.ReLU(), nn.Linear(16, 4)]
    return nn.Sequential(*layers)


def batch(rank, step, dtype):
    g = torch.Generator().manual_seed(1000 * step + rank)
    if dtype == torch.float64:
        return (torch.randint(-3, 4, (8, 12), generator=g).double(),
                torch.randint(-2, 3, (8, 64), generator=g).double())
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def train(model, rank, dtype, hook_state=None):
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    calls = []
    if hook_state is not None:
        def counting_hook(state, bucket):
            fut = allreduce_hook(state, bucket)
            assert isinstance(fut, torch.futures.Future)
            calls.append(bucket.index())
            return fut
        ddp.register_comm_hook(hook_state, counting_hook)
    lr = 2.0 ** -4 if dtype == torch.float64 else 0.01
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.0 if dtype == torch.float64 else 0.9)
    for step in range(STEPS):
        x, y = batch(rank, step, dtype)
        opt.zero_grad()
        out = ddp(x)
        loss = (out * y).sum() if dtype == torch.float64 else ((out - y) ** 2).mean()
        loss.backward()
        opt.step()
        if hook_state is not None and step == STEPS - 1:
            assert len(set(calls)) >= 4, "only %d buckets in a step" % len(set(calls))
            calls.clear()
    return [p.detach().clone() for p in model.parameters()]


def rank_main(rank, size, tmpdir):
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmpdir, "store"), size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    state = HcollState.from_process_group()
    assert state.comm.node_count == 2 and state.comm.local_size == 2
    for dtype, bn, average in ((torch.float64, False, "divide"),
                               (torch.float32, True, "divide"),
                               (torch.float32, True, "premul")):
        base = model(dtype, bn)
        plain = train(copy.deepcopy(base), rank, dtype)
        before = state.buckets
        state.average = average
        hooked = train(copy.deepcopy(base), rank, dtype, state)
        # DDP rebuilds its buckets after the first step (one bucket there).
        assert state.buckets - before >= 4 * (STEPS - 1), state.buckets - before
        worst = max((a - b).abs().max().item() for a, b in zip(plain, hooked))
        moved = max((a - b).abs().max().item() for a, b in zip(plain, base.parameters()))
        assert moved > 1e-3, "training did not move the parameters (%g)" % moved
        if dtype == torch.float64:
            assert all(torch.equal(a, b) for a, b in zip(plain, hooked)), \
                "integer-valued run: hook differs from gloo by %g" % worst
        else:
            assert worst <= 1e-6, "%s hook differs from gloo by %g" % (average, worst)
        if rank == 0:
            print("ddp hook %s%s (%s): max |hook - gloo| = %g after %d steps"
                  % (str(dtype)[6:], "+BN" if bn else "", average, worst, STEPS), flush=True)
    state.comm.destroy()
    dist.destroy_process_group()


def main():
    ranks.env_setup()
    with tempfile.TemporaryDirectory(prefix="hcoll-pyddp-") as d:
        res = ranks.run(rank_main, 4, 2, timeout=90, args=(d,))
    print("ddp hook: 4 ranks (2 nodes x 2), 20 steps, equal to gloo: ok in %.1f s"
          % max(r[1] for r in res))


if __name__ == "__main__":
    main()
