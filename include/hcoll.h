/*
 * hcoll.h: the whole public contract of hcoll, a hierarchical all-reduce
 * library for rail-optimized GPU clusters.
 *
 *   stage 1  intra-node reduce-scatter   (NVLink via NCCL, or shared memory)
 *   stage 2  inter-node ring all-reduce  (one rail per local rank: verbs or TCP)
 *   stage 3  intra-node all-gather       (NVLink via NCCL, or shared memory)
 *
 * Conventions that hold for every call below unless its comment says
 * otherwise:
 *   - Calls return an hcoll_status_t. HCOLL_SUCCESS is 0; every other value
 *     is an error (or HCOLL_IN_PROGRESS where stated). Nothing ever prints to
 *     stdout, exits or aborts the process.
 *   - When a call on a communicator fails, hcoll_comm_last_error(comm) gives
 *     a message that says what went wrong; calls without a communicator keep
 *     theirs per thread, readable through hcoll_comm_last_error(NULL).
 *   - Outputs (*_out arguments) are written only on success.
 *   - Thread safety: distinct communicators may be used from distinct threads
 *     at once. One communicator's calls are serialised by the caller, except
 *     hcoll_comm_abort, hcoll_comm_get_async_error, hcoll_comm_last_error and
 *     the rank/size queries, which may be called from any thread at any time.
 *   - fork: a communicator belongs to the process that created it. In a
 *     forked child, every call on it (destroy and abort included) fails with
 *     HCOLL_ERR_INVALID_ARG and leaves the parent's connections, threads and
 *     segments alone; the child may create communicators of its own. So do
 *     calls on the parent's requests (hcoll_test, hcoll_wait, ...; message
 *     in hcoll_comm_last_error(NULL)). A unique id made before the fork
 *     may be used in the child, which listens on a socket of its own.
 *   - Configuration comes from an hcoll_config_t (explicit fields win), then
 *     the HCOLL_* environment variables, then built-in defaults; run
 *     `hcoll_info --env` for the full list.
 */
#ifndef HCOLL_H
#define HCOLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HCOLL_API __attribute__((visibility("default")))
#else
#define HCOLL_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                    */
/* ------------------------------------------------------------------------ */

#define HCOLL_VERSION_MAJOR 0
#define HCOLL_VERSION_MINOR 1
#define HCOLL_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, comparable with hcoll_version(). */
#define HCOLL_VERSION_CODE \
    (HCOLL_VERSION_MAJOR * 10000 + HCOLL_VERSION_MINOR * 100 + HCOLL_VERSION_PATCH)
#define HCOLL_VERSION_STRING "0.1.0"

/*
 * hcoll_version: the HCOLL_VERSION_CODE the library was built with, so a
 * program can check that the header it was compiled against matches the
 * library it loaded. Non-blocking, local, thread-safe.
 */
HCOLL_API int hcoll_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                               */
/* ------------------------------------------------------------------------ */

/*
 * X(NAME, value, text). Codes are only ever appended; a value never changes
 * meaning once released.
 */
#define HCOLL_STATUS_MAP(X)                                                   \
    X(SUCCESS,          0,  "success")                                        \
    X(IN_PROGRESS,      1,  "operation in progress")                          \
    X(ERR_INVALID_ARG,  2,  "invalid argument")                               \
    X(ERR_NO_MEMORY,    3,  "out of memory")                                  \
    X(ERR_SYSTEM,       4,  "system call failed")                             \
    X(ERR_NETWORK,      5,  "network error")                                  \
    X(ERR_TIMEOUT,      6,  "timed out")                                      \
    X(ERR_PEER_FAILED,  7,  "a peer rank failed")                             \
    X(ERR_ABORTED,      8,  "communicator aborted")                           \
    X(ERR_UNSUPPORTED,  9,  "not supported")                                  \
    X(ERR_CUDA,         10, "CUDA error")                                     \
    X(ERR_NCCL,         11, "NCCL error")                                     \
    X(ERR_RDMA,         12, "RDMA (verbs) error")                             \
    X(ERR_INTERNAL,     13, "internal error")                                 \
    X(ERR_MISMATCH,     14, "arguments differ between ranks")

#define HCOLL_STATUS_ENUM_(name, value, text) HCOLL_##name = value,
typedef enum hcoll_status {
    HCOLL_STATUS_MAP(HCOLL_STATUS_ENUM_)
    HCOLL_STATUS_COUNT_ /* one past the last code; not a status */
} hcoll_status_t;
#undef HCOLL_STATUS_ENUM_

/*
 * hcoll_strerror: a static, human-readable text for a status ("timed out").
 * hcoll_status_name: its symbolic name ("HCOLL_ERR_TIMEOUT").
 * Both return "unknown status" for a value that is not a code. Non-blocking,
 * local, thread-safe; the strings are never freed.
 */
HCOLL_API const char *hcoll_strerror(hcoll_status_t status);
HCOLL_API const char *hcoll_status_name(hcoll_status_t status);

/* ------------------------------------------------------------------------ */
/* Data types and reduction operations                                        */
/* ------------------------------------------------------------------------ */

typedef enum hcoll_dtype {
    HCOLL_FLOAT32  = 0,
    HCOLL_FLOAT16  = 1, /* IEEE 754 binary16 */
    HCOLL_BFLOAT16 = 2,
    HCOLL_FLOAT64  = 3,
    HCOLL_INT8     = 4,
    HCOLL_UINT8    = 5,
    HCOLL_INT32    = 6,
    HCOLL_INT64    = 7,
    HCOLL_DTYPE_COUNT_ /* not a type */
} hcoll_dtype_t;

/*
 * Semantics (host buffers; device buffers follow them except where said):
 *   - FLOAT16/BFLOAT16 combine two values in float and round the result to
 *     nearest-even when it is stored, at every step of the reduction.
 *   - Integer SUM and PROD wrap around (two's complement); they never trap.
 *   - MAX and MIN propagate NaN: if either input is NaN, the result is NaN.
 *     On device buffers with several ranks per node, NCCL's intra-node
 *     MAX/MIN do not propagate NaN, so a NaN may vanish there.
 *   - AVG of the floating types (FLOAT32, FLOAT16, BFLOAT16, FLOAT64)
 *     multiplies each rank's input by 1/n (n ranks) first, then sums as
 *     SUM does, so an average that fits the type never overflows on the way
 *     (NCCL's ncclAvg does the same). The multiplier is the float 1.0f/n
 *     (FLOAT64: the double 1.0/n); FLOAT32 multiplies in float, FLOAT64 in
 *     double, FLOAT16/BFLOAT16 widen the input to float, multiply by the
 *     float 1.0f/n and round to nearest-even when the product is stored.
 *     The result is therefore rounded sums of rounded products, which in
 *     general is not the correctly rounded mean.
 *     Device buffers: the NCCL intra-node stage scales (a PreMulSum op;
 *     NCCL takes the scalar in the type, so for FLOAT16/BFLOAT16 AVG's 1/n
 *     is rounded to the type first: exact when n is a power of two); with
 *     one rank per node the staged copy is scaled on the host as above.
 *     With a GPUDirect ring, on a single-rank communicator, and for a
 *     device-resident scalar where there is no NCCL stage (one rank per
 *     node), hcoll's scaling kernel multiplies the input on the stream,
 *     exactly as the host does (same multiplier and rounding; a single
 *     rank's AVG is a copy). A library built without its CUDA kernels
 *     refuses those cases with HCOLL_ERR_UNSUPPORTED.
 *     AVG of the integer types is SUM over all ranks, then one division by
 *     the number of ranks, truncating toward zero (C's '/').
 *   - A PREMUL_SUM op (hcoll_op_create_premul_sum) is SUM over ranks of
 *     scalar x input, each product computed and rounded as AVG's above
 *     with the rank's scalar instead of 1/n; for integers the product
 *     wraps modulo 2^width as SUM does.
 *   - Results are bit-identical on every rank: each element is reduced in
 *     one fixed order, whatever the rank or the timing. On host buffers
 *     that order is: each node folds its local ranks in local-rank order
 *     0..L-1, then the node sums are folded along the rail's ring (with
 *     unequal nodes, or one rank per node, the ring folds all ranks). A
 *     reduce-scatter's ring starts one position later than an all-reduce's,
 *     so a float block of a reduce-scatter may differ in its last bits from
 *     that block of an all-reduce of the same inputs. docs/design.md draws
 *     the orders; tests/test_sweep.c checks them bit for bit.
 */
typedef enum hcoll_op {
    HCOLL_SUM  = 0,
    HCOLL_PROD = 1,
    HCOLL_MAX  = 2,
    HCOLL_MIN  = 3,
    HCOLL_AVG  = 4,
    HCOLL_OP_COUNT_ /* not an op */
} hcoll_op_t;

/*
 * hcoll_dtype_size: bytes per element, 0 for a value that is not a type.
 * hcoll_dtype_name / hcoll_op_name: "float32", "sum"...; "unknown" otherwise.
 * Non-blocking, local, thread-safe.
 */
HCOLL_API size_t hcoll_dtype_size(hcoll_dtype_t dtype);
HCOLL_API const char *hcoll_dtype_name(hcoll_dtype_t dtype);
HCOLL_API const char *hcoll_op_name(hcoll_op_t op);


/* ------------------------------------------------------------------------ */
/* Handles                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct hcoll_comm *hcoll_comm_t;       /* a communicator */
typedef struct hcoll_request *hcoll_request_t; /* one non-blocking operation */

/*
 * The rendezvous identity of a job: the root's listening address and a
 * random secret. Opaque; copy it byte for byte to every rank (MPI_Bcast, a
 * file, a key-value store). Treat it as a credential: whoever holds it can
 * join the job.
 */
#define HCOLL_UNIQUE_ID_BYTES 128
typedef struct hcoll_unique_id {
    unsigned char internal[HCOLL_UNIQUE_ID_BYTES];
} hcoll_unique_id_t;

/* ------------------------------------------------------------------------ */
/* Configuration                                                              */
/* ------------------------------------------------------------------------ */

#define HCOLL_CONFIG_MAGIC   0x48434f4cu /* "HCOL" */
#define HCOLL_CONFIG_VERSION 3u /* 2: blocking, rail; 3: op_timeout_ms */
/* A field left at this value is taken from the environment or default. */
#define HCOLL_CONFIG_UNDEF_INT (-2147483647 - 1)

/*
 * Per-communicator settings. Always start from HCOLL_CONFIG_INITIALIZER and
 * then set the fields you care about; a config whose size, magic or version
 * is not one this library knows is rejected with HCOLL_ERR_INVALID_ARG.
 * Fields appended by later versions are defaulted for programs built against
 * an older header (their size is smaller).
 */
typedef struct hcoll_config {
    size_t   size;    /* sizeof(hcoll_config_t), set by the initializer */
    uint32_t magic;   /* HCOLL_CONFIG_MAGIC */
    uint32_t version; /* HCOLL_CONFIG_VERSION */
    /* Deadline in milliseconds of each set-up step (HCOLL_TIMEOUT_MS; what
     * it bounds is in README's knob table). */
    int timeout_ms;
    /* Pipelining chunk in bytes, 0 = environment/default (HCOLL_CHUNK_BYTES). */
    size_t chunk_bytes;
    /* "auto", "ib" or "tcp"; NULL = environment/default (HCOLL_NET). */
    const char *net;
    /* Interface list in NCCL syntax; NULL = environment (HCOLL_SOCKET_IFNAME). */
    const char *socket_ifname;
    /* Version 2. 1 (default): hcoll_comm_init, hcoll_comm_init_env and
     * hcoll_comm_split block until the communicator is ready. 0: they return
     * HCOLL_IN_PROGRESS at once with a valid handle and the set-up goes on in
     * a background thread; poll hcoll_comm_get_async_error until it is no
     * longer HCOLL_IN_PROGRESS. Any other value is HCOLL_ERR_INVALID_ARG. */
    int blocking;
    /* Version 2. This rank's rail: which interface (the rail-th address
     * HCOLL_SOCKET_IFNAME selects) and which RDMA NIC its inter-node ring
     * uses. -1 = HCOLL_RAIL, else the default: the local rank for
     * hcoll_comm_init, the rank's rail in the parent for hcoll_comm_split. */
    int rail;
    /* Version 3. How long an operation waits without progress for peers
     * that are alive but late, in milliseconds (HCOLL_OP_TIMEOUT_MS, same
     * bounds: 0..86400000, 0 = no limit); a per-communicator value, as a
     * framework's group timeout needs (torch's "hcoll" backend passes its
     * process group's timeout here). HCOLL_CONFIG_UNDEF_INT =
     * environment/default; a split with config NULL keeps the parent's. */
    int op_timeout_ms;
} hcoll_config_t;

#define HCOLL_CONFIG_INITIALIZER                                              \
    {                                                                         \
        sizeof(hcoll_config_t), HCOLL_CONFIG_MAGIC, HCOLL_CONFIG_VERSION,     \
        HCOLL_CONFIG_UNDEF_INT, 0, NULL, NULL, 1, -1, HCOLL_CONFIG_UNDEF_INT  \
    }

/* ------------------------------------------------------------------------ */
/* Communicator lifecycle                                                     */
/* ------------------------------------------------------------------------ */

/*
 * hcoll_get_unique_id: called once per communicator, by the process that
 * will be rank 0 or by any other process on rank 0's host (a driver that
 * hands the id to the ranks and may stay alive). Reserves the rendezvous
 * port on the address of the first interface HCOLL_SOCKET_IFNAME selects
 * (never the wildcard address) and fills *id_out with that address and a
 * fresh 256-bit secret from the kernel's random source. The reserving
 * socket is bound but does not listen; it stays in this process, reachable
 * only through the id's secret. Rank 0's hcoll_comm_init listens on it when
 * it runs in this process, else binds the same port itself (both sockets
 * use SO_REUSEPORT, so rank 0 must run as the same user); connections go
 * only to rank 0's listening socket. Non-blocking, local, thread-safe.
 */
HCOLL_API hcoll_status_t hcoll_get_unique_id(hcoll_unique_id_t *id_out);

/*
 * hcoll_comm_init: create a communicator of nranks ranks; this process is
 * rank `rank` (0 <= rank < nranks). Every rank passes the same *id.
 * config may be NULL (all defaults).
 * Blocks until every rank has joined, or until the timeout, and is
 * collective: all nranks processes must call it. Every rank proves to rank
 * 0, and rank 0 to every rank, that it holds the id's secret (the secret
 * itself never crosses the network). Ranks with the same host id (host
 * name and boot id, or HCOLL_HOSTID) form a node; local ranks are numbered
 * in rank order and local rank i uses rail i (unless HCOLL_RAIL or the
 * config's rail name another).
 * The communicator's GPU is the calling thread's current CUDA device at
 * this call, if the process has CUDA loaded (host-only programs are never
 * made to initialise CUDA): it orders the RDMA NICs by PCI distance and
 * decides GPUDirect RDMA, and device buffers on another GPU are refused.
 * Without one, the first device-buffer call's GPU is used and the NIC
 * choice and GPUDirect do not know it (GPUDirect stays off).
 * On success *comm_out is the new communicator; on failure it is left
 * unchanged and hcoll_comm_last_error(NULL) says why (on this thread):
 * HCOLL_ERR_TIMEOUT when some rank did not join within the timeout (the
 * message names the missing ranks; every rank fails within the timeout
 * plus about half a second), HCOLL_ERR_PEER_FAILED when a rank died during
 * init, HCOLL_ERR_MISMATCH for a wrong secret or a different nranks.
 * Thread-safe for distinct comm_out.
 * Non-blocking init (config->blocking = 0): after the local checks
 * (arguments, configuration, interfaces; their errors are returned at once
 * as above), returns HCOLL_IN_PROGRESS with *comm_out set, and the
 * rendezvous and set-up continue on a background thread.
 * hcoll_comm_get_async_error then reports HCOLL_IN_PROGRESS, and later
 * HCOLL_SUCCESS or the set-up's error (hcoll_comm_last_error(comm) has its
 * message); the handle must still be destroyed after a failed set-up.
 * Until it reports HCOLL_SUCCESS, hcoll_allreduce(_async),
 * hcoll_comm_split, hcoll_comm_last_stage_times and the topology queries
 * (local_rank, local_size, node_count) return HCOLL_IN_PROGRESS; rank and
 * size answer at once. hcoll_comm_abort or hcoll_comm_destroy during the
 * set-up cancel it (promptly: every wait of the rendezvous watches for it)
 * and wait for the background thread; peers then fail their init.
 */
HCOLL_API hcoll_status_t hcoll_comm_init(hcoll_comm_t *comm_out, int nranks, int rank,
                                         const hcoll_unique_id_t *id,
                                         const hcoll_config_t *config);

/*
 * hcoll_comm_init_env: like hcoll_comm_init, with rank, size and rendezvous
 * address read from the launcher's environment. Rank and size, in this
 * order of precedence: HCOLL_RANK/HCOLL_NRANKS; torchrun (RANK/WORLD_SIZE,
 * when TORCHELASTIC_RUN_ID, or LOCAL_RANK with RANK and WORLD_SIZE, is
 * set); Open MPI (OMPI_COMM_WORLD_RANK/SIZE); Slurm
 * (SLURM_PROCID/SLURM_NTASKS); a plain RANK/WORLD_SIZE. The first launcher
 * present decides, and both of its variables must be set. The root
 * address, never a port a launcher owns: HCOLL_ROOT (host:port,
 * [IPv6]:port); else MASTER_ADDR and MASTER_PORT + HCOLL_ROOT_PORT_OFFSET
 * (default 1: MASTER_PORT is torch's TCPStore); else, under srun alone, the
 * first host of SLURM_STEP_NODELIST with the port 12000 + (SLURM_JOB_ID *
 * 7919 + SLURM_STEP_ID) mod 20000. Rank 0 listens on exactly that address,
 * which must be one of its own. The shared secret is HCOLL_SECRET (any
 * string; use at least 128 bits of randomness: shorter gets a WARN),
 * stretched with HCOLL_KDF_ITERS PBKDF2 iterations. Without it init fails
 * with HCOLL_ERR_INVALID_ARG unless the root address is loopback or
 * HCOLL_ALLOW_UNAUTHENTICATED=1; the rendezvous is then not authenticated
 * (any process that reaches the root may join; a WARN says so). Malformed
 * or missing variables:
 * HCOLL_ERR_INVALID_ARG naming them. Blocking and collective, as
 * hcoll_comm_init.
 */
HCOLL_API hcoll_status_t hcoll_comm_init_env(hcoll_comm_t *comm_out,
                                             const hcoll_config_t *config);

/*
 * hcoll_comm_split: new communicators from the ranks of comm, as
 * MPI_Comm_split. Ranks passing the same color >= 0 form one new
 * communicator, ranked by (key, rank in comm); a rank passing
 * HCOLL_SPLIT_NOCOLOR gets *newcomm_out = NULL but must still call.
 * config: the new communicator's settings; NULL = the same settings as
 * comm (including blocking); otherwise loaded as for hcoll_comm_init
 * (explicit fields, then the environment).
 * Rails: each rank keeps its rail in comm (its local rank there by
 * default) unless config->rail or HCOLL_RAIL names one, so a group of one
 * rank per node (color = local rank) runs its ring on the NIC that rank
 * used in comm rather than all groups on rail 0.
 * The split runs over comm's bootstrap: no new rendezvous address and no
 * new secret (each new communicator's key is derived from comm's; only a
 * random nonce crosses the network). The new communicators are independent
 * of comm and of each other: they may be used at the same time as comm
 * (from other threads) and destroyed before or after it.
 * Collective over comm (every rank of comm must call it; its calls on comm
 * are serialised like any other). Blocks until the new communicator is
 * ready, or, with config blocking = 0 (or NULL and comm non-blocking),
 * returns HCOLL_IN_PROGRESS once the exchange over comm is done, with
 * *newcomm_out set up in the background as for hcoll_comm_init.
 * Errors: comm NULL, newcomm_out NULL or color < HCOLL_SPLIT_NOCOLOR,
 * HCOLL_ERR_INVALID_ARG; a rank with bad arguments still takes part, and
 * every other rank then fails with HCOLL_ERR_INVALID_ARG too. A comm still
 * being set up: HCOLL_IN_PROGRESS. Set-up failures of the new communicator
 * as for hcoll_comm_init, with the message in hcoll_comm_last_error(comm).
 * *newcomm_out is written only on success (or HCOLL_IN_PROGRESS).
 * Thread-safe for distinct comm.
 */
#define HCOLL_SPLIT_NOCOLOR (-1)
HCOLL_API hcoll_status_t hcoll_comm_split(hcoll_comm_t comm, int color, int key,
                                          const hcoll_config_t *config,
                                          hcoll_comm_t *newcomm_out);

/*
 * hcoll_comm_destroy: wait for the communicator's outstanding operations,
 * then free everything it holds (sockets, threads, memory, shared-memory
 * segments). NULL is a no-op returning HCOLL_SUCCESS. Local: it does not
 * wait for other ranks. The handle is invalid afterwards.
 */
HCOLL_API hcoll_status_t hcoll_comm_destroy(hcoll_comm_t comm);

/*
 * hcoll_comm_abort: stop the communicator now: outstanding operations end
 * with HCOLL_ERR_ABORTED, connections close (so peers see
 * HCOLL_ERR_PEER_FAILED), and all resources are freed. Returns promptly
 * even when peers are dead. NULL is a no-op. Safe to call from any thread,
 * once, also while another thread is blocked in a call on the same
 * communicator: that call returns HCOLL_ERR_ABORTED, and abort frees the
 * communicator only after it has returned. The handle is invalid
 * afterwards, in every thread.
 */
HCOLL_API hcoll_status_t hcoll_comm_abort(hcoll_comm_t comm);

/*
 * hcoll_comm_get_async_error: the first error that left the communicator
 * unusable (a peer failure seen by the progress engine or by a set-up
 * exchange, a timeout, an abort), or HCOLL_SUCCESS; HCOLL_IN_PROGRESS while
 * the communicator is still being set up. Non-blocking, thread-safe.
 */
HCOLL_API hcoll_status_t hcoll_comm_get_async_error(hcoll_comm_t comm,
                                                    hcoll_status_t *async_error_out);

/*
 * hcoll_comm_last_error: the text of the communicator's most recent error,
 * "" when there was none. With NULL: the most recent error of a call on
 * this thread that had no communicator yet (init, get_unique_id). The
 * string is a copy kept per calling thread: it stays valid, unchanged,
 * until this thread calls hcoll_comm_last_error again, whatever other
 * threads do. Thread-safe.
 */
HCOLL_API const char *hcoll_comm_last_error(hcoll_comm_t comm);

/*
 * Queries, each non-blocking, local and thread-safe (local_rank,
 * local_size and node_count return HCOLL_IN_PROGRESS while a non-blocking
 * init is still setting the communicator up):
 *   rank        this process's rank, 0..size-1
 *   size        number of ranks
 *   local_rank  index among the ranks on this node (its rail, unless a
 *               split or HCOLL_RAIL chose another)
 *   local_size  ranks on this node
 *   node_count  number of nodes (distinct host ids)
 */
HCOLL_API hcoll_status_t hcoll_comm_rank(hcoll_comm_t comm, int *rank_out);
HCOLL_API hcoll_status_t hcoll_comm_size(hcoll_comm_t comm, int *size_out);
HCOLL_API hcoll_status_t hcoll_comm_local_rank(hcoll_comm_t comm, int *local_rank_out);
HCOLL_API hcoll_status_t hcoll_comm_local_size(hcoll_comm_t comm, int *local_size_out);
HCOLL_API hcoll_status_t hcoll_comm_node_count(hcoll_comm_t comm, int *node_count_out);

/* ------------------------------------------------------------------------ */
/* All-reduce                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * hcoll_allreduce: recvbuf[i] = op over all ranks of sendbuf[i], for i in
 * 0..count-1. On a communicator still being set up (non-blocking init),
 * returns HCOLL_IN_PROGRESS and does nothing (as hcoll_allreduce_async). sendbuf == recvbuf means in place; otherwise the two must not
 * overlap. count, dtype and op must be the same on every rank; count may be
 * 0. Collective.
 * Argument agreement (host buffers, HCOLL_CHECK_ARGS=1, the default):
 * before any data moves, every host collective (all-reduce, broadcast,
 * barrier, reduce-scatter, all-gather) compares across all ranks the
 * collective, count, dtype, op (a PREMUL_SUM op counts as one op), root
 * and the call's number on the communicator, and whether each rank could
 * register its buffers. Ranks that disagree all return HCOLL_ERR_MISMATCH
 * (a rank that could not register: its status, e.g. HCOLL_ERR_RDMA, on
 * every rank), with a message naming the field and two ranks that differ;
 * no recvbuf is written (it keeps what it held, in place too) and the
 * communicator stays usable: the next matching call succeeds. Costs one
 * small all-reduce per call; HCOLL_CHECK_ARGS=0 turns it off, and then
 * disagreeing ranks may fail (stickily), hang until HCOLL_OP_TIMEOUT_MS
 * or get mixed data. Device buffers are not compared.
 * A registration refused inside the running ring (HCOLL_CHECK_ARGS=0, or
 * device buffers on a GPUDirect ring) fails that call on every rank of the
 * ring with the refusing rank's status and name (recvbuf undefined); with
 * one rank per node (or a flat ring) the communicator stays usable, and a
 * device call's error is its _async request's (a blocking device call's
 * becomes the async error), otherwise it is the communicator's failure.
 * stream: a cudaStream_t passed as void * for device buffers, NULL for host
 * buffers. With host buffers and NULL the call blocks until the result is
 * in recvbuf. Stream handles with device buffers: NULL (0, the handle of
 * PyTorch's and CuPy's default stream) and CU_STREAM_LEGACY (0x1,
 * cudaStreamLegacy) both mean the GPU's legacy default stream, which runs
 * after the earlier work of every blocking stream (per-thread default
 * streams included); CU_STREAM_PER_THREAD (0x2, cudaStreamPerThread) is
 * HCOLL_ERR_INVALID_ARG, as it names another stream on each thread and
 * hcoll's and NCCL's threads enqueue parts of the call: pass a stream of
 * your own, or 0x1. With device buffers the call is enqueued on the
 * stream and returns without blocking the host:
 * work queued on the stream after the call sees the result; the host sees
 * it after synchronising the stream (or an event recorded after the call).
 * Device buffers (both must be device or managed memory, on the GPU of the
 * stream): the first such call is collective over all ranks and sets the
 * device path up (that GPU's primary context, NCCL among the ranks of a
 * node); every rank must use the same GPU for every later call. Host-only
 * programs never initialise CUDA. Errors: host memory with a stream (or
 * with device memory), or stream CU_STREAM_PER_THREAD,
 * HCOLL_ERR_INVALID_ARG; no CUDA driver or GPU, or a stream being
 * captured into a CUDA graph, HCOLL_ERR_UNSUPPORTED.
 * If the inter-node stage fails, the stream is still released (the result
 * is then undefined) and the error is reported by later calls and
 * hcoll_comm_get_async_error.
 */
HCOLL_API hcoll_status_t hcoll_allreduce(hcoll_comm_t comm, const void *sendbuf,
                                         void *recvbuf, size_t count,
                                         hcoll_dtype_t dtype, hcoll_op_t op,
                                         void *stream);

/*
 * hcoll_allreduce_async: as hcoll_allreduce, but returns at once with a
 * request in *req_out; the operation progresses in the background. The
 * buffers must stay valid and untouched until the request completes.
 * Several requests may be outstanding on one communicator; they complete in
 * the order they were issued, and every rank must issue them in the same
 * order.
 * With a stream (device buffers) the GPU stages are enqueued before the
 * call returns, and the request completes when the whole all-reduce is
 * done: the inter-node stage has run, and the stream has passed the final
 * intra-node all-gather (hcoll's thread waits for an event of its own;
 * hcoll_wait never synchronises the caller's stream, so work the stream
 * queued behind the call need not have run).
 */
HCOLL_API hcoll_status_t hcoll_allreduce_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t count,
                                               hcoll_dtype_t dtype, hcoll_op_t op,
                                               void *stream, hcoll_request_t *req_out);

/*
 * hcoll_test: non-blocking check. *done_out = 1 and the operation's status
 * is returned when it has finished; *done_out = 0 and HCOLL_SUCCESS while
 * it is still running.
 * hcoll_wait: blocks until the request finishes; returns its status.
 * hcoll_request_free: releases a request. A request that has not finished
 * is waited for first. NULL is a no-op. From a completion callback, see
 * hcoll_request_set_callback below.
 * A request is used from one thread at a time.
 */
HCOLL_API hcoll_status_t hcoll_test(hcoll_request_t req, int *done_out);
HCOLL_API hcoll_status_t hcoll_wait(hcoll_request_t req);
HCOLL_API hcoll_status_t hcoll_request_free(hcoll_request_t req);

/*
 * Pre-scaled sums, NCCL's ncclRedOpCreatePreMulSum: an op whose result is
 * the sum over ranks of (scalar x input).
 *
 * hcoll_op_create_premul_sum: makes such an op on comm, for dtype only.
 *   comm       a ready communicator (not NULL)
 *   scalar     in: one element of dtype. HCOLL_SCALAR_HOST_IMMEDIATE: host
 *              memory, read now (the caller may reuse it at once).
 *              HCOLL_SCALAR_DEVICE: device memory (cudaMalloc'd, on the
 *              communicator's GPU), read each time an all-reduce with the
 *              op runs on the GPU, so it may change between calls (stream
 *              order); such an op serves device buffers only.
 *   dtype      the type it reduces: every dtype, the integers included
 *              (products wrap modulo 2^width, as SUM does)
 *   residence  where scalar lives, as above
 *   op_out     out: the op, a value above the built-in ones, valid with
 *              hcoll_allreduce / hcoll_allreduce_async on comm and dtype
 *              (and hcoll_reduce_scatter / _async) until
 *              hcoll_op_destroy; another dtype is
 *              HCOLL_ERR_INVALID_ARG. Ranks may use different scalars.
 * Returns HCOLL_SUCCESS; HCOLL_ERR_INVALID_ARG for a NULL pointer, an
 * unknown dtype or residence, a device scalar that is not device memory;
 * HCOLL_ERR_NO_MEMORY when 4096 ops are live on comm. Non-blocking, local
 * (not collective), thread-safe.
 *
 * hcoll_op_destroy: releases op. Requests already issued with it are not
 * affected (a host scalar was copied; a device scalar must stay valid until
 * they complete). Destroying it twice, or an op of another communicator,
 * is HCOLL_ERR_INVALID_ARG, and so is a later all-reduce with it. (A handle
 * carries a tag of its communicator and a generation of its slot, so a
 * foreign or stale one is refused, except one of a communicator created a
 * multiple of 128 communicators earlier or later in the process, or a slot
 * reused a multiple of 2048 times since.)
 * Destroying comm releases its ops. Non-blocking, local, thread-safe.
 */
typedef enum hcoll_scalar_residence {
    HCOLL_SCALAR_HOST_IMMEDIATE = 0,
    HCOLL_SCALAR_DEVICE = 1
} hcoll_scalar_residence_t;

HCOLL_API hcoll_status_t hcoll_op_create_premul_sum(hcoll_comm_t comm, const void *scalar,
                                                    hcoll_dtype_t dtype,
                                                    hcoll_scalar_residence_t residence,
                                                    hcoll_op_t *op_out);
HCOLL_API hcoll_status_t hcoll_op_destroy(hcoll_comm_t comm, hcoll_op_t op);

/* ------------------------------------------------------------------------ */
/* Broadcast and barrier                                                      */
/* ------------------------------------------------------------------------ */

/*
 * hcoll_broadcast: recvbuf[0..count) on every rank = sendbuf[0..count) of
 * rank root (NCCL's ncclBroadcast). sendbuf is read on the root only
 * (other ranks may pass NULL); on the root sendbuf == recvbuf means in
 * place, otherwise the two must not overlap. count (elements of dtype)
 * may be 0; count, dtype and root must be the same on every rank: a rank
 * called with another root or byte size fails, with every other rank,
 * with HCOLL_ERR_MISMATCH, before anything moves (no recvbuf written, the
 * root's neither; the communicator stays usable; hcoll_allreduce's
 * "argument agreement", HCOLL_CHECK_ARGS). The bytes
 * arrive bit for bit, whatever the dtype. On host buffers, a broadcast up
 * to the all-reduce's inline limit travels with that agreement (the
 * root's bytes summed with zeros as integers; hcoll_comm_last_algo "rd",
 * or "intra" on one node), larger ones and HCOLL_ALGO=broadcast=tree|chain
 * take a binomial tree ("tree") or the rails' chains ("chain"). Collective; blocks until the
 * vector is in recvbuf; on a communicator still being set up returns
 * HCOLL_IN_PROGRESS and does nothing. Thread-safe as hcoll_allreduce: calls
 * on one communicator run one at a time, in the order they were issued.
 * stream: NULL for host buffers; with device buffers, a stream handle as
 * hcoll_allreduce takes it (NULL, 0x1: the legacy stream). With a CUDA
 * stream, the buffers are
 * device memory of the communicator's GPU (as hcoll_allreduce's) and the
 * call is stream-ordered like hcoll_allreduce on device buffers: it
 * returns once the broadcast is enqueued (the root's sendbuf is read and
 * every recvbuf written after the stream's earlier work, and later work
 * on the stream sees the result); the host stage runs on hcoll's worker,
 * and a failure never leaves the stream waiting. Within a node the data
 * moves with ncclBroadcast / ncclAllGather, across nodes along each
 * rail's chain (staged through host memory, or GPUDirect). The argument
 * check then runs before anything moves: with hcoll_broadcast_async the
 * request reports HCOLL_ERR_MISMATCH (the communicator stays usable);
 * the blocking call has returned by then, so its mismatch fails the
 * communicator (hcoll_comm_get_async_error).
 * Returns HCOLL_SUCCESS, HCOLL_ERR_INVALID_ARG for a bad argument (root
 * not a rank, NULL buffer with count > 0, unknown dtype), or the error of
 * the communicator (a peer failed, timeout, abort; sticky).
 */
HCOLL_API hcoll_status_t hcoll_broadcast(hcoll_comm_t comm, const void *sendbuf,
                                         void *recvbuf, size_t count,
                                         hcoll_dtype_t dtype, int root, void *stream);

/*
 * hcoll_broadcast_async: as hcoll_broadcast, but returns at once with a
 * request in *req_out (hcoll_test, hcoll_wait, hcoll_request_free,
 * hcoll_request_stage_times), queued behind the communicator's earlier
 * requests of any kind. Buffers stay untouched by the caller until it
 * completes.
 */
HCOLL_API hcoll_status_t hcoll_broadcast_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t count,
                                               hcoll_dtype_t dtype, int root,
                                               void *stream, hcoll_request_t *req_out);

/*
 * hcoll_barrier: returns on a rank only once every rank of comm has
 * entered its matching barrier. Collective; blocks; no buffers. Returns
 * HCOLL_SUCCESS or the communicator's error: a rank that died makes the
 * others fail at once, a stopped one within HCOLL_LIVENESS_MS; a rank
 * alive but late is waited for up to HCOLL_OP_TIMEOUT_MS; a rank that
 * called another host collective in its place makes every rank fail with
 * HCOLL_ERR_MISMATCH, the communicator staying usable (with
 * HCOLL_CHECK_ARGS=0: HCOLL_ERR_MISMATCH or HCOLL_ERR_PEER_FAILED, the
 * reset that follows, and the failure is sticky).
 * Thread-safe as hcoll_allreduce.
 * hcoll_barrier_async: the same as a request in *req_out; it completes
 * once every rank has entered.
 */
HCOLL_API hcoll_status_t hcoll_barrier(hcoll_comm_t comm);
HCOLL_API hcoll_status_t hcoll_barrier_async(hcoll_comm_t comm, hcoll_request_t *req_out);

/* ------------------------------------------------------------------------ */
/* Reduce-scatter and all-gather                                              */
/* ------------------------------------------------------------------------ */

/*
 * hcoll_reduce_scatter: NCCL's ncclReduceScatter. sendbuf holds nranks x
 * recvcount elements, block r being elements [r*recvcount, (r+1)*recvcount);
 * afterwards recvbuf[0..recvcount) on rank r = op over all ranks of their
 * block r.
 *   comm       a ready communicator
 *   sendbuf    in: nranks * recvcount elements of dtype (left unchanged
 *              out of place)
 *   recvbuf    out: recvcount elements. In place means recvbuf ==
 *              sendbuf + rank * recvcount elements (then the other blocks
 *              of sendbuf are left unchanged too); any other overlap is
 *              HCOLL_ERR_INVALID_ARG.
 *   recvcount  elements per rank, may be 0 (NULL buffers are then fine)
 *   dtype, op  as hcoll_allreduce, with the same rounding (see the
 *              semantics above hcoll_op_t): SUM, PROD, MAX, MIN; AVG of a
 *              floating type multiplies each rank's input by 1/nranks and
 *              sums, AVG of an integer type sums and divides once by
 *              nranks, truncating; a PREMUL_SUM op of comm for dtype
 *   stream     NULL for host buffers; with device buffers, a stream
 *              handle as hcoll_allreduce takes it (NULL, 0x1: the legacy
 *              stream). With a CUDA stream the buffers are
 *              device memory and the call is stream-ordered exactly as
 *              hcoll_allreduce on device buffers (returns once enqueued;
 *              NCCL within the node, the rail rings across nodes staged
 *              or GPUDirect). The arguments are compared there too,
 *              before anything moves across nodes; where a node has
 *              several ranks the call then also waits until that node's
 *              ranks have made it (they compare first, so that NCCL never
 *              sees unequal calls). A mismatch is reported by the request
 *              (hcoll_reduce_scatter_async; the blocking call has
 *              returned by then, so it fails the communicator), and
 *              recvbuf is undefined on nodes whose ranks agreed.
 * Each element is reduced in one fixed order, so a block's result does not
 * depend on timing; above the all-reduce's inline limit (host buffers,
 * nranks * recvcount elements) that order is not the all-reduce's, so for
 * floats the result may differ in the last bits from the matching block
 * of an hcoll_allreduce of the same inputs (it is equal where every order
 * gives the same sum, e.g. integers, or floats whose sums are exact);
 * below it the whole vector travels with the argument agreement as that
 * all-reduce would (hcoll_comm_last_algo "rd") and the blocks are equal.
 * recvcount, dtype and op must be the same on every rank. Before any data
 * moves, the ranks compare the collective (reduce-scatter, all-gather),
 * recvcount, dtype and op (a PREMUL_SUM op counts as one op, whatever its
 * scalar): ranks that disagree fail alike with HCOLL_ERR_MISMATCH, no
 * recvbuf written, and the communicator stays usable; so does a rank that
 * calls another host collective at the same point (hcoll_allreduce's
 * "argument agreement"; with HCOLL_CHECK_ARGS=0 nothing is compared).
 * Collective; blocks until the result is in recvbuf; on a communicator still
 * being set up returns HCOLL_IN_PROGRESS and does nothing. Thread-safe as
 * hcoll_allreduce: calls on one communicator run one at a time, in the
 * order they were issued.
 * Returns HCOLL_SUCCESS, HCOLL_ERR_INVALID_ARG for a bad argument, or the
 * error of the communicator (a peer failed, timeout, abort; sticky).
 */
HCOLL_API hcoll_status_t hcoll_reduce_scatter(hcoll_comm_t comm, const void *sendbuf,
                                              void *recvbuf, size_t recvcount,
                                              hcoll_dtype_t dtype, hcoll_op_t op,
                                              void *stream);

/*
 * hcoll_reduce_scatter_async: as hcoll_reduce_scatter, but returns at once
 * with a request in *req_out (hcoll_test, hcoll_wait, hcoll_request_free,
 * hcoll_request_set_callback, hcoll_request_stage_times), queued behind
 * the communicator's earlier requests of any kind. The buffers stay
 * untouched by the caller until it completes.
 */
HCOLL_API hcoll_status_t hcoll_reduce_scatter_async(hcoll_comm_t comm, const void *sendbuf,
                                                    void *recvbuf, size_t recvcount,
                                                    hcoll_dtype_t dtype, hcoll_op_t op,
                                                    void *stream, hcoll_request_t *req_out);

/*
 * hcoll_allgather: NCCL's ncclAllGather. Afterwards recvbuf block r
 * (elements [r*sendcount, (r+1)*sendcount)) on every rank = sendbuf of
 * rank r, bit for bit, whatever the dtype.
 *   comm       a ready communicator
 *   sendbuf    in: sendcount elements (unchanged)
 *   recvbuf    out: nranks * sendcount elements. In place means sendbuf ==
 *              recvbuf + rank * sendcount elements; any other overlap is
 *              HCOLL_ERR_INVALID_ARG.
 *   sendcount  elements per rank, may be 0 (NULL buffers are then fine)
 *   dtype      a known dtype (it gives the element size)
 *   stream     NULL, as hcoll_reduce_scatter
 * sendcount and dtype must be the same on every rank: ranks that disagree
 * fail alike with HCOLL_ERR_MISMATCH, as for hcoll_reduce_scatter (which
 * also says what a rank calling another collective does). On host buffers
 * a vector (nranks * sendcount elements) up to the all-reduce's inline
 * limit travels with the argument agreement as a sum of integers, each
 * rank's block plus zeros (hcoll_comm_last_algo "rd"). Collective;
 * blocks; thread-safe and returns as hcoll_reduce_scatter.
 * hcoll_allgather_async: the same as a request in *req_out, as
 * hcoll_reduce_scatter_async.
 */
HCOLL_API hcoll_status_t hcoll_allgather(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                         size_t sendcount, hcoll_dtype_t dtype, void *stream);
HCOLL_API hcoll_status_t hcoll_allgather_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t sendcount,
                                               hcoll_dtype_t dtype, void *stream,
                                               hcoll_request_t *req_out);

/*
 * Completion callbacks. cb(req, status, arg) runs exactly once per request:
 *   - on hcoll's thread (the communicator's worker) when the request
 *     completes, if it was set before that;
 *   - at once, on the caller's thread and before hcoll_request_set_callback
 *     returns, if the request had already completed.
 * status is the request's status (what hcoll_wait returns: HCOLL_SUCCESS,
 * or the error the operation failed with, e.g. HCOLL_ERR_ABORTED for a
 * request still queued when its communicator is aborted or destroyed).
 * For device buffers the request completes, and the callback runs, when the
 * GPU has passed the final intra-node stage (as for hcoll_wait).
 * hcoll_wait and hcoll_request_free called from another thread return only
 * after the callback has returned, so its effects are visible to them.
 *
 * Inside the callback, on its own request, it may call hcoll_test,
 * hcoll_wait (returns at once), hcoll_request_stage_times and
 * hcoll_request_free (the common binding pattern: the request is released
 * once the callback returns; req must not be used after). It may issue
 * _async calls on host buffers (they only queue). On hcoll's
 * thread it must not block on the same communicator: hcoll_allreduce,
 * hcoll_comm_destroy, hcoll_comm_abort, hcoll_mem_register and
 * hcoll_mem_deregister return HCOLL_ERR_INVALID_ARG there, and so do
 * hcoll_wait and hcoll_request_free of a later, unfinished request of that
 * communicator (it cannot finish before the callback returns). Callbacks
 * hold up the communicator's later requests while they run: keep them
 * short.
 *
 * hcoll_request_set_callback: req (in) a request from an _async call
 * that has not been freed; cb (in) the callback, not NULL; arg (in) passed
 * to it unchanged. Returns HCOLL_SUCCESS once the callback is registered
 * (or has run); HCOLL_ERR_INVALID_ARG for NULL req or cb, or when the
 * request already has a callback (one per request; the first stays).
 * Non-blocking apart from running cb itself, local. Thread-safe against the
 * completion of req; like every request call, use req from one thread of
 * yours at a time.
 */
typedef void (*hcoll_request_cb_t)(hcoll_request_t req, hcoll_status_t status, void *arg);
HCOLL_API hcoll_status_t hcoll_request_set_callback(hcoll_request_t req, hcoll_request_cb_t cb,
                                                    void *arg);

/* ------------------------------------------------------------------------ */
/* Per-stage timing                                                           */
/* ------------------------------------------------------------------------ */

/*
 * Where one all-reduce spent its time, in microseconds on this rank.
 *   intra_rs_us  stage 1, intra-node reduce-scatter, summed over pieces
 *   inter_us     stage 2, inter-node ring, summed over pieces
 *   intra_ag_us  stage 3, intra-node all-gather, summed over pieces
 *   total_us     from the start of the operation to its end
 * Large vectors are pipelined, so the stages overlap and their sum may
 * exceed total_us. A stage the plan does not use reads 0 (one rank per
 * node: everything is inter_us). Where the intra-node stage runs as one
 * fused step (one node; vectors up to HCOLL_SMALL_BYTES), its time is split
 * evenly between intra_rs_us and intra_ag_us.
 * Reduce-scatter: intra_rs_us is the permuting copy and the intra-node
 * reduce-scatter, inter_us the ring, intra_ag_us the copy into recvbuf;
 * all-gather: inter_us the ring, intra_ag_us the intra-node all-gather and
 * the copy back in rank order (intra_rs_us the copy of sendbuf). For both,
 * total_us includes the exchange that checks the ranks' arguments.
 * Device buffers: the intra-node stages are timed with CUDA events on the
 * caller's stream (the GPU's clock; -1 where an event could not be made);
 * inter_us is the host stage (staging copies or the GPUDirect ring), and
 * total_us runs in hcoll's thread from the start of that stage until the
 * GPU has passed the last stage.
 */
typedef struct hcoll_stage_times {
    double intra_rs_us;
    double inter_us;
    double intra_ag_us;
    double total_us;
} hcoll_stage_times_t;

/*
 * hcoll_request_stage_times: the times of a finished request
 * (HCOLL_IN_PROGRESS while it runs). hcoll_comm_last_stage_times: the
 * times of the communicator's most recently finished collective (all-reduce,
 * broadcast, barrier, reduce-scatter or all-gather), blocking or not
 * (HCOLL_ERR_INVALID_ARG before the first). Non-blocking, local.
 */
HCOLL_API hcoll_status_t hcoll_request_stage_times(hcoll_request_t req,
                                                   hcoll_stage_times_t *times_out);
HCOLL_API hcoll_status_t hcoll_comm_last_stage_times(hcoll_comm_t comm,
                                                     hcoll_stage_times_t *times_out);

/*
 * hcoll_comm_last_algo: the name of the algorithm that the communicator's
 * most recently finished collective ran (as hcoll_comm_last_stage_times
 * picks it): "rd" (fused intra-node step and recursive doubling across
 * nodes), "ring" (the pipelined three stages or flat ring), "fused-ring"
 * (fused intra-node step and a whole-vector ring, below HCOLL_SMALL_BYTES),
 * "intra" (one node), "copy" (one rank), "tree" and "chain" (a broadcast),
 * "dissem" (a barrier without the argument agreement), "ring-rsag"
 * (reduce-scatter, all-gather); a small broadcast, reduce-scatter or
 * all-gather that travelled with the argument agreement says "rd" (or
 * "intra" on one node). "rd-split": the agreement's data went split, each
 * local rank's rail carrying its shard, then a node all-gather (where the
 * link model finds the bytes dearer than the extra node step). comm: in.
 * *name_out: out, a static string. Returns HCOLL_ERR_INVALID_ARG before
 * the first collective (or NULL arguments). Non-blocking, local,
 * thread-safe.
 */
HCOLL_API hcoll_status_t hcoll_comm_last_algo(hcoll_comm_t comm, const char **name_out);

/* ------------------------------------------------------------------------ */
/* Registered buffers                                                         */
/* ------------------------------------------------------------------------ */

typedef struct hcoll_mem *hcoll_mem_t; /* a registered range of memory */

/*
 * hcoll_mem_register: tells comm that [ptr, ptr+bytes) will be used by
 * many all-reduces (a training loop's gradient buffer), so that the
 * inter-node transport registers it with the NIC once, here, instead of
 * once per operation. Every later operation whose buffers lie inside the
 * range uses that registration; buffers outside it are registered per
 * operation as before. Over verbs the range is registered (pinned) now;
 * over TCP, or when this rank has no inter-node stage, the call only
 * records the range. Device memory is registered where the transport does
 * GPUDirect RDMA, else only recorded (it is staged through hcoll's own
 * memory).
 * comm (in) a ready communicator; ptr (in) the start, not NULL; bytes
 * (in) the length, > 0; handle_out (out) the handle for
 * hcoll_mem_deregister, written only on success.
 * Returns HCOLL_SUCCESS; HCOLL_ERR_INVALID_ARG for NULL ptr or
 * handle_out, 0 bytes, or a range that overlaps one already registered on
 * comm (deregister it first); HCOLL_ERR_RDMA when the NIC refuses the
 * registration (e.g. `ulimit -l`; the communicator stays usable);
 * HCOLL_IN_PROGRESS during a non-blocking init.
 * The memory must stay allocated until it is deregistered. Blocks until
 * the requests issued earlier on comm have finished (registration takes
 * the transport, which operations use). Local: not collective, ranks
 * register independently. Thread-safe (serialised with comm's
 * operations); not from a completion callback of comm.
 *
 * hcoll_mem_deregister: releases a registration (after the requests issued
 * earlier on comm have finished: none of them is left using it). NULL is a
 * no-op. HCOLL_ERR_INVALID_ARG for a handle that is not a live
 * registration of comm (already deregistered, or another communicator's).
 * Blocks as hcoll_mem_register; local; thread-safe.
 * hcoll_comm_destroy and hcoll_comm_abort release the registrations still
 * held; their handles are then invalid.
 */
HCOLL_API hcoll_status_t hcoll_mem_register(hcoll_comm_t comm, void *ptr, size_t bytes,
                                            hcoll_mem_t *handle_out);
HCOLL_API hcoll_status_t hcoll_mem_deregister(hcoll_comm_t comm, hcoll_mem_t handle);

/*
 * Registration counters of this process: what the verbs transport did with
 * the NIC's memory registration, summed over every communicator of the
 * process since it loaded hcoll (TCP registers nothing and counts nothing).
 * A registered buffer (hcoll_mem_register) all-reduced again and again
 * shows one registration and cache hits; an unregistered one a
 * registration per call once it leaves the cache.
 *
 * counters: in/out; the caller sets counters->size = sizeof(*counters)
 * (HCOLL_RDMA_COUNTERS_INITIALIZER does); the fields that fit in size are
 * written, so a program built against an older header still works.
 * Returns HCOLL_ERR_INVALID_ARG for NULL or a size too small for the first
 * field. Local; never blocks; thread-safe (a snapshot, each field read
 * atomically).
 */
typedef struct hcoll_rdma_counters {
    size_t size;              /* sizeof(hcoll_rdma_counters_t), set by the caller */
    uint64_t registrations;   /* ibv_reg_mr / ibv_reg_dmabuf_mr calls that succeeded */
    uint64_t deregistrations; /* ibv_dereg_mr calls */
    uint64_t cache_hits;      /* transport registrations served by the cache */
    uint64_t cache_misses;    /* ... that had to register */
} hcoll_rdma_counters_t;

#define HCOLL_RDMA_COUNTERS_INITIALIZER { sizeof(hcoll_rdma_counters_t), 0, 0, 0, 0 }

HCOLL_API hcoll_status_t hcoll_rdma_counters(hcoll_rdma_counters_t *counters);

#ifdef __cplusplus
}
#endif

#endif /* HCOLL_H */
