/*
 * The transport contract (src/inter/transport.h), written once and run
 * against every transport that can run here, each case on forked ranks:
 *
 *   tcp     hc_tcp_ops, one socket per peer
 *   tcp3    hc_tcp_ops, three sockets per peer (puts striped over them)
 *   ib      hc_ib_ops on the emulated libibverbs (tests/mock/verbs.c,
 *           build/mock/libibverbs.so.1) and the RoCE fixture tree
 *           tests/fixtures/sysfs-roce; skipped, saying why, where hcoll was
 *           built without rdma-core headers or the mock is not built
 *
 * Cases (each promised by transport.h):
 *   ring_connect    a ring of 4 ranks connects to next and prev; a put to
 *                   next and a zero-length put to prev arrive with their
 *                   immediates and the sender's position as peer
 *   puts_land       a burst of puts (zero to megabytes, more than any queue
 *                   holds) issued without polling: each immediate only once
 *                   its payload is in place, each local completion once its
 *                   source may be rewritten (the sender scribbles over it at
 *                   once), nothing outside the target ranges written
 *   peer_killed     a peer that dies (SIGKILL) makes the survivor fail with
 *                   HCOLL_ERR_PEER_FAILED naming it, well within the
 *                   deadline; the error is sticky
 *   peer_reset      a peer that destroys without grace makes an idle
 *                   survivor fail at once, not at its deadline
 *   graceful_close  an orderly destroy is no failure for the peer
 *   garbage_address a peer whose exchanged address is garbage is refused
 *                   with a message, within the connect deadline
 * Every case ends with the transport destroyed and checks that it left no
 * file descriptor (and, on the emulation, no verbs object) behind.
 *
 * dlopen reads LD_LIBRARY_PATH when the process starts, so main
 * re-executes this program with LD_LIBRARY_PATH=$HCOLL_TEST_BUILD/mock and
 * HCOLL_SYSFS_ROOT set when the mock is there.
 */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "base/config.h"
#include "base/err.h"
#include "base/log.h"
#include "boot/hmac.h"
#include "hc_build.h"
#include "inter/transport.h"

#define TEST_TIMEOUT_S 90
#define MAXR 4
#define GARBAGE_TIMEOUT_MS 1500 /* connect deadline when a peer's address is garbage */

/* ------------------------------------------------------------------------ */
/* The transports                                                             */
/* ------------------------------------------------------------------------ */

typedef struct tp_kind {
    const char *name;
    const hc_transport_ops_t *ops;
    int nsocks;       /* TCP: sockets per peer */
    int verbs;        /* the emulated verbs: one NIC for every rank */
    int available;
    char why[300];    /* why not available */
} tp_kind_t;

static tp_kind_t kinds[] = {
    { "tcp", &hc_tcp_ops, 1, 0, 1, "" },
    { "tcp3", &hc_tcp_ops, 3, 0, 1, "" },
#if HCOLL_BUILD_VERBS
    { "ib", &hc_ib_ops, 1, 1, 0, "" },
#else
    { "ib", NULL, 1, 1, 0, "hcoll was built without rdma-core headers: no verbs transport" },
#endif
};
#define NKINDS (int)(sizeof kinds / sizeof kinds[0])

static hc_errbuf_t eb; /* per forked rank */

/*
 * The one place that fills a transport's settings. The knobs a transport
 * reads come from hc_params_load, as a communicator's do (the verbs
 * transport reads the same environment itself); the rest is the test's:
 * TCP ranks on 127.0.0.<rank+1>, the emulated verbs ranks all on NIC 0.
 */
/* The data connections' hello key (a communicator passes its own). */
static const unsigned char tp_key[HC_TP_KEY_BYTES] = "test_transport's data hello key";

static hcoll_status_t tp_params(const tp_kind_t *k, int rank, int n, int timeout_ms,
                                hc_transport_params_t *p_out)
{
    static hc_params_t knobs;
    static char addr[MAXR][32];
    char err[256];
    hc_errbuf_init(&eb);
    if (hc_params_load(&knobs, NULL, err, sizeof err) != HCOLL_SUCCESS)
        return hc_err_set(&eb, HC_NET, rank, HCOLL_ERR_INVALID_ARG, "test: %s", err);
    snprintf(addr[rank], sizeof addr[rank], "127.0.0.%d", k->verbs ? 1 : rank + 1);
    hc_transport_params_t p = {
        .rank = rank,
        .nranks = n,
        .bind_addr = addr[rank],
        .ifname = "lo",
        .rail = k->verbs ? 0 : rank, /* verbs: the local rank that picks the NIC */
        .log_rank = rank,
        .timeout_ms = timeout_ms,
        .nsocks_perpeer = k->nsocks,
        .socket_buf = knobs.socket_buf,
        .errbuf = &eb,
        .has_gpu = 0,
        .gpu = -1,
        .peer_ranks = NULL,
        .settings = &knobs,
        .auth_key = tp_key,
        .mac = hc_hmac_sha256,
    };
    *p_out = p;
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Fixture: address exchange, completions, what a destroy must release        */
/* ------------------------------------------------------------------------ */

/* Address exchange over shared memory, standing in for the bootstrap. A
 * rank with liar set publishes garbage instead of what it was given. */
typedef struct shm_ag {
    hct_barrier_t bar;
    int nranks;
    int liar;                 /* rank + 1 of the rank that lies, 0: none */
    int ag_timeout_ms;        /* how long the exchange waits for every rank */
    volatile double kill_ms;  /* peer_killed: when the victim died */
    char slot[MAXR][4096];
} shm_ag_t;

typedef struct ag_ctx {
    shm_ag_t *shm;
    int rank;
} ag_ctx_t;

static hcoll_status_t shm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_ctx_t *c = ctx;
    if (len > sizeof c->shm->slot[0])
        return HCOLL_ERR_INTERNAL;
    if (c->shm->liar == c->rank + 1)
        memset(c->shm->slot[c->rank], 0x5A, len);
    else
        memcpy(c->shm->slot[c->rank], mine, len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, c->shm->ag_timeout_ms) != 0)
        return HCOLL_ERR_TIMEOUT;
    for (int i = 0; i < c->shm->nranks; i++)
        memcpy((char *)all + (size_t)i * len, c->shm->slot[i], len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, c->shm->ag_timeout_ms) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

static int barrier(shm_ag_t *shm)
{
    return hct_barrier_wait(&shm->bar, shm->nranks, 20000);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* After destroy: the fds open before create, and no verbs object left in
 * the emulation (a leaked MR pins memory, a leaked QP keeps a peer's
 * connection half open). */
static int released(const tp_kind_t *k, int fds_before, const char *who)
{
    int fds = count_fds();
    HCT_REQUIRE(fds == fds_before, "%s %s: %d file descriptor(s) open after destroy, %d before",
                k->name, who, fds, fds_before);
    if (!k->verbs)
        return 0;
    static const char *const live[] = { "live_contexts", "live_pds", "live_mrs", "live_cqs",
                                        "live_qps" };
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(h, "%s %s: libibverbs.so.1 is not loaded: hcoll did not use verbs", k->name, who);
    uint64_t (*stat)(const char *) = (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat");
    HCT_REQUIRE(stat, "%s %s: not the mock", k->name, who);
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        HCT_REQUIRE(stat(live[i]) == 0, "%s %s: %llu verbs object(s) left after destroy (%s)",
                    k->name, who, (unsigned long long)stat(live[i]), live[i]);
    dlclose(h);
    return 0;
}

/* Create and connect to peers[0..npeers-1]; eps[i] is the endpoint to
 * peers[i]. */
static int tp_open(const tp_kind_t *k, shm_ag_t *shm, int rank, int n, int timeout_ms,
                   const int *peers, int npeers, hc_transport_t **tr_out, hc_ep_t **eps)
{
    ag_ctx_t ag = { shm, rank };
    hc_transport_params_t p;
    HCT_REQUIRE(tp_params(k, rank, n, timeout_ms, &p) == HCOLL_SUCCESS, "params: %s", eb.msg);
    HCT_REQUIRE(k->ops->create(&p, tr_out) == HCOLL_SUCCESS, "%s create: %s", k->name, eb.msg);
    HCT_REQUIRE(k->ops->connect(*tr_out, peers, npeers, shm_allgather, &ag, eps) == HCOLL_SUCCESS,
                "%s connect: %s", k->name, eb.msg);
    return 0;
}

/* Every rank's rkey, by position. */
static int exchange_rkeys(shm_ag_t *shm, int rank, const hc_rkey_t *mine, hc_rkey_t *all)
{
    ag_ctx_t ag = { shm, rank };
    HCT_REQUIRE(shm_allgather(&ag, mine, all, sizeof *mine) == HCOLL_SUCCESS, "exchange keys");
    return 0;
}

/* Poll until nimm immediates and nput local completions arrived (into imm
 * and put), for up to timeout_ms. Returns how many of both; *st_out is the
 * error that stopped it. */
static int wait_kinds(const tp_kind_t *k, hc_transport_t *tr, hc_comp_t *imm, int nimm,
                      hc_comp_t *put, int nput, int timeout_ms, hcoll_status_t *st_out)
{
    int gi = 0, gp = 0;
    double deadline = hct_now_ms() + timeout_ms;
    *st_out = HCOLL_SUCCESS;
    while ((gi < nimm || gp < nput) && hct_now_ms() < deadline) {
        hc_comp_t c[16];
        int n = 0;
        hcoll_status_t st = k->ops->poll(tr, c, 16, 20, &n);
        if (st != HCOLL_SUCCESS) {
            *st_out = st;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (c[i].kind == HC_COMP_IMM && gi < nimm)
                imm[gi++] = c[i];
            else if (c[i].kind == HC_COMP_PUT && gp < nput)
                put[gp++] = c[i];
        }
    }
    return gi + gp;
}

typedef struct case_arg {
    const tp_kind_t *k;
    shm_ag_t *shm;
} case_arg_t;

static int run_case(int kidx, int nranks, hct_rank_fn fn, int liar, hct_result_t *res,
                    shm_ag_t **shm_out)
{
    shm_ag_t *shm = hct_shared_alloc(sizeof *shm);
    shm->nranks = nranks;
    shm->liar = liar;
    /* A liar's peer gives up connecting; an exchange the transport starts
     * after that (verbs has a second one) must not outlast the deadline. */
    shm->ag_timeout_ms = liar ? GARBAGE_TIMEOUT_MS : 20000;
    case_arg_t a = { &kinds[kidx], shm };
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 1, .timeout_ms = 60000 };
    int bad = hct_run(&o, fn, &a, res);
    if (shm_out)
        *shm_out = shm;
    else
        hct_shared_free(shm, sizeof *shm);
    return bad;
}

/* ------------------------------------------------------------------------ */
/* ring_connect                                                               */
/* ------------------------------------------------------------------------ */

#define RC_BYTES 100000

static unsigned char ring_pat(int rank, size_t i)
{
    return (unsigned char)(rank * 37 + i * 7 + (i >> 8));
}

static int rank_ring_connect(int rank, int n, void *argp)
{
    case_arg_t *a = argp;
    const tp_kind_t *k = a->k;
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const int fds = count_fds();
    int peers[2] = { next, prev };
    hc_ep_t *eps[2] = { NULL, NULL };
    hc_transport_t *tr;
    if (tp_open(k, a->shm, rank, n, 10000, peers, 2, &tr, eps))
        return 1;
    HCT_REQUIRE(eps[0] && eps[1] && eps[0] != eps[1], "two distinct endpoints");
    unsigned char *src = malloc(RC_BYTES), *dst = malloc(RC_BYTES);
    HCT_REQUIRE(src && dst, "malloc");
    for (size_t i = 0; i < RC_BYTES; i++)
        src[i] = ring_pat(rank, i);
    memset(dst, 0, RC_BYTES);
    hc_mr_t *smr, *dmr;
    hc_rkey_t srk, drk, rks[MAXR];
    HCT_REQUIRE(k->ops->mr_reg(tr, src, RC_BYTES, &smr, &srk) == HCOLL_SUCCESS, "reg: %s", eb.msg);
    HCT_REQUIRE(k->ops->mr_reg(tr, dst, RC_BYTES, &dmr, &drk) == HCOLL_SUCCESS, "reg: %s", eb.msg);
    if (exchange_rkeys(a->shm, rank, &drk, rks))
        return 1;
    /* To next: my pattern into its buffer. To prev: a bare notification. */
    HCT_REQUIRE(k->ops->put(eps[0], smr, 0, &rks[next], 0, RC_BYTES, 1000u + (unsigned)rank, 1) ==
                    HCOLL_SUCCESS,
                "put to next: %s", eb.msg);
    HCT_REQUIRE(k->ops->put(eps[1], NULL, 0, NULL, 0, 0, 2000u + (unsigned)rank, 2) ==
                    HCOLL_SUCCESS,
                "notify prev: %s", eb.msg);
    hc_comp_t c[2], pc[2];
    hcoll_status_t st;
    int got = wait_kinds(k, tr, c, 2, pc, 2, 10000, &st);
    HCT_REQUIRE(st == HCOLL_SUCCESS && got == 4, "completions %d/4: %s", got, eb.msg);
    int from_prev = 0, from_next = 0;
    for (int i = 0; i < 2; i++) {
        if (c[i].imm == 1000u + (unsigned)prev && c[i].peer == prev)
            from_prev++;
        else if (c[i].imm == 2000u + (unsigned)next && c[i].peer == next)
            from_next++;
        else
            HCT_REQUIRE(0, "unexpected immediate %u from peer %d", c[i].imm, c[i].peer);
    }
    HCT_REQUIRE(from_prev == 1 && from_next == 1, "one put from each neighbour");
    for (size_t i = 0; i < RC_BYTES; i++)
        HCT_REQUIRE(dst[i] == ring_pat(prev, i), "byte %zu from prev", i);
    HCT_REQUIRE(pc[0].wr_id + pc[1].wr_id == 3 && pc[0].wr_id != pc[1].wr_id, "wr_ids %llu %llu",
                (unsigned long long)pc[0].wr_id, (unsigned long long)pc[1].wr_id);
    HCT_REQUIRE(barrier(a->shm) == 0, "barrier");
    k->ops->mr_dereg(tr, smr);
    k->ops->mr_dereg(tr, dmr);
    k->ops->destroy(tr, 1);
    free(src);
    free(dst);
    return released(k, fds, "ring rank");
}

START_TEST(ring_connect)
{
    hct_result_t res[MAXR];
    ck_assert_int_eq(run_case(_i, 4, rank_ring_connect, 0, res, NULL), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* puts_land                                                                  */
/* ------------------------------------------------------------------------ */

#define NBURST 300
#define GUARD  64

/* Put i of the burst: its length (zero to a few MiB) and offset (the same
 * at source and target, ranges disjoint). */
static size_t burst_len(int i)
{
    if (i % 50 == 7)
        return (1u << 20) + 3 + (size_t)i;
    if (i % 10 == 3)
        return 0;
    return (size_t)(i * 977) % 70000 + 1;
}

static size_t burst_off(int i)
{
    size_t off = 0;
    for (int j = 0; j < i; j++)
        off += burst_len(j) + 5;
    return off;
}

static unsigned char burst_pat(size_t i)
{
    return (unsigned char)(i * 131 + (i >> 9) + 7);
}

/* Rank 0 sends; as each local completion comes it scribbles over that
 * source range. Rank 1 checks each range the moment its immediate comes. */
static int burst_send(const tp_kind_t *k, hc_transport_t *tr, hc_ep_t *ep, hc_mr_t *mr,
                      unsigned char *buf, const hc_rkey_t *rk, size_t total)
{
    for (size_t i = 0; i < total; i++)
        buf[i] = burst_pat(i);
    for (int i = 0; i < NBURST; i++)
        HCT_REQUIRE(k->ops->put(ep, mr, burst_off(i), rk, burst_off(i), burst_len(i),
                                (uint32_t)i, 5000u + (uint64_t)i) == HCOLL_SUCCESS,
                    "put %d: %s", i, eb.msg);
    static uint8_t seen[NBURST];
    hc_comp_t c[NBURST];
    hcoll_status_t st;
    int got = wait_kinds(k, tr, NULL, 0, c, NBURST, 30000, &st);
    HCT_REQUIRE(st == HCOLL_SUCCESS && got == NBURST, "local completions %d/%d: %s", got, NBURST,
                eb.msg);
    for (int i = 0; i < got; i++) {
        uint64_t w = c[i].wr_id - 5000u;
        HCT_REQUIRE(w < NBURST && !seen[w], "wr_id %llu unknown or twice",
                    (unsigned long long)c[i].wr_id);
        seen[w] = 1;
        memset(buf + burst_off((int)w), 0xEE, burst_len((int)w));
    }
    return 0;
}

static int burst_check(const tp_kind_t *k, hc_transport_t *tr, unsigned char *region,
                       size_t total)
{
    static uint8_t seen[NBURST];
    int got = 0;
    double deadline = hct_now_ms() + 30000;
    while (got < NBURST && hct_now_ms() < deadline) {
        hc_comp_t c[32];
        int n = 0;
        hcoll_status_t st = k->ops->poll(tr, c, 32, 20, &n);
        HCT_REQUIRE(st == HCOLL_SUCCESS, "poll after %d immediates: %s", got, eb.msg);
        for (int j = 0; j < n; j++) {
            if (c[j].kind != HC_COMP_IMM)
                continue;
            uint32_t i = c[j].imm;
            HCT_REQUIRE(i < NBURST && !seen[i], "immediate %u unknown or twice", i);
            HCT_REQUIRE(c[j].peer == 0, "immediate %u names peer %d", i, c[j].peer);
            seen[i] = 1;
            got++;
            size_t off = burst_off((int)i), len = burst_len((int)i);
            for (size_t b = off; b < off + len; b++)
                HCT_REQUIRE(region[b] == burst_pat(b),
                            "put %u (%zu bytes at %zu): byte %zu is 0x%02x when its immediate "
                            "came, not 0x%02x",
                            i, len, off, b, region[b], burst_pat(b));
        }
    }
    HCT_REQUIRE(got == NBURST, "immediates %d/%d", got, NBURST);
    /* Between the ranges and around the region: untouched. */
    for (int i = 0; i < NBURST; i++)
        for (size_t b = burst_off(i) + burst_len(i); b < burst_off(i) + burst_len(i) + 5; b++)
            HCT_REQUIRE(region[b] == 0xA5, "gap byte %zu written", b);
    for (int g = 1; g <= GUARD; g++)
        HCT_REQUIRE(region[-g] == 0xA5 && region[total + (size_t)g - 1] == 0xA5, "guard %d", g);
    return 0;
}

static int rank_puts_land(int rank, int n, void *argp)
{
    case_arg_t *a = argp;
    const tp_kind_t *k = a->k;
    const int fds = count_fds(), peer = 1 - rank;
    const size_t total = burst_off(NBURST);
    hc_ep_t *ep;
    hc_transport_t *tr;
    if (tp_open(k, a->shm, rank, n, 10000, &peer, 1, &tr, &ep))
        return 1;
    unsigned char *buf = malloc(total + 2 * GUARD);
    HCT_REQUIRE(buf, "malloc %zu", total);
    memset(buf, 0xA5, total + 2 * GUARD);
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(k->ops->mr_reg(tr, buf + GUARD, total, &mr, &rk) == HCOLL_SUCCESS, "reg: %s",
                eb.msg);
    if (exchange_rkeys(a->shm, rank, &rk, rks))
        return 1;
    /* The receiver starts late, so that the burst cannot all be taken at
     * once: a local completion reported for bytes still queued shows. */
    if (rank == 1)
        usleep(200000);
    if (rank == 0 ? burst_send(k, tr, ep, mr, buf + GUARD, &rks[1], total)
                  : burst_check(k, tr, buf + GUARD, total))
        return 1;
    HCT_REQUIRE(barrier(a->shm) == 0, "barrier");
    k->ops->mr_dereg(tr, mr);
    k->ops->destroy(tr, 1);
    free(buf);
    return released(k, fds, rank ? "receiver" : "sender");
}

START_TEST(puts_land)
{
    hct_result_t res[2];
    ck_assert_int_eq(run_case(_i, 2, rank_puts_land, 0, res, NULL), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* peer_killed, peer_reset, graceful_close                                    */
/* ------------------------------------------------------------------------ */

#define KILL_TIMEOUT_MS 20000
#define KILL_NOTICE_MS  5000 /* the survivor must fail well within the deadline */

/* Rank 1 dies (how: mode); rank 0 keeps writing to it and polling until
 * the transport says so. */
enum { END_KILL, END_RESET, END_GRACEFUL };

static int rank_end(int rank, int n, void *argp, int mode)
{
    case_arg_t *a = argp;
    const tp_kind_t *k = a->k;
    const int fds = count_fds(), peer = 1 - rank;
    hc_ep_t *ep;
    hc_transport_t *tr;
    if (tp_open(k, a->shm, rank, n, KILL_TIMEOUT_MS, &peer, 1, &tr, &ep))
        return 1;
    static unsigned char buf[1 << 16];
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(k->ops->mr_reg(tr, buf, sizeof buf, &mr, &rk) == HCOLL_SUCCESS, "reg: %s",
                eb.msg);
    if (exchange_rkeys(a->shm, rank, &rk, rks))
        return 1;
    if (rank == 1) {
        a->shm->kill_ms = hct_now_ms();
        if (mode == END_KILL)
            raise(SIGKILL);
        k->ops->mr_dereg(tr, mr);
        k->ops->destroy(tr, mode == END_GRACEFUL);
        return released(k, fds, "closer");
    }
    while (!a->shm->kill_ms)
        usleep(100);
    /* Killed: keep writing, as a ring would. Reset: idle, only polling.
     * Graceful: idle for a while, and nothing may be reported. */
    hcoll_status_t st = HCOLL_SUCCESS;
    const double watch_ms = mode == END_GRACEFUL ? 1000 : KILL_TIMEOUT_MS;
    for (int i = 0; st == HCOLL_SUCCESS && hct_now_ms() - a->shm->kill_ms < watch_ms; i++) {
        if (mode == END_KILL)
            st = k->ops->put(ep, mr, 0, &rks[1], 0, sizeof buf, (uint32_t)i, (uint64_t)i);
        if (st == HCOLL_SUCCESS) {
            hc_comp_t c[16];
            int got = 0;
            st = k->ops->poll(tr, c, 16, 10, &got);
            HCT_REQUIRE(mode == END_KILL || st != HCOLL_SUCCESS || got == 0,
                        "%d completion(s) from a peer that is gone", got);
        }
    }
    double dt = hct_now_ms() - a->shm->kill_ms;
    fprintf(stderr, "%s: survivor: %s after %.0f ms: %s\n", k->name, hcoll_status_name(st), dt,
            st ? eb.msg : "");
    if (mode == END_GRACEFUL) {
        HCT_REQUIRE(st == HCOLL_SUCCESS, "an orderly close taken as a failure: %s", eb.msg);
    } else {
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "got %s: %s", hcoll_status_name(st), eb.msg);
        HCT_REQUIRE(dt < KILL_NOTICE_MS, "noticed after %.0f ms (deadline %d ms)", dt,
                    KILL_TIMEOUT_MS);
        HCT_REQUIRE(strstr(eb.msg, "rank 1"), "the message names the peer: %s", eb.msg);
        /* Sticky: the next calls report it too. */
        hc_comp_t c[4];
        int got = -1;
        HCT_REQUIRE(k->ops->poll(tr, c, 4, 0, &got) == st && got == 0, "poll after the failure");
        HCT_REQUIRE(k->ops->put(ep, mr, 0, &rks[1], 0, 8, 1, 1) == st, "put after the failure");
    }
    k->ops->mr_dereg(tr, mr);
    k->ops->destroy(tr, mode == END_GRACEFUL);
    return released(k, fds, "survivor");
}

static int rank_killed(int rank, int n, void *argp)
{
    return rank_end(rank, n, argp, END_KILL);
}

static int rank_reset(int rank, int n, void *argp)
{
    return rank_end(rank, n, argp, END_RESET);
}

static int rank_graceful(int rank, int n, void *argp)
{
    return rank_end(rank, n, argp, END_GRACEFUL);
}

START_TEST(peer_killed)
{
    /* The emulated NIC gives up on a dead peer after 1 s of retries. */
    setenv("HCMOCK_IB_RETRY_MS", "1000", 1);
    hct_result_t res[2];
    run_case(_i, 2, rank_killed, 0, res, NULL);
    ck_assert_msg(res[1].signaled && res[1].sig == SIGKILL, "rank 1 did not die of SIGKILL");
    ck_assert_msg(res[0].exited && res[0].code == 0, "the survivor failed (its stderr says how)");
}
END_TEST

START_TEST(peer_reset)
{
    hct_result_t res[2];
    ck_assert_int_eq(run_case(_i, 2, rank_reset, 0, res, NULL), 0);
}
END_TEST

START_TEST(graceful_close)
{
    hct_result_t res[2];
    ck_assert_int_eq(run_case(_i, 2, rank_graceful, 0, res, NULL), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* garbage_address                                                            */
/* ------------------------------------------------------------------------ */

/* Rank 1 publishes garbage. Rank 0 must refuse it with a message; neither
 * may block past the connect deadline. */
static int rank_garbage(int rank, int n, void *argp)
{
    case_arg_t *a = argp;
    const tp_kind_t *k = a->k;
    const int fds = count_fds(), peer = 1 - rank;
    ag_ctx_t ag = { a->shm, rank };
    hc_transport_params_t p;
    HCT_REQUIRE(tp_params(k, rank, n, GARBAGE_TIMEOUT_MS, &p) == HCOLL_SUCCESS, "params");
    hc_transport_t *tr;
    HCT_REQUIRE(k->ops->create(&p, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    hc_ep_t *ep = NULL;
    double t0 = hct_now_ms();
    hcoll_status_t st = k->ops->connect(tr, &peer, 1, shm_allgather, &ag, &ep);
    double dt = hct_now_ms() - t0;
    fprintf(stderr, "%s rank %d: connect: %s after %.0f ms: %s\n", k->name, rank,
            hcoll_status_name(st), dt, st ? eb.msg : "");
    HCT_REQUIRE(dt < GARBAGE_TIMEOUT_MS + 2000, "connect blocked %.0f ms (deadline %d ms)", dt,
                GARBAGE_TIMEOUT_MS);
    if (rank == 0) {
        HCT_REQUIRE(st != HCOLL_SUCCESS, "a garbage address was accepted");
        HCT_REQUIRE(strstr(eb.msg, "rank 1") || strstr(eb.msg, "peer 1"),
                    "the message names rank 1: %s", eb.msg);
    }
    k->ops->destroy(tr, 0);
    return released(k, fds, rank ? "liar" : "refuser");
}

START_TEST(garbage_address)
{
    hct_result_t res[2];
    ck_assert_int_eq(run_case(_i, 2, rank_garbage, 2, res, NULL), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */

static Suite *transport_suite(void)
{
    Suite *s = suite_create("transport");
    for (int k = 0; k < NKINDS; k++) {
        if (!kinds[k].available) {
            printf("SKIP: transport %s: %s\n", kinds[k].name, kinds[k].why);
            continue;
        }
        TCase *tc = tcase_create(kinds[k].name);
        tcase_set_timeout(tc, TEST_TIMEOUT_S);
        tcase_add_loop_test(tc, ring_connect, k, k + 1);
        tcase_add_loop_test(tc, puts_land, k, k + 1);
        tcase_add_loop_test(tc, peer_killed, k, k + 1);
        tcase_add_loop_test(tc, peer_reset, k, k + 1);
        tcase_add_loop_test(tc, graceful_close, k, k + 1);
        tcase_add_loop_test(tc, garbage_address, k, k + 1);
        suite_add_tcase(s, tc);
    }
    return s;
}

#if HCOLL_BUILD_VERBS
/* The emulated verbs are usable when this process was started with the
 * mock on LD_LIBRARY_PATH (see main) and it loads. */
static void verbs_probe(tp_kind_t *k)
{
    const char *why = getenv("HCT_TRANSPORT_WHY");
    if (why && *why) {
        snprintf(k->why, sizeof k->why, "%s", why);
        return;
    }
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(k->why, sizeof k->why, "dlopen libibverbs.so.1: %s", dlerror());
        return;
    }
    if (!dlsym(h, "hcmock_verbs")) {
        snprintf(k->why, sizeof k->why, "the libibverbs.so.1 found is not the mock");
        dlclose(h);
        return;
    }
    k->available = 1;
}

/* dlopen("libibverbs.so.1") must find the mock: the loader reads
 * LD_LIBRARY_PATH at exec, so set it (and the fixture sysfs tree) and
 * start over; where the mock is missing, start over anyway with the reason
 * in HCT_TRANSPORT_WHY so that the TCP cases still run. */
static void reexec(char **argv)
{
    const char *build = getenv("HCOLL_TEST_BUILD");
    char mock[PATH_MAX], dir[PATH_MAX], lib[PATH_MAX + 32], root[PATH_MAX];
    snprintf(mock, sizeof mock, "%s/mock", build && *build ? build : "build");
    snprintf(lib, sizeof lib, "%s/libibverbs.so.1", mock);
    setenv("HCT_TRANSPORT_CHILD", "1", 1);
    if (access(lib, R_OK) != 0 || !realpath(mock, dir)) {
        setenv("HCT_TRANSPORT_WHY", "build/mock/libibverbs.so.1 not built (make tests)", 1);
    } else if (!getenv("HCOLL_SYSFS_ROOT") && !realpath("tests/fixtures/sysfs-roce", root)) {
        setenv("HCT_TRANSPORT_WHY", "tests/fixtures/sysfs-roce not found (run from the source "
                                    "tree)", 1);
    } else {
        const char *old = getenv("LD_LIBRARY_PATH");
        size_t ldlen = strlen(dir) + (old ? strlen(old) : 0) + 2;
        char *ld = malloc(ldlen);
        if (!ld)
            return;
        snprintf(ld, ldlen, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
        setenv("LD_LIBRARY_PATH", ld, 1);
        free(ld);
        if (!getenv("HCOLL_SYSFS_ROOT"))
            setenv("HCOLL_SYSFS_ROOT", root, 1);
    }
    execv("/proc/self/exe", argv);
    perror("execv /proc/self/exe");
}
#endif

int main(int argc, char **argv)
{
    (void)argc;
#if HCOLL_BUILD_VERBS
    if (!getenv("HCT_TRANSPORT_CHILD")) {
        reexec(argv);
        return 1;
    }
    verbs_probe(&kinds[NKINDS - 1]);
#else
    (void)argv;
#endif
    SRunner *sr = srunner_create(transport_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
