/*
 * hcoll_comm_split: children of a communicator, over the parent's
 * bootstrap, each with a bootstrap star of its own.
 *
 *   parent ranks   ── allgather {color, key, rail, ok} ──►  every rank knows
 *                                                           every color's members
 *   child rank 0   listens on an ephemeral port of its first interface
 *                  and draws a 32-byte nonce
 *   parent ranks   ── allgather {root address, nonce} ──►   members learn
 *                                                           their child's root
 *   child members  rendezvous with the child's rank 0 (boot/), key =
 *                  HMAC(parent key, "hcoll-split-v1" nonce color), then
 *                  topology and data plane as any init (comm.c)
 *
 * Members of a color are ordered by (key, parent rank). A child has its
 * own bootstrap, shared memory and connections, so parent and children run
 * at the same time and are destroyed in any order. The child key is
 * derived from the parent's secret, so no secret crosses the network (the
 * nonce does; a listener who knows it still lacks the parent's key).
 *
 * Rails: a member asks for its rail in the parent (or the config's rail
 * or HCOLL_RAIL), so a group of one rank per node keeps one NIC per rank.
 */
#include "core/comm.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "boot/hmac.h"

/* Phase 1: what each parent rank wants (network byte order). */
typedef struct split_want {
    int32_t color, key, rail, ok;
} split_want_t;

/* Phase 2: what each child's rank 0 offers its members. */
typedef struct split_offer {
    uint32_t status;        /* hcoll_status_t of its listen */
    uint16_t family, port;  /* AF_INET / AF_INET6; port in network order */
    uint32_t scope;
    unsigned char addr[16];
    unsigned char nonce[32];
} split_offer_t;

/* Members of `color`, in child rank order: by (key, parent rank). */
static int members_of(const split_want_t *w, int n, int color, int *out)
{
    int m = 0;
    for (int r = 0; r < n; r++) {
        if ((int32_t)ntohl((uint32_t)w[r].color) != color)
            continue;
        int k = (int32_t)ntohl((uint32_t)w[r].key), i = m++;
        /* Insertion: r is larger than every rank already placed. */
        while (i > 0 && (int32_t)ntohl((uint32_t)w[out[i - 1]].key) > k) {
            out[i] = out[i - 1];
            i--;
        }
        out[i] = r;
    }
    return m;
}

static void child_key(const struct hcoll_comm *p, const unsigned char nonce[32], int color,
                      unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    hc_hmac_t h;
    uint32_t col = htonl((uint32_t)color);
    hc_hmac_init(&h, p->key, sizeof p->key);
    hc_hmac_update(&h, "hcoll-split-v1", 14);
    hc_hmac_update(&h, nonce, 32);
    hc_hmac_update(&h, &col, sizeof col);
    hc_hmac_final(&h, key_out);
    hc_secure_zero(&h, sizeof h);
}

/* Child rank 0: listen where the members can reach it, fill the offer. */
static hcoll_status_t offer_make(struct hcoll_comm *p, split_offer_t *o, int *lfd_out)
{
    hc_sockaddr_t a = p->peers[p->rank].addrs[0].addr, bound;
    if (a.sa.sa_family == AF_INET6)
        a.sin6.sin6_port = 0;
    else
        a.sin.sin_port = 0;
    hcoll_status_t st = hc_boot_socket(&a, HC_BOOT_SOCK_LISTEN | HC_BOOT_SOCK_REUSEADDR, &p->err,
                                       p->rank, "split", lfd_out, &bound);
    if (st != HCOLL_SUCCESS)
        return st;
    if (hc_random_bytes(o->nonce, sizeof o->nonce) != 0) {
        close(*lfd_out);
        *lfd_out = -1;
        return hc_err_set(&p->err, HC_INIT, p->rank, HCOLL_ERR_SYSTEM,
                          "split: no random bytes for the child's key");
    }
    o->family = htons(bound.sa.sa_family);
    if (bound.sa.sa_family == AF_INET6) {
        o->port = bound.sin6.sin6_port;
        o->scope = htonl(bound.sin6.sin6_scope_id);
        memcpy(o->addr, &bound.sin6.sin6_addr, 16);
    } else {
        o->port = bound.sin.sin_port;
        memcpy(o->addr, &bound.sin.sin_addr, 4);
    }
    return HCOLL_SUCCESS;
}

static void offer_root(const split_offer_t *o, hc_sockaddr_t *root)
{
    memset(root, 0, sizeof *root);
    if (ntohs(o->family) == AF_INET6) {
        root->sin6.sin6_family = AF_INET6;
        root->sin6.sin6_port = o->port;
        root->sin6.sin6_scope_id = ntohl(o->scope);
        memcpy(&root->sin6.sin6_addr, o->addr, 16);
    } else {
        root->sin.sin_family = AF_INET;
        root->sin.sin_port = o->port;
        memcpy(&root->sin.sin_addr, o->addr, 4);
    }
}

/* Phase 1: exchange wants, check them, find this rank's members. */
static hcoll_status_t split_plan(struct hcoll_comm *p, const split_want_t *mine,
                                 split_want_t *all, int *members, int *nmembers_out)
{
    hcoll_status_t st = hc_boot_allgather(p->boot, mine, all, sizeof *mine);
    if (st != HCOLL_SUCCESS)
        return st;
    for (int r = 0; r < p->nranks; r++)
        if (!all[r].ok)
            return !mine->ok ? HCOLL_ERR_INVALID_ARG : hc_err_set(&p->err, HC_INIT, p->rank, HCOLL_ERR_INVALID_ARG,
                              "split: rank %d passed invalid arguments (see its error)", r);
    int color = (int32_t)ntohl((uint32_t)mine->color);
    *nmembers_out = color == HCOLL_SPLIT_NOCOLOR ? 0 : members_of(all, p->nranks, color, members);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_comm_split(struct hcoll_comm *p, int color, int key,
                             const hcoll_config_t *config, int args_ok, hcoll_comm_t *newcomm_out)
{
    hcoll_status_t st;
    char err[512];
    hc_params_t params = p->params;
    if (args_ok && config && hc_params_load(&params, config, err, sizeof err) != HCOLL_SUCCESS) {
        hc_err_set(&p->err, HC_INIT, p->rank, HCOLL_ERR_INVALID_ARG, "split: %s", err);
        args_ok = 0;
    }
    const int rail = params.rail >= 0 ? (int)params.rail : p->peers[p->rank].rail;
    split_want_t mine = { (int32_t)htonl((uint32_t)color), (int32_t)htonl((uint32_t)key),
                          (int32_t)htonl((uint32_t)rail), args_ok };
    split_want_t *all = calloc((size_t)p->nranks, sizeof *all);
    split_offer_t *offers = calloc((size_t)p->nranks, sizeof *offers);
    int *members = calloc((size_t)p->nranks, sizeof *members);
    int lfd = -1, nmembers = 0;
    if (!all || !offers || !members) {
        st = hc_err_set(&p->err, HC_INIT, p->rank, HCOLL_ERR_NO_MEMORY, "split: out of memory");
        goto clean_tables; /* peers time out: nothing better without memory */
    }
    st = split_plan(p, &mine, all, members, &nmembers);
    if (st != HCOLL_SUCCESS || !args_ok) {
        st = args_ok ? st : HCOLL_ERR_INVALID_ARG;
        goto clean_tables;
    }

    /* Phase 2: every child's rank 0 offers its listener (a failed listen
     * is sent too, so every member fails with it instead of waiting). */
    split_offer_t me;
    memset(&me, 0, sizeof me);
    if (nmembers > 0 && members[0] == p->rank) {
        hcoll_status_t lst = offer_make(p, &me, &lfd);
        me.status = htonl((uint32_t)lst);
    }
    HC_CHECK(hc_boot_allgather(p->boot, &me, offers, sizeof me), clean_listener);
    if (nmembers == 0) {
        *newcomm_out = NULL;
        goto clean_listener;
    }
    const split_offer_t *o = &offers[members[0]];
    if (o->status != 0) {
        st = hc_err_set(&p->err, HC_INIT, p->rank, (hcoll_status_t)ntohl(o->status),
                        "split: rank %d, the new communicator's rank 0, could not listen",
                        members[0]);
        goto clean_listener;
    }

    hc_comm_init_t ia;
    memset(&ia, 0, sizeof ia);
    ia.nranks = nmembers;
    for (int i = 0; i < nmembers; i++)
        if (members[i] == p->rank)
            ia.rank = i;
    offer_root(o, &ia.root);
    ia.listen_fd = lfd;
    lfd = -1; /* hc_comm_create consumes it */
    child_key(p, o->nonce, color, ia.key);
    ia.authenticated = p->authenticated;
    ia.rail = rail;
    params.rail = -1; /* the request travels as ia.rail */
    HC_INFO(HC_INIT, p->rank, "split: color %d key %d -> rank %d of %d, rail %d", color, key,
            ia.rank, ia.nranks, rail);
    st = hc_comm_create(&ia, NULL, &params, newcomm_out);
    hc_secure_zero(ia.key, sizeof ia.key);
    if (st != HCOLL_SUCCESS && st != HCOLL_IN_PROGRESS) {
        /* The child's message is in this thread's buffer: the parent's
         * last error says it too. */
        hc_err_set(&p->err, HC_INIT, p->rank, st, "split: %s",
                   hc_errbuf_get(hc_errbuf_thread()));
    }

clean_listener:
    if (lfd >= 0)
        close(lfd);
clean_tables:
    free(all);
    free(offers);
    free(members);
    return st;
}
