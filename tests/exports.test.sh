#!/usr/bin/env bash
# The shared library exports the public API and nothing else, never one of
# the names HPC-X's libhcoll.so.1 exports (both can live in one process,
# e.g. under Open MPI's coll/hcoll), and carries the soname libhcoll.so.0.
set -u
cd "$(dirname "$0")/.."
lib=lib/libhcoll.so
fail=0
bad() { echo "FAIL: $*"; fail=1; }

[ -e "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }

# Names exported by HPC-X HCOLL (hcoll/api/hcoll_api.h and its runtime API).
hpcx=(
  hcoll_init hcoll_init_with_opts hcoll_read_init_opts hcoll_free_init_opts
  hcoll_finalize hcoll_create_context hcoll_destroy_context hcoll_context_free
  hcoll_group_destroy_notify hcoll_progress_fn hcoll_collectives
  hcoll_set_runtime_tag_offset hcoll_get_info hcoll_check_mem_release_cb_needed
  hcoll_mem_unmap hcoll_rte_p2p_disabled_notify hcoll_rte_functions
  hcoll_get_version init_hcoll_collectives hcoll_dte_init hcoll_dte_destroy
)

mapfile -t syms < <(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | sed 's/@.*//' | sort -u)
[ ${#syms[@]} -gt 10 ] || bad "only ${#syms[@]} exported symbols: ${syms[*]}"

for s in "${syms[@]}"; do
  case "$s" in
    hcoll_*) ;;
    *) bad "exports non-API symbol $s" ;;
  esac
  for h in "${hpcx[@]}"; do
    [ "$s" = "$h" ] && bad "exports $s, a name HPC-X's libhcoll.so.1 uses"
  done
  # Every exported function is declared in the public header.
  grep -Eq "\\b$s\\(" include/hcoll.h || bad "$s is exported but not declared in include/hcoll.h"
done

# Every function the header declares is exported.
mapfile -t declared < <(grep -oE 'HCOLL_API [^(]*\b(hcoll_[a-z0-9_]+)\(' include/hcoll.h | grep -oE 'hcoll_[a-z0-9_]+\($' | tr -d '(' | sort -u)
for d in "${declared[@]}"; do
  printf '%s\n' "${syms[@]}" | grep -qx "$d" || bad "$d is declared in hcoll.h but not exported"
done

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libhcoll.so.0" ] || bad "soname is '$soname', expected libhcoll.so.0"

# Internal helpers must stay hidden even though the static library has them.
nm -D "$lib" | grep -q ' hc_' && bad "internal hc_ symbols leak from the shared library"

if [ $fail -eq 0 ]; then
  echo "exports ok: ${#syms[@]} symbols, ${#declared[@]} declared, soname $soname"
fi
exit $fail
