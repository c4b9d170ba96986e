/*
 * How hcoll_perf's ranks come to be (see perf_rank.h). Under mpirun, srun
 * or torchrun the launcher started them and says which one this is; with
 * -np N they are forked here, each given the library's env launch
 * variables (HCOLL_RANK, HCOLL_NRANKS, a loopback HCOLL_ROOT on a free
 * port, a random HCOLL_SECRET) and, with --ranks-per-node, an emulated
 * node through HCOLL_HOSTID (and NCCL_HOSTID, so that NCCL sees the same
 * nodes). The parent only waits: once a rank fails it gives the others a
 * moment to report, then kills them, since they would otherwise wait for
 * the dead one until HCOLL_TIMEOUT_MS.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perf_rank.h"

int hp_launcher_rank(void)
{
    static const char *vars[] = { "HCOLL_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                  "SLURM_PROCID", "RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        int r;
        if (v && hp_parse_int(v, 0, INT_MAX, &r) == 0)
            return r;
    }
    return -1;
}

/* A port free on loopback now, below the kernel's ephemeral range: one
 * from bind(0) is ephemeral, and any connection the ranks make before rank
 * 0 binds it may be given it as its local port. */
static int try_bind(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons((uint16_t)port) };
    socklen_t sl = sizeof sa;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &sl) == 0;
    if (fd >= 0)
        close(fd);
    return ok ? ntohs(sa.sin_port) : -1;
}

static int free_loopback_port(void)
{
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int i = 0; low > 10001 && i < 200; i++) {
        int port = try_bind(10000 + (int)(rand_r(&seed) % (unsigned)(low - 10001)));
        if (port > 0)
            return port;
    }
    return try_bind(0);
}

/* Rank r of the -np job, in the forked child: the library's env launch
 * variables, then the rank's own run. Never returns. */
static void np_child(const hp_opts_t *o, int r, const char *root, const char *secret, pid_t parent,
                     int (*rank_main)(const hp_opts_t *o))
{
    char buf[64];
    snprintf(buf, sizeof buf, "%d", r);
    setenv("HCOLL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", o->np);
    setenv("HCOLL_NRANKS", buf, 1);
    setenv("HCOLL_ROOT", root, 1);
    setenv("HCOLL_SECRET", secret, 1);
    setenv("HCOLL_PERF_CHILD", "1", 1);
    /* One host: the rails are loopback unless the user chose. */
    setenv("HCOLL_SOCKET_IFNAME", "lo", 0);
    if (o->ranks_per_node) {
        snprintf(buf, sizeof buf, "hcoll-perf-%d-node%d", (int)parent, r / o->ranks_per_node);
        setenv("HCOLL_HOSTID", buf, 1);
        setenv("NCCL_HOSTID", buf, 1);
    }
    if (r != 0) /* only rank 0 prints the table */
        if (!freopen("/dev/null", "w", stdout))
            _exit(1);
    exit(rank_main(o));
}

int hp_launch_np(const hp_opts_t *o, int (*rank_main)(const hp_opts_t *o))
{
    int n = o->np;
    int port = free_loopback_port();
    unsigned char rnd[16];
    char secret[33], root[32];
    if (port < 0 || getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        fprintf(stderr, "hcoll_perf: -np: no loopback port or random secret: %s\n",
                strerror(errno));
        return 1;
    }
    for (int i = 0; i < 16; i++)
        snprintf(secret + 2 * i, 3, "%02x", rnd[i]);
    snprintf(root, sizeof root, "127.0.0.1:%d", port);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    int *done = calloc((size_t)n, sizeof *done);
    int *codes = calloc((size_t)n, sizeof *codes);
    if (!pids || !done || !codes)
        return 1;
    fflush(stdout);
    fflush(stderr);
    pid_t me = getpid();
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            fprintf(stderr, "hcoll_perf: fork: %s\n", strerror(errno));
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            return 1;
        }
        if (pids[r] == 0)
            np_child(o, r, root, secret, me, rank_main);
    }
    /* Wait; once a rank fails, give the others a moment to report, then
     * kill them: they would otherwise wait for the dead one until
     * HCOLL_TIMEOUT_MS. */
    double deadline = hp_now_s() + o->deadline_s, kill_at = 0;
    int left = n, first_bad = -1, killed = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != pid)
                    continue;
                done[r] = 1;
                left--;
                codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (codes[r] != 0 && first_bad < 0) {
                    first_bad = r;
                    kill_at = hp_now_s() + 2.0;
                }
            }
            continue;
        }
        double t = hp_now_s();
        if (!killed && ((kill_at > 0 && t > kill_at) || t > deadline)) {
            if (t > deadline)
                fprintf(stderr, "hcoll_perf: -np: deadline of %.0f s passed; killing the ranks\n",
                        o->deadline_s);
            for (int r = 0; r < n; r++)
                if (!done[r])
                    kill(pids[r], SIGKILL);
            killed = 1;
        }
        usleep(20000);
    }
    int rc = 0;
    if (first_bad >= 0) {
        /* Rank 0's code says most (it sees the whole job); else the first. */
        rc = codes[0] != 0 && codes[0] < 128 ? codes[0] : codes[first_bad];
        for (int r = 0; r < n; r++)
            if (codes[r] != 0)
                fprintf(stderr, "hcoll_perf: -np: rank %d %s %d\n", r,
                        codes[r] >= 128 ? "died of signal" : "exited with",
                        codes[r] >= 128 ? codes[r] - 128 : codes[r]);
    } else if (killed) {
        rc = 124;
    }
    free(pids);
    free(done);
    free(codes);
    return rc;
}
