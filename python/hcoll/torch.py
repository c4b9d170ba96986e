"""hcoll for PyTorch: a DDP communication hook that all-reduces gradient
buckets with hcoll instead of the process group.

    import torch.distributed as dist
    from hcoll.torch import HcollState, allreduce_hook
    dist.init_process_group("gloo")            # or any backend DDP runs on
    model = DistributedDataParallel(net)
    model.register_comm_hook(HcollState.from_process_group(), allreduce_hook)

Averaging: as DDP's default, the bucket is divided by the world size and
then summed (average="divide", the default; bit for bit what the default
hook computes, up to the order of the sum). average="premul" uses hcoll's
AVG instead: each element is multiplied by 1/size in float (FLOAT64:
double) and rounded to the bucket's dtype before the sum, in one pass; for
a power-of-two world size the two are identical, otherwise the last bit
may differ. Either way the result is the sum's fixed order in hcoll.h, the
same on every rank.
"""
import torch
import torch.distributed as dist

from ._core import Comm, Op


class HcollState:
    """What allreduce_hook needs: an hcoll Comm whose rank r is the DDP
    group's rank r.

    comm     an hcoll.Comm of the same ranks as DDP's process group
    average  "divide" (default) or "premul", see the module's doc
    """

    def __init__(self, comm, average="divide"):
        if average not in ("divide", "premul"):
            raise ValueError("average must be 'divide' or 'premul', got %r" % (average,))
        self.comm = comm
        self.average = average
        self.buckets = 0  # buckets all-reduced so far (a diagnostic)

    @classmethod
    def from_process_group(cls, group=None, average="divide", **config):
        """A state whose Comm is made over the default group's store (rank 0
        makes the id, the others read it there): call it on every rank of
        the default group, in the same order as any other from_store.
        group: None (the default group) only, for now; for a subgroup make
        the Comm yourself (Comm.from_store or Comm.split) and pass it to
        HcollState(comm). config: as hcoll.Comm."""
        if group is not None and group is not dist.group.WORLD:
            raise ValueError("from_process_group: only the default group; for a subgroup, "
                             "pass HcollState(comm) a Comm of its ranks")
        store = dist.PrefixStore("hcoll", dist.distributed_c10d._get_default_store())
        comm = Comm.from_store(store, dist.get_rank(), dist.get_world_size(), **config)
        return cls(comm, average)


def allreduce_hook(state, bucket):
    """DDP communication hook: averages bucket.buffer() over state.comm and
    returns a torch.futures.Future whose value is that tensor, completed by
    hcoll's completion callback on hcoll's thread (no thread per bucket).
    CPU tensors run on host buffers; CUDA tensors are enqueued on
    torch.cuda.current_stream() (written, but not yet run on a GPU). A
    failure (a peer lost, ...) sets the future's exception to the
    HcollError, which DDP's backward raises."""
    tensor = bucket.buffer()
    comm = state.comm
    if state.average == "divide":
        tensor.div_(comm.size)
        op = Op.SUM
    else:
        op = Op.AVG
    fut = torch.futures.Future(devices=[tensor.device] if tensor.is_cuda else None)
    work = comm.allreduce(tensor, op=op, async_op=True)
    state.buckets += 1

    def done(f):
        err = f.exception()
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(tensor)

    work.get_future().add_done_callback(done)
    return fut

# --- c10d backend "hcoll" (hcoll/_c10d.py): registered on import, so that
# dist.init_process_group("hcoll") and dist.new_group(backend="hcoll") work.
from hcoll import _c10d as _hcoll_c10d  # noqa: E402

_hcoll_c10d.register()
ProcessGroupBackend = _hcoll_c10d.BACKEND
