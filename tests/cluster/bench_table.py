#!/usr/bin/env python3
"""The markdown table of one tests/cluster/bench.sh sweep, from hcoll_perf's
-J file and the run's facts:
  bench_table.py JSON RATE NODES RAILS SECS CMD PNG GOODPUT GOODPUT_MIN LOAD GOODPUT_CPU_PERCENT
GOODPUT is G, the raw TCP goodput per NIC in GB/s measured on the same
cluster (tests/cluster/goodput.py)."""
import json, os, sys
path, rate, N, L, secs, cmd, png, gp, gp_min, load, gp_cpu = sys.argv[1:12]
d = json.load(open(path))
N, L, gp, gp_min = int(N), int(L), float(gp), float(gp_min)
n = d['nranks']
coll = d.get('coll', 'allreduce')
rows = d['rows']
peer = {'allreduce': 'MPI_Allreduce', 'reduce_scatter': 'MPI_Reduce_scatter_block',
        'allgather': 'MPI_Allgather', 'broadcast': 'MPI_Bcast'}[coll]
busf = {'allreduce': '2(n-1)/n', 'reduce_scatter': '(n-1)/n', 'allgather': '(n-1)/n',
        'broadcast': '1'}[coll]
nicf = {'allreduce': '2(N-1)/N · S/L', 'reduce_scatter': '(N-1)/N · S/L',
        'allgather': '(N-1)/N · S/L', 'broadcast': 'S/L'}[coll]
def size(b):
    # Reduce-scatter and all-gather sizes are whole multiples of nranks
    # elements, so on 6 ranks "64 MiB" is a little less: say so.
    for u, m in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if b >= m * 0.99:
            return f"{b // m} {u}" if b % m == 0 else f"~{round(b / m)} {u}"
    return f"{b} B"
def best(x):
    return min(x['oop']['time_us'], x['ip']['time_us'])
def bus(x):
    return max(x['oop']['busbw'], x['ip']['busbw'])
line = d['line_rate_GBps']
print(f"### {coll}: {N} nodes x {L} rails\n")
print(f"{N} nodes x {L} rails, {n} ranks, each rail {rate} each way "
      f"(line rate R = {line} GB/s per NIC, {d['line_rate_source']}); raw TCP goodput "
      f"G = {gp:.4f} GB/s per NIC (mean of {N * L} NICs, lowest {gp_min:.4f}), measured "
      f"on the same cluster just before (host CPU busy meanwhile: {gp_cpu} %); float32{' sum' if coll in ('allreduce', 'reduce_scatter') else ''}; "
      f"busbw = algbw x {busf}; hcoll's bytes per NIC = {nicf} per call; "
      f"times are the faster of out-of-place and in-place, each the mean of the "
      f"iterations, maximum over ranks. Sweep took {secs} s; load average at its end: {load}.\n")
print("```\n" + cmd + "\n```\n")
print(f"| size | hcoll time (us) | hcoll busbw (GB/s) | hcoll NIC (GB/s) | NIC % of R "
      f"| NIC / G | stages rs / inter / ag (ms) | Open MPI time (us) | Open MPI busbw (GB/s) "
      f"| hcoll / Open MPI busbw |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
hc = [r for r in rows if r['impl'] == 'hcoll']
mp = {r['size']: r for r in rows if r['impl'] == 'mpi'}
for r in hc:
    m = mp.get(r['size'])
    hb = bus(r)
    mb = bus(m) if m else None
    st = r.get('stages_us')
    stages = " / ".join("-" if st[k] is None else f"{st[k] / 1e3:.1f}"
                        for k in ('intra_rs', 'inter', 'intra_ag')) if st else "-"
    cells = [size(r['size']), f"{best(r):.0f}", f"{hb:.3f}", f"{r['nic_GBps']:.4f}",
             f"{r['nic_pct']:.1f}", f"{r['nic_GBps'] / gp:.2f}", stages,
             f"{best(m):.0f}" if m else "-", f"{mb:.3f}" if m else "-",
             f"{hb / mb:.2f}x" if m and mb > 0 else "-"]
    print("| " + " | ".join(cells) + " |")
print()
big = [r for r in hc if r['size'] >= 0.99 * (64 << 20)]  # see size()
if big:
    low = min(r['nic_GBps'] for r in big) / gp
    ratios = [bus(r) / bus(mp[r['size']]) for r in big if r['size'] in mp]
    goal = (f"hcoll NIC >= 0.9 G: lowest {low:.2f} G ({'met' if low >= 0.9 else 'NOT met'})")
    if coll == 'allreduce':
        pct = min(r['nic_pct'] for r in big)
        goal = (f"hcoll NIC >= 95% of R: lowest {pct:.1f}% "
                f"({'met' if pct >= 95 else 'NOT met'}); " + goal)
    print(f"Goals at >= 64 MiB: {goal}; hcoll busbw >= 1.3x {peer}'s: lowest "
          f"{min(ratios):.2f}x ({'met' if min(ratios) >= 1.3 else 'NOT met'}).")
if os.path.exists(png):
    print(f"\nPlot: `{png}` (busbw and NIC % against size, from hcoll_perf --plot).")
print()
