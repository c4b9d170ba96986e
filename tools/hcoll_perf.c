/*
 * hcoll_perf: nccl-tests' all_reduce_perf (and, with -o reduce_scatter,
 * allgather or broadcast, its reduce_scatter_perf, all_gather_perf and
 * broadcast_perf) for the three-stage pattern.
 * This file wires the pieces of tools/lib/perf_rank.h together and holds
 * what needs mpi.h (MPI_Init, the unique id by MPI_Bcast, --peer mpi),
 * since it alone is built with mpicc where Open MPI is installed.
 * hcoll is driven through its public API (hcoll.h) only; CUDA and NCCL
 * (--mem device, --peer nccl) through the library's run-time loaders
 * (gdr/gdr.h, intra/nccl_api.h), so the binary links neither.
 *
 *   sizes -b..-e ─► per size: check (-c) ─► warm-up (-w) ─► -n timed calls,
 *                   out of place then in place, then the same for --peer
 *                 ─► max of times / sum of #wrong over ranks (a small
 *                   hcoll_allreduce, as nccl-tests uses its own collective)
 *                 ─► rank 0: a row (+ NIC columns, + --stages split)
 *   end: # Avg bus bandwidth, the NIC verdict on the plateau, -J, --plot
 *
 * Launch: mpirun/srun (rank from the launcher; under Open MPI the unique id
 * travels by MPI_Bcast unless HCOLL_ROOT is set), the library's own env
 * launch (HCOLL_RANK, HCOLL_NRANKS, HCOLL_ROOT, HCOLL_SECRET), or -np N:
 * fork N ranks here with a loopback rendezvous; --ranks-per-node groups
 * them into emulated nodes through HCOLL_HOSTID (and NCCL_HOSTID, so that
 * NCCL, for hcoll's intra-node stages and for --peer nccl, sees the same
 * nodes).
 *
 * --mem device: local rank i uses GPU i mod #GPUs (its primary context) and
 * one non-blocking CUDA stream; every call goes on that stream, a timed
 * batch ends with a stream synchronize, -c fills and reads through host
 * copies. --peer nccl: one flat NCCL communicator over all ranks, its
 * unique id carried by a small hcoll_allreduce.
 *
 * Exit: 0; 1 on an error or a non-zero #wrong; 2 usage; 3 when the
 * library's collective says HCOLL_ERR_UNSUPPORTED (a library without it),
 * so that scripts can tell "not there" from "broken".
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hcoll.h"
#include "lib/perf.h"
#include "lib/perf_rank.h"

#ifndef HCOLL_PERF_MPI
#define HCOLL_PERF_MPI 0
#endif
#if HCOLL_PERF_MPI
#include <mpi.h>
#endif

static void finish_mpi(hp_perf_t *p, int abort_code)
{
#if HCOLL_PERF_MPI
    if (p->mpi) {
        if (abort_code)
            MPI_Abort(MPI_COMM_WORLD, abort_code);
        MPI_Finalize();
    }
#else
    (void)p, (void)abort_code;
#endif
}


#if HCOLL_PERF_MPI
/* MPI's type (and op, for the reductions) of p's collective; the copies
 * move half types as 16-bit words and take no op. */
static int mpi_types(hp_coll_t c, hcoll_dtype_t t, hcoll_op_t op, MPI_Datatype *dt, MPI_Op *mop)
{
    switch (t) {
    case HCOLL_FLOAT32: *dt = MPI_FLOAT; break;
    case HCOLL_FLOAT64: *dt = MPI_DOUBLE; break;
    case HCOLL_INT8: *dt = MPI_INT8_T; break;
    case HCOLL_UINT8: *dt = MPI_UINT8_T; break;
    case HCOLL_INT32: *dt = MPI_INT32_T; break;
    case HCOLL_INT64: *dt = MPI_INT64_T; break;
    case HCOLL_FLOAT16:
    case HCOLL_BFLOAT16:
        if (hp_coll_reduces(c))
            return -1; /* MPI has no half types to reduce */
        *dt = MPI_UINT16_T;
        break;
    default: return -1;
    }
    *mop = MPI_OP_NULL;
    if (!hp_coll_reduces(c))
        return 0;
    switch (op) {
    case HCOLL_SUM: *mop = MPI_SUM; break;
    case HCOLL_PROD: *mop = MPI_PROD; break;
    case HCOLL_MAX: *mop = MPI_MAX; break;
    case HCOLL_MIN: *mop = MPI_MIN; break;
    default: return -1; /* no MPI_AVG */
    }
    return 0;
}

/*
 * MPI's counterpart of p's collective on the same buffers: MPI_Allreduce,
 * MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast (root -r), in place
 * with MPI_IN_PLACE. MPI's in-place reduce-scatter leaves the result at
 * the start of the receive buffer, not at block rank as NCCL's does.
 */
static int mpi_call(hp_perf_t *p, int ip, size_t count, void **res_out, char *err,
                    size_t errlen)
{
    MPI_Datatype dt;
    MPI_Op op;
    const void *s;
    void *r;
    int rc;
    const char *what;
    hp_coll_bufs(p, ip, count, &s, &r);
    if (mpi_types(p->o.coll, p->o.dtype, p->o.op, &dt, &op) != 0) {
        snprintf(err, errlen, "MPI has no %s %s", hcoll_dtype_name(p->o.dtype),
                 hcoll_op_name(p->o.op));
        return -1;
    }
    if (count > INT_MAX) {
        snprintf(err, errlen, "MPI: count %zu exceeds INT_MAX", count);
        return -1;
    }
    int n = (int)count;
    switch (p->o.coll) {
    case HP_COLL_REDUCE_SCATTER:
        what = "MPI_Reduce_scatter_block";
        if (ip)
            r = (void *)s;
        rc = MPI_Reduce_scatter_block(ip ? MPI_IN_PLACE : s, r, n, dt, op, MPI_COMM_WORLD);
        break;
    case HP_COLL_ALLGATHER:
        what = "MPI_Allgather";
        rc = MPI_Allgather(ip ? MPI_IN_PLACE : s, n, dt, r, n, dt, MPI_COMM_WORLD);
        break;
    case HP_COLL_BROADCAST:
        what = "MPI_Bcast";
        /* One buffer: the root sends from its sendbuf, the others
         * receive into recvbuf (the root's result is its own input). */
        if (p->rank == p->o.root)
            r = (void *)s;
        rc = MPI_Bcast(r, n, dt, p->o.root, MPI_COMM_WORLD);
        break;
    default:
        what = "MPI_Allreduce";
        rc = MPI_Allreduce(ip ? MPI_IN_PLACE : s, r, n, dt, op, MPI_COMM_WORLD);
        break;
    }
    if (rc != MPI_SUCCESS) {
        int len = 0;
        char msg[MPI_MAX_ERROR_STRING];
        MPI_Error_string(rc, msg, &len);
        snprintf(err, errlen, "%s: %s", what, msg);
        return -1;
    }
    if (res_out)
        *res_out = r;
    return 0;
}

static void mpi_barrier(hp_perf_t *p)
{
    (void)p;
    MPI_Barrier(MPI_COMM_WORLD);
}

static const hp_peer_ops_t mpi_peer = { "mpi", mpi_call, mpi_barrier, NULL };
#endif


#if HCOLL_PERF_MPI
static int under_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}
#endif

#if HCOLL_PERF_MPI
/* The usual MPI way: rank 0's unique id, broadcast. */
static hcoll_status_t comm_init_mpi(hp_perf_t *p)
{
    hcoll_status_t st;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    p->rank = rank;
    hcoll_unique_id_t id;
    memset(&id, 0, sizeof id);
    int ok = 1;
    if (rank == 0 && (st = hcoll_get_unique_id(&id)) != HCOLL_SUCCESS) {
        fprintf(stderr, "hcoll_perf: hcoll_get_unique_id: %s (%s)\n", hcoll_status_name(st),
                hcoll_comm_last_error(NULL));
        ok = 0;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    return hcoll_comm_init(&p->comm, size, rank, &id, NULL);
}
#endif

/* The communicator, by MPI under mpirun unless the env launch variables
 * are set, else by hcoll_comm_init_env; exits on failure. */
static void comm_create(hp_perf_t *p)
{
    hcoll_status_t st;
#if HCOLL_PERF_MPI
    if (p->mpi && !getenv("HCOLL_RANK") && !getenv("HCOLL_ROOT") && !getenv("MASTER_ADDR"))
        st = comm_init_mpi(p);
    else
#endif
        st = hcoll_comm_init_env(&p->comm, NULL);
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "hcoll_perf: rank %d: hcoll_comm_init: %s (%s)\n", hp_launcher_rank(),
                hcoll_status_name(st), hcoll_comm_last_error(NULL));
        if (hp_launcher_rank() < 0)
            fprintf(stderr, "hcoll_perf: no launcher found: use -np N on one host, or run "
                            "under mpirun/srun/torchrun, or set HCOLL_RANK, HCOLL_NRANKS, "
                            "HCOLL_ROOT and HCOLL_SECRET\n");
        finish_mpi(p, 1);
        exit(1);
    }
}

/* Under mpirun: MPI_Init, and the MPI peer when --peer mpi asks for it.
 * Returns -1 to go on, or the code to exit with. */
static int rank_mpi_init(hp_perf_t *p)
{
    const hp_opts_t *o = &p->o;
#if HCOLL_PERF_MPI
    if (under_mpirun() && !getenv("HCOLL_PERF_CHILD")) {
        MPI_Init(NULL, NULL);
        p->mpi = 1;
        if (o->peer == HP_PEER_MPI) {
            MPI_Datatype dt;
            MPI_Op mop;
            if (mpi_types(o->coll, o->dtype, o->op, &dt, &mop) != 0) {
                fprintf(stderr, "hcoll_perf: --peer mpi: MPI has no %s/%s; use another -d/-o\n",
                        hcoll_dtype_name(o->dtype), hcoll_op_name(o->op));
                finish_mpi(p, 0);
                return HP_EXIT_USAGE;
            }
            p->peer = &mpi_peer;
        }
    }
#endif
    if (o->peer == HP_PEER_MPI && !p->peer) {
        fprintf(stderr, "hcoll_perf: --peer mpi: %s\n",
                HCOLL_PERF_MPI ? "not running under mpirun (MPI must launch the ranks)"
                               : "this hcoll_perf was built without MPI (install Open MPI's "
                                 "mpicc and rebuild)");
        return HP_EXIT_USAGE;
    }
    return -1;
}

/* --ranks-per-node under a launcher: this rank's emulated node, through
 * HCOLL_HOSTID (and NCCL_HOSTID, so that NCCL sees the same nodes).
 * Returns -1 to go on, or the code to exit with. */
static int rank_emulated_node(hp_perf_t *p)
{
    const hp_opts_t *o = &p->o;
    if (o->ranks_per_node <= 0 || getenv("HCOLL_PERF_CHILD"))
        return -1;
    int r = hp_launcher_rank();
#if HCOLL_PERF_MPI
    if (p->mpi)
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
#endif
    if (r < 0) {
        fprintf(stderr, "hcoll_perf: --ranks-per-node: no rank from a launcher "
                        "(HCOLL_RANK, mpirun, srun, torchrun); or use -np\n");
        finish_mpi(p, 0);
        return HP_EXIT_USAGE;
    }
    char host[64];
    snprintf(host, sizeof host, "hcoll-perf-node%d", r / o->ranks_per_node);
    setenv("HCOLL_HOSTID", host, 1);
    setenv("NCCL_HOSTID", host, 1);
    return -1;
}

static int rank_main(const hp_opts_t *o)
{
    hp_perf_t P, *p = &P;
    memset(p, 0, sizeof *p);
    p->o = *o;
    p->async_ok = 1;
    p->rank = hp_launcher_rank();
    p->finish = finish_mpi;

    int rc = rank_mpi_init(p);
    if (rc < 0)
        rc = rank_emulated_node(p);
    if (rc >= 0)
        return rc;
    comm_create(p);
    hp_rank_open(p);
    if (p->rank == 0)
        hp_print_preamble(p);
    for (uint64_t b = hp_next_size(o, 0); b; b = hp_next_size(o, b))
        hp_run_size(p, b);
    rc = p->rank == 0 ? hp_print_summary(p) : 0;
    fflush(stdout);
    rc = hp_rank_agree(p, rc);
    hp_rank_close(p);
    return rc;
}

int main(int argc, char **argv)
{
    hp_opts_t o;
    char err[300];
    hp_opts_default(&o);
    if (hp_opts_parse(argc, argv, &o, err, sizeof err) != 0) {
        fprintf(stderr, "hcoll_perf: %s\n%s", err, hp_usage());
        return HP_EXIT_USAGE;
    }
    if (o.help) {
        fputs(hp_usage(), stdout);
        return 0;
    }
    if (o.np > 0 && !getenv("HCOLL_PERF_CHILD")) {
        /* Under a launcher every process is one rank already: -np (or
         * nccl-tests' -t/-g > 1) would fork more in each. */
        if (hp_launcher_rank() >= 0) {
            fprintf(stderr, "hcoll_perf: -np %d (or -t x -g > 1) under a launcher: hcoll_perf "
                    "runs one rank per process; have the launcher start %d processes instead\n",
                    o.np, o.np);
            return HP_EXIT_USAGE;
        }
        return hp_launch_np(&o, rank_main);
    }
    return rank_main(&o);
}
