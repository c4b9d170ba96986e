#!/usr/bin/env bash
# hcoll_info --rdma on sysfs fixture trees (tests/fixtures) and on this host:
# devices, states, link layers, rates, the GID table with the chosen entry,
# the NIC per local rank, GPUDirect availability; "none found" and exit 0
# on a host without RDMA devices. hcoll_info --env: every knob of the table
# in src/base/config.c, malformed values flagged, the secret hidden.
# hcoll_info --memreg: the registration counters (hcoll_rdma_counters) of a
# registered buffer all-reduced 100 times, on the emulated verbs provider.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
case "$build" in build) bin=bin ;; *) bin=$build/bin ;; esac
info=$bin/hcoll_info
[ -x "$info" ] || { echo "SKIP: $info not built"; exit 77; }
fail=0
expect() { # description, output, pattern
  if ! grep -qE -- "$3" <<<"$2"; then
    echo "FAIL: $1: no line matching /$3/"; fail=1
  fi
}
expect_not() {
  if grep -qE -- "$3" <<<"$2"; then
    echo "FAIL: $1: unexpected line matching /$3/"; fail=1
  fi
}

out=$(env -u HCOLL_IB_HCA -u HCOLL_IB_GID_INDEX "$info" --rdma --sysfs-root tests/fixtures/sysfs-roce) \
  || { echo "FAIL: exit status $? on sysfs-roce"; fail=1; }
expect roce "$out" '^  mlx5_bond_0:1 +4: ACTIVE +RoCE +rate 200 Gb/sec \(4X HDR\)'
expect roce "$out" '^  mlx5_4:1 +1: DOWN .*not used'
expect roce "$out" 'GID +3 +::ffff:10\.0\.0\.1 +RoCE v2 +<- chosen'
expect roce "$out" 'GID +3 +2001:db8::5 +RoCE v2 +<- chosen'
expect roce "$out" 'mlx5_bond_2:1 has no usable RoCE v2 GID'
expect roce "$out" 'line rate of the selected ports: 700 Gb/s'
expect roce "$out" 'local rank 1 -> \[1\]mlx5_bond_1:1/RoCE \(3 selected\)'
expect roce "$out" 'nvidia-peermem +loaded, /sys/kernel/mm/memory_peers/nv_mem/version'
expect roce "$out" 'dma-buf +kernel supports it \(5\.15'

out=$(HCOLL_IB_HCA='^=mlx5_bond_0' HCOLL_IB_GID_INDEX=1 "$info" --rdma --sysfs-root tests/fixtures/sysfs-roce) \
  || { echo "FAIL: exit status $? with HCOLL_IB_HCA"; fail=1; }
expect hca "$out" 'local rank 0 -> \[0\]mlx5_bond_1:1/RoCE \(2 selected\)'
expect hca "$out" 'GID +1 +fe80::a00:27ff:fe00:3 +RoCE v2 +<- chosen'
expect hca "$out" 'GID index 1 \(HCOLL_IB_GID_INDEX\)'

out=$(env -u HCOLL_IB_HCA "$info" --rdma --sysfs-root tests/fixtures/sysfs-ib) \
  || { echo "FAIL: exit status $? on sysfs-ib"; fail=1; }
expect ib "$out" '^  mlx5_10:1 +4: ACTIVE +IB +rate 400 Gb/sec'
expect ib "$out" 'GID choice: GID index 0 .*\(InfiniBand\)'
expect ib "$out" 'nvidia-peermem +loaded, /sys/module/nvidia_peermem'
expect ib "$out" 'dma-buf +kernel too old'

out=$("$info" --rdma --sysfs-root tests/fixtures/sysfs-none) \
  || { echo "FAIL: exit status $? on sysfs-none"; fail=1; }
expect none "$out" '^  none found'
expect none "$out" 'nvidia-peermem +not loaded'
expect_not none "$out" 'local rank'

# This host: whatever it has, the section is there and the exit status is 0.
out=$(env -u HCOLL_IB_HCA "$info") || { echo "FAIL: exit status $? on this host"; fail=1; }
expect host "$out" '^RDMA devices \(sysfs root /;'
expect host "$out" '^GPUDirect RDMA:'
expect host "$out" '^Environment'
if [ ! -e /sys/class/infiniband ]; then
  expect host "$out" '^  none found'
fi
# --env prints every row of the table, each with its help line.
knobs=$(grep -oE '^ +\{ "HCOLL_[A-Z0-9_]+"' src/base/config.c | grep -oE 'HCOLL_[A-Z0-9_]+')
[ "$(wc -l <<<"$knobs")" -gt 15 ] || { echo "FAIL: env: cannot read the table"; fail=1; }
clean_env=(env)
for k in $knobs; do clean_env+=(-u "$k"); done
out=$("${clean_env[@]}" "$info" --env) || { echo "FAIL: env: exit status $?"; fail=1; }
for k in $knobs; do
  expect env "$out" "^  $k +="
done
expect_not env "$out" 'ERROR'

# A malformed value is flagged, naming the variable, and the exit status
# says so; a secret is never printed.
out=$("${clean_env[@]}" HCOLL_DEBUG=LOUD HCOLL_DEBUG_SUBSYS=INIT,BOGUS HCOLL_SECRET=hush \
      "$info" --env)
rc=$?
[ $rc -eq 1 ] || { echo "FAIL: env: malformed values gave exit status $rc"; fail=1; }
expect env-bad "$out" "ERROR: HCOLL_DEBUG='LOUD': expected one of NONE, WARN, INFO, TRACE"
expect env-bad "$out" "ERROR: HCOLL_DEBUG_SUBSYS='INIT,BOGUS': unknown subsystem 'BOGUS'"
expect env-bad "$out" '2 variable\(s\) above are malformed'
expect env-bad "$out" '^  HCOLL_SECRET +=.*\(set, hidden\)'
expect_not env-bad "$out" 'hush'

# --memreg on the emulated verbs provider: a registered 64 MiB buffer
# all-reduced 100 times costs the one registration hcoll_mem_register made.
mock=$build/mock
if [ -r "$mock/libibverbs.so.1" ]; then
  out=$(LD_LIBRARY_PATH=$(realpath "$mock") HCOLL_SYSFS_ROOT=$(realpath tests/fixtures/sysfs-roce) \
        HCOLL_NET=ib HCOLL_SOCKET_IFNAME==lo timeout 120 "$info" --memreg 64 100) \
    || { echo "FAIL: memreg: exit status $?"; fail=1; }
  expect memreg "$out" '^Registrations .*HCOLL_NET=ib'
  expect memreg "$out" '^  hcoll_mem_register of 64 MiB: 1 registration\(s\)$'
  expect memreg "$out" '^  100 all-reduces in it: 0 registration\(s\), [1-9][0-9]* cache hit\(s\), 0 miss\(es\)$'
  # Over TCP nothing is registered, and nothing counted.
  out=$(HCOLL_NET=tcp HCOLL_SOCKET_IFNAME==lo timeout 60 "$info" --memreg 1 5) \
    || { echo "FAIL: memreg tcp: exit status $?"; fail=1; }
  expect memreg-tcp "$out" '^  process total: 0 registration\(s\)'
else
  echo "memreg: $mock/libibverbs.so.1 not built; --memreg not checked"
fi

# --tune refuses a layout it cannot emulate (its sweep takes a minute: README, not here).
"$info" --tune 3 2 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || { echo "FAIL: --tune 3 2: exit $rc, want 2 (usage)"; fail=1; }
[ $fail -eq 0 ] && echo "hcoll_info --rdma, --env and --memreg: all checks passed"
exit $fail
