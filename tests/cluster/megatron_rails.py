"""One rank of the Megatron-style rail check (tests/megatron-rails.test.sh).

TP = 2 x DP = 2 on the emulated cluster (2 nodes x 2 rails): the DP groups
{0,2} and {1,3} come from new_group(backend="hcoll"), one rank per node, and
each must keep its ranks' rail (local rank i on rail i) instead of all
landing on rail 0. Each DP group in turn all-reduces SIZE bytes while the
other waits; the node's local rank 0 reads both rails' tx_bytes around each
turn. Prints one line per turn: "TURN t rail0 <bytes> rail1 <bytes>".
"""
import os
import sys

import torch
import torch.distributed as dist

import hcoll.torch  # noqa: F401  (registers the "hcoll" backend)

SIZE = int(os.environ.get("MR_BYTES", str(32 << 20)))


def tx(rail):
    with open("/sys/class/net/rail%d/statistics/tx_bytes" % rail) as f:
        return int(f.read())


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    tp_size = 2
    dp_groups = [dist.new_group([d * tp_size + t for d in range(world // tp_size)],
                                backend="hcoll") for t in range(tp_size)]
    mine = dp_groups[rank % tp_size]
    buf = torch.full((SIZE // 4,), float(rank), dtype=torch.float32)
    dist.all_reduce(torch.zeros(4), group=mine)  # connections up before counting
    dist.barrier()
    for turn in range(tp_size):
        before = (tx(0), tx(1))
        dist.barrier()
        if rank % tp_size == turn:
            dist.all_reduce(buf, group=mine)
            want = float(sum(d * tp_size + turn for d in range(world // tp_size)))
            if not torch.all(buf == want):
                print("WRONG turn %d: %s" % (turn, buf[:4]), flush=True)
                sys.exit(1)
            buf.fill_(float(rank))
        dist.barrier()
        if local == 0:
            print("TURN %d rail0 %d rail1 %d" % (turn, tx(0) - before[0], tx(1) - before[1]),
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
