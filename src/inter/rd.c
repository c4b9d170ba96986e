/*
 * Recursive-doubling all-reduce (rd.h): fold, log2(P) exchange rounds,
 * unfold; one put per message into the receiver's slot for that step.
 *
 *   this rank's memory              partner's memory
 *   ┌ send area: one slot per step ┐      ┌ recv area: 2 parities x (rounds+1) slots ┐
 *   │ copy of buf at that step ────┼─put─►│ [seq & 1][step]                           │
 *   └──────────────────────────────┘      └───────────────────────────────────────────┘
 */
#include "inter/rd.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/reduce.h"

#define RD_MAX_ROUNDS 30

/* Immediate: tag:4 | seq:16 | unused:4 | slot:8. */
#define RD_TAG 0xau
#define RD_IMM(seq, slot) \
    ((RD_TAG << 28) | (((uint32_t)(seq)&0xffffu) << 8) | ((uint32_t)(slot)&0xffu))
#define RD_IMM_TAG(i)  ((uint32_t)(i) >> 28)
#define RD_IMM_SEQ(i)  (((uint32_t)(i) >> 8) & 0xffffu)
#define RD_IMM_SLOT(i) ((int)((uint32_t)(i)&0xffu))
#define RD_SEQ(s)      ((uint32_t)(s)&0xffffu)

/* Steps of one operation, in order. */
enum rd_step { RD_FOLD, RD_ROUNDS, RD_UNFOLD, RD_DRAIN, RD_DONE };

struct hc_rd {
    hc_rd_params_t p;
    const hc_transport_ops_t *ops;
    hc_transport_t *tr;
    int n, me, pow2, rounds;
    int fold_peer;       /* p +- P, or -1 */
    hc_ep_t *ep_round[RD_MAX_ROUNDS], *ep_fold;
    hc_rkey_t rk_round[RD_MAX_ROUNDS], rk_fold;
    unsigned char *recv, *send;
    size_t recv_bytes, send_bytes; /* mapped: see rd_map */
    hc_mr_t *recv_mr, *send_mr;
    size_t seg;          /* bytes per slot */
    int nslots;          /* rounds + 1: the fold's slot is the last */

    /* The running all-reduce. */
    unsigned char *buf;
    size_t count, done_elems, seg_elems, cur_elems;
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    int active;
    uint32_t seq;        /* operation (segment) number, 16 bits on the wire */
    enum rd_step step;
    int round;           /* in RD_ROUNDS: the round; its message is sent */
    int sent;            /* this step's message is out */
    int puts;            /* puts not yet locally complete */
    uint32_t got, got_next;
    /* The agreement (hc_rd_start_agree): nw words MAX-combined at every
     * fold ahead of the data; data_len: this value's bytes, -1 once the
     * data of two values could not be combined (lengths differ). */
    int64_t *words;
    int nw;
    int64_t data_len;
    int *data_ok;        /* where the end says whether data_len held */
    double step_start;
    int op_timeout_ms;
    hcoll_status_t err;
    char addr[64], ifname[64];
};

#define RD_EB(d) ((d)->p.tp.errbuf)
#define RD_LR(d) ((d)->p.tp.log_rank)

static hcoll_status_t rd_failed(hc_rd_t *d, hcoll_status_t st)
{
    if (d->err == HCOLL_SUCCESS)
        d->err = st;
    return d->err;
}

static unsigned char *recv_slot(hc_rd_t *d, uint32_t seq, int slot)
{
    return d->recv + ((size_t)(seq & 1u) * (size_t)d->nslots + (size_t)slot) * d->seg;
}

static uint64_t recv_off(const hc_rd_t *d, uint32_t seq, int slot)
{
    return ((uint64_t)(seq & 1u) * (uint64_t)d->nslots + (uint64_t)slot) * d->seg;
}

typedef struct rd_info {
    uint32_t magic, pos;
    uint64_t seg;
    hc_rkey_t rkey;
} rd_info_t;
#define RD_MAGIC 0x68637264u /* "hcrd" */

static hcoll_status_t connect_partners(hc_rd_t *d)
{
    int peers[RD_MAX_ROUNDS + 1], np = 0;
    hc_ep_t *eps[RD_MAX_ROUNDS + 1] = { NULL };
    if (d->me < d->pow2)
        for (int k = 0; k < d->rounds; k++)
            peers[np++] = d->me ^ (1 << k);
    if (d->fold_peer >= 0)
        peers[np++] = d->fold_peer;
    hcoll_status_t st = d->ops->connect(d->tr, peers, np, d->p.allgather, d->p.ag_ctx, eps);
    if (st != HCOLL_SUCCESS)
        return st;
    for (int k = 0; d->me < d->pow2 && k < d->rounds; k++)
        d->ep_round[k] = eps[k];
    if (d->fold_peer >= 0)
        d->ep_fold = eps[np - 1];
    return HCOLL_SUCCESS;
}

/* Every rank's slot key, checked: one slot size everywhere. */
static hcoll_status_t exchange_keys(hc_rd_t *d, const hc_rkey_t *mine_key)
{
    rd_info_t mine = { RD_MAGIC, (uint32_t)d->me, d->seg, *mine_key };
    rd_info_t *all = calloc((size_t)d->n, sizeof *all);
    if (!all)
        return hc_err_set(RD_EB(d), HC_NET, RD_LR(d), HCOLL_ERR_NO_MEMORY,
                          "recursive doubling: out of memory");
    hcoll_status_t st = d->p.allgather(d->p.ag_ctx, &mine, all, sizeof mine);
    for (int i = 0; st == HCOLL_SUCCESS && i < d->n; i++)
        if (all[i].magic != RD_MAGIC || all[i].pos != (uint32_t)i || all[i].seg != d->seg)
            st = hc_err_set(RD_EB(d), HC_NET, RD_LR(d), HCOLL_ERR_MISMATCH,
                            "recursive doubling: rank %d published slots of %llu bytes, this "
                            "rank %zu",
                            hc_tp_rank(&d->p.tp, i), (unsigned long long)all[i].seg, d->seg);
    if (st == HCOLL_SUCCESS) {
        for (int k = 0; d->me < d->pow2 && k < d->rounds; k++)
            d->rk_round[k] = all[d->me ^ (1 << k)].rkey;
        if (d->fold_peer >= 0)
            d->rk_fold = all[d->fold_peer].rkey;
    }
    free(all);
    return st;
}

/* The slots are mapped, not malloc'd: a freed block this large raises
 * glibc's mmap threshold, later ones come from the heap, and the pages
 * the init probe (core/algo_model.c) touched stayed resident after
 * destroy (test_lifecycle: RSS +1.4 MB over 9 init/abort cycles). NULL
 * when the mapping fails. */
static unsigned char *rd_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static hcoll_status_t rd_setup(hc_rd_t *d)
{
    hcoll_status_t st;
    const size_t recv_bytes = 2 * (size_t)d->nslots * d->seg;
    const size_t send_bytes = (size_t)(d->rounds + 2) * d->seg;
    d->recv = rd_map(recv_bytes);
    d->recv_bytes = d->recv ? recv_bytes : 0;
    d->send = rd_map(send_bytes);
    d->send_bytes = d->send ? send_bytes : 0;
    if (!d->recv || !d->send)
        return hc_err_set(RD_EB(d), HC_NET, RD_LR(d), HCOLL_ERR_NO_MEMORY,
                          "recursive doubling: out of memory for %zu bytes of slots",
                          recv_bytes + send_bytes);
    HC_CHECK(d->ops->create(&d->p.tp, &d->tr), out);
    HC_CHECK(connect_partners(d), out);
    hc_rkey_t key = { { 0, 0 } };
    HC_CHECK(d->ops->mr_reg(d->tr, d->recv, recv_bytes, &d->recv_mr, &key), out);
    HC_CHECK(d->ops->mr_reg(d->tr, d->send, send_bytes, &d->send_mr, NULL), out);
    st = exchange_keys(d, &key);
out:
    return st; /* hc_rd_destroy frees what was made */
}

hcoll_status_t hc_rd_create(const hc_rd_params_t *p, hc_rd_t **out)
{
    const int n = p->tp.nranks, me = p->tp.rank;
    if (n < 1 || me < 0 || me >= n || !p->ops || !p->allgather || p->seg_bytes < 64 ||
        p->seg_bytes % 8)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_INVALID_ARG,
                          "recursive doubling: bad parameters (position %d of %d, slot %zu)",
                          me, n, p->seg_bytes);
    hc_rd_t *d = calloc(1, sizeof *d);
    if (!d)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_NO_MEMORY,
                          "recursive doubling: out of memory");
    d->p = *p;
    d->ops = p->ops;
    d->n = n;
    d->me = me;
    d->seg = p->seg_bytes;
    d->op_timeout_ms = p->op_timeout_ms ? p->op_timeout_ms : p->tp.timeout_ms;
    snprintf(d->addr, sizeof d->addr, "%s", p->tp.bind_addr ? p->tp.bind_addr : "");
    snprintf(d->ifname, sizeof d->ifname, "%s", p->tp.ifname ? p->tp.ifname : "?");
    d->p.tp.bind_addr = d->addr;
    d->p.tp.ifname = d->ifname;
    d->p.tp.nsocks_perpeer = 1;
    for (d->pow2 = 1; d->pow2 * 2 <= n; d->pow2 *= 2)
        d->rounds++;
    d->nslots = d->rounds + 1;
    d->fold_peer = me >= d->pow2 ? me - d->pow2 : me + d->pow2 < n ? me + d->pow2 : -1;
    if (n > 1) {
        hcoll_status_t st = rd_setup(d);
        if (st != HCOLL_SUCCESS) {
            d->err = st;
            hc_rd_destroy(d);
            return st;
        }
    }
    HC_TRACE(HC_NET, RD_LR(d), "recursive doubling: position %d of %d, %d rounds, fold %d",
             me, n, d->rounds, d->fold_peer);
    *out = d;
    return HCOLL_SUCCESS;
}

/* The step after the fold (or after the rounds), for this position. */
static void enter_step(hc_rd_t *d, enum rd_step s)
{
    d->step = s;
    d->round = 0;
    d->sent = 0;
    d->step_start = hc_now_ms();
}

static void seg_begin(hc_rd_t *d)
{
    const size_t left = d->count - d->done_elems;
    d->cur_elems = left < d->seg_elems ? left : d->seg_elems;
    d->got = d->got_next;
    d->got_next = 0;
    enter_step(d, RD_FOLD);
}

hcoll_status_t hc_rd_start(hc_rd_t *d, void *buf, size_t count, hcoll_dtype_t dtype,
                           hcoll_op_t op)
{
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    d->active = 0;
    d->nw = 0;
    if (count == 0 || d->n == 1)
        return HCOLL_SUCCESS; /* nothing moves: early arrivals stay where they are */
    d->buf = buf;
    d->count = count;
    d->dtype = dtype;
    d->op = op;
    d->done_elems = 0;
    d->seg_elems = d->seg / hcoll_dtype_size(dtype);
    d->active = 1;
    seg_begin(d);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_rd_start_agree(hc_rd_t *d, int64_t *words, int nw, void *buf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op, int *data_ok)
{
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    const size_t bytes = count * hcoll_dtype_size(dtype);
    d->active = 0;
    d->nw = 0;
    if (nw < 1 || !words || ((size_t)(nw + 1) * 8 + 63) / 64 * 64 + bytes > d->seg)
        return hc_err_set(RD_EB(d), HC_NET, RD_LR(d), HCOLL_ERR_INVALID_ARG,
                          "recursive doubling: %d words and %zu bytes do not fit a slot of %zu",
                          nw, bytes, d->seg);
    if (d->n == 1)
        return HCOLL_SUCCESS;
    d->words = words;
    d->nw = nw;
    d->data_ok = data_ok;
    d->data_len = *data_ok ? (int64_t)bytes : -1;
    d->buf = buf;
    d->count = count;
    d->dtype = dtype;
    d->op = op;
    d->done_elems = 0;
    d->seg_elems = count ? count : 1; /* one segment, empty or not */
    d->active = 1;
    seg_begin(d);
    d->cur_elems = count;
    return HCOLL_SUCCESS;
}

/* Bytes ahead of the data in a message of the agreement: the words and
 * the data's length, rounded to a cache line. */
static size_t hdr_bytes(const hc_rd_t *d)
{
    return d->nw ? ((size_t)(d->nw + 1) * 8 + 63) & ~(size_t)63 : 0;
}

/* Put this segment's current value into the peer's slot (after a copy into
 * the send area's slot for the step, since buf changes after it); in an
 * agreement, the words and the data's length ahead of it, and no data once
 * it could not be combined. */
static hcoll_status_t send_to(hc_rd_t *d, hc_ep_t *ep, const hc_rkey_t *rk, int slot,
                              int send_slot)
{
    const size_t es = hcoll_dtype_size(d->dtype), hb = hdr_bytes(d);
    size_t len = d->cur_elems * es;
    unsigned char *src = d->send + (size_t)send_slot * d->seg;
    if (d->nw) {
        memcpy(src, d->words, (size_t)d->nw * 8);
        memcpy(src + (size_t)d->nw * 8, &d->data_len, 8);
        if (d->data_len < 0)
            len = 0;
    }
    if (len)
        memcpy(src + hb, d->buf + d->done_elems * es, len);
    hcoll_status_t st = d->ops->put(ep, d->send_mr, (size_t)send_slot * d->seg, rk,
                                    recv_off(d, d->seq, slot), hb + len, RD_IMM(d->seq, slot), 0);
    if (st != HCOLL_SUCCESS)
        return rd_failed(d, st);
    d->puts++;
    d->sent = 1;
    return HCOLL_SUCCESS;
}

/* An agreement's header in a landed slot: the words MAX-combined into
 * ours; 1 when its data can be combined with ours (same length). */
static int fold_words(hc_rd_t *d, const unsigned char *slot)
{
    int64_t theirs[1];
    for (int i = 0; i < d->nw; i++) {
        memcpy(theirs, slot + (size_t)i * 8, 8);
        if (theirs[0] > d->words[i])
            d->words[i] = theirs[0];
    }
    memcpy(theirs, slot + (size_t)d->nw * 8, 8);
    if (theirs[0] != d->data_len)
        d->data_len = -1;
    return d->data_len >= 0;
}

/* Fold the peer's slot into buf: lower position's value first. */
static void fold_in(hc_rd_t *d, int slot, int peer_is_lower)
{
    const size_t es = hcoll_dtype_size(d->dtype);
    unsigned char *mine = d->buf + d->done_elems * es;
    const unsigned char *theirs = recv_slot(d, d->seq, slot);
    if (d->nw && !fold_words(d, theirs))
        return;
    theirs += hdr_bytes(d);
    if (peer_is_lower)
        hc_reduce(mine, theirs, mine, d->cur_elems, d->dtype, d->op);
    else
        hc_reduce(mine, mine, theirs, d->cur_elems, d->dtype, d->op);
}

/* One landed message: this segment's or the next one's. */
static hcoll_status_t take(hc_rd_t *d, const hc_comp_t *c)
{
    if (c->kind == HC_COMP_PUT) {
        d->puts--;
        return HCOLL_SUCCESS;
    }
    const uint32_t s = RD_IMM_SEQ(c->imm);
    const int slot = RD_IMM_SLOT(c->imm);
    if (RD_IMM_TAG(c->imm) != RD_TAG || slot >= d->nslots ||
        (s != RD_SEQ(d->seq) && s != RD_SEQ(d->seq + 1)))
        return rd_failed(d, hc_err_set(RD_EB(d), HC_NET, RD_LR(d), HCOLL_ERR_NETWORK,
                                       "recursive doubling: unexpected message %08x from "
                                       "rank %d (operation %u here)",
                                       (unsigned)c->imm, hc_tp_rank(&d->p.tp, c->peer),
                                       (unsigned)RD_SEQ(d->seq)));
    if (s == RD_SEQ(d->seq) && d->active)
        d->got |= 1u << slot;
    else
        d->got_next |= 1u << slot;
    return HCOLL_SUCCESS;
}

/* Advance the state machine as far as what landed allows; 1 when a
 * message is awaited. */
static hcoll_status_t advance(hc_rd_t *d, int *waiting)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int fslot = d->rounds;
    *waiting = 0;
    while (st == HCOLL_SUCCESS && d->step != RD_DONE && !*waiting) {
        switch (d->step) {
        case RD_FOLD:
            if (d->fold_peer < 0) {
                enter_step(d, RD_ROUNDS);
            } else if (d->me >= d->pow2) { /* extra: hand over, await the result */
                if (!d->sent)
                    st = send_to(d, d->ep_fold, &d->rk_fold, fslot, 0);
                enter_step(d, RD_UNFOLD);
            } else if (d->got >> fslot & 1u) {
                fold_in(d, fslot, 0);
                enter_step(d, RD_ROUNDS);
            } else {
                *waiting = 1;
            }
            break;
        case RD_ROUNDS:
            if (d->round == d->rounds) {
                enter_step(d, RD_UNFOLD);
                break;
            }
            if (!d->sent)
                st = send_to(d, d->ep_round[d->round], &d->rk_round[d->round], d->round,
                             1 + d->round);
            if (st == HCOLL_SUCCESS && (d->got >> d->round & 1u)) {
                fold_in(d, d->round, (d->me ^ (1 << d->round)) < d->me);
                d->round++;
                d->sent = 0;
                d->step_start = hc_now_ms();
            } else {
                *waiting = 1;
            }
            break;
        case RD_UNFOLD:
            if (d->fold_peer >= 0 && d->me >= d->pow2) {
                if (!(d->got >> fslot & 1u)) {
                    *waiting = 1;
                    break;
                }
                const size_t es = hcoll_dtype_size(d->dtype);
                const unsigned char *res = recv_slot(d, d->seq, fslot);
                if (d->nw) { /* the result's words and length are ours now */
                    memcpy(d->words, res, (size_t)d->nw * 8);
                    memcpy(&d->data_len, res + (size_t)d->nw * 8, 8);
                    res += hdr_bytes(d);
                }
                if (d->data_len >= 0 && d->cur_elems)
                    memcpy(d->buf + d->done_elems * es, res, d->cur_elems * es);
            } else if (d->fold_peer >= 0) {
                st = send_to(d, d->ep_fold, &d->rk_fold, fslot, d->rounds + 1);
            }
            enter_step(d, RD_DRAIN);
            break;
        case RD_DRAIN:
            /* The send area is reused by the next segment. */
            if (d->puts > 0) {
                *waiting = 1;
                break;
            }
            d->seq++;
            d->done_elems += d->cur_elems;
            if (d->done_elems < d->count) {
                seg_begin(d);
            } else {
                d->step = RD_DONE;
                if (d->nw)
                    *d->data_ok = d->data_len >= 0;
            }
            break;
        case RD_DONE:
            break;
        }
    }
    return st;
}

/* Poll once, waiting up to wait_ms; *n_out completions taken. */
static hcoll_status_t reap(hc_rd_t *d, int wait_ms, int *n_out)
{
    hc_comp_t comps[16];
    int n = 0;
    hcoll_status_t st = d->ops->poll(d->tr, comps, 16, wait_ms, &n);
    *n_out = n;
    if (st != HCOLL_SUCCESS)
        return rd_failed(d, st);
    for (int i = 0; i < n; i++)
        if ((st = take(d, &comps[i])) != HCOLL_SUCCESS)
            return st;
    return HCOLL_SUCCESS;
}

/* The rank whose message the current step awaits, for a timeout message. */
static int awaited(const hc_rd_t *d)
{
    int pos = d->step == RD_ROUNDS ? d->me ^ (1 << d->round) : d->fold_peer;
    return hc_tp_rank(&d->p.tp, pos < 0 ? d->me : pos);
}

hcoll_status_t hc_rd_progress(hc_rd_t *d, int wait_ms, int spin_us, int *done_out)
{
    *done_out = 0;
    if (d->err != HCOLL_SUCCESS)
        return d->err;
    if (!d->active) {
        *done_out = 1;
        return HCOLL_SUCCESS;
    }
    const double spin_until = hc_now_us() + spin_us;
    for (;;) {
        int waiting, n;
        hcoll_status_t st = advance(d, &waiting);
        if (st != HCOLL_SUCCESS)
            return rd_failed(d, st);
        if (d->step == RD_DONE) {
            /* Nothing of it sits in the transport: the drain saw every
             * put complete (TCP: the kernel took its last byte). */
            d->active = 0;
            *done_out = 1;
            return HCOLL_SUCCESS;
        }
        const int spinning = hc_now_us() < spin_until;
        if ((st = reap(d, spinning ? 0 : wait_ms, &n)) != HCOLL_SUCCESS)
            return st;
        if (n > 0)
            continue;
        if (spinning) {
            /* Give the core to whoever is runnable (the awaited rank, on a
             * host with fewer cores than ranks), as MPI's yield_when_idle. */
            sched_yield();
            continue;
        }
        const double quiet = hc_now_ms() - d->step_start;
        if (d->op_timeout_ms > 0 && quiet > d->op_timeout_ms)
            return rd_failed(d, hc_err_set(RD_EB(d), HC_COLL, RD_LR(d), HCOLL_ERR_TIMEOUT,
                                           "recursive doubling: rank %d sent nothing in %.0f "
                                           "ms; it is alive but late, or called another "
                                           "collective (HCOLL_OP_TIMEOUT_MS=%d)",
                                           awaited(d), quiet, d->op_timeout_ms));
        return HCOLL_SUCCESS;
    }
}

void hc_rd_fail(hc_rd_t *d, hcoll_status_t st)
{
    if (!d)
        return;
    rd_failed(d, st);
    if (d->tr) {
        if (d->send_mr)
            d->ops->mr_dereg(d->tr, d->send_mr);
        if (d->recv_mr)
            d->ops->mr_dereg(d->tr, d->recv_mr);
        d->send_mr = d->recv_mr = NULL;
        d->ops->destroy(d->tr, 0);
        d->tr = NULL;
    }
}

void hc_rd_destroy(hc_rd_t *d)
{
    if (!d)
        return;
    if (d->tr) {
        if (d->send_mr)
            d->ops->mr_dereg(d->tr, d->send_mr);
        if (d->recv_mr)
            d->ops->mr_dereg(d->tr, d->recv_mr);
        d->ops->destroy(d->tr, d->err == HCOLL_SUCCESS && !d->active);
    }
    if (d->recv)
        munmap(d->recv, d->recv_bytes);
    if (d->send)
        munmap(d->send, d->send_bytes);
    free(d);
}
