/* The recursive-doubling all-reduce's messages (inter/rd.c): everything a
 * partner can make one position see, through the real rd code (hc_rd_*)
 * over a transport written here that never sends anything anywhere. The
 * input picks N (2..8), the position and the slot size, then is a script
 * of events:
 *   - the slot infos every position publishes at creation, valid or
 *     overwritten with input bytes;
 *   - immediates from a partner, raw or built from fields near the
 *     operation now running (its sequence number, a slot);
 *   - bytes landing anywhere in the receive slots, as a partner's put
 *     writes them (an agreement's words and length, data);
 *   - this position's own puts completing, a partner's connection failing;
 *   - operations started (plain, or carrying the agreement's words) and
 *     progress.
 * Promises checked beyond memory safety:
 *   - every put reads inside the send area, goes to a partner of the
 *     schedule (a round's partner or the fold's), lands inside the
 *     partner's receive slots, in the slot its immediate names;
 *   - an operation is done only when every put it made has completed
 *     locally (the send area is reused next);
 *   - the agreement's words never decrease at a position that folds (one
 *     below P: it MAX-combines), and data_ok ends 0 or 1;
 *   - arguments that do not fit a slot are refused with INVALID_ARG and a
 *     message, and nothing is sent;
 *   - a failure leaves a message and stays (later progress returns it). */
#include "fuzz.h"

#include "base/err.h"
#include "base/log.h"
#include "inter/rd.h"

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

/* rd.c's slot info, as it goes through the allgather. */
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
    int nheld;      /* puts not yet locally complete */
    uint32_t seq;   /* the sequence number of the last put (the running op's) */
    int raw_info;
    hcoll_status_t fail; /* the transport's failure, once injected */
    hc_errbuf_t *eb;
    int np, me, pow2, nslots; /* positions, this one, P, slots per parity */
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

/* The partners a position must have: its rounds' and its fold's. */
static int is_partner(int peer)
{
    if (F.me < F.pow2 && peer < F.pow2 && peer != F.me &&
        __builtin_popcount((unsigned)(peer ^ F.me)) == 1)
        return 1;
    return F.me >= F.pow2 ? peer == F.me - F.pow2 : peer == F.me + F.pow2;
}

static hcoll_status_t fz_connect(hc_transport_t *tr, const int *peers, int npeers,
                                 hc_allgather_fn ag, void *ctx, hc_ep_t **eps_out)
{
    (void)tr, (void)ag, (void)ctx;
    FUZZ_CHECK(npeers <= FZ_MAXEP);
    for (int i = 0; i < npeers; i++) {
        FUZZ_CHECK(peers[i] >= 0 && peers[i] < F.np && is_partner(peers[i]));
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
    FUZZ_CHECK(ep >= &F.eps[0] && ep < &F.eps[F.neps] && is_partner(ep->peer));
    FUZZ_CHECK(lmr == F.send && F.send && loff <= lmr->len && len <= lmr->len - loff);
    FUZZ_CHECK(len <= F.seg);
    /* The partner's receive area: 2 parities x nslots slots of seg bytes;
     * the immediate names the slot (tag:4 | seq:16 | 4 | slot:8). */
    const int slot = (int)(imm & 0xffu);
    const uint32_t seq = (imm >> 8) & 0xffffu;
    FUZZ_CHECK(imm >> 28 == 0xau && slot < F.nslots);
    FUZZ_CHECK(roff == ((uint64_t)(seq & 1u) * (uint64_t)F.nslots + (uint64_t)slot) * F.seg);
    if (len) { /* the bytes a real transport would send */
        volatile unsigned char sink = lmr->base[loff] ^ lmr->base[loff + len - 1];
        (void)sink;
    }
    F.seq = seq;
    F.nheld++;
    push(&(hc_comp_t){ .kind = -1, .peer = ep->peer, .wr_id = wr_id }); /* held: see poll */
    return HCOLL_SUCCESS;
}

/* Reports the queue up to the first held put (kind -1): those complete
 * only when the script says so. */
static hcoll_status_t fz_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                              int *n_out)
{
    (void)tr, (void)wait_ms;
    *n_out = 0;
    if (F.fail)
        return F.fail;
    int n = 0, k = 0;
    hc_comp_t keep[FZ_MAXQ];
    int nkeep = 0;
    for (k = 0; k < F.nq; k++) {
        if (F.q[k].kind == -1 || n == max)
            keep[nkeep++] = F.q[k];
        else
            comps[n++] = F.q[k];
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

typedef struct fz_op {
    int busy, agree, data_ok;
    int64_t words[4], before[4];
    int nw;
    void *buf;
} fz_op_t;

static void start_op(hc_rd_t *d, fz_op_t *o)
{
    /* (Valid arguments: the caller checks them; rd takes them as given.) */
    const unsigned what = take8(), dt = take8() % HCOLL_DTYPE_COUNT_,
                   op = take8() % HCOLL_OP_COUNT_;
    size_t count = take16() % 700;
    if (o->busy)
        return;
    const size_t es = hcoll_dtype_size((hcoll_dtype_t)dt);
    free(o->buf);
    o->buf = calloc(count + 1, es);
    FUZZ_CHECK(o->buf);
    const int held = F.nheld, queued = F.nq;
    hcoll_status_t st;
    if (what & 1) {
        o->nw = 1 + (int)((what >> 1) % 4);
        for (int i = 0; i < o->nw; i++)
            o->before[i] = o->words[i] = (int64_t)(int32_t)take32();
        o->data_ok = (what >> 3) & 1;
        count %= 64;
        st = hc_rd_start_agree(d, o->words, o->nw, o->buf, count, (hcoll_dtype_t)dt,
                               (hcoll_op_t)op, &o->data_ok);
        const size_t need = ((size_t)(o->nw + 1) * 8 + 63) / 64 * 64 + count * es;
        if (st == HCOLL_SUCCESS)
            FUZZ_CHECK(need <= F.seg);
        else if (st == HCOLL_ERR_INVALID_ARG)
            FUZZ_CHECK(need > F.seg && hc_errbuf_get(F.eb)[0] != '\0');
        o->agree = st == HCOLL_SUCCESS;
        o->busy = st == HCOLL_SUCCESS;
    } else {
        o->agree = 0;
        st = hc_rd_start(d, o->buf, count, (hcoll_dtype_t)dt, (hcoll_op_t)op);
        o->busy = st == HCOLL_SUCCESS && count > 0;
    }
    FUZZ_CHECK(F.nheld == held && F.nq == queued); /* nothing moves before progress */
    FUZZ_SAY("rd: start %s count %zu dtype %u op %u: %s\n", what & 1 ? "agree" : "plain", count,
             dt, op, hcoll_status_name(st));
}

static hcoll_status_t progress(hc_rd_t *d, fz_op_t *o, hcoll_status_t st)
{
    int done = 0;
    hcoll_status_t now = hc_rd_progress(d, 0, 0, &done);
    FUZZ_SAY("rd: progress: %s%s %s\n", hcoll_status_name(now), done ? " (done)" : "",
             now ? hc_errbuf_get(F.eb) : "");
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(now == st);
    if (now != HCOLL_SUCCESS) {
        FUZZ_CHECK(hc_errbuf_get(F.eb)[0] != '\0');
        o->busy = 0;
        return now;
    }
    if (done && o->busy) {
        /* Done only once its puts completed locally. */
        FUZZ_CHECK(F.nheld == 0);
        if (o->agree) {
            FUZZ_CHECK(o->data_ok == 0 || o->data_ok == 1);
            for (int i = 0; F.me < F.pow2 && i < o->nw; i++)
                FUZZ_CHECK(o->words[i] >= o->before[i]);
        }
        o->busy = 0;
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

static void run_script(hc_rd_t *d)
{
    fz_op_t o = { 0 };
    hcoll_status_t st = HCOLL_SUCCESS;
    while (F.n) {
        switch (take8() % 8) {
        case 0: start_op(d, &o); break;
        case 1: { /* a raw immediate from a partner (or anyone) */
            const int from = (int)(take8() % (unsigned)F.np);
            push(&(hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = take32() });
            break;
        }
        case 2: { /* built from fields, near the running operation */
            const unsigned seq = F.seq + take8() % 4, slot = take8() % (unsigned)(F.nslots + 2);
            const int from = F.neps ? F.eps[take8() % (unsigned)F.neps].peer : 0;
            push(&(hc_comp_t){ .kind = HC_COMP_IMM, .peer = from,
                               .imm = 0xau << 28 | (seq & 0xffffu) << 8 | (slot & 0xffu) });
            break;
        }
        case 3: land(); break;
        case 4: /* this position's puts complete */
            for (int i = 0; i < F.nq; i++)
                if (F.q[i].kind == -1)
                    F.q[i].kind = HC_COMP_PUT;
            F.nheld = 0;
            break;
        case 5:
            if (take8() == 0xff && !F.fail) { /* a partner's connection fails */
                F.fail = hc_err_set(F.eb, HC_NET, 0, HCOLL_ERR_NETWORK,
                                    "fuzz: a partner reset its connection");
            }
            break;
        default: st = progress(d, &o, st); break;
        }
    }
    progress(d, &o, st);
    free(o.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t segs[4] = { 64, 128, 256, 1024 };
    if (size < 3 || size > 16 * 1024)
        return 0;
    memset(&F, 0, sizeof F);
    F.p = data;
    F.n = size;
    const unsigned shape = take8();
    F.np = 2 + (int)(shape % 7);
    F.me = (int)(take8() % (unsigned)F.np);
    F.raw_info = (shape >> 7) & 1;
    F.seg = segs[(shape >> 3) & 3];
    for (F.pow2 = 1; F.pow2 * 2 <= F.np; F.pow2 *= 2)
        F.nslots++;
    F.nslots++; /* rounds + the fold's */
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    F.eb = &eb;
    hc_rd_params_t p = {
        .ops = &fz_ops,
        .tp = { .rank = F.me, .nranks = F.np, .bind_addr = "127.0.0.1", .ifname = "fz",
                .log_rank = F.me, .timeout_ms = 1000, .nsocks_perpeer = 4, .errbuf = &eb },
        .allgather = fz_allgather,
        .op_timeout_ms = -1,
        .seg_bytes = F.seg,
    };
    hc_rd_t *d = NULL;
    hcoll_status_t st = hc_rd_create(&p, &d);
    FUZZ_SAY("rd: position %d of %d, slots of %zu: create %s %s\n", F.me, F.np, F.seg,
             hcoll_status_name(st), st ? hc_errbuf_get(&eb) : "");
    if (st != HCOLL_SUCCESS) {
        /* Only a partner's info can fail it, and it says so. */
        FUZZ_CHECK(F.raw_info && st == HCOLL_ERR_MISMATCH && hc_errbuf_get(&eb)[0] != '\0');
        FUZZ_CHECK(F.mrs == NULL);
        hc_errbuf_fini(&eb);
        return 0;
    }
    run_script(d);
    hc_rd_destroy(d);
    FUZZ_CHECK(F.mrs == NULL);
    hc_errbuf_fini(&eb);
    return 0;
}
