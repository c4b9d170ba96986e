/*
 * libibverbs, loaded at run time: dlopen("libibverbs.so.1") once per
 * process into a table that is read-only afterwards. libhcoll never links
 * libibverbs, so it loads and runs over TCP on hosts without it; every
 * other file of ib/ reaches verbs through this table (or through the
 * inline fast-path calls of verbs.h, which go through the provider's
 * context and need no symbol).
 */
#include "inter/ib/ib_priv.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#if HCOLL_BUILD_VERBS

static ib_verbs_t g_verbs;
static pthread_once_t g_verbs_once = PTHREAD_ONCE_INIT;

static void verbs_load(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_verbs.why, sizeof g_verbs.why, "libibverbs not loadable (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&g_verbs.field = dlsym(h, name);                                           \
        if (!g_verbs.field) {                                                                \
            snprintf(g_verbs.why, sizeof g_verbs.why, "libibverbs.so.1 lacks %s", name);     \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(query_port_compat, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(create_qp, "ibv_create_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
#undef SYM
    /* rdma-core >= 34 only: dma-buf is then simply not offered. */
    *(void **)&g_verbs.reg_dmabuf_mr = dlsym(h, "ibv_reg_dmabuf_mr");
    /* IBVERBS_1.8 (rdma-core >= 27): the call that takes optional access
     * flags such as IBV_ACCESS_RELAXED_ORDERING. */
    *(void **)&g_verbs.reg_mr_iova2 = dlsym(h, "ibv_reg_mr_iova2");
    /* Every libibverbs has these; without them events go unread. */
    *(void **)&g_verbs.get_async_event = dlsym(h, "ibv_get_async_event");
    *(void **)&g_verbs.ack_async_event = dlsym(h, "ibv_ack_async_event");
    *(void **)&g_verbs.fork_init = dlsym(h, "ibv_fork_init");
    /* rdma-core >= 35: tells whether the kernel copies pinned pages at fork. */
    *(void **)&g_verbs.is_fork_initialized = dlsym(h, "ibv_is_fork_initialized");
    /* Completion channels (poll.c's long waits); without them, timed sleeps. */
    *(void **)&g_verbs.create_comp_channel = dlsym(h, "ibv_create_comp_channel");
    *(void **)&g_verbs.destroy_comp_channel = dlsym(h, "ibv_destroy_comp_channel");
    *(void **)&g_verbs.get_cq_event = dlsym(h, "ibv_get_cq_event");
    *(void **)&g_verbs.ack_cq_events = dlsym(h, "ibv_ack_cq_events");
    g_verbs.ok = 1;
}

/*
 * Fork safety, once per process and before the first registration: a child
 * forked while regions are live (hcoll_perf --plot's gnuplot, an
 * application's workers) takes the registered pages copy-on-write, and on
 * kernels without copy-on-fork for pinned pages (before 5.13) the parent's
 * next write lands on a copy the NIC never sees. ibv_fork_init marks
 * registered ranges MADV_DONTFORK. Not needed where
 * ibv_is_fork_initialized says IBV_FORK_UNNEEDED (or already done:
 * RDMAV_FORK_SAFE, the application's own call).
 */
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;
static char g_fork_state[160];

static void fork_setup(void)
{
    const ib_verbs_t *v = &g_verbs;
    if (v->is_fork_initialized) {
        enum ibv_fork_status fs = v->is_fork_initialized();
        if (fs == IBV_FORK_UNNEEDED) {
            snprintf(g_fork_state, sizeof g_fork_state, "not needed (the kernel copies pinned "
                     "pages at fork)");
            return;
        }
        if (fs == IBV_FORK_ENABLED) {
            snprintf(g_fork_state, sizeof g_fork_state, "enabled (before hcoll)");
            return;
        }
    }
    int rc = v->fork_init ? v->fork_init() : ENOSYS;
    if (rc == 0)
        snprintf(g_fork_state, sizeof g_fork_state, "ibv_fork_init done");
    else
        snprintf(g_fork_state, sizeof g_fork_state,
                 "ibv_fork_init failed (%s): regions were registered before hcoll's first; "
                 "set RDMAV_FORK_SAFE=1 if this process forks",
                 strerror(rc));
}

const char *ib_fork_setup(void)
{
    ib_verbs_get();
    if (!g_verbs.ok)
        return "libibverbs not loaded";
    pthread_once(&g_fork_once, fork_setup);
    return g_fork_state;
}

const ib_verbs_t *ib_verbs_get(void)
{
    pthread_once(&g_verbs_once, verbs_load);
    return &g_verbs;
}

int hc_ib_verbs_loadable(char *why, size_t whylen)
{
    const ib_verbs_t *v = ib_verbs_get();
    if (!v->ok && why && whylen) {
        size_t n = strnlen(v->why, whylen - 1);
        memcpy(why, v->why, n);
        why[n] = '\0';
    }
    return v->ok;
}

/* The extended op when the provider has one, else the exported compat
 * entry point: what verbs.h's inline ibv_query_port does. */
int ib_port_query(const ib_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                  struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx)
        return vctx->query_port(ctx, port, attr, sizeof *attr);
    memset(attr, 0, sizeof *attr);
    return v->query_port_compat(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

#else /* !HCOLL_BUILD_VERBS */

int hc_ib_verbs_loadable(char *why, size_t whylen)
{
    snprintf(why, whylen, "hcoll was built without libibverbs headers (rdma-core)");
    return 0;
}

#endif
