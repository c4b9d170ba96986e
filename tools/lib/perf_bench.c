/*
 * One hcoll_perf rank at work (see perf_rank.h): how it stops on an error,
 * the small cross-rank reductions it runs on hcoll itself, and the timed
 * loops of one size.
 *
 *   per size: check (-c) ─► warm-up (-w) ─► -n timed calls, out of place
 *             then in place, then the same for the peer
 *           ─► max of times / sum of #wrong over ranks (a small
 *             hcoll_allreduce, as nccl-tests uses its own collective)
 *           ─► rank 0: a row (+ NIC columns, + -p stage split)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perf_rank.h"

double hp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void hp_die_status(hp_perf_t *p, const char *what, hcoll_status_t st)
{
    fprintf(stderr, "hcoll_perf: rank %d: %s: %s (%s)\n", p->rank, what, hcoll_status_name(st),
            hcoll_comm_last_error(p->comm));
    int code = st == HCOLL_ERR_UNSUPPORTED ? HP_EXIT_UNSUPPORTED : 1;
    if (st == HCOLL_ERR_UNSUPPORTED && p->rank == 0)
        fprintf(stderr, "hcoll_perf: this libhcoll cannot run this %s here "
                        "(%s returns HCOLL_ERR_UNSUPPORTED)\n", hp_coll_name(p->o.coll), what);
    /* Abort, not destroy: peers may be stuck in a call and must see us go. */
    hcoll_comm_abort(p->comm);
    p->comm = NULL;
    if (p->finish)
        p->finish(p, code);
    exit(code);
}

void hp_die(hp_perf_t *p, const char *fmt, const char *detail)
{
    /* One write, so that ranks dying together do not interleave lines. */
    char msg[600];
    int n = snprintf(msg, sizeof msg, "hcoll_perf: rank %d: ", p->rank);
    snprintf(msg + n, sizeof msg - (size_t)n, fmt, detail);
    fprintf(stderr, "%s\n", msg);
    hcoll_comm_abort(p->comm);
    p->comm = NULL;
    if (p->finish)
        p->finish(p, 1);
    exit(1);
}

void hp_barrier(hp_perf_t *p)
{
    p->scratch[0] = 0;
    hcoll_status_t st = hcoll_allreduce(p->comm, p->scratch, p->scratch, 1, HCOLL_INT64,
                                        HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, "hcoll_allreduce (barrier)", st);
}

/* Each rank's times become the row's, as -a says: rank 0's (the others
 * contribute 0 to a sum), the mean, the minimum or the maximum. */
static void reduce_times(hp_perf_t *p, double *v, size_t n)
{
    hp_average_t a = p->o.average;
    hcoll_op_t op = a == HP_AVG_MIN ? HCOLL_MIN : a == HP_AVG_MAX ? HCOLL_MAX : HCOLL_SUM;
    if (a == HP_AVG_RANK0 && p->rank != 0)
        for (size_t k = 0; k < n; k++)
            v[k] = 0;
    hcoll_status_t st = hcoll_allreduce(p->comm, v, v, n, HCOLL_FLOAT64, op, NULL);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, "hcoll_allreduce (times over ranks)", st);
    if (a == HP_AVG_MEAN)
        for (size_t k = 0; k < n; k++)
            v[k] /= p->nranks;
}

void hp_reduce_sum(hp_perf_t *p, int64_t *v, size_t n)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, v, v, n, HCOLL_INT64, HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, "hcoll_allreduce (sum of #wrong)", st);
}

/*
 * The intra RS / inter / intra AG times of the last all-reduce on comm (or
 * of req, when given), in microseconds on this rank; the one place that
 * asks the library. Returns 0 with us_out filled, -1 when unknown.
 */
static int stage_times_last(hcoll_comm_t comm, hcoll_request_t req, double us_out[HP_NSTAGES])
{
    hcoll_stage_times_t t;
    hcoll_status_t st = req ? hcoll_request_stage_times(req, &t)
                            : hcoll_comm_last_stage_times(comm, &t);
    if (st != HCOLL_SUCCESS)
        return -1;
    us_out[HP_STAGE_RS] = t.intra_rs_us;
    us_out[HP_STAGE_INTER] = t.inter_us;
    us_out[HP_STAGE_AG] = t.intra_ag_us;
    return 0;
}


void hp_coll_bufs(const hp_perf_t *p, int ip, size_t count, const void **s_out, void **r_out)
{
    char *block = (char *)p->recv + count * hcoll_dtype_size(p->o.dtype) * (size_t)p->rank;
    *s_out = ip ? p->recv : p->send;
    *r_out = p->recv;
    if (ip && p->o.coll == HP_COLL_REDUCE_SCATTER)
        *r_out = block;
    if (ip && p->o.coll == HP_COLL_ALLGATHER)
        *s_out = block;
}

/* The library's name of p's collective, for messages. */
static const char *hcoll_fn(const hp_perf_t *p, int async)
{
    static const char *names[HP_NCOLLS][2] = {
        { "hcoll_allreduce", "hcoll_allreduce_async" },
        { "hcoll_reduce_scatter", "hcoll_reduce_scatter_async" },
        { "hcoll_allgather", "hcoll_allgather_async" },
        { "hcoll_broadcast", "hcoll_broadcast_async" },
    };
    return names[p->o.coll][async != 0];
}

/* One call of p's collective (root -r for the broadcast): a request in
 * *req when req is given, else blocking (host) or on the stream. */
static hcoll_status_t hcoll_coll(hp_perf_t *p, const void *s, void *r, size_t count,
                                 hcoll_request_t *req)
{
    const hcoll_dtype_t dt = p->o.dtype;
    const hcoll_op_t op = p->o.op;
    void *stream = req ? NULL : p->gpu.stream;
    switch (p->o.coll) {
    case HP_COLL_REDUCE_SCATTER:
        return req ? hcoll_reduce_scatter_async(p->comm, s, r, count, dt, op, stream, req)
                   : hcoll_reduce_scatter(p->comm, s, r, count, dt, op, stream);
    case HP_COLL_ALLGATHER:
        return req ? hcoll_allgather_async(p->comm, s, r, count, dt, stream, req)
                   : hcoll_allgather(p->comm, s, r, count, dt, stream);
    case HP_COLL_BROADCAST:
        return req ? hcoll_broadcast_async(p->comm, s, r, count, dt, p->o.root, stream, req)
                   : hcoll_broadcast(p->comm, s, r, count, dt, p->o.root, stream);
    default:
        return req ? hcoll_allreduce_async(p->comm, s, r, count, dt, op, stream, req)
                   : hcoll_allreduce(p->comm, s, r, count, dt, op, stream);
    }
}

/* Enqueue one call (device memory) or run it (host memory). */
static void hcoll_issue(hp_perf_t *p, const void *s, void *r, size_t count)
{
    hcoll_status_t st = hcoll_coll(p, s, r, count, NULL);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, hcoll_fn(p, 0), st);
}

/* One call, complete on return; where the result is. */
static const void *hcoll_call(hp_perf_t *p, int ip, size_t count)
{
    const void *s;
    void *r;
    hp_coll_bufs(p, ip, count, &s, &r);
    hcoll_issue(p, s, r, count);
    hp_buf_sync(p);
    return r;
}

static void add_stage_times(hp_perf_t *p, double st_us[HP_NSTAGES], int *st_n)
{
    double us[HP_NSTAGES];
    if (st_us && stage_times_last(p->comm, NULL, us) == 0) {
        for (int k = 0; k < HP_NSTAGES; k++)
            st_us[k] += us[k];
        ++*st_n;
    }
}

/* Seconds per call, this rank; stage times summed into st_us when asked. */
static double hcoll_time(hp_perf_t *p, int ip, size_t count, int iters, double st_us[HP_NSTAGES],
                         int *st_n)
{
    const void *s;
    void *r;
    hp_coll_bufs(p, ip, count, &s, &r);
    hp_barrier(p);
    double t0 = hp_now_s();
    if (p->gpu.cu) {
        /* Device memory: calls go on the stream as nccl-tests issues them;
         * -z 1 waits for each. Stage times: of a call near the end of the
         * batch (the library writes them as each call's host stage ends). */
        for (int i = 0; i < iters; i++) {
            hcoll_issue(p, s, r, count);
            if (p->o.blocking)
                hp_buf_sync(p);
        }
        hp_buf_sync(p);
        double t = (hp_now_s() - t0) / iters;
        add_stage_times(p, st_us, st_n);
        return t;
    }
    if (p->o.blocking || !p->async_ok) {
        for (int i = 0; i < iters; i++) {
            hcoll_call(p, ip, count);
            add_stage_times(p, st_us, st_n);
        }
        return (hp_now_s() - t0) / iters;
    }
    /* nccl-tests' default: issue every call, then wait for all of them. */
    hcoll_request_t *reqs = calloc((size_t)iters, sizeof *reqs);
    if (!reqs)
        hp_die(p, "%s", "out of memory for requests");
    for (int i = 0; i < iters; i++) {
        hcoll_status_t st = hcoll_coll(p, s, r, count, &reqs[i]);
        if (st == HCOLL_ERR_UNSUPPORTED && i == 0) {
            /* Same answer on every rank: nothing was started anywhere. */
            free(reqs);
            p->async_ok = 0;
            if (p->rank == 0)
                printf("# -z 0: %s is not supported by this library; "
                       "timing blocking calls instead\n", hcoll_fn(p, 1));
            return hcoll_time(p, ip, count, iters, st_us, st_n);
        }
        if (st != HCOLL_SUCCESS)
            hp_die_status(p, hcoll_fn(p, 1), st);
    }
    for (int i = 0; i < iters; i++) {
        hcoll_status_t st = hcoll_wait(reqs[i]);
        if (st != HCOLL_SUCCESS)
            hp_die_status(p, "hcoll_wait", st);
    }
    double t = (hp_now_s() - t0) / iters;
    for (int i = 0; i < iters; i++) {
        double us[HP_NSTAGES];
        if (st_us && stage_times_last(p->comm, reqs[i], us) == 0) {
            for (int k = 0; k < HP_NSTAGES; k++)
                st_us[k] += us[k];
            ++*st_n;
        }
        hcoll_request_free(reqs[i]);
    }
    free(reqs);
    return t;
}

/* Seconds per call of the peer, this rank. */
static double peer_time(hp_perf_t *p, int ip, size_t count, int iters)
{
    char err[300];
    p->peer->barrier(p);
    double t0 = hp_now_s();
    for (int i = 0; i < iters; i++) {
        if (p->peer->call(p, ip, count, NULL, err, sizeof err) != 0)
            hp_die(p, "%s", err);
        if (p->o.blocking && p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
            hp_die(p, "%s", err);
    }
    if (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
        hp_die(p, "%s", err);
    return (hp_now_s() - t0) / iters;
}

static const void *peer_call(hp_perf_t *p, int ip, size_t count)
{
    char err[300];
    void *res = NULL;
    if (p->peer->call(p, ip, count, &res, err, sizeof err) != 0 ||
        (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0))
        hp_die(p, "%s", err);
    return res;
}

/* One call, complete on return; where its result is. */
typedef const void *(*call_fn)(hp_perf_t *p, int ip, size_t count);

/*
 * The inputs of one checked call, through p->stage (so that device memory
 * works too); every byte the result may land in starts as 0xa5, so a result
 * never written shows as wrong. Reductions: hp_check_fill's values over
 * the whole vector; all-gather: this rank's block of the copy values;
 * broadcast: the copy values on the root, junk in the others' sendbuf.
 */
static void check_inputs(hp_perf_t *p, int ip, size_t count)
{
    const hcoll_dtype_t dt = p->o.dtype;
    const size_t es = hcoll_dtype_size(dt), n = (size_t)p->nranks;
    const hp_coll_t c = p->o.coll;
    size_t whole = count * (c == HP_COLL_ALLREDUCE || c == HP_COLL_BROADCAST ? 1 : n);
    const void *s;
    void *r;
    hp_coll_bufs(p, ip, count, &s, &r);
    memset(p->stage, 0xa5, whole * es);
    hp_buf_put(p, p->recv, p->stage, whole * es);
    if (c == HP_COLL_ALLGATHER || (c == HP_COLL_BROADCAST && p->rank == p->o.root))
        hp_check_fill_copy(p->stage, count, c == HP_COLL_ALLGATHER ? count * (size_t)p->rank : 0,
                           dt);
    else if (c == HP_COLL_BROADCAST)
        memset(p->stage, 0x5a, count * es); /* a non-root's sendbuf must not matter */
    else
        hp_check_fill(p->stage, whole, dt, p->o.op, p->rank, p->nranks);
    if (c == HP_COLL_BROADCAST && p->rank != p->o.root && ip)
        return; /* in place: the non-root's buffer is the result's */
    hp_buf_put(p, (void *)s, p->stage, (c == HP_COLL_ALLGATHER ? count : whole) * es);
}

/* Wrong elements of one checked call's result at res. */
static int64_t check_result(hp_perf_t *p, const void *res, size_t count)
{
    const hcoll_dtype_t dt = p->o.dtype;
    const size_t es = hcoll_dtype_size(dt), n = (size_t)p->nranks;
    switch (p->o.coll) {
    case HP_COLL_REDUCE_SCATTER:
        hp_buf_get(p, p->stage, res, count * es);
        return (int64_t)hp_check_count_wrong_at(p->stage, count, count * (size_t)p->rank, dt,
                                                p->o.op, p->nranks);
    case HP_COLL_ALLGATHER:
        hp_buf_get(p, p->stage, res, count * n * es);
        return (int64_t)hp_check_count_wrong_copy(p->stage, count * n, dt);
    case HP_COLL_BROADCAST:
        hp_buf_get(p, p->stage, res, count * es);
        return (int64_t)hp_check_count_wrong_copy(p->stage, count, dt);
    default:
        hp_buf_get(p, p->stage, res, count * es);
        return (int64_t)hp_check_count_wrong(p->stage, count, dt, p->o.op, p->nranks);
    }
}

/* -c checked calls, out of place and in place; #wrong on this rank. */
static void run_check(hp_perf_t *p, call_fn call, size_t count, int64_t wrong[2])
{
    wrong[0] = wrong[1] = 0;
    for (int c = 0; c < p->o.check; c++) {
        for (int ip = 0; ip < 2; ip++) {
            check_inputs(p, ip, count);
            wrong[ip] += check_result(p, call(p, ip, count), count);
        }
    }
}

static hp_row_t *row_new(hp_perf_t *p, const char *impl, uint64_t bytes, size_t count)
{
    if (p->nrows == p->caprows) {
        p->caprows = p->caprows ? 2 * p->caprows : 64;
        hp_row_t *n = realloc(p->rows, (size_t)p->caprows * sizeof *n);
        if (!n)
            hp_die(p, "%s", "out of memory for rows");
        p->rows = n;
    }
    hp_row_t *r = &p->rows[p->nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->impl, sizeof r->impl, "%s", impl);
    snprintf(r->algo, sizeof r->algo, "-");
    r->coll = p->o.coll;
    r->bytes = bytes;
    r->count = count;
    r->dtype = p->o.dtype;
    r->op = p->o.op;
    r->ratio = -1;
    return r;
}

int hp_checkable(const hp_perf_t *p)
{
    return !hp_coll_reduces(p->o.coll) || hp_check_exact(p->o.dtype, p->o.op, p->nranks);
}

void hp_run_size(hp_perf_t *p, uint64_t want_bytes)
{
    uint64_t bytes;
    size_t count = hp_coll_count(p->o.coll, want_bytes, hcoll_dtype_size(p->o.dtype), p->nranks,
                                 &bytes);
    if (count == 0) {
        if (p->rank == 0)
            printf("# %llu B: less than one element per rank, skipped\n",
                   (unsigned long long)want_bytes);
        return;
    }
    int checked = p->o.check > 0 && hp_checkable(p);
    /* [0..1] hcoll oop/ip, [2..4] stages, [5..6] peer oop/ip; over ranks as -a says */
    double t[7] = { 0 };
    int64_t w[4] = { 0 };
    double st_us[HP_NSTAGES] = { 0 };
    int st_n = 0;
    const int calls = p->o.iters * p->o.agg; /* -m: calls per timed iteration */

    if (checked)
        run_check(p, hcoll_call, count, w);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, 0, count);
    t[0] = hcoll_time(p, 0, count, calls, p->o.stages ? st_us : NULL, &st_n);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, 1, count);
    t[1] = hcoll_time(p, 1, count, calls, NULL, NULL);
    /* Before anything else runs on comm (the sums of times and #wrong). */
    const char *algo = NULL;
    if (hcoll_comm_last_algo(p->comm, &algo) != HCOLL_SUCCESS)
        algo = "?";
    for (int k = 0; k < HP_NSTAGES; k++)
        t[2 + k] = st_n ? st_us[k] / st_n : -1;

    if (p->peer) {
        if (checked)
            run_check(p, peer_call, count, w + 2);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, 0, count);
        t[5] = peer_time(p, 0, count, calls);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, 1, count);
        t[6] = peer_time(p, 1, count, calls);
    }

    reduce_times(p, t, 7);
    hp_reduce_sum(p, w, 4);

    hp_row_t *h = row_new(p, "hcoll", bytes, count);
    snprintf(h->algo, sizeof h->algo, "%s", algo);
    hp_coll_result_fill(&h->oop, p->o.coll, (double)bytes, t[0] * 1e6, p->nranks,
                        checked ? w[0] : -1);
    hp_coll_result_fill(&h->ip, p->o.coll, (double)bytes, t[1] * 1e6, p->nranks,
                        checked ? w[1] : -1);
    hp_row_nic(h, p->nodes, p->local_size, p->line_bps);
    h->have_stages = t[3] >= 0; /* the inter stage is always timed when any is */
    for (int k = 0; k < HP_NSTAGES; k++)
        h->stage_us[k] = t[2 + k];
    if (h->have_stages)
        p->stages_known = 1;
    if (p->rank == 0)
        hp_print_row(p, h);
    if (p->peer) {
        hp_row_t *q = row_new(p, p->peer->name, bytes, count);
        h = q - 1; /* rows may have moved */
        hp_coll_result_fill(&q->oop, p->o.coll, (double)bytes, t[5] * 1e6, p->nranks,
                            checked ? w[2] : -1);
        hp_coll_result_fill(&q->ip, p->o.coll, (double)bytes, t[6] * 1e6, p->nranks,
                            checked ? w[3] : -1);
        hp_row_nic(q, p->nodes, p->local_size, p->line_bps);
        q->ratio = hp_row_best_busbw(q) > 0 ? hp_row_best_busbw(h) / hp_row_best_busbw(q) : -1;
        if (p->rank == 0)
            hp_print_row(p, q);
    }
}

void hp_rank_open(hp_perf_t *p)
{
    const hp_opts_t *o = &p->o;
    hcoll_comm_rank(p->comm, &p->rank);
    hcoll_comm_size(p->comm, &p->nranks);
    hcoll_comm_local_size(p->comm, &p->local_size);
    hcoll_comm_node_count(p->comm, &p->nodes);
    if (o->root >= p->nranks) {
        char what[64];
        snprintf(what, sizeof what, "%d ranks", p->nranks);
        hp_die(p, "-r: the root is not a rank of a job of %s", what);
    }
    if (p->rank == 0 && hp_line_rate_resolve(o->line_rate, getenv("HCOLL_SOCKET_IFNAME"), "/sys",
                                             1, &p->line_bps, p->line_src,
                                             sizeof p->line_src) != 0)
        p->line_bps = 0;
    hp_buffers_open(p);
    if (o->peer == HP_PEER_NCCL)
        hp_peer_nccl_open(p);
}

int hp_rank_agree(hp_perf_t *p, int rc)
{
    int64_t agree[1] = { rc };
    hp_reduce_sum(p, agree, 1);
    return agree[0] ? (p->rank == 0 ? rc : HP_EXIT_WRONG) : 0;
}

void hp_rank_close(hp_perf_t *p)
{
    hp_peer_nccl_close(p);
    hcoll_comm_destroy(p->comm);
    if (p->finish)
        p->finish(p, 0);
    hp_buffers_close(p);
    free(p->rows);
}
