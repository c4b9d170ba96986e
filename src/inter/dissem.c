/*
 * The dissemination barrier (dissem.h): partners at distance 2^k, one
 * zero-byte put per round, signals kept by barrier and round.
 */
#include "inter/dissem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define DS_MAX_ROUNDS 31 /* positions are ints */

/* Immediate: tag:4 | seq:16 | unused:4 | round:8. The tag keeps a stray
 * put (a bug elsewhere) from passing for a signal. */
#define DS_TAG 0xbu
#define DS_IMM(seq, round) \
    ((DS_TAG << 28) | (((uint32_t)(seq)&0xffffu) << 8) | ((uint32_t)(round)&0xffu))
#define DS_IMM_TAG(i)   ((uint32_t)(i) >> 28)
#define DS_IMM_SEQ(i)   (((uint32_t)(i) >> 8) & 0xffffu)
#define DS_IMM_ROUND(i) ((int)((uint32_t)(i)&0xffu))
#define DS_SEQ(s)       ((uint32_t)(s)&0xffffu)

struct hc_dissem {
    hc_dissem_params_t p;
    const hc_transport_ops_t *ops;
    hc_transport_t *tr;
    int n, me, rounds;
    int to[DS_MAX_ROUNDS], from[DS_MAX_ROUNDS];
    hc_ep_t *ep_to[DS_MAX_ROUNDS];
    int active;
    uint32_t seq;        /* the barrier being run (16 bits) */
    int round;           /* rounds whose signal has arrived, and ours is sent */
    uint32_t got;        /* rounds of seq heard */
    uint32_t got_next;   /* rounds of next_seq heard early */
    uint32_t next_seq;
    uint32_t last;       /* the operation entered or absorbed last (16 bits) */
    int ran;             /* last is valid: some operation was seen */
    double round_start;  /* hc_now_ms when the current round began */
    int op_timeout_ms;   /* < 0: none */
    hcoll_status_t err;
    char addr[64], ifname[64];
};

#define DS_EB(d) ((d)->p.tp.errbuf)
#define DS_LR(d) ((d)->p.tp.log_rank)

static hcoll_status_t ds_fail(hc_dissem_t *d, hcoll_status_t st)
{
    if (d->err == HCOLL_SUCCESS)
        d->err = st;
    return d->err;
}

/* Index of position q in peers[0..n), or -1. */
static int find_peer(const int *peers, int n, int q)
{
    for (int i = 0; i < n; i++)
        if (peers[i] == q)
            return i;
    return -1;
}

static hcoll_status_t connect_partners(hc_dissem_t *d)
{
    int peers[2 * DS_MAX_ROUNDS], np = 0;
    hc_ep_t *eps[2 * DS_MAX_ROUNDS] = { NULL };
    for (int k = 0; k < d->rounds; k++) {
        if (find_peer(peers, np, d->to[k]) < 0)
            peers[np++] = d->to[k];
        if (find_peer(peers, np, d->from[k]) < 0)
            peers[np++] = d->from[k];
    }
    hcoll_status_t st = d->ops->connect(d->tr, peers, np, d->p.allgather, d->p.ag_ctx, eps);
    if (st != HCOLL_SUCCESS)
        return st;
    for (int k = 0; k < d->rounds; k++)
        d->ep_to[k] = eps[find_peer(peers, np, d->to[k])];
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_dissem_create(const hc_dissem_params_t *p, hc_dissem_t **out)
{
    const int n = p->tp.nranks, me = p->tp.rank;
    if (n < 1 || me < 0 || me >= n || !p->ops || !p->allgather)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_INVALID_ARG,
                          "barrier: bad parameters (position %d of %d)", me, n);
    hc_dissem_t *d = calloc(1, sizeof *d);
    if (!d)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_NO_MEMORY,
                          "barrier: out of memory");
    d->p = *p;
    d->ops = p->ops;
    d->n = n;
    d->me = me;
    d->op_timeout_ms = p->op_timeout_ms ? p->op_timeout_ms : p->tp.timeout_ms;
    snprintf(d->addr, sizeof d->addr, "%s", p->tp.bind_addr ? p->tp.bind_addr : "");
    snprintf(d->ifname, sizeof d->ifname, "%s", p->tp.ifname ? p->tp.ifname : "?");
    d->p.tp.bind_addr = d->addr;
    d->p.tp.ifname = d->ifname;
    /* Signals carry no payload: one socket per partner is plenty. */
    d->p.tp.nsocks_perpeer = 1;
    for (int dist = 1; dist < n; dist *= 2) {
        d->to[d->rounds] = (me + dist) % n;
        d->from[d->rounds] = (me - dist % n + n) % n;
        d->rounds++;
    }
    if (n == 1) {
        *out = d;
        return HCOLL_SUCCESS;
    }
    hcoll_status_t st;
    HC_CHECK(d->ops->create(&d->p.tp, &d->tr), clean_d);
    HC_CHECK(connect_partners(d), clean_tr);
    HC_TRACE(HC_NET, DS_LR(d), "barrier: position %d of %d, %d rounds over %s", me, n, d->rounds,
             d->ops->name);
    *out = d;
    return HCOLL_SUCCESS;

clean_tr:
    d->ops->destroy(d->tr, 0);
clean_d:
    free(d);
    return st;
}

static hcoll_status_t send_round(hc_dissem_t *d, int k)
{
    hcoll_status_t st = d->ops->put(d->ep_to[k], NULL, 0, NULL, 0, 0, DS_IMM(d->seq, k), 0);
    d->round_start = hc_now_ms();
    return st == HCOLL_SUCCESS ? st : ds_fail(d, st);
}

/* A signal for a barrier this rank has not entered yet: kept. A partner
 * is at most one barrier ahead (it cannot leave one before this rank
 * entered it), so the kept signals all name one barrier; a second one
 * means the ranks' sequences of collectives differ. */
static hcoll_status_t keep_early(hc_dissem_t *d, uint32_t s, int k, int who)
{
    if (d->got_next && d->next_seq != s)
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: rank %d signalled a barrier as operation %u, "
                                     "another as operation %u before this rank entered "
                                     "either; the ranks' sequences of collectives differ",
                                     who, (unsigned)d->next_seq, (unsigned)s));
    d->next_seq = s;
    d->got_next |= 1u << k;
    return HCOLL_SUCCESS;
}

/* What this rank does while signals land (take, reap). */
enum { DS_ABSORB, DS_BARRIER, DS_IDLE };

/* One landed signal: for the current barrier (DS_BARRIER), for the next
 * one, or (DS_ABSORB: running operation cur as something else) a
 * mismatch. DS_IDLE: no operation runs (progress outside a barrier); cur
 * is the last one this rank ran, if any (d->ran), and any later barrier
 * may come next. */
static hcoll_status_t take(hc_dissem_t *d, const hc_comp_t *c, uint32_t cur, int mode,
                           const char *what)
{
    if (c->kind != HC_COMP_IMM)
        return HCOLL_SUCCESS;
    const uint32_t s = DS_IMM_SEQ(c->imm);
    const int k = DS_IMM_ROUND(c->imm);
    const int who = hc_tp_rank(&d->p.tp, c->peer);
    const int in_barrier = mode == DS_BARRIER, idle = mode == DS_IDLE;
    if (DS_IMM_TAG(c->imm) != DS_TAG || k >= d->rounds || c->peer != d->from[k])
        return ds_fail(d, hc_err_set(DS_EB(d), HC_NET, DS_LR(d), HCOLL_ERR_NETWORK,
                                     "barrier: malformed signal %08x from rank %d",
                                     (unsigned)c->imm, who));
    if (in_barrier && s == cur) {
        d->got |= 1u << k;
    } else if (s == DS_SEQ(cur + 1) || (idle && (!d->ran || s != cur))) {
        return keep_early(d, s, k, who);
    } else if (idle) {
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: rank %d signalled a barrier as operation %u, "
                                     "which this rank has already run; the ranks' sequences "
                                     "of collectives differ",
                                     who, (unsigned)s));
    } else if (s == cur) {
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: rank %d entered a barrier as operation %u, where "
                                     "this rank runs %s; every rank must call the same "
                                     "collectives in the same order",
                                     who, (unsigned)s, what));
    } else {
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: rank %d signalled a barrier as operation %u while "
                                     "this rank runs operation %u (%s); the ranks' sequences "
                                     "of collectives differ",
                                     who, (unsigned)s, (unsigned)cur, what));
    }
    return HCOLL_SUCCESS;
}

/* Poll once (waiting up to wait_ms) and take what landed; *n_out comps. */
static hcoll_status_t reap(hc_dissem_t *d, int wait_ms, uint32_t cur, int mode,
                           const char *what, int *n_out)
{
    hc_comp_t comps[16];
    int n = 0;
    hcoll_status_t st = d->ops->poll(d->tr, comps, 16, wait_ms, &n);
    *n_out = n;
    if (st != HCOLL_SUCCESS)
        return ds_fail(d, st);
    for (int i = 0; i < n; i++)
        if ((st = take(d, &comps[i], cur, mode, what)) != HCOLL_SUCCESS)
            return st;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_dissem_start(hc_dissem_t *d, uint32_t seq)
{
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    d->seq = DS_SEQ(seq);
    d->last = d->seq;
    d->ran = 1;
    /* A signal kept for another barrier: its sender left (or skipped)
     * this one without this rank, so it ran this operation as something
     * else. Dropping it would hide the mismatch. */
    if (d->got_next && d->next_seq != d->seq)
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: a rank signalled a barrier as operation %u "
                                     "before this rank entered its barrier %u; the ranks' "
                                     "sequences of collectives differ",
                                     (unsigned)d->next_seq, (unsigned)d->seq));
    d->got = d->next_seq == d->seq ? d->got_next : 0;
    d->got_next = 0;
    d->next_seq = DS_SEQ(d->seq + 0x8000u); /* matches no barrier soon */
    d->round = 0;
    d->active = 1;
    return d->rounds ? send_round(d, 0) : HCOLL_SUCCESS;
}

hcoll_status_t hc_dissem_progress(hc_dissem_t *d, int wait_ms, int *done_out)
{
    *done_out = 0;
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    if (!d->active) {
        /* No barrier runs (before the first, or between two): what landed
         * is for one to come. Taken as the barrier's own, it would make
         * this rank send rounds of a barrier it never entered, or lose
         * them when it does enter. Nothing to wait for. */
        int n = 0;
        do {
            hcoll_status_t st;
            if (d->tr && (st = reap(d, 0, d->last, DS_IDLE, "nothing", &n)) != HCOLL_SUCCESS)
                return st;
        } while (n > 0);
        *done_out = 1;
        return HCOLL_SUCCESS;
    }
    for (;;) {
        hcoll_status_t st;
        while (d->round < d->rounds && (d->got >> d->round & 1u)) {
            if (++d->round < d->rounds && (st = send_round(d, d->round)) != HCOLL_SUCCESS)
                return st;
        }
        int n;
        if (d->round == d->rounds) {
            /* The last signals may still sit in the transport (TCP sends
             * what was put at its next poll): see them out before
             * leaving, since nothing may poll again for a long time. */
            if (d->tr && (st = reap(d, 0, d->seq, DS_BARRIER, "a barrier", &n)) != HCOLL_SUCCESS)
                return st;
            d->active = 0;
            *done_out = 1;
            return HCOLL_SUCCESS;
        }
        if ((st = reap(d, wait_ms, d->seq, DS_BARRIER, "a barrier", &n)) != HCOLL_SUCCESS)
            return st;
        if (n > 0)
            continue;
        const double quiet = hc_now_ms() - d->round_start;
        if (d->op_timeout_ms > 0 && quiet > d->op_timeout_ms)
            return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_TIMEOUT,
                                         "barrier: rank %d has not entered the barrier in "
                                         "%.0f ms (round %d of %d); it is alive but late, or "
                                         "called another collective (HCOLL_OP_TIMEOUT_MS=%d)",
                                         hc_tp_rank(&d->p.tp, d->from[d->round]), quiet,
                                         d->round + 1, d->rounds, d->op_timeout_ms));
        return HCOLL_SUCCESS;
    }
}

hcoll_status_t hc_dissem_absorb(hc_dissem_t *d, uint32_t seq, const char *what)
{
    if (!d || !d->tr)
        return d ? d->err : HCOLL_SUCCESS;
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    const uint32_t cur = DS_SEQ(seq);
    d->last = cur;
    d->ran = 1;
    /* A signal kept earlier for this very operation. */
    if (d->got_next && d->next_seq == cur)
        return ds_fail(d, hc_err_set(DS_EB(d), HC_COLL, DS_LR(d), HCOLL_ERR_MISMATCH,
                                     "barrier: a rank entered a barrier as operation %u, where "
                                     "this rank runs %s; every rank must call the same "
                                     "collectives in the same order",
                                     (unsigned)cur, what));
    int n;
    do {
        hcoll_status_t st = reap(d, 0, cur, DS_ABSORB, what, &n);
        if (st != HCOLL_SUCCESS)
            return st;
    } while (n > 0);
    return HCOLL_SUCCESS;
}

void hc_dissem_fail(hc_dissem_t *d, hcoll_status_t st)
{
    if (!d)
        return;
    ds_fail(d, st);
    if (d->tr) {
        d->ops->destroy(d->tr, 0);
        d->tr = NULL;
    }
}

void hc_dissem_destroy(hc_dissem_t *d)
{
    if (!d)
        return;
    if (d->tr)
        d->ops->destroy(d->tr, d->err == HCOLL_SUCCESS && !d->active);
    free(d);
}
