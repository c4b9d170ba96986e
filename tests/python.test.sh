#!/usr/bin/env bash
# The Python binding (python/hcoll) from the build tree, on /usr/bin/python3
# (Debian's numpy and torch live there; the python3 on PATH may not see
# them): each tests/python/test_*.py script forks its ranks and ends within
# its own deadline. Skips (77) without numpy; the torch cases are left out,
# and said so, without torch.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
py=/usr/bin/python3
[ -e lib/libhcoll.so.0 ] || [ -e "$build/lib/libhcoll.so.0" ] ||
  { echo "FAIL: libhcoll.so.0 not built (make)"; exit 1; }
if ! "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("numpy") is None)' 2>/dev/null; then
  echo "SKIP: $py cannot import numpy (apt-get install python3-numpy)"
  exit 77
fi
has_torch=1
"$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null ||
  { has_torch=0; echo "note: $py cannot import torch: torch cases skipped (apt-get install python3-torch)"; }

export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
unset HCOLL_LIBRARY
fails=0
for t in tests/python/test_*.py; do
  name=$(basename "$t" .py)
  case $name in test_ddp*) [ $has_torch = 1 ] || { echo "$name: SKIP (no torch)"; continue; } ;; esac
  start=$SECONDS
  if timeout --kill-after=5 120 "$py" "$t"; then
    echo "$name: ok ($((SECONDS - start)) s)"
  else
    echo "FAIL: $name (exit $?)"
    fails=$((fails + 1))
  fi
done
[ $fails -eq 0 ] || { echo "$fails Python test(s) failed"; exit 1; }
echo "python binding: ok"
