/*
 * Memory registration for the verbs transport, on top of the registration
 * cache (mr_cache.c):
 *
 *   mr_reg(p, n) ─► cache hit? ─ yes ─► handle on the cached ibv_mr
 *                        │ no
 *                        ├─ host memory ───────────► ibv_reg_mr
 *                        └─ device memory (GPUDirect on):
 *                             dma-buf ─► ibv_reg_dmabuf_mr ─┐ failed and
 *                             peermem ─► ibv_reg_mr ◄───────┘ peermem loaded
 *
 * Device memory is taken only when GPUDirect was decided for this rank's
 * GPU and NIC (device.c); otherwise mr_reg refuses it and the caller
 * stages through host memory. Before Hopper a completion can overtake the
 * PCIe writes into GPU memory, so immediates are held back until a
 * one-word RDMA read of device memory (through a loopback QP on our own
 * NIC) has returned: PCIe reads push earlier writes ahead of them. The
 * word read is hcoll's own (gdr/mem.h), never a user's buffer, which the
 * user may free while the cache still holds its registration.
 */
#include "inter/ib/ib_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "gdr/gdr.h"

#if HCOLL_BUILD_VERBS

#define IB_FLUSH_BYTES 64

void ib_mrc_dereg(void *ctx, hc_mrc_entry_t *e)
{
    hc_transport_t *tr = ctx;
    ib_mrent_t *mr = (ib_mrent_t *)e;
    if (mr->mr) {
        tr->v->dereg_mr(mr->mr);
        hc_tp_count(HC_TP_DEREG);
    }
    if (e->dmabuf_fd >= 0)
        close(e->dmabuf_fd);
    free(mr);
}

/* A registration that failed: this call's error, recorded, never the
 * transport's sticky failure. The caller (the ring starting an operation,
 * hcoll_mem_register, the device slots at set-up) decides what it means;
 * the QPs and every other region are untouched. */
static hcoll_status_t mr_refuse(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hcoll_status_t mr_refuse(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hc_err_set(tr->p.errbuf, HC_NET, tr->p.log_rank, st,
                      "NET/IB rank %d, rail %d (%s port %d): %s", tr->p.log_rank, tr->p.rail,
                      tr->choice.port.dev, tr->choice.port.port, msg);
}

/* A loopback QP on our own NIC for flush reads of device memory; -1 with
 * the reason in why (GPUDirect then stays off: not a failure). */
static int loop_qp_setup(hc_transport_t *tr, char *why, size_t whylen)
{
    if (tr->loop_qp)
        return 0;
    if (ib_qp_create(tr, &tr->loop_cq, &tr->loop_qp) != 0) {
        snprintf(why, whylen, "creating the GPUDirect flush QP failed (%s)", strerror(errno));
        return -1;
    }
    ib_addr_t self;
    memset(&self, 0, sizeof self);
    self.psn = tr->psn;
    self.lid = tr->pattr.lid;
    self.link_layer = tr->pattr.link_layer;
    self.mtu = (uint8_t)tr->pattr.active_mtu;
    memcpy(self.gid, tr->gid.raw, 16);
    int mtu;
    if (ib_qp_connect(tr, tr->loop_qp, &self, tr->loop_qp->qp_num, &mtu) != 0) {
        snprintf(why, whylen, "connecting the GPUDirect flush QP failed (%s)", strerror(errno));
        return -1;
    }
    return 0;
}

static void mr_register(hc_transport_t *tr, ib_mrent_t *mr, int kind, char *why, size_t whylen);

int ib_flush_setup(hc_transport_t *tr, char *why, size_t whylen)
{
    if (hc_gdr_dmem_alloc(tr->gpu, IB_FLUSH_BYTES, &tr->flush_mem) != 0) {
        snprintf(why, whylen, "no device memory for the flush word");
        return -1;
    }
    /* Registered as device buffers are: through dma-buf where that was
     * chosen (a dma-buf-only host has no peermem for a plain ibv_reg_mr). */
    ib_mrent_t w;
    memset(&w, 0, sizeof w);
    w.e.base = (void *)(uintptr_t)tr->flush_mem.ptr;
    w.e.len = IB_FLUSH_BYTES;
    w.e.dmabuf_fd = -1;
    w.e.flags = HC_MRC_REMOTE; /* the loopback QP reads it */
    w.device = 1;
    char rwhy[200] = "";
    mr_register(tr, &w, HC_MEM_DEVICE, rwhy, sizeof rwhy);
    if (w.e.dmabuf_fd >= 0)
        close(w.e.dmabuf_fd); /* the region holds the dma-buf now */
    tr->flush_mr = w.mr;
    if (!tr->flush_mr) {
        snprintf(why, whylen, "registering the flush word through %s failed (%s)",
                 hc_gdr_reg_name(tr->gdr_reg), rwhy[0] ? rwhy : strerror(errno));
        return -1;
    }
    return loop_qp_setup(tr, why, whylen); /* on failure ib_flush_free undoes the rest */
}

/*
 * The flush for the immediates held now. The NIC's writes into GPU memory
 * are pushed ahead by a read on their own path, so the reads go to the
 * buffers they landed in (as NCCL reads the buffer just received), not to
 * a word of hcoll's: on a C2C host, or through a switch that reorders, a
 * read elsewhere orders nothing. A completion does not say where its
 * write landed, so each device region a peer may be writing now (handed
 * out with an rkey and in use) is read, one word each, chained, the last
 * one signaled: RC reads complete in order. Each region read is held
 * (a cache reference) until the read is back, so that a buffer released
 * meanwhile is not deregistered under it. With no such region, the flush
 * word is read. Returns ibv_post_send's code.
 */
int ib_flush_post(hc_transport_t *tr)
{
    struct ibv_send_wr wr[IB_FLUSH_REGIONS], *bad;
    /* The scratch word after the credit words (ib_priv.h). */
    struct ibv_sge sge = { (uintptr_t)&tr->credits[IB_CREDIT_WORDS(tr->p.nranks) - 1], 4,
                           tr->credits_mr->lkey };
    int n = 0, over = 0;
    for (hc_mrc_entry_t *e = tr->mrc.list; e; e = e->next) {
        const ib_mrent_t *m = (const ib_mrent_t *)e;
        if (!m->device || !(e->flags & HC_MRC_REMOTE) || e->refs == 0)
            continue;
        if (n == IB_FLUSH_REGIONS) {
            over++;
            continue;
        }
        memset(&wr[n], 0, sizeof wr[n]);
        wr[n].wr.rdma.remote_addr = (uintptr_t)e->base;
        wr[n].wr.rdma.rkey = m->mr->rkey;
        tr->flush_ents[n++] = e;
    }
    if (over && !tr->flush_warned) {
        tr->flush_warned = 1;
        HC_WARN(HC_GDR, tr->p.log_rank,
                "NET/IB: %d device regions in use; GPUDirect flush reads cover %d of them "
                "(deregister buffers with hcoll_mem_deregister when done)",
                n + over, IB_FLUSH_REGIONS);
    }
    if (n == 0) {
        memset(&wr[0], 0, sizeof wr[0]);
        wr[0].wr.rdma.remote_addr = tr->flush_mem.ptr;
        wr[0].wr.rdma.rkey = tr->flush_mr->rkey;
        n = 1;
        tr->flush_ents[0] = NULL;
    }
    for (int i = 0; i < n; i++) {
        wr[i].wr_id = TX_FLUSH;
        wr[i].sg_list = &sge;
        wr[i].num_sge = 1;
        wr[i].opcode = IBV_WR_RDMA_READ;
        wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
        wr[i].send_flags = i + 1 < n ? 0 : IBV_SEND_SIGNALED;
    }
    int rc = ibv_post_send(tr->loop_qp, wr, &bad);
    if (rc != 0)
        return rc;
    tr->nflush_ents = tr->flush_ents[0] ? n : 0;
    for (int i = 0; i < tr->nflush_ents; i++)
        tr->flush_ents[i]->refs++;
    return 0;
}

void ib_flush_release(hc_transport_t *tr)
{
    for (int i = 0; i < tr->nflush_ents; i++)
        hc_mrc_release(&tr->mrc, tr->flush_ents[i]);
    tr->nflush_ents = 0;
}

void ib_flush_free(hc_transport_t *tr)
{
    tr->nflush_ents = 0; /* the cache goes whole after this */
    if (tr->loop_qp)
        tr->v->destroy_qp(tr->loop_qp);
    if (tr->loop_cq)
        tr->v->destroy_cq(tr->loop_cq);
    tr->loop_qp = NULL;
    tr->loop_cq = NULL;
    if (tr->flush_mr) {
        tr->v->dereg_mr(tr->flush_mr);
        hc_tp_count(HC_TP_DEREG);
    }
    tr->flush_mr = NULL;
    hc_gdr_dmem_free(&tr->flush_mem);
}

/* IBV_ACCESS_RELAXED_ORDERING lets the NIC's PCIe writes pass each other
 * (faster through some root complexes and switches); ordering that
 * matters is restored by completions and flush reads. A provider that
 * refuses the flag turns it off for this transport, once, and the
 * registration is made without it. */
static int ro_refused(hc_transport_t *tr, int err)
{
    if (err != EINVAL && err != EOPNOTSUPP && err != EPROTONOSUPPORT)
        return 0;
    tr->ro = 0;
    HC_INFO(HC_NET, tr->p.log_rank,
            "NET/IB: %s refused a relaxed-ordering registration (%s): registering without it",
            tr->choice.port.dev, strerror(err));
    return 1;
}

/* ibv_reg_mr, through ibv_reg_mr_iova2 with relaxed ordering where chosen. */
static struct ibv_mr *reg_plain(hc_transport_t *tr, void *base, size_t len, int access)
{
    if (tr->ro) {
        struct ibv_mr *m = tr->v->reg_mr_iova2(tr->pd, base, len, (uintptr_t)base,
                                               (unsigned)(access | IBV_ACCESS_RELAXED_ORDERING));
        if (m || !ro_refused(tr, errno))
            return m;
    }
    return tr->v->reg_mr(tr->pd, base, len, access);
}

static struct ibv_mr *reg_dmabuf(hc_transport_t *tr, uint64_t off, size_t len, void *base,
                                 int fd, int access)
{
    if (tr->ro) {
        struct ibv_mr *m = tr->v->reg_dmabuf_mr(tr->pd, off, len, (uintptr_t)base, fd,
                                                access | IBV_ACCESS_RELAXED_ORDERING);
        if (m || !ro_refused(tr, errno))
            return m;
    }
    return tr->v->reg_dmabuf_mr(tr->pd, off, len, (uintptr_t)base, fd, access);
}

/* Register mr->e's range: dma-buf first where chosen, peermem or plain
 * ibv_reg_mr otherwise. why gets the reason when mr->mr stays NULL. A
 * region whose rkey is handed out (remote) is written and read by peers
 * and by our flush reads; any other is only read by our own NIC, and no
 * peer can reach it whatever key it guesses. */
static void mr_register(hc_transport_t *tr, ib_mrent_t *mr, int kind, char *why, size_t whylen)
{
    void *base = mr->e.base;
    const size_t len = mr->e.len;
    const int access = (mr->e.flags & HC_MRC_REMOTE)
                           ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                 IBV_ACCESS_REMOTE_READ
                           : IBV_ACCESS_LOCAL_WRITE;
    if (mr->device && tr->gdr_reg == HC_GDR_REG_DMABUF) {
        int fd;
        uint64_t off;
        size_t alen;
        if (hc_gdr_dmabuf_fd(base, len, &fd, &off, &alen, why, whylen) == 0) {
            mr->e.dmabuf_fd = fd;
            mr->mr = reg_dmabuf(tr, off, len, base, fd, access);
            if (!mr->mr)
                snprintf(why, whylen, "ibv_reg_dmabuf_mr: %s", strerror(errno));
        }
        if (!mr->mr && tr->peermem) {
            /* dma-buf was the first choice, not the only one. */
            HC_INFO(HC_GDR, tr->p.log_rank,
                    "dma-buf registration of %zu bytes failed (%s); nvidia-peermem instead", len,
                    why);
            if (mr->e.dmabuf_fd >= 0)
                close(mr->e.dmabuf_fd);
            mr->e.dmabuf_fd = -1;
            why[0] = '\0';
            mr->mr = reg_plain(tr, base, len, access);
        }
        if (mr->mr)
            hc_tp_count(HC_TP_REG);
        return;
    }
    /* Host memory; device memory through nvidia-peermem. */
    mr->mr = reg_plain(tr, base, len, access);
    /* A read-only send buffer (const, PROT_READ) cannot be pinned
     * writable; the NIC only reads it. Its rkey then allows nothing,
     * which a peer writing to it would learn. */
    if (!mr->mr && errno == EFAULT && kind == HC_MEM_HOST)
        mr->mr = reg_plain(tr, base, len, 0);
    if (mr->mr)
        hc_tp_count(HC_TP_REG);
}

/* Track a handle, so that destroy frees those nobody deregistered. */
static void mr_link(hc_transport_t *tr, hc_mr_t *h)
{
    h->prev = NULL;
    h->next = tr->mrs;
    if (tr->mrs)
        tr->mrs->prev = h;
    tr->mrs = h;
}

/* Register mr->e.base/len, widened first to the whole CUDA allocation for
 * device memory: training loops hand over sub-ranges of one allocation
 * (buckets of a flat gradient buffer, slabs of a caching allocator), and
 * each would otherwise pin (and export) its own pages. Where the whole
 * allocation cannot be registered (BAR space, say), the range alone. */
static void mr_register_range(hc_transport_t *tr, ib_mrent_t *mr, int kind, char *why,
                              size_t whylen)
{
    uintptr_t ab;
    size_t an;
    const uintptr_t b = (uintptr_t)mr->e.base;
    if (kind == HC_MEM_DEVICE && hc_gdr_ptr_range(mr->e.base, &ab, &an) == HCOLL_SUCCESS &&
        ab <= b && b - ab <= an && mr->e.len <= an - (b - ab) && an > mr->e.len) {
        void *want = mr->e.base;
        const size_t wlen = mr->e.len;
        mr->e.base = (void *)ab;
        mr->e.len = an;
        mr_register(tr, mr, kind, why, whylen);
        if (mr->mr)
            return;
        HC_INFO(HC_GDR, tr->p.log_rank,
                "registering the whole allocation of %p (%zu bytes) failed (%s); %zu bytes "
                "only", want, an, why[0] ? why : strerror(errno), wlen);
        if (mr->e.dmabuf_fd >= 0)
            close(mr->e.dmabuf_fd);
        mr->e.dmabuf_fd = -1;
        why[0] = '\0';
        mr->e.base = want;
        mr->e.len = wlen;
    }
    mr_register(tr, mr, kind, why, whylen);
}

/* A fresh cache entry for [base, base+len), registered. */
static hcoll_status_t mrent_new(hc_transport_t *tr, void *base, size_t len, int kind, int dev,
                                uint64_t gen, unsigned flags, ib_mrent_t **out)
{
    if (kind != HC_MEM_HOST && !tr->gdr)
        return mr_refuse(tr, HCOLL_ERR_UNSUPPORTED,
                       "device buffer %p (GPU %d) cannot be registered for the NIC: %s; the "
                       "caller must stage it through host memory",
                       base, dev, tr->gdr_why[0] ? tr->gdr_why : "GPUDirect RDMA disabled");
    if (kind == HC_MEM_MANAGED)
        return mr_refuse(tr, HCOLL_ERR_UNSUPPORTED,
                         "%p is managed memory (GPU %d): neither dma-buf nor nvidia-peermem pins "
                         "it; the caller must stage it through host memory",
                         base, dev);
    ib_mrent_t *mr = calloc(1, sizeof *mr);
    if (!mr)
        return mr_refuse(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
    mr->e.base = base;
    mr->e.len = len;
    mr->e.gen = gen;
    mr->e.flags = flags;
    mr->e.dmabuf_fd = -1;
    mr->device = kind != HC_MEM_HOST;
    char why[200] = "";
    mr_register_range(tr, mr, kind, why, sizeof why);
    if (!mr->mr) {
        int e = errno;
        if (mr->e.dmabuf_fd >= 0)
            close(mr->e.dmabuf_fd);
        free(mr);
        return mr_refuse(tr, HCOLL_ERR_RDMA,
                         "registering %zu bytes of %s memory at %p failed (%s%s%s)%s", len,
                         kind == HC_MEM_HOST ? "host" : "device", base,
                         why[0] ? why : strerror(e), kind == HC_MEM_HOST ? "" : ", via ",
                         kind == HC_MEM_HOST ? "" : hc_gdr_reg_name(tr->gdr_reg),
                         kind == HC_MEM_HOST && (e == ENOMEM || e == EPERM)
                             ? "; the locked-memory limit (`ulimit -l`, RLIMIT_MEMLOCK) is "
                               "too low for it"
                             : "");
    }
    mr->e.handle = mr->mr;
    *out = mr;
    return HCOLL_SUCCESS;
}

/* Is the allocation an idle entry registered still there? Its first
 * address must still carry its CUDA buffer id. */
static int mr_alive(void *ctx, const hc_mrc_entry_t *e)
{
    (void)ctx;
    return hc_gdr_ptr_buffer_id(e->base) == e->gen;
}

/* A handle on [base, base+len) in an entry that allows flags: the cache's,
 * or a fresh registration (not sticky on failure: the caller decides). */
static hcoll_status_t mr_get(hc_transport_t *tr, void *base, size_t len, int kind, int dev,
                             unsigned flags, hc_mr_t **out)
{
    hcoll_status_t st;
    hc_mr_t *h = calloc(1, sizeof *h);
    if (!h)
        return mr_refuse(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
    h->base = base;
    h->len = len;
    /* CUDA's allocation id (device memory, and the host memory CUDA
     * allocated: the device path's pinned staging), so that a buffer freed
     * and reallocated at the same address never finds the old entry. */
    uint64_t gen = hc_gdr_cuda_in_process() ? hc_gdr_ptr_buffer_id(base) : 0;
    ib_mrent_t *mr = (ib_mrent_t *)hc_mrc_find_flags(&tr->mrc, base, len, gen, flags);
    hc_tp_count(mr ? HC_TP_CACHE_HIT : HC_TP_CACHE_MISS);
    if (!mr) {
        /* A registration costs far more than asking CUDA about the few
         * idle entries: drop those of freed buffers before adding one. */
        if (hc_gdr_cuda_in_process())
            hc_mrc_sweep(&tr->mrc, mr_alive, NULL);
        HC_CHECK(mrent_new(tr, base, len, kind, dev, gen, flags, &mr), clean_handle);
        hc_mrc_insert(&tr->mrc, &mr->e);
    }
    h->ent = mr;
    mr_link(tr, h);
    *out = h;
    return HCOLL_SUCCESS;

clean_handle:
    free(h);
    return st;
}

hcoll_status_t ib_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                         hc_rkey_t *rkey_out)
{
    if (tr->err)
        return tr->err;
    int dev = -1;
    /* Only a process that loaded CUDA can hold device memory: a host-only
     * job must not pay for (or be changed by) cuInit. */
    int kind = hc_gdr_cuda_in_process() ? hc_gdr_ptr_kind(base, &dev) : HC_MEM_HOST;
    /* No rkey asked for: a send buffer, registered for local access only. */
    hcoll_status_t st = mr_get(tr, base, len, kind, dev, rkey_out ? HC_MRC_REMOTE : 0, mr_out);
    if (st != HCOLL_SUCCESS)
        return st;
    if (rkey_out) {
        /* The peer adds its offsets to the address the caller registered. */
        rkey_out->w[0] = (uintptr_t)base;
        rkey_out->w[1] = (*mr_out)->ent->mr->rkey;
    }
    return HCOLL_SUCCESS;
}

void ib_mr_dereg(hc_transport_t *tr, hc_mr_t *h)
{
    if (!h)
        return;
    if (h->prev)
        h->prev->next = h->next;
    else
        tr->mrs = h->next;
    if (h->next)
        h->next->prev = h->prev;
    hc_mrc_release(&tr->mrc, &h->ent->e);
    free(h);
}

void ib_mr_free_handles(hc_transport_t *tr)
{
    while (tr->mrs) {
        hc_mr_t *h = tr->mrs;
        tr->mrs = h->next;
        free(h);
    }
}

/*
 * A user's registered range (hcoll_mem_register): an entry of the cache
 * held by this handle, so that every operation inside it hits the cache
 * (host entries otherwise go with their last user). Registered for remote
 * access, as the range may receive. Not sticky on failure: the application
 * may fall back to per-operation registration.
 */
hcoll_status_t ib_mem_pin(hc_transport_t *tr, void *base, size_t len, hc_mr_t **pin_out)
{
    if (tr->err)
        return tr->err;
    int dev = -1;
    int kind = hc_gdr_cuda_in_process() ? hc_gdr_ptr_kind(base, &dev) : HC_MEM_HOST;
    if (kind != HC_MEM_HOST && (!tr->gdr || kind == HC_MEM_MANAGED)) {
        *pin_out = NULL; /* staged through hcoll's own memory: never registered */
        return HCOLL_SUCCESS;
    }
    return mr_get(tr, base, len, kind, dev, HC_MRC_REMOTE, pin_out);
}

void ib_mem_unpin(hc_transport_t *tr, hc_mr_t *pin)
{
    ib_mr_dereg(tr, pin);
}

/* A held (refs > 0) remote-access host entry covering the range: the
 * cache's own test, without taking a reference or counting a hit. */
int ib_mem_pinned(hc_transport_t *tr, const void *base, size_t len)
{
    const char *b = base;
    for (const hc_mrc_entry_t *e = tr->mrc.list; e; e = e->next) {
        const char *eb = e->base;
        if (e->refs > 0 && e->gen == 0 && (e->flags & HC_MRC_REMOTE) && b >= eb &&
            len <= e->len && (size_t)(b - eb) <= e->len - len)
            return 1;
    }
    return 0;
}

#endif /* HCOLL_BUILD_VERBS */
