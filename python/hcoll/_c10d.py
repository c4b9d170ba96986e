"""The torch.distributed (c10d) backend "hcoll".

Importing ``hcoll.torch`` registers it; then::

    dist.init_process_group("hcoll")                  # or
    dp = dist.new_group(ranks, backend="hcoll")

The backend is a C++ extension (``csrc/``) built with
``torch.utils.cpp_extension`` the first time a group is created (or ahead
of time by ``make python`` / :func:`load`), cached in a build directory
(``HCOLL_TORCH_BUILD_DIR``; default ``build/torch_ext`` in the source tree,
else ``~/.cache/hcoll/torch_ext``) and rebuilt only when its sources or
flags change.

Per group: rank 0 makes the hcoll unique id and puts it in the group's
c10d store; the others read it there, so hcoll needs no port of its own
beyond the one its id reserves. The group's timeout becomes the
communicator's operation timeout (``hcoll_config_t.op_timeout_ms``, i.e.
HCOLL_OP_TIMEOUT_MS for that communicator). A process's rail in every group
is HCOLL_RAIL, else torchrun's LOCAL_RANK (see _rail). The other HCOLL_*
variables apply as usual (``HCOLL_SOCKET_IFNAME``, ``HCOLL_HOSTID``...).
"""

import datetime
import os
import shutil
import subprocess
import threading

import torch
import torch.distributed as dist

BACKEND = "hcoll"
_STORE_KEY = "hcoll/unique_id"
_HERE = os.path.dirname(os.path.abspath(__file__))
_SRC_ROOT = os.path.normpath(os.path.join(_HERE, "..", ".."))
_SOURCES = ["module.cpp", "process_group_hcoll.cpp"]

_lock = threading.Lock()
_ext = None


def _hcoll_paths():
    """(include dir, library dir) of hcoll: HCOLL_LIBRARY's directory,
    the source tree this package sits in, the prefix a `make install` copy
    records, or pkg-config."""
    lib = os.environ.get("HCOLL_LIBRARY")
    if lib:
        libdir = os.path.dirname(os.path.abspath(lib))
        for inc in (os.environ.get("HCOLL_INCLUDE"), os.path.join(libdir, "..", "include"),
                    os.path.join(_SRC_ROOT, "include")):
            if inc and os.path.isfile(os.path.join(inc, "hcoll.h")):
                return os.path.normpath(inc), libdir
        raise RuntimeError("hcoll: HCOLL_LIBRARY=%s, but no hcoll.h found next to it "
                           "(set HCOLL_INCLUDE)" % lib)
    inc, libdir = os.path.join(_SRC_ROOT, "include"), os.path.join(_SRC_ROOT, "lib")
    if os.path.isfile(os.path.join(inc, "hcoll.h")) and \
            os.path.exists(os.path.join(libdir, "libhcoll.so")):
        return inc, libdir
    try:  # a `make install` copy records its LIBDIR (hcoll/_prefix.py)
        from hcoll import _prefix
        inc = os.path.normpath(os.path.join(_prefix.LIBDIR, "..", "include"))
        if os.path.isfile(os.path.join(inc, "hcoll.h")):
            return inc, _prefix.LIBDIR
    except ImportError:
        pass
    if shutil.which("pkg-config"):
        try:
            out = subprocess.run(["pkg-config", "--variable=includedir", "hcoll"],
                                 check=True, capture_output=True, text=True).stdout.strip()
            ldir = subprocess.run(["pkg-config", "--variable=libdir", "hcoll"],
                                  check=True, capture_output=True, text=True).stdout.strip()
            if out and ldir:
                return out, ldir
        except subprocess.CalledProcessError:
            pass
    raise RuntimeError("hcoll: cannot find hcoll.h and libhcoll.so: build the tree (make), "
                       "install it (make install, with pkg-config), or set HCOLL_LIBRARY")


def _build_dir():
    d = os.environ.get("HCOLL_TORCH_BUILD_DIR")
    if not d:
        if os.path.isdir(os.path.join(_SRC_ROOT, "src")) and os.access(_SRC_ROOT, os.W_OK):
            d = os.path.join(_SRC_ROOT, "build", "torch_ext")
        else:
            d = os.path.join(os.path.expanduser("~"), ".cache", "hcoll", "torch_ext")
    os.makedirs(d, exist_ok=True)
    return d


def load(verbose=False):
    """Build (if needed) and import the extension; returns its module."""
    global _ext
    with _lock:
        if _ext is not None:
            return _ext
        from torch.utils import cpp_extension
        inc, libdir = _hcoll_paths()
        cflags = ["-O2"]
        # CUDA tensors go through hcoll's stream-ordered calls when torch
        # has CUDA and its headers are here (untested without a GPU).
        if torch.version.cuda and cpp_extension.CUDA_HOME:
            cflags.append("-DHCOLL_TORCH_CUDA")
        _ext = cpp_extension.load(
            name="_hcoll_c10d",
            sources=[os.path.join(_HERE, "csrc", s) for s in _SOURCES],
            extra_cflags=cflags,
            extra_include_paths=[inc],
            extra_ldflags=["-L" + libdir, "-lhcoll", "-Wl,-rpath," + libdir],
            build_directory=_build_dir(),
            verbose=verbose)
        return _ext


def _timeout_ms(timeout):
    if timeout is None:
        return -1
    if isinstance(timeout, datetime.timedelta):
        return max(0, int(timeout.total_seconds() * 1000))
    return max(0, int(float(timeout) * 1000))


def _rail():
    """This process's rail for every group it joins: HCOLL_RAIL (hcoll reads
    it), else torchrun's LOCAL_RANK, so that groups of one rank per node
    (Megatron's data-parallel groups) each run on their ranks' own NIC and
    not all on rail 0, which a fresh communicator's local rank would give."""
    if os.environ.get("HCOLL_RAIL"):
        return -1
    try:
        return int(os.environ.get("LOCAL_RANK", "-1"))
    except ValueError:
        return -1


def _create(store, rank, size, timeout):
    """c10d's creator: only the group's members call it, each with the
    group's own (prefixed) store."""
    ext = load()
    if rank == 0:
        uid = ext.unique_id()
        store.set(_STORE_KEY, uid)
    else:
        uid = store.get(_STORE_KEY)
    return ext.ProcessGroupHcoll(bytes(uid), rank, size, _timeout_ms(timeout), _rail())


def register():
    """Register the "hcoll" backend with torch.distributed (idempotent)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create)
