/*
 * The set-up collectives over the bootstrap's star: every non-root rank
 * sends UP(len) to the root, which gathers them in rank order (all
 * connections at once, so that whichever rank fails first is noticed at
 * once) and sends DOWN(total) back to each.
 *
 *   allgather  rank k ── UP(len) ──► root ── DOWN(nranks*len) ──► every rank
 *   bcast      root r ── UP(len) ──► root ── DOWN(len) ─────────► every rank but r
 *   barrier    allgather of 0 bytes
 *
 * Each call carries (op << 24 | sequence) in the header's arg, so ranks
 * that call them in a different order fail with HCOLL_ERR_MISMATCH. A
 * failure half-way breaks the boot (hc_bio_break): later calls fail at
 * once with the same status.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "base/log.h"
#include "boot/io.h"

/* The root's view of one gather: how much of each rank's UP it has. */
typedef struct gather {
    hc_boot_t *b;
    uint32_t arg;
    unsigned char *all;
    size_t len;
    const char *what;
    size_t *got;                               /* header and body bytes, per rank */
    unsigned char (*hb)[HC_BWIRE_HDR_BYTES];   /* headers, per rank */
} gather_t;

/* Rank r's complete header: an UP of this very call and length. */
static hcoll_status_t gather_check_hdr(gather_t *g, int r)
{
    hc_bwire_hdr_t h;
    char why[96];
    hc_bwire_unpack(g->hb[r], &h);
    if (!hc_bwire_sane(&h, why, sizeof why) || h.type != HC_BMSG_UP)
        return hc_err_set(g->b->eb, HC_BOOT, 0, HCOLL_ERR_NETWORK,
                          "%s: rank %d sent an unexpected message (type %u)", g->what, r, h.type);
    if (h.arg != g->arg)
        return hc_err_set(g->b->eb, HC_BOOT, 0, HCOLL_ERR_MISMATCH,
                          "%s: rank %d is in %s #%u (set-up collectives called in "
                          "a different order)",
                          g->what, r, hc_bwire_op_name(h.arg >> 24), h.arg & 0xffffff);
    if (h.len != g->len)
        return hc_err_set(g->b->eb, HC_BOOT, 0, HCOLL_ERR_MISMATCH,
                          "%s: rank %d contributes %u bytes, this rank %zu (len "
                          "differs between ranks)", g->what, r, h.len, g->len);
    return HCOLL_SUCCESS;
}

/* Read what rank r's connection holds without blocking: the header into
 * hb[r], the body straight into its slot of all. */
static hcoll_status_t gather_feed(gather_t *g, int r)
{
    hc_boot_t *b = g->b;
    const size_t hdr = HC_BWIRE_HDR_BYTES;
    for (;;) {
        size_t got = g->got[r];
        size_t want = got < hdr ? hdr - got : hdr + g->len - got;
        if (want == 0)
            return HCOLL_SUCCESS;
        /* Only now: a barrier's all is NULL (len 0), and NULL + 0 is UB. */
        unsigned char *dst = got < hdr ? g->hb[r] + got : g->all + (size_t)r * g->len + (got - hdr);
        ssize_t m = recv(b->conn[r], dst, want, 0);
        if (m < 0 && errno == EINTR)
            continue;
        if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return HCOLL_SUCCESS;
        if (m <= 0) {
            b->saved_errno = m < 0 ? errno : 0;
            return hc_bio_err(b, HCOLL_ERR_PEER_FAILED, r, g->what, 0);
        }
        g->got[r] += (size_t)m;
        if (g->got[r] == hdr) {
            hc_bwire_hdr_t h;
            hc_bwire_unpack(g->hb[r], &h);
            if (h.magic == HC_BWIRE_MAGIC && h.type == HC_BMSG_BEAT && h.len == 0) {
                g->got[r] = 0; /* the rendezvous's last heartbeat, still in flight */
                continue;
            }
            hcoll_status_t st = gather_check_hdr(g, r);
            if (st != HCOLL_SUCCESS)
                return st;
        }
    }
}

/* The deadline passed: name the ranks whose UP is not complete. */
static hcoll_status_t gather_missing(gather_t *g, double waited_ms)
{
    const int n = g->b->nranks;
    char *present = calloc((size_t)n, 1);
    char list[160] = "?";
    if (present) {
        for (int r = 0; r < n; r++)
            present[r] = r == 0 || g->got[r] == HC_BWIRE_HDR_BYTES + g->len;
        hc_bio_format_ranks(present, n, list, sizeof list);
        free(present);
    }
    return hc_err_set(g->b->eb, HC_BOOT, 0, HCOLL_ERR_TIMEOUT,
                      "%s: rank(s) %s did not take part within %.0f ms (HCOLL_TIMEOUT_MS)",
                      g->what, list, waited_ms);
}

/* Root: receive UP(len) from every rank in parallel (so that whichever
 * rank fails first is noticed at once), each into all + r*len. */
static hcoll_status_t root_gather(hc_boot_t *b, uint32_t arg, unsigned char *all, size_t len,
                                  double deadline, const char *what)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int n = b->nranks;
    gather_t g = { b, arg, all, len, what, calloc((size_t)n, sizeof *g.got),
                   calloc((size_t)n, HC_BWIRE_HDR_BYTES) };
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *who = calloc((size_t)n + 1, sizeof *who);
    if (!g.got || !g.hb || !pf || !who) {
        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NO_MEMORY, "%s: out of memory", what);
        goto clean_bufs;
    }
    int left = n - 1;
    const double t0 = hc_now_ms();
    while (left > 0) {
        int np = 0;
        pf[np++] = (struct pollfd){ b->abort_fd, POLLIN, 0 };
        for (int r = 1; r < n; r++) {
            if (g.got[r] < HC_BWIRE_HDR_BYTES + len) {
                who[np] = r;
                pf[np++] = (struct pollfd){ b->conn[r], POLLIN, 0 };
            }
        }
        double wait = deadline - hc_now_ms();
        if (wait <= 0) {
            st = gather_missing(&g, deadline - t0);
            goto clean_bufs;
        }
        int k = poll(pf, (nfds_t)np, (int)(wait + 0.999));
        if (k < 0 && errno != EINTR) {
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_SYSTEM, "%s: poll: %s", what,
                            strerror(errno));
            goto clean_bufs;
        }
        if (k <= 0)
            continue;
        if (pf[0].revents) {
            st = hc_bio_aborted(b, what);
            goto clean_bufs;
        }
        for (int i = 1; i < np; i++) {
            if (!pf[i].revents)
                continue;
            HC_CHECK(gather_feed(&g, who[i]), clean_bufs);
            if (g.got[who[i]] == HC_BWIRE_HDR_BYTES + len)
                left--;
        }
    }
clean_bufs:
    free(who);
    free(pf);
    free(g.hb);
    free(g.got);
    return st;
}

static hcoll_status_t coll_enter(hc_boot_t *b, const char *what)
{
    pthread_mutex_lock(&b->call_lock);
    if (hc_bio_is_aborted(b))
        return hc_bio_aborted(b, what);
    hcoll_status_t broken = hc_boot_status(b);
    if (broken != HCOLL_SUCCESS)
        return hc_err_set(b->eb, HC_BOOT, b->rank, broken,
                          "%s: the bootstrap failed earlier (%s) and cannot be used any more",
                          what, hcoll_status_name(broken));
    return HCOLL_SUCCESS;
}

static hcoll_status_t coll_run(hc_boot_t *b, unsigned op, const void *mine, void *out,
                               size_t len, int root)
{
    char what[48];
    hcoll_status_t st;
    const uint32_t seq = b->seq++ & 0xffffff;
    const uint32_t arg = (uint32_t)op << 24 | seq;
    snprintf(what, sizeof what, "bootstrap %s #%u", hc_bwire_op_name(op), seq);
    HC_CHECK(coll_enter(b, what), clean_lock);
    const double deadline = hc_now_ms() + (double)b->timeout_ms;
    const size_t total = op == HC_BOOT_OP_BCAST ? len : (size_t)b->nranks * len;

    if (b->rank == 0) {
        if (op == HC_BOOT_OP_BCAST) {
            if (root != 0)
                HC_CHECK(hc_bio_recv_msg(b, b->conn[root], root, HC_BMSG_UP, arg, out, len,
                                         deadline, what),
                         clean_conns);
        } else {
            if (len)
                memcpy(out, mine, len);
            HC_CHECK(root_gather(b, arg, out, len, deadline, what), clean_conns);
        }
        for (int r = 1; r < b->nranks; r++) {
            if (op == HC_BOOT_OP_BCAST && r == root)
                continue;
            st = hc_bio_send_msg(b, b->conn[r], HC_BMSG_DOWN, arg, out, total, deadline);
            if (st != HCOLL_SUCCESS) {
                st = hc_bio_err(b, st, r, what, b->timeout_ms);
                goto clean_conns;
            }
        }
    } else {
        if (op != HC_BOOT_OP_BCAST || root == b->rank) {
            const void *up = op == HC_BOOT_OP_BCAST ? out : mine;
            st = hc_bio_send_msg(b, b->conn[0], HC_BMSG_UP, arg, up, len, deadline);
            if (st == HCOLL_ERR_PEER_FAILED) {
                /* The root may have broken the star over another rank
                 * (a mismatch, a missing rank) and sent its verdict before
                 * closing: report that, not our broken pipe. */
                st = hc_bio_recv_msg(b, b->conn[0], 0, HC_BMSG_DOWN, arg, out, total,
                                     hc_now_ms() + HC_BOOT_VERDICT_GRACE_MS, what);
                if (st == HCOLL_SUCCESS)
                    st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_PEER_FAILED,
                                    "%s: connection to rank 0 failed", what);
                goto clean_conns;
            }
            if (st != HCOLL_SUCCESS) {
                st = hc_bio_err(b, st, 0, what, b->timeout_ms);
                goto clean_conns;
            }
        }
        /* As at init, the root names whoever is missing: give its verdict
         * a moment past our own deadline. */
        if (op != HC_BOOT_OP_BCAST || root != b->rank)
            HC_CHECK(hc_bio_recv_msg(b, b->conn[0], 0, HC_BMSG_DOWN, arg, out, total,
                                     deadline + HC_BOOT_VERDICT_GRACE_MS, what),
                     clean_conns);
    }
    pthread_mutex_unlock(&b->call_lock);
    return HCOLL_SUCCESS;

clean_conns:
    hc_bio_break(b, st);
clean_lock:
    pthread_mutex_unlock(&b->call_lock);
    return st;
}

hcoll_status_t hc_boot_allgather(void *boot, const void *mine, void *all_out, size_t len)
{
    hc_boot_t *b = boot;
    if (!b || (len && (!mine || !all_out)) || len > HC_BOOT_COLL_MAX / (size_t)b->nranks)
        return hc_err_set(b ? b->eb : NULL, HC_BOOT, b ? b->rank : -1, HCOLL_ERR_INVALID_ARG,
                          "bootstrap allgather: bad arguments (len %zu)", len);
    return coll_run(b, HC_BOOT_OP_ALLGATHER, mine, all_out, len, 0);
}

hcoll_status_t hc_boot_bcast(void *boot, void *buf, size_t len, int root)
{
    hc_boot_t *b = boot;
    if (!b || (len && !buf) || len > HC_BOOT_COLL_MAX || root < 0 || root >= b->nranks)
        return hc_err_set(b ? b->eb : NULL, HC_BOOT, b ? b->rank : -1, HCOLL_ERR_INVALID_ARG,
                          "bootstrap bcast: bad arguments (len %zu, root %d)", len, root);
    return coll_run(b, HC_BOOT_OP_BCAST, buf, buf, len, root);
}

hcoll_status_t hc_boot_barrier(void *boot)
{
    hc_boot_t *b = boot;
    if (!b)
        return hc_err_set(NULL, HC_BOOT, -1, HCOLL_ERR_INVALID_ARG, "bootstrap barrier: NULL");
    return coll_run(b, HC_BOOT_OP_BARRIER, NULL, NULL, 0, 0);
}
