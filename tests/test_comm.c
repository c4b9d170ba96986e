/*
 * Communicator lifecycle across forked ranks on one host: init/destroy in
 * every shape, topology queries, set-up collectives, repeated init without
 * leaking fds, threads or memory, init from each launcher's variables, and
 * abort (from the same thread and from another one while blocked).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "boot/boot.h"
#include "common/ranks.h"
#include "core/comm.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#else
#define HAVE_LSAN 0
#endif

#define TIMEOUT_MS 20000

static hcoll_config_t cfg_timeout(int ms)
{
    hcoll_config_t c = HCOLL_CONFIG_INITIALIZER;
    c.timeout_ms = ms;
    return c;
}

typedef struct shape_arg {
    hct_id_slot_t slot;
    int rpn;
} shape_arg_t;

/* Init, check every query against the shape, run each set-up collective,
 * destroy. */
static int rank_shape(int rank, int nranks, void *argp)
{
    shape_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));

    int v;
    HCT_OK(comm, hcoll_comm_rank(comm, &v));
    HCT_REQUIRE(v == rank, "rank %d", v);
    HCT_OK(comm, hcoll_comm_size(comm, &v));
    HCT_REQUIRE(v == nranks, "size %d", v);
    HCT_OK(comm, hcoll_comm_local_rank(comm, &v));
    HCT_REQUIRE(v == rank % a->rpn, "local rank %d", v);
    HCT_OK(comm, hcoll_comm_local_size(comm, &v));
    HCT_REQUIRE(v == a->rpn, "local size %d", v);
    HCT_OK(comm, hcoll_comm_node_count(comm, &v));
    HCT_REQUIRE(v == nranks / a->rpn, "node count %d", v);
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "async error %d", ae);

    /* The internal view other modules use. */
    HCT_REQUIRE(comm->uniform == 1, "not uniform");
    HCT_REQUIRE(comm->node == rank / a->rpn, "node %d", comm->node);
    for (int r = 0; r < nranks; r++) {
        HCT_REQUIRE(comm->node_of[r] == r / a->rpn && comm->local_of[r] == r % a->rpn,
                    "rank %d placed at %d/%d", r, comm->node_of[r], comm->local_of[r]);
        HCT_REQUIRE(hc_comm_rank_at(comm, r / a->rpn, r % a->rpn) == r, "rank_at");
        HCT_REQUIRE(comm->peers[r].naddrs == 1 && strcmp(comm->peers[r].addrs[0].name, "lo") == 0,
                    "rank %d addresses", r);
        HCT_REQUIRE(comm->peers[r].pid > 0, "pid");
    }
    HCT_REQUIRE(hc_comm_rank_at(comm, 0, a->rpn) == -1 && hc_comm_rank_at(comm, -1, 0) == -1,
                "rank_at out of range");

    /* Set-up collectives, each in the shape the transport will use. */
    int mine[2] = { rank * 10 + 1, -rank }, all[16 * 2];
    HCT_OK(comm, hc_boot_allgather(comm->boot, mine, all, sizeof mine));
    for (int r = 0; r < nranks; r++)
        HCT_REQUIRE(all[2 * r] == r * 10 + 1 && all[2 * r + 1] == -r, "allgather slot %d", r);
    for (int root = 0; root < nranks; root++) {
        char msg[32] = "";
        if (rank == root)
            snprintf(msg, sizeof msg, "from %d", root);
        HCT_OK(comm, hc_boot_bcast(comm->boot, msg, sizeof msg, root));
        char want[32];
        snprintf(want, sizeof want, "from %d", root);
        HCT_REQUIRE(strcmp(msg, want) == 0, "bcast root %d got '%s'", root, msg);
    }
    HCT_OK(comm, hc_boot_barrier(comm->boot));
    HCT_OK(comm, hc_boot_allgather(comm->boot, NULL, NULL, 0));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run_shape(int nnodes, int rpn)
{
    shape_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    a->rpn = rpn;
    hct_opts_t o = { .nranks = nnodes * rpn, .ranks_per_node = rpn, .timeout_ms = 60000 };
    hct_result_t res[16];
    int bad = hct_run(&o, rank_shape, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_msg(bad == 0, "%d x %d: %d rank(s) failed", nnodes, rpn, bad);
}

START_TEST(shapes_one_node)
{
    for (int r = 1; r <= 8; r++)
        run_shape(1, r);
}
END_TEST

START_TEST(shapes_one_per_node)
{
    for (int r = 2; r <= 8; r++)
        run_shape(r, 1);
}
END_TEST

START_TEST(shapes_grid)
{
    run_shape(2, 2);
    run_shape(2, 3);
    run_shape(4, 2);
}
END_TEST

/* Nodes of 2, 2 and 1 ranks: init succeeds, the communicator says only the
 * flat ring is possible, and rank 0 says so at INFO. */
typedef struct uneven_arg {
    hct_id_slot_t slot;
    char logdir[64];
} uneven_arg_t;

static int rank_uneven(int rank, int nranks, void *argp)
{
    uneven_arg_t *a = argp;
    static const int node_of[5] = { 0, 0, 1, 1, 2 };
    char hostid[64], path[128];
    snprintf(hostid, sizeof hostid, "uneven-%d-node%d", (int)getppid(), node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    snprintf(path, sizeof path, "%s/rank%d.log", a->logdir, rank);
    setenv("HCOLL_DEBUG", "INFO", 1);
    setenv("HCOLL_DEBUG_FILE", path, 1);

    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    int nn, ls, lr;
    HCT_OK(comm, hcoll_comm_node_count(comm, &nn));
    HCT_OK(comm, hcoll_comm_local_size(comm, &ls));
    HCT_OK(comm, hcoll_comm_local_rank(comm, &lr));
    static const int want_ls[5] = { 2, 2, 2, 2, 1 }, want_lr[5] = { 0, 1, 0, 1, 0 };
    HCT_REQUIRE(nn == 3 && ls == want_ls[rank] && lr == want_lr[rank], "nn %d ls %d lr %d", nn,
                ls, lr);
    HCT_REQUIRE(comm->uniform == 0, "uniform");
    HCT_OK(comm, hc_boot_barrier(comm->boot));
    HCT_OK(comm, hcoll_comm_destroy(comm));

    if (rank == 0) {
        FILE *f = fopen(path, "r");
        HCT_REQUIRE(f, "no log %s", path);
        char line[1200];
        int flat = 0, nodes = 0;
        while (fgets(line, sizeof line, f)) {
            flat += strstr(line, "flat ring only: nodes have 2,2,1 ranks") != NULL;
            nodes += strstr(line, "INIT INFO node ") != NULL;
        }
        fclose(f);
        HCT_REQUIRE(flat == 1 && nodes == 3, "log: flat %d, node lines %d", flat, nodes);
    }
    return 0;
}

START_TEST(uneven_nodes)
{
    uneven_arg_t *a = hct_shared_alloc(sizeof *a);
    snprintf(a->logdir, sizeof a->logdir, "/tmp/hct-uneven-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(a->logdir));
    hct_opts_t o = { .nranks = 5, .ranks_per_node = 0, .timeout_ms = 60000 };
    hct_result_t res[5];
    int bad = hct_run(&o, rank_uneven, a, res);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", a->logdir);
    ck_assert_int_eq(system(cmd), 0);
    hct_shared_free(a, sizeof *a);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* Interleaved placement (ranks 0,2,4 on one host, 1,3 on another), which
 * forked shapes do not produce: nodes numbered by lowest rank, local ranks
 * in rank order. */
START_TEST(topology_interleaved)
{
    struct hcoll_comm c;
    hc_peer_t peers[5];
    memset(&c, 0, sizeof c);
    memset(peers, 0, sizeof peers);
    const uint64_t host[5] = { 77, 5, 77, 5, 77 };
    for (int r = 0; r < 5; r++)
        peers[r].hostid = host[r];
    c.peers = peers;
    c.nranks = 5;
    c.rank = 3;
    hc_errbuf_init(&c.err);
    ck_assert_int_eq(hc_comm_topo_build(&c), HCOLL_SUCCESS);
    ck_assert_int_eq(c.nnodes, 2);
    ck_assert_int_eq(c.uniform, 0);
    ck_assert_int_eq(c.node, 1);
    ck_assert_int_eq(c.local_rank, 1);
    ck_assert_int_eq(c.local_size, 2);
    const int want_node[5] = { 0, 1, 0, 1, 0 }, want_local[5] = { 0, 0, 1, 1, 2 };
    for (int r = 0; r < 5; r++) {
        ck_assert_int_eq(c.node_of[r], want_node[r]);
        ck_assert_int_eq(c.local_of[r], want_local[r]);
    }
    ck_assert_int_eq(hc_comm_rank_at(&c, 0, 2), 4);
    ck_assert_int_eq(hc_comm_rank_at(&c, 1, 1), 3);
    ck_assert_int_eq(hc_comm_node_size(&c, 0), 3);
    free(c.node_of), free(c.local_of), free(c.node_start), free(c.node_ranks);
    hc_errbuf_fini(&c.err);
}
END_TEST

/* ------------------------------------------------------------------------ */

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* opendir's own fd (for /proc/self/fd; harmless for task) */
}

typedef struct repeat_arg {
    hct_id_slot_t slot[6];
} repeat_arg_t;

static int rank_repeat(int rank, int nranks, void *argp)
{
    repeat_arg_t *a = argp;
    const int fds0 = count_dir("/proc/self/fd"), threads0 = count_dir("/proc/self/task");
    for (int it = 0; it < 6; it++) {
        hcoll_unique_id_t id;
        hcoll_comm_t comm;
        hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
        HCT_REQUIRE(hct_share_unique_id(&a->slot[it], rank, TIMEOUT_MS, &id) == 0, "no id");
        HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
        HCT_OK(comm, hc_boot_barrier(comm->boot));
        HCT_OK(comm, hcoll_comm_destroy(comm));
    }
    const int fds1 = count_dir("/proc/self/fd"), threads1 = count_dir("/proc/self/task");
    HCT_REQUIRE(fds0 == fds1, "open fds %d before, %d after 6 init/destroy", fds0, fds1);
    HCT_REQUIRE(threads0 == threads1, "threads %d before, %d after", threads0, threads1);
#if HAVE_LSAN
    HCT_REQUIRE(__lsan_do_recoverable_leak_check() == 0, "LeakSanitizer found leaks");
#endif
    return 0;
}

START_TEST(repeat_no_leaks)
{
    repeat_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_repeat, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Init from launcher variables                                              */
/* ------------------------------------------------------------------------ */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0)
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

enum launcher { L_HCOLL, L_OMPI, L_SLURM, L_TORCH, L_PRECEDENCE, L_IPV6, L_COUNT };

typedef struct env_arg {
    int launcher;
    int port;
} env_arg_t;

static const char *const all_vars[] = {
    "HCOLL_RANK", "HCOLL_NRANKS", "HCOLL_ROOT", "HCOLL_SECRET", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
};

static void setint(const char *name, int v)
{
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

static int rank_env(int rank, int nranks, void *argp)
{
    env_arg_t *a = argp;
    char root[64];
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
    snprintf(root, sizeof root, "127.0.0.1:%d", a->port);
    int want = rank;
    switch (a->launcher) {
    case L_HCOLL:
        setint("HCOLL_RANK", rank), setint("HCOLL_NRANKS", nranks);
        setenv("HCOLL_ROOT", root, 1);
        setenv("HCOLL_SECRET", "correct horse battery staple", 1);
        break;
    case L_OMPI:
        setint("OMPI_COMM_WORLD_RANK", rank), setint("OMPI_COMM_WORLD_SIZE", nranks);
        setenv("HCOLL_ROOT", root, 1);
        setenv("HCOLL_SECRET", "s3cret-ompi", 1);
        break;
    case L_SLURM:
        setint("SLURM_PROCID", rank), setint("SLURM_NTASKS", nranks);
        setenv("HCOLL_ROOT", root, 1);
        break; /* no secret: unauthenticated, with a WARN */
    case L_TORCH:
        setint("RANK", rank), setint("WORLD_SIZE", nranks);
        setenv("MASTER_ADDR", "127.0.0.1", 1), setint("MASTER_PORT", a->port);
        setenv("HCOLL_SECRET", "torch-secret", 1);
        break;
    case L_PRECEDENCE:
        /* HCOLL_* beats Open MPI beats Slurm beats torchrun; HCOLL_ROOT
         * beats MASTER_ADDR (which points nowhere useful here). */
        want = nranks - 1 - rank;
        setint("HCOLL_RANK", want), setint("HCOLL_NRANKS", nranks);
        setint("OMPI_COMM_WORLD_RANK", rank), setint("OMPI_COMM_WORLD_SIZE", nranks + 5);
        setint("SLURM_PROCID", rank), setint("SLURM_NTASKS", nranks + 6);
        setint("RANK", rank), setint("WORLD_SIZE", nranks + 7);
        setenv("HCOLL_ROOT", root, 1);
        setenv("MASTER_ADDR", "192.0.2.123", 1), setint("MASTER_PORT", 1);
        setenv("HCOLL_SECRET", "prec", 1);
        break;
    case L_IPV6:
        snprintf(root, sizeof root, "[::1]:%d", a->port);
        setint("HCOLL_RANK", rank), setint("HCOLL_NRANKS", nranks);
        setenv("HCOLL_ROOT", root, 1);
        setenv("HCOLL_SECRET", "six", 1);
        break;
    }
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_OK(NULL, hcoll_comm_init_env(&comm, &cfg));
    int r, n;
    HCT_OK(comm, hcoll_comm_rank(comm, &r));
    HCT_OK(comm, hcoll_comm_size(comm, &n));
    HCT_REQUIRE(r == want && n == nranks, "launcher %d: rank %d size %d (want %d %d)",
                a->launcher, r, n, want, nranks);
    HCT_REQUIRE(comm->authenticated == (a->launcher != L_SLURM), "authenticated %d",
                comm->authenticated);
    int all[8];
    HCT_OK(comm, hc_boot_allgather(comm->boot, &r, all, sizeof r));
    for (int k = 0; k < n; k++)
        HCT_REQUIRE(all[k] == k, "allgather %d", k);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static int have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

START_TEST(env_launchers)
{
    env_arg_t *a = hct_shared_alloc(sizeof *a);
    for (int l = 0; l < L_COUNT; l++) {
        if (l == L_IPV6 && !have_ipv6_loopback()) {
            printf("note: no IPv6 loopback; IPv6 rendezvous not tested\n");
            continue;
        }
        a->launcher = l;
        a->port = free_port();
        ck_assert_int_gt(a->port, 0);
        hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
        hct_result_t res[3];
        int bad = hct_run(&o, rank_env, a, res);
        ck_assert_msg(bad == 0, "launcher %d: %d rank(s) failed", l, bad);
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* Bad launcher settings are argument errors with a message, not hangs. */
START_TEST(env_errors)
{
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
    hcoll_comm_t comm = NULL;
    hcoll_config_t cfg = cfg_timeout(2000);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "HCOLL_RANK"));
    setenv("HCOLL_RANK", "0", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "HCOLL_NRANKS"));
    setenv("HCOLL_NRANKS", "2", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "HCOLL_ROOT"));
    setenv("HCOLL_ROOT", "::1:5000", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    setenv("HCOLL_ROOT", "127.0.0.1:99999", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    setenv("HCOLL_ROOT", "127.0.0.1:5000", 1);
    setenv("HCOLL_RANK", "2", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    setenv("HCOLL_RANK", "x", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    /* Rank 0 must own the root address. */
    setenv("HCOLL_RANK", "0", 1);
    setenv("HCOLL_ROOT", "192.0.2.200:5000", 1);
    /* Off loopback, not without a secret (test_launch has the rest). */
    unsetenv("HCOLL_SECRET");
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "HCOLL_SECRET is not set"));
    setenv("HCOLL_SECRET", "env_errors: a test secret", 1);
    ck_assert_int_eq(hcoll_comm_init_env(&comm, &cfg), HCOLL_ERR_NETWORK);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "bind"));
    ck_assert_ptr_null(comm);
}
END_TEST

START_TEST(api_arguments)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    int v;
    hcoll_status_t st;
    ck_assert_int_eq(hcoll_comm_destroy(NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_abort(NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_rank(NULL, &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_node_count(NULL, &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_get_async_error(NULL, &st), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_get_unique_id(NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_get_unique_id(&id), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_init(&comm, 2, 2, &id, NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_init(&comm, 0, 0, &id, NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_init(&comm, 2, -1, &id, NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_init(NULL, 2, 0, &id, NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hcoll_comm_init(&comm, 2, 0, NULL, NULL), HCOLL_ERR_INVALID_ARG);
    hcoll_unique_id_t bad = id;
    bad.internal[40] ^= 1;
    ck_assert_int_eq(hcoll_comm_init(&comm, 2, 1, &bad, NULL), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "corrupted"));
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.magic = 0;
    ck_assert_int_eq(hcoll_comm_init(&comm, 1, 0, &id, &cfg), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_null(comm);
    /* A single rank needs nobody: init, query, collectives, destroy. The
     * failed init above closed the parked listener, so rank 0 binds the
     * id's address itself here. */
    ck_assert_int_eq(hcoll_comm_init(&comm, 1, 0, &id, NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_node_count(comm, &v), HCOLL_SUCCESS);
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(hc_boot_barrier(comm->boot), HCOLL_SUCCESS);
    ck_assert_str_eq(hcoll_comm_last_error(comm), "");
    ck_assert_int_eq(hcoll_comm_destroy(comm), HCOLL_SUCCESS);
}
END_TEST


/* hcoll_comm_last_error from other threads while failing calls rewrite
 * the message: every string read is one whole message, never a mix. The
 * writer records at INFO (hc_err_repeat) so the log stays quiet. */
typedef struct lasterr_arg {
    hcoll_comm_t comm;
    atomic_int stop;
    long reads, torn;
} lasterr_arg_t;

static void *lasterr_reader(void *p)
{
    lasterr_arg_t *a = p;
    long reads = 0, torn = 0;
    while (!atomic_load(&a->stop)) {
        const char *m = hcoll_comm_last_error(a->comm);
        const char *body = strstr(m, ": ");
        reads++;
        if (!m[0])
            continue;
        if (!body) {
            torn++;
            continue;
        }
        body += 2;
        size_t n = strlen(body);
        if (n != 300 || strspn(body, body[0] == 'a' ? "a" : "b") != n)
            torn++;
        /* The string stays put while other threads write. */
        char first = body[0];
        for (int k = 0; k < 50; k++)
            if (body[299] != first)
                torn++;
    }
    __atomic_fetch_add(&a->reads, reads, __ATOMIC_RELAXED);
    __atomic_fetch_add(&a->torn, torn, __ATOMIC_RELAXED);
    return NULL;
}

START_TEST(last_error_threads)
{
    hcoll_unique_id_t id;
    lasterr_arg_t a = { 0 };
    ck_assert_int_eq(hcoll_get_unique_id(&id), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_init(&a.comm, 1, 0, &id, NULL), HCOLL_SUCCESS);
    char msg[2][301];
    memset(msg[0], 'a', 300);
    memset(msg[1], 'b', 300);
    msg[0][300] = msg[1][300] = '\0';
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, lasterr_reader, &a), 0);
    for (int i = 0; i < 200000; i++)
        hc_err_repeat(&a.comm->err, HC_COLL, 0, HCOLL_ERR_INVALID_ARG, "%s", msg[i & 1]);
    atomic_store(&a.stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    ck_assert_msg(a.torn == 0, "%ld of %ld reads saw a torn or changing message", a.torn,
                  a.reads);
    ck_assert_int_gt(a.reads, 0);
    ck_assert_int_eq(hcoll_comm_destroy(a.comm), HCOLL_SUCCESS);
}
END_TEST


/* A forked child of a rank: its calls on the parent's communicator fail
 * with a message saying why, and its destroy leaves the parent's
 * connections alone, so the parent's next collective over TCP still
 * works (a goodbye or a shutdown from the child would break it). */
static int rank_fork(int rank, int nranks, void *argp)
{
    shape_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    float v[256], w[256];
    for (int i = 0; i < 256; i++)
        v[i] = w[i] = (float)(rank + 1);
    if (rank == 0) {
        /* A request of the parent's, in flight at the fork. */
        hcoll_request_t req;
        HCT_OK(comm, hcoll_allreduce_async(comm, w, w, 256, HCOLL_FLOAT32, HCOLL_SUM, NULL,
                                           &req));
        pid_t pid = fork();
        HCT_REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            alarm(20); /* a child stuck in the parent's communicator ends */
            int bad = 0, done = 0;
            if (hcoll_allreduce(comm, v, v, 256, HCOLL_FLOAT32, HCOLL_SUM, NULL) !=
                    HCOLL_ERR_INVALID_ARG ||
                !strstr(hcoll_comm_last_error(comm), "forked child"))
                bad |= 1;
            if (hcoll_comm_destroy(comm) != HCOLL_ERR_INVALID_ARG)
                bad |= 2;
            if (hcoll_comm_abort(comm) != HCOLL_ERR_INVALID_ARG)
                bad |= 4;
            if (hcoll_test(req, &done) != HCOLL_ERR_INVALID_ARG ||
                hcoll_wait(req) != HCOLL_ERR_INVALID_ARG)
                bad |= 8;
            _exit(bad);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        HCT_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x",
                    status);
        HCT_OK(comm, hcoll_wait(req));
        HCT_OK(comm, hcoll_request_free(req));
    } else {
        HCT_OK(comm, hcoll_allreduce(comm, w, w, 256, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    }
    for (int i = 0; i < 256; i++)
        HCT_REQUIRE(w[i] == 3.0f, "w[%d] = %g", i, (double)w[i]);
    HCT_OK(comm, hcoll_allreduce(comm, v, v, 256, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    for (int i = 0; i < 256; i++)
        HCT_REQUIRE(v[i] == 3.0f, "v[%d] = %g", i, (double)v[i]);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(fork_child_refused)
{
    shape_arg_t *a = hct_shared_alloc(sizeof *a);
    a->rpn = 1;
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_fork, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Abort                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct abort_arg {
    hct_id_slot_t slot;
    hct_barrier_t bar;
    int aborter;
} abort_arg_t;

/* The aborting rank aborts right after init; the others find out in their
 * next collective, promptly rather than at the deadline. */
static int rank_abort_simple(int rank, int nranks, void *argp)
{
    abort_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    if (rank == a->aborter) {
        HCT_OK(NULL, hcoll_comm_abort(comm));
        return 0;
    }
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_boot_barrier(comm->boot);
    double dt = hct_now_ms() - t0;
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_ABORTED, "barrier -> %s",
                hcoll_status_name(st));
    HCT_REQUIRE(dt < 5000, "took %.0f ms to notice", dt);
    HCT_REQUIRE(strlen(hcoll_comm_last_error(comm)) > 0, "no error text");
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == st, "async error %s", hcoll_status_name(ae));
    /* Broken for good: the next call fails at once. */
    HCT_REQUIRE(hc_boot_barrier(comm->boot) == st, "second barrier");
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(abort_then_peers_fail)
{
    abort_arg_t *a = hct_shared_alloc(sizeof *a);
    for (int who = 0; who < 3; who += 2) { /* the root, then a leaf */
        memset(a, 0, sizeof *a);
        a->aborter = who;
        hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
        hct_result_t res[3];
        ck_assert_msg(hct_run(&o, rank_abort_simple, a, res) == 0, "aborter %d", who);
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

typedef struct thr_arg {
    hcoll_comm_t comm;
    int delay_ms;
} thr_arg_t;

static void *abort_later(void *p)
{
    thr_arg_t *t = p;
    usleep((useconds_t)t->delay_ms * 1000);
    hcoll_comm_abort(t->comm);
    return NULL;
}

/* The aborter blocks in a barrier nobody else enters; another thread
 * aborts it. Its barrier returns ABORTED promptly; the others then see
 * PEER_FAILED (or ABORTED). */
static int rank_abort_thread(int rank, int nranks, void *argp)
{
    abort_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(TIMEOUT_MS);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    if (rank == a->aborter) {
        thr_arg_t t = { comm, 300 };
        pthread_t th;
        HCT_REQUIRE(pthread_create(&th, NULL, abort_later, &t) == 0, "pthread_create");
        double t0 = hct_now_ms();
        void *boot = comm->boot;
        hcoll_status_t st = hc_boot_barrier(boot);
        double dt = hct_now_ms() - t0;
        pthread_join(th, NULL);
        /* comm is gone now: only the status and the time are looked at. */
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "blocked barrier -> %s", hcoll_status_name(st));
        HCT_REQUIRE(dt < 3000, "abort took %.0f ms to wake the barrier", dt);
        hct_barrier_wait(&a->bar, nranks, TIMEOUT_MS);
        return 0;
    }
    HCT_REQUIRE(hct_barrier_wait(&a->bar, nranks, TIMEOUT_MS) == 0, "test barrier");
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_boot_barrier(comm->boot);
    /* A leaf's contribution sent before it aborted may still complete the
     * barrier it was in; the call after that must fail. */
    if (st == HCOLL_SUCCESS && a->aborter != 0)
        st = hc_boot_barrier(comm->boot);
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_ABORTED, "barrier -> %s",
                hcoll_status_name(st));
    HCT_REQUIRE(hct_now_ms() - t0 < 5000, "slow to fail");
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(abort_from_thread)
{
    abort_arg_t *a = hct_shared_alloc(sizeof *a);
    for (int who = 0; who < 3; who += 2) {
        memset(a, 0, sizeof *a);
        a->aborter = who;
        hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
        hct_result_t res[3];
        ck_assert_msg(hct_run(&o, rank_abort_thread, a, res) == 0, "aborter %d", who);
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

int main(void)
{
    /* Loopback only, whatever this host has. */
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");

    Suite *s = suite_create("comm");
    TCase *shapes = tcase_create("shapes");
    tcase_set_timeout(shapes, 240);
    tcase_add_test(shapes, shapes_one_node);
    tcase_add_test(shapes, shapes_one_per_node);
    tcase_add_test(shapes, shapes_grid);
    tcase_add_test(shapes, uneven_nodes);
    tcase_add_test(shapes, topology_interleaved);
    tcase_add_test(shapes, repeat_no_leaks);
    suite_add_tcase(s, shapes);

    TCase *env = tcase_create("env");
    tcase_set_timeout(env, 240);
    tcase_add_test(env, env_launchers);
    tcase_add_test(env, env_errors);
    tcase_add_test(env, api_arguments);
    tcase_add_test(env, last_error_threads);
    tcase_add_test(env, fork_child_refused);
    suite_add_tcase(s, env);

    TCase *ab = tcase_create("abort");
    tcase_set_timeout(ab, 240);
    tcase_add_test(ab, abort_then_peers_fail);
    tcase_add_test(ab, abort_from_thread);
    suite_add_tcase(s, ab);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
