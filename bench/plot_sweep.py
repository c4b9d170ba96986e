#!/usr/bin/env python3
"""Draw and tabulate bin/gloo_bench sweeps (-J files, one per repetition).

    bench/plot_sweep.py [-o OUT.png] [--table] [--title T] REP.json [REP.json ...]

Each JSON holds one run in which every library (hcoll, mpi, gloo, ...) was
timed call by call on the same processes. With several repetitions, each
point is the median over them and the bar spans the lowest to the highest.

  -o OUT.png   latency (median us per call, log-log) and busbw (GB/s) against
               size, every library in one picture (needs python3-matplotlib;
               without it this says so and exits 3, the table still works)
  --table      a Markdown table on stdout: per size, each library's median,
               mean and p99 time, and hcoll's time over each other library's
               (median and mean; the ratio is taken within each repetition,
               then median [lowest-highest] over repetitions)
Exit: 0; 1 bad input; 2 usage; 3 no matplotlib.
"""
import argparse
import json
import statistics
import sys


def load(paths):
    """{(bytes, lib): [row per repetition]}, libs in first-seen order, [run]."""
    cells, libs, meta = {}, [], []
    for p in paths:
        try:
            with open(p) as f:
                run = json.load(f)
            rows = run["rows"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"plot_sweep: {p}: not a gloo_bench -J file ({e})")
        if run.get("tool") != "gloo_bench":
            sys.exit(f"plot_sweep: {p}: not a gloo_bench -J file (no \"tool\": \"gloo_bench\")")
        meta.append(run)
        for r in rows:
            r["iters"] = run["iters"]
            cells.setdefault((r["bytes"], r["lib"]), []).append(r)
            if r["lib"] not in libs:
                libs.append(r["lib"])
    if not cells:
        sys.exit("plot_sweep: no rows")
    return cells, libs, meta


def size_name(b):
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= mult and b % mult == 0:
            return f"{b // mult} {unit}"
    return f"{b} B"


def spread(vals, fmt):
    """median [lowest-highest], or the value alone for one repetition."""
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt.format(m)
    return (fmt + " [" + fmt + "–" + fmt + "]").format(m, min(vals), max(vals))


def ratios(cells, size, lib, other, key):
    """hcoll's key over other's, within each repetition (same run)."""
    a, b = cells.get((size, lib), []), cells.get((size, other), [])
    return [x[key] / y[key] for x, y in zip(a, b) if y[key] > 0]


def md_table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(["---:"] * len(head)) + " |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def best_gloo(cells, size, libs):
    """The Gloo variant with the lowest mean time at size (median over repetitions)."""
    g = [l for l in libs if l.startswith("gloo") and (size, l) in cells]
    return min(g, key=lambda l: statistics.median(r["mean_us"] for r in cells[(size, l)]), default=None)


def table(cells, libs, meta, nrep):
    sizes = sorted({s for s, _ in cells})
    iters = sorted({r["iters"] for r in meta}, reverse=True)
    print(f"{meta[0]['nranks']} ranks, {' or '.join(map(str, iters))} timed calls per size and "
          f"library, {nrep} repetition(s). Times: us per call (slowest rank), median over the "
          "repetitions; [lowest–highest] over them.\n")
    print("Time per call, median / mean / p99 (us):\n")
    md_table(["size"] + libs,
             [[size_name(s)] + [" / ".join("{:.0f}".format(statistics.median(r[k] for r in cells[(s, l)]))
                                           for k in ("median_us", "mean_us", "p99_us"))
                                if (s, l) in cells else "" for l in libs] for s in sizes])
    others = [o for o in ("mpi", "gloo") if o in libs]
    head = ["size"] + [f"hcoll / {o} {k}" for o in others for k in ("median", "mean")]
    head.append("hcoll / fastest Gloo variant, mean")
    rows = []
    for s in sizes:
        row = [size_name(s)]
        for o in others:
            for key in ("median_us", "mean_us"):
                q = ratios(cells, s, "hcoll", o, key)
                row.append(spread(q, "{:.2f}") if q else "")
        b = best_gloo(cells, s, libs)
        q = ratios(cells, s, "hcoll", b, "mean_us") if b else []
        row.append(f"{spread(q, '{:.2f}')} ({b})" if q else "")
        rows.append(row)
    if "hcoll" in libs:
        print("hcoll's time over the other's, taken within each repetition (< 1: hcoll faster):\n")
        md_table(head, rows)
    print("busbw (GB/s, from the mean time):\n")
    md_table(["size"] + libs, [[size_name(s)] + [spread([r["busbw"] for r in cells[(s, l)]], "{:.3f}")
                                                 if (s, l) in cells else "" for l in libs]
                               for s in sizes])
    bad = sum(r["wrong"] for rows in cells.values() for r in rows)
    if bad:
        print(f"**{bad:.0f} wrong elements** in the checked calls.")


def plot(cells, libs, meta, out, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot_sweep: no plot: python3-matplotlib is not installed for {sys.executable} "
              "(apt-get install python3-matplotlib, then run this with /usr/bin/python3)",
              file=sys.stderr)
        sys.exit(3)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5))
    styles = {"hcoll": ("C0", "o", 2.2), "mpi": ("C1", "s", 1.6), "gloo": ("C2", "^", 1.6)}
    for i, lib in enumerate(libs):
        sizes = sorted(s for s, l in cells if l == lib)
        color, marker, width = styles.get(lib, (f"C{3 + i}", "v", 1.0))
        for ax, key in ((ax_t, "median_us"), (ax_b, "busbw")):
            vals = [[r[key] for r in cells[(s, lib)]] for s in sizes]
            mid = [statistics.median(v) for v in vals]
            err = [[m - min(v) for m, v in zip(mid, vals)], [max(v) - m for m, v in zip(mid, vals)]]
            ls = "-" if lib in styles else "--"
            ax.errorbar(sizes, mid, yerr=err, label=lib, color=color, marker=marker, lw=width,
                        ls=ls, ms=4, capsize=2)
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ticks = sorted({s for s, _ in cells})
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_name(t).replace(" ", "") for t in ticks], rotation=45)
    ax_t.set_yscale("log")
    ax_b.set_yscale("log")
    ax_t.set_ylabel("time per call, median (µs)")
    ax_t.set_title("latency (lower is better)")
    ax_b.set_ylabel("busbw (GB/s) = size / mean time × 2(n-1)/n")
    ax_b.set_title("bus bandwidth (higher is better)")
    ax_b.legend()
    fig.suptitle(title or f"all-reduce, float32 sum, {meta[0]['nranks']} ranks")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot_sweep: wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("-o", dest="out")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--title")
    a = ap.parse_args()
    if not a.out and not a.table:
        ap.error("nothing to do: give -o OUT.png and/or --table")
    cells, libs, meta = load(a.json)
    if a.table:
        table(cells, libs, meta, max(len(v) for v in cells.values()))
    if a.out:
        plot(cells, libs, meta, a.out, a.title)


if __name__ == "__main__":
    main()
