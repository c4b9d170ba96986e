"""hcoll from Python: a ctypes binding of libhcoll (include/hcoll.h).

    import hcoll
    comm = hcoll.Comm.from_env()              # torchrun / mpirun / srun
    comm.allreduce(grads, op=hcoll.AVG)       # numpy arrays, torch tensors
    work = comm.allreduce(grads, async_op=True)
    work.get_future().add_done_callback(...)  # completed by hcoll's callback
    comm.destroy()

hcoll.torch has a DDP communication hook (allreduce_hook). The library is
found through HCOLL_LIBRARY, the build tree, the `make install` prefix,
then the dynamic loader (see _lib.py).
"""
__version__ = "0.1.0"  # = HCOLL_VERSION_STRING (tests/python.test.sh checks)

from ._core import (Comm, Dtype, HcollArgError, HcollError, NOCOLOR, Op, PremulSum, Work,
                    premul_sum, unique_id, version)
from ._lib import path as library_path

SUM, PROD, MAX, MIN, AVG = Op.SUM, Op.PROD, Op.MAX, Op.MIN, Op.AVG

__all__ = ["Comm", "Work", "HcollError", "HcollArgError", "Op", "Dtype", "PremulSum",
           "premul_sum", "unique_id", "version", "library_path", "NOCOLOR",
           "SUM", "PROD", "MAX", "MIN", "AVG"]
