/* The broadcast tree's messages and acks (inter/tree.c): everything a
 * partner can make one position see, through the real tree code
 * (hc_tree_*) over a transport written here that never sends anything
 * anywhere. The input picks N (2..9), the position and the slot size,
 * then is a script of events:
 *   - the slot infos every position publishes at creation, valid or
 *     overwritten with input bytes;
 *   - immediates from a partner, raw, or segments and acks built from
 *     fields (distance, parity, sequence number near the running one);
 *   - bytes landing anywhere in the receive slots;
 *   - this position's own puts completing, a partner's connection failing;
 *   - broadcasts started (any root, 0..3000 bytes) and progress.
 * Promises checked beyond memory safety:
 *   - every segment put reads inside the send area or the receive slot
 *     the segment landed in, at most one slot, and goes to me + 2^k into
 *     the slot (k, parity) its immediate names, never into a slot that
 *     the child has not acked yet;
 *   - every ack is a zero-byte put to me - 2^k for a slot (k, parity)
 *     where a segment from it landed and was not acked yet;
 *   - a segment from a rank that is no sender at that distance, into a
 *     slot not yet consumed, or an ack for no segment of ours, fails the
 *     tree (NETWORK);
 *   - a broadcast is done only when its puts are complete and every slot
 *     it used was acked, and landed is 1 from then on;
 *   - a failure leaves a message and stays (later progress returns it). */
#include "fuzz.h"

#include "base/err.h"
#include "base/log.h"
#include "inter/tree.h"

struct hc_transport {
    int unused;
};
struct hc_ep {
    int peer;
};
struct hc_mr {
    unsigned char *base;
    size_t len;
    struct hc_mr *next;
};

#define FZ_MAXQ 1024
#define FZ_MAXEP 8
#define FZ_MAXK 4 /* rounds for N <= 9: ceil(log2 9) */

#define TAG_DATA 0xcu
#define TAG_ACK 0xdu
#define IMM(tag, seq, k, par) \
    ((uint32_t)(tag) << 28 | ((uint32_t)(seq)&0xffffu) << 8 | ((uint32_t)(k)&0x1fu) << 1 | \
     ((uint32_t)(par)&1u))
#define WR_DATA 1

/* tree.c's slot info, as it goes through the allgather. */
typedef struct fz_info {
    uint32_t magic, pos;
    uint64_t seg;
    hc_rkey_t rkey;
} fz_info_t;

static struct {
    const uint8_t *p;
    size_t n;
    struct hc_transport tr;
    struct hc_ep eps[FZ_MAXEP];
    int neps;
    struct hc_mr *mrs, *recv, *send;
    hc_comp_t q[FZ_MAXQ];
    int nq;
    int nheld;      /* segment puts not yet locally complete */
    uint32_t seq;   /* the segment number of the last put */
    int raw_info;
    hcoll_status_t fail;
    int bad_msg;    /* a message the tree must refuse was delivered */
    hc_errbuf_t *eb;
    int np, me, rounds;
    int to[FZ_MAXK], from[FZ_MAXK];
    int busy[FZ_MAXK][2];   /* our segment in to[k]'s slot, not acked */
    int landed[FZ_MAXK][2]; /* from[k]'s segment in our slot, not acked */
    size_t seg;
} F;

static unsigned take8(void)
{
    if (!F.n)
        return 0;
    F.n--;
    return *F.p++;
}

/* (One read per statement: the order of reads inside one expression is
 * the compiler's, and gcc's replay must read an input as clang's fuzzer.) */
static unsigned take16(void)
{
    unsigned hi = take8();
    return hi << 8 | take8();
}

static uint32_t take32(void)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | take8();
    return v;
}

static void push(const hc_comp_t *c)
{
    if (F.nq < FZ_MAXQ)
        F.q[F.nq++] = *c;
}

/* ---- the transport ------------------------------------------------------ */

static hcoll_status_t fz_create(const hc_transport_params_t *p, hc_transport_t **out)
{
    FUZZ_CHECK(p->nsocks_perpeer == 1);
    *out = &F.tr;
    return HCOLL_SUCCESS;
}

static int is_partner(int peer)
{
    for (int k = 0; k < F.rounds; k++)
        if (peer == F.to[k] || peer == F.from[k])
            return 1;
    return 0;
}

static hcoll_status_t fz_connect(hc_transport_t *tr, const int *peers, int npeers,
                                 hc_allgather_fn ag, void *ctx, hc_ep_t **eps_out)
{
    (void)tr, (void)ag, (void)ctx;
    FUZZ_CHECK(npeers <= FZ_MAXEP);
    for (int i = 0; i < npeers; i++) {
        FUZZ_CHECK(peers[i] >= 0 && peers[i] < F.np && peers[i] != F.me && is_partner(peers[i]));
        F.eps[i].peer = peers[i];
        eps_out[i] = &F.eps[i];
    }
    F.neps = npeers;
    return HCOLL_SUCCESS;
}

static hcoll_status_t fz_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                                hc_rkey_t *rkey_out)
{
    (void)tr;
    struct hc_mr *m = calloc(1, sizeof *m);
    FUZZ_CHECK(m);
    m->base = base;
    m->len = len;
    m->next = F.mrs;
    F.mrs = m;
    if (rkey_out) {
        *rkey_out = (hc_rkey_t){ { (uint64_t)(uintptr_t)m, len } };
        F.recv = m;
    } else {
        F.send = m;
    }
    *mr_out = m;
    return HCOLL_SUCCESS;
}

static void fz_mr_dereg(hc_transport_t *tr, hc_mr_t *mr)
{
    (void)tr;
    for (struct hc_mr **pp = &F.mrs; *pp; pp = &(*pp)->next)
        if (*pp == mr) {
            *pp = mr->next;
            if (mr == F.recv)
                F.recv = NULL;
            if (mr == F.send)
                F.send = NULL;
            free(mr);
            return;
        }
    FUZZ_CHECK(!"deregistering a region that is not registered");
}

static hcoll_status_t fz_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                             uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    (void)rkey;
    FUZZ_CHECK(ep >= &F.eps[0] && ep < &F.eps[F.neps]);
    const int k = (int)((imm >> 1) & 0x1fu), par = (int)(imm & 1u);
    FUZZ_CHECK(k < F.rounds);
    F.seq = (imm >> 8) & 0xffffu;
    if (imm >> 28 == TAG_ACK) { /* the slot (k, par) goes back to from[k] */
        FUZZ_CHECK(len == 0 && ep->peer == F.from[k] && F.landed[k][par]);
        F.landed[k][par] = 0;
        return HCOLL_SUCCESS;
    }
    FUZZ_CHECK(imm >> 28 == TAG_DATA && wr_id == WR_DATA);
    FUZZ_CHECK(ep->peer == F.to[k] && !F.busy[k][par]);
    FUZZ_CHECK(roff == ((uint64_t)k * 2 + (uint64_t)par) * F.seg && len <= F.seg);
    FUZZ_CHECK(lmr && (lmr == F.send || lmr == F.recv) && loff <= lmr->len &&
               len <= lmr->len - loff);
    if (lmr == F.recv) { /* forwarded from a slot that holds a segment */
        FUZZ_CHECK(loff % F.seg == 0);
        const int pk = (int)(loff / F.seg / 2), pp = (int)(loff / F.seg % 2);
        FUZZ_CHECK(F.landed[pk][pp]);
    }
    if (len) {
        volatile unsigned char sink = lmr->base[loff] ^ lmr->base[loff + len - 1];
        (void)sink;
    }
    F.busy[k][par] = 1;
    F.nheld++;
    push(&(hc_comp_t){ .kind = -1, .peer = ep->peer, .wr_id = wr_id });
    return HCOLL_SUCCESS;
}

/* A delivered message: what the tree must make of it. */
static void deliver(const hc_comp_t *c)
{
    if (c->kind != HC_COMP_IMM)
        return;
    const int k = (int)((c->imm >> 1) & 0x1fu), par = (int)(c->imm & 1u);
    const unsigned tag = c->imm >> 28;
    if (tag == TAG_DATA && k < F.rounds && c->peer == F.from[k] && !F.landed[k][par])
        F.landed[k][par] = 1;
    else if (tag == TAG_ACK && k < F.rounds && c->peer == F.to[k] && F.busy[k][par])
        F.busy[k][par] = 0;
    else
        F.bad_msg = 1;
}

static hcoll_status_t fz_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                              int *n_out)
{
    (void)tr, (void)wait_ms;
    *n_out = 0;
    if (F.fail)
        return F.fail;
    int n = 0, nkeep = 0;
    hc_comp_t keep[FZ_MAXQ];
    for (int k = 0; k < F.nq; k++) {
        if (F.q[k].kind == -1 || n == max) {
            keep[nkeep++] = F.q[k];
        } else {
            comps[n++] = F.q[k];
            deliver(&F.q[k]);
        }
    }
    memcpy(F.q, keep, (size_t)nkeep * sizeof *keep);
    F.nq = nkeep;
    *n_out = n;
    return HCOLL_SUCCESS;
}

static void fz_destroy(hc_transport_t *tr, int graceful)
{
    (void)tr, (void)graceful;
    FUZZ_CHECK(F.mrs == NULL);
}

static const hc_transport_ops_t fz_ops = {
    .name = "fuzz", .create = fz_create, .connect = fz_connect, .mr_reg = fz_mr_reg,
    .mr_dereg = fz_mr_dereg, .put = fz_put, .poll = fz_poll, .destroy = fz_destroy,
};

static hcoll_status_t fz_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    (void)ctx;
    FUZZ_CHECK(len == sizeof(fz_info_t));
    for (int i = 0; i < F.np; i++) {
        fz_info_t *o = (fz_info_t *)((char *)all + (size_t)i * len);
        memcpy(o, mine, len);
        o->pos = (uint32_t)i;
        if (F.raw_info && i != F.me)
            for (size_t k = 0; k < len; k++)
                ((uint8_t *)o)[k] = (uint8_t)take8();
    }
    return HCOLL_SUCCESS;
}

/* ---- the script --------------------------------------------------------- */

typedef struct fz_bc {
    int busy;
    void *buf;
} fz_bc_t;

static void start_bc(hc_tree_t *t, fz_bc_t *b)
{
    const size_t bytes = take16() % 3000;
    const unsigned r = take8(); /* 0xff: a root out of range (the failure is sticky) */
    const int root = r == 0xff ? F.np : (int)(r % (unsigned)F.np);
    if (b->busy)
        return;
    free(b->buf);
    b->buf = malloc(bytes + 1);
    FUZZ_CHECK(b->buf);
    memset(b->buf, 0x5a, bytes + 1);
    const int held = F.nheld, queued = F.nq;
    hcoll_status_t st = hc_tree_start(t, b->buf, bytes, root);
    if (root == F.np)
        FUZZ_CHECK(st != HCOLL_SUCCESS && hc_errbuf_get(F.eb)[0] != '\0');
    b->busy = st == HCOLL_SUCCESS && bytes > 0;
    FUZZ_CHECK(F.nheld == held && F.nq == queued);
    FUZZ_SAY("tree: start %zu bytes from %d: %s\n", bytes, root, hcoll_status_name(st));
}

static hcoll_status_t progress(hc_tree_t *t, fz_bc_t *b, hcoll_status_t st)
{
    int done = 0;
    hcoll_status_t now = hc_tree_progress(t, 0, 0, &done);
    FUZZ_SAY("tree: progress: %s%s%s %s\n", hcoll_status_name(now), done ? " (done)" : "",
             hc_tree_landed(t) ? " (landed)" : "", now ? hc_errbuf_get(F.eb) : "");
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(now == st);
    if (F.bad_msg)
        FUZZ_CHECK(now != HCOLL_SUCCESS);
    if (now != HCOLL_SUCCESS) {
        FUZZ_CHECK(hc_errbuf_get(F.eb)[0] != '\0');
        b->busy = 0;
        return now;
    }
    if (done && b->busy) {
        FUZZ_CHECK(F.nheld == 0 && hc_tree_landed(t));
        for (int k = 0; k < F.rounds; k++)
            FUZZ_CHECK(!F.busy[k][0] && !F.busy[k][1]);
        b->busy = 0;
    }
    return now;
}

static void land(void)
{
    const uint32_t off = take32();
    const size_t len = take8();
    if (!F.recv || !F.recv->len)
        return;
    size_t o = off % F.recv->len, l = len > F.recv->len - o ? F.recv->len - o : len;
    for (size_t i = 0; i < l; i++)
        F.recv->base[o + i] = (unsigned char)take8();
}

static void run_script(hc_tree_t *t)
{
    fz_bc_t b = { 0 };
    hcoll_status_t st = HCOLL_SUCCESS;
    while (F.n) {
        switch (take8() % 8) {
        case 0: start_bc(t, &b); break;
        case 1: {
            const int from = (int)(take8() % (unsigned)F.np);
            push(&(hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = take32() });
            break;
        }
        case 2:
        case 3: { /* a segment from from[k], or an ack from to[k], from fields */
            const unsigned what = take8(), k = take8() % (unsigned)(F.rounds + 1);
            const uint32_t seq = F.seq + take8() % 4 - 1;
            const int ack = what & 1, kk = (int)(k < (unsigned)F.rounds ? k : 0);
            int from = ack ? F.to[kk] : F.from[kk];
            if (what & 2)
                from = (int)((what >> 2) % (unsigned)F.np);
            push(&(hc_comp_t){ .kind = HC_COMP_IMM, .peer = from,
                               .imm = IMM(ack ? TAG_ACK : TAG_DATA, seq, k, what >> 7) });
            break;
        }
        case 4: land(); break;
        case 5:
            for (int i = 0; i < F.nq; i++)
                if (F.q[i].kind == -1)
                    F.q[i].kind = HC_COMP_PUT;
            F.nheld = 0;
            break;
        case 6:
            if (take8() == 0xff && !F.fail)
                F.fail = hc_err_set(F.eb, HC_NET, 0, HCOLL_ERR_NETWORK,
                                    "fuzz: a partner reset its connection");
            break;
        default: st = progress(t, &b, st); break;
        }
    }
    progress(t, &b, st);
    free(b.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t segs[4] = { 64, 128, 512, 1024 };
    if (size < 3 || size > 16 * 1024)
        return 0;
    memset(&F, 0, sizeof F);
    F.p = data;
    F.n = size;
    const unsigned shape = take8();
    F.np = 2 + (int)(shape % 8);
    F.me = (int)(take8() % (unsigned)F.np);
    F.raw_info = (shape >> 7) & 1;
    F.seg = segs[(shape >> 3) & 3];
    for (int dist = 1; dist < F.np; dist *= 2, F.rounds++) {
        F.to[F.rounds] = (F.me + dist) % F.np;
        F.from[F.rounds] = (F.me - dist % F.np + F.np) % F.np;
    }
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    F.eb = &eb;
    hc_tree_params_t p = {
        .ops = &fz_ops,
        .tp = { .rank = F.me, .nranks = F.np, .bind_addr = "127.0.0.1", .ifname = "fz",
                .log_rank = F.me, .timeout_ms = 1000, .nsocks_perpeer = 4, .errbuf = &eb },
        .allgather = fz_allgather,
        .op_timeout_ms = -1,
        .seg_bytes = F.seg,
    };
    hc_tree_t *t = NULL;
    hcoll_status_t st = hc_tree_create(&p, &t);
    FUZZ_SAY("tree: position %d of %d, slots of %zu: create %s %s\n", F.me, F.np, F.seg,
             hcoll_status_name(st), st ? hc_errbuf_get(&eb) : "");
    if (st != HCOLL_SUCCESS) {
        FUZZ_CHECK(F.raw_info && st == HCOLL_ERR_MISMATCH && hc_errbuf_get(&eb)[0] != '\0');
        FUZZ_CHECK(F.mrs == NULL);
        hc_errbuf_fini(&eb);
        return 0;
    }
    run_script(t);
    hc_tree_destroy(t);
    FUZZ_CHECK(F.mrs == NULL);
    hc_errbuf_fini(&eb);
    return 0;
}
