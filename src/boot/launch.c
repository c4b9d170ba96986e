/*
 * The launcher environment (see launch.h for the whole rule): rank and size
 * from the first launcher present, the rendezvous address (never a port a
 * launcher owns), the secret. Every value comes through the caller's lookup
 * function; HCOLL_* values are checked by the configuration table's parser
 * before they are used.
 */
#include "boot/launch.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/config.h"
#include "base/log.h"
#include "boot/hmac.h"
#include "boot/hostlist.h"

#define LAUNCH_ERR_MAX 400

/* Launchers in order of precedence (launch.h): the first present decides
 * rank and size (both must be set). */
enum { L_HCOLL, L_TORCHRUN, L_OMPI, L_SLURM, L_TORCH_ENV, L_COUNT };
static const struct {
    const char *launcher, *rank, *size;
} launchers[L_COUNT] = {
    [L_HCOLL] = { "hcoll", "HCOLL_RANK", "HCOLL_NRANKS" },
    [L_TORCHRUN] = { "torchrun", "RANK", "WORLD_SIZE" },
    [L_OMPI] = { "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
    [L_SLURM] = { "Slurm", "SLURM_PROCID", "SLURM_NTASKS" },
    [L_TORCH_ENV] = { "RANK/WORLD_SIZE", "RANK", "WORLD_SIZE" },
};

/* Slurm's node lists, most specific first. */
static const char *const slurm_nodelists[] = { "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                               "SLURM_NODELIST" };

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

/* Whether launcher i is present: its rank variable is set; torchrun is
 * told from a plain RANK by its own variables. */
static int launcher_present(hc_getenv_fn getenv_fn, void *ctx, int i)
{
    if (i == L_TORCHRUN)
        return env_get(getenv_fn, ctx, "TORCHELASTIC_RUN_ID") ||
               (env_get(getenv_fn, ctx, "LOCAL_RANK") && env_get(getenv_fn, ctx, "RANK") &&
                env_get(getenv_fn, ctx, "WORLD_SIZE"));
    return env_get(getenv_fn, ctx, launchers[i].rank) != NULL;
}

static int env_rank_size(hc_getenv_fn getenv_fn, void *ctx, hc_launch_t *l, int *which,
                         char *err, size_t errlen)
{
    for (int i = 0; i < L_COUNT; i++) {
        long r, n;
        if (!launcher_present(getenv_fn, ctx, i))
            continue;
        int hr = env_long(getenv_fn, ctx, launchers[i].rank, 0, INT_MAX - 1, &r, err, errlen);
        if (hr < 0)
            return -1;
        if (hr == 0) { /* only torchrun is present without its rank variable */
            snprintf(err, errlen, "TORCHELASTIC_RUN_ID is set (torchrun) but RANK is not");
            return -1;
        }
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
        *which = i;
        return 0;
    }
    snprintf(err, errlen, "no launcher variables: set HCOLL_RANK and HCOLL_NRANKS (or run under "
                          "torchrun, Open MPI or Slurm)");
    return -1;
}

/* A lookup on a helper thread: shared by the caller and the thread, freed
 * by whichever lets go last (the caller may stop waiting first). */
typedef struct gai_job {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs, done, rc;
    struct addrinfo *res;
    char host[256];
} gai_job_t;

static void gai_job_put(gai_job_t *j)
{
    pthread_mutex_lock(&j->lock);
    const int last = --j->refs == 0;
    pthread_mutex_unlock(&j->lock);
    if (!last)
        return;
    if (j->res)
        freeaddrinfo(j->res);
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

static void *gai_thread(void *arg)
{
    gai_job_t *j = arg;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(j->host, NULL, &hints, &res);
    pthread_mutex_lock(&j->lock);
    j->rc = rc;
    j->res = rc == 0 ? res : NULL;
    j->done = 1;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    gai_job_put(j);
    return NULL;
}

/* getaddrinfo(host) within timeout_ms: 0 with *res_out, else -1 with err. */
static int resolve_bounded(const char *host, int64_t timeout_ms, struct addrinfo **res_out,
                           char *err, size_t errlen)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    int rc = getaddrinfo(host, NULL, &hints, res_out);
    if (rc == 0)
        return 0;
    gai_job_t *j = calloc(1, sizeof *j);
    if (!j || strlen(host) >= sizeof j->host) {
        free(j);
        snprintf(err, errlen, "cannot resolve '%.64s': %s", host, j ? "out of memory" : "too long");
        return -1;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    strcpy(j->host, host);
    j->refs = 2;
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &ta, gai_thread, j) != 0) {
        pthread_attr_destroy(&ta);
        j->refs = 1;
        gai_job_put(j);
        hints.ai_flags = 0; /* no thread to spare: look up here, unbounded */
        rc = getaddrinfo(host, NULL, &hints, res_out);
        if (rc != 0)
            snprintf(err, errlen, "cannot resolve '%.64s': %s", host, gai_strerror(rc));
        return rc == 0 ? 0 : -1;
    }
    pthread_attr_destroy(&ta);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)(timeout_ms / 1000);
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&j->lock);
    while (!j->done && pthread_cond_timedwait(&j->cond, &j->lock, &until) != ETIMEDOUT)
        ;
    const int done = j->done;
    rc = j->rc;
    *res_out = j->res;
    j->res = NULL;
    pthread_mutex_unlock(&j->lock);
    gai_job_put(j);
    if (!done)
        snprintf(err, errlen, "cannot resolve '%.64s' within %lld ms (HCOLL_TIMEOUT_MS): the "
                 "name service does not answer; give an address instead", host,
                 (long long)timeout_ms);
    else if (rc != 0)
        snprintf(err, errlen, "cannot resolve '%.64s': %s", host, gai_strerror(rc));
    return done && rc == 0 ? 0 : -1;
}

/* host (a name or an address) and port into *out, IPv4 first, within
 * timeout_ms. */
static int resolve(const char *host, int port, int64_t timeout_ms, hc_sockaddr_t *out, char *err,
                   size_t errlen)
{
    struct addrinfo *res;
    if (resolve_bounded(host, timeout_ms, &res, err, errlen) != 0)
        return -1;
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
    hc_sockaddr_set_port(out, port);
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

int hc_launch_slurm_port(unsigned long long job, unsigned long long step)
{
    return HC_LAUNCH_SLURM_PORT_BASE +
           (int)((job * HC_LAUNCH_SLURM_PORT_MULT + step) % HC_LAUNCH_SLURM_PORT_SPAN);
}

static int root_from_hcoll(const char *v, int64_t ms, hc_launch_t *l, char *err, size_t errlen)
{
    char host[256], detail[300];
    const char *port;
    if (hc_knob_parse(hc_knob_find("HCOLL_ROOT"), v, NULL, err, errlen) != HCOLL_SUCCESS ||
        root_split(v, host, &port, err, errlen) != 0)
        return -1;
    char *end;
    errno = 0;
    long p = strtol(port, &end, 10);
    if (errno || end == port || *end || p < 1 || p > 65535) {
        snprintf(err, errlen, "HCOLL_ROOT: port '%s' is not a number in 1..65535", port);
        return -1;
    }
    if (resolve(host, (int)p, ms, &l->root, detail, sizeof detail) != 0) {
        snprintf(err, errlen, "HCOLL_ROOT: %s", detail);
        return -1;
    }
    l->root_from = "HCOLL_ROOT";
    return 0;
}

/* MASTER_ADDR : MASTER_PORT + HCOLL_ROOT_PORT_OFFSET. */
static int root_from_master(hc_getenv_fn getenv_fn, void *ctx, const char *ma, int64_t ms,
                            hc_launch_t *l, char *err, size_t errlen)
{
    char detail[300];
    long port, off;
    if (env_long(getenv_fn, ctx, "MASTER_PORT", 1, 65535, &port, err, errlen) < 0)
        return -1;
    const hc_knob_t *k = hc_knob_find("HCOLL_ROOT_PORT_OFFSET");
    int h = env_long(getenv_fn, ctx, k->name, (long)k->min, (long)k->max, &off, err, errlen);
    if (h < 0)
        return -1;
    if (h == 0)
        off = strtol(k->defval, NULL, 10);
    if (port + off > 65535) {
        snprintf(err, errlen, "MASTER_PORT=%ld + HCOLL_ROOT_PORT_OFFSET=%ld is %ld, above 65535: "
                 "lower MASTER_PORT or HCOLL_ROOT_PORT_OFFSET, or set HCOLL_ROOT=host:port",
                 port, off, port + off);
        return -1;
    }
    if (resolve(ma, (int)(port + off), ms, &l->root, detail, sizeof detail) != 0) {
        snprintf(err, errlen, "MASTER_ADDR: %s", detail);
        return -1;
    }
    l->root_from = "MASTER_ADDR/MASTER_PORT+HCOLL_ROOT_PORT_OFFSET";
    return 0;
}

/* The first of the variables names[n] that is set: 0 with its value and
 * name, -1 when none is (the caller words the error). */
static int env_first(hc_getenv_fn getenv_fn, void *ctx, const char *const *names, size_t n,
                     const char **v_out, const char **name_out)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = env_get(getenv_fn, ctx, names[i]);
        if (v) {
            *v_out = v;
            *name_out = names[i];
            return 0;
        }
    }
    return -1;
}

/* A job or step id, under its name or its older spelling. */
static int slurm_id(hc_getenv_fn getenv_fn, void *ctx, const char *name, const char *old,
                    long *out, char *err, size_t errlen)
{
    int h = env_long(getenv_fn, ctx, name, 0, 4294967295L, out, err, errlen);
    if (h == 0)
        h = env_long(getenv_fn, ctx, old, 0, 4294967295L, out, err, errlen);
    if (h == 0)
        snprintf(err, errlen, "srun: neither %s nor %s is set (set HCOLL_ROOT=host:port)", name,
                 old);
    return h > 0 ? 0 : -1;
}

/* srun alone: the step's first node, the step's port. */
static int root_from_slurm(hc_getenv_fn getenv_fn, void *ctx, int64_t ms, hc_launch_t *l,
                           char *err, size_t errlen)
{
    char host[HC_HOSTLIST_NAME_MAX], detail[300];
    const char *list, *var;
    long job, step, nodeid;
    if (env_first(getenv_fn, ctx, slurm_nodelists, 3, &list, &var) != 0) {
        snprintf(err, errlen, "srun: no rendezvous address: none of SLURM_STEP_NODELIST, "
                              "SLURM_JOB_NODELIST, SLURM_NODELIST is set (set HCOLL_ROOT=host:port)");
        return -1;
    }
    if (hc_hostlist_first(list, host, sizeof host, detail, sizeof detail) != HCOLL_SUCCESS) {
        snprintf(err, errlen, "%s='%.120s': %.200s", var, list, detail);
        return -1;
    }
    if (slurm_id(getenv_fn, ctx, "SLURM_JOB_ID", "SLURM_JOBID", &job, err, errlen) != 0 ||
        slurm_id(getenv_fn, ctx, "SLURM_STEP_ID", "SLURM_STEPID", &step, err, errlen) != 0)
        return -1;
    int h = env_long(getenv_fn, ctx, "SLURM_NODEID", 0, INT_MAX, &nodeid, err, errlen);
    if (h < 0)
        return -1;
    if (h > 0 && l->rank == 0 && nodeid != 0) {
        snprintf(err, errlen, "srun: rank 0 runs on node %ld of the step (SLURM_NODEID), not on "
                 "its first node '%s' (%s), where every rank looks for it: set "
                 "HCOLL_ROOT=host:port", nodeid, host, var);
        return -1;
    }
    int port = hc_launch_slurm_port((unsigned long long)job, (unsigned long long)step);
    if (resolve(host, port, ms, &l->root, detail, sizeof detail) != 0) {
        snprintf(err, errlen, "%s: first host '%.64s': %.200s", var, host, detail);
        return -1;
    }
    l->root_from = var;
    return 0;
}

/* The rendezvous address; which: the launcher that gave rank and size. */
static int env_root(hc_getenv_fn getenv_fn, void *ctx, int which, hc_launch_t *l, char *err,
                    size_t errlen)
{
    /* Name look-ups are a set-up step: HCOLL_TIMEOUT_MS bounds them. */
    long ms;
    const hc_knob_t *k = hc_knob_find("HCOLL_TIMEOUT_MS");
    int h = env_long(getenv_fn, ctx, k->name, (long)k->min, (long)k->max, &ms, err, errlen);
    if (h < 0)
        return -1;
    if (h == 0)
        ms = strtol(k->defval, NULL, 10);
    const char *v = env_get(getenv_fn, ctx, "HCOLL_ROOT");
    if (v)
        return root_from_hcoll(v, ms, l, err, errlen);
    const char *ma = env_get(getenv_fn, ctx, "MASTER_ADDR");
    const char *mp = env_get(getenv_fn, ctx, "MASTER_PORT");
    if (ma && mp)
        return root_from_master(getenv_fn, ctx, ma, ms, l, err, errlen);
    if (ma || mp) {
        snprintf(err, errlen, "%s is set but %s is not (set both, or HCOLL_ROOT=host:port)",
                 ma ? "MASTER_ADDR" : "MASTER_PORT", ma ? "MASTER_PORT" : "MASTER_ADDR");
        return -1;
    }
    if (which == L_SLURM)
        return root_from_slurm(getenv_fn, ctx, ms, l, err, errlen);
    snprintf(err, errlen, "no rendezvous address: set HCOLL_ROOT=host:port (torchrun sets "
                          "MASTER_ADDR and MASTER_PORT; srun alone derives it from its node list)");
    return -1;
}

int hc_launch_is_loopback(const hc_sockaddr_t *a)
{
    if (a->sa.sa_family == AF_INET)
        return (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127;
    if (a->sa.sa_family != AF_INET6)
        return 0;
    const struct in6_addr *x = &a->sin6.sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
}

int hc_launch_secret_weak(const char *secret)
{
    size_t n = strlen(secret), hex = 0;
    while (hex < n && isxdigit((unsigned char)secret[hex]))
        hex++;
    return n < 16 || (hex == n && n < 32);
}

/* The secret, the key stretching's cost, and the rule that a job without
 * a secret runs only where no stranger can reach its root. */
static int launch_secret(hc_getenv_fn getenv_fn, void *ctx, hc_launch_t *l, char *err,
                         size_t errlen)
{
    char as[80];
    long iters, allow = 0;
    const char *secret = env_get(getenv_fn, ctx, "HCOLL_SECRET");
    if (!secret) {
        const hc_knob_t *k = hc_knob_find("HCOLL_ALLOW_UNAUTHENTICATED");
        if (env_long(getenv_fn, ctx, k->name, (long)k->min, (long)k->max, &allow, err, errlen) < 0)
            return -1;
        if (!allow && !hc_launch_is_loopback(&l->root)) {
            snprintf(err, errlen,
                     "HCOLL_SECRET is not set and the root address %s (from %s) is not "
                     "loopback, so any process that reaches it could join this job: set the "
                     "same HCOLL_SECRET on every rank (e.g. HCOLL_SECRET=$(od -An -tx1 -N32 "
                     "/dev/urandom | tr -d ' \\n') exported before mpirun, srun or torchrun), "
                     "or HCOLL_ALLOW_UNAUTHENTICATED=1 to run without",
                     hc_sockaddr_str(&l->root, as, sizeof as), l->root_from);
            return -1;
        }
        hc_boot_key_public(l->key);
        return 0;
    }
    if (hc_knob_parse(hc_knob_find("HCOLL_SECRET"), secret, NULL, err, errlen) != HCOLL_SUCCESS)
        return -1;
    const hc_knob_t *k = hc_knob_find("HCOLL_KDF_ITERS");
    int h = env_long(getenv_fn, ctx, k->name, (long)k->min, (long)k->max, &iters, err, errlen);
    if (h < 0)
        return -1;
    if (h == 0)
        iters = strtol(k->defval, NULL, 10);
    if (hc_launch_secret_weak(secret))
        HC_WARN(HC_INIT, l->rank,
                "HCOLL_SECRET is weak (%zu characters): use at least 16 characters, or 32 hex "
                "digits (128 bits), e.g. $(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')",
                strlen(secret));
    hc_boot_key_from_string(secret, l->key);
    l->authenticated = 1;
    l->kdf_iters = (uint32_t)iters;
    return 0;
}

hcoll_status_t hc_launch_read(hc_getenv_fn getenv_fn, void *ctx, hc_errbuf_t *eb,
                              hc_launch_t *out)
{
    char err[LAUNCH_ERR_MAX];
    hc_launch_t l;
    memset(&l, 0, sizeof l);
    int which;
    if (env_rank_size(getenv_fn, ctx, &l, &which, err, sizeof err) != 0)
        return hc_err_set(eb, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
    if (env_root(getenv_fn, ctx, which, &l, err, sizeof err) != 0)
        return hc_err_set(eb, HC_INIT, l.rank, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
    if (launch_secret(getenv_fn, ctx, &l, err, sizeof err) != 0) {
        const int rank = l.rank;
        hc_secure_zero(&l, sizeof l);
        return hc_err_set(eb, HC_INIT, rank, HCOLL_ERR_INVALID_ARG, "init_env: %s", err);
    }
    *out = l;
    hc_secure_zero(&l, sizeof l);
    return HCOLL_SUCCESS;
}
