#!/usr/bin/env bash
# examples/allreduce_mpi under mpirun: the unique id travels by MPI_Bcast,
# 4 ranks as 2 emulated nodes x 2 (HCOLL_HOSTID from the MPI rank, set by a
# shell between mpirun and the program), and the example compares hcoll's
# sum with MPI_Allreduce's. Checks the exit status and the reported layout
# and "0 wrong". Skips (77) where mpicc or mpirun is missing (the example
# is then not built).
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
prog=$build/examples/allreduce_mpi
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "SKIP: no mpicc/mpirun (apt-get install libopenmpi-dev openmpi-bin): allreduce_mpi not built"
  exit 77
fi
[ -x "$prog" ] || { echo "FAIL: $prog not built (make; mpicc is present)"; exit 1; }
# As in perf-run.test.sh: Open MPI's own allocations are not hcoll's leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export HCOLL_SOCKET_IFNAME=lo HCOLL_TIMEOUT_MS=20000
out=$(timeout --kill-after=5 90 mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 \
        --mca btl tcp,self,vader --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
        -x HCOLL_SOCKET_IFNAME -x HCOLL_TIMEOUT_MS -x ASAN_OPTIONS \
        sh -c 'HCOLL_HOSTID=node$((OMPI_COMM_WORLD_RANK / 2)) exec "$0" 65537' "$PWD/$prog" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: mpirun exited $rc"; exit 1; }
grep -q '^4 ranks on 2 nodes (2 per node): 65537 floats in .* ms, 0 wrong against MPI_Allreduce$' \
  <<<"$out" || { echo "FAIL: want 4 ranks on 2 nodes x 2 and 0 wrong"; exit 1; }
echo "allreduce_mpi: ok"
