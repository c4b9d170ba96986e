/*
 * RDMA devices, ports and GIDs from sysfs (see ibdev.h).
 *
 *   scan ──► filter (HCOLL_IB_HCA, ACTIVE) ──► order (GPU distance, name)
 *        ──► local rank i takes entry i ──► GID for that port
 */
#include "sys/ibdev.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sys/envlist.h"
#include "sys/pci.h"

const char *hc_ib_link_name(int link_layer)
{
    switch (link_layer) {
    case HC_IB_LINK_IB: return "IB";
    case HC_IB_LINK_ETH: return "RoCE";
    default: return "?";
    }
}

const char *hc_gid_type_name(int type)
{
    switch (type) {
    case HC_GID_TYPE_IB: return "IB";
    case HC_GID_TYPE_ROCE_V1: return "RoCE v1";
    case HC_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "?";
    }
}

double hc_ibdev_parse_rate(const char *s)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return -1;
    while (*end == ' ')
        end++;
    if (strncmp(end, "Gb/sec", 6) == 0)
        return v;
    if (strncmp(end, "Mb/sec", 6) == 0)
        return v / 1000.0;
    return -1;
}

static void port_rel(char *out, size_t len, const char *dev, int port, const char *what)
{
    snprintf(out, len, "sys/class/infiniband/%s/ports/%d/%s", dev, port, what);
}

int hc_ibdev_rate_gbps(const char *root, const char *dev, int port)
{
    char rel[HC_SYSFS_PATH_MAX], buf[64];
    port_rel(rel, sizeof rel, dev, port, "rate");
    if (hc_sysfs_read(root, rel, buf, sizeof buf) != 0)
        return 0;
    double g = hc_ibdev_parse_rate(buf);
    return g > 0 ? (int)lround(g) : 0;
}

static void port_load(const char *root, const char *dev, int port, hc_ibport_t *p)
{
    char rel[HC_SYSFS_PATH_MAX], buf[64];
    memset(p, 0, sizeof *p);
    snprintf(p->dev, sizeof p->dev, "%s", dev);
    p->port = port;
    p->pci_dist = -1;
    port_rel(rel, sizeof rel, dev, port, "state");
    if (hc_sysfs_read(root, rel, p->state, sizeof p->state) == 0)
        p->active = strstr(p->state, "ACTIVE") != NULL;
    port_rel(rel, sizeof rel, dev, port, "link_layer");
    if (hc_sysfs_read(root, rel, buf, sizeof buf) == 0)
        p->link_layer = strcmp(buf, "InfiniBand") == 0 ? HC_IB_LINK_IB
                        : strcmp(buf, "Ethernet") == 0 ? HC_IB_LINK_ETH
                                                       : HC_IB_LINK_UNKNOWN;
    port_rel(rel, sizeof rel, dev, port, "rate");
    if (hc_sysfs_read(root, rel, p->rate, sizeof p->rate) == 0) {
        double g = hc_ibdev_parse_rate(p->rate);
        p->rate_gbps = g > 0 ? g : 0;
    }
}

int hc_ibdev_scan(const char *root, hc_ibport_t *ports, int max)
{
    static const int dev_max = 64;
    char (*devs)[HC_SYSFS_NAME_MAX] = calloc((size_t)dev_max, sizeof *devs);
    char (*pnames)[HC_SYSFS_NAME_MAX] = calloc(32, sizeof *pnames);
    int n = 0;
    if (!devs || !pnames)
        goto clean_names;
    int nd = hc_sysfs_list(root, "sys/class/infiniband", devs, dev_max);
    for (int d = 0; d < nd && n < max; d++) {
        char rel[HC_SYSFS_PATH_MAX];
        snprintf(rel, sizeof rel, "sys/class/infiniband/%s/ports", devs[d]);
        int np = hc_sysfs_list(root, rel, pnames, 32);
        for (int i = 0; i < np && n < max; i++) {
            char *end;
            long port = strtol(pnames[i], &end, 10);
            if (*end || port < 1 || port > 255)
                continue;
            port_load(root, devs[d], (int)port, &ports[n++]);
        }
    }
clean_names:
    free(devs);
    free(pnames);
    return n;
}

/* ------------------------------------------------------------------------ */
/* GIDs                                                                       */
/* ------------------------------------------------------------------------ */

int hc_gid_parse(const char *s, uint8_t raw[16])
{
    unsigned g[8];
    char tail;
    if (sscanf(s, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x%c", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
               &g[6], &g[7], &tail) != 8)
        return -1;
    for (int i = 0; i < 8; i++) {
        raw[2 * i] = (uint8_t)(g[i] >> 8);
        raw[2 * i + 1] = (uint8_t)g[i];
    }
    return 0;
}

void hc_gid_format(const uint8_t raw[16], char *out, size_t outlen)
{
    char buf[INET6_ADDRSTRLEN];
    if (!inet_ntop(AF_INET6, raw, buf, sizeof buf))
        snprintf(buf, sizeof buf, "?");
    snprintf(out, outlen, "%s", buf);
}

int hc_gid_is_zero(const uint8_t raw[16])
{
    for (int i = 0; i < 16; i++)
        if (raw[i])
            return 0;
    return 1;
}

int hc_gid_is_link_local(const uint8_t raw[16])
{
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

int hc_gid_is_ipv4(const uint8_t raw[16], uint32_t *ip_out)
{
    for (int i = 0; i < 10; i++)
        if (raw[i])
            return 0;
    if (raw[10] != 0xff || raw[11] != 0xff)
        return 0;
    if (ip_out)
        memcpy(ip_out, raw + 12, 4);
    return 1;
}

static int gid_load(const char *root, const char *dev, int port, int idx, hc_gid_entry_t *e)
{
    char rel[HC_SYSFS_PATH_MAX], buf[80], what[48];
    snprintf(what, sizeof what, "gids/%d", idx);
    port_rel(rel, sizeof rel, dev, port, what);
    if (hc_sysfs_read(root, rel, buf, sizeof buf) != 0)
        return -1;
    memset(e, 0, sizeof *e);
    e->index = idx;
    if (hc_gid_parse(buf, e->raw) != 0)
        return -1;
    /* Unused slots read EINVAL on a real kernel: the type stays unknown. */
    snprintf(what, sizeof what, "gid_attrs/types/%d", idx);
    port_rel(rel, sizeof rel, dev, port, what);
    if (hc_sysfs_read(root, rel, buf, sizeof buf) == 0) {
        if (strcmp(buf, "RoCE v2") == 0)
            e->type = HC_GID_TYPE_ROCE_V2;
        else if (strstr(buf, "RoCE v1"))
            e->type = HC_GID_TYPE_ROCE_V1; /* "IB/RoCE v1" */
        else if (strcmp(buf, "IB") == 0)
            e->type = HC_GID_TYPE_IB;
    }
    return 0;
}

int hc_ibdev_gids(const char *root, const char *dev, int port, hc_gid_entry_t *out, int max)
{
    char rel[HC_SYSFS_PATH_MAX];
    port_rel(rel, sizeof rel, dev, port, "gids");
    char (*names)[HC_SYSFS_NAME_MAX] = calloc(HC_IBDEV_MAX_GIDS, sizeof *names);
    if (!names)
        return 0;
    int nn = hc_sysfs_list(root, rel, names, HC_IBDEV_MAX_GIDS);
    int n = 0;
    for (int i = 0; i < nn && n < max; i++) {
        char *end;
        long idx = strtol(names[i], &end, 10);
        if (*end || idx < 0 || idx >= HC_IBDEV_MAX_GIDS)
            continue;
        hc_gid_entry_t e;
        if (gid_load(root, dev, port, (int)idx, &e) == 0 && !hc_gid_is_zero(e.raw))
            out[n++] = e;
    }
    free(names);
    return n;
}

hcoll_status_t hc_ibdev_gid_choose(const char *root, const char *dev, int port, int link_layer,
                                   long forced, uint32_t prefer_ip, int *index_out,
                                   hc_gid_entry_t *gid_out, char *why, size_t whylen)
{
    char txt[INET6_ADDRSTRLEN];
    hc_gid_entry_t e;
    if (forced >= 0) {
        if (gid_load(root, dev, port, (int)forced, &e) != 0 || hc_gid_is_zero(e.raw)) {
            snprintf(why, whylen,
                     "HCOLL_IB_GID_INDEX=%ld: %s:%d has no GID at that index (empty or unreadable)",
                     forced, dev, port);
            return HCOLL_ERR_INVALID_ARG;
        }
        hc_gid_format(e.raw, txt, sizeof txt);
        snprintf(why, whylen, "GID index %ld (HCOLL_IB_GID_INDEX) %s %s", forced, txt,
                 hc_gid_type_name(e.type));
        *index_out = (int)forced;
        *gid_out = e;
        return HCOLL_SUCCESS;
    }
    if (link_layer == HC_IB_LINK_IB) {
        if (gid_load(root, dev, port, 0, &e) != 0)
            memset(&e, 0, sizeof e); /* IB routes by LID; the GID is informative */
        hc_gid_format(e.raw, txt, sizeof txt);
        snprintf(why, whylen, "GID index 0 %s (InfiniBand)", txt);
        *index_out = 0;
        *gid_out = e;
        return HCOLL_SUCCESS;
    }
    hc_gid_entry_t *tab = calloc(HC_IBDEV_MAX_GIDS, sizeof *tab);
    if (!tab) {
        snprintf(why, whylen, "out of memory reading GIDs");
        return HCOLL_ERR_NO_MEMORY;
    }
    int n = hc_ibdev_gids(root, dev, port, tab, HC_IBDEV_MAX_GIDS);
    int best = -1, rank_best = 0;
    int nv1 = 0, nll = 0, nv2 = 0;
    for (int i = 0; i < n; i++) {
        const hc_gid_entry_t *g = &tab[i];
        if (g->type != HC_GID_TYPE_ROCE_V2) {
            nv1++;
            continue;
        }
        if (hc_gid_is_link_local(g->raw)) {
            nll++;
            continue;
        }
        nv2++;
        uint32_t ip;
        /* 3: the rail's own IPv4, 2: any IPv4, 1: global IPv6. */
        int r = hc_gid_is_ipv4(g->raw, &ip) ? (prefer_ip && ip == prefer_ip ? 3 : 2) : 1;
        if (r > rank_best) {
            rank_best = r;
            best = i;
        }
    }
    if (best < 0) {
        snprintf(why, whylen,
                 "%s:%d has no usable RoCE v2 GID (%d non-zero GIDs: %d RoCE v2 link-local, %d "
                 "other type); set HCOLL_IB_GID_INDEX",
                 dev, port, n, nll, nv1);
        free(tab);
        return HCOLL_ERR_RDMA;
    }
    e = tab[best];
    free(tab);
    hc_gid_format(e.raw, txt, sizeof txt);
    snprintf(why, whylen, "GID index %d %s RoCE v2%s", e.index, txt,
             rank_best == 3   ? " (the rail's address)"
             : rank_best == 1 ? " (IPv6: no IPv4-mapped RoCE v2 GID)"
                              : "");
    *index_out = e.index;
    *gid_out = e;
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Selection                                                                  */
/* ------------------------------------------------------------------------ */

static int port_cmp(const void *x, const void *y)
{
    const hc_ibport_t *a = x, *b = y;
    if (a->pci_dist != b->pci_dist)
        return a->pci_dist < b->pci_dist ? -1 : 1;
    int c = hc_name_natcmp(a->dev, b->dev);
    if (c)
        return c;
    return a->port - b->port;
}

hcoll_status_t hc_ibdev_select(const char *root, const char *hca_spec, const char *gpu_path,
                               hc_ibport_t *out, int max, int *count_out, char *err,
                               size_t errlen)
{
    hc_list_t list;
    hcoll_status_t st = hc_list_parse(hca_spec, &list, err, errlen);
    if (st != HCOLL_SUCCESS)
        return st;
    hc_ibport_t *all = calloc(HC_IBDEV_MAX_PORTS, sizeof *all);
    if (!all) {
        snprintf(err, errlen, "out of memory scanning RDMA devices");
        return HCOLL_ERR_NO_MEMORY;
    }
    int n = hc_ibdev_scan(root, all, HC_IBDEV_MAX_PORTS), k = 0;
    for (int i = 0; i < n && k < max; i++) {
        hc_ibport_t p = all[i];
        if (!p.active || !hc_list_match(&list, p.dev, p.port))
            continue;
        if (gpu_path) {
            char path[HC_PCI_PATH_MAX];
            p.pci_dist = hc_pci_ibdev_path(root, p.dev, path, sizeof path) == 0
                             ? hc_pci_distance(root, gpu_path, path)
                             : HC_PCI_SYS;
        }
        out[k++] = p;
    }
    free(all);
    qsort(out, (size_t)k, sizeof *out, port_cmp);
    *count_out = k;
    return HCOLL_SUCCESS;
}

/* Why no port was selected: what sysfs holds, in err. */
static void explain_none(const char *root, const char *hca_spec, char *err, size_t errlen)
{
    hc_ibport_t *all = calloc(HC_IBDEV_MAX_PORTS, sizeof *all);
    int total = all ? hc_ibdev_scan(root, all, HC_IBDEV_MAX_PORTS) : 0, nact = 0;
    for (int i = 0; i < total; i++)
        nact += all[i].active;
    free(all);
    if (total == 0)
        snprintf(err, errlen, "no RDMA device found (no ports under %s%ssys/class/infiniband)",
                 root && root[0] ? root : "/", root && root[0] && strcmp(root, "/") ? "/" : "");
    else if (nact == 0)
        snprintf(err, errlen, "no ACTIVE port (%d RDMA port(s), none ACTIVE)", total);
    else
        snprintf(err, errlen, "no ACTIVE port matching HCOLL_IB_HCA=%s (%d ACTIVE port(s))",
                 hca_spec ? hca_spec : "", nact);
}

hcoll_status_t hc_ibdev_for_rank(const char *root, const char *hca_spec, int local_rank,
                                 const char *gpu_path, long gid_index, uint32_t prefer_ip,
                                 hc_ib_choice_t *choice_out, char *err, size_t errlen)
{
    hc_ibport_t *sel = calloc(HC_IBDEV_MAX_PORTS, sizeof *sel);
    if (!sel) {
        snprintf(err, errlen, "out of memory selecting an RDMA device");
        return HCOLL_ERR_NO_MEMORY;
    }
    int n = 0;
    hcoll_status_t st =
        hc_ibdev_select(root, hca_spec, gpu_path, sel, HC_IBDEV_MAX_PORTS, &n, err, errlen);
    if (st != HCOLL_SUCCESS)
        goto clean_sel;
    if (n == 0) {
        explain_none(root, hca_spec, err, errlen);
        st = HCOLL_ERR_RDMA;
        goto clean_sel;
    }
    /* Among the nearest ports only: rank i's GPU normally has its own. */
    int nnear = n;
    if (gpu_path) {
        nnear = 1;
        while (nnear < n && sel[nnear].pci_dist == sel[0].pci_dist)
            nnear++;
    }
    int idx = (local_rank < 0 ? 0 : local_rank) % nnear;
    hc_ib_choice_t c;
    memset(&c, 0, sizeof c);
    c.port = sel[idx];
    c.index = idx;
    c.nselected = n;
    c.gid_index = -1;
    st = hc_ibdev_gid_choose(root, c.port.dev, c.port.port, c.port.link_layer, gid_index,
                             prefer_ip, &c.gid_index, &c.gid, c.gid_why, sizeof c.gid_why);
    if (st != HCOLL_SUCCESS) {
        snprintf(err, errlen, "%s", c.gid_why);
        goto clean_sel;
    }
    *choice_out = c;
clean_sel:
    free(sel);
    return st;
}
