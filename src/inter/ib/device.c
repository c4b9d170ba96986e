/*
 * Which NIC a rank uses and what it may do with it: the verbs settings
 * taken from the communicator's parameters, the port choice (local rank i
 * takes the i-th allowed ACTIVE port, among those nearest its GPU), the
 * device opened on that port, and the GPUDirect decision for the rank's
 * GPU and that NIC (PCI distance within HCOLL_NET_GDR_LEVEL, dma-buf or
 * nvidia-peermem, flush reads unless the GPU orders the NIC's writes, and
 * always behind a C2C link with the NIC on the GPU's PCIe switch).
 */
#include "inter/ib/ib_priv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "base/log.h"
#include "gdr/gdr.h"
#include "sys/pci.h"

void hc_ib_config_from_params(const hc_params_t *p, hc_ib_config_t *cfg_out)
{
    hc_ib_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.sysfs_root, sizeof c.sysfs_root, "%s", p->sysfs_root[0] ? p->sysfs_root : "/");
    snprintf(c.hca, sizeof c.hca, "%s", p->ib_hca);
    c.gid_index = (long)p->ib_gid_index;
    c.tc = (int)p->ib_tc;
    c.sl = (int)p->ib_sl;
    c.timeout = (int)p->ib_timeout;
    c.retry_cnt = (int)p->ib_retry_cnt;
    c.gdr_level = p->gdr_level;
    c.gdr_flush = p->gdr_flush;
    c.spin_us = (int)p->ib_spin_us;
    /* The table's bounds; settings made by hand (tests) may leave it 0. */
    c.qps_per_peer = p->ib_qps_per_peer < 1 ? 1 : p->ib_qps_per_peer > 4 ? 4 : (int)p->ib_qps_per_peer;
    c.relaxed_ordering = (int)p->ib_relaxed_ordering;
    *cfg_out = c;
}

#if HCOLL_BUILD_VERBS

/* The sysfs path of GPU gpu's PCI device, or NULL (no GPU, no driver). */
static const char *gpu_pci_path(const hc_ib_config_t *cfg, int gpu, char *path, size_t len)
{
    char bdf[64];
    if (gpu >= 0 && hc_gdr_gpu_info(gpu, bdf, sizeof bdf, NULL, NULL) == 0 &&
        hc_pci_bdf_path(cfg->sysfs_root, bdf, path, len) == 0)
        return path;
    return NULL;
}


int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, int gpu, hc_ib_choice_t *choice_out,
                 char *why, size_t whylen)
{
    if (!hc_ib_verbs_loadable(why, whylen))
        return 0;
    char gpu_path[HC_PCI_PATH_MAX];
    const char *gp = gpu_pci_path(cfg, gpu, gpu_path, sizeof gpu_path);
    hc_ib_choice_t c;
    if (hc_ibdev_for_rank(cfg->sysfs_root, cfg->hca, local_rank, gp, cfg->gid_index, 0, &c, why,
                          whylen) != HCOLL_SUCCESS)
        return 0;
    if (choice_out)
        *choice_out = c;
    return 1;
}

static struct ibv_context *device_open(const ib_verbs_t *v, const char *name, int *ndev_out)
{
    int n = 0;
    struct ibv_device **list = v->get_device_list(&n);
    *ndev_out = list ? n : 0;
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n && !ctx; i++)
        if (strcmp(v->get_device_name(list[i]), name) == 0)
            ctx = v->open_device(list[i]);
    if (list)
        v->free_device_list(list);
    return ctx;
}

hcoll_status_t ib_dev_open(hc_transport_t *tr)
{
    const hc_ib_config_t *cfg = &tr->cfg;
    uint32_t prefer_ip = 0;
    if (tr->bind_addr[0])
        inet_pton(AF_INET, tr->bind_addr, &prefer_ip);
    char gpu_path[HC_PCI_PATH_MAX], err[256];
    const char *gp = gpu_pci_path(cfg, tr->gpu, gpu_path, sizeof gpu_path);
    if (hc_ibdev_for_rank(cfg->sysfs_root, cfg->hca, tr->local_rank, gp, cfg->gid_index,
                          prefer_ip, &tr->choice, err, sizeof err) != HCOLL_SUCCESS)
        return ib_fail(tr, HCOLL_ERR_RDMA, "%s", err);
    int ndev = 0;
    tr->ctx = device_open(tr->v, tr->choice.port.dev, &ndev);
    if (!tr->ctx)
        return ib_fail(tr, HCOLL_ERR_RDMA,
                       "sysfs lists %s but libibverbs cannot open it (%d verbs device(s); is the "
                       "provider library, e.g. libmlx5, installed? errno %d)",
                       tr->choice.port.dev, ndev, errno);
    if (ib_port_query(tr->v, tr->ctx, (uint8_t)tr->choice.port.port, &tr->pattr) != 0 ||
        tr->pattr.state != IBV_PORT_ACTIVE)
        return ib_fail(tr, HCOLL_ERR_RDMA, "port %d is not ACTIVE according to ibv_query_port",
                       tr->choice.port.port);
    tr->roce = tr->pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
    tr->choice.port.active_mtu = hc_ib_mtu_bytes(tr->pattr.active_mtu);
    if (tr->v->query_gid(tr->ctx, (uint8_t)tr->choice.port.port, tr->choice.gid_index,
                         &tr->gid) != 0)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_query_gid(index %d) failed",
                       tr->choice.gid_index);
    tr->pd = tr->v->alloc_pd(tr->ctx);
    if (!tr->pd)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_alloc_pd failed (errno %d)", errno);
    /* Progress reads the async events between sweeps: never block there. */
    int fl = fcntl(tr->ctx->async_fd, F_GETFL);
    tr->async_ok = tr->v->get_async_event && tr->v->ack_async_event && fl >= 0 &&
                   fcntl(tr->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0;
    if (!tr->async_ok)
        HC_WARN(HC_NET, tr->p.log_rank, "NET/IB: the NIC's async events cannot be read: port "
                "and QP errors will show only as failed completions");
    return HCOLL_SUCCESS;
}

/* ---- GPUDirect -------------------------------------------------------------- */

/* dma-buf import on this NIC and kernel, asked as NCCL asks: a registration
 * of nothing from fd -1 answers EOPNOTSUPP or EPROTONOSUPPORT where import
 * is missing (a kernel before 5.12, a driver without it), EBADF where it
 * exists. The kernel's version alone says nothing about the NIC's driver. */
static int dmabuf_probe(hc_transport_t *tr, char *why, size_t len)
{
    if (!tr->v->reg_dmabuf_mr) {
        snprintf(why, len, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)");
        return 0;
    }
    errno = 0;
    struct ibv_mr *mr = tr->v->reg_dmabuf_mr(tr->pd, 0, 0, 0, -1, 0);
    int e = errno;
    if (mr) {
        tr->v->dereg_mr(mr);
        return 1;
    }
    if (e == EOPNOTSUPP || e == EPROTONOSUPPORT) {
        snprintf(why, len, "%s refuses dma-buf registration (%s)", tr->choice.port.dev,
                 strerror(e));
        return 0;
    }
    return 1;
}

void ib_gdr_decide(hc_transport_t *tr)
{
    const hc_ib_config_t *c = &tr->cfg;
    const int gpu = tr->gpu;
    char bdf[64] = "", gpu_path[HC_PCI_PATH_MAX], nic_path[HC_PCI_PATH_MAX];
    int cc = 0, gpu_dmabuf = 0;
    if (gpu < 0) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "no GPU for this rank (none was current at hcoll_comm_init)");
        HC_INFO(HC_GDR, tr->p.log_rank, "GPU Direct RDMA Disabled: %s", tr->gdr_why);
        return;
    }
    if (hc_gdr_gpu_info(gpu, bdf, sizeof bdf, &cc, &gpu_dmabuf) != 0 ||
        hc_pci_bdf_path(c->sysfs_root, bdf, gpu_path, sizeof gpu_path) != 0 ||
        hc_pci_ibdev_path(c->sysfs_root, tr->choice.port.dev, nic_path, sizeof nic_path) != 0) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why, "PCI path of GPU %d (%s) or of %s unknown",
                 gpu, bdf[0] ? bdf : "?", tr->choice.port.dev);
        HC_INFO(HC_GDR, tr->p.log_rank, "GPU Direct RDMA Disabled: %s", tr->gdr_why);
        return;
    }
    int dist = hc_pci_distance(c->sysfs_root, gpu_path, nic_path);
    char line[200];
    if (!hc_gdr_level_allows(dist, c->gdr_level, gpu, tr->choice.port.dev, tr->p.log_rank, line,
                             sizeof line)) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why, "%s", line);
        return;
    }
    hc_gdr_caps_t caps;
    hc_gdr_probe(c->sysfs_root, &caps);
    tr->peermem = caps.peermem;
    char dwhy[160] = "";
    tr->dmabuf_ok = dmabuf_probe(tr, dwhy, sizeof dwhy);
    caps.dmabuf_kernel = tr->dmabuf_ok; /* the probe answers for kernel and NIC both */
    tr->gdr_reg = hc_gdr_reg_choose(&caps, gpu_dmabuf, tr->v->reg_dmabuf_mr != NULL);
    if (tr->gdr_reg == HC_GDR_REG_STAGING) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "GPU %d / HCA %.64s: neither dma-buf (GPU %s; NIC: %.160s) nor nvidia-peermem "
                 "available",
                 gpu, tr->choice.port.dev, gpu_dmabuf ? "yes" : "no",
                 dwhy[0] ? dwhy : "yes");
        HC_INFO(HC_GDR, tr->p.log_rank, "%s: host staging", tr->gdr_why);
        return;
    }
    tr->gdr = 1;
    const int ordering = hc_gdr_rdma_ordering(gpu);
    const int c2c = hc_gdr_gpu_c2c(gpu);
    tr->flush = hc_gdr_flush_decide_path(c->gdr_flush, cc, ordering, c2c, dist);
    HC_INFO(HC_GDR, tr->p.log_rank,
            "GPU %d (%s, sm_%d): registration through %s, flush %s (RDMA write ordering %s, "
            "GPU-CPU link %s, GPU-NIC %s)",
            gpu, bdf, cc * 10, hc_gdr_reg_name(tr->gdr_reg), tr->flush ? "on" : "off",
            ordering < 0 ? "unknown" : ordering >= 200 ? "all devices" : ordering >= 100 ? "owner"
                                                                                   : "none",
            c2c == 1 ? "C2C" : c2c == 0 ? "PCIe" : "unknown", hc_pci_dist_name(dist));
}

#else /* !HCOLL_BUILD_VERBS */

int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, int gpu, hc_ib_choice_t *choice_out,
                 char *why, size_t whylen)
{
    (void)cfg;
    (void)local_rank;
    (void)gpu;
    (void)choice_out;
    return hc_ib_verbs_loadable(why, whylen);
}

#endif
