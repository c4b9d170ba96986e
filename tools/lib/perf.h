/*
 * Logic shared by bin/hcoll_perf, bin/hcoll_plan and their tests: units,
 * bandwidth arithmetic, the NIC verdict, flag parsing, exact check values,
 * the JSON rows, the line-rate lookup and the overlap planner.
 *
 * Nothing declared here talks to other ranks or prints to stdout; the
 * programs do (perf_rank.h holds hcoll_perf's pieces that do).
 * Units: GB/s is 1e9 bytes per second (as nccl-tests); sizes with K/M/G/T
 * or KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000.
 */
#ifndef HP_PERF_H
#define HP_PERF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hcoll.h"

/* ------------------------------------------------------------------------ */
/* Units                                                                      */
/* ------------------------------------------------------------------------ */

/* "4096", "4K", "64MiB", "4GB" (decimal), "1.5G". 0 ok, -1 malformed. */
int hp_parse_size(const char *s, uint64_t *bytes_out);
/* "25GB/s", "25e9" (bytes/s), "200Gbps", "200Gb/s", "200Gbit", "400Mbit/s",
 * "3.2MB/s". Must be > 0. 0 ok, -1 malformed. */
int hp_parse_rate(const char *s, double *bytes_per_s_out);
/* "100ms", "0.1s", "2500us", "1min"; a bare number is in default_unit_s. */
int hp_parse_time(const char *s, double default_unit_s, double *seconds_out);
/* A non-negative decimal int (no sign, no junk). */
int hp_parse_int(const char *s, int min, int max, int *out);
/* nccl-tests names (float, half, bfloat16, double, int8, uint8, int32,
 * int64) and hcoll's (float32, float16, float64). */
int hp_parse_dtype(const char *s, hcoll_dtype_t *out);
int hp_parse_op(const char *s, hcoll_op_t *out); /* sum prod max min avg */
/* "64 MiB", "4 KiB", "512 B", "4.00 GB"(si=1) into buf. */
void hp_format_bytes(double bytes, int si, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Collectives (-o allreduce|reduce_scatter|allgather|broadcast)              */
/* ------------------------------------------------------------------------ */

/*
 * Size S of a row is the full vector, as nccl-tests: the all-reduce's and
 * the broadcast's count × element, nranks × recvcount elements for the
 * reduce-scatter, nranks × sendcount for the all-gather.
 *
 *               busbw / algbw      bytes one NIC carries (three-stage plan,
 *               (nccl-tests)       N nodes × L rails)
 *   allreduce   2(n-1)/n           2(N-1)/N · S/L  (inter-node RS + AG of S/L)
 *   reduce_sc.  (n-1)/n            (N-1)/N · S/L   (inter-node RS of S/L)
 *   allgather   (n-1)/n            (N-1)/N · S/L   (inter-node AG of S/L)
 *   broadcast   1                  S/L             (each rail's chain forwards
 *                                                  its S/L part once; N > 1)
 */
typedef enum hp_coll {
    HP_COLL_ALLREDUCE = 0,
    HP_COLL_REDUCE_SCATTER,
    HP_COLL_ALLGATHER,
    HP_COLL_BROADCAST,
    HP_NCOLLS,
} hp_coll_t;

/* "allreduce" "reduce_scatter" "allgather" "broadcast" (and nccl-tests'
 * "all_reduce" "all_gather", "reducescatter", "bcast"). 0 ok, -1. */
int hp_parse_coll(const char *s, hp_coll_t *out);
const char *hp_coll_name(hp_coll_t c); /* "allreduce"... */
/* 1 for the collectives that reduce (an op applies). */
int hp_coll_reduces(hp_coll_t c);
/* busbw / algbw of c on n ranks (the table above); 0 for n <= 1 except the
 * broadcast (1: nccl-tests' busbw = algbw there). */
double hp_coll_bus_factor(hp_coll_t c, int nranks);
/* Bytes one NIC carries per byte of S/L on N nodes; 0 when N <= 1. */
double hp_coll_nic_factor(hp_coll_t c, int nodes);
/* Elements each rank passes as count (recvcount for the reduce-scatter,
 * sendcount for the all-gather, count otherwise) for a size of bytes, and
 * the size actually run (a whole number of nranks × elements for the
 * reduce-scatter and all-gather; 0 when not even one fits). */
size_t hp_coll_count(hp_coll_t c, uint64_t bytes, size_t elem_size, int nranks,
                     uint64_t *run_bytes_out);

/* ------------------------------------------------------------------------ */
/* Bandwidth arithmetic                                                       */
/* ------------------------------------------------------------------------ */

/* 2(n-1)/n: the share of a vector that crosses each link of a ring of n.
 * 0 for n <= 1 (nothing crosses). */
double hp_ring_factor(int n);
/* S / t in GB/s. */
double hp_algbw(double bytes, double seconds);
/* algbw × 2(n-1)/n over all n ranks (nccl-tests' definition for the
 * all-reduce; hp_coll_bus_factor for the others). */
double hp_busbw(double algbw_gbs, int nranks);
/* Inter-node bytes one NIC sent per second, GB/s, for the three-stage
 * pattern: 2(N-1)/N · S/L / t on N nodes of L ranks. 0 when N == 1. */
double hp_nic_bw(double bytes, double seconds, int nodes, int ranks_per_node);
/* busbw the pattern reaches when every NIC runs at nic_gbs: (n-1)/(N-1)
 * × nic_gbs (from the two formulas above); 0 when N == 1. */
double hp_busbw_from_nic(double nic_gbs, int nodes, int ranks_per_node);

/* ------------------------------------------------------------------------ */
/* The NIC verdict: thresholds in this one place                              */
/* ------------------------------------------------------------------------ */

/*
 * NIC bandwidth as a share of the NIC's line rate, on the large-message
 * plateau (sizes >= HP_PLATEAU_BYTES where run, else the largest size):
 *   >= 80 %   healthy      what a tuned RoCE/IB rail delivers
 *   60-80 %   acceptable   some headroom left (chunk size, CPU, PCIe)
 *   50-60 %   poor         not broken, but look at the suspects below
 *   <  50 %   problem      something is wrong; the usual suspects are listed
 * "poor" shares the suspects' list but is not called a fault, because a
 * busy host path (TCP, host staging) lands there without any
 * misconfiguration.
 */
#define HP_PLATEAU_BYTES   (256ull << 20)
#define HP_HEALTHY_PCT     80.0
#define HP_ACCEPTABLE_PCT  60.0
#define HP_POOR_PCT        50.0

typedef enum hp_verdict {
    HP_VERDICT_UNKNOWN = 0, /* line rate unknown, or nothing crosses nodes */
    HP_VERDICT_HEALTHY,
    HP_VERDICT_ACCEPTABLE,
    HP_VERDICT_POOR,
    HP_VERDICT_PROBLEM,
} hp_verdict_t;

/* pct < 0 means unknown. */
hp_verdict_t hp_verdict_of(double pct);
const char *hp_verdict_name(hp_verdict_t v);      /* "healthy"... */
const char *hp_verdict_range(hp_verdict_t v);     /* ">= 80% of line rate"... */
/* The usual suspects, one per line, each line starting with "  - ". */
const char *hp_verdict_suspects(void);

/* ------------------------------------------------------------------------ */
/* Rows                                                                       */
/* ------------------------------------------------------------------------ */

typedef struct hp_result {
    double time_us;  /* per call; combined over ranks as -a says */
    double algbw;    /* GB/s */
    double busbw;    /* GB/s */
    int64_t wrong;   /* mismatching elements summed over ranks; -1 = not checked */
} hp_result_t;

enum { HP_STAGE_RS = 0, HP_STAGE_INTER = 1, HP_STAGE_AG = 2, HP_NSTAGES = 3 };

typedef struct hp_row {
    char impl[8];        /* "hcoll", "mpi", "nccl" */
    hp_coll_t coll;      /* which collective (0: allreduce) */
    uint64_t bytes;
    size_t count;
    hcoll_dtype_t dtype;
    hcoll_op_t op;       /* meaningful where hp_coll_reduces(coll) */
    hp_result_t oop, ip; /* out-of-place, in-place */
    double nic_gbs;      /* from the faster of oop and ip; < 0 unknown */
    double nic_pct;      /* of the line rate; < 0 unknown */
    int have_stages;
    double stage_us[HP_NSTAGES];
    double ratio;        /* peer rows: hcoll busbw / this busbw; < 0 none */
    char algo[12];       /* hcoll rows: hcoll_comm_last_algo of the timed calls; "-" */
} hp_row_t;

/* Fill the derived columns of one all-reduce result from bytes, time and
 * nranks; hp_coll_result_fill for any collective. */
void hp_result_fill(hp_result_t *r, double bytes, double time_us, int nranks, int64_t wrong);
void hp_coll_result_fill(hp_result_t *r, hp_coll_t c, double bytes, double time_us, int nranks,
                         int64_t wrong);
/* NIC columns of a row (of row->coll), from the faster of its two results. line_bps <= 0:
 * unknown, so nic_pct = -1. nodes == 1: both -1 (no inter-node traffic). */
void hp_row_nic(hp_row_t *row, int nodes, int ranks_per_node, double line_bps);
/* The plateau of one implementation's rows: mean NIC % and mean busbw over
 * rows with bytes >= HP_PLATEAU_BYTES, else over the largest size's row.
 * Returns the number of rows used (0: none of impl). *from_bytes_out gets
 * the smallest size used. */
int hp_plateau(const hp_row_t *rows, int nrows, const char *impl, double *nic_pct_out,
               double *nic_gbs_out, double *busbw_out, uint64_t *from_bytes_out);
/* nccl-tests' "# Avg bus bandwidth": mean over rows of impl of the oop
 * and ip busbw. */
double hp_avg_busbw(const hp_row_t *rows, int nrows, const char *impl);

/* ------------------------------------------------------------------------ */
/* Exact check values                                                         */
/* ------------------------------------------------------------------------ */

/* Fill count elements of rank's input: small integers whose reduction with
 * op over nranks is exact in any order (sums and products stay below the
 * dtype's exact-integer limit; integer wrap-around is exact anyway). */
void hp_check_fill(void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op, int rank,
                   int nranks);
/* Elements of buf that differ (bitwise) from the expected result. */
size_t hp_check_count_wrong(const void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                            int nranks);
/* The same for elements first .. first+count-1 of the reduced vector (a
 * reduce-scatter's block). */
size_t hp_check_count_wrong_at(const void *buf, size_t count, size_t first, hcoll_dtype_t dtype,
                               hcoll_op_t op, int nranks);
/* The values moved by the all-gather and the broadcast: element i of the
 * whole vector is i mod 127 (exact in every dtype), so a block in the
 * wrong place, a stale or an unwritten one shows. fill: elements first ..
 * first+count-1; count_wrong: of a whole vector from element 0. */
void hp_check_fill_copy(void *buf, size_t count, size_t first, hcoll_dtype_t dtype);
size_t hp_check_count_wrong_copy(const void *buf, size_t count, hcoll_dtype_t dtype);
/* 1 when the values stay exact for this dtype/op/nranks; 0 when nranks is
 * too large for the dtype (the check would report false mismatches). */
int hp_check_exact(hcoll_dtype_t dtype, hcoll_op_t op, int nranks);

/* ------------------------------------------------------------------------ */
/* hcoll_perf's options                                                       */
/* ------------------------------------------------------------------------ */

typedef enum hp_peer { HP_PEER_NONE = 0, HP_PEER_MPI, HP_PEER_NCCL } hp_peer_t;
/* Where the benchmark's buffers live. AUTO: device with --peer nccl (NCCL
 * needs device memory), host otherwise. */
typedef enum hp_mem { HP_MEM_AUTO = 0, HP_MEM_HOST, HP_MEM_DEVICE } hp_mem_t;

/* nccl-tests' -a: the time a row reports, from every rank's own. */
typedef enum hp_average {
    HP_AVG_RANK0 = 0,
    HP_AVG_MEAN = 1,
    HP_AVG_MIN = 2,
    HP_AVG_MAX = 3,
} hp_average_t;

typedef struct hp_opts {
    uint64_t minbytes, maxbytes;  /* -b -e */
    uint64_t stepbytes;           /* -i */
    int stepfactor;               /* -f; 0 = use stepbytes */
    int iters, warmup;            /* -n -w */
    int check;                    /* -c: checked iterations, 0 = off */
    hcoll_dtype_t dtype;          /* -d */
    hcoll_op_t op;                /* -o sum|prod|max|min|avg */
    hp_coll_t coll;               /* -o allreduce|reduce_scatter|allgather|broadcast */
    int blocking;                 /* -z */
    int stages;                   /* --stages */
    int root;                     /* -r: the broadcast's root */
    int agg;                      /* -m: calls per timed iteration */
    hp_average_t average;         /* -a: how times combine across ranks */
    int parallel_init;            /* -p: accepted (one communicator per process) */
    const char *csv;              /* -F */
    double line_rate;             /* --line-rate, bytes/s; 0 = not given */
    int np;                       /* -np: self-launch this many ranks; 0 = no */
    int ranks_per_node;           /* --ranks-per-node; 0 = real hosts */
    hp_peer_t peer;               /* --peer */
    hp_mem_t mem;                 /* --mem; HP_MEM_AUTO resolves in hp_opts_parse */
    const char *json;             /* -J */
    const char *plot;             /* --plot */
    double deadline_s;            /* --deadline: self-launch kill deadline */
    int help;                     /* -h */
} hp_opts_t;

void hp_opts_default(hp_opts_t *o);
/* 0 ok (o->help set for -h), -1 usage error with a message in err. Never
 * prints, never exits. argv[0] is the program name. */
int hp_opts_parse(int argc, char **argv, hp_opts_t *o, char *err, size_t errlen);
const char *hp_usage(void);
/* The next size of the sweep after cur (0 = the first); 0 past the end.
 * Each size is rounded down to a whole number of elements of dtype_size. */
uint64_t hp_next_size(const hp_opts_t *o, uint64_t cur);

/* ------------------------------------------------------------------------ */
/* JSON                                                                       */
/* ------------------------------------------------------------------------ */

typedef struct hp_meta {
    int nranks, nodes, ranks_per_node;
    double line_bps;         /* <= 0 unknown */
    const char *line_source; /* where the line rate came from */
    const char *verdict;     /* hcoll's verdict name */
    double plateau_pct;      /* < 0 unknown */
    hp_coll_t coll;          /* the collective of the run */
} hp_meta_t;

/* One object; "rows" holds one row per line, so hp_json_read_busbw (and
 * grep) can read it line by line. 0 ok, -1 on a write error. */
int hp_json_write(FILE *f, const hp_meta_t *meta, const hp_row_t *rows, int nrows);
/* From a file hp_json_write produced: the hcoll rows' plateau busbw (as
 * hp_plateau), the time of the smallest hcoll size (the all-reduce's fixed
 * latency, for bucketing), nranks and nodes of the run. 0 ok, -1 with err. */
int hp_json_read_busbw(const char *path, double *busbw_out, double *latency_us_out,
                       int *nranks_out, int *nodes_out, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Line rate                                                                  */
/* ------------------------------------------------------------------------ */

/* The line rate of the RDMA ports the verbs transport could use (ACTIVE,
 * passing hca_spec = HCOLL_IB_HCA), bytes/s: the slowest of them. root is
 * the directory holding sys/ ("/" on a live system). Returns 0, or -1 when
 * there is no such port. */
int hp_line_rate_rdma(const char *root, const char *hca_spec, double *bps_out, char *source_out,
                      size_t srclen);
/* Rate of a tbf qdisc in the JSON of `tc -j qdisc show dev IF`; -1 none. */
int hp_tc_parse_qdisc_json(const char *json, double *bps_out);
/* Smallest "rate N<unit>" in the text of `tc class show dev IF` (htb,
 * hfsc); -1 none. */
int hp_tc_parse_class_text(const char *text, double *bps_out);
/* The rate limit of one interface: tc qdisc (tbf), then tc class (htb),
 * then sysroot/class/net/IF/speed when IF is a real device (has a
 * device link) and the speed is a real value (> 0). sysroot is "/sys" or a
 * fixture tree; use_tc 0 skips the tc commands. source_out says which. */
int hp_iface_rate_limit(const char *ifname, const char *sysroot, int use_tc, double *bps_out,
                        char *source_out, size_t srclen);
/* The line rate in force, in this order: the RDMA devices' rate
 * when present, else given_bps (--line-rate, > 0), else the smallest rate
 * limit of the interfaces ifname_list selects (NCCL list syntax; NULL or
 * "" = every interface but lo), else unknown (returns -1). source_out says
 * where it came from. */
int hp_line_rate_resolve(double given_bps, const char *ifname_list, const char *sysroot,
                         int use_tc, double *bps_out, char *source_out, size_t srclen);

/* ------------------------------------------------------------------------ */
/* hcoll_plan                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * Bucketing: an all-reduce of B bytes costs about c = lat + B·2(n-1)/n/busbw;
 * the bucket is the smallest power of two whose transfer time is at least
 * HP_PLAN_LAT_RATIO times the fixed latency (latency <= 1/10 of it), unless
 * the caller gives one.
 * Overlap: backward fills the S bytes at an even rate over b seconds, in
 * k = ceil(S/B) buckets; bucket i's all-reduce starts when it is full and
 * the one before it is done, so the last bucket starts no earlier than the
 * end of backward and its whole time c_last is always exposed:
 *   exposed = max(0, finish of the last bucket - b) >= c_last
 * (t - b is what bandwidth alone would say.) Verdict, on what is exposed
 * beyond that unavoidable tail (beyond 0 when k = 1: nothing overlaps):
 *   hidden          nothing: the all-reduce keeps pace with backward
 *   partly exposed  at most (HP_PLAN_PARTLY_MAX - 1) x b: bucket/chunk
 *                   tuning or a modest busbw gain can hide it
 *   exposed         beyond
 */
#define HP_PLAN_PARTLY_MAX 1.25
#define HP_PLAN_LAT_RATIO  10.0
#define HP_PLAN_HOP_US     5.0 /* default latency per inter-node ring step */

typedef enum hp_plan_verdict {
    HP_PLAN_HIDDEN = 0,
    HP_PLAN_PARTLY_EXPOSED,
    HP_PLAN_EXPOSED,
} hp_plan_verdict_t;

typedef struct hp_plan_in {
    double bytes;        /* gradient bytes per rank */
    double backward_s;
    int nodes, ranks_per_node;
    double busbw;        /* bytes/s */
    double latency_s;    /* fixed cost of one all-reduce; <= 0: from hops */
    double bucket_bytes; /* bucket size to model; <= 0: the rule's */
} hp_plan_in_t;

typedef struct hp_plan_out {
    int nranks;
    double factor;        /* 2(n-1)/n */
    double t_s;           /* S · factor / busbw */
    double naive_t_s;     /* S / busbw: the common mistake */
    double exposed_s;     /* bucketed, the last bucket included (above) */
    hp_plan_verdict_t verdict;
    double busbw_needed;  /* bytes/s to make t == backward */
    double latency_s;     /* the one used */
    uint64_t bucket_bytes;
    uint64_t nbuckets;
    double bucket_t_s;    /* one bucket's all-reduce */
    double bw_exposed_s;  /* max(0, t - backward): bandwidth alone */
    double last_bucket_s; /* the last bucket's all-reduce, exposed always */
} hp_plan_out_t;

/* 0 ok, -1 invalid input (non-positive sizes, times or counts). */
int hp_plan_compute(const hp_plan_in_t *in, hp_plan_out_t *out);
const char *hp_plan_verdict_name(hp_plan_verdict_t v);

typedef struct hp_plan_opts {
    double bytes;              /* -s/--bytes */
    double backward_s;         /* -t/--backward */
    int nodes, ranks_per_node; /* -N, -L */
    double busbw[8];           /* --busbw, comma list of up to 8 */
    int nbusbw;
    const char *json;          /* --from-json */
    double line_rate;          /* --line-rate */
    double efficiency;         /* --efficiency, 0..1 (or %) */
    double latency_s;          /* --latency; 0 = from JSON or hops */
    double bucket;             /* --bucket; 0 = the rule's */
    int terse;                 /* --terse: one key=value line per busbw */
    int help;
} hp_plan_opts_t;

void hp_plan_opts_default(hp_plan_opts_t *o);
int hp_plan_opts_parse(int argc, char **argv, hp_plan_opts_t *o, char *err, size_t errlen);
const char *hp_plan_usage(void);

#endif
