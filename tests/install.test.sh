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
