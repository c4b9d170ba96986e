/*
 * NCCL's list syntax for HCOLL_SOCKET_IFNAME and HCOLL_IB_HCA:
 *
 *   "eth,ib"          names starting with "eth" or "ib" (prefix match)
 *   "=eth0,eth1"      exactly eth0 or eth1
 *   "^docker,lo"      anything but names starting with docker or lo
 *   "^=mlx5_1"        anything but exactly mlx5_1
 *   "mlx5_0:1,mlx5_1" device mlx5_0 port 1, or any port of mlx5_1*
 *
 * An empty or NULL list matches everything. Depends on nothing of ours.
 * Errors follow the sys convention (sys/sysfs.h).
 */
#ifndef HC_ENVLIST_H
#define HC_ENVLIST_H

#include <stddef.h>

#include "hcoll.h"

#define HC_LIST_MAX_ENTRIES 32
#define HC_LIST_NAME_MAX 64

typedef struct hc_list_entry {
    char name[HC_LIST_NAME_MAX];
    int port; /* -1: any port */
} hc_list_entry_t;

typedef struct hc_list {
    int exclude; /* leading ^ */
    int exact;   /* leading = (after ^ if both) */
    int count;   /* 0: match everything */
    hc_list_entry_t entries[HC_LIST_MAX_ENTRIES];
} hc_list_t;

/* Parse spec (NULL or "" gives an empty list). HCOLL_SUCCESS, or
 * HCOLL_ERR_INVALID_ARG with a message in err: empty entries, names too
 * long, bad ports, too many. */
hcoll_status_t hc_list_parse(const char *spec, hc_list_t *list_out, char *err, size_t errlen);

/* Does (name, port) pass the list? port < 0 when the thing has no port
 * (an interface). */
int hc_list_match(const hc_list_t *list, const char *name, int port);

/* Is name named explicitly by an including list (so that, for example, lo
 * is allowed when the user asked for it)? */
int hc_list_names(const hc_list_t *list, const char *name);

/* Natural order of names: digit runs compare as numbers, so rail2 comes
 * before rail10 and mlx5_2 before mlx5_10; every node then lists its
 * interfaces and devices alike. */
int hc_name_natcmp(const char *a, const char *b);

#endif
