#include "sys/ifaces.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sys/envlist.h"

/* Automatic choice, best tier first; a lower tier is used only when no
 * interface of a better one exists. */
enum { TIER_NET = 0, TIER_BRIDGE = 1, TIER_LOOP = 2, TIER_NONE = 3 };

static const char *const bridge_prefixes[] = { "docker", "br-", "virbr" };

static int auto_tier(const hc_iface_t *f)
{
    if (f->flags & IFF_LOOPBACK)
        return TIER_LOOP;
    for (size_t i = 0; i < sizeof bridge_prefixes / sizeof bridge_prefixes[0]; i++)
        if (strncmp(f->name, bridge_prefixes[i], strlen(bridge_prefixes[i])) == 0)
            return TIER_BRIDGE;
    return TIER_NET;
}

static int addr_usable(const hc_sockaddr_t *a)
{
    if (a->sa.sa_family == AF_INET)
        return 1;
    if (a->sa.sa_family == AF_INET6) {
        const struct in6_addr *x = &a->sin6.sin6_addr;
        return !IN6_IS_ADDR_LINKLOCAL(x) && !IN6_IS_ADDR_UNSPECIFIED(x) &&
               !IN6_IS_ADDR_MULTICAST(x);
    }
    return 0;
}

typedef struct cand {
    hc_iface_t f;
    int key;  /* tier, or list entry index for an including list */
    int v6;   /* sorts IPv4 first within an interface */
    int seq;  /* input order, for a stable sort */
} cand_t;

static int cand_cmp(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    int c = hc_name_natcmp(a->f.name, b->f.name);
    if (c)
        return c;
    if (a->v6 != b->v6)
        return a->v6 - b->v6;
    return a->seq - b->seq;
}

/* Index of the first entry of an including list that name matches. */
static int list_rank(const hc_list_t *l, const char *name)
{
    for (int i = 0; i < l->count; i++) {
        const char *e = l->entries[i].name;
        if (l->exact ? strcmp(name, e) == 0 : strncmp(name, e, strlen(e)) == 0)
            return i;
    }
    return -1;
}

hcoll_status_t hc_ifaces_select(const hc_iface_t *in, int n, const char *spec, hc_iface_t *out,
                                int max_out, int *count_out, char *err, size_t errlen)
{
    hc_list_t list;
    hcoll_status_t st = hc_list_parse(spec, &list, err, errlen);
    if (st != HCOLL_SUCCESS)
        return st;
    const int including = list.count > 0 && !list.exclude;

    cand_t *c = calloc(n > 0 ? (size_t)n : 1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return HCOLL_ERR_NO_MEMORY;
    }
    int nc = 0, best = TIER_NONE;
    for (int i = 0; i < n; i++) {
        const hc_iface_t *f = &in[i];
        if (!(f->flags & IFF_UP) || !addr_usable(&f->addr))
            continue;
        int key;
        if (including) {
            key = list_rank(&list, f->name);
            if (key < 0)
                continue;
        } else {
            if (!hc_list_match(&list, f->name, -1))
                continue;
            key = auto_tier(f);
            if (key < best)
                best = key;
        }
        c[nc].f = *f;
        c[nc].key = key;
        c[nc].v6 = f->addr.sa.sa_family == AF_INET6;
        c[nc].seq = i;
        nc++;
    }
    qsort(c, (size_t)nc, sizeof *c, cand_cmp);

    int nout = 0;
    for (int i = 0; i < nc && nout < max_out; i++) {
        if (!including && c[i].key != best)
            continue;
        /* One address per interface: the sort put its best one first. */
        if (nout > 0 && strcmp(out[nout - 1].name, c[i].f.name) == 0)
            continue;
        int dup = 0;
        for (int k = 0; k < nout && !dup; k++)
            dup = strcmp(out[k].name, c[i].f.name) == 0;
        if (!dup)
            out[nout++] = c[i].f;
    }
    free(c);
    if (nout == 0) {
        snprintf(err, errlen, "no usable interface%s%s%s", spec && *spec ? " matches '" : "",
                 spec && *spec ? spec : "", spec && *spec ? "'" : " (none is up with an address)");
        return HCOLL_ERR_NETWORK;
    }
    *count_out = nout;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ifaces_list(const char *spec, hc_iface_t *out, int max_out, int *count_out,
                              char *err, size_t errlen)
{
    struct ifaddrs *ifa;
    if (getifaddrs(&ifa) != 0) {
        snprintf(err, errlen, "getifaddrs: %s", strerror(errno));
        return HCOLL_ERR_SYSTEM;
    }
    int n = 0;
    for (struct ifaddrs *p = ifa; p; p = p->ifa_next)
        n++;
    hc_iface_t *in = calloc(n > 0 ? (size_t)n : 1, sizeof *in);
    if (!in) {
        freeifaddrs(ifa);
        snprintf(err, errlen, "out of memory");
        return HCOLL_ERR_NO_MEMORY;
    }
    int k = 0;
    for (struct ifaddrs *p = ifa; p; p = p->ifa_next) {
        if (!p->ifa_addr || !p->ifa_name)
            continue;
        int fam = p->ifa_addr->sa_family;
        if (fam != AF_INET && fam != AF_INET6)
            continue;
        snprintf(in[k].name, sizeof in[k].name, "%s", p->ifa_name);
        in[k].flags = p->ifa_flags;
        memcpy(&in[k].addr, p->ifa_addr,
               fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
        hc_sockaddr_set_port(&in[k].addr, 0);
        k++;
    }
    freeifaddrs(ifa);
    hcoll_status_t st = hc_ifaces_select(in, k, spec, out, max_out, count_out, err, errlen);
    free(in);
    return st;
}

socklen_t hc_sockaddr_len(const hc_sockaddr_t *a)
{
    return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                       : sizeof(struct sockaddr_in);
}

int hc_sockaddr_port(const hc_sockaddr_t *a)
{
    return ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port);
}

void hc_sockaddr_set_port(hc_sockaddr_t *a, int port)
{
    if (a->sa.sa_family == AF_INET6)
        a->sin6.sin6_port = htons((uint16_t)port);
    else
        a->sin.sin_port = htons((uint16_t)port);
}

const char *hc_sockaddr_str(const hc_sockaddr_t *a, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = hc_sockaddr_port(a);
    if (a->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof host);
        if (port)
            snprintf(buf, len, "[%s]:%d", host, port);
        else
            snprintf(buf, len, "%s", host);
    } else if (a->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof host);
        if (port)
            snprintf(buf, len, "%s:%d", host, port);
        else
            snprintf(buf, len, "%s", host);
    } else {
        snprintf(buf, len, "(family %d)", a->sa.sa_family);
    }
    return buf;
}
