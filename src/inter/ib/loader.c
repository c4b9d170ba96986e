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
    g_verbs.ok = 1;
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
