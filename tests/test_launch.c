/* The launcher environment (boot/launch.h) with synthetic environments:
 * launcher precedence, the rendezvous address, the secret, and every
 * malformed value rejected with a message naming the variable. The
 * process environment is never read or written. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "boot/hostlist.h"
#include "boot/launch.h"
#include "boot/uid.h"
#include "common/ranks.h"
#include "hcoll.h"

/* A synthetic environment: NULL-terminated "NAME=value" strings. */
typedef struct fake_env {
    const char *vars[40];
} fake_env_t;

static const char *fake_getenv(const char *name, void *ctx)
{
    const fake_env_t *e = ctx;
    size_t n = strlen(name);
    for (int i = 0; e->vars[i]; i++)
        if (strncmp(e->vars[i], name, n) == 0 && e->vars[i][n] == '=')
            return e->vars[i] + n + 1;
    return NULL;
}

static hcoll_status_t read_env(fake_env_t *e, hc_launch_t *l)
{
    memset(l, 0x5a, sizeof *l);
    return hc_launch_read(fake_getenv, e, NULL, l);
}

static const char *last_error(void)
{
    return hc_errbuf_get(hc_errbuf_thread());
}

/* Fails with INVALID_ARG and a message holding each of the words. */
static void expect_error(fake_env_t *e, const char *word1, const char *word2)
{
    hc_launch_t l;
    ck_assert_int_eq(read_env(e, &l), HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(last_error(), word1), "'%s' not in: %s", word1, last_error());
    if (word2)
        ck_assert_msg(strstr(last_error(), word2), "'%s' not in: %s", word2, last_error());
}

#define ROOT_OK "HCOLL_ROOT=127.0.0.1:29500"

/* What each launcher really sets (the parts hcoll may read). */
#define TORCHRUN(rank, ws, lr)                                                         \
    "TORCHELASTIC_RUN_ID=8d7c", "LOCAL_RANK=" lr, "RANK=" rank, "WORLD_SIZE=" ws,      \
        "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"
#define SRUN(procid, ntasks, nodeid)                                                   \
    "SLURM_PROCID=" procid, "SLURM_NTASKS=" ntasks, "SLURM_NODEID=" nodeid,            \
        "SLURM_LOCALID=0", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=3",                     \
        "SLURM_STEP_NODELIST=127.0.0.[1-4]", "SLURM_JOB_NODELIST=127.0.0.[1-8]"
#define MPIRUN(rank, size)                                                             \
    "OMPI_COMM_WORLD_RANK=" rank, "OMPI_COMM_WORLD_SIZE=" size,                        \
        "OMPI_COMM_WORLD_LOCAL_RANK=0"
/* hc_launch_slurm_port(4242, 3) = 12000 + (4242 * 7919 + 3) mod 20000. */
#define SRUN_ROOT "127.0.0.1:24401"

START_TEST(launcher_precedence)
{
    static const struct {
        fake_env_t env;
        int rank, nranks;
        const char *launcher, *root, *root_from;
    } cases[] = {
        /* torchrun alone: MASTER_PORT is torch's; hcoll takes the next one. */
        { { { TORCHRUN("3", "4", "1") } }, 3, 4, "torchrun", "127.0.0.1:29501",
          "MASTER_ADDR/MASTER_PORT+HCOLL_ROOT_PORT_OFFSET" },
        /* srun alone: the step's first node, the step's port. */
        { { { SRUN("2", "8", "1") } }, 2, 8, "Slurm", SRUN_ROOT, "SLURM_STEP_NODELIST" },
        { { { SRUN("0", "8", "0") } }, 0, 8, "Slurm", SRUN_ROOT, "SLURM_STEP_NODELIST" },
        /* srun torchrun: every worker of a node has the node's SLURM_PROCID;
         * torchrun's RANK wins. */
        { { { SRUN("1", "2", "1"), TORCHRUN("5", "8", "1") } }, 5, 8, "torchrun",
          "127.0.0.1:29501", NULL },
        /* mpirun inside an allocation: Open MPI over Slurm. */
        { { { SRUN("0", "1", "0"), MPIRUN("6", "16"), ROOT_OK } }, 6, 16, "Open MPI",
          "127.0.0.1:29500", "HCOLL_ROOT" },
        /* HCOLL_* over everything, HCOLL_ROOT over MASTER_* and Slurm. */
        { { { "HCOLL_RANK=1", "HCOLL_NRANKS=4", SRUN("3", "6", "0"), MPIRUN("2", "5"),
              TORCHRUN("4", "7", "0"), "HCOLL_ROOT=127.0.0.3:7" } }, 1, 4, "hcoll",
          "127.0.0.3:7", "HCOLL_ROOT" },
        { { { TORCHRUN("0", "2", "0"), "HCOLL_ROOT=127.0.0.3:29500" } }, 0, 2, "torchrun",
          "127.0.0.3:29500", "HCOLL_ROOT" },
        { { { SRUN("0", "2", "0"), "HCOLL_ROOT=127.0.0.3:8" } }, 0, 2, "Slurm", "127.0.0.3:8",
          "HCOLL_ROOT" },
        /* torchrun told by TORCHELASTIC_RUN_ID alone, or by LOCAL_RANK. */
        { { { MPIRUN("2", "5"), "TORCHELASTIC_RUN_ID=x", "RANK=4", "WORLD_SIZE=7", ROOT_OK } },
          4, 7, "torchrun", NULL, NULL },
        { { { MPIRUN("2", "5"), "LOCAL_RANK=0", "RANK=4", "WORLD_SIZE=7", ROOT_OK } }, 4, 7,
          "torchrun", NULL, NULL },
        /* LOCAL_RANK without RANK is not torchrun; RANK without torchrun's
         * marks comes after Slurm. */
        { { { SRUN("3", "6", "0"), "LOCAL_RANK=0" } }, 3, 6, "Slurm", SRUN_ROOT, NULL },
        { { { SRUN("3", "6", "0"), "RANK=4", "WORLD_SIZE=7" } }, 3, 6, "Slurm", NULL, NULL },
        { { { "RANK=4", "WORLD_SIZE=7", ROOT_OK } }, 4, 7, "RANK/WORLD_SIZE", NULL, NULL },
        /* The offset is a knob. */
        { { { TORCHRUN("0", "2", "0"), "HCOLL_ROOT_PORT_OFFSET=100" } }, 0, 2, "torchrun",
          "127.0.0.1:29600", NULL },
        { { { TORCHRUN("0", "2", "0"), "HCOLL_ROOT_PORT_OFFSET=" } }, 0, 2, "torchrun",
          "127.0.0.1:29501", NULL },
        /* Slurm's older spellings and node-list fallbacks. */
        { { { "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_JOBID=4242", "SLURM_STEPID=3",
              "SLURM_JOB_NODELIST=127.0.0.[1-2]" } }, 1, 2, "Slurm", SRUN_ROOT,
          "SLURM_JOB_NODELIST" },
        { { { "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=4",
              "SLURM_NODELIST=localhost" } }, 1, 2, "Slurm", "127.0.0.1:24402",
          "SLURM_NODELIST" },
        /* An empty variable counts as unset: the next launcher decides. */
        { { { "HCOLL_RANK=", "HCOLL_NRANKS=", "RANK=0", "WORLD_SIZE=1", ROOT_OK } },
          0, 1, "RANK/WORLD_SIZE", NULL, NULL },
        /* Only the rank variable selects a launcher; a size alone does not. */
        { { { "HCOLL_NRANKS=9", "SLURM_PROCID=0", "SLURM_NTASKS=2", ROOT_OK } },
          0, 2, "Slurm", NULL, NULL },
        /* Leading blanks and a plus sign are numbers, as strtol reads them. */
        { { { "OMPI_COMM_WORLD_RANK= 1", "OMPI_COMM_WORLD_SIZE=+3", ROOT_OK } },
          1, 3, "Open MPI", NULL, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_env_t e = cases[i].env;
        hc_launch_t l;
        char as[80];
        ck_assert_msg(read_env(&e, &l) == HCOLL_SUCCESS, "case %zu: %s", i, last_error());
        ck_assert_msg(l.rank == cases[i].rank && l.nranks == cases[i].nranks,
                      "case %zu: rank %d of %d", i, l.rank, l.nranks);
        ck_assert_msg(strcmp(l.launcher, cases[i].launcher) == 0, "case %zu: %s", i,
                      l.launcher);
        if (cases[i].root)
            ck_assert_msg(strcmp(hc_sockaddr_str(&l.root, as, sizeof as), cases[i].root) == 0,
                          "case %zu: root %s, want %s", i, as, cases[i].root);
        if (cases[i].root_from)
            ck_assert_msg(strcmp(l.root_from, cases[i].root_from) == 0, "case %zu: from %s", i,
                          l.root_from);
    }
}
END_TEST

START_TEST(slurm_port)
{
    /* Pinned: users compute it to open firewalls. */
    ck_assert_int_eq(hc_launch_slurm_port(4242, 3), 24401);
    ck_assert_int_eq(hc_launch_slurm_port(0, 0), 12000);
    /* Always in 12000..31999, below the ephemeral range; the steps of a job
     * and the same step of neighbouring jobs differ. */
    for (unsigned long long job = 4294967295ull - 3000; job <= 4294967295ull; job++) {
        for (unsigned long long step = 0; step < 4; step++) {
            int p = hc_launch_slurm_port(job, step);
            ck_assert(p >= 12000 && p <= 31999);
            ck_assert_int_ne(p, hc_launch_slurm_port(job, step + 1));
            ck_assert_int_ne(p, hc_launch_slurm_port(job + 1, step));
        }
    }
    ck_assert_int_ne(hc_launch_slurm_port(4294967294ull, 0), 0);
}
END_TEST

START_TEST(launcher_errors)
{
    fake_env_t no_rank = { { "TORCHELASTIC_RUN_ID=x", "WORLD_SIZE=2", ROOT_OK } };
    expect_error(&no_rank, "TORCHELASTIC_RUN_ID is set (torchrun) but RANK is not", NULL);
    fake_env_t bad_rank = { { TORCHRUN("x", "4", "0") } };
    expect_error(&bad_rank, "RANK='x' is not an integer", NULL);
    fake_env_t big_rank = { { TORCHRUN("4", "4", "0") } };
    expect_error(&big_rank, "RANK=4 is not below WORLD_SIZE=4", NULL);

    /* MASTER_*: both or neither, numbers, and the offset stays a port. */
    fake_env_t ma_only = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1" } };
    expect_error(&ma_only, "MASTER_ADDR is set but MASTER_PORT is not", "HCOLL_ROOT");
    fake_env_t mp_only = { { "RANK=0", "WORLD_SIZE=1", "MASTER_PORT=29500" } };
    expect_error(&mp_only, "MASTER_PORT is set but MASTER_ADDR is not", NULL);
    fake_env_t mp_bad = { { "TORCHELASTIC_RUN_ID=x", "LOCAL_RANK=0", "RANK=0", "WORLD_SIZE=1",
                            "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29x" } };
    expect_error(&mp_bad, "MASTER_PORT='29x' is not an integer in 1..65535", NULL);
    fake_env_t mp_zero = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=0" } };
    expect_error(&mp_zero, "MASTER_PORT='0'", NULL);
    fake_env_t mp_big = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                            "MASTER_PORT=70000" } };
    expect_error(&mp_big, "MASTER_PORT='70000'", NULL);
    fake_env_t over = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                          "MASTER_PORT=65535" } };
    expect_error(&over, "MASTER_PORT=65535 + HCOLL_ROOT_PORT_OFFSET=1 is 65536, above 65535",
                 NULL);
    fake_env_t over2 = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=65000", "HCOLL_ROOT_PORT_OFFSET=600" } };
    expect_error(&over2, "HCOLL_ROOT_PORT_OFFSET=600", "above 65535");
    fake_env_t off0 = { { TORCHRUN("0", "1", "0"), "HCOLL_ROOT_PORT_OFFSET=0" } };
    expect_error(&off0, "HCOLL_ROOT_PORT_OFFSET='0'", "out of range");
    fake_env_t offx = { { TORCHRUN("0", "1", "0"), "HCOLL_ROOT_PORT_OFFSET=one" } };
    expect_error(&offx, "HCOLL_ROOT_PORT_OFFSET='one'", NULL);
    fake_env_t offbig = { { TORCHRUN("0", "1", "0"), "HCOLL_ROOT_PORT_OFFSET=1001" } };
    expect_error(&offbig, "HCOLL_ROOT_PORT_OFFSET='1001'", "out of range");

    /* srun alone: node list, ids, and rank 0's node. */
    fake_env_t no_list = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=1",
                             "SLURM_STEP_ID=0" } };
    expect_error(&no_list, "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST", "HCOLL_ROOT");
    fake_env_t bad_list = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=1",
                              "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n[1-" } };
    expect_error(&bad_list, "SLURM_STEP_NODELIST='n[1-'", "unclosed '['");
    fake_env_t bad_list2 = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=1",
                               "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=n[3-1]" } };
    expect_error(&bad_list2, "SLURM_JOB_NODELIST='n[3-1]'", "ends below its start");
    fake_env_t no_job = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_ID=0",
                            "SLURM_STEP_NODELIST=localhost" } };
    expect_error(&no_job, "neither SLURM_JOB_ID nor SLURM_JOBID is set", NULL);
    fake_env_t no_step = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                             "SLURM_STEP_NODELIST=localhost" } };
    expect_error(&no_step, "neither SLURM_STEP_ID nor SLURM_STEPID is set", NULL);
    fake_env_t bad_step = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                              "SLURM_STEP_ID=x", "SLURM_STEP_NODELIST=localhost" } };
    expect_error(&bad_step, "SLURM_STEP_ID='x'", NULL);
    fake_env_t bad_job = { { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=-5",
                             "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=localhost" } };
    expect_error(&bad_job, "SLURM_JOB_ID='-5'", NULL);
    fake_env_t far0 = { { SRUN("0", "8", "2") } };
    expect_error(&far0, "rank 0 runs on node 2 of the step (SLURM_NODEID)", "HCOLL_ROOT");

    /* Open MPI inside an allocation has no address of its own. */
    fake_env_t ompi = { { SRUN("0", "1", "0"), MPIRUN("1", "4") } };
    expect_error(&ompi, "no rendezvous address", "HCOLL_ROOT");
}
END_TEST

START_TEST(rank_size_errors)
{
    fake_env_t none = { { ROOT_OK } };
    expect_error(&none, "no launcher variables", "HCOLL_RANK");

    fake_env_t no_size = { { "HCOLL_RANK=0", ROOT_OK } };
    expect_error(&no_size, "HCOLL_RANK is set but HCOLL_NRANKS is not", NULL);
    fake_env_t no_size2 = { { "SLURM_PROCID=0", "RANK=0", "WORLD_SIZE=2", ROOT_OK } };
    expect_error(&no_size2, "SLURM_PROCID is set but SLURM_NTASKS is not", NULL);

    fake_env_t too_big = { { "HCOLL_RANK=2", "HCOLL_NRANKS=2", ROOT_OK } };
    expect_error(&too_big, "HCOLL_RANK=2 is not below HCOLL_NRANKS=2", NULL);

    /* HCOLL_* values go through the configuration table's parser. */
    fake_env_t bad_hc = { { "HCOLL_RANK=x", "HCOLL_NRANKS=2", ROOT_OK } };
    expect_error(&bad_hc, "HCOLL_RANK='x'", "not an integer");
    fake_env_t neg_hc = { { "HCOLL_RANK=-1", "HCOLL_NRANKS=2", ROOT_OK } };
    expect_error(&neg_hc, "HCOLL_RANK='-1'", "out of range");
    fake_env_t zero_n = { { "HCOLL_RANK=0", "HCOLL_NRANKS=0", ROOT_OK } };
    expect_error(&zero_n, "HCOLL_NRANKS='0'", "out of range");
    fake_env_t huge = { { "HCOLL_RANK=0", "HCOLL_NRANKS=99999999999", ROOT_OK } };
    expect_error(&huge, "HCOLL_NRANKS", NULL);

    /* Other launchers' values: strtol with the same bounds. */
    fake_env_t bad_ompi = { { "OMPI_COMM_WORLD_RANK=1x", "OMPI_COMM_WORLD_SIZE=2", ROOT_OK } };
    expect_error(&bad_ompi, "OMPI_COMM_WORLD_RANK='1x' is not an integer", NULL);
    fake_env_t bad_ws = { { "RANK=0", "WORLD_SIZE=0", ROOT_OK } };
    expect_error(&bad_ws, "WORLD_SIZE='0' is not an integer in 1..", NULL);

    /* A malformed variable of a higher launcher is an error even when a
     * lower one is complete. */
    fake_env_t shadow = { { "HCOLL_RANK=one", "RANK=0", "WORLD_SIZE=2", ROOT_OK } };
    expect_error(&shadow, "HCOLL_RANK", NULL);
}
END_TEST

START_TEST(root_address)
{
    hc_launch_t l;
    char s[80];
    fake_env_t v4 = { { "HCOLL_RANK=0", "HCOLL_NRANKS=1", "HCOLL_ROOT=127.0.0.1:29500" } };
    ck_assert_int_eq(read_env(&v4, &l), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&l.root, s, sizeof s), "127.0.0.1:29500");
    ck_assert_str_eq(l.root_from, "HCOLL_ROOT");

    fake_env_t v6 = { { "HCOLL_RANK=0", "HCOLL_NRANKS=1", "HCOLL_ROOT=[::1]:1234" } };
    ck_assert_int_eq(read_env(&v6, &l), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&l.root, s, sizeof s), "[::1]:1234");

    /* HCOLL_ROOT beats MASTER_ADDR/MASTER_PORT. */
    fake_env_t both = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.2",
                          "MASTER_PORT=1", "HCOLL_ROOT=127.0.0.3:7" } };
    ck_assert_int_eq(read_env(&both, &l), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&l.root, s, sizeof s), "127.0.0.3:7");

    fake_env_t master = { { "RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.2",
                            "MASTER_PORT=29400", "HCOLL_ROOT=" } };
    ck_assert_int_eq(read_env(&master, &l), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&l.root, s, sizeof s), "127.0.0.2:29401");
    ck_assert_str_eq(l.root_from, "MASTER_ADDR/MASTER_PORT+HCOLL_ROOT_PORT_OFFSET");
    fake_env_t none = { { "RANK=0", "WORLD_SIZE=1" } };
    expect_error(&none, "no rendezvous address", NULL);
    fake_env_t bare6 = { { "RANK=0", "WORLD_SIZE=1", "HCOLL_ROOT=::1:5000" } };
    expect_error(&bare6, "HCOLL_ROOT='::1:5000' is not host:port", NULL);
    fake_env_t bracket = { { "RANK=0", "WORLD_SIZE=1", "HCOLL_ROOT=[::1]5000" } };
    expect_error(&bracket, "is not [address]:port", NULL);
    fake_env_t noport = { { "RANK=0", "WORLD_SIZE=1", "HCOLL_ROOT=127.0.0.1" } };
    expect_error(&noport, "HCOLL_ROOT='127.0.0.1'", NULL);
    fake_env_t bigport = { { "RANK=0", "WORLD_SIZE=1", "HCOLL_ROOT=127.0.0.1:99999" } };
    expect_error(&bigport, "HCOLL_ROOT: port '99999' is not a number in 1..65535", NULL);

    /* The table's parser bounds HCOLL_ROOT's length, naming it. */
    char longroot[400] = "HCOLL_ROOT=";
    memset(longroot + strlen(longroot), 'a', 300);
    strcat(longroot, ":1");
    fake_env_t lr = { { "RANK=0", "WORLD_SIZE=1", longroot } };
    expect_error(&lr, "HCOLL_ROOT", "longer than");
}
END_TEST

START_TEST(secret_and_key)
{
    hc_launch_t l;
    unsigned char want[HC_BOOT_KEY_BYTES];
    fake_env_t with = { { "RANK=0", "WORLD_SIZE=1", ROOT_OK, "HCOLL_SECRET=s3cret" } };
    ck_assert_int_eq(read_env(&with, &l), HCOLL_SUCCESS);
    ck_assert_int_eq(l.authenticated, 1);
    hc_boot_key_from_string("s3cret", want);
    ck_assert(memcmp(l.key, want, sizeof want) == 0);

    fake_env_t without = { { "RANK=0", "WORLD_SIZE=1", ROOT_OK, "HCOLL_SECRET=" } };
    ck_assert_int_eq(read_env(&without, &l), HCOLL_SUCCESS);
    ck_assert_int_eq(l.authenticated, 0);
    hc_boot_key_public(want);
    ck_assert(memcmp(l.key, want, sizeof want) == 0);

    /* Too long for the table: rejected by name, and the value is never
     * repeated (the knob is secret). */
    char longsecret[400] = "HCOLL_SECRET=";
    memset(longsecret + strlen(longsecret), 'z', 300);
    fake_env_t lng = { { "RANK=0", "WORLD_SIZE=1", ROOT_OK, longsecret } };
    expect_error(&lng, "HCOLL_SECRET", NULL);
    ck_assert_ptr_null(strstr(last_error(), "zzzz"));

    /* The stretching's cost travels with the key; the public key has none. */
    ck_assert_int_eq(read_env(&with, &l), HCOLL_SUCCESS);
    ck_assert_uint_eq(l.kdf_iters, 20000);
    fake_env_t cost = { { "RANK=0", "WORLD_SIZE=1", ROOT_OK, "HCOLL_SECRET=s3cret",
                          "HCOLL_KDF_ITERS=5000" } };
    ck_assert_int_eq(read_env(&cost, &l), HCOLL_SUCCESS);
    ck_assert_uint_eq(l.kdf_iters, 5000);
    fake_env_t cheap = { { "RANK=0", "WORLD_SIZE=1", ROOT_OK, "HCOLL_SECRET=s3cret",
                           "HCOLL_KDF_ITERS=10" } };
    expect_error(&cheap, "HCOLL_KDF_ITERS='10'", "out of range");
    ck_assert_int_eq(read_env(&without, &l), HCOLL_SUCCESS);
    ck_assert_uint_eq(l.kdf_iters, 0);
}
END_TEST

/* Without a secret, only a loopback root (every rank on this host) or an
 * explicit HCOLL_ALLOW_UNAUTHENTICATED=1 runs. */
START_TEST(unauthenticated_refused)
{
    hc_launch_t l;
    fake_env_t far = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=192.0.2.7:29500" } };
    expect_error(&far, "HCOLL_SECRET is not set", "HCOLL_ALLOW_UNAUTHENTICATED=1");
    ck_assert_ptr_nonnull(strstr(last_error(), "192.0.2.7:29500"));
    fake_env_t far6 = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=[2001:db8::1]:29500" } };
    expect_error(&far6, "HCOLL_SECRET is not set", NULL);
    fake_env_t allowed = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=192.0.2.7:29500",
                             "HCOLL_ALLOW_UNAUTHENTICATED=1" } };
    ck_assert_int_eq(read_env(&allowed, &l), HCOLL_SUCCESS);
    ck_assert_int_eq(l.authenticated, 0);
    fake_env_t zero = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=192.0.2.7:29500",
                          "HCOLL_ALLOW_UNAUTHENTICATED=0" } };
    expect_error(&zero, "HCOLL_SECRET is not set", NULL);
    fake_env_t bad = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=192.0.2.7:29500",
                         "HCOLL_ALLOW_UNAUTHENTICATED=yes" } };
    expect_error(&bad, "HCOLL_ALLOW_UNAUTHENTICATED='yes'", NULL);
    fake_env_t secret = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=192.0.2.7:29500",
                            "HCOLL_SECRET=0123456789abcdef0123456789abcdef" } };
    ck_assert_int_eq(read_env(&secret, &l), HCOLL_SUCCESS);
    ck_assert_int_eq(l.authenticated, 1);
    const char *loop[] = { "HCOLL_ROOT=127.0.0.1:29500", "HCOLL_ROOT=127.3.2.1:29500",
                           "HCOLL_ROOT=[::1]:29500", "HCOLL_ROOT=[::ffff:127.0.0.1]:29500" };
    for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
        fake_env_t e = { { "RANK=1", "WORLD_SIZE=2", loop[i] } };
        ck_assert_msg(read_env(&e, &l) == HCOLL_SUCCESS, "%s: %s", loop[i], last_error());
        ck_assert_int_eq(l.authenticated, 0);
    }
    fake_env_t mapped = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=[::ffff:10.0.0.1]:29500" } };
    expect_error(&mapped, "HCOLL_SECRET is not set", NULL);
}
END_TEST

/* A name service that hangs: this executable's getaddrinfo wins over
 * libc's for the library linked into it; names ending in ".hang.test"
 * take 3 s, as a dead DNS server would, everything else is libc's. */
static volatile int hang_calls;

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                          struct addrinfo **);
    static gai_fn real;
    if (!real)
        real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    size_t n = node ? strlen(node) : 0;
    if (n > 10 && strcmp(node + n - 10, ".hang.test") == 0 &&
        !(hints && (hints->ai_flags & AI_NUMERICHOST))) {
        __atomic_add_fetch(&hang_calls, 1, __ATOMIC_ACQ_REL);
        sleep(3);
        return EAI_AGAIN;
    }
    return real(node, service, hints, res);
}

START_TEST(resolve_bounded)
{
    hc_launch_t l;
    /* A numeric address never reaches the name service. */
    fake_env_t num = { { "RANK=1", "WORLD_SIZE=2", "HCOLL_ROOT=127.0.0.1:29500" } };
    ck_assert_int_eq(read_env(&num, &l), HCOLL_SUCCESS);
    ck_assert_int_eq(hang_calls, 0);
    /* A name that hangs: an error naming the timeout, well before 3 s. */
    const char *roots[] = { "HCOLL_ROOT=root.hang.test:29500", "MASTER_ADDR=root.hang.test" };
    for (int i = 0; i < 2; i++) {
        fake_env_t e = { { "RANK=1", "WORLD_SIZE=2", roots[i], "MASTER_PORT=29500",
                           "HCOLL_TIMEOUT_MS=300", "HCOLL_SECRET=resolve_bounded: secret" } };
        double t0 = hct_now_ms();
        expect_error(&e, "cannot resolve 'root.hang.test' within 300 ms", "HCOLL_TIMEOUT_MS");
        double dt = hct_now_ms() - t0;
        ck_assert_msg(dt >= 250 && dt < 1500, "took %.0f ms", dt);
        ck_assert_int_eq(hang_calls, i + 1);
    }
}
END_TEST

START_TEST(weak_secrets)
{
    ck_assert(hc_launch_secret_weak(""));
    ck_assert(hc_launch_secret_weak("x"));
    ck_assert(hc_launch_secret_weak("fifteen chars!!"));       /* 15 */
    ck_assert(!hc_launch_secret_weak("sixteen chars!!!"));     /* 16 */
    ck_assert(hc_launch_secret_weak("0123456789abcdef"));      /* 16 hex digits: 64 bits */
    ck_assert(hc_launch_secret_weak("0123456789abcdef0123456789ABCDE")); /* 31 */
    ck_assert(!hc_launch_secret_weak("0123456789abcdef0123456789ABCDEF"));
    ck_assert(!hc_launch_secret_weak("0123456789abcdeg")); /* not all hex: 16 chars */
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Slurm host lists                                                          */
/* ------------------------------------------------------------------------ */

typedef struct joined {
    char s[2048];
    int n, stop_after;
} joined_t;

static int join_host(const char *host, void *ctx)
{
    joined_t *j = ctx;
    size_t l = strlen(j->s);
    snprintf(j->s + l, sizeof j->s - l, "%s%s", l ? " " : "", host);
    return ++j->n == j->stop_after;
}

START_TEST(hostlist_expansion)
{
    static const struct {
        const char *list, *want;
    } cases[] = {
        { "node1", "node1" },
        { "node[01-04,07]", "node01 node02 node03 node04 node07" },
        { "gpu-[1-3]-ib", "gpu-1-ib gpu-2-ib gpu-3-ib" },
        { "a,b[2-3]", "a b2 b3" },
        { "b[2-3],a", "b2 b3 a" },
        { "n[098-100]", "n098 n099 n100" },
        { "n[8-11]", "n8 n9 n10 n11" },
        { "n[08-11]", "n08 n09 n10 n11" },
        { "n[0]", "n0" },
        { "r[1-2]n[8-9]", "r1n8 r1n9 r2n8 r2n9" },
        { "[1-2]x", "1x 2x" },
        { "x[1,3],y[05-06,9],z", "x1 x3 y05 y06 y9 z" },
        { "gpu-a.ib-[3-4].example.org", "gpu-a.ib-3.example.org gpu-a.ib-4.example.org" },
        { "10.0.0.[1-2]", "10.0.0.1 10.0.0.2" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        joined_t j = { "", 0, 0 };
        char err[200] = "";
        ck_assert_msg(hc_hostlist_expand(cases[i].list, join_host, &j, err, sizeof err) ==
                          HCOLL_SUCCESS, "%s: %s", cases[i].list, err);
        ck_assert_msg(strcmp(j.s, cases[i].want) == 0, "%s: got '%s', want '%s'",
                      cases[i].list, j.s, cases[i].want);
    }
    /* Stopping early: the rest is not produced, but still checked. */
    joined_t j = { "", 0, 2 };
    char err[200];
    ck_assert_int_eq(hc_hostlist_expand("n[1-999999999],m", join_host, &j, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_str_eq(j.s, "n1 n2");
    j = (joined_t){ "", 0, 1 };
    ck_assert_int_eq(hc_hostlist_expand("n[1-3],m[", join_host, &j, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    char host[16];
    ck_assert_int_eq(hc_hostlist_first("gpu-[07-09]-ib,x", host, sizeof host, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_str_eq(host, "gpu-07-ib");
    ck_assert_int_eq(hc_hostlist_first("averyveryverylonghostname", host, sizeof host, err,
                                       sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "does not fit"));
}
END_TEST

START_TEST(hostlist_errors)
{
    static const struct {
        const char *list, *why;
    } cases[] = {
        { "", "empty host list" },
        { "a,", "empty host name at character 3" },
        { ",a", "empty host name at character 1" },
        { "a,,b", "empty host name at character 3" },
        { "n[1-3", "unclosed '[' at character 2" },
        { "n[1-[2]]", "nested '[' at character 5" },
        { "n1]", "']' without '[' at character 3" },
        { "n[]", "empty brackets at character 2" },
        { "n[3-1]", "range 3-1 at character 3 ends below its start" },
        { "n[1-]", "bad range at character 5" },
        { "n[-1]", "bad range at character 3" },
        { "n[a]", "bad range at character 3" },
        { "n[1,,2]", "bad range at character 5" },
        { "n[1,]", "empty range at character 5" },
        { "n[1 2]", "bad range at character 4" },
        { "n[1234567890]", "bad range" },
        { "a b", "unexpected character 0x20 at character 2" },
        { "n[1][2][3][4][5][6][7][8][9]", "more than 8 brackets" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        joined_t j = { "", 0, 0 };
        char err[200] = "";
        ck_assert_msg(hc_hostlist_expand(cases[i].list, join_host, &j, err, sizeof err) ==
                          HCOLL_ERR_INVALID_ARG, "'%s' accepted", cases[i].list);
        ck_assert_msg(strstr(err, cases[i].why), "'%s': '%s' not in '%s'", cases[i].list,
                      cases[i].why, err);
    }
    char lng[400], err[200];
    memset(lng, 'h', 300);
    lng[300] = '\0';
    joined_t j = { "", 0, 0 };
    ck_assert_int_eq(hc_hostlist_expand(lng, join_host, &j, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "longer than 255"));
    snprintf(lng, sizeof lng, "%.250s[1-100000]", "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
             "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
             "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
             "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh");
    j = (joined_t){ "", 0, 0 };
    ck_assert_int_eq(hc_hostlist_expand(lng, join_host, &j, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "longer than 255"));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A unique id made by a process that is not a rank and stays alive         */
/* ------------------------------------------------------------------------ */

#define DRV_RANKS 4
#define DRV_TIMEOUT_MS 15000
#define DRV_COUNT 100000

typedef struct driver_arg {
    int pipe[DRV_RANKS][2];
    volatile int done;      /* ranks finished (shared memory) */
    volatile int driver_up; /* the driver was alive when the last rank finished */
} driver_arg_t;

/* Makes the id, hands it to every rank through its pipe, and stays alive
 * (holding its reserved port) until every rank has finished; then checks
 * that the port was still reserved. */
static int driver(driver_arg_t *a)
{
    hcoll_unique_id_t id;
    HCT_OK(NULL, hcoll_get_unique_id(&id));
    for (int r = 0; r < DRV_RANKS; r++)
        HCT_REQUIRE(write(a->pipe[r][1], &id, sizeof id) == (ssize_t)sizeof id, "write: %s",
                    strerror(errno));
    const double end = hct_now_ms() + DRV_TIMEOUT_MS;
    while (__atomic_load_n(&a->done, __ATOMIC_ACQUIRE) < DRV_RANKS && hct_now_ms() < end)
        usleep(2000);
    HCT_REQUIRE(a->done == DRV_RANKS, "only %d ranks finished", a->done);
    __atomic_store_n(&a->driver_up, 1, __ATOMIC_RELEASE);
    /* The reservation held all along: a plain bind of the port fails. */
    hc_uid_t u;
    HCT_OK(NULL, hc_uid_decode(&id, NULL, -1, &u));
    int fd = socket(u.root.sa.sa_family, SOCK_STREAM, 0);
    int rc = bind(fd, &u.root.sa, hc_sockaddr_len(&u.root));
    int e = errno;
    close(fd);
    HCT_REQUIRE(rc != 0 && e == EADDRINUSE, "the id's port was not reserved (bind rc %d)", rc);
    return 0;
}

static int driver_rank(int rank, int nranks, void *argp)
{
    driver_arg_t *a = argp;
    (void)nranks;
    if (rank == DRV_RANKS)
        return driver(a);
    hcoll_unique_id_t id;
    struct pollfd p = { a->pipe[rank][0], POLLIN, 0 };
    HCT_REQUIRE(poll(&p, 1, DRV_TIMEOUT_MS) == 1, "no id from the driver");
    HCT_REQUIRE(read(a->pipe[rank][0], &id, sizeof id) == (ssize_t)sizeof id, "short id");
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = DRV_TIMEOUT_MS;
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, DRV_RANKS, rank, &id, &cfg));
    float *buf = malloc(DRV_COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "malloc");
    for (int i = 0; i < DRV_COUNT; i++)
        buf[i] = (float)((rank + i) % 7);
    HCT_OK(comm, hcoll_allreduce(comm, buf, buf, DRV_COUNT, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    int wrong = 0;
    for (int i = 0; i < DRV_COUNT; i++) {
        float want = 0;
        for (int r = 0; r < DRV_RANKS; r++)
            want += (float)((r + i) % 7);
        wrong += buf[i] != want;
    }
    free(buf);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    HCT_REQUIRE(wrong == 0, "%d elements wrong", wrong);
    __atomic_add_fetch(&a->done, 1, __ATOMIC_ACQ_REL);
    return 0;
}

START_TEST(uid_from_live_driver)
{
    driver_arg_t *a = hct_shared_alloc(sizeof *a);
    for (int r = 0; r < DRV_RANKS; r++)
        ck_assert_int_eq(pipe(a->pipe[r]), 0);
    /* Four ranks as 2 emulated nodes x 2, and the driver as a fifth
     * process that is no rank. */
    hct_opts_t o = { .nranks = DRV_RANKS + 1, .ranks_per_node = 2,
                     .timeout_ms = DRV_TIMEOUT_MS + 5000 };
    hct_result_t res[DRV_RANKS + 1];
    int bad = hct_run(&o, driver_rank, a, res);
    for (int r = 0; r < DRV_RANKS; r++)
        close(a->pipe[r][0]), close(a->pipe[r][1]);
    ck_assert_msg(bad == 0, "%d process(es) failed", bad);
    ck_assert_int_eq(a->done, DRV_RANKS);
    ck_assert_int_eq(a->driver_up, 1);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* hcoll_comm_init_env under emulated srun and srun torchrun                 */
/* ------------------------------------------------------------------------ */

enum { RUN_SRUN, RUN_SRUN_TORCHRUN };

typedef struct srun_arg {
    int mode;
    int job;         /* SLURM_JOB_ID, varied so that runs do not share a port */
    int master_port; /* held by the parent, as torch's TCPStore would be */
} srun_arg_t;

static void setint(const char *name, int v)
{
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

static int srun_rank(int rank, int nranks, void *argp)
{
    const srun_arg_t *a = argp;
    static const char *const clear[] = { "HCOLL_RANK", "HCOLL_NRANKS", "HCOLL_ROOT",
                                         "HCOLL_SECRET", "MASTER_ADDR", "MASTER_PORT",
                                         "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                         "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK" };
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++)
        unsetenv(clear[i]);
    const int node = rank / 2;
    setint("SLURM_JOB_ID", a->job);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_STEP_NODELIST", "localhost,node-[2-9]", 1);
    if (a->mode == RUN_SRUN) {
        setint("SLURM_PROCID", rank), setint("SLURM_NTASKS", nranks);
        setint("SLURM_NODEID", node);
    } else {
        /* One srun task per node, torchrun's workers under it, all with
         * the node's SLURM_PROCID. */
        setint("SLURM_PROCID", node), setint("SLURM_NTASKS", nranks / 2);
        setint("SLURM_NODEID", node);
        setenv("TORCHELASTIC_RUN_ID", "hc-test", 1);
        setint("LOCAL_RANK", rank % 2), setint("RANK", rank), setint("WORLD_SIZE", nranks);
        setenv("MASTER_ADDR", "127.0.0.1", 1), setint("MASTER_PORT", a->master_port);
    }
    setenv("HCOLL_SECRET", "srun-test", 1);
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = DRV_TIMEOUT_MS;
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init_env(&comm, &cfg));
    int r, n, nodes;
    HCT_OK(comm, hcoll_comm_rank(comm, &r));
    HCT_OK(comm, hcoll_comm_size(comm, &n));
    HCT_OK(comm, hcoll_comm_node_count(comm, &nodes));
    HCT_REQUIRE(r == rank && n == nranks && nodes == 2, "rank %d of %d, %d nodes", r, n, nodes);
    int64_t v = rank + 1;
    HCT_OK(comm, hcoll_allreduce(comm, &v, &v, 1, HCOLL_INT64, HCOLL_SUM, NULL));
    HCT_REQUIRE(v == (int64_t)nranks * (nranks + 1) / 2, "sum %lld", (long long)v);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(init_env_srun)
{
    srun_arg_t *a = hct_shared_alloc(sizeof *a);
    /* MASTER_PORT is held (listening) all along: a rendezvous there fails. */
    int hold = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(hold, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(hold, 4), 0);
    ck_assert_int_eq(getsockname(hold, (struct sockaddr *)&sa, &sl), 0);
    a->master_port = ntohs(sa.sin_port);
    for (int mode = RUN_SRUN; mode <= RUN_SRUN_TORCHRUN; mode++) {
        a->mode = mode;
        a->job = (int)getpid() * 2 + mode;
        hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = DRV_TIMEOUT_MS + 5000 };
        hct_result_t res[4];
        int bad = hct_run(&o, srun_rank, a, res);
        ck_assert_msg(bad == 0, "mode %d: %d rank(s) failed", mode, bad);
    }
    close(hold);
    hct_shared_free(a, sizeof *a);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_TIMEOUT_MS");
    Suite *s = suite_create("launch");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, launcher_precedence);
    tcase_add_test(tc, slurm_port);
    tcase_add_test(tc, launcher_errors);
    tcase_add_test(tc, rank_size_errors);
    tcase_add_test(tc, root_address);
    tcase_add_test(tc, secret_and_key);
    tcase_add_test(tc, unauthenticated_refused);
    tcase_add_test(tc, weak_secrets);
    tcase_add_test(tc, resolve_bounded);
    tcase_add_test(tc, hostlist_expansion);
    tcase_add_test(tc, hostlist_errors);
    suite_add_tcase(s, tc);
    TCase *uid = tcase_create("uid");
    tcase_set_timeout(uid, 60);
    tcase_add_test(uid, uid_from_live_driver);
    tcase_add_test(uid, init_env_srun);
    suite_add_tcase(s, uid);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
