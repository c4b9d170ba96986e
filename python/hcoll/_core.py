"""Comm, Work and HcollError: the binding proper (ctypes over libhcoll)."""
import atexit
import collections
import concurrent.futures
import ctypes
import enum
import itertools
import os
import struct
import sys
import threading
import time
import traceback
import weakref

from . import _lib
from ._lib import lib

NOCOLOR = -1


class HcollError(RuntimeError):
    """A failed hcoll call.

    status   the status name, e.g. "HCOLL_ERR_PEER_FAILED"
    code     its numeric value (include/hcoll.h)
    message  the communicator's last error (hcoll_comm_last_error), or the
             binding's own text for an argument it refused
    """

    def __init__(self, code, message):
        self.code = int(code)
        self.status = _lib.status_name(self.code)
        self.message = message
        text = message or _lib.strerror(self.code)
        # hcoll's own messages already start with the status name.
        super().__init__(text if text.startswith(self.status) else "%s: %s" % (self.status, text))


class HcollArgError(HcollError, ValueError):
    """An argument the binding refused before calling hcoll
    (status HCOLL_ERR_INVALID_ARG): wrong type, dtype, size or layout."""

    def __init__(self, message):
        super().__init__(2, message)


class Op(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class Dtype(enum.IntEnum):
    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2
    FLOAT64 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7


_NP_DTYPES = {"float32": Dtype.FLOAT32, "float16": Dtype.FLOAT16, "bfloat16": Dtype.BFLOAT16,
              "float64": Dtype.FLOAT64, "int8": Dtype.INT8, "uint8": Dtype.UINT8,
              "int32": Dtype.INT32, "int64": Dtype.INT64}
_TORCH_DTYPES = {"torch." + k: v for k, v in _NP_DTYPES.items()}
_ITEMSIZE = {Dtype.FLOAT32: 4, Dtype.FLOAT16: 2, Dtype.BFLOAT16: 2, Dtype.FLOAT64: 8,
             Dtype.INT8: 1, Dtype.UINT8: 1, Dtype.INT32: 4, Dtype.INT64: 8}


class PremulSum:
    """The op sum over ranks of (scalar x input), NCCL's PreMulSum. scalar:
    a Python number (each rank may pass its own), or a one-element CUDA
    tensor of the buffers' dtype read on the GPU when the call runs."""

    def __init__(self, scalar):
        self.scalar = scalar


def premul_sum(scalar):
    return PremulSum(scalar)


def version():
    """The library's HCOLL_VERSION_CODE (MAJOR*10000 + MINOR*100 + PATCH)."""
    return lib.hcoll_version()


def _raise_for(status, handle):
    if status != 0:
        msg = lib.hcoll_comm_last_error(handle)
        raise HcollError(status, msg.decode(errors="replace") if msg else "")


class _Buf:
    """One buffer as hcoll sees it: address, element count, dtype, and the
    CUDA stream it is ordered on (None for host memory)."""
    __slots__ = ("obj", "ptr", "count", "dtype", "stream")


def _torch_mod():
    return sys.modules.get("torch")


def _as_buf(x, what, writable):
    b = _Buf()
    b.obj = x
    torch = _torch_mod()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise HcollArgError("%s: %s tensors are not supported (dense only)" % (what, x.layout))
        if not x.is_contiguous():
            raise HcollArgError("%s: tensor is not contiguous (shape %s, stride %s); "
                                "pass t.contiguous()" % (what, tuple(x.shape), x.stride()))
        dt = _TORCH_DTYPES.get(str(x.dtype))
        if dt is None:
            raise HcollArgError("%s: dtype %s is not supported (float32, float16, bfloat16, "
                                "float64, int8, uint8, int32, int64)" % (what, x.dtype))
        if x.device.type not in ("cpu", "cuda"):
            raise HcollArgError("%s: device %s is not supported (cpu, cuda)" % (what, x.device))
        b.ptr, b.count, b.dtype = x.data_ptr(), x.numel(), dt
        # Device buffers are ordered on the caller's current stream, as
        # torch's own collectives are.
        b.stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None
        return b
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise HcollArgError("%s: array is not C-contiguous (strides %s); pass "
                                "numpy.ascontiguousarray(a)" % (what, x.strides))
        if writable and not x.flags.writeable:
            raise HcollArgError("%s: array is read-only" % what)
        dt = _NP_DTYPES.get(x.dtype.name)
        if dt is None or x.dtype.byteorder == ">":
            raise HcollArgError("%s: dtype %s is not supported (float32, float16, bfloat16, "
                                "float64, int8, uint8, int32, int64, native byte order)"
                                % (what, x.dtype))
        b.ptr, b.count, b.dtype, b.stream = x.ctypes.data, x.size, dt, None
        return b
    raise HcollArgError("%s: expected a numpy.ndarray or torch.Tensor, got %s"
                        % (what, type(x).__name__))


def _same_kind(a, b, what):
    if a.dtype != b.dtype:
        raise HcollArgError("%s: dtypes differ (%s, %s)" % (what, a.dtype.name, b.dtype.name))
    if (a.stream is None) != (b.stream is None):
        raise HcollArgError("%s: one buffer is on the GPU, the other in host memory" % what)


def _bf16_bits(v):
    (u,) = struct.unpack("<I", struct.pack("<f", v))
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):
        return (u >> 16) | 0x40  # quiet NaN
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even


def _scalar_bytes(value, dtype):
    if dtype in (Dtype.FLOAT32, Dtype.FLOAT64, Dtype.FLOAT16):
        return struct.pack({Dtype.FLOAT32: "<f", Dtype.FLOAT64: "<d", Dtype.FLOAT16: "<e"}[dtype],
                           float(value))
    if dtype == Dtype.BFLOAT16:
        return struct.pack("<H", _bf16_bits(float(value)))
    if int(value) != value:
        raise HcollArgError("premul_sum: scalar %r is not an integer, the buffers are %s"
                            % (value, dtype.name.lower()))
    n = _ITEMSIZE[dtype]
    return (int(value) & ((1 << (8 * n)) - 1)).to_bytes(n, "little")


# Requests in flight: token -> Work. The one C callback below finds its Work
# here; the entry (and with it the buffers the Work holds) lives until the
# callback has run.
_pending = {}
_pending_lock = threading.Lock()
_tokens = itertools.count(1)
# Set while a completion callback (and the done-callbacks it triggers) runs
# on this thread: a wait() there for a later request would never return.
_in_callback = threading.local()
# Finished Works, released later on a caller's thread: a Work may hold the
# last reference to its Comm, whose destroy must not run on hcoll's thread
# (hcoll refuses it inside a callback of that communicator).
_graveyard = collections.deque()


def _on_done(req, status, arg):
    # Runs on hcoll's worker thread (or at once on the caller's). It may free
    # its own request (hcoll.h allows it) but never blocks on the
    # communicator; exceptions must not reach C.
    try:
        with _pending_lock:
            work = _pending.pop(arg)
        lib.hcoll_request_free(req)
        # Run at once by set_callback (already complete) on the issuing
        # thread, a wait() for a later request simply waits for hcoll.
        outer = getattr(_in_callback, "active", False)
        _in_callback.active = outer or not getattr(_in_callback, "issuing", False)
        try:
            work._finish(status)
        finally:
            _in_callback.active = outer
            _graveyard.append(work)
    except BaseException:  # noqa: B902 - nothing may escape into C
        traceback.print_exc()


_on_done_c = _lib.CALLBACK(_on_done)  # kept alive for the life of the module


class Work:
    """One non-blocking collective. Its buffers are held until it completes.

    wait(timeout=None)  blocks until done; returns the result buffer, or
                        raises HcollError (concurrent.futures.TimeoutError
                        when timeout seconds pass first)
    is_completed()      True once finished (successfully or not)
    get_future()        a concurrent.futures.Future completed from hcoll's
                        completion callback, on hcoll's thread: callbacks
                        added to it run there and must not block on the
                        communicator (no blocking hcoll call, no wait())
    """

    def __init__(self, comm, result, keep):
        self._comm = comm  # alive (not collected, hence not destroyed) until done
        self._handle = comm._handle
        self._result = result
        self._keep = keep
        self._future = concurrent.futures.Future()
        self._future.set_running_or_notify_cancel()

    def _finish(self, status):
        result = self._result
        self._keep = self._result = None
        if status == 0:
            self._future.set_result(result)
        else:
            # The handle is still valid: destroy and abort run the callbacks
            # of the requests they end before they free the communicator.
            msg = lib.hcoll_comm_last_error(self._handle)
            self._future.set_exception(
                HcollError(status, msg.decode(errors="replace") if msg else ""))

    def wait(self, timeout=None):
        if not self._future.done() and getattr(_in_callback, "active", False):
            # hcoll runs callbacks in issue order on one thread: this request
            # cannot finish before the running callback returns.
            raise HcollError(2, "wait() on an unfinished request from inside a completion "
                                "callback would never return")
        return self._future.result(timeout)

    def is_completed(self):
        return self._future.done()

    def get_future(self):
        return self._future

    def exception(self, timeout=None):
        return self._future.exception(timeout)


_live = weakref.WeakSet()


@atexit.register
def _destroy_live():
    # A communicator left open at exit still has hcoll's threads, which
    # would call into a finalising interpreter.
    _graveyard.clear()
    for comm in list(_live):
        comm.destroy()


def _config(timeout_ms=None, chunk_bytes=None, net=None, socket_ifname=None, rail=None):
    if timeout_ms is None and chunk_bytes is None and net is None and socket_ifname is None \
            and rail is None:
        return None
    c = _lib.Config(ctypes.sizeof(_lib.Config), _lib.CONFIG_MAGIC, _lib.CONFIG_VERSION,
                    _lib.CONFIG_UNDEF_INT, 0, None, None, 1, -1)
    if timeout_ms is not None:
        c.timeout_ms = int(timeout_ms)
    if chunk_bytes is not None:
        c.chunk_bytes = int(chunk_bytes)
    if net is not None:
        c.net = net.encode()
    if socket_ifname is not None:
        c.socket_ifname = socket_ifname.encode()
    if rail is not None:
        c.rail = int(rail)
    return c


def unique_id():
    """A fresh rendezvous id (bytes, a credential: share it only with the
    job's ranks). Call it in the process that will be rank 0 (or on its
    host, in a process that stays alive until rank 0 has joined)."""
    uid = _lib.UniqueId()
    _raise_for(lib.hcoll_get_unique_id(ctypes.byref(uid)), None)
    return bytes(uid.internal)


_store_calls = itertools.count()


class Comm:
    """An hcoll communicator. Make one with Comm.from_env(),
    Comm.from_unique_id() or Comm.from_store(); end it with destroy() or a
    `with` block. Calls on one Comm are serialised by the caller (one
    thread at a time), as in C. Config keywords, all optional:
    timeout_ms, chunk_bytes, net ("auto", "ib", "tcp"), socket_ifname, rail
    (hcoll_config_t; unset ones come from the HCOLL_* environment)."""

    def __init__(self, handle):
        self._handle = handle
        self._pid = os.getpid()
        r, s = ctypes.c_int(), ctypes.c_int()
        _raise_for(lib.hcoll_comm_rank(handle, ctypes.byref(r)), handle)
        _raise_for(lib.hcoll_comm_size(handle, ctypes.byref(s)), handle)
        self.rank, self.size = r.value, s.value
        _live.add(self)

    # -- creation ------------------------------------------------------------
    @classmethod
    def from_env(cls, **config):
        """hcoll_comm_init_env: rank, size and root from the launcher's
        environment (torchrun, mpirun, srun, or HCOLL_RANK/HCOLL_NRANKS/
        HCOLL_ROOT). Blocking, collective."""
        h = _lib.c_comm()
        cfg = _config(**config)
        _raise_for(lib.hcoll_comm_init_env(ctypes.byref(h), cfg and ctypes.byref(cfg)), None)
        return cls(h.value)

    @classmethod
    def from_unique_id(cls, uid, rank, size, **config):
        """hcoll_comm_init with the id bytes from unique_id(). Blocking,
        collective over size ranks."""
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != _lib.UNIQUE_ID_BYTES:
            raise HcollArgError("unique id: expected %d bytes, got %r"
                                % (_lib.UNIQUE_ID_BYTES, type(uid).__name__ if not
                                   isinstance(uid, (bytes, bytearray)) else len(uid)))
        cid = _lib.UniqueId()
        ctypes.memmove(cid.internal, bytes(uid), _lib.UNIQUE_ID_BYTES)
        h = _lib.c_comm()
        cfg = _config(**config)
        _raise_for(lib.hcoll_comm_init(ctypes.byref(h), int(size), int(rank), ctypes.byref(cid),
                                       cfg and ctypes.byref(cfg)), None)
        return cls(h.value)

    @classmethod
    def from_store(cls, store, rank, size, key=None, timeout=300.0, **config):
        """Rank 0 makes the id and stores it under key; the others read it.
        store: anything with set(key, bytes) (or store[key] = bytes) and
        get(key) -> bytes, e.g. a torch.distributed Store (its get blocks
        until the key is set) or a shared dict such as a
        multiprocessing.Manager().dict() (get polled until the key appears,
        up to timeout seconds).
        The default key counts from_store calls in this process, so every
        rank must make its communicators in the same order."""
        if key is None:
            key = "hcoll/unique_id/%d" % next(_store_calls)
        if rank == 0:
            uid = unique_id()
            if hasattr(store, "set"):
                store.set(key, uid)
            else:
                store[key] = uid
        else:
            deadline = time.monotonic() + timeout
            while True:
                uid = store.get(key)
                if uid is not None:
                    break
                if time.monotonic() > deadline:
                    raise HcollError(6, "from_store: no id under %r after %.0f s (is rank 0 "
                                        "running?)" % (key, timeout))
                time.sleep(0.01)
            if isinstance(uid, str):
                uid = uid.encode("latin-1")
        return cls.from_unique_id(bytes(uid), rank, size, **config)

    def split(self, color, key=0, **config):
        """hcoll_comm_split: ranks with the same color form a new Comm,
        ordered by (key, rank); color None (or NOCOLOR) takes part and gets
        None. Blocking, collective over this communicator."""
        h = _lib.c_comm()
        cfg = _config(**config)
        col = NOCOLOR if color is None else int(color)
        _raise_for(lib.hcoll_comm_split(self._h(), col, int(key), cfg and ctypes.byref(cfg),
                                        ctypes.byref(h)), self._handle)
        return Comm(h.value) if h.value else None

    # -- lifetime ------------------------------------------------------------
    def destroy(self):
        """hcoll_comm_destroy: waits for outstanding operations (their
        futures complete first), then frees the communicator. Idempotent."""
        h = self._handle
        _live.discard(self)
        if h and self._pid == os.getpid():
            st = lib.hcoll_comm_destroy(h)  # runs the pending requests' callbacks
            self._handle = None
            _raise_for(st, None)
        self._handle = None

    def abort(self):
        """hcoll_comm_abort: outstanding operations fail with
        HCOLL_ERR_ABORTED; peers see HCOLL_ERR_PEER_FAILED."""
        h = self._handle
        _live.discard(self)
        if h and self._pid == os.getpid():
            lib.hcoll_comm_abort(h)  # runs the pending requests' callbacks
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            if getattr(self, "_handle", None):
                self.destroy()
        except Exception:  # noqa: BLE001 - nothing to report to at GC time
            pass

    def _h(self):
        if not self._handle:
            raise HcollError(2, "the communicator was destroyed")
        return self._handle

    # -- queries -------------------------------------------------------------
    def _query(self, fn):
        v = ctypes.c_int()
        _raise_for(fn(self._h(), ctypes.byref(v)), self._handle)
        return v.value

    @property
    def local_rank(self):
        return self._query(lib.hcoll_comm_local_rank)

    @property
    def local_size(self):
        return self._query(lib.hcoll_comm_local_size)

    @property
    def node_count(self):
        return self._query(lib.hcoll_comm_node_count)

    def async_error(self):
        """The status name of the error that left the communicator unusable,
        or None."""
        st = _lib.c_status()
        _raise_for(lib.hcoll_comm_get_async_error(self._h(), ctypes.byref(st)), self._handle)
        return None if st.value == 0 else _lib.status_name(st.value)

    def last_error(self):
        msg = lib.hcoll_comm_last_error(self._h())
        return msg.decode(errors="replace") if msg else ""

    # -- collectives -----------------------------------------------------------
    def _issue(self, blocking_fn, async_fn, args, result, keep, async_op):
        h = self._h()
        while _graveyard:
            _graveyard.popleft()
        if not async_op:
            _raise_for(blocking_fn(h, *args), h)
            return None
        req = _lib.c_req()
        _raise_for(async_fn(h, *args, ctypes.byref(req)), h)
        work = Work(self, result, keep)
        token = next(_tokens)
        with _pending_lock:
            _pending[token] = work
        outer = getattr(_in_callback, "issuing", False)
        _in_callback.issuing = True
        try:
            st = lib.hcoll_request_set_callback(req, _on_done_c, token)
        finally:
            _in_callback.issuing = outer
        if st != 0:  # cannot happen for a fresh request; do not leak it
            with _pending_lock:
                _pending.pop(token, None)
            lib.hcoll_request_free(req)
            _raise_for(st, h)
        return work

    def _op(self, op, dtype, keep):
        """(op value, a destroy function or None) for an Op or PremulSum."""
        if isinstance(op, PremulSum):
            torch = _torch_mod()
            s = op.scalar
            if torch is not None and isinstance(s, torch.Tensor) and s.is_cuda:
                sb = _as_buf(s, "premul_sum scalar", False)
                if sb.dtype != dtype or sb.count != 1:
                    raise HcollArgError("premul_sum: a device scalar must be one element of "
                                        "the buffers' dtype")
                ptr, residence = sb.ptr, 1
                keep.append(s)
            else:
                if torch is not None and isinstance(s, torch.Tensor):
                    s = s.item()
                raw = ctypes.create_string_buffer(_scalar_bytes(s, dtype))
                ptr, residence = ctypes.addressof(raw), 0
            out = _lib.c_op()
            h = self._h()
            _raise_for(lib.hcoll_op_create_premul_sum(h, ptr, int(dtype), residence,
                                                      ctypes.byref(out)), h)
            # Requests already issued keep their copy of a host scalar, so
            # the op can go as soon as the call is issued.
            return out.value, lambda: lib.hcoll_op_destroy(h, out.value)
        try:
            return int(Op(op)), None
        except ValueError:
            raise HcollArgError("op: %r is not one of SUM, PROD, MAX, MIN, AVG or a "
                                "premul_sum()" % (op,)) from None

    def allreduce(self, tensor, out=None, op=Op.SUM, async_op=False):
        """out = op over ranks of tensor (in place when out is None).
        Returns None, or a Work with async_op=True (its result: out)."""
        a = _as_buf(tensor, "allreduce input", out is None)
        o = a if out is None else _as_buf(out, "allreduce output", True)
        _same_kind(a, o, "allreduce")
        if o.count != a.count:
            raise HcollArgError("allreduce: output has %d elements, input %d"
                                % (o.count, a.count))
        keep = [a.obj, o.obj]
        code, destroy = self._op(op, a.dtype, keep)
        try:
            return self._issue(lib.hcoll_allreduce, lib.hcoll_allreduce_async,
                               (a.ptr, o.ptr, a.count, int(a.dtype), code, a.stream),
                               o.obj, keep, async_op)
        finally:
            if destroy:
                destroy()

    def reduce_scatter(self, input, output, op=Op.SUM, async_op=False):
        """output (n elements) on rank r = op over ranks of block r of
        input (size * n elements)."""
        a = _as_buf(input, "reduce_scatter input", False)
        o = _as_buf(output, "reduce_scatter output", True)
        _same_kind(a, o, "reduce_scatter")
        if a.count != o.count * self.size:
            raise HcollArgError("reduce_scatter: input has %d elements, expected size (%d) x "
                                "output (%d)" % (a.count, self.size, o.count))
        keep = [a.obj, o.obj]
        code, destroy = self._op(op, a.dtype, keep)
        try:
            return self._issue(lib.hcoll_reduce_scatter, lib.hcoll_reduce_scatter_async,
                               (a.ptr, o.ptr, o.count, int(a.dtype), code, a.stream),
                               o.obj, keep, async_op)
        finally:
            if destroy:
                destroy()

    def allgather(self, input, output, async_op=False):
        """block r of output (size * n elements) = input (n elements) of
        rank r."""
        a = _as_buf(input, "allgather input", False)
        o = _as_buf(output, "allgather output", True)
        _same_kind(a, o, "allgather")
        if o.count != a.count * self.size:
            raise HcollArgError("allgather: output has %d elements, expected size (%d) x "
                                "input (%d)" % (o.count, self.size, a.count))
        return self._issue(lib.hcoll_allgather, lib.hcoll_allgather_async,
                           (a.ptr, o.ptr, a.count, int(a.dtype), a.stream),
                           o.obj, [a.obj, o.obj], async_op)

    def broadcast(self, tensor, root=0, async_op=False):
        """tensor on every rank = tensor of rank root (in place)."""
        a = _as_buf(tensor, "broadcast buffer", True)
        if not 0 <= int(root) < self.size:
            raise HcollArgError("broadcast: root %d is not a rank (size %d)" % (root, self.size))
        return self._issue(lib.hcoll_broadcast, lib.hcoll_broadcast_async,
                           (a.ptr, a.ptr, a.count, int(a.dtype), int(root), a.stream),
                           a.obj, [a.obj], async_op)

    def barrier(self, async_op=False):
        """Returns once every rank has entered the barrier."""
        return self._issue(lib.hcoll_barrier, lib.hcoll_barrier_async, (), None, [], async_op)

    def __repr__(self):
        state = "destroyed" if not self._handle else "rank %d of %d" % (self.rank, self.size)
        return "<hcoll.Comm %s>" % state
