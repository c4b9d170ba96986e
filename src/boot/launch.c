/*
 * The launcher environment (see launch.h): rank and size from the first
 * launcher that sets them, the rendezvous address, the secret. Every value
 * comes through the caller's lookup function; HCOLL_* values are checked by
 * the configuration table's parser before they are used.
 */
#include "boot/launch.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/config.h"
#include "base/log.h"
#include "boot/hmac.h"

#define LAUNCH_ERR_MAX 400

/* Launchers in order of precedence: the first whose rank variable is set
 * decides rank and size (both must be set). */
static const struct {
    const char *launcher, *rank, *size;
} launchers[] = {
    { "hcoll", "HCOLL_RANK", "HCOLL_NRANKS" },
    { "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
    { "Slurm", "SLURM_PROCID", "SLURM_NTASKS" },
    { "torchrun", "RANK", "WORLD_SIZE" },
};

const char *hc_launch_process_env(const char *name, void *ctx)
{
    (void)ctx;
    return getenv(name);
}

/* name's value, or NULL when unset or empty. */
static const char *env_get(hc_getenv_fn getenv_fn, void *ctx, const char *name)
{
    const char *v = getenv_fn(name, ctx);
    return v && *v ? v : NULL;
}

/* 0: unset, 1: parsed, -1: malformed (message in err). A variable of the
 * configuration table is checked by its parser, whose bounds are the same
 * as lo..hi; any other by strtol. */
static int env_long(hc_getenv_fn getenv_fn, void *ctx, const char *name, long lo, long hi,
                    long *out, char *err, size_t errlen)
{
    const char *v = env_get(getenv_fn, ctx, name);
    if (!v)
        return 0;
    const hc_knob_t *k = hc_knob_find(name);
    if (k && hc_knob_parse(k, v, NULL, err, errlen) != HCOLL_SUCCESS)
        return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        snprintf(err, errlen, "%s='%s' is not an integer in %ld..%ld", name, v, lo, hi);
        return -1;
    }
    *out = x;
    return 1;
}

static int env_rank_size(hc_getenv_fn getenv_fn, void *ctx, hc_launch_t *l, char *err,
                         size_t errlen)
{
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        long r, n;
        int hr = env_long(getenv_fn, ctx, launchers[i].rank, 0, INT_MAX - 1, &r, err, errlen);
        if (hr < 0)
            return -1;
        if (hr == 0)
            continue;
        int hn = env_long(getenv_fn, ctx, launchers[i].size, 1, INT_MAX, &n, err, errlen);
        if (hn < 0)
            return -1;
        if (hn == 0) {
            snprintf(err, errlen, "%s is set but %s is not", launchers[i].rank,
                     launchers[i].size);
            return -1;
        }
        if (r >= n) {
            snprintf(err, errlen, "%s=%ld is not below %s=%ld", launchers[i].rank, r,
                     launchers[i].size, n);
            return -1;
        }
        l->rank = (int)r;
        l->nranks = (int)n;
        l->launcher = launchers[i].launcher;
        return 0;
    }
    snprintf(err, errlen, "no launcher variables: set HCOLL_RANK and HCOLL_NRANKS (or run under "
                          "Open MPI, Slurm or torchrun)");
    return -1;
}

static int resolve(const char *host, const char *port, hc_sockaddr_t *out, char *err,
                   size_t errlen)
{
    char *end;
    errno = 0;
    long p = strtol(port, &end, 10);
    if (errno || end == port || *end || p < 1 || p > 65535) {
        snprintf(err, errlen, "port '%s' is not a number in 1..65535", port);
        return -1;
    }
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    /* IPv4 first, as for interfaces. */
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a && !pick; a = a->ai_next)
        if (a->ai_family == AF_INET)
            pick = a;
    for (const struct addrinfo *a = res; a && !pick; a = a->ai_next)
        if (a->ai_family == AF_INET6)
            pick = a;
    if (!pick) {
        freeaddrinfo(res);
        snprintf(err, errlen, "'%s' has no IPv4 or IPv6 address", host);
        return -1;
    }
    memset(out, 0, sizeof *out);
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    hc_sockaddr_set_port(out, (int)p);
    freeaddrinfo(res);
    return 0;
}

/* HCOLL_ROOT's value, "host:port" or "[v6]:port": the host into host[256]
 * and a pointer to the port. */
static int root_split(const char *v, char host[256], const char **port_out, char *err,
                      size_t errlen)
{
    const char *colon;
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close || close[1] != ':' || (size_t)(close - v - 1) >= 256) {
            snprintf(err, errlen, "HCOLL_ROOT='%s' is not [address]:port", v);
            return -1;
        }
        memcpy(host, v + 1, (size_t)(close - v - 1));
        host[close - v - 1] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(v, ':');
        if (!colon || colon == v || memchr(v, ':', (size_t)(colon - v)) ||
            (size_t)(colon - v) >= 256) {
            snprintf(err, errlen, "HCOLL_ROOT='%s' is not host:port (write an IPv6 "
                                  "address as [address]:port)", v);
            return -1;
        }
        memcpy(host, v, (size_t)(colon - v));
        host[colon - v] = '\0';
    }
    *port_out = colon + 1;
    return 0;
}

/* HCOLL_ROOT, else MASTER_ADDR and MASTER_PORT. */
static int env_root(hc_getenv_fn getenv_fn, void *ctx, hc_launch_t *l, char *err,
                    size_t errlen)
{
    char host[256], detail[300];
    const char *v = env_get(getenv_fn, ctx, "HCOLL_ROOT");
    if (v) {
        const char *port;
        if (hc_knob_parse(hc_knob_find("HCOLL_ROOT"), v, NULL, err, errlen) != HCOLL_SUCCESS ||
            root_split(v, host, &port, err, errlen) != 0)
            return -1;
        if (resolve(host, port, &l->root, detail, sizeof detail) != 0) {
            snprintf(err, errlen, "HCOLL_ROOT: %s", detail);
            return -1;
        }
        l->root_from = "HCOLL_ROOT";
        return 0;
    }
    const char *ma = env_get(getenv_fn, ctx, "MASTER_ADDR");
    const char *mp = env_get(getenv_fn, ctx, "MASTER_PORT");
    if (ma && mp) {
        if (resolve(ma, mp, &l->root, detail, sizeof detail) != 0) {
            snprintf(err, errlen, "MASTER_ADDR/MASTER_PORT: %s", detail);
            return -1;
        }
        l->root_from = "MASTER_ADDR/MASTER_PORT";
        return 0;
    }
    snprintf(err, errlen, "no rendezvous address: set HCOLL_ROOT=host:port (or MASTER_ADDR and "
                          "MASTER_PORT)");
    return -1;
}

hcoll_status_t hc_launch_read(hc_getenv_fn getenv_fn, void *ctx, hc_errbuf_t *eb,
                              hc_launch_t *out)
{
    char err[LAUNCH_ERR_MAX];
    hc_launch_t l;
    memset(&l, 0, sizeof l);
    if (env_rank_size(getenv_fn, ctx, &l, err, sizeof err) != 0)
        return hc_err_set(eb, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
    if (env_root(getenv_fn, ctx, &l, err, sizeof err) != 0)
        return hc_err_set(eb, HC_INIT, l.rank, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
    const char *secret = env_get(getenv_fn, ctx, "HCOLL_SECRET");
    if (secret) {
        if (hc_knob_parse(hc_knob_find("HCOLL_SECRET"), secret, NULL, err, sizeof err) != HCOLL_SUCCESS)
            return hc_err_set(eb, HC_INIT, l.rank, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
        hc_boot_key_from_string(secret, l.key);
        l.authenticated = 1;
    } else {
        hc_boot_key_public(l.key);
    }
    *out = l;
    hc_secure_zero(&l, sizeof l);
    return HCOLL_SUCCESS;
}
