#!/usr/bin/env bash
# The Python binding (python/hcoll) from the build tree, on /usr/bin/python3
# (Debian's numpy and torch live there; the python3 on PATH may not see
# them): tests/python/run_all.py runs each tests/python/test_*.py in one
# process (numpy and torch imported once); each forks its ranks and ends
# within its own deadline. Skips (77) without numpy; the torch cases are left out,
# and said so, without torch.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
py=/usr/bin/python3
[ -e lib/libhcoll.so.0 ] || [ -e "$build/lib/libhcoll.so.0" ] ||
  { echo "FAIL: libhcoll.so.0 not built (make)"; exit 1; }
lib=lib/libhcoll.so.0
[ -e "$build/lib/libhcoll.so.0" ] && lib=$build/lib/libhcoll.so.0
# An ASan build (make test-asan): python3 is not instrumented, so ASan's
# runtime is preloaded into it (it must be the first library loaded), and
# the interpreter's own blocks left at exit are not reported as leaks.
asan=() deadline=240
if readelf -d "$lib" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  rt=$(ldd "$lib" | awk '/libasan/ {print $3; exit}')
  [ -e "$rt" ] || { echo "SKIP: $lib is an ASan build and its runtime was not found (ldd)"; exit 77; }
  asan=(env LD_PRELOAD="$rt" ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}")
  deadline=900
fi
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
start=$SECONDS
timeout --kill-after=5 $deadline "${asan[@]}" "$py" tests/python/run_all.py || fails=$((fails + 1))
echo "binding tests: $((SECONDS - start)) s"

# The package's version is the library's.
want=$(sed -n 's/^#define HCOLL_VERSION_STRING "\(.*\)"/\1/p' include/hcoll.h)
got=$("${asan[@]}" "$py" -c 'import hcoll; print(hcoll.__version__)')
[ "$got" = "$want" ] || { echo "FAIL: hcoll.__version__ $got, hcoll.h says $want"; fails=$((fails + 1)); }

# Offline install into a virtual environment that sees Debian's packages,
# from a copy of python/ (pip builds in the source directory). The venv is
# made without its own pip (copying one in costs ~10 s here); the system
# pip run by the venv's interpreter installs into the venv all the same.
tmp=$(mktemp -d /tmp/hcoll-pyvenv.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp -r python "$tmp/src" && rm -rf "$tmp/src/hcoll/__pycache__"
start=$SECONDS
if "$py" -m venv --without-pip --system-site-packages "$tmp/venv" &&
   "$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index "$tmp/src" \
     >"$tmp/pip.log" 2>&1; then
  libpath=$PWD/lib/libhcoll.so.0
  [ -e "$PWD/$build/lib/libhcoll.so.0" ] && libpath=$PWD/$build/lib/libhcoll.so.0
  out=$(cd "$tmp" && PYTHONPATH= HCOLL_LIBRARY=$libpath HCOLL_SOCKET_IFNAME=lo \
    "${asan[@]}" "$tmp/venv/bin/python" -c '
import sys, numpy as np, hcoll, hcoll.torch
assert hcoll.__file__.startswith(sys.prefix + "/lib/"), hcoll.__file__
with hcoll.Comm.from_unique_id(hcoll.unique_id(), 0, 1) as c:
    x = np.arange(5, dtype=np.int32)
    c.allreduce(x, op=hcoll.MAX)
    assert x.tolist() == [0, 1, 2, 3, 4]
print("venv ok", hcoll.__file__)' 2>&1)
  case $out in
    "venv ok $tmp/venv/"*) echo "venv install: ok ($((SECONDS - start)) s): ${out#venv ok }" ;;
    *) echo "FAIL: the venv's hcoll: $out"; fails=$((fails + 1)) ;;
  esac
else
  echo "FAIL: venv + pip install --no-build-isolation --no-index failed:"; tail -20 "$tmp/pip.log"
  fails=$((fails + 1))
fi

[ $fails -eq 0 ] || { echo "$fails Python test(s) failed"; exit 1; }
echo "python binding: ok"
