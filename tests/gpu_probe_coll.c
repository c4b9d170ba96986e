/*
 * gpu_probe's probes of hcoll's device collectives (see gpu_probe.c): each
 * forks its ranks (tests/common/ranks.c: emulated nodes through
 * HCOLL_HOSTID, all on GPU 0, a deadline after which they are killed), the
 * ranks record verdicts in shared memory, and the parent prints one line
 * per probe: the worst verdict over the ranks, with that rank's reason. A
 * rank killed at the deadline is a hang, printed as a FAIL naming it.
 * The parent never initialises CUDA (it does not survive fork).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "gpu/probe.h"

#define NR_MAX 4
#define LINES 12

typedef struct rline {
    char name[64];
    char verdict[8];
    char detail[440];
} rline_t;

typedef struct pshared {
    hct_id_slot_t id;
    int nlines[NR_MAX];
    rline_t line[NR_MAX][LINES];
} pshared_t;

static pshared_t *sh;
static int me; /* this rank, in a rank process */

/* A verdict of this rank, printed by the parent. */
static void say(const char *name, const char *verdict, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(const char *name, const char *verdict, const char *fmt, ...)
{
    int k = sh->nlines[me];
    if (k >= LINES)
        return;
    rline_t *l = &sh->line[me][k];
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(l->verdict, sizeof l->verdict, "%s", verdict);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->detail, sizeof l->detail, fmt, ap);
    va_end(ap);
    sh->nlines[me] = k + 1;
}

static int severity(const char *v)
{
    return strcmp(v, "FAIL") == 0 ? 3 : strcmp(v, "SKIP") == 0 ? 2 : strcmp(v, "INFO") == 0 ? 1 : 0;
}

typedef int (*rank_fn)(int rank, int nranks);
static rank_fn cur_fn;

static int rank_entry(int rank, int nranks, void *arg)
{
    (void)arg;
    me = rank;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    return cur_fn(rank, nranks);
}

/* Fork nranks ranks (rpn per emulated node) running fn; print the merged
 * verdicts. what names the probe in the hang message. */
static int run_ranks(const char *what, rank_fn fn, int nranks, int rpn, int timeout_s)
{
    sh = hct_shared_alloc(sizeof *sh);
    if (!sh)
        return 1;
    cur_fn = fn;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = rpn, .timeout_ms = timeout_s * 1000 };
    hct_result_t res[NR_MAX];
    hct_run(&o, rank_entry, NULL, res);
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < sh->nlines[r]; k++) {
            const char *name = sh->line[r][k].name;
            int seen = 0, worst = -1, wr = 0;
            for (int q = 0; q < r && !seen; q++)
                for (int j = 0; j < sh->nlines[q] && !seen; j++)
                    seen = strcmp(sh->line[q][j].name, name) == 0;
            if (seen)
                continue;
            const rline_t *w = NULL;
            for (int q = 0; q < nranks; q++)
                for (int j = 0; j < sh->nlines[q]; j++)
                    if (strcmp(sh->line[q][j].name, name) == 0 &&
                        severity(sh->line[q][j].verdict) > worst) {
                        worst = severity(sh->line[q][j].verdict);
                        w = &sh->line[q][j];
                        wr = q;
                    }
            if (worst >= 2)
                probe_say(name, w->verdict, "rank %d: %s", wr, w->detail);
            else
                probe_say(name, w->verdict, "%s", w->detail);
        }
    for (int r = 0; r < nranks; r++) {
        if (res[r].killed)
            probe_say(what, "FAIL",
                      "rank %d hung: killed at the %d s deadline (its stderr above; a device "
                      "call that never completes, issue 19)", r, timeout_s);
        else if (res[r].signaled)
            probe_say(what, "FAIL", "rank %d died of signal %d", r, res[r].sig);
        else if (res[r].code != 0 && sh->nlines[r] == 0)
            probe_say(what, "FAIL", "rank %d exited %d before any verdict (stderr above)", r,
                      res[r].code);
    }
    hct_shared_free(sh, sizeof *sh);
    sh = NULL;
    return 0;
}

/* ---- helpers inside a rank ------------------------------------------------- */

static hcoll_comm_t rank_comm(int rank, int nranks)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    if (hct_share_unique_id(&sh->id, rank, 30000, &id) != 0)
        return NULL;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 60000;
    if (hcoll_comm_init(&comm, nranks, rank, &id, &cfg) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcoll_comm_last_error(NULL));
        return NULL;
    }
    return comm;
}

/* Element i of rank r, and the sum over nranks ranks: exact in float. */
static float in_val(int r, size_t i)
{
    return (float)(i % 7) + (float)r;
}

static float sum_val(int nranks, size_t i)
{
    return (float)nranks * (float)(i % 7) + (float)(nranks * (nranks - 1) / 2);
}

/* In-place SUM of n floats at d on stream s: inputs copied in on s, the
 * result copied out on s and checked. NULL, or why it failed (in buf). */
static const char *sum_check(hcoll_comm_t comm, const hc_cu_api_t *cu, void *s, hc_cu_dptr_t d,
                             size_t n, int rank, int nranks, double *ms, char *buf, size_t len)
{
    float *h = malloc(n * sizeof *h);
    if (!h)
        return "no host memory";
    for (size_t i = 0; i < n; i++)
        h[i] = in_val(rank, i);
    const char *why = NULL;
    hc_cu_res_t r = cu->memcpy_htod_async(d, h, n * sizeof *h, s);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(s);
    double t0 = hct_now_ms();
    hcoll_status_t st = HCOLL_SUCCESS;
    if (r == HC_CU_SUCCESS)
        st = hcoll_allreduce(comm, (void *)(uintptr_t)d, (void *)(uintptr_t)d, n, HCOLL_FLOAT32,
                             HCOLL_SUM, s);
    if (st != HCOLL_SUCCESS) {
        snprintf(buf, len, "hcoll_allreduce: %s: %s", hcoll_status_name(st),
                 hcoll_comm_last_error(comm));
        why = buf;
        goto out;
    }
    if (r == HC_CU_SUCCESS)
        r = cu->memcpy_dtoh_async(h, d, n * sizeof *h, s);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(s);
    if (ms)
        *ms = hct_now_ms() - t0;
    if (r != HC_CU_SUCCESS) {
        snprintf(buf, len, "a driver call failed: %s", pd_err(r));
        why = buf;
        goto out;
    }
    for (size_t i = 0; i < n && !why; i++)
        if (h[i] != sum_val(nranks, i)) {
            snprintf(buf, len, "n=%zu: element %zu is %g, want %g (stream order broken?)", n, i,
                     h[i], sum_val(nranks, i));
            why = buf;
        }
out:
    free(h);
    return why;
}

/* ---- allreduce under CUDA_DEVICE_MAX_CONNECTIONS / extra streams ------------- */

static int extra_n;

static int rank_allreduce(int rank, int nranks)
{
    const char *cdmc = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    char name[64], why[300];
    snprintf(name, sizeof name, "allreduce.cdmc_%s.streams_%d", cdmc ? cdmc : "default",
             extra_n);
    const hc_cu_api_t *cu = gpu_open(0);
    if (!cu) {
        say(name, "FAIL", "cannot open GPU 0");
        return 1;
    }
    /* The application's streams, each with work, made before hcoll's: the
     * driver spreads streams over its hardware queues in creation order. */
    void **xs = calloc((size_t)extra_n + 1, sizeof *xs);
    hc_cu_dptr_t scratch = 0;
    /* Each stream copies within its own 512 KiB (no two streams touch
     * the same bytes: they are unordered). */
    const size_t part = 256u << 10;
    if (extra_n > 0 && cu->mem_alloc(&scratch, (size_t)extra_n * 2 * part) != HC_CU_SUCCESS) {
        say(name, "FAIL", "cannot allocate scratch memory");
        return 1;
    }
    for (int i = 0; i < extra_n; i++)
        if (cu->stream_create(&xs[i], (i & 1) ? HC_CU_STREAM_NON_BLOCKING : 0) != HC_CU_SUCCESS ||
            cu->memcpy_dtod_async(scratch + 2 * part * (size_t)i,
                                  scratch + 2 * part * (size_t)i + part, part, xs[i]) !=
                HC_CU_SUCCESS) {
            say(name, "FAIL", "cannot make application stream %d", i);
            return 1;
        }
    hcoll_comm_t comm = rank_comm(rank, nranks);
    void *s;
    if (!comm || cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS) {
        say(name, "FAIL", "set-up failed (stderr)");
        return 1;
    }
    static const size_t sizes[] = { 1024, 1u << 20, 3000017 }; /* the last: several segments */
    double ms[3] = { 0 };
    hc_cu_dptr_t d;
    if (cu->mem_alloc(&d, 3000017 * 4) != HC_CU_SUCCESS) {
        say(name, "FAIL", "cannot allocate");
        return 1;
    }
    for (int k = 0; k < 3; k++) {
        /* Keep the application's streams busy meanwhile. */
        for (int i = 0; i < extra_n; i++)
            cu->memcpy_dtod_async(scratch + 2 * part * (size_t)i,
                                  scratch + 2 * part * (size_t)i + part, part, xs[i]);
        const char *e = sum_check(comm, cu, s, d, sizes[k], rank, nranks, &ms[k], why, sizeof why);
        if (e) {
            say(name, "FAIL", "%s", e);
            return 1;
        }
    }
    for (int i = 0; i < extra_n; i++)
        cu->stream_synchronize(xs[i]);
    say(name, "PASS", "1 Ki, 1 Mi, 3 M floats correct (%.1f, %.1f, %.1f ms per call)", ms[0],
        ms[1], ms[2]);
    hcoll_comm_destroy(comm);
    return 0;
}

int probe_allreduce(int extra_streams)
{
    extra_n = extra_streams < 0 ? 0 : extra_streams;
    return run_ranks("allreduce", rank_allreduce, 2, 1, 60);
}

/* ---- three stages on one GPU -------------------------------------------------- */

static size_t ts_bytes;
static int ts_iters;

static int rank_three_stage(int rank, int nranks)
{
    char host[64], why[300];
    /* hcoll's nodes: HCOLL_HOSTID (hct_run); NCCL's: one host per rank, so
     * that it accepts two ranks of a node on one GPU (over its network
     * transport) instead of "Duplicate GPU detected". */
    snprintf(host, sizeof host, "gpu-probe-%d-rank%d", (int)getppid(), rank);
    setenv("NCCL_HOSTID", host, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    setenv("NCCL_IB_DISABLE", "1", 0);
    const hc_cu_api_t *cu = gpu_open(0);
    hcoll_comm_t comm = cu ? rank_comm(rank, nranks) : NULL;
    void *s;
    if (!comm || cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS) {
        say("three_stage.one_gpu", "FAIL", "set-up failed (stderr)");
        return 1;
    }
    hc_cu_dptr_t d;
    if (cu->mem_alloc(&d, 3000017 * 4) != HC_CU_SUCCESS) {
        say("three_stage.one_gpu", "FAIL", "cannot allocate");
        return 1;
    }
    static const size_t sizes[] = { 1001, 65537, 3000017 };
    for (int k = 0; k < 3; k++) {
        const char *e = sum_check(comm, cu, s, d, sizes[k], rank, nranks, NULL, why, sizeof why);
        if (e) {
            say("three_stage.one_gpu", "FAIL", "%s (NCCL RS/AG among ranks 2r, 2r+1 on one "
                "GPU as two NCCL hosts)", e);
            return 1;
        }
    }
    cu->mem_free(d);
    say("three_stage.one_gpu", "PASS", "2 nodes x 2 ranks on GPU 0 (NCCL over its network "
        "transport within a node): 1001, 65537, 3000017 floats correct");
    if (ts_bytes > 0) {
        size_t n = ts_bytes / 4;
        if (cu->mem_alloc(&d, n * 4) != HC_CU_SUCCESS) {
            say("three_stage.big", "FAIL", "cannot allocate %zu MiB", ts_bytes >> 20);
            return 1;
        }
        void *p = (void *)(uintptr_t)d;
        hcoll_request_t req = NULL;
        hcoll_status_t st = hcoll_allreduce(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, s);
        cu->stream_synchronize(s);
        double t0 = hct_now_ms();
        /* Blocking calls, the last one async for its stage times. */
        for (int i = 0; i + 1 < ts_iters && st == HCOLL_SUCCESS; i++)
            st = hcoll_allreduce(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, s);
        if (st == HCOLL_SUCCESS)
            st = hcoll_allreduce_async(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, s, &req);
        if (st == HCOLL_SUCCESS)
            st = hcoll_wait(req);
        cu->stream_synchronize(s);
        double ms = (hct_now_ms() - t0) / (ts_iters > 0 ? ts_iters : 1);
        hcoll_stage_times_t t = { 0 };
        if (st == HCOLL_SUCCESS)
            st = hcoll_request_stage_times(req, &t);
        if (req)
            hcoll_request_free(req);
        if (st != HCOLL_SUCCESS) {
            say("three_stage.big", "FAIL", "%s: %s", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
            return 1;
        }
        say("three_stage.big", "INFO",
            "%zu MiB: %.1f ms per call, busbw %.2f GB/s; last call's stages rs %.0f us, inter "
            "%.0f us, ag %.0f us, total %.0f us (one GPU time-sliced by 4 processes)",
            ts_bytes >> 20, ms, 2.0 * (nranks - 1) / nranks * (double)ts_bytes / (ms / 1e3) / 1e9,
            t.intra_rs_us, t.inter_us, t.intra_ag_us, t.total_us);
        cu->mem_free(d);
    }
    hcoll_comm_destroy(comm);
    return 0;
}

int probe_three_stage(size_t bytes, int iters)
{
    void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!nccl) {
        probe_say("three_stage.one_gpu", "SKIP", "cannot run: libnccl.so.2 does not load (%s); "
                  "the intra-node stages need NCCL", dlerror());
        return 0;
    }
    dlclose(nccl);
    ts_bytes = bytes;
    ts_iters = iters > 0 ? iters : 1;
    return run_ranks("three_stage", rank_three_stage, 4, 2, bytes ? 150 : 90);
}

/* ---- stream handles ------------------------------------------------------------ */

static int rank_handles(int rank, int nranks)
{
    char why[300];
    const hc_cu_api_t *cu = gpu_open(0);
    hcoll_comm_t comm = cu ? rank_comm(rank, nranks) : NULL;
    hc_cu_dptr_t d;
    void *blocking;
    if (!comm || cu->mem_alloc(&d, 65537 * 4) != HC_CU_SUCCESS ||
        cu->stream_create(&blocking, 0) != HC_CU_SUCCESS) {
        say("handles", "FAIL", "set-up failed (stderr)");
        return 1;
    }
    /* The contract (hcoll.h, issue 19 item 8): 0x1, a blocking stream and
     * 0 with device buffers run on the stream they name (0 = the legacy
     * stream); 0x2 (per-thread) is refused with a message saying what to
     * pass, since it names another stream on each of hcoll's threads. */
    static const struct { const char *name; uintptr_t h; } hs[] = {
        { "handles.legacy_0x1", 0x1 },
        { "handles.per_thread_0x2", 0x2 },
        { "handles.blocking_stream", 0 /* made above */ },
        { "handles.null_device_buffers", 0 },
    };
    for (size_t k = 0; k < 4; k++) {
        void *h = k == 2 ? blocking : (void *)hs[k].h;
        const char *e = sum_check(comm, cu, h, d, 65537, rank, nranks, NULL, why, sizeof why);
        if (k == 1) {
            const char *msg = hcoll_comm_last_error(comm);
            if (e && strstr(why, "HCOLL_ERR_INVALID_ARG") && strstr(msg, "PER_THREAD"))
                say(hs[k].name, "PASS", "refused, saying what to pass: %s", msg);
            else
                say(hs[k].name, "FAIL", "%s (the contract: refused with INVALID_ARG)",
                    e ? e : "accepted");
            continue;
        }
        if (k == 3) {
            const char *msg = hcoll_comm_last_error(comm);
            if (!e)
                say(hs[k].name, "PASS", "accepted, as the legacy stream; result correct");
            else if (strstr(why, "HCOLL_ERR_INVALID_ARG") && strstr(msg, "stream"))
                say(hs[k].name, "PASS", "refused, saying what to pass: %s", msg);
            else
                say(hs[k].name, "FAIL", "%s", e);
            continue;
        }
        if (e)
            say(hs[k].name, "FAIL", "%s (the contract: accepted)", e);
        else
            say(hs[k].name, "PASS", "accepted; the copy behind it on the same handle sees the "
                "result");
    }
    hcoll_comm_destroy(comm);
    return 0;
}

int probe_handles(void)
{
    return run_ranks("handles", rank_handles, 2, 1, 60);
}

/* ---- managed memory ---------------------------------------------------------- */

static int rank_managed(int rank, int nranks)
{
    char why[300];
    const hc_cu_api_t *cu = gpu_open(0);
    const pd_t *d = cu ? pd_open(0, why, sizeof why) : NULL;
    if (!d || !d->alloc_managed) {
        say("managed.allreduce", "SKIP", "this driver has no cuMemAllocManaged");
        return 0;
    }
    hcoll_comm_t comm = rank_comm(rank, nranks);
    void *s;
    if (!comm || cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS) {
        say("managed.allreduce", "FAIL", "set-up failed (stderr)");
        return 1;
    }
    static const size_t sizes[] = { 65537, 3000017 };
    for (int k = 0; k < 2; k++) {
        unsigned long long m;
        int r = d->alloc_managed(&m, sizes[k] * 4, 0x1 /* CU_MEM_ATTACH_GLOBAL */);
        if (r != 0) {
            say("managed.allreduce", "SKIP", "cuMemAllocManaged: %s", pd_err(r));
            return 0;
        }
        const char *e = sum_check(comm, cu, s, m, sizes[k], rank, nranks, NULL, why, sizeof why);
        cu->mem_free(m);
        if (e) {
            say("managed.allreduce", "FAIL", "n=%zu: %s (contract: managed memory works like "
                "device memory; issue 19 item 6: staged where GPUDirect cannot pin it)",
                sizes[k], e);
            return 1;
        }
    }
    say("managed.allreduce", "PASS", "cuMemAllocManaged buffers of 65537 and 3000017 floats "
        "all-reduced in place, correct");
    hcoll_comm_destroy(comm);
    return 0;
}

int probe_managed(void)
{
    return run_ranks("managed", rank_managed, 2, 1, 60);
}

/* ---- a global-mode capture on another thread during the first call ------------ */

typedef struct cap {
    const pd_t *d;
    void *stream;
    hc_cu_dptr_t a, b;
    volatile int capturing, release;
    int begin_rc, end_rc;
} cap_t;

static void *cap_thread(void *arg)
{
    cap_t *c = arg;
    char why[128];
    pd_open(0, why, sizeof why);
    c->begin_rc = c->d->begin_capture(c->stream, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */);
    if (c->begin_rc == 0)
        c->d->dtod(c->a, c->b, 4096, c->stream); /* some captured work */
    __atomic_store_n(&c->capturing, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&c->release, __ATOMIC_ACQUIRE))
        usleep(1000);
    void *graph = NULL;
    c->end_rc = c->begin_rc == 0 ? c->d->end_capture(c->stream, &graph) : -1;
    if (graph && c->d->graph_destroy)
        c->d->graph_destroy(graph);
    return NULL;
}

static int rank_capture(int rank, int nranks)
{
    char why[300];
    const char *name = "capture.global_other_thread";
    const hc_cu_api_t *cu = gpu_open(0);
    const pd_t *d = cu ? pd_open(0, why, sizeof why) : NULL;
    if (!d || !d->begin_capture || !d->end_capture) {
        say(name, "SKIP", "this driver has no stream capture");
        return 0;
    }
    hcoll_comm_t comm = rank_comm(rank, nranks);
    cap_t c = { .d = d };
    void *s;
    hc_cu_dptr_t buf;
    /* Everything the application needs is made before its capture. */
    if (!comm || cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        cu->stream_create(&c.stream, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        cu->mem_alloc(&c.a, 4096) != HC_CU_SUCCESS || cu->mem_alloc(&c.b, 4096) != HC_CU_SUCCESS ||
        cu->mem_alloc(&buf, 65537 * 4) != HC_CU_SUCCESS) {
        say(name, "FAIL", "set-up failed (stderr)");
        return 1;
    }
    float *h = malloc(65537 * 4);
    for (size_t i = 0; i < 65537; i++)
        h[i] = in_val(rank, i);
    cu->memcpy_htod_async(buf, h, 65537 * 4, s);
    cu->stream_synchronize(s);
    pthread_t t;
    pthread_create(&t, NULL, cap_thread, &c);
    while (!__atomic_load_n(&c.capturing, __ATOMIC_ACQUIRE))
        usleep(1000);
    /* The communicator's first device call (its set-up) while the other
     * thread captures in global mode; this thread makes no CUDA call of
     * its own until the capture ends. */
    hcoll_request_t req = NULL;
    void *p = (void *)(uintptr_t)buf;
    hcoll_status_t st = hcoll_allreduce_async(comm, p, p, 65537, HCOLL_FLOAT32, HCOLL_SUM, s, &req);
    int done = 0;
    double t0 = hct_now_ms();
    while (st == HCOLL_SUCCESS && !done && hct_now_ms() - t0 < 30000) {
        st = hcoll_test(req, &done);
        usleep(1000);
    }
    __atomic_store_n(&c.release, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    char err[300];
    snprintf(err, sizeof err, "%s", hcoll_comm_last_error(comm));
    if (req)
        hcoll_request_free(req);
    if (c.begin_rc != 0) {
        say(name, "SKIP", "cuStreamBeginCapture (global): %s", pd_err(c.begin_rc));
        return 0;
    }
    int ok = st == HCOLL_SUCCESS && done;
    if (ok) {
        cu->memcpy_dtoh_async(h, buf, 65537 * 4, s);
        ok = cu->stream_synchronize(s) == HC_CU_SUCCESS;
        for (size_t i = 0; i < 65537 && ok; i++)
            ok = h[i] == sum_val(nranks, i);
    }
    free(h);
    if (c.end_rc != 0 || !ok)
        say(name, "FAIL", "capture %s; all-reduce %s%s%s (intended, issue 19 item 7: hcoll's "
            "threads use cuThreadExchangeStreamCaptureMode(RELAXED), so neither disturbs the "
            "other)", c.end_rc == 0 ? "ended fine" : pd_err(c.end_rc),
            st != HCOLL_SUCCESS ? hcoll_status_name(st) : !done ? "not done after 30 s" :
            ok ? "correct" : "wrong result", st != HCOLL_SUCCESS ? ": " : "",
            st != HCOLL_SUCCESS ? err : "");
    else
        say(name, "PASS", "the application's global-mode capture on another thread survived "
            "the first device call, whose result is correct");
    hcoll_comm_destroy(comm);
    return 0;
}

int probe_capture(void)
{
    return run_ranks("capture", rank_capture, 2, 1, 60);
}

/* ---- destroy while the application's stream waits ------------------------------ */

typedef struct dst {
    hcoll_comm_t comm;
    volatile int done;
    hcoll_status_t st;
} dst_t;

static void *destroy_thread(void *arg)
{
    dst_t *x = arg;
    x->st = hcoll_comm_destroy(x->comm);
    __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int rank_destroy(int rank, int nranks)
{
    char why[300];
    const char *name = "destroy.app_stream_waiting";
    const hc_cu_api_t *cu = gpu_open(0);
    const pd_t *d = cu ? pd_open(0, why, sizeof why) : NULL;
    hcoll_comm_t comm = d ? rank_comm(rank, nranks) : NULL;
    void *s, *app;
    hc_cu_dptr_t buf;
    volatile uint32_t *flag;
    unsigned long long fdev;
    if (!comm || cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        cu->stream_create(&app, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        cu->mem_alloc(&buf, 3000017 * 4) != HC_CU_SUCCESS || pd_host_flag(d, &flag, &fdev) != 0) {
        say(name, "FAIL", "set-up failed (stderr)");
        return 1;
    }
    /* A call that sets up the device path and its staging. */
    const char *e = sum_check(comm, cu, s, buf, 3000017, rank, nranks, NULL, why, sizeof why);
    if (e) {
        say(name, "FAIL", "the all-reduce before destroy: %s", e);
        return 1;
    }
    int r = d->wait_value32(app, fdev, 1, 0 /* GEQ */);
    if (r != 0) {
        say(name, "SKIP", "cannot hold a stream on a host flag: %s", pd_err(r));
        return 0;
    }
    dst_t x = { .comm = comm };
    pthread_t t;
    double t0 = hct_now_ms();
    pthread_create(&t, NULL, destroy_thread, &x);
    while (!__atomic_load_n(&x.done, __ATOMIC_ACQUIRE) && hct_now_ms() - t0 < 5000)
        usleep(1000);
    int returned = __atomic_load_n(&x.done, __ATOMIC_ACQUIRE);
    double took = hct_now_ms() - t0;
    *flag = 1;
    __sync_synchronize();
    pthread_join(t, NULL);
    cu->stream_synchronize(app);
    if (returned)
        say(name, "PASS", "hcoll_comm_destroy returned in %.1f ms (%s) while the application's "
            "stream waited", took, hcoll_status_name(x.st));
    else
        say(name, "FAIL", "hcoll_comm_destroy did not return within 5 s while the "
            "application's stream waited; it returned once the stream was released (issue 19 "
            "item 2: cuMemFreeHost/cuModuleUnload synchronise the device; the contract is "
            "that destroy does not wait for the application's streams)");
    return 0;
}

int probe_destroy(void)
{
    return run_ranks("destroy", rank_destroy, 2, 1, 60);
}
