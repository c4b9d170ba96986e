/*
 * Slurm's compressed host lists (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST),
 * expanded in order:
 *
 *   node[01-04,07]      node01 node02 node03 node04 node07
 *   gpu-[1-3]-ib        gpu-1-ib gpu-2-ib gpu-3-ib
 *   a,b[2-3]            a b2 b3
 *   r[1-2]n[8-10]       r1n8 r1n9 r1n10 r2n8 r2n9 r2n10
 *   n[098-100]          n098 n099 n100
 *
 * Items are separated by commas outside brackets; a bracket holds numbers
 * and lo-hi ranges separated by commas; a number is printed at least as
 * wide as the range's lower bound is written (zero padding kept). Several
 * brackets in one item multiply out, leftmost slowest. Malformed lists (an
 * unclosed or nested bracket, an empty item or range, hi < lo, a number of
 * more than 9 digits, a blank, a name of more than HC_HOSTLIST_NAME_MAX-1
 * characters) are rejected with a message that says what and where.
 *
 * Pure string work: no allocation, no I/O. Like the configuration parser,
 * it returns a status with the message in the caller's buffer, and the
 * caller (boot/launch.c) records it naming the variable.
 */
#ifndef HC_BOOT_HOSTLIST_H
#define HC_BOOT_HOSTLIST_H

#include <stddef.h>

#include "hcoll.h"

#define HC_HOSTLIST_NAME_MAX 256 /* bytes, with the terminating NUL */
#define HC_HOSTLIST_GROUPS_MAX 8 /* brackets in one item */

/* Called with each host in order; a non-zero return stops the expansion
 * (the rest of the list is still checked). */
typedef int (*hc_hostlist_fn)(const char *host, void *ctx);

/* Expand list, calling fn(host, ctx) for each host. HCOLL_SUCCESS, or
 * HCOLL_ERR_INVALID_ARG with the reason in err. */
hcoll_status_t hc_hostlist_expand(const char *list, hc_hostlist_fn fn, void *ctx, char *err,
                                  size_t errlen);

/* The first host of list (the whole list is checked) into host[hostlen]. */
hcoll_status_t hc_hostlist_first(const char *list, char *host, size_t hostlen, char *err,
                                 size_t errlen);

#endif
