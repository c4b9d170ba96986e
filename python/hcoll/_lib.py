"""Finding libhcoll.so.0 and declaring its C signatures (ctypes).

Search order, first hit wins:
  1. HCOLL_LIBRARY: a path to the library (or a directory holding it);
  2. the build tree, when this package runs from a checkout (python/hcoll
     next to the Makefile's lib/, or $HCOLL_TEST_BUILD/lib);
  3. the prefix `make install` recorded in _prefix.py next to this file;
  4. the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig).
"""
import ctypes
import os

SONAME = "libhcoll.so.0"

c_status = ctypes.c_int
c_comm = ctypes.c_void_p
c_req = ctypes.c_void_p
c_op = ctypes.c_int
UNIQUE_ID_BYTES = 128


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


CONFIG_MAGIC = 0x48434F4C
CONFIG_VERSION = 2
CONFIG_UNDEF_INT = -2147483648


class Config(ctypes.Structure):
    """hcoll_config_t, field for field (include/hcoll.h)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("net", ctypes.c_char_p),
        ("socket_ifname", ctypes.c_char_p),
        ("blocking", ctypes.c_int),
        ("rail", ctypes.c_int),
    ]


CALLBACK = ctypes.CFUNCTYPE(None, c_req, c_status, ctypes.c_void_p)


def _candidates():
    env = os.environ.get("HCOLL_LIBRARY")
    if env:
        yield os.path.join(env, SONAME) if os.path.isdir(env) else env
        return  # an explicit choice is never silently replaced
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(repo, "Makefile")) and os.path.isdir(
            os.path.join(repo, "python", "hcoll")):
        build = os.environ.get("HCOLL_TEST_BUILD")
        if build:
            yield os.path.join(repo, build, "lib", SONAME)
        yield os.path.join(repo, "lib", SONAME)
    try:
        from . import _prefix  # written by `make install`
        yield os.path.join(_prefix.LIBDIR, SONAME)
    except ImportError:
        pass
    yield SONAME


def _load():
    tried = []
    for path in _candidates():
        if path != SONAME and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("hcoll: cannot load %s; tried: %s. Build it (make) or set "
                      "HCOLL_LIBRARY to its path." % (SONAME, "; ".join(tried)))


lib, path = _load()

_P = ctypes.POINTER
_VP = ctypes.c_void_p
_SZ = ctypes.c_size_t
_I = ctypes.c_int
_SIGS = {
    "hcoll_version": (_I, []),
    "hcoll_strerror": (ctypes.c_char_p, [c_status]),
    "hcoll_status_name": (ctypes.c_char_p, [c_status]),
    "hcoll_get_unique_id": (c_status, [_P(UniqueId)]),
    "hcoll_comm_init": (c_status, [_P(c_comm), _I, _I, _P(UniqueId), _P(Config)]),
    "hcoll_comm_init_env": (c_status, [_P(c_comm), _P(Config)]),
    "hcoll_comm_split": (c_status, [c_comm, _I, _I, _P(Config), _P(c_comm)]),
    "hcoll_comm_destroy": (c_status, [c_comm]),
    "hcoll_comm_abort": (c_status, [c_comm]),
    "hcoll_comm_get_async_error": (c_status, [c_comm, _P(c_status)]),
    "hcoll_comm_last_error": (ctypes.c_char_p, [c_comm]),
    "hcoll_comm_rank": (c_status, [c_comm, _P(_I)]),
    "hcoll_comm_size": (c_status, [c_comm, _P(_I)]),
    "hcoll_comm_local_rank": (c_status, [c_comm, _P(_I)]),
    "hcoll_comm_local_size": (c_status, [c_comm, _P(_I)]),
    "hcoll_comm_node_count": (c_status, [c_comm, _P(_I)]),
    "hcoll_allreduce": (c_status, [c_comm, _VP, _VP, _SZ, _I, c_op, _VP]),
    "hcoll_allreduce_async": (c_status, [c_comm, _VP, _VP, _SZ, _I, c_op, _VP, _P(c_req)]),
    "hcoll_broadcast": (c_status, [c_comm, _VP, _VP, _SZ, _I, _I, _VP]),
    "hcoll_broadcast_async": (c_status, [c_comm, _VP, _VP, _SZ, _I, _I, _VP, _P(c_req)]),
    "hcoll_barrier": (c_status, [c_comm]),
    "hcoll_barrier_async": (c_status, [c_comm, _P(c_req)]),
    "hcoll_reduce_scatter": (c_status, [c_comm, _VP, _VP, _SZ, _I, c_op, _VP]),
    "hcoll_reduce_scatter_async": (c_status, [c_comm, _VP, _VP, _SZ, _I, c_op, _VP,
                                              _P(c_req)]),
    "hcoll_allgather": (c_status, [c_comm, _VP, _VP, _SZ, _I, _VP]),
    "hcoll_allgather_async": (c_status, [c_comm, _VP, _VP, _SZ, _I, _VP, _P(c_req)]),
    "hcoll_test": (c_status, [c_req, _P(_I)]),
    "hcoll_wait": (c_status, [c_req]),
    "hcoll_request_free": (c_status, [c_req]),
    "hcoll_request_set_callback": (c_status, [c_req, CALLBACK, _VP]),
    "hcoll_op_create_premul_sum": (c_status, [c_comm, _VP, _I, _I, _P(c_op)]),
    "hcoll_op_destroy": (c_status, [c_comm, c_op]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def status_name(status):
    return lib.hcoll_status_name(status).decode()


def strerror(status):
    return lib.hcoll_strerror(status).decode()
