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
        fprintf(stderr, "hcoll_perf: this libhcoll has no all-reduce yet "
                        "(hcoll_allreduce returns HCOLL_ERR_UNSUPPORTED)\n");
    /* Abort, not destroy: peers may be stuck in a call and must see us go. */
    hcoll_comm_abort(p->comm);
    p->comm = NULL;
    if (p->finish)
        p->finish(p, code);
    exit(code);
}

void hp_die(hp_perf_t *p, const char *fmt, const char *detail)
{
    fprintf(stderr, "hcoll_perf: rank %d: ", p->rank);
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
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

void hp_reduce_max(hp_perf_t *p, double *v, size_t n)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, v, v, n, HCOLL_FLOAT64, HCOLL_MAX, NULL);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, "hcoll_allreduce (max of times)", st);
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


/* Enqueue one call (device memory) or run it (host memory). */
static void hcoll_issue(hp_perf_t *p, const void *s, void *r, size_t count)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, s, r, count, p->o.dtype, p->o.op,
                                        p->gpu.stream);
    if (st != HCOLL_SUCCESS)
        hp_die_status(p, "hcoll_allreduce", st);
}

/* One call, complete on return. */
static void hcoll_call(hp_perf_t *p, const void *s, void *r, size_t count)
{
    hcoll_issue(p, s, r, count);
    hp_buf_sync(p);
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
static double hcoll_time(hp_perf_t *p, const void *s, void *r, size_t count, int iters,
                         double st_us[HP_NSTAGES], int *st_n)
{
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
            hcoll_call(p, s, r, count);
            add_stage_times(p, st_us, st_n);
        }
        return (hp_now_s() - t0) / iters;
    }
    /* nccl-tests' default: issue every call, then wait for all of them. */
    hcoll_request_t *reqs = calloc((size_t)iters, sizeof *reqs);
    if (!reqs)
        hp_die(p, "%s", "out of memory for requests");
    for (int i = 0; i < iters; i++) {
        hcoll_status_t st = hcoll_allreduce_async(p->comm, s, r, count, p->o.dtype, p->o.op,
                                                  NULL, &reqs[i]);
        if (st == HCOLL_ERR_UNSUPPORTED && i == 0) {
            /* Same answer on every rank: nothing was started anywhere. */
            free(reqs);
            p->async_ok = 0;
            if (p->rank == 0)
                printf("# -z 0: hcoll_allreduce_async is not supported by this library; "
                       "timing blocking calls instead\n");
            return hcoll_time(p, s, r, count, iters, st_us, st_n);
        }
        if (st != HCOLL_SUCCESS)
            hp_die_status(p, "hcoll_allreduce_async", st);
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
static double peer_time(hp_perf_t *p, const void *s, void *r, size_t count, int iters)
{
    char err[300];
    p->peer->barrier(p);
    double t0 = hp_now_s();
    for (int i = 0; i < iters; i++) {
        if (p->peer->allreduce(p, s, r, count, err, sizeof err) != 0)
            hp_die(p, "%s", err);
        if (p->o.blocking && p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
            hp_die(p, "%s", err);
    }
    if (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
        hp_die(p, "%s", err);
    return (hp_now_s() - t0) / iters;
}

static void peer_call(hp_perf_t *p, const void *s, void *r, size_t count)
{
    char err[300];
    if (p->peer->allreduce(p, s, r, count, err, sizeof err) != 0 ||
        (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0))
        hp_die(p, "%s", err);
}

typedef void (*call_fn)(hp_perf_t *p, const void *s, void *r, size_t count);

/* -c checked calls, out of place and in place; #wrong on this rank. */
static void run_check(hp_perf_t *p, call_fn call, size_t count, int64_t wrong[2])
{
    size_t bytes = count * hcoll_dtype_size(p->o.dtype);
    wrong[0] = wrong[1] = 0;
    const hcoll_dtype_t dt = p->o.dtype;
    const hcoll_op_t op = p->o.op;
    for (int c = 0; c < p->o.check; c++) {
        /* Filled and read through p->stage, so device memory works too. */
        hp_check_fill(p->stage, count, dt, op, p->rank, p->nranks);
        hp_buf_put(p, p->send, p->stage, bytes);
        memset(p->stage, 0xa5, bytes); /* a result never written shows as wrong */
        hp_buf_put(p, p->recv, p->stage, bytes);
        call(p, p->send, p->recv, count);
        hp_buf_get(p, p->stage, p->recv, bytes);
        wrong[0] += (int64_t)hp_check_count_wrong(p->stage, count, dt, op, p->nranks);
        hp_check_fill(p->stage, count, dt, op, p->rank, p->nranks);
        hp_buf_put(p, p->recv, p->stage, bytes);
        call(p, p->recv, p->recv, count);
        hp_buf_get(p, p->stage, p->recv, bytes);
        wrong[1] += (int64_t)hp_check_count_wrong(p->stage, count, dt, op, p->nranks);
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
    r->bytes = bytes;
    r->count = count;
    r->dtype = p->o.dtype;
    r->op = p->o.op;
    r->ratio = -1;
    return r;
}

void hp_run_size(hp_perf_t *p, uint64_t bytes)
{
    size_t count = bytes / hcoll_dtype_size(p->o.dtype);
    int checked = p->o.check > 0 && hp_check_exact(p->o.dtype, p->o.op, p->nranks);
    /* [0..1] hcoll oop/ip, [2..4] stages, [5..6] peer oop/ip; max over ranks */
    double t[7] = { 0 };
    int64_t w[4] = { 0 };
    double st_us[HP_NSTAGES] = { 0 };
    int st_n = 0;

    if (checked)
        run_check(p, hcoll_call, count, w);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, p->send, p->recv, count);
    t[0] = hcoll_time(p, p->send, p->recv, count, p->o.iters, p->o.stages ? st_us : NULL, &st_n);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, p->recv, p->recv, count);
    t[1] = hcoll_time(p, p->recv, p->recv, count, p->o.iters, NULL, NULL);
    for (int k = 0; k < HP_NSTAGES; k++)
        t[2 + k] = st_n ? st_us[k] / st_n : -1;

    if (p->peer) {
        if (checked)
            run_check(p, peer_call, count, w + 2);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, p->send, p->recv, count);
        t[5] = peer_time(p, p->send, p->recv, count, p->o.iters);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, p->recv, p->recv, count);
        t[6] = peer_time(p, p->recv, p->recv, count, p->o.iters);
    }

    hp_reduce_max(p, t, 7);
    hp_reduce_sum(p, w, 4);

    hp_row_t *h = row_new(p, "hcoll", bytes, count);
    hp_result_fill(&h->oop, (double)bytes, t[0] * 1e6, p->nranks, checked ? w[0] : -1);
    hp_result_fill(&h->ip, (double)bytes, t[1] * 1e6, p->nranks, checked ? w[1] : -1);
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
        hp_result_fill(&q->oop, (double)bytes, t[5] * 1e6, p->nranks, checked ? w[2] : -1);
        hp_result_fill(&q->ip, (double)bytes, t[6] * 1e6, p->nranks, checked ? w[3] : -1);
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
