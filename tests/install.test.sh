#!/usr/bin/env bash
# make install / uninstall honour PREFIX and DESTDIR, and a program builds
# against the installed copy through pkg-config alone.
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

make --no-print-directory -s install PREFIX="$prefix" >/dev/null
for f in include/hcoll.h lib/libhcoll.so lib/libhcoll.so.0 lib/libhcoll.a lib/pkgconfig/hcoll.pc \
         bin/hcoll_info bin/hcoll_perf bin/hcoll_plan; do
  [ -e "$prefix/$f" ] || { echo "FAIL: install did not create $f"; exit 1; }
done
# The user tools and nothing else: micro-benchmarks stay in the build tree.
extra=$(ls "$prefix/bin" | grep -vxE 'hcoll_info|hcoll_perf|hcoll_plan' || true)
[ -z "$extra" ] || { echo "FAIL: install put more than the user tools in bin/: $extra"; exit 1; }

cat >"$tmp/user.c" <<'C'
#include <hcoll.h>
#include <stdio.h>
int main(void)
{
    if (hcoll_version() != HCOLL_VERSION_CODE)
        return 1;
    printf("%s %s\n", hcoll_status_name(HCOLL_ERR_TIMEOUT), hcoll_strerror(HCOLL_ERR_TIMEOUT));
    return 0;
}
C
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
cc -o "$tmp/user" "$tmp/user.c" $(pkg-config --cflags --libs hcoll)
out=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/user")
[ "$out" = "HCOLL_ERR_TIMEOUT timed out" ] || { echo "FAIL: program printed '$out'"; exit 1; }
readelf -d "$tmp/user" | grep -q 'NEEDED.*libhcoll.so.0' || { echo "FAIL: program does not need libhcoll.so.0"; exit 1; }

# The Python package: imported from PYTHONDIR, it loads the prefix's
# library (recorded by make install), with no LD_LIBRARY_PATH or
# HCOLL_LIBRARY, from outside the source tree.
pydir=$prefix/lib/python3/dist-packages
[ -f "$pydir/hcoll/__init__.py" ] && [ -f "$pydir/hcoll/torch.py" ] ||
  { echo "FAIL: install did not put the Python package in $pydir"; exit 1; }
if [ -x /usr/bin/python3 ]; then
  out=$(cd "$tmp" && env -u HCOLL_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$pydir" /usr/bin/python3 -c \
    'import hcoll; print(hcoll.__file__, hcoll.library_path, hcoll.version())')
  code=$(awk '/^#define HCOLL_VERSION_(MAJOR|MINOR|PATCH) /{v[$2] = $3} END {print \
    v["HCOLL_VERSION_MAJOR"] * 10000 + v["HCOLL_VERSION_MINOR"] * 100 + v["HCOLL_VERSION_PATCH"]}' \
    include/hcoll.h)
  [ "$out" = "$pydir/hcoll/__init__.py $prefix/lib/libhcoll.so.0 $code" ] ||
    { echo "FAIL: installed Python package: '$out'"; exit 1; }
fi

make --no-print-directory -s uninstall PREFIX="$prefix" >/dev/null
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || { echo "FAIL: uninstall left: $left"; exit 1; }

# DESTDIR stages under a root without changing the recorded prefix.
make --no-print-directory -s install PREFIX=/opt/hcoll-test DESTDIR="$tmp/stage" >/dev/null
[ -e "$tmp/stage/opt/hcoll-test/lib/libhcoll.so.0" ] || { echo "FAIL: DESTDIR not honoured"; exit 1; }
grep -q '^prefix=/opt/hcoll-test$' "$tmp/stage/opt/hcoll-test/lib/pkgconfig/hcoll.pc" ||
  { echo "FAIL: hcoll.pc does not record the prefix"; exit 1; }
[ ! -e /opt/hcoll-test ] || { echo "FAIL: installed outside DESTDIR"; exit 1; }
echo "install ok: PREFIX, DESTDIR, pkg-config, uninstall"
