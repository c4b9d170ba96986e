#!/usr/bin/env bash
# bin/gloo_bench (Gloo's all-reduce against hcoll, bench/gloo_bench.cc) and
# bench/plot_sweep.py, a tiny sweep on loopback (a few seconds):
#   - bad flags: usage error (exit 2) with a message; --help
#   - -np 4 as 2 emulated nodes x 2: a row per size and library, #wrong 0,
#     min <= median <= p99, busbw = size / mean x 2(n-1)/n, JSON = rows
#   - plot_sweep.py: the table from that JSON, the picture (or, without
#     python3-matplotlib, its message and exit 3), bad input refused
#   - under mpirun (a build with mpicxx): the mpi row, checked
# Skipped (77) where libgloo-dev is not installed, so bin/gloo_bench is not
# built; a missing binary where it is installed fails.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
bindir=bin
[ "$build" != build ] && [ -d "$build/bin" ] && bindir=$build/bin
bench=$bindir/gloo_bench
if [ ! -x "$bench" ]; then
  if [ -f /usr/include/gloo/allreduce.h ]; then echo "FAIL: $bench not built (make)"; exit 1; fi
  echo "SKIP: libgloo-dev is not installed, so $bench is not built"
  exit 77
fi
tmp=$(mktemp -d /tmp/hcoll-gloo-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export HCOLL_SOCKET_IFNAME=lo HCOLL_TIMEOUT_MS=20000
# Gloo's and Open MPI's own allocations read as leaks under ASan; hcoll's
# are checked by every other test.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3

# ---- flags --------------------------------------------------------------
for f in "-b x" "-e 4Q" "-b 64M -e 4K" "-n 0" "-f 1" "-c 2" "-A nccl" "-A gloo,xor" \
         "-np 0" "-np 3 --ranks-per-node 2" "--deadline 0" "--bogus 1" "-J"; do
  # shellcheck disable=SC2086
  out=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$bench" -np 2 $f 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "gloo_bench $f: exit $rc, want 2"
  grep -q '^gloo_bench: ' <<<"$out" && grep -q '^usage: ' <<<"$out" || fail "gloo_bench $f: no message: $out"
done
out=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$bench" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q 'run under mpirun or give -np' <<<"$out" || fail "no launcher: rc $rc: $out"
out=$(env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK "$bench" -np 2 -A mpi 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- '-A mpi needs' <<<"$out" || fail "-A mpi with -np: rc $rc: $out"
"$bench" --help | grep -q 'gloo_ring_chunked' || fail "--help does not name the algorithms"

# ---- 2 x 2 on loopback, every Gloo variant --------------------------------
libs=hcoll,gloo,gloo_ring,gloo_ring_chunked,gloo_hd
out=$(timeout 120 "$bench" -np 4 --ranks-per-node 2 -b 4K -e 256K -f 8 -n 4 -w 1 -A $libs \
        -J "$tmp/run.json" --deadline 100 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "-np 4: exit $rc"
grep -q '^# gloo_bench: 4 ranks (2 emulated nodes x 2 for hcoll)' <<<"$out" || fail "-np 4: header"
grep -q '^# all results correct' <<<"$out" || fail "-np 4: not all correct"
rows=$(grep -E '^ +[0-9]+ ' <<<"$out")
[ "$(wc -l <<<"$rows")" -eq 15 ] || fail "-np 4: want 3 sizes x 5 libraries = 15 rows"
for lib in ${libs//,/ }; do
  [ "$(awk -v l=$lib '$2 == l' <<<"$rows" | wc -l)" -eq 3 ] || fail "-np 4: $lib: want 3 rows"
done
# columns: size lib median mean p99 min algbw busbw #wrong (times in us, GB/s)
awk '{ want = $1 / $4 / 1e3 * 1.5; d = $8 - want; if (d < 0) d = -d
       if ($9 != 0 || $3 <= 0 || $6 > $3 || $3 > $5 + 0.05 || d > 0.0002 + 0.01 * want) bad = 1 }
     END { exit bad }' <<<"$rows" ||
  fail "-np 4: a row's #wrong, order of min/median/p99 or busbw is off: $rows"
"$py" - "$tmp/run.json" <<'EOF' || fail "-np 4: JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["nranks"] == 4 and d["ranks_per_node"] == 2 and d["iters"] == 4, d
rows = d["rows"]
assert len(rows) == 15, len(rows)
assert {r["bytes"] for r in rows} == {4096, 32768, 262144}, rows
for r in rows:
    assert r["wrong"] == 0 and 0 < r["min_us"] <= r["median_us"] <= r["p99_us"] + 1e-3, r
    assert abs(r["busbw"] - r["bytes"] / r["mean_us"] / 1e3 * 1.5) <= 1e-4 + 1e-3 * r["busbw"], r
EOF

# ---- plot_sweep.py --------------------------------------------------------
tab=$("$py" bench/plot_sweep.py --table "$tmp/run.json" "$tmp/run.json" 2>&1); rc=$?
[ $rc -eq 0 ] || fail "plot_sweep --table: exit $rc: $tab"
grep -q '| hcoll / gloo median | hcoll / gloo mean |' <<<"$tab" || fail "plot_sweep --table: no hcoll / gloo columns: $tab"
# The same run twice: each ratio's spread is nil, so "x [x–x]".
grep -qE '^\| 32 KiB \| ([0-9.]+) \[\1–\1\] \| ([0-9.]+) \[\2–\2\] \|' <<<"$tab" ||
  fail "plot_sweep --table: the 32 KiB ratios: $tab"
out=$("$py" bench/plot_sweep.py -o "$tmp/p.png" "$tmp/run.json" 2>&1); rc=$?
if "$py" -c 'import matplotlib' 2>/dev/null; then
  [ $rc -eq 0 ] && [ -s "$tmp/p.png" ] && [ "$(head -c 4 "$tmp/p.png" | tail -c 3)" = PNG ] ||
    fail "plot_sweep -o: rc $rc, no PNG: $out"
else
  [ $rc -eq 3 ] && grep -q 'python3-matplotlib is not installed' <<<"$out" ||
    fail "plot_sweep without matplotlib: rc $rc: $out"
fi
echo '{"rows": 1' >"$tmp/bad.json"
out=$("$py" bench/plot_sweep.py --table "$tmp/bad.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q 'not a gloo_bench -J file' <<<"$out" || fail "plot_sweep bad JSON: rc $rc: $out"

# ---- under mpirun: the Open MPI peer --------------------------------------
if command -v mpirun >/dev/null && grep -q 'MPI_Allreduce' "$bench" 2>/dev/null; then
  out=$(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 \
          --mca btl tcp,self,vader --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
          --mca mpi_yield_when_idle 1 -x HCOLL_SOCKET_IFNAME -x HCOLL_TIMEOUT_MS -x ASAN_OPTIONS \
          "$bench" --ranks-per-node 2 -b 64K -e 64K -n 3 -w 1 --deadline 100 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "mpirun: exit $rc"
  grep -E '^ +65536 mpi ' <<<"$out" | awk '$9 != 0 { exit 1 }' || fail "mpirun: no correct mpi row"
  [ "$(grep -cE '^ +65536 ' <<<"$out")" -eq 5 ] || fail "mpirun: want hcoll, mpi and 3 Gloo rows"
else
  echo "note: no mpirun, or gloo_bench built without MPI: the mpi peer not run"
fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "gloo: all good"
