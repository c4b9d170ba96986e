/*
 * hcoll_info: what a cluster user runs first. Prints the library version
 * and build options and every HCOLL_* knob with its value in force.
 *
 *   hcoll_info            everything
 *   hcoll_info --env      the knob table only
 *   hcoll_info --build    version and build options only
 *   hcoll_info --rdma     RDMA devices, ports, GIDs and GPUDirect only
 *   --sysfs-root DIR      read sysfs/proc under DIR (a fixture tree)
 *   hcoll_info --memreg [MIB [N]]   count registrations: two ranks of this
 *                         host all-reduce N times a registered buffer of
 *                         MIB MiB (64, 100) over HCOLL_NET's transport
 *   hcoll_info --tune [NP [RPN]]   measure the all-reduce crossover between
 *                         recursive doubling and the ring on this machine:
 *                         hcoll_perf -np NP (4) --ranks-per-node RPN (2),
 *                         1 KiB..1 MiB, under HCOLL_ALGO=rd and =ring,
 *                         alternately, twice; then the broadcast's between
 *                         the tree and the chain (broadcast=tree, =chain)
 *                         alike; prints the tables and the HCOLL_ALGO line
 *                         that reproduces the choice
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/config.h"
#include "core/algo.h"
#include "base/reduce.h"
#include "gdr/gdr.h"
#include "inter/ib/ib.h"
#include "sys/envlist.h"
#include "sys/ibdev.h"
#include "sys/pci.h"
#include "hc_build.h"
#include "hcoll.h"

static void print_build(void)
{
    int v = hcoll_version();
    printf("hcoll %d.%d.%d (header %s)\n", v / 10000, v / 100 % 100, v % 100,
           HCOLL_VERSION_STRING);
    if (v != HCOLL_VERSION_CODE)
        printf("  WARNING: the library loaded is not the one this program was built with\n");
    printf("Build options:\n");
    printf("  CUDA     %s (CUDA_HOME %s)\n", HCOLL_BUILD_CUDA ? "found" : "not found",
           HCOLL_BUILD_CUDA_HOME);
    printf("  NCCL     %s\n", HCOLL_BUILD_NCCL ? "found" : "not found");
    printf("  verbs    %s\n", HCOLL_BUILD_VERBS ? "headers found" : "not found");
    printf("  rdmacm   %s\n", HCOLL_BUILD_RDMACM ? "headers found" : "not found");
    printf("  host reduction kernels: %s\n", hc_reduce_impl_name());
}

static const char *kind_name(hc_knob_kind_t k)
{
    switch (k) {
    case HC_KNOB_INT: return "int";
    case HC_KNOB_SIZE: return "size";
    case HC_KNOB_ENUM: return "choice";
    case HC_KNOB_STR: return "string";
    case HC_KNOB_LIST: return "list";
    case HC_KNOB_SUBSYS: return "list";
    }
    return "?";
}

/* Returns the number of variables whose current value is malformed. */
static int print_env(void)
{
    size_t n;
    const hc_knob_t *k = hc_knobs(&n);
    int bad = 0;
    printf("Environment (HCOLL_*; an explicit hcoll_config_t field wins over these):\n");
    for (size_t i = 0; i < n; i++) {
        int from_env;
        const char *v = hc_knob_current(&k[i], &from_env);
        char err[256] = "";
        int ok = !from_env || hc_knob_parse(&k[i], v, NULL, err, sizeof err) == HCOLL_SUCCESS;
        const char *shown = k[i].secret && from_env ? "(set, hidden)" : (v[0] ? v : "(unset)");
        printf("  %-22s = %-16s %s [%s, default %s]\n", k[i].name, shown,
               from_env ? "(env)    " : "(default)", kind_name(k[i].kind),
               k[i].defval[0] ? k[i].defval : "unset");
        printf("      %s\n", k[i].help);
        if (!ok) {
            printf("      ERROR: %s\n", err);
            bad++;
        }
    }
    return bad;
}

/* What the verbs transport would find on this host (or fixture tree). */
static void print_rdma(const char *root)
{
    hc_params_t p;
    char err[300];
    if (hc_params_load(&p, NULL, err, sizeof err) != HCOLL_SUCCESS) {
        printf("RDMA: cannot read the HCOLL_IB_* settings: %s\n", err);
        return;
    }
    char why[300] = "";
    int verbs = hc_ib_verbs_loadable(why, sizeof why);
    printf("RDMA devices (sysfs root %s; libibverbs %s%s%s):\n", root,
           verbs ? "loadable" : "not loadable", verbs ? "" : ": ", verbs ? "" : why);
    hc_ibport_t ports[HC_IBDEV_MAX_PORTS];
    int n = hc_ibdev_scan(root, ports, HC_IBDEV_MAX_PORTS);
    if (n == 0)
        printf("  none found (no ports under sys/class/infiniband)\n");
    double node_gbps = 0;
    hc_list_t list;
    int have_list = hc_list_parse(p.ib_hca, &list, err, sizeof err) == HCOLL_SUCCESS;
    for (int i = 0; i < n; i++) {
        const hc_ibport_t *q = &ports[i];
        char pci[HC_PCI_PATH_MAX] = "";
        if (hc_pci_ibdev_path(root, q->dev, pci, sizeof pci) != 0)
            snprintf(pci, sizeof pci, "(no PCI device)");
        int sel = q->active && have_list && hc_list_match(&list, q->dev, q->port);
        printf("  %s:%d  %-10s %-5s rate %-22s MTU %s  %s%s\n", q->dev, q->port,
               q->state[0] ? q->state : "?", hc_ib_link_name(q->link_layer),
               q->rate[0] ? q->rate : "?", "(verbs only)", pci,
               sel ? "" : "  [not used: not ACTIVE or excluded by HCOLL_IB_HCA]");
        if (sel)
            node_gbps += q->rate_gbps;
        hc_gid_entry_t g[HC_IBDEV_MAX_GIDS];
        int ng = hc_ibdev_gids(root, q->dev, q->port, g, HC_IBDEV_MAX_GIDS);
        int idx = -1;
        hc_gid_entry_t chosen;
        char gwhy[300] = "";
        int ok = hc_ibdev_gid_choose(root, q->dev, q->port, q->link_layer, (long)p.ib_gid_index,
                                     0, &idx, &chosen, gwhy, sizeof gwhy) == HCOLL_SUCCESS;
        for (int k = 0; k < ng; k++) {
            char t[64];
            hc_gid_format(g[k].raw, t, sizeof t);
            printf("      GID %3d  %-40s %-8s%s\n", g[k].index, t, hc_gid_type_name(g[k].type),
                   ok && g[k].index == idx ? "  <- chosen" : "");
        }
        printf("      GID choice: %s\n", ok ? gwhy : gwhy[0] ? gwhy : "none");
    }
    if (n)
        printf("  line rate of the selected ports: %.0f Gb/s\n", node_gbps);
    for (int r = 0; r < 2 && n; r++) {
        hc_ib_choice_t c;
        if (hc_ibdev_for_rank(root, p.ib_hca, r, NULL, (long)p.ib_gid_index, 0, &c, err,
                              sizeof err) == HCOLL_SUCCESS)
            printf("  local rank %d -> [%d]%s:%d/%s (%d selected)\n", r, c.index, c.port.dev,
                   c.port.port, hc_ib_link_name(c.port.link_layer), c.nselected);
        else
            printf("  local rank %d: %s\n", r, err);
    }

    hc_gdr_caps_t caps;
    hc_gdr_probe(root, &caps);
    char cwhy[200] = "";
    int cuda = hc_gdr_cuda_available(cwhy, sizeof cwhy);
    printf("GPUDirect RDMA:\n");
    printf("  nvidia-peermem  %s%s\n", caps.peermem ? "loaded, " : "not loaded",
           caps.peermem ? caps.peermem_how : "");
    printf("  dma-buf         kernel %s (%s)\n", caps.dmabuf_kernel ? "supports it" : "too old or unknown",
           caps.kernel[0] ? caps.kernel : "osrelease unreadable");
    printf("  CUDA driver     %s%s\n", cuda ? "loaded" : "none: ", cuda ? "" : cwhy);
    printf("  HCOLL_NET_GDR_LEVEL %s, HCOLL_GDR_FLUSH %lld\n", hc_pci_dist_name(p.gdr_level),
           (long long)p.gdr_flush);
    if (!cuda) {
        printf("  no GPU: registration would use host memory only\n");
        return;
    }
    for (int d = 0; d < 16; d++) {
        char bdf[64] = "", gpath[HC_PCI_PATH_MAX];
        int cc = 0, gdmabuf = 0;
        if (hc_gdr_gpu_info(d, bdf, sizeof bdf, &cc, &gdmabuf) != 0)
            break;
        hc_ib_choice_t c;
        int have_path = hc_pci_bdf_path(root, bdf, gpath, sizeof gpath) == 0;
        if (hc_ibdev_for_rank(root, p.ib_hca, d, have_path ? gpath : NULL, (long)p.ib_gid_index, 0,
                              &c, err, sizeof err) != HCOLL_SUCCESS) {
            printf("  GPU %d (%s): %s\n", d, bdf, err);
            continue;
        }
        char line[200];
        int on = c.port.pci_dist >= 0 &&
                 hc_gdr_level_allows(c.port.pci_dist, p.gdr_level, d, c.port.dev, -1, line,
                                     sizeof line);
        if (c.port.pci_dist < 0)
            snprintf(line, sizeof line, "GPU %d: PCI path unknown, GPU Direct RDMA Disabled", d);
        int reg = hc_gdr_reg_choose(&caps, gdmabuf, verbs);
        const int ord = hc_gdr_rdma_ordering(d);
        printf("  %s; registration %s; flush %s (sm_%d, RDMA write ordering %d)\n", line,
               on ? hc_gdr_reg_name(reg) : "host staging",
               hc_gdr_flush_decide(p.gdr_flush, cc, ord) ? "on" : "off", cc * 10, ord);
    }
}

/* One rank of the --memreg probe; rank 0 prints. Returns 0 or 1. */
static int memreg_rank(int rank, const hcoll_unique_id_t *id, size_t mib, int iters)
{
    char host[96];
    snprintf(host, sizeof host, "hcoll-info-memreg-%d-node%d", (int)(rank ? getppid() : getpid()),
             rank);
    setenv("HCOLL_HOSTID", host, 1); /* two nodes: the ring crosses the transport */
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    hcoll_comm_t comm = NULL;
    const size_t count = mib * ((size_t)1 << 20) / sizeof(int32_t);
    int32_t *buf = calloc(count ? count : 1, sizeof *buf);
    hcoll_mem_t h = NULL;
    hcoll_rdma_counters_t c0 = HCOLL_RDMA_COUNTERS_INITIALIZER;
    hcoll_rdma_counters_t c1 = c0, c2 = c0;
    hcoll_status_t st = buf ? hcoll_comm_init(&comm, 2, rank, id, &cfg) : HCOLL_ERR_NO_MEMORY;
    if (st == HCOLL_SUCCESS) {
        hcoll_rdma_counters(&c0);
        st = hcoll_mem_register(comm, buf, count * sizeof *buf, &h);
        hcoll_rdma_counters(&c1);
    }
    for (int i = 0; st == HCOLL_SUCCESS && i < iters; i++)
        st = hcoll_allreduce(comm, buf, buf, count, HCOLL_INT32, HCOLL_MAX, NULL);
    hcoll_rdma_counters(&c2);
    if (st != HCOLL_SUCCESS)
        fprintf(stderr, "hcoll_info --memreg: rank %d: %s (%s)\n", rank,
                hcoll_status_name(st), comm ? hcoll_comm_last_error(comm) : "init");
    hcoll_mem_deregister(comm, h);
    hcoll_comm_destroy(comm);
    free(buf);
    if (rank == 0 && st == HCOLL_SUCCESS) {
        const char *net = getenv("HCOLL_NET");
        printf("Registrations (hcoll_rdma_counters, rank 0 of 2 on this host, HCOLL_NET=%s)\n",
               net ? net : "auto");
        printf("  hcoll_mem_register of %zu MiB: %llu registration(s)\n", mib,
               (unsigned long long)(c1.registrations - c0.registrations));
        printf("  %d all-reduces in it: %llu registration(s), %llu cache hit(s), %llu "
               "miss(es)\n",
               iters, (unsigned long long)(c2.registrations - c1.registrations),
               (unsigned long long)(c2.cache_hits - c1.cache_hits),
               (unsigned long long)(c2.cache_misses - c1.cache_misses));
        printf("  process total: %llu registration(s), %llu deregistration(s), %llu cache "
               "hit(s), %llu miss(es)\n",
               (unsigned long long)c2.registrations, (unsigned long long)c2.deregistrations,
               (unsigned long long)c2.cache_hits, (unsigned long long)c2.cache_misses);
    }
    return st == HCOLL_SUCCESS ? 0 : 1;
}

static int memreg_probe(size_t mib, int iters)
{
    hcoll_unique_id_t id;
    if (hcoll_get_unique_id(&id) != HCOLL_SUCCESS) {
        fprintf(stderr, "hcoll_info --memreg: %s\n", hcoll_comm_last_error(NULL));
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("hcoll_info --memreg: fork");
        return 1;
    }
    if (pid == 0)
        _exit(memreg_rank(1, &id, mib, iters));
    int bad = memreg_rank(0, &id, mib, iters), ws = 0;
    if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        bad = 1;
    return bad;
}

/* ------------------------------------------------------------------------ */
/* --tune                                                                     */
/* ------------------------------------------------------------------------ */

#define TUNE_SIZES 6 /* 1K 4K 16K 64K 256K 1M */
#define TUNE_BCAST_SIZES 8 /* and 4M 16M: where the chain's S/L per NIC tells */
#define TUNE_REPS 2

/* One hcoll_perf sweep of collective coll under HCOLL_ALGO=algo: per size,
 * the mean of its out-of-place and in-place times (us) into us[], keeping
 * the minimum. */
static int tune_sweep(const char *perf, const char *coll, const char *algo, int np, int rpn,
                      int nsizes, double *us)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd,
             "HCOLL_ALGO=%s '%s' -np %d --ranks-per-node %d -o %s -b 1K -e %lluK -f 4 -n %d "
             "-w 10 -c 0 2>/dev/null",
             algo, perf, np, rpn, coll, 1ull << (2 * (nsizes - 1)), nsizes > TUNE_SIZES ? 30 : 100);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    char line[1024];
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long bytes;
        double oop, ip;
        char skip[6][32];
        /* size count type coll redop impl | time algbw busbw #wrong | time ... */
        if (sscanf(line, " %llu %31s %31s %31s %31s %31s %lf %31s %31s %31s %lf", &bytes,
                   skip[0], skip[1], skip[2], skip[3], skip[4], &oop, skip[5], skip[5], skip[5],
                   &ip) != 11)
            continue;
        for (int k = 0; k < nsizes; k++)
            if (bytes == (1024ull << (2 * k))) {
                double t = (oop + ip) / 2;
                if (us[k] < 0 || t < us[k])
                    us[k] = t;
                rows++;
            }
    }
    int rc = pclose(f);
    return rc == 0 && rows == nsizes ? 0 : -1;
}

/* The broadcast's sweeps: the tree against the chain, as the all-reduce's;
 * prints the table and its crossover into *cross_out. */
static int tune_bcast(const char *perf, int np, int rpn, uint64_t *cross_out)
{
    double tree[TUNE_BCAST_SIZES], chain[TUNE_BCAST_SIZES];
    for (int k = 0; k < TUNE_BCAST_SIZES; k++)
        tree[k] = chain[k] = -1;
    printf("# broadcast, root 0, 1 KiB..16 MiB, the same way\n");
    fflush(stdout);
    for (int r = 0; r < TUNE_REPS; r++)
        if (tune_sweep(perf, "broadcast", "broadcast=tree", np, rpn, TUNE_BCAST_SIZES, tree) ||
            tune_sweep(perf, "broadcast", "broadcast=chain", np, rpn, TUNE_BCAST_SIZES, chain))
            return -1;
    uint64_t cross = 0;
    printf("#%11s  %10s  %10s  %8s  %s\n", "size (B)", "tree (us)", "chain (us)", "chain/tree",
           "faster");
    for (int k = 0; k < TUNE_BCAST_SIZES; k++) {
        const uint64_t b = 1024ull << (2 * k);
        if (tree[k] <= chain[k])
            cross = b;
        printf("%12llu  %10.1f  %10.1f  %8.2f  %s\n", (unsigned long long)b, tree[k], chain[k],
               chain[k] / tree[k], tree[k] <= chain[k] ? "tree" : "chain");
    }
    const int nodes = np / rpn;
    const uint64_t dflt = hc_algo_default_bcast_max(
        nodes == 1 ? HC_PLAN_INTRA : rpn == 1 ? HC_PLAN_RING : HC_PLAN_3STAGE, nodes, rpn);
    printf("# crossover: the tree up to %llu bytes (the built-in table says %llu for this "
           "layout)\n",
           (unsigned long long)cross, (unsigned long long)dflt);
    *cross_out = cross;
    return 0;
}

/* What HCOLL_ALGO=auto chooses here: the probe's figures and limits, as
 * rank 0 logs them at init (core/algo_model.c). */
static void tune_model(const char *perf, int np, int rpn)
{
    char cmd[4400], line[1024];
    snprintf(cmd, sizeof cmd,
             "HCOLL_ALGO=auto HCOLL_DEBUG=info HCOLL_DEBUG_SUBSYS=INIT '%s' -np %d "
             "--ranks-per-node %d -b 4K -e 4K -n 1 -w 0 -c 0 2>&1",
             perf, np, rpn);
    FILE *f = popen(cmd, "r");
    if (!f)
        return;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        const char *m = strstr(line, "all-reduce model");
        if (m && !found++)
            printf("# HCOLL_ALGO=auto: %s", m);
    }
    pclose(f);
    if (!found)
        printf("# HCOLL_ALGO=auto: no model line (HCOLL_ALGO_MODEL=table, or one node)\n");
}

static int tune(int np, int rpn)
{
    char self[4096], perf[4096 + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return fprintf(stderr, "hcoll_info: --tune: cannot find this program\n"), 1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(perf, sizeof perf, "%s/hcoll_perf", slash ? self : ".");
    if (access(perf, X_OK) != 0)
        return fprintf(stderr, "hcoll_info: --tune needs %s\n", perf), 1;
    double rd[TUNE_SIZES], ring[TUNE_SIZES];
    for (int k = 0; k < TUNE_SIZES; k++)
        rd[k] = ring[k] = -1;
    printf("# hcoll_info --tune: all-reduce float32 sum, %d ranks, %d per emulated node, over "
           "%s; us per call (mean of out of place and in place, best of %d runs alternating)\n",
           np, rpn, "HCOLL_NET's transport on loopback", TUNE_REPS);
    fflush(stdout);
    for (int r = 0; r < TUNE_REPS; r++)
        if (tune_sweep(perf, "allreduce", "rd", np, rpn, TUNE_SIZES, rd) ||
            tune_sweep(perf, "allreduce", "ring", np, rpn, TUNE_SIZES, ring))
            return fprintf(stderr, "hcoll_info: --tune: hcoll_perf failed\n"), 1;
    uint64_t cross = 0;
    printf("#%11s  %10s  %10s  %8s  %s\n", "size (B)", "rd (us)", "ring (us)", "ring/rd",
           "faster");
    for (int k = 0; k < TUNE_SIZES; k++) {
        const uint64_t b = 1024ull << (2 * k);
        if (rd[k] <= ring[k])
            cross = b;
        printf("%12llu  %10.1f  %10.1f  %8.2f  %s\n", (unsigned long long)b, rd[k], ring[k],
               ring[k] / rd[k], rd[k] <= ring[k] ? "rd" : "ring");
    }
    const int nodes = np / rpn;
    const uint64_t dflt = hc_algo_default_rd_max(
        nodes == 1 ? HC_PLAN_INTRA : rpn == 1 ? HC_PLAN_RING : HC_PLAN_3STAGE, nodes, rpn);
    printf("# crossover: rd up to %llu bytes (the built-in table says %llu for this layout)\n",
           (unsigned long long)cross, (unsigned long long)dflt);
    tune_model(perf, np, rpn);
    uint64_t bcross = 0;
    if (tune_bcast(perf, np, rpn, &bcross) != 0)
        return fprintf(stderr, "hcoll_info: --tune: hcoll_perf failed\n"), 1;
    char ar[64], bc[64];
    if (cross == 0)
        snprintf(ar, sizeof ar, "allreduce=ring");
    else
        snprintf(ar, sizeof ar, "allreduce=rd:%lluK", (unsigned long long)(cross >> 10));
    if (bcross == 0)
        snprintf(bc, sizeof bc, "broadcast=chain");
    else
        snprintf(bc, sizeof bc, "broadcast=tree:%lluK", (unsigned long long)(bcross >> 10));
    printf("HCOLL_ALGO=%s,%s\n", ar, bc);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: hcoll_info [--env | --build | --rdma | --help] [--sysfs-root DIR]\n"
               "       hcoll_info --memreg [MIB [N]]\n"
               "       hcoll_info --tune [NP [RPN]]\n"
               "  --env     every HCOLL_* knob with its value, default and help\n"
               "  --build   library version and build options\n"
               "  --rdma    RDMA devices, ports, rates, GIDs, NIC per local rank, GPUDirect\n"
               "  --sysfs-root DIR  read /sys and /proc under DIR (a fixture tree)\n"
               "  --memreg  count registrations: two ranks of this host all-reduce N times\n"
               "            (100) a registered buffer of MIB MiB (64) over HCOLL_NET\n"
               "  --tune [NP [RPN]]  measure the all-reduce crossover between recursive\n"
               "            doubling and the ring, and the broadcast's between the tree and\n"
               "            the chain, with hcoll_perf -np NP (4) --ranks-per-node RPN (2);\n"
               "            prints the tables and the HCOLL_ALGO line for them\n");
}

int main(int argc, char **argv)
{
    int env = 0, build = 0, rdma = 0;
    const char *root = "/";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--env") == 0)
            env = 1;
        else if (strcmp(argv[i], "--rdma") == 0)
            rdma = 1;
        else if (strcmp(argv[i], "--sysfs-root") == 0 && i + 1 < argc)
            root = argv[++i];
        else if (strcmp(argv[i], "--build") == 0)
            build = 1;
        else if (strcmp(argv[i], "--memreg") == 0) {
            long mib = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 64;
            long n = i + 2 < argc ? strtol(argv[i + 2], NULL, 10) : 100;
            if (mib < 1 || mib > 65536 || n < 0 || n > 1000000) {
                fprintf(stderr, "hcoll_info: --memreg takes MiB (1..65536) and a count\n");
                return 2;
            }
            return memreg_probe((size_t)mib, (int)n);
        }
        else if (strcmp(argv[i], "--tune") == 0) {
            long np = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 4;
            long rpn = i + 2 < argc ? strtol(argv[i + 2], NULL, 10) : 2;
            if (np < 2 || np > 64 || rpn < 1 || rpn > np || np % rpn) {
                fprintf(stderr, "hcoll_info: --tune takes NP (2..64) and RPN dividing it\n");
                return 2;
            }
            return tune((int)np, (int)rpn);
        }
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "hcoll_info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!env && !build && !rdma)
        env = build = rdma = 1;
    int bad = 0;
    if (build)
        print_build();
    if (env) {
        if (build)
            printf("\n");
        bad = print_env();
    }
    if (rdma) {
        if (build || env)
            printf("\n");
        print_rdma(root);
    }
    if (bad)
        printf("\n%d variable(s) above are malformed: hcoll_comm_init will refuse them.\n", bad);
    return bad ? 1 : 0;
}
