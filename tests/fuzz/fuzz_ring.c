/* The ring's control traffic (inter/ring*.c): everything a neighbour can
 * make a ring see, through the real ring code over a transport written
 * here that never sends anything anywhere. The input is a script of
 * events against one ring of 2..5 positions:
 *   - the ring info every position publishes at creation (exchange_info),
 *     valid or overwritten with input bytes;
 *   - immediates (credits, reduce-scatter / all-gather messages,
 *     descriptors' notices) from next or prev, raw or built from fields;
 *   - bytes landing anywhere in a region the ring registered (its
 *     staging slots, descriptor mailbox, gather halves, an operation's
 *     buffers), as a neighbour's put would write them, and descriptors
 *     that match the operation;
 *   - heartbeats, goodbyes and closes on the liveness links (ring_live.c);
 *   - operations started (all-reduce, one phase, broadcast) and progress.
 * Promises checked beyond memory safety: every put reads inside the
 * region it names and goes to next or prev; a failure leaves a message
 * and stays (later progress returns it again). */
#include "fuzz.h"

#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "inter/ring_priv.h"

/* The transport's objects, as this target's backend defines them. */
struct hc_transport {
    int unused;
};
struct hc_ep {
    int pos; /* 0: next, 1: prev */
};
struct hc_mr {
    char *base;
    size_t len;
    struct hc_mr *next;
};

#define FZ_MAXQ 4096

static struct {
    const uint8_t *p;
    size_t n;
    struct hc_transport tr;
    struct hc_ep eps[2];
    struct hc_mr *mrs;
    hc_comp_t q[FZ_MAXQ]; /* reported by the next poll */
    int nq;
    hc_comp_t held[FZ_MAXQ]; /* local puts not yet complete */
    int nheld;
    int raw_info; /* allgather: overwrite the peers' infos with input */
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

static void push(hc_comp_t *q, int *n, const hc_comp_t *c)
{
    if (*n < FZ_MAXQ)
        q[(*n)++] = *c;
}

/* ---- the transport ------------------------------------------------------ */

static hcoll_status_t fz_create(const hc_transport_params_t *p, hc_transport_t **out)
{
    (void)p;
    *out = &F.tr;
    return HCOLL_SUCCESS;
}

static hcoll_status_t fz_connect(hc_transport_t *tr, const int *peers, int npeers,
                                 hc_allgather_fn ag, void *ctx, hc_ep_t **eps_out)
{
    (void)tr, (void)peers, (void)ag, (void)ctx;
    for (int i = 0; i < npeers; i++) {
        F.eps[i].pos = i;
        eps_out[i] = &F.eps[i];
    }
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
    if (rkey_out)
        *rkey_out = (hc_rkey_t){ { (uint64_t)(uintptr_t)m, len } };
    *mr_out = m;
    return HCOLL_SUCCESS;
}

static void fz_mr_dereg(hc_transport_t *tr, hc_mr_t *mr)
{
    (void)tr;
    for (struct hc_mr **pp = &F.mrs; *pp; pp = &(*pp)->next)
        if (*pp == mr) {
            *pp = mr->next;
            free(mr);
            return;
        }
    FUZZ_CHECK(!"deregistering a region that is not registered");
}

static hcoll_status_t fz_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                             uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    (void)rkey, (void)roff, (void)imm;
    FUZZ_CHECK(ep == &F.eps[0] || ep == &F.eps[1]);
    if (len) {
        int known = 0;
        for (struct hc_mr *m = F.mrs; m; m = m->next)
            known |= m == lmr;
        FUZZ_CHECK(known && loff <= lmr->len && len <= lmr->len - loff);
        /* The bytes a real transport would send: ASan sees a read of
         * freed or foreign memory. */
        volatile char sink = 0;
        for (size_t i = 0; i < len; i += 61)
            sink ^= lmr->base[loff + i];
        sink ^= lmr->base[loff + len - 1];
        (void)sink;
    }
    push(F.held, &F.nheld, &(hc_comp_t){ .kind = HC_COMP_PUT, .peer = -1, .wr_id = wr_id });
    return HCOLL_SUCCESS;
}

static hcoll_status_t fz_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                              int *n_out)
{
    (void)tr, (void)wait_ms;
    int n = F.nq < max ? F.nq : max;
    memcpy(comps, F.q, (size_t)n * sizeof *comps);
    memmove(F.q, F.q + n, (size_t)(F.nq - n) * sizeof *F.q);
    F.nq -= n;
    *n_out = n;
    return HCOLL_SUCCESS;
}

static void fz_destroy(hc_transport_t *tr, int graceful)
{
    (void)tr, (void)graceful;
    while (F.mrs) {
        struct hc_mr *m = F.mrs;
        F.mrs = m->next;
        free(m);
    }
}

static const hc_transport_ops_t fz_ops = {
    .name = "fuzz", .create = fz_create, .connect = fz_connect, .mr_reg = fz_mr_reg,
    .mr_dereg = fz_mr_dereg, .put = fz_put, .poll = fz_poll, .destroy = fz_destroy,
};

/* Every position's ring info: what a correct neighbour publishes, or the
 * input's bytes instead. */
static hcoll_status_t fz_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    const ring_info_t *m = mine;
    int n = *(const int *)ctx;
    FUZZ_CHECK(len == sizeof(ring_info_t));
    for (int i = 0; i < n; i++) {
        ring_info_t *o = (ring_info_t *)((char *)all + (size_t)i * len);
        *o = *m;
        o->rank = (uint32_t)i;
        if (F.raw_info && i != (int)m->rank)
            for (size_t k = 0; k < len; k++)
                ((uint8_t *)o)[k] = (uint8_t)take8();
    }
    return HCOLL_SUCCESS;
}

/* ---- the script --------------------------------------------------------- */

typedef struct fz_buf {
    void *a, *b;
} fz_buf_t;

/* Start an operation of the input's choosing; its buffers stay until the
 * ring is gone. */
static void start_op(hc_ring_t *r, fz_buf_t *bufs, int *nbufs)
{
    unsigned what = take8(), dt = take8() % 10, op = take8() % 7;
    size_t count = (size_t)(take8() << 8 | take8()) % 3000;
    if (*nbufs >= 64 || r->op.active)
        return;
    size_t es = dt < 8 ? hcoll_dtype_size((hcoll_dtype_t)dt) : 8;
    fz_buf_t *f = &bufs[(*nbufs)++];
    f->a = calloc(count + 1, es);
    f->b = what & 4 ? f->a : calloc(count + 1, es);
    FUZZ_CHECK(f->a && f->b);
    switch (what & 3) {
    case 0:
        hc_ring_start(r, f->a, f->b, count, (hcoll_dtype_t)dt, (hcoll_op_t)op, (what >> 3) & 3);
        break;
    case 1:
        hc_ring_rs_start(r, f->a, f->b, count, (hcoll_dtype_t)dt, (hcoll_op_t)op, 0);
        break;
    case 2: hc_ring_ag_start(r, f->b, count, (hcoll_dtype_t)dt); break;
    default: hc_ring_bcast_start(r, f->b, count, (hcoll_dtype_t)dt, (int)(what >> 3) % 6); break;
    }
}

/* Bytes landing in one of the ring's registered regions. */
static void land(void)
{
    int nregs = 0, k = (int)take8();
    for (struct hc_mr *m = F.mrs; m; m = m->next)
        nregs++;
    uint32_t off = take32();
    size_t len = take8();
    if (!nregs)
        return;
    struct hc_mr *m = F.mrs;
    for (k %= nregs; k; k--)
        m = m->next;
    if (m->len == 0)
        return;
    off %= (uint32_t)m->len;
    if (len > m->len - off)
        len = m->len - off;
    for (size_t i = 0; i < len; i++)
        m->base[off + i] = (char)take8();
}

/* The descriptor a correct next writes for the active operation. */
static void good_desc(hc_ring_t *r)
{
    const ring_op_t *o = &r->op;
    /* (A broadcast's op is 0x80 | root already.) */
    ring_desc_t d = { .seq = r->seq, .sig = ring_op_sig(o->count, o->phase, o->dtype, o->op) };
    memcpy(r->ctrl + (r->seq % DESC_SLOTS) * DESC_BYTES, &d, sizeof d);
    push(F.q, &F.nq,
         &(hc_comp_t){ .kind = HC_COMP_IMM, .peer = r->next,
                       .imm = IMM(IMM_DESC, r->seq & 15, 0, 0) });
}

static void live_bytes(hc_ring_t *r, int peer_fd[2])
{
    int i = (int)(take8() & 1);
    unsigned char buf[8];
    size_t n = take8() % sizeof buf;
    for (size_t k = 0; k < n; k++)
        buf[k] = (unsigned char)take8();
    if (peer_fd[i] < 0)
        return;
    if (n == 0) { /* the neighbour's process ends */
        close(peer_fd[i]);
        peer_fd[i] = -1;
    } else {
        (void)send(peer_fd[i], buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    hc_ring_live_poll(r, 0);
}

static hcoll_status_t progress(hc_ring_t *r, hcoll_status_t st)
{
    int done = 0;
    const uint64_t seq = r->seq;
    hcoll_status_t now = hc_ring_progress(r, 0, &done);
    FUZZ_SAY("ring: progress: %s%s %s\n", hcoll_status_name(now),
             r->seq != seq ? " (an operation finished)" : "",
             now ? hc_errbuf_get(RING_ERRBUF(r)) : "");
    /* The ring's failure stays, with its message. An operation voided by
     * a peer's notice (ring_void.c: it could not register its buffers)
     * fails alone, and the ring goes on. */
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(now == st);
    if (now != HCOLL_SUCCESS)
        FUZZ_CHECK(hc_errbuf_get(RING_ERRBUF(r))[0] != '\0');
    FUZZ_CHECK(hc_ring_error(r) == HCOLL_SUCCESS || hc_ring_error(r) == now);
    return hc_ring_error(r);
}

static void run_script(hc_ring_t *r, int peer_fd[2])
{
    fz_buf_t bufs[64];
    int nbufs = 0;
    hcoll_status_t st = HCOLL_SUCCESS;
    while (F.n) {
        switch (take8() % 9) {
        case 0: start_op(r, bufs, &nbufs); break;
        case 1: { /* a raw immediate from next or prev */
            int from = take8() & 1 ? r->prev : r->next;
            push(F.q, &F.nq, &(hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = take32() });
            break;
        }
        case 2: { /* an immediate built from fields, near the ring's state */
            unsigned kind = take8(), seq = (unsigned)r->seq + (take8() % 3), slot = take8();
            unsigned m = take8() << 8 | take8();
            push(F.q, &F.nq,
                 &(hc_comp_t){ .kind = HC_COMP_IMM, .peer = kind & 4 ? r->next : r->prev,
                               .imm = IMM(kind & 3, seq & 15, slot % 17, m % 300) });
            break;
        }
        case 3: land(); break;
        case 4:
            if (r->op.active)
                good_desc(r);
            break;
        case 5: /* local puts complete */
            for (int i = 0; i < F.nheld; i++)
                push(F.q, &F.nq, &F.held[i]);
            F.nheld = 0;
            break;
        case 6: live_bytes(r, peer_fd); break;
        case 7:
        case 8: st = progress(r, st); break;
        }
    }
    progress(r, st);
    hc_ring_destroy(r);
    for (int i = 0; i < nbufs; i++) {
        if (bufs[i].b != bufs[i].a)
            free(bufs[i].b);
        free(bufs[i].a);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t chunks[4] = { 8, 64, 1000, 4096 };
    if (size < 4 || size > 64 * 1024)
        return 0;
    memset(&F, 0, sizeof F);
    F.p = data;
    F.n = size;
    unsigned shape = take8();
    int n = 2 + (int)(shape % 4);
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    hc_ring_params_t p = {
        .ops = &fz_ops,
        .tp = { .rank = (int)(take8() % (unsigned)n), .nranks = n, .bind_addr = "127.0.0.1",
                .ifname = "fz", .log_rank = 0, .timeout_ms = 1000, .nsocks_perpeer = 1,
                .errbuf = &eb },
        .chunk_bytes = chunks[(shape >> 2) & 3],
        .nslots = (int)((shape >> 4) % 5),
        .allgather = fz_allgather,
        .ag_ctx = &n,
        .op_timeout_ms = -1,
    };
    F.raw_info = (shape >> 7) & 1;
    hc_ring_t *r = NULL;
    hcoll_status_t st = hc_ring_create(&p, &r);
    if (st != HCOLL_SUCCESS) {
        FUZZ_CHECK(hc_errbuf_get(&eb)[0] != '\0');
        FUZZ_SAY("ring: create: %s\n", hc_errbuf_get(&eb));
        FUZZ_CHECK(F.mrs == NULL);
        hc_errbuf_fini(&eb);
        return 0;
    }
    /* Liveness links: socketpairs whose other ends the script writes. */
    int peer_fd[2] = { -1, -1 };
    for (int i = 0; i < 2; i++) {
        int sv[2];
        FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
        r->live[i].fd = sv[0];
        peer_fd[i] = sv[1];
        atomic_store(&r->live[i].last_ms, (long long)hc_now_ms());
        atomic_store(&r->live[i].state, HC_RING_LIVE_UP);
    }
    r->p.liveness_ms = 60000;
    run_script(r, peer_fd);
    for (int i = 0; i < 2; i++)
        if (peer_fd[i] >= 0)
            close(peer_fd[i]);
    FUZZ_CHECK(F.mrs == NULL);
    hc_errbuf_fini(&eb);
    return 0;
}
