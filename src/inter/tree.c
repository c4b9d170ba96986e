/*
 * Binomial-tree broadcast (tree.h): one put per segment and child into the
 * child's slot for this sender, forwarded from that slot, acked back.
 *
 *   sender (parent)                      receiver (child at distance 2^k)
 *   ┌ send area (root only) ┐            ┌ recv area: rounds x 2 slots ───────┐
 *   │ copy of the segment ──┼─put(k,par)►│ [k][par] ─copy─► buf               │
 *   └───────────────────────┘            │          ─put──► its own children  │
 *                            ◄─ack(k,par)┤ (once those puts are complete)     │
 *                                        └────────────────────────────────────┘
 */
#include "inter/tree.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define TR_MAX_ROUNDS 31 /* positions are ints */

/* Immediate: tag:4 | seq:16 | unused:2 | k:5 | parity:1. The tags keep a
 * stray put (a bug elsewhere) from passing for a segment or an ack. */
#define TR_TAG_DATA 0xcu
#define TR_TAG_ACK  0xdu
#define TR_IMM(tag, seq, k, par)                                                  \
    (((uint32_t)(tag) << 28) | (((uint32_t)(seq)&0xffffu) << 8) |                 \
     (((uint32_t)(k)&0x1fu) << 1) | ((uint32_t)(par)&1u))
#define TR_IMM_TAG(i) ((uint32_t)(i) >> 28)
#define TR_IMM_SEQ(i) (((uint32_t)(i) >> 8) & 0xffffu)
#define TR_IMM_K(i)   ((int)(((uint32_t)(i) >> 1) & 0x1fu))
#define TR_IMM_PAR(i) ((int)((uint32_t)(i)&1u))
#define TR_SEQ(s)     ((uint32_t)(s)&0xffffu)
#define TR_FULL       0x10000u /* landed[][]: a segment is there (| its seq) */

/* wr_id of our puts: only the segments' completions are counted. */
#define TR_WR_DATA 1
#define TR_WR_ACK  2

/* Steps of one segment, in order; then the wait for the acks. */
enum tr_step { TR_RECV, TR_SEND, TR_DRAIN, TR_ACKS, TR_DONE };

struct hc_tree {
    hc_tree_params_t p;
    const hc_transport_ops_t *ops;
    hc_transport_t *tr;
    int n, me, rounds;
    int to[TR_MAX_ROUNDS], from[TR_MAX_ROUNDS]; /* me + 2^k, me - 2^k (mod n) */
    hc_ep_t *ep_to[TR_MAX_ROUNDS], *ep_from[TR_MAX_ROUNDS];
    hc_rkey_t rk_to[TR_MAX_ROUNDS];
    unsigned char *recv, *send;
    hc_mr_t *recv_mr, *send_mr;
    size_t seg;

    /* Slots, across broadcasts: what landed here from from[k]; our puts
     * into to[k]'s slots not yet acked; messages sent to to[k] and taken
     * from from[k] (their parities pick the slot). */
    uint32_t landed[TR_MAX_ROUNDS][2];
    unsigned char busy[TR_MAX_ROUNDS][2];
    uint32_t nsent[TR_MAX_ROUNDS], ntaken[TR_MAX_ROUNDS];

    /* The running broadcast. */
    unsigned char *buf;
    size_t bytes, done, cur;
    int parent_k;        /* -1: this rank is the root */
    int kids[TR_MAX_ROUNDS], nkids, next_kid;
    int par;             /* the parity the segment landed in (not the root) */
    int active;
    enum tr_step step;
    int puts;            /* segment puts not yet locally complete */
    uint32_t seq;        /* segment number, 16 bits on the wire */
    double quiet_since;  /* hc_now_ms of the last completion */
    int op_timeout_ms;
    hcoll_status_t err;
    char addr[64], ifname[64];
};

#define TR_EB(t) ((t)->p.tp.errbuf)
#define TR_LR(t) ((t)->p.tp.log_rank)

static hcoll_status_t tr_failed(hc_tree_t *t, hcoll_status_t st)
{
    if (t->err == HCOLL_SUCCESS)
        t->err = st;
    return t->err;
}

static uint64_t slot_off(const hc_tree_t *t, int k, int par)
{
    return ((uint64_t)k * 2 + (uint64_t)par) * t->seg;
}

/* Index of position q in peers[0..n), or -1. */
static int find_peer(const int *peers, int n, int q)
{
    for (int i = 0; i < n; i++)
        if (peers[i] == q)
            return i;
    return -1;
}

static hcoll_status_t connect_partners(hc_tree_t *t)
{
    int peers[2 * TR_MAX_ROUNDS], np = 0;
    hc_ep_t *eps[2 * TR_MAX_ROUNDS] = { NULL };
    for (int k = 0; k < t->rounds; k++) {
        if (find_peer(peers, np, t->to[k]) < 0)
            peers[np++] = t->to[k];
        if (find_peer(peers, np, t->from[k]) < 0)
            peers[np++] = t->from[k];
    }
    hcoll_status_t st = t->ops->connect(t->tr, peers, np, t->p.allgather, t->p.ag_ctx, eps);
    if (st != HCOLL_SUCCESS)
        return st;
    for (int k = 0; k < t->rounds; k++) {
        t->ep_to[k] = eps[find_peer(peers, np, t->to[k])];
        t->ep_from[k] = eps[find_peer(peers, np, t->from[k])];
    }
    return HCOLL_SUCCESS;
}

typedef struct tr_info {
    uint32_t magic, pos;
    uint64_t seg;
    hc_rkey_t rkey;
} tr_info_t;
#define TR_MAGIC 0x68637472u /* "hctr" */

/* Every rank's slot key, checked: one slot size everywhere. */
static hcoll_status_t exchange_keys(hc_tree_t *t, const hc_rkey_t *mine_key)
{
    tr_info_t mine = { TR_MAGIC, (uint32_t)t->me, t->seg, *mine_key };
    tr_info_t *all = calloc((size_t)t->n, sizeof *all);
    if (!all)
        return hc_err_set(TR_EB(t), HC_NET, TR_LR(t), HCOLL_ERR_NO_MEMORY,
                          "tree broadcast: out of memory");
    hcoll_status_t st = t->p.allgather(t->p.ag_ctx, &mine, all, sizeof mine);
    for (int i = 0; st == HCOLL_SUCCESS && i < t->n; i++)
        if (all[i].magic != TR_MAGIC || all[i].pos != (uint32_t)i || all[i].seg != t->seg)
            st = hc_err_set(TR_EB(t), HC_NET, TR_LR(t), HCOLL_ERR_MISMATCH,
                            "tree broadcast: rank %d published slots of %llu bytes, this "
                            "rank %zu",
                            hc_tp_rank(&t->p.tp, i), (unsigned long long)all[i].seg, t->seg);
    for (int k = 0; st == HCOLL_SUCCESS && k < t->rounds; k++)
        t->rk_to[k] = all[t->to[k]].rkey;
    free(all);
    return st;
}

static hcoll_status_t tr_setup(hc_tree_t *t)
{
    hcoll_status_t st;
    const size_t recv_bytes = 2 * (size_t)t->rounds * t->seg;
    t->recv = aligned_alloc(64, recv_bytes);
    t->send = aligned_alloc(64, t->seg);
    if (!t->recv || !t->send)
        return hc_err_set(TR_EB(t), HC_NET, TR_LR(t), HCOLL_ERR_NO_MEMORY,
                          "tree broadcast: out of memory for %zu bytes of slots",
                          recv_bytes + t->seg);
    HC_CHECK(t->ops->create(&t->p.tp, &t->tr), out);
    HC_CHECK(connect_partners(t), out);
    hc_rkey_t key = { { 0, 0 } };
    HC_CHECK(t->ops->mr_reg(t->tr, t->recv, recv_bytes, &t->recv_mr, &key), out);
    HC_CHECK(t->ops->mr_reg(t->tr, t->send, t->seg, &t->send_mr, NULL), out);
    st = exchange_keys(t, &key);
out:
    return st; /* hc_tree_destroy frees what was made */
}

hcoll_status_t hc_tree_create(const hc_tree_params_t *p, hc_tree_t **out)
{
    const int n = p->tp.nranks, me = p->tp.rank;
    if (n < 1 || me < 0 || me >= n || !p->ops || !p->allgather || p->seg_bytes < 64 ||
        p->seg_bytes % 64)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_INVALID_ARG,
                          "tree broadcast: bad parameters (position %d of %d, slot %zu)", me,
                          n, p->seg_bytes);
    hc_tree_t *t = calloc(1, sizeof *t);
    if (!t)
        return hc_err_set(p->tp.errbuf, HC_NET, p->tp.log_rank, HCOLL_ERR_NO_MEMORY,
                          "tree broadcast: out of memory");
    t->p = *p;
    t->ops = p->ops;
    t->n = n;
    t->me = me;
    t->seg = p->seg_bytes;
    t->op_timeout_ms = p->op_timeout_ms ? p->op_timeout_ms : p->tp.timeout_ms;
    snprintf(t->addr, sizeof t->addr, "%s", p->tp.bind_addr ? p->tp.bind_addr : "");
    snprintf(t->ifname, sizeof t->ifname, "%s", p->tp.ifname ? p->tp.ifname : "?");
    t->p.tp.bind_addr = t->addr;
    t->p.tp.ifname = t->ifname;
    t->p.tp.nsocks_perpeer = 1;
    for (int dist = 1; dist < n; dist *= 2) {
        t->to[t->rounds] = (me + dist) % n;
        t->from[t->rounds] = (me - dist % n + n) % n;
        t->rounds++;
    }
    if (n > 1) {
        hcoll_status_t st = tr_setup(t);
        if (st != HCOLL_SUCCESS) {
            t->err = st;
            hc_tree_destroy(t);
            return st;
        }
    }
    HC_TRACE(HC_NET, TR_LR(t), "tree broadcast: position %d of %d, %d partners' slots of %zu",
             me, n, t->rounds, t->seg);
    *out = t;
    return HCOLL_SUCCESS;
}

static void seg_begin(hc_tree_t *t)
{
    const size_t left = t->bytes - t->done;
    t->cur = left < t->seg ? left : t->seg;
    t->next_kid = 0;
    t->step = TR_RECV;
}

hcoll_status_t hc_tree_start(hc_tree_t *t, void *buf, size_t bytes, int root)
{
    if (t->err != HCOLL_SUCCESS)
        return t->err;
    t->active = 0;
    if (root < 0 || root >= t->n)
        return tr_failed(t, hc_err_set(TR_EB(t), HC_NET, TR_LR(t), HCOLL_ERR_INVALID_ARG,
                                       "tree broadcast: root position %d of %d", root, t->n));
    if (bytes == 0 || t->n == 1)
        return HCOLL_SUCCESS; /* nothing moves: early arrivals stay where they are */
    const int v = (t->me - root + t->n) % t->n;
    int j = t->rounds; /* the root sends at every distance */
    t->parent_k = -1;
    if (v > 0) {
        for (j = 0; !(v >> j & 1); j++)
            ;
        t->parent_k = j;
    }
    t->nkids = 0;
    for (int k = j - 1; k >= 0; k--) /* the farthest first: the largest subtree */
        if (v + (1 << k) < t->n)
            t->kids[t->nkids++] = k;
    t->buf = buf;
    t->bytes = bytes;
    t->done = 0;
    t->active = 1;
    t->quiet_since = hc_now_ms();
    seg_begin(t);
    return HCOLL_SUCCESS;
}

static hcoll_status_t protocol_error(hc_tree_t *t, const hc_comp_t *c, const char *why)
{
    return tr_failed(t, hc_err_set(TR_EB(t), HC_NET, TR_LR(t), HCOLL_ERR_NETWORK,
                                   "tree broadcast: %s: message %08x from rank %d (segment %u "
                                   "here)",
                                   why, (unsigned)c->imm, hc_tp_rank(&t->p.tp, c->peer),
                                   (unsigned)TR_SEQ(t->seq)));
}

/* One completion: our put done, a segment landed, or a slot acked. */
static hcoll_status_t take(hc_tree_t *t, const hc_comp_t *c)
{
    if (c->kind == HC_COMP_PUT) {
        if (c->wr_id == TR_WR_DATA)
            t->puts--;
        return HCOLL_SUCCESS;
    }
    const int k = TR_IMM_K(c->imm), par = TR_IMM_PAR(c->imm);
    if (TR_IMM_TAG(c->imm) == TR_TAG_DATA) {
        if (k >= t->rounds || c->peer != t->from[k])
            return protocol_error(t, c, "a segment from a rank that is no sender here");
        if (t->landed[k][par])
            return protocol_error(t, c, "a segment into a slot not yet consumed");
        t->landed[k][par] = TR_FULL | TR_IMM_SEQ(c->imm);
        return HCOLL_SUCCESS;
    }
    if (TR_IMM_TAG(c->imm) == TR_TAG_ACK) {
        if (k >= t->rounds || c->peer != t->to[k] || !t->busy[k][par])
            return protocol_error(t, c, "an ack for no segment of ours");
        t->busy[k][par] = 0;
        return HCOLL_SUCCESS;
    }
    return protocol_error(t, c, "not a tree broadcast message");
}

/* Poll once, waiting up to wait_ms; *n_out completions taken. */
static hcoll_status_t reap(hc_tree_t *t, int wait_ms, int *n_out)
{
    hc_comp_t comps[16];
    int n = 0;
    hcoll_status_t st = t->ops->poll(t->tr, comps, 16, wait_ms, &n);
    *n_out = n;
    if (st != HCOLL_SUCCESS)
        return tr_failed(t, st);
    if (n > 0)
        t->quiet_since = hc_now_ms();
    for (int i = 0; i < n; i++)
        if ((st = take(t, &comps[i])) != HCOLL_SUCCESS)
            return st;
    return HCOLL_SUCCESS;
}

/* This segment to the children not yet sent to, as slots allow; 1 in
 * *waiting when a child's slot is still busy. */
static hcoll_status_t send_kids(hc_tree_t *t, int *waiting)
{
    hc_mr_t *mr = t->parent_k < 0 ? t->send_mr : t->recv_mr;
    const uint64_t off = t->parent_k < 0 ? 0 : slot_off(t, t->parent_k, t->par);
    while (t->next_kid < t->nkids) {
        const int k = t->kids[t->next_kid], par = (int)(t->nsent[k] & 1u);
        if (t->busy[k][par]) {
            *waiting = 1;
            return HCOLL_SUCCESS;
        }
        hcoll_status_t st = t->ops->put(t->ep_to[k], mr, off, &t->rk_to[k], slot_off(t, k, par),
                                        t->cur, TR_IMM(TR_TAG_DATA, t->seq, k, par), TR_WR_DATA);
        if (st != HCOLL_SUCCESS)
            return tr_failed(t, st);
        t->busy[k][par] = 1;
        t->nsent[k]++;
        t->puts++;
        t->next_kid++;
    }
    return HCOLL_SUCCESS;
}

/* Advance as far as what landed allows; *waiting = 1 when a message, a
 * slot or a completion is awaited. */
static hcoll_status_t advance(hc_tree_t *t, int *waiting)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    int n;
    *waiting = 0;
    while (st == HCOLL_SUCCESS && t->step != TR_DONE && !*waiting) {
        switch (t->step) {
        case TR_RECV:
            if (t->parent_k < 0) {
                memcpy(t->send, t->buf + t->done, t->cur);
            } else {
                const int k = t->parent_k, par = (int)(t->ntaken[k] & 1u);
                const uint32_t l = t->landed[k][par];
                if (!l) {
                    *waiting = 1;
                    break;
                }
                if (l != (TR_FULL | TR_SEQ(t->seq)))
                    return tr_failed(t, hc_err_set(TR_EB(t), HC_COLL, TR_LR(t),
                                                   HCOLL_ERR_MISMATCH,
                                                   "tree broadcast: rank %d sent segment %u "
                                                   "where this rank expects %u; the ranks' "
                                                   "broadcasts differ",
                                                   hc_tp_rank(&t->p.tp, t->from[k]),
                                                   (unsigned)(l & 0xffffu),
                                                   (unsigned)TR_SEQ(t->seq)));
                t->par = par;
            }
            t->step = TR_SEND;
            break;
        case TR_SEND:
            if ((st = send_kids(t, waiting)) != HCOLL_SUCCESS || *waiting)
                break;
            if (t->parent_k >= 0) {
                /* TCP writes what was put at its next poll: send it on
                 * before the copy, which the children need not wait for. */
                if (t->nkids && (st = reap(t, 0, &n)) != HCOLL_SUCCESS)
                    break;
                memcpy(t->buf + t->done, t->recv + slot_off(t, t->parent_k, t->par), t->cur);
            }
            t->step = TR_DRAIN;
            break;
        case TR_DRAIN:
            /* The slot (or the send area) is read until our puts are done. */
            if (t->puts > 0) {
                *waiting = 1;
                break;
            }
            if (t->parent_k >= 0) {
                const int k = t->parent_k;
                t->landed[k][t->par] = 0;
                t->ntaken[k]++;
                st = t->ops->put(t->ep_from[k], NULL, 0, NULL, 0, 0,
                                 TR_IMM(TR_TAG_ACK, t->seq, k, t->par), TR_WR_ACK);
                if (st != HCOLL_SUCCESS)
                    return tr_failed(t, st);
            }
            t->seq++;
            t->done += t->cur;
            if (t->done < t->bytes)
                seg_begin(t);
            else
                t->step = TR_ACKS;
            break;
        case TR_ACKS:
            for (int i = 0; i < t->nkids && !*waiting; i++)
                if (t->busy[t->kids[i]][0] || t->busy[t->kids[i]][1])
                    *waiting = 1;
            if (!*waiting)
                t->step = TR_DONE;
            break;
        case TR_DONE:
            break;
        }
    }
    return st;
}

/* The rank the current step awaits, for a timeout message. */
static int awaited(const hc_tree_t *t)
{
    int pos = t->me;
    if (t->step == TR_RECV && t->parent_k >= 0)
        pos = t->from[t->parent_k];
    else if (t->step == TR_SEND && t->next_kid < t->nkids)
        pos = t->to[t->kids[t->next_kid]];
    else
        for (int i = 0; i < t->nkids; i++)
            if (t->busy[t->kids[i]][0] || t->busy[t->kids[i]][1])
                pos = t->to[t->kids[i]];
    return hc_tp_rank(&t->p.tp, pos);
}

hcoll_status_t hc_tree_progress(hc_tree_t *t, int wait_ms, int spin_us, int *done_out)
{
    *done_out = 0;
    if (t->err != HCOLL_SUCCESS)
        return t->err;
    if (!t->active) {
        *done_out = 1;
        return HCOLL_SUCCESS;
    }
    const double spin_until = hc_now_us() + spin_us;
    const int landed = hc_tree_landed(t);
    for (;;) {
        int waiting, n;
        hcoll_status_t st = advance(t, &waiting);
        if (st != HCOLL_SUCCESS)
            return tr_failed(t, st);
        if (t->step == TR_DONE) {
            t->active = 0;
            *done_out = 1;
        }
        /* Done, or the vector just landed (the caller passes it on before
         * it waits for the acks): what was put may still sit in the
         * transport (TCP sends at its next poll, our ack among it), so
         * see it out, since nothing may poll for a while. */
        if (t->step == TR_DONE || (!landed && hc_tree_landed(t)))
            return reap(t, 0, &n);
        const int spinning = hc_now_us() < spin_until;
        if ((st = reap(t, spinning ? 0 : wait_ms, &n)) != HCOLL_SUCCESS)
            return st;
        if (n > 0)
            continue;
        if (spinning) {
            /* As the recursive doubling's wait: the awaited rank may need
             * this core (more ranks than cores). */
            sched_yield();
            continue;
        }
        const double quiet = hc_now_ms() - t->quiet_since;
        if (t->op_timeout_ms > 0 && quiet > t->op_timeout_ms)
            return tr_failed(t, hc_err_set(TR_EB(t), HC_COLL, TR_LR(t), HCOLL_ERR_TIMEOUT,
                                           "tree broadcast: rank %d sent nothing in %.0f ms; "
                                           "it is alive but late, or called another "
                                           "collective (HCOLL_OP_TIMEOUT_MS=%d)",
                                           awaited(t), quiet, t->op_timeout_ms));
        return HCOLL_SUCCESS;
    }
}

int hc_tree_landed(const hc_tree_t *t)
{
    return !t->active || t->step >= TR_ACKS;
}

void hc_tree_fail(hc_tree_t *t, hcoll_status_t st)
{
    if (!t)
        return;
    tr_failed(t, st);
    if (t->tr) {
        if (t->send_mr)
            t->ops->mr_dereg(t->tr, t->send_mr);
        if (t->recv_mr)
            t->ops->mr_dereg(t->tr, t->recv_mr);
        t->send_mr = t->recv_mr = NULL;
        t->ops->destroy(t->tr, 0);
        t->tr = NULL;
    }
}

void hc_tree_destroy(hc_tree_t *t)
{
    if (!t)
        return;
    if (t->tr) {
        if (t->send_mr)
            t->ops->mr_dereg(t->tr, t->send_mr);
        if (t->recv_mr)
            t->ops->mr_dereg(t->tr, t->recv_mr);
        t->ops->destroy(t->tr, t->err == HCOLL_SUCCESS && !t->active);
    }
    free(t->recv);
    free(t->send);
    free(t);
}
