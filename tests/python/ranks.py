"""Multi-rank test harness for the Python binding (the counterpart of
tests/common/ranks.c): fork N ranks from a parent that has already imported
numpy/torch (saves ~1-2 s of start-up per rank), group them into emulated
nodes through HCOLL_HOSTID, and SIGKILL whatever is left at the deadline so
that a test never hangs.

A rank function returns normally for success; an exception (assert) prints
its traceback on stderr and fails the rank."""
import os
import random
import signal
import socket
import sys
import time
import traceback

TAG = "hcpy-%d" % os.getpid()


def env_setup(liveness_ms=3000):
    """Knobs every rank shares: loopback, short waits so failures show fast."""
    os.environ.setdefault("HCOLL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("HCOLL_TIMEOUT_MS", "20000")
    os.environ.setdefault("HCOLL_LIVENESS_MS", str(liveness_ms))
    os.environ.setdefault("HCOLL_OP_TIMEOUT_MS", "20000")


def free_port():
    """A TCP port free on loopback now (for HCOLL_ROOT), below the kernel's
    ephemeral range: a port from bind(0) is an ephemeral one, which any
    connection made before rank 0 binds it (the bootstrap's, the data
    path's) may be given as its own local port."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low - 1))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, nranks=4, per_node=2, timeout=30.0, args=(), expect_fail=()):
    """Runs fn(rank, nranks, *args) in nranks forked children. Returns a list
    of (exit code or -signal, seconds). Ranks in expect_fail may die."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    start = time.monotonic()
    for r in range(nranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ["HCOLL_HOSTID"] = "%s-node%d" % (TAG, r // per_node)
                fn(r, nranks, *args)
                code = 0
            except BaseException:  # noqa: BLE001 - report any failure of the rank
                sys.stderr.write("rank %d failed:\n%s" % (r, traceback.format_exc()))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    results = [None] * nranks
    while any(x is None for x in results):
        for i, pid in enumerate(pids):
            if results[i] is not None:
                continue
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                code = os.waitstatus_to_exitcode(status)
                results[i] = (code, time.monotonic() - start)
        if time.monotonic() - start > timeout:
            for i, pid in enumerate(pids):
                if results[i] is None:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    results[i] = ("killed at %.0f s deadline" % timeout, timeout)
            break
        time.sleep(0.01)
    bad = [(r, res) for r, res in enumerate(results) if res[0] != 0 and r not in expect_fail]
    if bad:
        raise AssertionError("ranks failed: %s" % bad)
    return results


class FileKV:
    """A dict-like store in a directory: kv[key] = value, and get returns
    None until then, so Comm.from_store polls it (the path a non-c10d store
    takes)."""

    def __init__(self, d):
        self.d = d

    def __setitem__(self, key, value):
        p = os.path.join(self.d, key.replace("/", "_"))
        with open(p + ".tmp", "wb") as f:
            f.write(value)
        os.rename(p + ".tmp", p)

    def get(self, key):
        try:
            with open(os.path.join(self.d, key.replace("/", "_")), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
