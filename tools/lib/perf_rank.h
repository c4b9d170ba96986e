/*
 * The pieces of one hcoll_perf rank, shared by bin/hcoll_perf (which wires
 * them together in main) and nothing else. Unlike perf.h, these talk to
 * the other ranks, print rank 0's table to stdout, and stop the process on
 * the first error (on every rank, with a message on stderr): a benchmark
 * has nothing better to do.
 *
 *   perf_launch.c     -np N: fork the ranks here with a loopback rendezvous;
 *                     the rank a launcher gives before any init
 *   perf_bench.c      one rank's state, errors, cross-rank helpers on hcoll,
 *                     the timed loops of one size (hcoll and the peer)
 *   perf_gpu.c        the buffers: host memory, or device memory on this
 *                     rank's GPU (--mem device)
 *   perf_peer_nccl.c  --peer nccl
 *   perf_out.c        the table, the verdict, -J and --plot
 * The MPI peer needs mpi.h and stays in tools/hcoll_perf.c, which is built
 * with mpicc where Open MPI is installed.
 */
#ifndef HP_PERF_RANK_H
#define HP_PERF_RANK_H

#include <stddef.h>
#include <stdint.h>

#include "gdr/gdr.h"
#include "hcoll.h"
#include "intra/nccl_api.h"
#include "perf.h"

/* Exit codes: 0; 1 on an error or a non-zero #wrong; 2 usage; 3 when
 * the library's collective says HCOLL_ERR_UNSUPPORTED. */
#define HP_EXIT_WRONG 1
#define HP_EXIT_USAGE 2
#define HP_EXIT_UNSUPPORTED 3

typedef struct hp_perf hp_perf_t;

/* A peer implementation timed on the same buffers: MPI or NCCL. */
typedef struct hp_peer_ops {
    const char *name;
    /* One call of p->o.coll on p's buffers, out of place (ip 0) or in
     * place (ip 1); *res_out (when res_out is given) gets where the result
     * is. 0 ok; -1 with a message in err. */
    int (*call)(hp_perf_t *p, int ip, size_t count, void **res_out, char *err, size_t errlen);
    void (*barrier)(hp_perf_t *p);
    /* Wait until every call issued so far is done; 0 ok, -1 with err.
     * NULL: calls complete before they return (MPI). */
    int (*sync)(hp_perf_t *p, char *err, size_t errlen);
} hp_peer_ops_t;

/* --mem device: this rank's GPU. */
typedef struct hp_gpu {
    const hc_cu_api_t *cu; /* NULL: host memory */
    int ordinal, cudev;
    void *ctx, *stream;
    char busid[32];
} hp_gpu_t;

/* --peer nccl. */
typedef struct hp_nccl {
    const hc_nccl_api_t *nc;
    hc_nccl_comm_t comm;
    int dtype, op;
} hp_nccl_t;

struct hp_perf {
    hp_opts_t o;
    hcoll_comm_t comm;
    int rank, nranks, nodes, local_size;
    int mpi;                 /* MPI_Init was called */
    /* Ends MPI (MPI_Abort when abort_code != 0, else MPI_Finalize) where
     * it was started; NULL without MPI. */
    void (*finish)(hp_perf_t *p, int abort_code);
    int async_ok;            /* hcoll_allreduce_async works */
    double line_bps;
    char line_src[200];
    void *send, *recv;       /* host, or device addresses with --mem device */
    void *stage;             /* host copy for -c fills and reads */
    hp_gpu_t gpu;
    hp_nccl_t nccl;
    int64_t *scratch;        /* barrier and cross-rank reductions */
    const hp_peer_ops_t *peer;
    hp_row_t *rows;
    int nrows, caprows;
    int stages_known;        /* the library reported stage times */
};

/* ---- perf_bench.c -------------------------------------------------------- */

double hp_now_s(void); /* CLOCK_MONOTONIC, seconds */

/* Stop this rank: a message on stderr, hcoll_comm_abort (so that peers
 * stuck in a call see it go), p->finish, exit. */
void hp_die_status(hp_perf_t *p, const char *what, hcoll_status_t st)
    __attribute__((noreturn));
void hp_die(hp_perf_t *p, const char *fmt, const char *detail) __attribute__((noreturn));

/* Cross-rank helpers on hcoll itself (small all-reduces). */
void hp_barrier(hp_perf_t *p);
void hp_reduce_sum(hp_perf_t *p, int64_t *v, size_t n);

/* The send and receive pointers of one call of p->o.coll with count (the
 * collective's own count argument), out of place (ip 0: send, recv) or in
 * place as NCCL lays it out (ip 1: the whole vector in recv; the
 * reduce-scatter's result and the all-gather's input are block rank of
 * it). */
void hp_coll_bufs(const hp_perf_t *p, int ip, size_t count, const void **s_out, void **r_out);
/* 1 when -c can check p's collective exactly (always for the copies). */
int hp_checkable(const hp_perf_t *p);

/* After hcoll_comm_init: this rank's place in the job, the line rate
 * (rank 0), the buffers and, with --peer nccl, the NCCL communicator. */
void hp_rank_open(hp_perf_t *p);
/* One size of the sweep: check, warm-up and timed calls of hcoll and the
 * peer, reduced over ranks; rank 0 prints the rows. */
void hp_run_size(hp_perf_t *p, uint64_t bytes);
/* Every rank learns rank 0's exit code (rc on rank 0, 0 elsewhere), so
 * that the codes agree: returns the code this rank exits with. */
int hp_rank_agree(hp_perf_t *p, int rc);
/* The peer, the communicator, MPI (p->finish), then the buffers. */
void hp_rank_close(hp_perf_t *p);

/* ---- perf_gpu.c ---------------------------------------------------------- */

/* Local rank i on GPU i mod #GPUs, its primary context, one stream. */
void hp_gpu_open(hp_perf_t *p);
void hp_gpu_close(hp_perf_t *p);
/* send, recv and stage of o.maxbytes (device memory with --mem device),
 * zeroed; scratch for the cross-rank helpers. */
void hp_buffers_open(hp_perf_t *p);
void hp_buffers_close(hp_perf_t *p);
void *hp_buf_alloc(hp_perf_t *p, size_t n);
void hp_buf_free(hp_perf_t *p, void *b);
/* Wait for everything on this rank's stream; nothing to do on the host. */
void hp_buf_sync(hp_perf_t *p);
/* n bytes between the host and a benchmark buffer, complete on return. */
void hp_buf_put(hp_perf_t *p, void *dst, const void *host, size_t n);
void hp_buf_get(hp_perf_t *p, void *host, const void *src, size_t n);

/* ---- perf_peer_nccl.c ---------------------------------------------------- */

/* Collective over hcoll: every rank ends with the NCCL communicator and
 * p->peer set, or every rank stops with a message. */
void hp_peer_nccl_open(hp_perf_t *p);
void hp_peer_nccl_close(hp_perf_t *p);

/* ---- perf_out.c ---------------------------------------------------------- */

/* Rank 0: the lines before the table, then its header. */
void hp_print_preamble(const hp_perf_t *p);
void hp_print_header(const hp_perf_t *p);
void hp_print_row(const hp_perf_t *p, const hp_row_t *r);
double hp_row_best_busbw(const hp_row_t *r);
/* Rank 0: #wrong, averages, the NIC verdict, then -J and --plot. Returns
 * the exit code (HP_EXIT_WRONG on a non-zero #wrong, 1 on a write
 * error, else 0). */
int hp_print_summary(const hp_perf_t *p);

/* ---- perf_launch.c ------------------------------------------------------- */

/* This process's rank as its launcher tells it, before any init; -1. */
int hp_launcher_rank(void);
/* -np: fork o->np ranks that each run rank_main(o) with a loopback
 * rendezvous, wait, and kill them all once one fails (or at --deadline).
 * Returns the job's exit code. */
int hp_launch_np(const hp_opts_t *o, int (*rank_main)(const hp_opts_t *o));

#endif
