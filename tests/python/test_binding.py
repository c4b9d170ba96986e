"""The ctypes binding across 4 ranks (2 emulated nodes x 2): every
collective on NumPy arrays and on torch CPU tensors, every dtype, the ops
(AVG, PREMUL_SUM included), async Work and its future, split, and the
argument errors. Inputs are small integers, so every result is exact and
compared bit for bit with a NumPy reference. Run by tests/python.test.sh."""
import os
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402
from ranks import FileKV  # noqa: E402

import hcoll  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

N = 1000
DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int32", "int64"]


class NumpyKind:
    name = "numpy"
    dtypes = DTYPES

    @staticmethod
    def make(a, dtype):
        return np.ascontiguousarray(np.asarray(a).astype(dtype))

    @staticmethod
    def to_np(x):
        return np.asarray(x)

    @staticmethod
    def empty(n, dtype):
        return np.zeros(n, dtype=dtype)


class TorchKind:
    name = "torch"
    dtypes = DTYPES + ["bfloat16"]

    @staticmethod
    def make(a, dtype):
        return torch.from_numpy(np.asarray(a).astype("float64")).to(getattr(torch, dtype))

    @staticmethod
    def to_np(x):
        return (x.double() if x.dtype in (torch.bfloat16, torch.float16) else x).numpy()

    @staticmethod
    def empty(n, dtype):
        return torch.zeros(n, dtype=getattr(torch, dtype))


def ref_dtype(dtype):
    return "float32" if dtype == "bfloat16" else dtype


def inputs(rank, dtype, n=N):
    """Small integers, different per rank: exact in every dtype and sum."""
    hi = 7 if dtype in ("int8", "uint8") else 50
    return (np.arange(n) * (rank + 3) + rank) % hi


def check_equal(kind, got, want, what):
    g = kind.to_np(got).astype("float64")
    w = np.asarray(want).astype("float64")
    assert g.shape == w.shape and np.array_equal(g, w), \
        "%s %s: wrong result (first bad %s)" % (kind.name, what,
                                                 np.argwhere(g != w)[:3].tolist())


def collectives(comm, kind, rank, size):
    allin = [inputs(r, "int8") for r in range(size)]
    for dtype in kind.dtypes:
        ins = [inputs(r, dtype) for r in range(size)]
        # SUM in place; the reference wraps like the dtype does.
        x = kind.make(ins[rank], dtype)
        comm.allreduce(x)
        want = np.sum([i.astype(ref_dtype(dtype)) for i in ins], axis=0, dtype=ref_dtype(dtype))
        check_equal(kind, x, want, "allreduce sum " + dtype)
        # MAX / MIN / PROD out of place, input untouched.
        for op, f in ((hcoll.MAX, np.max), (hcoll.MIN, np.min)):
            x, out = kind.make(ins[rank], dtype), kind.empty(N, dtype)
            comm.allreduce(x, out, op=op)
            check_equal(kind, out, f(ins, axis=0), "allreduce %s %s" % (op.name, dtype))
            check_equal(kind, x, ins[rank], "allreduce input kept " + dtype)
        small = [inputs(r, "int8") % 3 for r in range(size)]
        x = kind.make(small[rank], dtype)
        comm.allreduce(x, op=hcoll.PROD)
        check_equal(kind, x, np.prod(small, axis=0), "allreduce prod " + dtype)
        # AVG: floats pre-multiply by 1/4 (exact here), integers truncate.
        x = kind.make(ins[rank], dtype)
        comm.allreduce(x, op=hcoll.AVG)
        s = np.sum(ins, axis=0)
        want = s / size if dtype in ("float32", "float16", "float64", "bfloat16") else s // size
        if dtype in ("int8", "uint8"):
            want = np.sum([i.astype(dtype) for i in ins], axis=0, dtype=dtype) // size
        check_equal(kind, x, want, "allreduce avg " + dtype)
        # PREMUL_SUM: each rank its own scalar (rank + 1).
        x = kind.make(allin[rank], dtype)
        comm.allreduce(x, op=hcoll.premul_sum(rank + 1))
        check_equal(kind, x, np.sum([(r + 1) * allin[r] for r in range(size)], axis=0),
                    "allreduce premul_sum " + dtype)
        # reduce_scatter: block r of the sum.
        big = [inputs(r, dtype, N * size) for r in range(size)]
        out = kind.empty(N, dtype)
        comm.reduce_scatter(kind.make(big[rank], dtype), out)
        want = np.sum([b.astype(ref_dtype(dtype)) for b in big], axis=0,
                      dtype=ref_dtype(dtype))[rank * N:(rank + 1) * N]
        check_equal(kind, out, want, "reduce_scatter " + dtype)
        # allgather: rank r's block r.
        out = kind.empty(N * size, dtype)
        comm.allgather(kind.make(ins[rank], dtype), out)
        check_equal(kind, out, np.concatenate(ins), "allgather " + dtype)
        # broadcast from the last rank.
        x = kind.make(ins[rank], dtype)
        comm.broadcast(x, root=size - 1)
        check_equal(kind, x, ins[size - 1], "broadcast " + dtype)
    comm.barrier()


def async_work(comm, kind, rank, size):
    ins = [inputs(r, "float32") for r in range(size)]
    xs = [kind.make(ins[rank] + i, "float32") for i in range(4)]
    works = [comm.allreduce(x, async_op=True) for x in xs]
    works.append(comm.barrier(async_op=True))
    out = kind.empty(N * size, "float32")
    works.append(comm.allgather(kind.make(ins[rank], "float32"), out, async_op=True))
    assert works[-1].wait(timeout=20) is out
    for i, w in enumerate(works[:4]):
        fut = w.get_future()
        assert fut.result(timeout=20) is xs[i], "the future's value is the output buffer"
        assert w.is_completed()
        check_equal(kind, xs[i], np.sum(ins, axis=0) + size * i, "async allreduce %d" % i)
    assert works[4].wait(timeout=20) is None and works[4].is_completed()
    # A done-callback added after completion runs at once and sees the value.
    seen = []
    works[0].get_future().add_done_callback(lambda f: seen.append(f.result()))
    assert seen and seen[0] is xs[0]
    r = kind.empty(N, "float32")
    w = comm.reduce_scatter(kind.make(inputs(rank, "float32", N * size), "float32"), r,
                            op=hcoll.AVG, async_op=True)
    w2 = comm.broadcast(kind.make(ins[rank], "float32"), root=1, async_op=True)
    w.wait(20)
    check_equal(kind, w2.wait(20), ins[1], "async broadcast")
    # wait() for a later request inside a completion callback is refused,
    # not a hang: rank 0 enters late, so elsewhere the first barrier's
    # callback runs on hcoll's thread, before the second barrier can end.
    if rank == 0:
        time.sleep(0.3)
    first, second = comm.barrier(async_op=True), comm.barrier(async_op=True)
    got = []

    def in_callback(f):
        on_worker = threading.get_ident() != main_thread
        try:
            second.wait(timeout=5)
            got.append((on_worker, "returned"))
        except BaseException as e:  # noqa: BLE001 - recorded and checked below
            got.append((on_worker, e))
    main_thread = threading.get_ident()
    first.get_future().add_done_callback(in_callback)
    second.wait(20)
    on_worker, what = got[0]
    if on_worker:  # (rank 0, or a rank stalled 0.3 s by the host, runs it here)
        assert isinstance(what, hcoll.HcollError) and "never return" in str(what), got
    else:
        assert what == "returned", got
    seen = np.array([int(on_worker)], np.int32)
    comm.allreduce(seen)
    assert seen[0] >= 1, "no rank ran the callback on hcoll's thread"


def errors(comm, kind, rank, size):
    def expect(fn, words, status="HCOLL_ERR_INVALID_ARG"):
        try:
            fn()
        except hcoll.HcollError as e:
            assert e.status == status, "status %s, expected %s (%s)" % (e.status, status, e)
            for w in words:
                assert w in str(e), "message %r lacks %r" % (str(e), w)
            return e
        raise AssertionError("no HcollError for %s" % words)

    if kind.name == "numpy":
        expect(lambda: comm.allreduce(np.zeros(4, np.complex64)), ["dtype complex64"])
        expect(lambda: comm.allreduce(np.zeros(4, bool)), ["dtype bool"])
        expect(lambda: comm.allreduce(np.zeros(8, np.float32)[::2]), ["not C-contiguous"])
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        expect(lambda: comm.allreduce(ro), ["read-only"])
        expect(lambda: comm.allreduce([1.0, 2.0]), ["expected a numpy.ndarray", "list"])
    else:
        expect(lambda: comm.allreduce(torch.zeros(4, dtype=torch.complex64)),
               ["dtype torch.complex64"])
        expect(lambda: comm.allreduce(torch.zeros(4, dtype=torch.bool)), ["dtype torch.bool"])
        expect(lambda: comm.allreduce(torch.zeros(4, 4).t()), ["not contiguous"])
        expect(lambda: comm.allreduce(torch.zeros(4), torch.zeros(4, dtype=torch.float64)),
               ["dtypes differ"])
    z = kind.empty(N, "float32")
    expect(lambda: comm.reduce_scatter(z, kind.empty(N, "float32")), ["expected size (4)"])
    expect(lambda: comm.allgather(z, kind.empty(N, "float32")), ["expected size (4)"])
    expect(lambda: comm.broadcast(z, root=size), ["root 4 is not a rank"])
    expect(lambda: comm.allreduce(z, op=17), ["op: 17"])
    expect(lambda: comm.allreduce(kind.empty(4, "int32"), op=hcoll.premul_sum(0.5)),
           ["not an integer"])
    # Every rank still agrees after the refused calls.
    comm.barrier()


def aborted(comm, rank, tmpdir):
    """Rank 3 stays out of a barrier, so ranks 0-2's async barriers hang
    until rank 0 aborts: its own future raises HCOLL_ERR_ABORTED (with the
    message read while the callback runs), the others' a peer failure."""
    sub = comm.split(0)
    flag = os.path.join(tmpdir, "aborted")
    if rank == 3:
        while not os.path.exists(flag):
            time.sleep(0.01)
        sub.destroy()
        return
    work = sub.barrier(async_op=True)
    if rank == 0:
        time.sleep(0.2)
        assert not work.is_completed(), "barrier finished without rank 3"
        sub.abort()
        open(flag, "w").close()
    err = work.exception(timeout=10)
    want = "HCOLL_ERR_ABORTED" if rank == 0 else "HCOLL_ERR_PEER_FAILED"
    assert isinstance(err, hcoll.HcollError) and err.status == want, (err, want)
    assert rank != 0 or sub._handle is None
    if rank != 0:
        sub.destroy()


def from_env(rank, size, port):
    """Comm.from_env with HCOLL_RANK/NRANKS/ROOT, config keywords passed
    through, and an init error's status and message."""
    os.environ.update(HCOLL_RANK=str(rank), HCOLL_NRANKS=str(size),
                      HCOLL_ROOT="127.0.0.1:%d" % port)
    try:
        hcoll.Comm.from_env(net="bogus")
    except hcoll.HcollError as e:
        assert e.status == "HCOLL_ERR_INVALID_ARG" and "bogus" in e.message, e
    else:
        raise AssertionError("net='bogus' accepted")
    with hcoll.Comm.from_env(socket_ifname="lo", timeout_ms=20000, rail=0) as c:
        assert (c.rank, c.size) == (rank, size)
        x = np.full(3, rank + 1, np.int64)
        c.allreduce(x, op=hcoll.PROD)
        assert x.tolist() == [24] * 3, x
    for k in ("HCOLL_RANK", "HCOLL_NRANKS", "HCOLL_ROOT"):
        del os.environ[k]


def rank_main(rank, size, tmpdir, port):
    comm = hcoll.Comm.from_store(FileKV(tmpdir), rank, size)
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size, comm.node_count) == \
        (rank, size, rank % 2, 2, 2), repr((comm.local_rank, comm.local_size, comm.node_count))
    kinds = [NumpyKind] + ([TorchKind] if torch is not None else [])
    for kind in kinds:
        collectives(comm, kind, rank, size)
        async_work(comm, kind, rank, size)
        errors(comm, kind, rank, size)
    # split: even and odd ranks, ordered by key = -rank (reversed).
    sub = comm.split(rank % 2, key=-rank)
    assert sub.size == 2 and sub.rank == 1 - rank // 2, (sub.rank, sub.size)
    x = np.array([rank], np.int64)
    sub.allreduce(x)
    assert x[0] == (0 + 2 if rank % 2 == 0 else 1 + 3), x
    none = comm.split(None if rank == 0 else 1)
    assert (none is None) == (rank == 0)
    if none is not None:
        assert none.size == 3
        none.destroy()
    sub.destroy()
    # The c10d store (a blocking get), if torch is here.
    if torch is not None:
        import torch.distributed as dist
        store = dist.FileStore(os.path.join(tmpdir, "filestore"), size)
        with hcoll.Comm.from_store(store, rank, size) as c2:
            t = torch.full((8,), float(rank))
            c2.allreduce(t)
            assert t.tolist() == [6.0] * 8, t
        assert c2._handle is None
    aborted(comm, rank, tmpdir)
    from_env(rank, size, port)
    comm.destroy()
    comm.destroy()  # idempotent
    try:
        comm.allreduce(np.zeros(4, np.float32))
    except hcoll.HcollError as e:
        assert e.status == "HCOLL_ERR_INVALID_ARG" and "destroyed" in str(e), e
    else:
        raise AssertionError("a destroyed communicator accepted an allreduce")


def main():
    ranks.env_setup()
    with tempfile.TemporaryDirectory(prefix="hcoll-py-") as d:
        res = ranks.run(rank_main, 4, 2, timeout=60, args=(d, ranks.free_port()))
    print("binding: 4 ranks (2 nodes x 2), numpy%s: ok in %.1f s"
          % (" and torch" if torch is not None else " only (no torch)",
             max(r[1] for r in res)))


if __name__ == "__main__":
    main()
