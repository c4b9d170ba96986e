#!/usr/bin/env bash
# The shared library exports the public API and nothing else, never one of
# the names HPC-X's libhcoll.so.1 exports (both can live in one process,
# e.g. under Open MPI's coll/hcoll), and carries the soname libhcoll.so.0.
# The checker is first run on a deliberately bad library to prove it bites.
set -u
cd "$(dirname "$0")/.."

# Names exported by HPC-X HCOLL (hcoll/api/hcoll_api.h and its runtime API).
hpcx=(
  hcoll_init hcoll_init_with_opts hcoll_read_init_opts hcoll_free_init_opts
  hcoll_finalize hcoll_create_context hcoll_destroy_context hcoll_context_free
  hcoll_group_destroy_notify hcoll_progress_fn hcoll_collectives
  hcoll_set_runtime_tag_offset hcoll_get_info hcoll_check_mem_release_cb_needed
  hcoll_mem_unmap hcoll_rte_p2p_disabled_notify hcoll_rte_functions
  hcoll_get_version init_hcoll_collectives
)

# check_lib LIB HEADER: prints one line per problem; returns the count.
check_lib() {
  local lib=$1 header=$2 problems=0 s h d
  local -a syms declared
  mapfile -t syms < <(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | sed 's/@.*//' | sort -u)
  for s in "${syms[@]}"; do
    case "$s" in
      hcoll_*) ;;
      *) echo "exports non-API symbol $s"; problems=$((problems + 1)) ;;
    esac
    for h in "${hpcx[@]}"; do
      [ "$s" = "$h" ] && { echo "exports $s, a name HPC-X's libhcoll.so.1 uses"; problems=$((problems + 1)); }
    done
    grep -Eq "\\b$s\\(" "$header" || { echo "$s is exported but not declared in $header"; problems=$((problems + 1)); }
  done
  mapfile -t declared < <(grep -oE 'HCOLL_API [^(]*\b(hcoll_[a-z0-9_]+)\(' "$header" | grep -oE 'hcoll_[a-z0-9_]+\($' | tr -d '(' | sort -u)
  for d in "${declared[@]}"; do
    printf '%s\n' "${syms[@]}" | grep -qx "$d" || { echo "$d is declared but not exported"; problems=$((problems + 1)); }
  done
  local soname
  soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ "$soname" = "libhcoll.so.0" ] || { echo "soname is '$soname', expected libhcoll.so.0"; problems=$((problems + 1)); }
  echo "checked ${#syms[@]} exported symbols, ${#declared[@]} declared, soname '$soname'"
  return $problems
}

# 1. The checker itself: a library with an HPC-X name, a stray internal
#    symbol, a declared-but-missing call and no soname must give 4 problems.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/bad.c" <<'C'
int hcoll_init(void) { return 0; }
int hc_internal_helper(void) { return 1; }
int hcoll_version(void) { return 1; }
C
printf '%s\n' 'HCOLL_API int hcoll_version(void);' 'HCOLL_API int hcoll_wait(void);' >"$tmp/bad.h"
cc -shared -fPIC -o "$tmp/libbad.so" "$tmp/bad.c"
out=$(check_lib "$tmp/libbad.so" "$tmp/bad.h")
n=$?
# hcoll_init: HPC-X name + not declared (2); hc_internal_helper: non-API +
# not declared (2); hcoll_wait missing (1); soname (1).
if [ $n -ne 6 ]; then
  echo "FAIL: the checker found $n problems in the bad library, expected 6:"
  echo "$out"
  exit 1
fi
echo "checker self-test ok (flags an HPC-X name, a leaked symbol, a missing call, a wrong soname)"

# 2. The real library.
lib=lib/libhcoll.so
# Another build tree (make test-asan: build-asan/lib) exports the same.
build=${HCOLL_TEST_BUILD:-build}
[ "$build" != build ] && lib=$build/lib/libhcoll.so
[ -e "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
if out=$(check_lib "$lib" include/hcoll.h); then
  echo "exports ok: $out"
else
  echo "FAIL:"
  echo "$out"
  exit 1
fi
