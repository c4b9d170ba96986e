/*
 * ring_bench: the inter-node ring against the bound its transport allows,
 * on this host's loopback, ranks forked here (one per emulated node).
 *
 *   (a) ring     hc_ring_allreduce of B bytes of float32 SUM; bus bandwidth
 *                = B / t * 2(n-1)/n (what each link carries per second)
 *   (b) raw      the same traffic pattern with no reduction and no framing:
 *                every rank streams B*2(n-1)/n bytes over plain TCP to the
 *                next rank while receiving as much from the previous one;
 *                bandwidth = bytes per rank / t
 *
 * usage: ring_bench [-n 2,4] [-b 64M] [-i iters] [-w warmup] [-r reps]
 * (a) and (b) alternate for reps rounds of iters calls; each keeps its best
 * round (the host is shared and noisy; both see the same noise).
 * Chunk size, sockets per peer, socket buffers come from HCOLL_* variables.
 * Prints a table and one "RESULT n=.. busbw_ring=.. bw_raw=.." line per n
 * (GB/s = 1e9 bytes/s) for scripts/bench-ring.sh.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/err.h"
#include "base/reduce.h"
#include "boot/hmac.h"
#include "inter/ring.h"
#include "inter/tcp.h"

#define MAXR 16

typedef struct shared {
    volatile int bar_count, bar_gen;
    int n;
    char slot[MAXR][256];
    volatile int port[MAXR];
    double t_ring[MAXR], t_raw[MAXR];
    int failed;
} shared_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void barrier(shared_t *sh)
{
    int gen = __atomic_load_n(&sh->bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&sh->bar_count, 1, __ATOMIC_ACQ_REL) == sh->n) {
        __atomic_store_n(&sh->bar_count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&sh->bar_gen, 1, __ATOMIC_RELEASE);
        return;
    }
    double deadline = now_s() + 120;
    while (__atomic_load_n(&sh->bar_gen, __ATOMIC_ACQUIRE) == gen) {
        if (now_s() > deadline) {
            fprintf(stderr, "ring_bench: barrier timed out\n");
            _exit(3);
        }
        usleep(50);
    }
}

typedef struct ag {
    shared_t *sh;
    int rank;
} ag_t;

static hcoll_status_t allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_t *a = ctx;
    memcpy(a->sh->slot[a->rank], mine, len);
    barrier(a->sh);
    for (int i = 0; i < a->sh->n; i++)
        memcpy((char *)all + (size_t)i * len, a->sh->slot[i], len);
    barrier(a->sh);
    return HCOLL_SUCCESS;
}

/* (b): raw TCP, the next rank's socket written while the previous rank's
 * is read, both straight from/to big buffers. */
typedef struct raw {
    int lfd, out, in;
} raw_t;

static int raw_connect(shared_t *sh, int rank, int n, raw_t *rw)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.%d", rank + 1);
    rw->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET };
    inet_pton(AF_INET, addr, &sa.sin_addr);
    if (bind(rw->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(rw->lfd, 4))
        return -1;
    socklen_t sl = sizeof sa;
    getsockname(rw->lfd, (struct sockaddr *)&sa, &sl);
    sh->port[rank] = ntohs(sa.sin_port);
    barrier(sh);
    int next = (rank + 1) % n;
    rw->out = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in da = { .sin_family = AF_INET, .sin_port = htons((uint16_t)sh->port[next]) };
    char naddr[32];
    snprintf(naddr, sizeof naddr, "127.0.0.%d", next + 1);
    inet_pton(AF_INET, naddr, &da.sin_addr);
    if (connect(rw->out, (struct sockaddr *)&da, sizeof da))
        return -1;
    rw->in = accept(rw->lfd, NULL, NULL);
    if (rw->in < 0)
        return -1;
    int one = 1;
    setsockopt(rw->out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(rw->out, F_SETFL, O_NONBLOCK);
    fcntl(rw->in, F_SETFL, O_NONBLOCK);
    return 0;
}

static int raw_stream(const raw_t *rw, char *src, char *dst, size_t bytes)
{
    size_t sent = 0, got = 0;
    while (sent < bytes || got < bytes) {
        struct pollfd p[2] = { { rw->out, sent < bytes ? POLLOUT : 0, 0 },
                               { rw->in, got < bytes ? POLLIN : 0, 0 } };
        if (poll(p, 2, 10000) <= 0)
            return -1;
        if (p[0].revents & POLLOUT) {
            ssize_t k = send(rw->out, src + sent, bytes - sent, MSG_NOSIGNAL);
            if (k > 0)
                sent += (size_t)k;
            else if (k < 0 && errno != EAGAIN)
                return -1;
        }
        if (p[1].revents & (POLLIN | POLLHUP)) {
            ssize_t k = recv(rw->in, dst + got, bytes - got, 0);
            if (k > 0)
                got += (size_t)k;
            else if (k == 0 || errno != EAGAIN)
                return -1;
        }
    }
    return 0;
}

static int run_rank(shared_t *sh, int rank, int n, size_t bytes, int iters, int warmup, int reps,
                    const hc_params_t *hp)
{
    static hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.%d", rank + 1);
    ag_t ag = { sh, rank };
    hc_ring_params_t p = {
        .ops = &hc_tcp_ops,
        .tp = { rank, n, addr, "lo", rank, rank, (int)hp->timeout_ms, (int)hp->nsocks_perpeer,
                hp->socket_buf, &eb },
        .chunk_bytes = hp->chunk_bytes,
        .allgather = allgather,
        .ag_ctx = &ag,
    };
    static const unsigned char key[HC_TP_KEY_BYTES] = "ring_bench's data hello key";
    p.tp.auth_key = key;
    p.tp.mac = hc_hmac_sha256;
    hc_ring_t *ring;
    if (hc_ring_create(&p, &ring) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", rank, eb.msg);
        return 1;
    }
    size_t count = bytes / sizeof(float);
    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        send[i] = (float)(i % 17), recv[i] = 0;
    /* (b) moves the same bytes per rank as the ring's links carry. */
    size_t per_rank = (size_t)((double)bytes * 2 * (n - 1) / n);
    char *src = malloc(per_rank), *dst = malloc(per_rank);
    memset(src, 1, per_rank);
    memset(dst, 0, per_rank);
    raw_t rw;
    if (raw_connect(sh, rank, n, &rw) != 0) {
        fprintf(stderr, "rank %d: raw connect: %s\n", rank, strerror(errno));
        return 1;
    }
    for (int i = 0; i < warmup; i++) {
        if (hc_ring_allreduce(ring, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM) != HCOLL_SUCCESS)
            goto fail;
        barrier(sh);
        if (raw_stream(&rw, src, dst, per_rank) != 0)
            goto fail_raw;
    }
    /* Alternate (a) and (b) rep by rep and keep each one's best rep: this
     * host is shared and noisy, and interleaving exposes both to the same
     * noise. */
    double best_ring = 1e30, best_raw = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        barrier(sh);
        double t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (hc_ring_allreduce(ring, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM) !=
                HCOLL_SUCCESS)
                goto fail;
        barrier(sh);
        double t = (now_s() - t0) / iters;
        best_ring = t < best_ring ? t : best_ring;
        t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (raw_stream(&rw, src, dst, per_rank) != 0)
                goto fail_raw;
        barrier(sh);
        t = (now_s() - t0) / iters;
        best_raw = t < best_raw ? t : best_raw;
    }
    sh->t_ring[rank] = best_ring;
    sh->t_raw[rank] = best_raw;
    if (recv[5] != (float)(5 * n)) {
        fprintf(stderr, "rank %d: wrong result %g\n", rank, recv[5]);
        return 1;
    }
    hc_ring_destroy(ring);
    close(rw.in), close(rw.out), close(rw.lfd);
    free(src), free(dst), free(send), free(recv);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, eb.msg);
    return 1;
fail_raw:
    fprintf(stderr, "rank %d: raw stream failed: %s\n", rank, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    const char *ns = "2,4";
    uint64_t bytes = 64u << 20;
    int iters = 5, warmup = 2, reps = 5;
    int opt;
    while ((opt = getopt(argc, argv, "n:b:i:w:r:h")) != -1) {
        switch (opt) {
        case 'n': ns = optarg; break;
        case 'b':
            if (hc_parse_size(optarg, &bytes) != HCOLL_SUCCESS) {
                fprintf(stderr, "bad size %s\n", optarg);
                return 2;
            }
            break;
        case 'i': iters = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-n 2,4] [-b 64M] [-i iters] [-w warmup] [-r reps]\n", argv[0]);
            return 2;
        }
    }
    hc_params_t hp;
    char err[512];
    if (hc_params_load(&hp, NULL, err, sizeof err) != HCOLL_SUCCESS) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    printf("# ring_bench: float32 sum, %llu bytes, best of %d rounds of %d (+%d warm-up), chunk %llu, "
           "%lld socket(s) per peer, reduce kernels %s\n",
           (unsigned long long)bytes, reps, iters, warmup, (unsigned long long)hp.chunk_bytes,
           (long long)hp.nsocks_perpeer, hc_reduce_impl_name());
    printf("# %5s %12s %12s %12s %12s %8s\n", "ranks", "ring ms", "algbw GB/s", "busbw GB/s",
           "raw GB/s", "a/b");
    int rc = 0;
    char *list = strdup(ns);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        if (n < 2 || n > MAXR) {
            fprintf(stderr, "ranks must be 2..%d\n", MAXR);
            return 2;
        }
        shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
        memset(sh, 0, sizeof *sh);
        sh->n = n;
        pid_t pids[MAXR];
        fflush(stdout);
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0)
                _exit(run_rank(sh, r, n, (size_t)bytes, iters, warmup, reps, &hp));
        }
        int bad = 0;
        for (int r = 0; r < n; r++) {
            int status;
            waitpid(pids[r], &status, 0);
            bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        if (bad) {
            fprintf(stderr, "ring_bench: n=%d failed\n", n);
            rc = 1;
            continue;
        }
        double t = 0, traw = 0;
        for (int r = 0; r < n; r++) {
            t = t > sh->t_ring[r] ? t : sh->t_ring[r];
            traw = traw > sh->t_raw[r] ? traw : sh->t_raw[r];
        }
        double algbw = (double)bytes / t / 1e9;
        double busbw = algbw * 2 * (n - 1) / n;
        double raw = (double)bytes * 2 * (n - 1) / n / traw / 1e9;
        printf("  %5d %12.2f %12.3f %12.3f %12.3f %8.2f\n", n, t * 1e3, algbw, busbw, raw,
               busbw / raw);
        printf("RESULT n=%d bytes=%llu busbw_ring=%.4f bw_raw=%.4f\n", n,
               (unsigned long long)bytes, busbw, raw);
        munmap(sh, sizeof *sh);
    }
    free(list);
    return rc;
}
