"""DDP step time: the c10d backend "hcoll" against gloo (a benchmark, not a
test). Run it under torchrun, e.g. 2 emulated nodes x 2 on loopback:

  PYTHONPATH=python /usr/bin/python3 -m torch.distributed.run --standalone \\
      --nproc_per_node 4 --redirects 1 --tee 1 bench/torch_ddp_step.py \\
      [--hidden 1024] [--layers 4] [--batch 32] [--steps 20] [--rounds 2]

Every rank makes one hcoll group (the default group, "hcoll") and one gloo
group over the same ranks, then alternates the two for --rounds rounds of
--steps timed steps (after 3 warm-up steps each), so that both see the same
load. A step is forward, backward (DDP's bucketed all-reduces overlap it)
and an SGD update; the time is the slowest rank's mean step. Then, for
comparison, one all-reduce of the whole gradient alone (10 times). Rank 0
prints one line per backend and round, then the medians over rounds.
Under torchrun, workers with LOCAL_RANK 0-1 / 2-3 are node0 / node1
(HCOLL_HOSTID), unless HCOLL_HOSTID is set already or --one-node is given.
"""
import argparse
import os
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--hidden", type=int, default=1024)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--bucket-mb", type=float, default=25.0)
ap.add_argument("--ranks-per-node", type=int, default=2)
ap.add_argument("--one-node", action="store_true")
args = ap.parse_args()

local = int(os.environ["LOCAL_RANK"])
if not args.one_node and "HCOLL_HOSTID" not in os.environ:
    os.environ["HCOLL_HOSTID"] = "node%d" % (local // args.ranks_per_node)
os.environ.setdefault("HCOLL_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import hcoll.torch  # noqa: E402,F401


def model():
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.BatchNorm1d(args.hidden), nn.ReLU()]
    return nn.Sequential(*layers)


def run(pg):
    ddp = nn.parallel.DistributedDataParallel(model(), process_group=pg,
                                              bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001)
    x = torch.randn(args.batch, args.hidden)

    def step():
        opt.zero_grad()
        ddp(x).square().sum().backward()
        opt.step()
    for _ in range(3):
        step()
    dist.barrier(group=pg)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    mean = torch.tensor([(time.perf_counter() - t0) / args.steps])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=pg)
    return float(mean[0])


def comm_only(pg, nfloat, iters=10):
    """Mean time of one all-reduce of the whole gradient (nfloat floats)."""
    t = torch.ones(nfloat)
    dist.all_reduce(t, group=pg)
    dist.barrier(group=pg)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=pg)
    mean = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=pg)
    return float(mean[0])


def main():
    dist.init_process_group("hcoll")
    gloo = dist.new_group(backend="gloo")
    nparams = sum(p.numel() for p in model().parameters())
    rank = dist.get_rank()
    if rank == 0:
        print("ddp step: %d ranks, %d params (%.1f MiB of gradients), batch %d, %d steps x %d "
              "rounds, bucket_cap_mb %g, torch %s, threads %d" % (
                  dist.get_world_size(), nparams, nparams * 4 / 2**20, args.batch, args.steps,
                  args.rounds, args.bucket_mb, torch.__version__, torch.get_num_threads()),
              flush=True)
    times = {"hcoll": [], "gloo": []}
    comm = {"hcoll": [], "gloo": []}
    for r in range(args.rounds):
        for name, pg in (("gloo", gloo), ("hcoll", None)):
            t = run(pg)
            c = comm_only(pg, nparams)
            times[name].append(t)
            comm[name].append(c)
            if rank == 0:
                print("round %d %-5s %.2f ms/step, all-reduce of the whole gradient alone "
                      "%.2f ms" % (r, name, t * 1e3, c * 1e3), flush=True)
    if rank == 0:
        g, h = statistics.median(times["gloo"]), statistics.median(times["hcoll"])
        gc, hc = statistics.median(comm["gloo"]), statistics.median(comm["hcoll"])
        print("median: step gloo %.2f ms, hcoll %.2f ms (gloo/hcoll %.2fx); gradient "
              "all-reduce alone gloo %.2f ms, hcoll %.2f ms (%.2fx)" % (
                  g * 1e3, h * 1e3, g / h, gc * 1e3, hc * 1e3, gc / hc), flush=True)
    dist.barrier(group=gloo)
    os._exit(0)


if __name__ == "__main__":
    main()
