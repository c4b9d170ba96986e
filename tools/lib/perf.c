/* hcoll_perf's arithmetic, verdict, rows and flags. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

/* ------------------------------------------------------------------------ */
/* Arithmetic                                                                 */
/* ------------------------------------------------------------------------ */

double hp_ring_factor(int n)
{
    return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}

double hp_algbw(double bytes, double seconds)
{
    return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

double hp_busbw(double algbw_gbs, int nranks)
{
    return algbw_gbs * hp_ring_factor(nranks);
}

double hp_nic_bw(double bytes, double seconds, int nodes, int ranks_per_node)
{
    if (nodes <= 1 || ranks_per_node < 1 || seconds <= 0)
        return 0.0;
    return hp_ring_factor(nodes) * bytes / ranks_per_node / seconds / 1e9;
}

double hp_busbw_from_nic(double nic_gbs, int nodes, int ranks_per_node)
{
    /* busbw = S/t · 2(n-1)/n and nic = 2(N-1)/N · S/(L t) with n = N L,
     * so busbw / nic = (n-1)/(N-1). */
    if (nodes <= 1)
        return 0.0;
    int n = nodes * ranks_per_node;
    return nic_gbs * (n - 1) / (nodes - 1);
}

int hp_coll_reduces(hp_coll_t c)
{
    return c == HP_COLL_ALLREDUCE || c == HP_COLL_REDUCE_SCATTER;
}

double hp_coll_bus_factor(hp_coll_t c, int n)
{
    switch (c) {
    case HP_COLL_ALLREDUCE: return hp_ring_factor(n);
    case HP_COLL_REDUCE_SCATTER:
    case HP_COLL_ALLGATHER: return n > 1 ? (double)(n - 1) / n : 0.0;
    case HP_COLL_BROADCAST: return 1.0;
    case HP_NCOLLS: break;
    }
    return 0.0;
}

double hp_coll_nic_factor(hp_coll_t c, int nodes)
{
    if (nodes <= 1)
        return 0.0;
    switch (c) {
    case HP_COLL_ALLREDUCE: return hp_ring_factor(nodes);
    case HP_COLL_REDUCE_SCATTER:
    case HP_COLL_ALLGATHER: return (double)(nodes - 1) / nodes;
    case HP_COLL_BROADCAST: return 1.0;
    case HP_NCOLLS: break;
    }
    return 0.0;
}

size_t hp_coll_count(hp_coll_t c, uint64_t bytes, size_t elem_size, int nranks,
                     uint64_t *run_bytes_out)
{
    uint64_t unit = elem_size;
    if ((c == HP_COLL_REDUCE_SCATTER || c == HP_COLL_ALLGATHER) && nranks > 1)
        unit *= (uint64_t)nranks;
    uint64_t per = unit ? bytes / unit : 0;
    *run_bytes_out = per * unit;
    return (size_t)per;
}

/* ------------------------------------------------------------------------ */
/* Verdict                                                                    */
/* ------------------------------------------------------------------------ */

hp_verdict_t hp_verdict_of(double pct)
{
    if (pct < 0 || !isfinite(pct))
        return HP_VERDICT_UNKNOWN;
    if (pct >= HP_HEALTHY_PCT)
        return HP_VERDICT_HEALTHY;
    if (pct >= HP_ACCEPTABLE_PCT)
        return HP_VERDICT_ACCEPTABLE;
    if (pct >= HP_POOR_PCT)
        return HP_VERDICT_POOR;
    return HP_VERDICT_PROBLEM;
}

const char *hp_verdict_name(hp_verdict_t v)
{
    switch (v) {
    case HP_VERDICT_HEALTHY: return "healthy";
    case HP_VERDICT_ACCEPTABLE: return "acceptable";
    case HP_VERDICT_POOR: return "poor";
    case HP_VERDICT_PROBLEM: return "problem";
    case HP_VERDICT_UNKNOWN: break;
    }
    return "unknown";
}

const char *hp_verdict_range(hp_verdict_t v)
{
    switch (v) {
    case HP_VERDICT_HEALTHY: return ">= 80% of line rate";
    case HP_VERDICT_ACCEPTABLE: return "60-80% of line rate";
    case HP_VERDICT_POOR: return "50-60% of line rate";
    case HP_VERDICT_PROBLEM: return "< 50% of line rate";
    case HP_VERDICT_UNKNOWN: break;
    }
    return "line rate unknown";
}

const char *hp_verdict_suspects(void)
{
    return "  - GPU-direct off: NIC traffic staged through host memory "
           "(hcoll_info; HCOLL_NET_GDR_LEVEL; nvidia-peermem or dma-buf missing)\n"
           "  - no lossless class: PFC not enabled for the RoCE traffic class, or "
           "HCOLL_IB_TC not mapped to it (pause counters, `mlnx_qos`)\n"
           "  - wrong GID index: RoCE v1 or an IPv6 link-local GID instead of RoCE v2 "
           "IPv4 (HCOLL_IB_GID_INDEX, show_gids)\n"
           "  - one NIC for several ranks: rails not one NIC per local rank "
           "(HCOLL_IB_HCA, HCOLL_SOCKET_IFNAME, PCI topology)\n";
}

/* ------------------------------------------------------------------------ */
/* Rows                                                                       */
/* ------------------------------------------------------------------------ */

void hp_coll_result_fill(hp_result_t *r, hp_coll_t c, double bytes, double time_us, int nranks,
                         int64_t wrong)
{
    r->time_us = time_us;
    r->algbw = hp_algbw(bytes, time_us * 1e-6);
    r->busbw = r->algbw * hp_coll_bus_factor(c, nranks);
    r->wrong = wrong;
}

void hp_result_fill(hp_result_t *r, double bytes, double time_us, int nranks, int64_t wrong)
{
    hp_coll_result_fill(r, HP_COLL_ALLREDUCE, bytes, time_us, nranks, wrong);
}

void hp_row_nic(hp_row_t *row, int nodes, int ranks_per_node, double line_bps)
{
    double t = row->oop.time_us;
    if (row->ip.time_us > 0 && (t <= 0 || row->ip.time_us < t))
        t = row->ip.time_us;
    row->nic_gbs = row->nic_pct = -1;
    if (nodes <= 1 || t <= 0)
        return;
    row->nic_gbs = hp_coll_nic_factor(row->coll, nodes) * (double)row->bytes /
                   (ranks_per_node > 0 ? ranks_per_node : 1) / (t * 1e-6) / 1e9;
    if (line_bps > 0)
        row->nic_pct = 100.0 * row->nic_gbs * 1e9 / line_bps;
}

static double row_busbw(const hp_row_t *r)
{
    return r->oop.busbw > r->ip.busbw ? r->oop.busbw : r->ip.busbw;
}

int hp_plateau(const hp_row_t *rows, int nrows, const char *impl, double *nic_pct_out,
               double *nic_gbs_out, double *busbw_out, uint64_t *from_bytes_out)
{
    uint64_t largest = 0;
    int any = 0;
    for (int i = 0; i < nrows; i++) {
        if (strcmp(rows[i].impl, impl) == 0) {
            any = 1;
            if (rows[i].bytes > largest)
                largest = rows[i].bytes;
        }
    }
    if (!any)
        return 0;
    uint64_t from = largest >= HP_PLATEAU_BYTES ? HP_PLATEAU_BYTES : largest;
    double pct = 0, nic = 0, bus = 0;
    int used = 0, pct_known = 1, nic_known = 1;
    uint64_t smallest = largest;
    for (int i = 0; i < nrows; i++) {
        const hp_row_t *r = &rows[i];
        if (strcmp(r->impl, impl) != 0 || r->bytes < from)
            continue;
        used++;
        if (r->bytes < smallest)
            smallest = r->bytes;
        bus += row_busbw(r);
        if (r->nic_gbs < 0)
            nic_known = 0;
        nic += r->nic_gbs;
        if (r->nic_pct < 0)
            pct_known = 0;
        pct += r->nic_pct;
    }
    *busbw_out = bus / used;
    *nic_gbs_out = nic_known ? nic / used : -1;
    *nic_pct_out = pct_known ? pct / used : -1;
    *from_bytes_out = smallest;
    return used;
}

double hp_avg_busbw(const hp_row_t *rows, int nrows, const char *impl)
{
    double sum = 0;
    int n = 0;
    for (int i = 0; i < nrows; i++) {
        if (strcmp(rows[i].impl, impl) == 0) {
            sum += rows[i].oop.busbw + rows[i].ip.busbw;
            n += 2;
        }
    }
    return n ? sum / n : 0.0;
}

/* ------------------------------------------------------------------------ */
/* Flags                                                                      */
/* ------------------------------------------------------------------------ */

const char *hp_usage(void)
{
    return "usage: hcoll_perf [flags]   (under mpirun/srun, HCOLL_RANK... env, or -np N)\n"
           "nccl-tests flags (its documented set; a command line for all_reduce_perf runs as is):\n"
           "  -b, --minbytes SIZE      smallest size (default 32M; K/M/G = 2^10.., KB/MB/GB = 10^3..)\n"
           "  -e, --maxbytes SIZE      largest size (default 32M)\n"
           "  -i, --stepbytes SIZE     increment between sizes (default 1M)\n"
           "  -f, --stepfactor N       multiply sizes by N (>= 2) instead of adding -i\n"
           "  -n, --iters N            timed iterations per size (default 20)\n"
           "  -w, --warmup_iters N     warm-up iterations per size (default 5)\n"
           "  -m, --agg_iters N        calls per timed iteration (default 1)\n"
           "  -a, --average 0|1|2|3    the time of a row: rank 0's, the mean (default), the\n"
           "                           minimum or the maximum over ranks\n"
           "  -c, --check N            checked iterations per size, 0 = off (default 1)\n"
           "  -d, --datatype TYPE      float half bfloat16 double int8 uint8 int32 int64\n"
           "  -o, --op OP|COLL         the reduction: sum prod max min avg (default sum); or the\n"
           "                           collective: allreduce (default) reduce_scatter allgather\n"
           "                           broadcast; give -o twice for both\n"
           "  -r, --root N             the broadcast's root (default 0)\n"
           "  -z, --blocking 0|1       1: wait for each call; 0: issue all, then wait (default 0)\n"
           "  -p, --parallel_init 0|1  accepted; each process initialises its one communicator\n"
           "  -t, --nthreads N         -g, --ngpus N: ranks per process; hcoll_perf runs one, so\n"
           "                           t x g > 1 launches that many on this host, as -np\n"
           "  -G, --cudagraph 0        CUDA-graph replay: only 0 (off)\n"
           "  -F, --output_file FILE   the rows as CSV, written by rank 0\n"
           "hcoll_perf's own:\n"
           "  --stages                 per-stage split: intra RS / inter / intra AG (us and %)\n"
           "  --line-rate RATE         NIC line rate per NIC (25GB/s, 200Gbps); default: RDMA\n"
           "                           devices, else the rate limit of HCOLL_SOCKET_IFNAME's\n"
           "                           interfaces (tc tbf/htb, link speed), else unknown\n"
           "  -np N                    launch N ranks on this host (loopback rendezvous)\n"
           "  --ranks-per-node L       emulate nodes of L ranks on one host (sets HCOLL_HOSTID\n"
           "                           and NCCL_HOSTID)\n"
           "  --peer mpi|nccl          also time MPI_Allreduce / ncclAllReduce on the same buffers\n"
           "  --mem host|device        buffers in host memory or on the GPU (local rank i on GPU\n"
           "                           i mod #GPUs, one CUDA stream); default host, device with\n"
           "                           --peer nccl\n"
           "  -J, --json FILE          write every row as JSON\n"
           "  --plot FILE.png          plot busbw and NIC % against size (needs gnuplot)\n"
           "  --deadline SECONDS       -np: kill every rank after this long (default 600)\n"
           "  -h, --help               this text\n"
           "Columns: time (us, per call, combined over ranks as -a says), algbw = S/t with S the whole vector (count x\n"
           "n elements for reduce_scatter and allgather), busbw = algbw x 2(n-1)/n (allreduce),\n"
           "(n-1)/n (reduce_scatter, allgather), 1 (broadcast) (GB/s = 1e9 B/s), #wrong =\n"
           "mismatching elements over all ranks, nicbw = bytes one NIC sends per second on N\n"
           "nodes of L ranks: 2(N-1)/N x S/L / t (allreduce), (N-1)/N x S/L / t (reduce_scatter,\n"
           "allgather), S/L / t (broadcast); %line = nicbw / line rate.\n"
           "Verdict on the plateau (sizes >= 256 MiB, else the largest): >= 80% healthy,\n"
           "60-80% acceptable, 50-60% poor, < 50% problem (with the usual suspects).\n";
}

void hp_opts_default(hp_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->minbytes = o->maxbytes = 32u << 20;
    o->stepbytes = 1u << 20;
    o->iters = 20;
    o->warmup = 5;
    o->agg = 1;
    o->average = HP_AVG_MEAN;
    o->check = 1;
    o->dtype = HCOLL_FLOAT32;
    o->op = HCOLL_SUM;
    o->deadline_s = 600;
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

typedef enum argk { A_NONE, A_VAL } argk_t;

typedef struct flagdef {
    const char *s;  /* short form without '-', or NULL */
    const char *l;  /* long form without '--', or NULL */
    argk_t kind;
    int id;
} flagdef_t;

enum {
    F_B, F_E, F_I, F_F, F_N, F_W, F_C, F_D, F_O, F_Z, F_STAGES, F_LINE, F_NP, F_RPN, F_PEER,
    F_JSON, F_PLOT, F_DEADLINE, F_MEM, F_HELP, F_R, F_M, F_A, F_P, F_T, F_G, F_GRAPH, F_CSV,
};

static const flagdef_t perf_flags[] = {
    { "b", "minbytes", A_VAL, F_B },      { "e", "maxbytes", A_VAL, F_E },
    { "i", "stepbytes", A_VAL, F_I },     { "f", "stepfactor", A_VAL, F_F },
    { "n", "iters", A_VAL, F_N },         { "w", "warmup_iters", A_VAL, F_W },
    { "c", "check", A_VAL, F_C },         { "d", "datatype", A_VAL, F_D },
    { "o", "op", A_VAL, F_O },            { "z", "blocking", A_VAL, F_Z },
    { NULL, "stages", A_NONE, F_STAGES }, { NULL, "line-rate", A_VAL, F_LINE },
    { "np", "np", A_VAL, F_NP },          { NULL, "ranks-per-node", A_VAL, F_RPN },
    { NULL, "peer", A_VAL, F_PEER },      { "J", "json", A_VAL, F_JSON },
    { NULL, "plot", A_VAL, F_PLOT },      { NULL, "deadline", A_VAL, F_DEADLINE },
    { NULL, "mem", A_VAL, F_MEM },
    { "h", "help", A_NONE, F_HELP },
    /* The rest of nccl-tests' documented set. */
    { "r", "root", A_VAL, F_R },          { "m", "agg_iters", A_VAL, F_M },
    { "a", "average", A_VAL, F_A },       { "p", "parallel_init", A_VAL, F_P },
    { "t", "nthreads", A_VAL, F_T },      { "g", "ngpus", A_VAL, F_G },
    { "G", "cudagraph", A_VAL, F_GRAPH }, { "F", "output_file", A_VAL, F_CSV },
};

/*
 * One flag at argv[*i]: "-b 8", "-b8", "--minbytes 8", "--minbytes=8",
 * "-np 4". Returns the flag's id and its value in *val_out, or -1.
 */
static int next_flag(const flagdef_t *defs, size_t ndefs, int argc, char **argv, int *i,
                     const char **val_out, char *err, size_t errlen)
{
    const char *a = argv[*i];
    const char *inline_val = NULL;
    const flagdef_t *d = NULL;
    if (a[0] != '-' || a[1] == '\0')
        return bad(err, errlen, "unexpected argument '%s'", a);
    if (a[1] == '-') {
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        for (size_t k = 0; k < ndefs && !d; k++)
            if (defs[k].l && strlen(defs[k].l) == nlen && strncmp(defs[k].l, name, nlen) == 0)
                d = &defs[k];
        if (!d)
            return bad(err, errlen, "unknown flag '%s'", a);
        if (eq)
            inline_val = eq + 1;
    } else {
        /* Exact multi-letter short forms first ("-np"), then one letter
         * with the value attached ("-b8"). */
        for (size_t k = 0; k < ndefs && !d; k++)
            if (defs[k].s && strcmp(defs[k].s, a + 1) == 0)
                d = &defs[k];
        for (size_t k = 0; k < ndefs && !d; k++)
            if (defs[k].s && defs[k].s[1] == '\0' && defs[k].s[0] == a[1] &&
                defs[k].kind == A_VAL)
                d = &defs[k], inline_val = a + 2;
        if (!d)
            return bad(err, errlen, "unknown flag '%s'", a);
    }
    if (d->kind == A_NONE) {
        if (inline_val)
            return bad(err, errlen, "flag '%s' takes no value", a);
        *val_out = NULL;
        return d->id;
    }
    if (inline_val) {
        *val_out = inline_val;
    } else {
        if (*i + 1 >= argc)
            return bad(err, errlen, "flag '%s' needs a value", a);
        *val_out = argv[++*i];
    }
    return d->id;
}

/* The flags together, after each alone parsed. */
static int opts_check(hp_opts_t *o, int stepbytes_given, char *err, size_t errlen)
{
    if (o->minbytes > o->maxbytes)
        return bad(err, errlen, "-b (%llu) is larger than -e (%llu)",
                   (unsigned long long)o->minbytes, (unsigned long long)o->maxbytes);
    if (o->stepfactor && stepbytes_given)
        return bad(err, errlen, "-f and -i exclude each other");
    if (o->stepfactor && o->minbytes == 0)
        return bad(err, errlen, "-f needs -b > 0 (0 never grows)");
    if (o->ranks_per_node && o->np && o->np % o->ranks_per_node != 0)
        return bad(err, errlen, "-np %d is not a multiple of --ranks-per-node %d", o->np,
                   o->ranks_per_node);
    if (o->np && o->peer == HP_PEER_MPI)
        return bad(err, errlen, "--peer mpi needs mpirun (MPI launches the ranks), not -np");
    if (o->peer == HP_PEER_NCCL && o->mem == HP_MEM_HOST)
        return bad(err, errlen, "--peer nccl needs --mem device (NCCL reduces GPU memory)");
    if ((long long)o->iters * o->agg > (1 << 26))
        return bad(err, errlen, "-n %d x -m %d calls per size is too many", o->iters, o->agg);
    if (o->mem == HP_MEM_AUTO)
        o->mem = o->peer == HP_PEER_NCCL ? HP_MEM_DEVICE : HP_MEM_HOST;
    size_t es = hcoll_dtype_size(o->dtype);
    if (o->maxbytes < es)
        return bad(err, errlen, "-e %llu is smaller than one %s element",
                   (unsigned long long)o->maxbytes, hcoll_dtype_name(o->dtype));
    return 0;
}

/* The nccl-tests flags that hcoll_perf adds nothing to; ranks_per_proc
 * collects -t x -g. */
static int nccl_tests_flag(hp_opts_t *o, int id, const char *v, int *ranks_per_proc, char *err,
                           size_t errlen)
{
    int x;
    switch (id) {
    case F_R:
        if (hp_parse_int(v, 0, 1 << 30, &o->root) != 0)
            return bad(err, errlen, "-r: '%s' is not a rank (hcoll_perf times one root per run; "
                       "'all' is not supported)", v);
        return 0;
    case F_M:
        if (hp_parse_int(v, 1, 1 << 20, &o->agg) != 0)
            return bad(err, errlen, "-m: '%s' is not a count >= 1", v);
        return 0;
    case F_A:
        if (hp_parse_int(v, 0, 3, &x) != 0)
            return bad(err, errlen, "-a: '%s' is not 0 (rank 0), 1 (mean), 2 (min) or 3 (max)", v);
        o->average = (hp_average_t)x;
        return 0;
    case F_P:
        if (hp_parse_int(v, 0, 1, &o->parallel_init) != 0)
            return bad(err, errlen, "-p: '%s' is not 0 or 1 (the per-stage split is --stages)",
                       v);
        return 0;
    case F_T:
    case F_G:
        if (hp_parse_int(v, 1, 4096, &x) != 0)
            return bad(err, errlen, "%s: '%s' is not a count >= 1", id == F_T ? "-t" : "-g", v);
        *ranks_per_proc *= x;
        return 0;
    case F_GRAPH:
        if (hp_parse_int(v, 0, 1 << 20, &x) != 0 || x != 0)
            return bad(err, errlen, "-G: '%s': hcoll_perf has no CUDA-graph replay; only -G 0", v);
        return 0;
    case F_CSV:
        if (!*v)
            return bad(err, errlen, "-F: empty file name");
        o->csv = v;
        return 0;
    default:
        return bad(err, errlen, "internal: flag %d has no handler", id);
    }
}

int hp_opts_parse(int argc, char **argv, hp_opts_t *o, char *err, size_t errlen)
{
    int stepbytes_given = 0, ranks_per_proc = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int id = next_flag(perf_flags, sizeof perf_flags / sizeof perf_flags[0], argc, argv, &i,
                           &v, err, errlen);
        switch (id) {
        case -1: return -1;
        case F_B:
            if (hp_parse_size(v, &o->minbytes) != 0)
                return bad(err, errlen, "-b: '%s' is not a size (8, 4K, 64M, 1G)", v);
            break;
        case F_E:
            if (hp_parse_size(v, &o->maxbytes) != 0)
                return bad(err, errlen, "-e: '%s' is not a size (8, 4K, 64M, 1G)", v);
            break;
        case F_I:
            if (hp_parse_size(v, &o->stepbytes) != 0 || o->stepbytes == 0)
                return bad(err, errlen, "-i: '%s' is not a positive size", v);
            stepbytes_given = 1;
            break;
        case F_F:
            if (hp_parse_int(v, 2, 1 << 20, &o->stepfactor) != 0)
                return bad(err, errlen, "-f: '%s' is not an integer factor >= 2", v);
            break;
        case F_N:
            if (hp_parse_int(v, 1, 1 << 24, &o->iters) != 0)
                return bad(err, errlen, "-n: '%s' is not a count >= 1", v);
            break;
        case F_W:
            if (hp_parse_int(v, 0, 1 << 24, &o->warmup) != 0)
                return bad(err, errlen, "-w: '%s' is not a count >= 0", v);
            break;
        case F_C:
            if (hp_parse_int(v, 0, 1 << 24, &o->check) != 0)
                return bad(err, errlen, "-c: '%s' is not a count >= 0", v);
            break;
        case F_D:
            if (hp_parse_dtype(v, &o->dtype) != 0)
                return bad(err, errlen,
                           "-d: unknown type '%s' (float half bfloat16 double int8 uint8 "
                           "int32 int64)", v);
            break;
        case F_O:
            /* nccl-tests' -o is the op; the collective shares the flag (the
             * names never overlap), so either or both may be given. */
            if (hp_parse_op(v, &o->op) != 0 && hp_parse_coll(v, &o->coll) != 0)
                return bad(err, errlen,
                           "-o: '%s' is neither a collective (allreduce reduce_scatter "
                           "allgather broadcast) nor an op (sum prod max min avg)", v);
            break;
        case F_Z:
            if (hp_parse_int(v, 0, 1, &o->blocking) != 0)
                return bad(err, errlen, "-z: '%s' is not 0 or 1", v);
            break;
        case F_STAGES: o->stages = 1; break;
        case F_LINE:
            if (hp_parse_rate(v, &o->line_rate) != 0)
                return bad(err, errlen, "--line-rate: '%s' is not a rate (25GB/s, 200Gbps)", v);
            break;
        case F_NP:
            if (hp_parse_int(v, 1, 4096, &o->np) != 0)
                return bad(err, errlen, "-np: '%s' is not a rank count in 1..4096", v);
            break;
        case F_RPN:
            if (hp_parse_int(v, 1, 4096, &o->ranks_per_node) != 0)
                return bad(err, errlen, "--ranks-per-node: '%s' is not a count >= 1", v);
            break;
        case F_PEER:
            if (strcmp(v, "mpi") == 0)
                o->peer = HP_PEER_MPI;
            else if (strcmp(v, "nccl") == 0)
                o->peer = HP_PEER_NCCL;
            else
                return bad(err, errlen, "--peer: '%s' is not mpi or nccl", v);
            break;
        case F_JSON:
            if (!*v)
                return bad(err, errlen, "-J: empty file name");
            o->json = v;
            break;
        case F_PLOT:
            if (!*v)
                return bad(err, errlen, "--plot: empty file name");
            o->plot = v;
            break;
        case F_DEADLINE:
            if (hp_parse_time(v, 1.0, &o->deadline_s) != 0 || o->deadline_s <= 0)
                return bad(err, errlen, "--deadline: '%s' is not a positive time", v);
            break;
        case F_MEM:
            if (strcmp(v, "host") == 0)
                o->mem = HP_MEM_HOST;
            else if (strcmp(v, "device") == 0)
                o->mem = HP_MEM_DEVICE;
            else
                return bad(err, errlen, "--mem: '%s' is not host or device", v);
            break;
        case F_HELP: o->help = 1; break;
        default:
            if (nccl_tests_flag(o, id, v, &ranks_per_proc, err, errlen) != 0)
                return -1;
            break;
        }
    }
    if (o->help)
        return 0;
    /* nccl-tests' -t/-g put several ranks in one process; hcoll_perf
     * launches that many processes instead. */
    if (ranks_per_proc > 1) {
        if (o->np && o->np != ranks_per_proc)
            return bad(err, errlen, "-t x -g = %d ranks disagrees with -np %d", ranks_per_proc,
                       o->np);
        o->np = ranks_per_proc;
    }
    return opts_check(o, stepbytes_given, err, errlen);
}

uint64_t hp_next_size(const hp_opts_t *o, uint64_t cur)
{
    uint64_t es = hcoll_dtype_size(o->dtype), next;
    if (cur == 0) {
        next = o->minbytes;
        /* nccl-tests starts at -b even when it is 0 bytes; so do we, but a
         * size below one element becomes one element. */
        if (next < es)
            next = es;
    } else if (o->stepfactor) {
        next = cur * (uint64_t)o->stepfactor;
    } else {
        next = cur + o->stepbytes;
    }
    next -= next % es;
    if (next <= cur || next > o->maxbytes)
        return 0;
    return next;
}
