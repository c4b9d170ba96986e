/*
 * Communicator lifecycle: unique id, init (explicit and from a launcher's
 * environment), topology, queries, destroy and abort.
 *
 *   hcoll_get_unique_id ─► listener parked under the id's secret (uid.h)
 *   hcoll_comm_init ─► own record (host id, interface addresses)
 *                   ─► hc_boot_create: authenticated rendezvous, rank table
 *                   ─► hc_comm_topo_build: nodes, local ranks, rails
 *   (config blocking = 0: everything from hc_boot_create on runs on a
 *    set-up thread; abort/destroy cancel it through cancel_fd and join it)
 *
 * Unique-id hand-over: see boot/uid.h. In short, get_unique_id reserves
 * the port with a socket that is bound (SO_REUSEPORT) but never listens,
 * kept in a mutex-guarded per-process table keyed by the id's random
 * secret; rank 0's init listens on that socket when it runs in the maker's
 * process, else binds the same port with SO_REUSEPORT itself, so a driver
 * process that made the id may stay alive while the ranks run elsewhere.
 */
#include "core/comm.h"
#include "core/redop.h"
#include "core/coll.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "boot/hmac.h"
#include "boot/launch.h"
#include "boot/uid.h"
#include "base/log.h"
#include "base/reduce.h"
#include "gdr/gdr.h"
#include "sys/host.h"

/* ------------------------------------------------------------------------ */
/* The record each rank brings to the rendezvous (fixed size, big-endian)   */
/* ------------------------------------------------------------------------ */

#define REC_MAGIC "HCRC"
#define REC_ADDR_BYTES 40 /* family, 3 pad, scope, address[16], name[16] */
#define REC_HEAD 92 /* ... naddrs at 84, rail (int32, -1 default) at 88 */
#define REC_BYTES (REC_HEAD + HC_IFACE_MAX * REC_ADDR_BYTES)
_Static_assert(REC_BYTES == HC_COMM_REC_BYTES, "comm.h's record size is stale");

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void rec_encode(const hc_peer_t *me, int rank, unsigned char *p)
{
    memset(p, 0, REC_BYTES);
    memcpy(p, REC_MAGIC, 4);
    put32(p + 4, (uint32_t)rank);
    put32(p + 8, (uint32_t)me->pid);
    put32(p + 12, (uint32_t)(me->hostid >> 32));
    put32(p + 16, (uint32_t)me->hostid);
    snprintf((char *)p + 20, HC_HOST_LABEL_MAX, "%s", me->host);
    put32(p + 84, (uint32_t)me->naddrs);
    put32(p + 88, (uint32_t)(int32_t)me->rail);
    for (int i = 0; i < me->naddrs; i++) {
        unsigned char *a = p + REC_HEAD + i * REC_ADDR_BYTES;
        const hc_sockaddr_t *s = &me->addrs[i].addr;
        if (s->sa.sa_family == AF_INET6) {
            a[0] = 6;
            put32(a + 4, s->sin6.sin6_scope_id);
            memcpy(a + 8, &s->sin6.sin6_addr, 16);
        } else {
            a[0] = 4;
            memcpy(a + 8, &s->sin.sin_addr, 4);
        }
        memcpy(a + 24, me->addrs[i].name, 16 < IF_NAMESIZE ? 16 : IF_NAMESIZE);
        a[39] = '\0';
    }
}

/* The table came from authenticated ranks, but is still checked field by
 * field: a buggy or mismatched peer must not make us read out of bounds. */
static int rec_decode(const unsigned char *p, int rank, hc_peer_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (memcmp(p, REC_MAGIC, 4) != 0 || get32(p + 4) != (uint32_t)rank) {
        snprintf(err, errlen, "record of rank %d is malformed", rank);
        return -1;
    }
    out->pid = (int)get32(p + 8);
    out->hostid = (uint64_t)get32(p + 12) << 32 | get32(p + 16);
    memcpy(out->host, p + 20, HC_HOST_LABEL_MAX);
    out->host[HC_HOST_LABEL_MAX - 1] = '\0';
    for (char *s = out->host; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
    uint32_t n = get32(p + 84);
    if (n < 1 || n > HC_IFACE_MAX) {
        snprintf(err, errlen, "record of rank %d lists %u addresses (1..%d allowed)", rank, n,
                 HC_IFACE_MAX);
        return -1;
    }
    out->naddrs = (int)n;
    int32_t rail = (int32_t)get32(p + 88);
    if (rail < -1 || rail > 1023) {
        snprintf(err, errlen, "record of rank %d asks for rail %d (-1..1023 allowed)", rank,
                 (int)rail);
        return -1;
    }
    out->rail = rail;
    for (uint32_t i = 0; i < n; i++) {
        const unsigned char *a = p + REC_HEAD + i * REC_ADDR_BYTES;
        hc_iface_t *f = &out->addrs[i];
        if (a[0] == 6) {
            f->addr.sin6.sin6_family = AF_INET6;
            f->addr.sin6.sin6_scope_id = get32(a + 4);
            memcpy(&f->addr.sin6.sin6_addr, a + 8, 16);
        } else if (a[0] == 4) {
            f->addr.sin.sin_family = AF_INET;
            memcpy(&f->addr.sin.sin_addr, a + 8, 4);
        } else {
            snprintf(err, errlen, "record of rank %d: address %u has family %u", rank, i, a[0]);
            return -1;
        }
        memcpy(f->name, a + 24, sizeof f->name < 16 ? sizeof f->name : 16);
        f->name[sizeof f->name - 1] = '\0';
        f->flags = IFF_UP;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                  */
/* ------------------------------------------------------------------------ */

/* What the set-up works from: the rendezvous arguments and this rank's
 * record. Freed (key zeroed) once the set-up ends. */
struct hc_comm_setup {
    hc_comm_init_t ia;
    unsigned char rec[REC_BYTES];
};

static void setup_free(struct hcoll_comm *c)
{
    struct hc_comm_setup *s = c->setup;
    if (!s)
        return;
    if (s->ia.listen_fd >= 0)
        close(s->ia.listen_fd);
    hc_secure_zero(s, sizeof *s);
    free(s);
    c->setup = NULL;
}

/* Cancel a set-up still running in the background and wait for it: every
 * wait of the rendezvous and the set-up exchanges polls cancel_fd. */
static void setup_cancel_join(struct hcoll_comm *c)
{
    if (!c->setup_joinable)
        return;
    uint64_t one = 1;
    ssize_t w = write(c->cancel_fd, &one, sizeof one);
    (void)w;
    pthread_join(c->setup_thread, NULL);
    c->setup_joinable = 0;
}

void hc_comm_free(struct hcoll_comm *c, int aborting)
{
    setup_cancel_join(c);
    /* The data plane goes before the bootstrap it set itself up with. */
    hc_coll_destroy(c->coll, aborting);
    hc_boot_destroy(c->boot);
    setup_free(c);
    if (c->cancel_fd >= 0)
        close(c->cancel_fd);
    free(c->node_of);
    free(c->local_of);
    free(c->node_start);
    free(c->node_ranks);
    free(c->peers);
    hc_redop_table_fini(c);
    hc_secure_zero(c->key, sizeof c->key);
    hc_errbuf_fini(&c->err);
    free(c);
}

void hc_comm_abort(struct hcoll_comm *c)
{
    atomic_store(&c->aborted, 1);
    hc_comm_set_async_error(c, HCOLL_ERR_ABORTED);
    HC_INFO(HC_INIT, c->rank, "communicator aborted");
    /* A set-up in the background ends first (cancelled), so that what it
     * made is no longer changing under us. */
    setup_cancel_join(c);
    /* Wake whatever is blocked, then free: hc_comm_free waits for the woken
     * call to leave the bootstrap before closing its sockets. */
    hc_boot_abort(c->boot);
    hc_comm_free(c, 1);
}

hcoll_status_t hc_comm_ready(struct hcoll_comm *c, const char *what)
{
    if (hc_comm_forked(c))
        return hc_err_set(&c->err, HC_INIT, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s: this communicator belongs to process %d, not to its forked "
                          "child %d (the connections and threads are the parent's); create "
                          "a new communicator in the child",
                          what, c->owner_pid, (int)getpid());
    hcoll_status_t st = (hcoll_status_t)atomic_load_explicit(&c->setup_state,
                                                             memory_order_acquire);
    /* Not an error: polling callers would fill the log at WARN. */
    if (st == HCOLL_IN_PROGRESS)
        return hc_err_repeat(&c->err, HC_INIT, c->rank, HCOLL_IN_PROGRESS,
                          "%s: the communicator is still being set up (non-blocking init; "
                          "poll hcoll_comm_get_async_error)", what);
    return st;
}

/* Hand the message of a failed init from the communicator, which goes, to
 * the calling thread's buffer, where hcoll_comm_last_error(NULL) reads it.
 * Not logged again: whoever decided the failure logged it. */
static void init_error_keep(struct hcoll_comm *c)
{
    hc_errbuf_t *t = hc_errbuf_thread();
    const char *msg = hc_errbuf_get(&c->err);
    pthread_mutex_lock(&t->lock);
    snprintf(t->msg, sizeof t->msg, "%s%s", strncmp(msg, "init", 4) ? "init: " : "", msg);
    pthread_mutex_unlock(&t->lock);
}

/* ------------------------------------------------------------------------ */
/* Init                                                                       */
/* ------------------------------------------------------------------------ */

/* The part of init that talks to other ranks: rendezvous, topology, data
 * plane. Runs on the caller's thread (blocking) or the set-up thread; its
 * errors go to c->err. On failure it tears down what it made, so that
 * peers see this rank leave at once. */
static hcoll_status_t comm_setup(struct hcoll_comm *c)
{
    struct hc_comm_setup *s = c->setup;
    hcoll_status_t st;
    char err[512];
    unsigned char *recs = malloc((size_t)c->nranks * REC_BYTES);
    if (!recs) {
        st = hc_err_set(&c->err, HC_INIT, c->rank, HCOLL_ERR_NO_MEMORY,
                        "init: out of memory for %d ranks", c->nranks);
        goto out;
    }
    hc_boot_args_t ba;
    memset(&ba, 0, sizeof ba);
    ba.rank = c->rank;
    ba.nranks = c->nranks;
    ba.root = s->ia.root;
    ba.listen_fd = s->ia.listen_fd;
    memcpy(ba.key, s->ia.key, sizeof ba.key);
    ba.authenticated = s->ia.authenticated;
    ba.kdf_iters = s->ia.kdf_iters;
    ba.timeout_ms = c->params.timeout_ms;
    ba.init_timeout_ms = c->params.init_timeout_ms;
    ba.liveness_ms = c->params.liveness_ms;
    ba.eb = &c->err;
    ba.cancel_fd = &c->cancel_fd;
    s->ia.listen_fd = -1;
    st = hc_boot_create(&ba, s->rec, REC_BYTES, recs, &c->boot);
    hc_secure_zero(ba.key, sizeof ba.key);
    if (st != HCOLL_SUCCESS)
        goto clean_recs;
    hc_boot_key(c->boot, c->key); /* the stretched key, for split's children */

    for (int r = 0; r < c->nranks; r++) {
        if (rec_decode(recs + (size_t)r * REC_BYTES, r, &c->peers[r], err, sizeof err) != 0) {
            st = hc_err_set(&c->err, HC_INIT, c->rank, HCOLL_ERR_NETWORK, "init: %s", err);
            goto clean_boot;
        }
    }
    HC_CHECK(hc_comm_topo_build(c), clean_boot);
    hc_comm_rails_resolve(c);
    hc_comm_topo_log(c);
    HC_CHECK(hc_coll_create(c), clean_coll);
    free(recs);
    setup_free(c);
    return HCOLL_SUCCESS;

clean_coll:
    hc_coll_destroy(c->coll, 1);
clean_boot:
    hc_boot_abort(c->boot);
    hc_boot_destroy(c->boot);
    c->boot = NULL;
clean_recs:
    free(recs);
out:
    setup_free(c);
    return st;
}

static void *setup_thread(void *arg)
{
    struct hcoll_comm *c = arg;
    hcoll_status_t st = comm_setup(c);
    if (st != HCOLL_SUCCESS && atomic_load(&c->aborted))
        st = HCOLL_ERR_ABORTED;
    if (st != HCOLL_SUCCESS)
        hc_comm_set_async_error(c, st);
    atomic_store_explicit(&c->setup_state, (int)st, memory_order_release);
    HC_INFO(HC_INIT, c->rank, "background set-up ended: %s", hcoll_status_name(st));
    return NULL;
}

/* The local part of init: the communicator, its settings and this rank's
 * record; nothing here waits for another rank. */
static hcoll_status_t comm_new(hc_comm_init_t *ia, const hcoll_config_t *config,
                               const hc_params_t *params, struct hcoll_comm **c_out)
{
    hcoll_status_t st;
    char err[512];
    hc_peer_t me;
    struct hcoll_comm *c = calloc(1, sizeof *c);
    struct hc_comm_setup *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c), free(s);
        return hc_err_set(NULL, HC_INIT, ia->rank, HCOLL_ERR_NO_MEMORY, "init: out of memory");
    }
    hc_errbuf_init(&c->err);
    hc_redop_table_init(c);
    c->owner_pid = hc_pid();
    c->rank = ia->rank;
    c->nranks = ia->nranks;
    c->authenticated = ia->authenticated;
    memcpy(c->key, ia->key, sizeof c->key);
    c->setup = s;
    s->ia = *ia;
    ia->listen_fd = -1; /* s owns it now */
    atomic_init(&c->async_error, HCOLL_SUCCESS);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->setup_state, HCOLL_IN_PROGRESS);
    c->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->cancel_fd < 0) {
        st = hc_err_set(NULL, HC_INIT, ia->rank, HCOLL_ERR_SYSTEM, "init: eventfd: %s",
                        strerror(errno));
        goto clean_comm;
    }
    if (params) {
        c->params = *params;
    } else if (hc_params_load(&c->params, config, err, sizeof err) != HCOLL_SUCCESS) {
        st = hc_err_set(NULL, HC_INIT, ia->rank, HCOLL_ERR_INVALID_ARG, "init: %s", err);
        goto clean_comm;
    }
    if (hc_reduce_check(err, sizeof err) != HCOLL_SUCCESS) {
        st = hc_err_set(NULL, HC_INIT, ia->rank, HCOLL_ERR_INVALID_ARG, "init: %s", err);
        goto clean_comm;
    }

    /* This rank's GPU: the caller's current device now, so that the NIC
     * choice and GPUDirect (made when the ring connects) know it. */
    c->gpu = hc_gdr_current_device();

    memset(&me, 0, sizeof me);
    me.pid = (int)getpid();
    me.rail = c->params.rail >= 0 ? (int)c->params.rail : ia->rail;
    hc_host_id(c->params.hostid, &me.hostid, me.host, sizeof me.host);
    st = hc_ifaces_list(c->params.socket_ifname, me.addrs, HC_IFACE_MAX, &me.naddrs, err,
                        sizeof err);
    if (st != HCOLL_SUCCESS) {
        st = hc_err_set(NULL, HC_INIT, ia->rank, st, "init: HCOLL_SOCKET_IFNAME: %s", err);
        goto clean_comm;
    }
    rec_encode(&me, ia->rank, s->rec);
    c->peers = calloc((size_t)ia->nranks, sizeof *c->peers);
    if (!c->peers) {
        st = hc_err_set(NULL, HC_INIT, ia->rank, HCOLL_ERR_NO_MEMORY,
                        "init: out of memory for %d ranks", ia->nranks);
        goto clean_comm;
    }
    *c_out = c;
    return HCOLL_SUCCESS;

clean_comm:
    hc_comm_free(c, 1);
    return st;
}

hcoll_status_t hc_comm_create(hc_comm_init_t *ia, const hcoll_config_t *config,
                              const hc_params_t *params, hcoll_comm_t *comm_out)
{
    struct hcoll_comm *c;
    hcoll_status_t st = comm_new(ia, config, params, &c);
    if (ia->listen_fd >= 0)
        close(ia->listen_fd);
    ia->listen_fd = -1;
    if (st != HCOLL_SUCCESS)
        return st;
    if (!c->params.blocking) {
        int rc = pthread_create(&c->setup_thread, NULL, setup_thread, c);
        if (rc == 0) {
            c->setup_joinable = 1;
            *comm_out = c;
            return HCOLL_IN_PROGRESS;
        }
        st = hc_err_set(NULL, HC_INIT, c->rank, HCOLL_ERR_SYSTEM,
                        "init: cannot start the set-up thread: %s", strerror(rc));
        hc_comm_free(c, 1);
        return st;
    }
    st = comm_setup(c);
    if (st != HCOLL_SUCCESS) {
        init_error_keep(c);
        hc_comm_free(c, 1);
        return st;
    }
    atomic_store_explicit(&c->setup_state, HCOLL_SUCCESS, memory_order_release);
    *comm_out = c;
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_get_unique_id(hcoll_unique_id_t *id_out)
{
    char err[512];
    hc_params_t params;
    hc_iface_t ifs[1];
    hc_uid_t u;

    if (!id_out)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "id_out is NULL");
    if (hc_params_load(&params, NULL, err, sizeof err) != HCOLL_SUCCESS)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "get_unique_id: %s", err);
    int n;
    hcoll_status_t st = hc_ifaces_list(params.socket_ifname, ifs, 1, &n, err, sizeof err);
    if (st != HCOLL_SUCCESS)
        return hc_err_set(NULL, HC_INIT, -1, st, "get_unique_id: HCOLL_SOCKET_IFNAME: %s", err);
    memset(&u, 0, sizeof u);
    int fd;
    st = hc_uid_reserve(&ifs[0].addr, NULL, &fd, &u.root);
    if (st != HCOLL_SUCCESS)
        return st;
    if (hc_random_bytes(u.secret, sizeof u.secret) != 0) {
        close(fd);
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_SYSTEM, "get_unique_id: getrandom: %s",
                          strerror(errno));
    }
    hc_uid_park(u.secret, fd);
    hc_uid_encode(&u, id_out);
    if (hc_log_enabled(HC_LOG_INFO, HC_INIT)) {
        char as[80];
        HC_INFO(HC_INIT, -1, "unique id: root port reserved on %s (%s)",
                hc_sockaddr_str(&u.root, as, sizeof as), ifs[0].name);
    }
    hc_secure_zero(&u, sizeof u);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_init(hcoll_comm_t *comm_out, int nranks, int rank,
                                         const hcoll_unique_id_t *id,
                                         const hcoll_config_t *config)
{
    hc_uid_t u;
    if (!comm_out || !id)
        return hc_err_set(NULL, HC_INIT, rank, HCOLL_ERR_INVALID_ARG, "init: %s is NULL",
                          comm_out ? "id" : "comm_out");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return hc_err_set(NULL, HC_INIT, rank, HCOLL_ERR_INVALID_ARG,
                          "init: rank %d is not in 0..nranks-1 (nranks %d)", rank, nranks);
    hcoll_status_t st = hc_uid_decode(id, NULL, rank, &u);
    if (st != HCOLL_SUCCESS)
        return st;

    hc_comm_init_t ia;
    memset(&ia, 0, sizeof ia);
    ia.nranks = nranks;
    ia.rank = rank;
    ia.root = u.root;
    ia.listen_fd = -1;
    if (rank == 0 && (st = hc_uid_listen(&u, NULL, &ia.listen_fd)) != HCOLL_SUCCESS) {
        hc_secure_zero(&u, sizeof u);
        return st;
    }
    ia.rail = -1;
    memcpy(ia.key, u.secret, sizeof ia.key);
    ia.authenticated = 1;
    hc_secure_zero(&u, sizeof u);
    st = hc_comm_create(&ia, config, NULL, comm_out);
    hc_secure_zero(ia.key, sizeof ia.key);
    return st;
}

HCOLL_API hcoll_status_t hcoll_comm_init_env(hcoll_comm_t *comm_out, const hcoll_config_t *config)
{
    hc_launch_t l;
    hc_comm_init_t ia;
    memset(&ia, 0, sizeof ia);
    ia.listen_fd = -1;
    ia.rail = -1;
    if (!comm_out)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "init_env: comm_out is NULL");
    hcoll_status_t st = hc_launch_read(hc_launch_process_env, NULL, NULL, &l);
    if (st != HCOLL_SUCCESS)
        return st;
    ia.rank = l.rank;
    ia.nranks = l.nranks;
    ia.root = l.root;
    ia.authenticated = l.authenticated;
    ia.kdf_iters = l.kdf_iters;
    memcpy(ia.key, l.key, sizeof ia.key);
    hc_secure_zero(l.key, sizeof l.key);
    if (!ia.authenticated)
        HC_WARN(HC_INIT, ia.rank,
                "HCOLL_SECRET is not set: peers are not authenticated; any process that can "
                "reach the root (%s) and speaks the protocol can join this job",
                hc_launch_is_loopback(&ia.root) ? "on loopback"
                                                : "HCOLL_ALLOW_UNAUTHENTICATED=1");
    if (hc_log_enabled(HC_LOG_INFO, HC_INIT)) {
        char as[80];
        HC_INFO(HC_INIT, ia.rank, "init_env: rank %d of %d from %s variables, root %s (from %s)",
                ia.rank, ia.nranks, l.launcher, hc_sockaddr_str(&ia.root, as, sizeof as),
                l.root_from);
    }
    st = hc_comm_create(&ia, config, NULL, comm_out);
    hc_secure_zero(ia.key, sizeof ia.key);
    return st;
}
