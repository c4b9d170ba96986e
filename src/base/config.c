/*
 * The one table of HCOLL_* knobs. To add a knob: a field in hc_params_t (if
 * the library reads it per communicator), a row here, and the code that
 * uses it; hcoll_info --env and the README's table follow from this row.
 */
#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "sys/envlist.h"

static const char *const net_choices[] = { "auto", "ib", "tcp", NULL };
/* Indexed as base/reduce.c's kernel sets. */
static const char *const cpu_kernel_choices[] = { "auto", "generic", "avx2", NULL };
static const char *const gdr_choices[] = { "LOC", "PIX", "PXB", "PHB", "SYS", NULL };
/* Indexed by hc_log_level_t: the ENUM's index is the level. */
static const char *const level_choices[] = {
    [HC_LOG_NONE] = "NONE", [HC_LOG_WARN] = "WARN", [HC_LOG_INFO] = "INFO",
    [HC_LOG_TRACE] = "TRACE", NULL,
};

#define OFF(field) offsetof(hc_params_t, field)
#define NS HC_KNOB_NOT_STORED

static const hc_knob_t knobs[] = {
    /* Logging: process-wide, read once by base/log.c through hc_knob_env. */
    { "HCOLL_DEBUG", HC_KNOB_ENUM, "WARN", 0, 0, level_choices, 0, 0, NS,
      "Log level: NONE, WARN, INFO or TRACE (VERSION is taken as WARN)." },
    { "HCOLL_DEBUG_SUBSYS", HC_KNOB_SUBSYS, "ALL", 0, 0, NULL, 0, 0, NS,
      "Subsystems logged at INFO/TRACE: comma list of INIT,BOOT,NET,ENV,COLL,SHM,GDR,TUNE,ALL; "
      "a leading ^ excludes." },
    { "HCOLL_DEBUG_FILE", HC_KNOB_STR, "", 0, 0, NULL, 0, 0, NS,
      "Write the log to this file instead of stderr; %h is the host name, %p the pid." },

    /* Launch: read by hcoll_comm_init_env. */
    { "HCOLL_RANK", HC_KNOB_INT, "", 0, INT32_MAX - 1, NULL, 0, 0, NS,
      "This process's rank, for hcoll_comm_init_env (before torchrun's RANK, "
      "OMPI_COMM_WORLD_RANK, SLURM_PROCID)." },
    { "HCOLL_NRANKS", HC_KNOB_INT, "", 1, INT32_MAX, NULL, 0, 0, NS,
      "Number of ranks, for hcoll_comm_init_env (before torchrun's WORLD_SIZE, "
      "OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)." },
    { "HCOLL_ROOT", HC_KNOB_STR, "", 0, 0, NULL, 0, 0, NS,
      "host:port where rank 0 listens for the rendezvous, for hcoll_comm_init_env (else "
      "MASTER_ADDR:MASTER_PORT+HCOLL_ROOT_PORT_OFFSET, else under srun the step's first node)." },
    { "HCOLL_SECRET", HC_KNOB_STR, "", 0, 0, NULL, 0, 1, NS,
      "Shared secret that authenticates ranks in hcoll_comm_init_env (at least 16 characters, "
      "or 32 hex digits; shorter ones get a WARN). Unset, init refuses to run unless the root "
      "is on loopback or HCOLL_ALLOW_UNAUTHENTICATED=1." },
    { "HCOLL_HOSTID", HC_KNOB_STR, "", 0, 0, NULL, 0, 0, OFF(hostid),
      "Overrides the host id (hash of host name and boot id) that groups ranks into nodes; "
      "lets one host emulate several nodes." },
    { "HCOLL_ROOT_PORT_OFFSET", HC_KNOB_INT, "1", 1, 1000, NULL, 0, 0, NS,
      "Under torchrun (root from MASTER_ADDR/MASTER_PORT), rank 0 listens on MASTER_PORT plus "
      "this, never on MASTER_PORT itself, which torch's TCPStore owns." },
    /* Bootstrap authentication (boot/launch.c, boot/wire.h). */
    { "HCOLL_ALLOW_UNAUTHENTICATED", HC_KNOB_INT, "0", 0, 1, NULL, 0, 0, NS,
      "1: let hcoll_comm_init_env run without HCOLL_SECRET on a root address that is not "
      "loopback (any process that reaches the root can then join the job)." },
    { "HCOLL_KDF_ITERS", HC_KNOB_INT, "20000", 1000, 10000000, NULL, 0, 0, NS,
      "PBKDF2-HMAC-SHA256 iterations that stretch HCOLL_SECRET over a salt rank 0 draws per "
      "job, so that a captured handshake does not allow cheap guessing; the same on every "
      "rank. Costs about this many x 2 SHA-256 blocks once per rank at init." },

    /* Network. */
    { "HCOLL_NET", HC_KNOB_ENUM, "auto", 0, 0, net_choices, 0, 0, OFF(net),
      "Inter-node transport: auto (verbs when a usable RDMA device is present, else TCP), "
      "ib or tcp." },
    { "HCOLL_SOCKET_IFNAME", HC_KNOB_LIST, "", 0, 0, NULL, 0, 0, OFF(socket_ifname),
      "Interfaces for bootstrap and TCP rails, NCCL syntax: prefixes, =exact, ^exclude. "
      "Unset: all up interfaces except lo and virtual bridges." },
    { "HCOLL_NSOCKS_PERPEER", HC_KNOB_INT, "1", 1, 16, NULL, 0, 0, OFF(nsocks_perpeer),
      "TCP sockets per peer connection, for links one stream cannot fill." },
    { "HCOLL_SOCKET_BUF", HC_KNOB_SIZE, "0", 0, (int64_t)1 << 30, NULL, 0, 0, OFF(socket_buf),
      "TCP send/receive buffer size; 0 leaves the kernel's autotuning alone." },
    { "HCOLL_IB_HCA", HC_KNOB_LIST, "", 0, 0, NULL, 0, 0, OFF(ib_hca),
      "RDMA devices to use, NCCL syntax: name[:port] list, =exact, ^exclude (e.g. ^=mlx5_1)." },
    { "HCOLL_IB_GID_INDEX", HC_KNOB_INT, "-1", -1, 255, NULL, 0, 0, OFF(ib_gid_index),
      "RoCE GID index; -1 picks a RoCE v2 GID with an IPv4-mapped address." },
    { "HCOLL_IB_TC", HC_KNOB_INT, "0", 0, 255, NULL, 0, 0, OFF(ib_tc),
      "Traffic class of the QPs (RoCE: DSCP << 2)." },
    { "HCOLL_IB_SL", HC_KNOB_INT, "0", 0, 15, NULL, 0, 0, OFF(ib_sl), "Service level of the QPs." },
    { "HCOLL_IB_TIMEOUT", HC_KNOB_INT, "20", 1, 31, NULL, 0, 0, OFF(ib_timeout),
      "QP ACK timeout exponent: 4.096 us * 2^value." },
    { "HCOLL_IB_RETRY_CNT", HC_KNOB_INT, "7", 0, 7, NULL, 0, 0, OFF(ib_retry_cnt),
      "QP retry count." },
    { "HCOLL_NET_GDR_LEVEL", HC_KNOB_ENUM, "PXB", 0, 0, gdr_choices, 1, 0, OFF(gdr_level),
      "Use GPUDirect RDMA when the GPU-NIC PCI path is within this level: LOC, PIX, PXB, PHB, "
      "SYS (or 0..4)." },
    { "HCOLL_GDR_FLUSH", HC_KNOB_INT, "-1", -1, 1, NULL, 0, 0, OFF(gdr_flush),
      "Flush read after GPUDirect writes: -1 auto (unless the GPU orders RDMA writes; "
      "pre-Hopper when unknown), 0 off, 1 on." },
    { "HCOLL_SYSFS_ROOT", HC_KNOB_STR, "", 0, 0, NULL, 0, 0, OFF(sysfs_root),
      "Directory holding the sys/ and proc/ trees that RDMA, PCI and GPUDirect discovery read "
      "(default /); for tests and diagnosis on a copied tree." },

    /* Collective behaviour. */
    { "HCOLL_TIMEOUT_MS", HC_KNOB_INT, "30000", 1, 86400000, NULL, 0, 0, OFF(timeout_ms),
      "Deadline of each set-up step once its peers are there (connecting, handshakes, set-up "
      "exchanges, shared-memory attach) and of a silent TCP link (TCP_USER_TIMEOUT), "
      "milliseconds. Waits for a late peer are bounded by HCOLL_OP_TIMEOUT_MS and "
      "HCOLL_INIT_TIMEOUT_MS instead, and a dead one is found by HCOLL_LIVENESS_MS." },
    /* 256K, measured: on CPU-bound hosts a chunk that stays in cache between
     * its receive, its reduction and its forward beat 1M by 10-40% (ring
     * and three stages), and matched it on 1 Gbit/s shaped rails. */
    { "HCOLL_CHUNK_BYTES", HC_KNOB_SIZE, "256K", 4096, (int64_t)1 << 30, NULL, 0, 0,
      OFF(chunk_bytes), "Pipelining chunk for the ring and intra-node stages." },
    { "HCOLL_SMALL_BYTES", HC_KNOB_SIZE, "32K", 0, (int64_t)1 << 30, NULL, 0, 0,
      OFF(small_bytes),
      "All-reduces of at most this many bytes take the latency path: one fused intra-node "
      "step and the ring on every rail over the whole vector, on the caller's thread; 0 "
      "turns it off. Must be equal on every rank." },

    /* Rails of split communicators. */
    { "HCOLL_RAIL", HC_KNOB_INT, "-1", -1, 1023, NULL, 0, 0, OFF(rail),
      "This rank's rail (its interface and RDMA NIC); -1: its local rank, or for a split "
      "communicator its rail in the parent. The config field rail wins." },
    /* Liveness: tell a dead or frozen rank from a late one (core/live.c). */
    { "HCOLL_LIVENESS_MS", HC_KNOB_INT, "15000", 100, 3600000, NULL, 0, 0, OFF(liveness_ms),
      "A peer that an operation waits for is declared dead after this many milliseconds "
      "without a sign of life (heartbeats of its liveness thread: a stopped or hung process); "
      "one that exits or is killed is found at once." },
    { "HCOLL_OP_TIMEOUT_MS", HC_KNOB_INT, "1800000", 0, 86400000, NULL, 0, 0, OFF(op_timeout_ms),
      "How long an all-reduce waits without progress for peers that are alive but have not "
      "called it yet (ranks minutes apart: checkpoints, evaluation), milliseconds; 0 = no "
      "limit." },
    { "HCOLL_INIT_TIMEOUT_MS", HC_KNOB_INT, "600000", 1, 86400000, NULL, 0, 0,
      OFF(init_timeout_ms),
      "How long init waits for every rank to arrive at the rendezvous, milliseconds; a rank "
      "that arrived and then froze is found by HCOLL_LIVENESS_MS." },
    /* Verbs memory registration (inter/ib/mr.c). */
    { "HCOLL_IB_PCI_RELAXED_ORDERING", HC_KNOB_INT, "-1", -1, 1, NULL, 0, 0,
      OFF(ib_relaxed_ordering),
      "Register memory with IBV_ACCESS_RELAXED_ORDERING (through ibv_reg_mr_iova2), as "
      "NCCL_IB_PCI_RELAXED_ORDERING: -1 auto (where libibverbs has the call and the NIC "
      "takes the flag), 0 off, 1 on (a warning where it cannot be had)." },
    /* Verbs progress (inter/ib/poll.c). */
    { "HCOLL_IB_SPIN_US", HC_KNOB_INT, "100", 0, 1000000, NULL, 0, 0, OFF(ib_spin_us),
      "How long a verbs wait polls its completion queues without sleeping, microseconds, "
      "before it sleeps on a completion channel; a NIC's round trip is 2-5 us, a sleep's "
      "wake-up tens. 0: sleep at once (frees the core sooner, costs latency)." },
    /* Cross-rank argument agreement (core/coll_agree.c). */
    { "HCOLL_CHECK_ARGS", HC_KNOB_INT, "1", 0, 1, NULL, 0, 0, OFF(check_args),
      "1: before any data moves, every host collective agrees across all ranks on its "
      "arguments (collective, count, dtype, op, root, operation number) and on each rank "
      "being able to take part, so that a mismatch or a failed registration fails that call "
      "on every rank alike; costs one small all-reduce per call. Device reduce-scatter, "
      "all-gather and broadcast also compare among the node's ranks at call time (the call "
      "waits for them). 0: no check (ranks must agree; a mismatch may then hang or mix "
      "data). Must be equal on every rank." },
    { "HCOLL_IB_QPS_PER_PEER", HC_KNOB_INT, "1", 1, 4, NULL, 0, 0, OFF(ib_qps_per_peer),
      "RC queue pairs per peer over verbs (NCCL_IB_QPS_PER_CONNECTION); puts go round robin "
      "over them, so that a LAG or an ECMP fabric spreads them over its links. Two ranks "
      "that differ use the smaller." },
    /* Host reduction kernels (base/reduce.c): process-wide, read once. */
    { "HCOLL_CPU_KERNELS", HC_KNOB_ENUM, "auto", 0, 0, cpu_kernel_choices, 0, 0, NS,
      "Host reduction kernel set: auto (the fastest this CPU runs), generic (16-byte vectors, "
      "software fp16) or avx2 (AVX2+F16C); init fails if the set asked for cannot run here. "
      "For tests: every set gives the same bits." },
    /* Algorithm choice by size (core/algo.c, inter/rd.c). */
    { "HCOLL_ALGO", HC_KNOB_STR, "auto", 0, 0, NULL, 0, 0, OFF(algo),
      "All-reduce algorithm across nodes: auto (recursive doubling up to the limit "
      "HCOLL_ALGO_MODEL sets, the ring above), ring, rd, or rd:SIZE (rd up to SIZE bytes); each "
      "may be written allreduce=... . Broadcast: broadcast=auto (the tree up to the table's "
      "crossover, the chain above), tree, chain or tree:SIZE, in a comma list with the "
      "all-reduce's. Must be equal on every rank." },
    /* 100, measured on the quiet 2-core host with each rank pinned (bench/RESULTS.md,
     * "Spinning before sleeping"): 2 x 2 on lo, 4 KiB, where the two ranks of an
     * exchange sit on different cores, 92-94 us per call with 0 against 39-55 us
     * with 50-200 (a sleeping rank's core must be woken); where they share one,
     * 43-46 against 35-47. 3 x 2 cluster, 4 KiB out of place: 138-146 us against 162-167. While
     * other jobs hold the cores a yield hands the core to them too (load 28-50:
     * no steady gain, and 0 was better there): set 0 on a host shared that way.
     * Blocking calls only: the worker's _async calls sleep at once (coll.c). */
    { "HCOLL_SPIN_US", HC_KNOB_INT, "100", 0, 1000000, NULL, 0, 0, OFF(spin_us),
      "How long a blocking call's recursive doubling (small all-reduces, the argument "
      "agreement) and broadcast tree poll their connections, yielding the core between looks, "
      "microseconds, before they sleep in the kernel; 0: sleep at once. _async calls never "
      "spin (they run beside the application's work)." },
    /* TCP data path (inter/tcp_ep.c). */
    { "HCOLL_TCP_RCVLOWAT", HC_KNOB_SIZE, "0", 0, (int64_t)1 << 30, NULL, 0, 0,
      OFF(tcp_rcvlowat),
      "While a large payload arrives, wake the receiving thread once per this many bytes "
      "(SO_RCVLOWAT, at most what is left of the payload and a quarter of the receive "
      "buffer) instead of once per segment or two; 0 leaves the socket's default." },
    /* The all-reduce's crossovers under HCOLL_ALGO=auto (core/algo_model.c). */
    { "HCOLL_ALGO_MODEL", HC_KNOB_STR, "probe", 0, 0, NULL, 0, 0, OFF(algo_model),
      "Where HCOLL_ALGO=auto takes the all-reduce's crossovers from: probe (time recursive "
      "doubling across nodes at init, a few ms, and choose rd or the ring by an alpha-beta "
      "cost model of the measured latency and bandwidth), table (the fixed crossover "
      "table), or ALPHA_US:MBPS (the model with this latency per message, microseconds, and "
      "this bandwidth per rank, MB/s, without the probe). Must be equal on every rank." },
};

#undef OFF
#undef NS

const hc_knob_t *hc_knobs(size_t *count_out)
{
    *count_out = sizeof knobs / sizeof knobs[0];
    return knobs;
}

const hc_knob_t *hc_knob_find(const char *name)
{
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        if (strcmp(knobs[i].name, name) == 0)
            return &knobs[i];
    return NULL;
}

hcoll_status_t hc_parse_size(const char *s, uint64_t *out)
{
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return HCOLL_ERR_INVALID_ARG;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno)
        return HCOLL_ERR_INVALID_ARG;
    uint64_t mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1ull << 10; break;
        case 'M': mult = 1ull << 20; break;
        case 'G': mult = 1ull << 30; break;
        case 'T': mult = 1ull << 40; break;
        default: return HCOLL_ERR_INVALID_ARG;
        }
        end++;
        if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 && strcasecmp(end, "iB") != 0)
            return HCOLL_ERR_INVALID_ARG;
    }
    if (v > UINT64_MAX / mult)
        return HCOLL_ERR_INVALID_ARG;
    *out = v * mult;
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* One parser per kind. The range checks take typed values, so that the     */
/* explicit hcoll_config_t fields go through them without text; text is the */
/* value as the user wrote it, for the message (NULL: print the number).    */
/* ------------------------------------------------------------------------ */

static hcoll_status_t int_check(const hc_knob_t *k, int64_t v, const char *text, char *err,
                                size_t errlen)
{
    if (v >= k->min && v <= k->max)
        return HCOLL_SUCCESS;
    char num[24];
    if (!text) {
        snprintf(num, sizeof num, "%" PRId64, v);
        text = num;
    }
    snprintf(err, errlen, "%s='%s': out of range (expected %" PRId64 "..%" PRId64 ")", k->name,
             text, k->min, k->max);
    return HCOLL_ERR_INVALID_ARG;
}

static hcoll_status_t size_check(const hc_knob_t *k, uint64_t v, const char *text, char *err,
                                 size_t errlen)
{
    if (v >= (uint64_t)k->min && v <= (uint64_t)k->max)
        return HCOLL_SUCCESS;
    char num[24];
    if (!text) {
        snprintf(num, sizeof num, "%" PRIu64, v);
        text = num;
    }
    snprintf(err, errlen, "%s='%s': out of range (expected %" PRId64 "..%" PRId64 " bytes)",
             k->name, text, k->min, k->max);
    return HCOLL_ERR_INVALID_ARG;
}

static hcoll_status_t int_parse(const hc_knob_t *k, const char *text, int64_t *out, char *err,
                                size_t errlen)
{
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end) {
        snprintf(err, errlen, "%s='%s': not an integer (expected %" PRId64 "..%" PRId64 ")",
                 k->name, text, k->min, k->max);
        return HCOLL_ERR_INVALID_ARG;
    }
    hcoll_status_t st = int_check(k, v, text, err, errlen);
    if (st == HCOLL_SUCCESS)
        *out = v;
    return st;
}

static hcoll_status_t size_parse(const hc_knob_t *k, const char *text, uint64_t *out, char *err,
                                 size_t errlen)
{
    uint64_t v;
    if (hc_parse_size(text, &v) != HCOLL_SUCCESS) {
        snprintf(err, errlen, "%s='%s': not a size (a number with an optional K, M or G suffix)",
                 k->name, text);
        return HCOLL_ERR_INVALID_ARG;
    }
    hcoll_status_t st = size_check(k, v, text, err, errlen);
    if (st == HCOLL_SUCCESS)
        *out = v;
    return st;
}

static hcoll_status_t enum_parse(const hc_knob_t *k, const char *text, int *out, char *err,
                                 size_t errlen)
{
    int n = 0, idx = -1;
    while (k->choices[n])
        n++;
    for (int i = 0; i < n; i++)
        if (strcasecmp(text, k->choices[i]) == 0)
            idx = i;
    if (idx < 0 && k->numeric_choices && text[0] >= '0' && text[0] < '0' + n && !text[1])
        idx = text[0] - '0';
    /* NCCL spells "print the version" as a level; the version is logged at
     * INIT anyway, so it means WARN. */
    if (idx < 0 && k->choices == level_choices && strcasecmp(text, "VERSION") == 0)
        idx = HC_LOG_WARN;
    if (idx < 0) {
        char list[128] = "";
        for (int i = 0; i < n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     k->choices[i]);
        snprintf(err, errlen, "%s='%s': expected one of %s%s", k->name, text, list,
                 k->numeric_choices ? " (or 0..4)" : "");
        return HCOLL_ERR_INVALID_ARG;
    }
    *out = idx;
    return HCOLL_SUCCESS;
}

#define HC_SUBSYS_NAME_(name, bit) { #name, 1u << (bit) },
static const struct { const char *name; unsigned bit; } subsys_names[] = {
    HC_SUBSYS_MAP(HC_SUBSYS_NAME_)
    { "ALL", HC_ALL },
};
#undef HC_SUBSYS_NAME_

static hcoll_status_t subsys_parse(const hc_knob_t *k, const char *text, unsigned *mask_out,
                                   char *err, size_t errlen)
{
    const char *s = text;
    const int exclude = *s == '^';
    unsigned mask = 0;
    if (exclude)
        s++;
    while (*s) {
        size_t n = strcspn(s, ",");
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
            if (strlen(subsys_names[i].name) == n && strncasecmp(s, subsys_names[i].name, n) == 0)
                bit = subsys_names[i].bit;
        if (n > 0 && !bit) {
            snprintf(err, errlen,
                     "%s='%s': unknown subsystem '%.*s' (known: "
                     "INIT,BOOT,NET,ENV,COLL,SHM,GDR,TUNE,ALL)",
                     k->name, text, (int)n, s);
            return HCOLL_ERR_INVALID_ARG;
        }
        mask |= bit;
        s += n;
        if (*s == ',')
            s++;
    }
    *mask_out = exclude ? (HC_ALL & ~mask) : mask;
    return HCOLL_SUCCESS;
}

static hcoll_status_t str_parse(const hc_knob_t *k, const char *text, char *err, size_t errlen)
{
    if (k->kind == HC_KNOB_LIST) {
        hc_list_t l;
        char lerr[160];
        if (hc_list_parse(text, &l, lerr, sizeof lerr) != HCOLL_SUCCESS) {
            snprintf(err, errlen, "%s=%s", k->name, lerr);
            return HCOLL_ERR_INVALID_ARG;
        }
    }
    if (strlen(text) >= HC_PARAM_STR_MAX) {
        snprintf(err, errlen, "%s: value longer than %d characters", k->name,
                 HC_PARAM_STR_MAX - 1);
        return HCOLL_ERR_INVALID_ARG;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_knob_value(const hc_knob_t *k, const char *text, hc_knob_value_t *value_out,
                             char *err, size_t errlen)
{
    hc_knob_value_t v;
    hcoll_status_t st;
    switch (k->kind) {
    case HC_KNOB_INT: st = int_parse(k, text, &v.i, err, errlen); break;
    case HC_KNOB_SIZE: st = size_parse(k, text, &v.size, err, errlen); break;
    case HC_KNOB_ENUM: st = enum_parse(k, text, &v.choice, err, errlen); break;
    case HC_KNOB_SUBSYS: st = subsys_parse(k, text, &v.mask, err, errlen); break;
    case HC_KNOB_STR:
    case HC_KNOB_LIST:
        st = str_parse(k, text, err, errlen);
        v.str = text;
        break;
    default:
        snprintf(err, errlen, "%s: internal error: unknown knob kind", k->name);
        return HCOLL_ERR_INTERNAL;
    }
    if (st == HCOLL_SUCCESS)
        *value_out = v;
    return st;
}

hcoll_status_t hc_knob_parse(const hc_knob_t *k, const char *text, hc_params_t *p, char *err,
                             size_t errlen)
{
    hc_knob_value_t v;
    hcoll_status_t st = hc_knob_value(k, text, &v, err, errlen);
    if (st != HCOLL_SUCCESS || !p || k->offset == HC_KNOB_NOT_STORED)
        return st;
    char *field = (char *)p + k->offset;
    switch (k->kind) {
    case HC_KNOB_INT: *(int64_t *)field = v.i; break;
    case HC_KNOB_SIZE: *(uint64_t *)field = v.size; break;
    case HC_KNOB_ENUM: *(int *)field = v.choice; break;
    case HC_KNOB_SUBSYS: *(unsigned *)field = v.mask; break;
    case HC_KNOB_STR:
    case HC_KNOB_LIST: snprintf(field, HC_PARAM_STR_MAX, "%s", v.str); break;
    }
    return HCOLL_SUCCESS;
}

const char *hc_knob_current(const hc_knob_t *k, int *from_env_out)
{
    const char *v = getenv(k->name);
    int from_env = v && *v;
    if (from_env_out)
        *from_env_out = from_env;
    return from_env ? v : k->defval;
}

hcoll_status_t hc_knob_env(const char *name, hc_knob_value_t *value_out, char *err,
                           size_t errlen)
{
    const hc_knob_t *k = hc_knob_find(name);
    if (!k) {
        snprintf(err, errlen, "%s: internal error: not in the table", name);
        return HCOLL_ERR_INTERNAL;
    }
    return hc_knob_value(k, hc_knob_current(k, NULL), value_out, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* The config struct                                                          */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_config_check(const hcoll_config_t *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return HCOLL_SUCCESS;
    const size_t head = offsetof(hcoll_config_t, version) + sizeof cfg->version;
    if (cfg->size < head || cfg->magic != HCOLL_CONFIG_MAGIC || cfg->version == 0) {
        snprintf(err, errlen,
                 "config was not made with HCOLL_CONFIG_INITIALIZER (size %zu, magic 0x%x, "
                 "version %u)",
                 cfg->size, cfg->magic, cfg->version);
        return HCOLL_ERR_INVALID_ARG;
    }
    if (cfg->version > HCOLL_CONFIG_VERSION) {
        snprintf(err, errlen, "config version %u is newer than this library's (%u)",
                 cfg->version, HCOLL_CONFIG_VERSION);
        return HCOLL_ERR_INVALID_ARG;
    }
    if (cfg->size > sizeof(hcoll_config_t) && cfg->version == HCOLL_CONFIG_VERSION) {
        snprintf(err, errlen, "config size %zu does not match version %u (expected %zu)",
                 cfg->size, cfg->version, sizeof(hcoll_config_t));
        return HCOLL_ERR_INVALID_ARG;
    }
    return HCOLL_SUCCESS;
}

/* Is field f of cfg present in the caller's (possibly older, smaller)
 * struct? */
#define CFG_HAS(cfg, f) \
    ((cfg) && (cfg)->size >= offsetof(hcoll_config_t, f) + sizeof((cfg)->f))

/* The message of a bad explicit field says which field, and that it
 * follows its variable's rules (the message already names the variable). */
static hcoll_status_t field_error(const char *field, char *err, size_t errlen)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "config field %s (same rules as the variable): %s", field, err);
    snprintf(err, errlen, "%s", tmp);
    return HCOLL_ERR_INVALID_ARG;
}

/* Explicit config fields win over the environment. Numbers are checked as
 * numbers against their knob's bounds; net and socket_ifname are text, so
 * they go through the knob's parser as a variable's text would. */
static hcoll_status_t apply_config(hc_params_t *p, const hcoll_config_t *cfg, char *err,
                                   size_t errlen)
{
    if (CFG_HAS(cfg, timeout_ms) && cfg->timeout_ms != HCOLL_CONFIG_UNDEF_INT) {
        if (int_check(hc_knob_find("HCOLL_TIMEOUT_MS"), cfg->timeout_ms, NULL, err, errlen) !=
            HCOLL_SUCCESS)
            return field_error("timeout_ms", err, errlen);
        p->timeout_ms = cfg->timeout_ms;
    }
    if (CFG_HAS(cfg, chunk_bytes) && cfg->chunk_bytes != 0) {
        if (size_check(hc_knob_find("HCOLL_CHUNK_BYTES"), cfg->chunk_bytes, NULL, err, errlen) !=
            HCOLL_SUCCESS)
            return field_error("chunk_bytes", err, errlen);
        p->chunk_bytes = cfg->chunk_bytes;
    }
    if (CFG_HAS(cfg, net) && cfg->net &&
        hc_knob_parse(hc_knob_find("HCOLL_NET"), cfg->net, p, err, errlen) != HCOLL_SUCCESS)
        return field_error("net", err, errlen);
    if (CFG_HAS(cfg, socket_ifname) && cfg->socket_ifname &&
        hc_knob_parse(hc_knob_find("HCOLL_SOCKET_IFNAME"), cfg->socket_ifname, p, err, errlen) !=
            HCOLL_SUCCESS)
        return field_error("socket_ifname", err, errlen);
    if (CFG_HAS(cfg, blocking)) {
        if (cfg->blocking != 0 && cfg->blocking != 1) {
            snprintf(err, errlen, "config field blocking is %d; it must be 0 or 1",
                     cfg->blocking);
            return HCOLL_ERR_INVALID_ARG;
        }
        p->blocking = cfg->blocking;
    }
    if (CFG_HAS(cfg, rail) && cfg->rail != -1) {
        if (int_check(hc_knob_find("HCOLL_RAIL"), cfg->rail, NULL, err, errlen) != HCOLL_SUCCESS)
            return field_error("rail", err, errlen);
        p->rail = cfg->rail;
    }
    if (CFG_HAS(cfg, op_timeout_ms) && cfg->op_timeout_ms != HCOLL_CONFIG_UNDEF_INT) {
        if (int_check(hc_knob_find("HCOLL_OP_TIMEOUT_MS"), cfg->op_timeout_ms, NULL, err,
                      errlen) != HCOLL_SUCCESS)
            return field_error("op_timeout_ms", err, errlen);
        p->op_timeout_ms = cfg->op_timeout_ms;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_params_load(hc_params_t *params_out, const hcoll_config_t *cfg, char *err,
                              size_t errlen)
{
    hc_params_t p;
    memset(&p, 0, sizeof p);
    p.blocking = 1;

    hcoll_status_t st = hc_config_check(cfg, err, errlen);
    if (st != HCOLL_SUCCESS)
        return st;
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        const hc_knob_t *k = &knobs[i];
        int from_env;
        const char *v = hc_knob_current(k, &from_env);
        /* Unset launcher variables have no default to parse. */
        if (!from_env && v[0] == '\0' && k->kind != HC_KNOB_STR && k->kind != HC_KNOB_LIST)
            continue;
        st = hc_knob_parse(k, v, &p, err, errlen);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    st = apply_config(&p, cfg, err, errlen);
    if (st != HCOLL_SUCCESS)
        return st;
    *params_out = p;
    return HCOLL_SUCCESS;
}
