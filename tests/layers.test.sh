#!/usr/bin/env bash
# The layer rule of docs/design.md holds for every file under src/: no
# include and no call from a lower layer to a higher one, no files that
# call each other in a loop (scripts/check-layers.py). The checker is first
# run on a copy of the tree with one planted violation of each kind, to
# prove that it bites.
set -u
cd "$(dirname "$0")/.."
build=${HCOLL_TEST_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A bad tree: base includes core, and two objects call each other.
mkdir -p "$tmp/bad/scripts" "$tmp/bad/src/base" "$tmp/bad/src/core" "$tmp/bad/obj/src/base" \
         "$tmp/bad/obj/src/core"
cp scripts/check-layers.py "$tmp/bad/scripts/"
: >"$tmp/bad/src/core/comm.h"
printf '#include "core/comm.h"\nint hc_b(void);\nint hc_a(void) { return hc_b(); }\n' \
  >"$tmp/bad/src/base/a.c"
printf 'int hc_a(void);\nint hc_b(void) { return hc_a(); }\n' >"$tmp/bad/src/core/b.c"
printf 'int hc_c(void);\nint hc_d(void) { return hc_c(); }\n' >"$tmp/bad/src/core/d.c"
printf 'int hc_d(void);\nint hc_c(void) { return hc_d(); }\n' >"$tmp/bad/src/core/c.c"
for f in base/a core/b core/c core/d; do
  cc -I"$tmp/bad/src" -c -x c "$tmp/bad/src/$f.c" -o "$tmp/bad/obj/src/$f.o" 2>/dev/null || { echo "cannot compile the bad tree"; exit 1; }
done
out=$(python3 "$tmp/bad/scripts/check-layers.py" --objects "$tmp/bad/obj")
rc=$?
echo "$out" | sed 's/^/  bad tree: /'
fail=0
[ $rc -ne 0 ] || { echo "FAIL: the checker passed a tree that breaks the rule"; fail=1; }
grep -q 'src/base/a.c:1: base (layer 2) includes "core/comm.h"' <<<"$out" || { echo "FAIL: upward include not named"; fail=1; }
grep -q 'src/base/a.c: base (layer 2) calls hc_b' <<<"$out" || { echo "FAIL: upward call not named"; fail=1; }
grep -q 'loop: src/core/c.c <-> src/core/d.c' <<<"$out" || { echo "FAIL: call loop not named"; fail=1; }

# The real tree, includes and calls (the library's objects).
[ -d "$build/src" ] || { echo "no $build/src: build the library first"; exit 1; }
python3 scripts/check-layers.py --objects "$build" || fail=1
exit $fail
