#!/usr/bin/env python3
"""Does a device all-reduce pipeline its segments on a real GPU?

Reads the SQLite export of an nsys trace of `gpu_probe three-stage --bytes
268435456` (scripts/gpu-check.sh makes it) and, per rank process, takes the
NCCL reduce-scatter kernels of the big calls (the longest ones: `calls` x 4
segments; RS and AG together where NCCL runs them as generic kernels) and
counts how many ran while a staging copy of the ring (a device-to-host or
host-to-device copy on another stream of the same process: stage 2 of an
earlier segment) was running. The design (docs/design.md,
README "GPU buffers") has RS(k+1) on the caller's stream overlap the ring of
segment k on hcoll's.

  scripts/nsys-overlap.py TRACE.sqlite [CALLS]

Prints OVERLAP lines (summarised by gpu-check.sh), a short timeline of the
first big call of the first rank, and one PROBE line.
"""
import sqlite3
import sys

HTOD, DTOH = 1, 2


def columns(db, table):
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def load(db):
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    kcols = columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
    mcols = columns(db, "CUPTI_ACTIVITY_KIND_MEMCPY")
    # One key per process: globalPid where the export has it, else the context.
    kp = "globalPid" if "globalPid" in kcols else "contextId"
    mp = "globalPid" if "globalPid" in mcols else "contextId"
    kname = "shortName" if "shortName" in kcols else "demangledName"
    kernels = [
        (pid, s, e, st, names.get(n, str(n)))
        for pid, s, e, st, n in db.execute(
            f"SELECT {kp}, start, end, streamId, {kname} FROM CUPTI_ACTIVITY_KIND_KERNEL")
    ]
    copies = [
        (pid, s, e, st, kind, nbytes)
        for pid, s, e, st, kind, nbytes in db.execute(
            f"SELECT {mp}, start, end, streamId, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY")
        if kind in (HTOD, DTOH)
    ]
    return kernels, copies


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 4  # warm-up + 3 timed
    db = sqlite3.connect(sys.argv[1])
    try:
        kernels, copies = load(db)
    except sqlite3.Error as e:
        print(f"PROBE nsys.rs_ring_overlap: SKIP the trace has no kernel/memcpy tables ({e})")
        return 0
    # NCCL names its specialised kernels after the collective; others run
    # as ncclDevKernel_Generic, which tells RS from AG apart no more.
    what, per_call = "reduce-scatter", 4
    is_rs = lambda name: "ReduceScatter" in name
    if not any(is_rs(k[4]) for k in kernels):
        what, per_call = "NCCL (RS or AG: generic kernel names)", 8
        is_rs = lambda name: name.startswith("nccl")
    pids = sorted({k[0] for k in kernels if is_rs(k[4])})
    if not pids:
        print("PROBE nsys.rs_ring_overlap: SKIP no NCCL kernel in the trace "
              "(did the three-stage plan run?)")
        return 0
    total = hit = 0
    for pid in pids:
        rs = [k for k in kernels if k[0] == pid and is_rs(k[4])]
        big = sorted(sorted(rs, key=lambda k: k[2] - k[1], reverse=True)[: calls * per_call],
                     key=lambda k: k[1])
        cp = [c for c in copies if c[0] == pid]
        n_ovl = 0
        for _, s, e, st, _ in big:
            if any(c[1] < e and c[2] > s and c[3] != st for c in cp):
                n_ovl += 1
        rs_ms = sum(k[2] - k[1] for k in big) / 1e6
        cp_ms = sum(c[2] - c[1] for c in cp if big and c[1] >= big[0][1]) / 1e6
        print(f"OVERLAP process {pid >> 24 & 0xFFFFFF if pid > 1 << 24 else pid}: "
              f"{n_ovl} of {len(big)} big {what} kernels ran during a staging copy "
              f"on another stream (RS {rs_ms:.1f} ms, staging copies {cp_ms:.1f} ms)")
        total += len(big)
        hit += n_ovl
    # A timeline of the first big call of the first rank.
    pid = pids[0]
    rs = [k for k in kernels if k[0] == pid and is_rs(k[4])]
    first = min(sorted(rs, key=lambda k: k[2] - k[1], reverse=True)[: calls * per_call],
                key=lambda k: k[1])
    t0 = first[1]
    ev = [(k[1], k[2], k[3], k[4][:40]) for k in kernels if k[0] == pid and k[1] >= t0]
    ev += [(c[1], c[2], c[3], ("HtoD" if c[4] == HTOD else "DtoH") + f" {c[5] >> 10} KiB")
           for c in copies if c[0] == pid and c[1] >= t0]
    print("timeline of the first big call (ms from its first RS; stream; what):")
    for s, e, st, label in sorted(ev)[:32]:
        print(f"  {(s - t0) / 1e6:9.3f} .. {(e - t0) / 1e6:9.3f}  stream {st:3}  {label}")
    verdict = "PASS" if hit > 0 else "FAIL"
    print(f"PROBE nsys.rs_ring_overlap: {verdict} {hit} of {total} big {what} kernels "
          f"(all ranks) overlapped a staging copy of an earlier segment's ring "
          f"(the design pipelines RS(k+1) with the ring of segment k)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
