"""A peer lost mid-job, seen from Python: 4 ranks (2 emulated nodes x 2),
HCOLL_LIVENESS_MS=1000. Rank 3 is SIGKILLed (phase "killed") or SIGSTOPped
(phase "stopped") while the others have an async all-reduce in flight:
their futures must raise HcollError, with a status and the communicator's
message, within the liveness window plus slack; later calls fail too
(sticky), and destroy returns promptly."""
import os
import signal
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402
import hcoll  # noqa: E402
from ranks import FileKV  # noqa: E402

LIVENESS_MS = 1000
SLACK_S = 4.0  # a loaded 2-core host


def rank_main(rank, size, tmpdir, how):
    comm = hcoll.Comm.from_store(FileKV(tmpdir), rank, size)
    x = np.ones(1 << 16, np.float32)
    comm.allreduce(x)
    assert x[0] == size
    comm.barrier()
    if rank == size - 1:
        with open(os.path.join(tmpdir, "victim"), "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        time.sleep(60)  # never reached when stopped: rank 0 kills it
    t0 = time.monotonic()
    work = comm.allreduce(x, async_op=True)
    fut = work.get_future()
    err = fut.exception(timeout=LIVENESS_MS / 1000 + SLACK_S + 10)
    took = time.monotonic() - t0
    assert isinstance(err, hcoll.HcollError), "future ended with %r" % (err,)
    assert err.status in ("HCOLL_ERR_PEER_FAILED", "HCOLL_ERR_NETWORK", "HCOLL_ERR_TIMEOUT"), err
    assert err.message, "no message from hcoll_comm_last_error"
    assert str(err).startswith(err.status + ": ") and \
        not str(err).startswith(err.status + ": " + err.status), str(err)
    assert took < LIVENESS_MS / 1000 + SLACK_S, "took %.1f s (liveness %d ms)" % (took, LIVENESS_MS)
    try:
        work.wait()
    except hcoll.HcollError as e:
        assert e is err
    else:
        raise AssertionError("wait() did not raise")
    assert work.is_completed()
    try:
        comm.allreduce(x)
        raise AssertionError("a call after the failure succeeded")
    except hcoll.HcollError as e:
        later = e
    assert comm.async_error() is not None
    t1 = time.monotonic()
    comm.destroy()
    assert time.monotonic() - t1 < 5, "destroy took %.1f s" % (time.monotonic() - t1)
    sys.stdout.write("rank %d (%s peer): %s after %.2f s; later call: %s\n"
                     % (rank, how, err.status, took, later.status))
    sys.stdout.flush()
    if rank == 0 and how == "stopped":
        with open(os.path.join(tmpdir, "victim")) as f:
            os.kill(int(f.read()), signal.SIGKILL)


def main():
    os.environ["HCOLL_LIVENESS_MS"] = str(LIVENESS_MS)
    ranks.env_setup()
    for how in ("killed", "stopped"):
        with tempfile.TemporaryDirectory(prefix="hcoll-pyfail-") as d:
            ranks.run(rank_main, 4, 2, timeout=40, args=(d, how), expect_fail=(3,))
    print("fail: futures raise HcollError within the liveness window: ok")


if __name__ == "__main__":
    main()
