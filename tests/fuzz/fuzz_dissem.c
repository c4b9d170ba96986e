/* The dissemination barrier's signals (inter/dissem.c): everything a
 * partner can make one position see, through the real barrier code
 * (hc_dissem_*) over a transport written here that never sends anything
 * anywhere. The input picks N (2..17) and the position, then is a script
 * of events:
 *   - signals from a partner, raw or built from fields (round, barrier
 *     number near the one running, the sender right or any rank);
 *   - barriers entered (this operation's number, or one further), other
 *     operations run (hc_dissem_absorb), progress, a partner's connection
 *     failing.
 * Promises checked beyond memory safety:
 *   - every signal sent is a zero-byte put to me + 2^k naming the barrier
 *     and round k, round 0 on entering and round k > 0 only once the
 *     signal of round k - 1 from me - 2^(k-1) for this barrier was
 *     delivered (early ones included);
 *   - a barrier is done only once every round's signal from its sender,
 *     for this barrier, was delivered: nobody leaves before all entered;
 *   - a signal with a wrong tag, round or sender fails it (NETWORK);
 *   - a signal for an operation this rank runs as something else fails it
 *     (MISMATCH);
 *   - a failure leaves a message and stays (later calls return it). */
#include "fuzz.h"

#include "base/err.h"
#include "base/log.h"
#include "inter/dissem.h"

struct hc_transport {
    int unused;
};
struct hc_ep {
    int peer;
};

#define FZ_MAXQ 1024
#define FZ_MAXEP 10
#define FZ_MAXK 5 /* rounds for N <= 17 */
#define FZ_MAXSEQ 64

#define DS_TAG 0xbu
#define IMM(seq, k) (DS_TAG << 28 | ((uint32_t)(seq)&0xffffu) << 8 | ((uint32_t)(k)&0xffu))

static struct {
    const uint8_t *p;
    size_t n;
    struct hc_transport tr;
    struct hc_ep eps[FZ_MAXEP];
    int neps;
    hc_comp_t q[FZ_MAXQ];
    int nq;
    hcoll_status_t fail;
    int bad_msg;      /* a signal it must refuse was delivered */
    uint32_t absorbing; /* the operation absorb runs, | 0x10000 while it does */
    hc_errbuf_t *eb;
    int np, me, rounds;
    int to[FZ_MAXK], from[FZ_MAXK];
    /* Signals delivered, per barrier number: rounds heard. */
    uint32_t seqs[FZ_MAXSEQ], heard[FZ_MAXSEQ];
    int nseqs;
    int active;       /* a barrier runs: cur */
    uint32_t cur;
    int sent;         /* rounds of cur signalled */
    int full;         /* more barrier numbers than the table holds */
} F;

static unsigned take8(void)
{
    if (!F.n)
        return 0;
    F.n--;
    return *F.p++;
}

static uint32_t take32(void)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | take8();
    return v;
}

/* The rounds heard for barrier seq: NULL when none was (lookup only), or
 * when the table is full (add: then F.full, and the checks that need it
 * are skipped). */
static uint32_t *heard_find(uint32_t seq)
{
    for (int i = 0; i < F.nseqs; i++)
        if (F.seqs[i] == seq)
            return &F.heard[i];
    return NULL;
}

static uint32_t *heard(uint32_t seq)
{
    uint32_t *h = heard_find(seq);
    if (h)
        return h;
    if (F.nseqs == FZ_MAXSEQ) {
        F.full = 1;
        return NULL;
    }
    F.seqs[F.nseqs] = seq;
    F.heard[F.nseqs] = 0;
    return &F.heard[F.nseqs++];
}

/* ---- the transport ------------------------------------------------------ */

static hcoll_status_t fz_create(const hc_transport_params_t *p, hc_transport_t **out)
{
    FUZZ_CHECK(p->nsocks_perpeer == 1);
    *out = &F.tr;
    return HCOLL_SUCCESS;
}

static hcoll_status_t fz_connect(hc_transport_t *tr, const int *peers, int npeers,
                                 hc_allgather_fn ag, void *ctx, hc_ep_t **eps_out)
{
    (void)tr, (void)ag, (void)ctx;
    FUZZ_CHECK(npeers <= FZ_MAXEP);
    for (int i = 0; i < npeers; i++) {
        int ok = 0;
        for (int k = 0; k < F.rounds; k++)
            ok |= peers[i] == F.to[k] || peers[i] == F.from[k];
        FUZZ_CHECK(ok && peers[i] != F.me);
        F.eps[i].peer = peers[i];
        eps_out[i] = &F.eps[i];
    }
    F.neps = npeers;
    return HCOLL_SUCCESS;
}

static hcoll_status_t fz_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                             uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    (void)loff, (void)rkey, (void)roff, (void)wr_id;
    FUZZ_CHECK(ep >= &F.eps[0] && ep < &F.eps[F.neps] && lmr == NULL && len == 0);
    const int k = (int)(imm & 0xffu);
    FUZZ_CHECK(imm >> 28 == DS_TAG && ((imm >> 8) & 0xffffu) == F.cur && F.active);
    FUZZ_CHECK(k == F.sent && k < F.rounds && ep->peer == F.to[k]);
    if (k > 0 && !F.full) {
        const uint32_t *h = heard_find(F.cur);
        FUZZ_CHECK(h && (*h >> (k - 1) & 1u));
    }
    F.sent++;
    return HCOLL_SUCCESS;
}

/* A delivered signal: what the barrier must make of it. */
static void deliver(const hc_comp_t *c)
{
    const int k = (int)(c->imm & 0xffu);
    const uint32_t s = (c->imm >> 8) & 0xffffu;
    FUZZ_SAY("dissem: delivered %08x from %d\n", (unsigned)c->imm, c->peer);
    if (c->imm >> 28 != DS_TAG || k >= F.rounds || c->peer != F.from[k]) {
        F.bad_msg = HCOLL_ERR_NETWORK;
        return;
    }
    if ((F.absorbing >> 16) && s == (F.absorbing & 0xffffu) && !F.bad_msg)
        F.bad_msg = HCOLL_ERR_MISMATCH;
    uint32_t *h = heard(s);
    if (h)
        *h |= 1u << k;
}

static hcoll_status_t fz_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                              int *n_out)
{
    (void)tr, (void)wait_ms;
    *n_out = 0;
    if (F.fail)
        return F.fail;
    int n = F.nq < max ? F.nq : max;
    for (int i = 0; i < n; i++) {
        comps[i] = F.q[i];
        deliver(&F.q[i]);
    }
    memmove(F.q, F.q + n, (size_t)(F.nq - n) * sizeof *F.q);
    F.nq -= n;
    *n_out = n;
    return HCOLL_SUCCESS;
}

static void fz_destroy(hc_transport_t *tr, int graceful)
{
    (void)tr, (void)graceful;
}

static const hc_transport_ops_t fz_ops = {
    .name = "fuzz", .create = fz_create, .connect = fz_connect, .put = fz_put,
    .poll = fz_poll, .destroy = fz_destroy,
};

static hcoll_status_t fz_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    (void)ctx, (void)mine, (void)all, (void)len;
    FUZZ_CHECK(!"the barrier exchanges nothing of its own");
    return HCOLL_ERR_INTERNAL;
}

/* ---- the script --------------------------------------------------------- */

static hcoll_status_t check(hcoll_status_t now, hcoll_status_t st)
{
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(now == st);
    if (F.bad_msg)
        FUZZ_CHECK(now != HCOLL_SUCCESS);
    if (now != HCOLL_SUCCESS) {
        FUZZ_CHECK(hc_errbuf_get(F.eb)[0] != '\0');
        F.active = 0;
    }
    return now;
}

static hcoll_status_t progress(hc_dissem_t *d, hcoll_status_t st)
{
    /* With no barrier running (core/barrier.c never calls it so, the
     * module allows it) progress only keeps what landed for the barrier
     * to come: fz_put refuses any signal sent meanwhile. */
    const int idle = !F.active;
    int done = 0;
    hcoll_status_t now = hc_dissem_progress(d, 0, &done);
    FUZZ_SAY("dissem: progress%s: %s%s %s\n", idle ? " (idle)" : "", hcoll_status_name(now),
             done ? " (done)" : "", now ? hc_errbuf_get(F.eb) : "");
    now = check(now, st);
    if (idle) {
        FUZZ_CHECK(now != HCOLL_SUCCESS || done);
        return now;
    }
    if (now == HCOLL_SUCCESS && done) {
        const uint32_t *h = heard_find(F.cur);
        const uint32_t all = F.rounds >= 32 ? ~0u : (1u << F.rounds) - 1u;
        FUZZ_CHECK(F.full || (h && (*h & all) == all));
        FUZZ_CHECK(F.sent == F.rounds);
        F.active = 0;
    }
    return now;
}

static void run_script(hc_dissem_t *d)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    uint32_t op = take8(); /* the executor's operation counter */
    while (F.n) {
        switch (take8() % 8) {
        case 0: { /* enter barrier op (or the next operation) */
            if (F.active)
                break;
            op += take8() & 1;
            F.cur = op & 0xffffu;
            F.sent = 0;
            F.active = 1;
            hcoll_status_t now = hc_dissem_start(d, op);
            FUZZ_SAY("dissem: barrier %u: %s\n", (unsigned)F.cur, hcoll_status_name(now));
            st = check(now, st);
            if (now == HCOLL_SUCCESS)
                op++;
            break;
        }
        case 1: { /* another operation runs: absorb */
            if (F.active)
                break;
            F.absorbing = 0x10000u | (op & 0xffffu);
            /* (A signal kept earlier for it counts as delivered now.) */
            const uint32_t *h = heard_find(op & 0xffffu);
            if (h && *h && !F.bad_msg)
                F.bad_msg = HCOLL_ERR_MISMATCH;
            hcoll_status_t now = hc_dissem_absorb(d, op, "an all-reduce");
            FUZZ_SAY("dissem: absorb %u: %s\n", (unsigned)(op & 0xffffu),
                     hcoll_status_name(now));
            F.absorbing = 0;
            st = check(now, st);
            op++;
            break;
        }
        case 2: { /* a raw signal */
            const int from = (int)(take8() % (unsigned)F.np);
            const uint32_t imm = take32();
            if (F.nq < FZ_MAXQ)
                F.q[F.nq++] = (hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = imm };
            break;
        }
        case 3:
        case 4: { /* built: round k of a barrier near op, from its sender or anyone */
            const unsigned what = take8(), k = take8() % (unsigned)(F.rounds + 1);
            const uint32_t s = op + take8() % 4 - 1;
            int from = F.from[k < (unsigned)F.rounds ? k : 0];
            if (what & 1)
                from = (int)((what >> 1) % (unsigned)F.np);
            if (F.nq < FZ_MAXQ)
                F.q[F.nq++] = (hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = IMM(s, k) };
            break;
        }
        case 5:
            if (take8() == 0xff && !F.fail)
                F.fail = hc_err_set(F.eb, HC_NET, 0, HCOLL_ERR_NETWORK,
                                    "fuzz: a partner reset its connection");
            break;
        default: st = progress(d, st); break;
        }
    }
    progress(d, st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 16 * 1024)
        return 0;
    memset(&F, 0, sizeof F);
    F.p = data;
    F.n = size;
    F.np = 2 + (int)(take8() % 16);
    F.me = (int)(take8() % (unsigned)F.np);
    for (int dist = 1; dist < F.np; dist *= 2, F.rounds++) {
        F.to[F.rounds] = (F.me + dist) % F.np;
        F.from[F.rounds] = (F.me - dist % F.np + F.np) % F.np;
    }
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    F.eb = &eb;
    hc_dissem_params_t p = {
        .ops = &fz_ops,
        .tp = { .rank = F.me, .nranks = F.np, .bind_addr = "127.0.0.1", .ifname = "fz",
                .log_rank = F.me, .timeout_ms = 1000, .nsocks_perpeer = 4, .errbuf = &eb },
        .allgather = fz_allgather,
        .op_timeout_ms = -1,
    };
    hc_dissem_t *d = NULL;
    FUZZ_CHECK(hc_dissem_create(&p, &d) == HCOLL_SUCCESS);
    run_script(d);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
    return 0;
}
