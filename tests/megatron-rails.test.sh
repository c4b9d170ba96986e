#!/usr/bin/env bash
# Data-parallel groups keep their rails: the Megatron layout (TP = 2 x
# DP = 2, DP groups from torch.distributed's new_group(backend="hcoll")) on
# the emulated cluster, 2 nodes x 2 rails at 1 gbit/s. While DP group t
# all-reduces 32 MiB, rail t of each node must carry it (>= 0.9 x 32 MiB
# sent) and the other rail almost nothing (< 1/8 of that).
# Needs root (network namespaces) and torch with libtorch-dev for the
# extension; skips (77) otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
py=/usr/bin/python3
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
"$py" -c 'import torch' 2>/dev/null || { echo "SKIP: $py cannot import torch"; exit 77; }
[ "${HCOLL_TEST_BUILD:-build}" = build ] || { echo "SKIP: default build only"; exit 77; }
make -s python >/dev/null || { echo "FAIL: make python"; exit 1; }
id=mr$$
out=$(mktemp -d /tmp/hcoll-mrails.XXXXXX)
trap 'bash tests/cluster/netcluster.sh --id $id down >/dev/null 2>&1; rm -rf "$out"' EXIT
bash tests/cluster/netcluster.sh --id $id up --nodes 2 --rails 2 --rate 1gbit >/dev/null ||
  { echo "SKIP: could not build the emulated cluster"; exit 77; }
cat >"$out/worker.sh" <<SH
#!/usr/bin/env bash
export RANK=\$HCOLL_RANK WORLD_SIZE=\$HCOLL_NRANKS LOCAL_RANK=\$HCC_LOCAL_RANK
export MASTER_ADDR=198.18.0.1 MASTER_PORT=29650 GLOO_SOCKET_IFNAME=rail0
unset HCOLL_RANK HCOLL_NRANKS HCOLL_ROOT
exec env PYTHONPATH=$PWD/python OMP_NUM_THREADS=1 $py $PWD/tests/cluster/megatron_rails.py
SH
chmod +x "$out/worker.sh"
bash tests/cluster/netcluster.sh --id $id run --deadline 180 --out "$out/run" -- "$out/worker.sh" ||
  { echo "FAIL: the job failed"; tail -n 5 "$out"/run/rank*.out; exit 1; }
want=$((32 << 20))
fails=0 turns=0
while read -r _ t _ r0 _ r1; do
  turns=$((turns + 1))
  if [ "$t" = 0 ]; then on=$r0 off=$r1; else on=$r1 off=$r0; fi
  echo "DP group $t: rail$t sent $on bytes, the other rail $off"
  if [ $((on * 10)) -lt $((want * 9)) ] || [ $((off * 8)) -ge "$on" ]; then
    echo "FAIL: DP group $t did not keep to rail $t"; fails=$((fails + 1))
  fi
done < <(grep -h '^TURN' "$out"/run/rank*.out)
[ "$turns" = 4 ] || { echo "FAIL: $turns turn reports, want 4 (2 nodes x 2 turns)"; exit 1; }
[ $fails = 0 ] || exit 1
echo "ok: each DP group's all-reduce on its own rail"
