/*
 * The rendezvous under pressure and against impostors, across forked
 * ranks and threads:
 *   paused_root      rank 0 SIGSTOPped while it listens, rank 1 connected,
 *                    40 idle strays, rank 0 resumed: both join
 *   flood            N ranks init while S strays connect (idle, garbage,
 *                    a valid-looking HELLO + AUTH with a bad MAC): the job
 *                    succeeds; the added init time against a clean init in
 *                    the same run is printed (HCT_FLOOD_RANKS and
 *                    HCT_FLOOD_STRAYS: 8 and 200 by default; the 16 x 1000
 *                    run is scripts/boot-flood.sh)
 *   emfile           the root out of file descriptors (low RLIMIT_NOFILE)
 *                    rests its listener instead of spinning, and lets the
 *                    rank in once fds are back
 *   fake_root_*      a client against a hand-written root: an AUTH_OK MAC
 *                    one bit off is MISMATCH; an ERROR or a REFUSE whose
 *                    MAC is wrong is retried, then MISMATCH quoting it as
 *                    unverified; a REFUSE with the right MAC is honoured
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/hmac.h"
#include "boot/uid.h"
#include "boot/wire.h"
#include "common/ranks.h"
#include "core/comm.h"

static int wait_flag(volatile int *f, int want, int ms)
{
    double end = hct_now_ms() + ms;
    while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < want) {
        if (hct_now_ms() > end)
            return -1;
        usleep(1000);
    }
    return 0;
}

static void add_flag(volatile int *f)
{
    __atomic_add_fetch(f, 1, __ATOMIC_ACQ_REL);
}

static int dial_nb(const hc_sockaddr_t *root)
{
    int fd = socket(root->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, &root->sa, hc_sockaddr_len(root)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Connect, retrying while the root is not listening yet (a unique id's
 * port refuses until rank 0's init listens on it). */
static int dial_wait(const hc_sockaddr_t *root, int ms)
{
    double end = hct_now_ms() + ms;
    for (;;) {
        int fd = dial_nb(root);
        if (fd >= 0 || hct_now_ms() > end)
            return fd;
        usleep(2000);
    }
}

/* ------------------------------------------------------------------------ */
/* Rank 0 paused while rank 1 and 40 strays connect                          */
/* ------------------------------------------------------------------------ */

typedef struct pause_arg {
    hct_id_slot_t slot;
    volatile int pid0, paused, done;
    char failure[256];
} pause_arg_t;

static int pause_attacker(pause_arg_t *a)
{
    hcoll_unique_id_t id;
    hc_uid_t u;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, 1, 20000, &id) == 0, "no id");
    HCT_REQUIRE(hc_uid_decode(&id, NULL, 1, &u) == HCOLL_SUCCESS, "decode");
    HCT_REQUIRE(wait_flag(&a->pid0, 1, 20000) == 0, "no pid");
    /* Rank 0 listens once a connection is accepted by the kernel. */
    int probe = dial_wait(&u.root, 20000);
    HCT_REQUIRE(probe >= 0, "root never listened");
    close(probe);
    HCT_REQUIRE(kill(a->pid0, SIGSTOP) == 0, "SIGSTOP");
    add_flag(&a->paused);
    usleep(300 * 1000); /* rank 1 connects and says HELLO into the backlog */
    int strays[40];
    for (int i = 0; i < 40; i++) {
        strays[i] = dial_nb(&u.root);
        HCT_REQUIRE(strays[i] >= 0, "stray %d", i);
    }
    usleep(100 * 1000);
    kill(a->pid0, SIGCONT);
    HCT_REQUIRE(wait_flag(&a->done, 2, 30000) == 0, "ranks did not finish");
    for (int i = 0; i < 40; i++)
        close(strays[i]);
    return 0;
}

static int rank_pause(int rank, int nranks, void *argp)
{
    pause_arg_t *a = argp;
    (void)nranks;
    if (rank == 2)
        return pause_attacker(a);
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 8000;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no id");
    if (rank == 0)
        __atomic_store_n(&a->pid0, (int)getpid(), __ATOMIC_RELEASE);
    else
        HCT_REQUIRE(wait_flag(&a->paused, 1, 20000) == 0, "rank 0 never paused");
    HCT_OK(NULL, hcoll_comm_init(&comm, 2, rank, &id, &cfg));
    int v = rank + 5, all[2];
    HCT_OK(comm, hc_boot_allgather(comm->boot, &v, all, sizeof v));
    HCT_REQUIRE(all[0] == 5 && all[1] == 6, "allgather");
    HCT_OK(comm, hcoll_comm_destroy(comm));
    add_flag(&a->done);
    return 0;
}

START_TEST(paused_root)
{
    pause_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[3];
    int bad = hct_run(&o, rank_pause, a, res);
    ck_assert_msg(bad == 0, "%d process(es) failed", bad);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A flood of strays during init                                             */
/* ------------------------------------------------------------------------ */

#define FLOOD_ATTACKERS 4
#define FLOOD_MAX_RANKS 64
#define FLOODED 2 /* rounds: 0 warm-up, 1 clean, 2 under the flood */

typedef struct flood_arg {
    hct_id_slot_t slot[3]; /* warm-up, clean round, flooded round */
    hct_barrier_t bar, fbar; /* the ranks; the ranks and attackers (flooded round) */
    int nranks, strays;
    volatile int connected, done;
    volatile int init_done;  /* rank 0's flooded init returned: the port closes */
    int connected_at_init;   /* strays connected by then */
    double init_ms[3][FLOOD_MAX_RANKS];
} flood_arg_t;

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

/* Strays i = a, a + A, a + 2A...: idle, garbage, or HELLO followed by an
 * AUTH with a random MAC (sent at once: the root reads it after its
 * challenge). All stay open until the job is done. */
static int flood_attacker(flood_arg_t *a, int which)
{
    hcoll_unique_id_t id;
    hc_uid_t u;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    HCT_REQUIRE(hct_barrier_wait(&a->fbar, a->nranks + FLOOD_ATTACKERS, 60000) == 0, "barrier");
    HCT_REQUIRE(hct_share_unique_id(&a->slot[FLOODED], 1, 60000, &id) == 0, "no id");
    HCT_REQUIRE(hc_uid_decode(&id, NULL, 1, &u) == HCOLL_SUCCESS, "decode");
    int n = (a->strays - which + FLOOD_ATTACKERS - 1) / FLOOD_ATTACKERS;
    int *fds = calloc((size_t)n + 1, sizeof *fds);
    HCT_REQUIRE(fds, "calloc");
    unsigned char m[16 + 16 + HC_BWIRE_AUTH_BYTES];
    hc_bwire_pack(m, HC_BMSG_HELLO, 0, 0);
    hc_bwire_pack(m + 16, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES, 0);
    for (int k = 0; k < n; k++) {
        const int i = which + k * FLOOD_ATTACKERS;
        double end = hct_now_ms() + 30000;
        while ((fds[k] = dial_nb(&u.root)) < 0 && !a->init_done && hct_now_ms() < end)
            usleep(2000);
        if (fds[k] < 0 && a->init_done) { /* the rendezvous is over */
            n = k;
            break;
        }
        HCT_REQUIRE(fds[k] >= 0, "stray %d: %s", i, strerror(errno));
        if (i % 3 == 1) {
            unsigned char junk[64];
            hc_random_bytes(junk, sizeof junk);
            (void)!send(fds[k], junk, sizeof junk, MSG_NOSIGNAL);
        } else if (i % 3 == 2) {
            hc_bwire_put32(m + 32, 1 + (uint32_t)(i % (a->nranks - 1)));
            hc_bwire_put32(m + 36, (uint32_t)a->nranks);
            hc_bwire_put32(m + 40, HC_COMM_REC_BYTES);
            hc_random_bytes(m + 44, HC_BWIRE_NONCE_BYTES + HC_BWIRE_MAC_BYTES);
            (void)!send(fds[k], m, sizeof m, MSG_NOSIGNAL);
        }
        add_flag(&a->connected);
    }
    HCT_REQUIRE(wait_flag(&a->done, a->nranks, 120000) == 0, "ranks did not finish");
    for (int k = 0; k < n; k++)
        close(fds[k]);
    free(fds);
    return 0;
}

static int flood_init(flood_arg_t *a, int round, int rank)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    const int flooded = round == FLOODED;
    HCT_REQUIRE(flooded ? hct_barrier_wait(&a->fbar, a->nranks + FLOOD_ATTACKERS, 60000) == 0
                        : hct_barrier_wait(&a->bar, a->nranks, 60000) == 0,
                "barrier");
    double t0 = hct_now_ms();
    HCT_REQUIRE(hct_share_unique_id(&a->slot[round], rank, 60000, &id) == 0, "no id");
    if (flooded && rank != 0) /* join once the flood is under way */
        HCT_REQUIRE(wait_flag(&a->connected, a->strays / 10, 60000) == 0, "no flood");
    HCT_OK(NULL, hcoll_comm_init(&comm, a->nranks, rank, &id, &cfg));
    a->init_ms[round][rank] = hct_now_ms() - t0;
    if (flooded && rank == 0) {
        a->connected_at_init = __atomic_load_n(&a->connected, __ATOMIC_ACQUIRE);
        __atomic_store_n(&a->init_done, 1, __ATOMIC_RELEASE);
    }
    int v = rank * 3 + round, all[FLOOD_MAX_RANKS];
    HCT_OK(comm, hc_boot_allgather(comm->boot, &v, all, sizeof v));
    for (int r = 0; r < a->nranks; r++)
        HCT_REQUIRE(all[r] == r * 3 + round, "allgather: rank %d", r);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static int rank_flood(int rank, int nranks, void *argp)
{
    flood_arg_t *a = argp;
    (void)nranks;
    if (rank >= a->nranks)
        return flood_attacker(a, rank - a->nranks);
    for (int round = 0; round <= FLOODED; round++)
        if (flood_init(a, round, rank) != 0)
            return 1;
    add_flag(&a->done);
    return 0;
}

START_TEST(flood)
{
    flood_arg_t *a = hct_shared_alloc(sizeof *a);
    a->nranks = env_int("HCT_FLOOD_RANKS", 8);
    a->strays = env_int("HCT_FLOOD_STRAYS", 200);
    ck_assert(a->nranks >= 2 && a->nranks <= FLOOD_MAX_RANKS);
    hct_opts_t o = { .nranks = a->nranks + FLOOD_ATTACKERS, .ranks_per_node = 0,
                     .timeout_ms = 170000 };
    hct_result_t res[FLOOD_MAX_RANKS + FLOOD_ATTACKERS];
    int bad = hct_run(&o, rank_flood, a, res);
    ck_assert_msg(bad == 0, "%d process(es) failed", bad);
    ck_assert_int_ge(a->connected_at_init, a->strays / 10);
    double worst[3] = { 0, 0, 0 };
    for (int round = 0; round <= FLOODED; round++)
        for (int r = 0; r < a->nranks; r++)
            if (a->init_ms[round][r] > worst[round])
                worst[round] = a->init_ms[round][r];
    printf("flood: %d ranks, %d strays (%d connected before rank 0's init returned): clean "
           "init %.0f ms, flooded init %.0f ms, added %.0f ms\n",
           a->nranks, a->strays, a->connected_at_init, worst[1], worst[FLOODED],
           worst[FLOODED] - worst[1]);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* The root out of file descriptors                                          */
/* ------------------------------------------------------------------------ */

typedef struct emfile_arg {
    volatile int port, pid0, ready;
    double wall_ms, cpu_ms;
} emfile_arg_t;

#define EMFILE_HOLD_MS 1500

static const unsigned char emfile_key[HC_BOOT_KEY_BYTES] = { 42 };

static void emfile_args(hc_boot_args_t *ba, int rank, int port)
{
    memset(ba, 0, sizeof *ba);
    ba->rank = rank;
    ba->nranks = 2;
    ba->root.sin.sin_family = AF_INET;
    ba->root.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ba->root.sin.sin_port = htons((uint16_t)port);
    ba->listen_fd = -1;
    memcpy(ba->key, emfile_key, sizeof ba->key);
    ba->authenticated = 1;
    ba->timeout_ms = 8000;
    ba->init_timeout_ms = 10000;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static int rank_emfile(int rank, int nranks, void *argp)
{
    emfile_arg_t *a = argp;
    hc_boot_args_t ba;
    hc_boot_t *b;
    uint64_t rec = 100 + (uint64_t)rank, all[2];
    (void)nranks;
    if (rank == 2) { /* give rank 0 its fds back after a while */
        HCT_REQUIRE(wait_flag(&a->ready, 1, 20000) == 0, "root never ready");
        usleep(EMFILE_HOLD_MS * 1000);
        struct rlimit rl = { 256, 256 };
        struct rlimit old;
        HCT_REQUIRE(prlimit(a->pid0, RLIMIT_NOFILE, NULL, &old) == 0, "prlimit: %s",
                    strerror(errno));
        rl.rlim_max = old.rlim_max;
        rl.rlim_cur = old.rlim_max < 256 ? old.rlim_max : 256;
        HCT_REQUIRE(prlimit(a->pid0, RLIMIT_NOFILE, &rl, NULL) == 0, "prlimit: %s",
                    strerror(errno));
        return 0;
    }
    if (rank == 1) {
        HCT_REQUIRE(wait_flag(&a->ready, 1, 20000) == 0, "root never ready");
        emfile_args(&ba, 1, a->port);
        HCT_OK(NULL, hc_boot_create(&ba, &rec, sizeof rec, all, &b));
        HCT_REQUIRE(all[0] == 100 && all[1] == 101, "table");
        hc_boot_destroy(b);
        return 0;
    }
    hc_sockaddr_t any;
    int lfd;
    emfile_args(&ba, 0, 0);
    any = ba.root;
    HCT_OK(NULL, hc_boot_socket(&any, HC_BOOT_SOCK_LISTEN, NULL, 0, "test", &lfd, &any));
    ba.listen_fd = lfd;
    a->port = ntohs(any.sin.sin_port);
    a->pid0 = (int)getpid();
    /* Every fd below the lowest free one is in use: with the limit one
     * above it, the boot's eventfd takes it and accept gets EMFILE. */
    int lowest = dup(0);
    HCT_REQUIRE(lowest >= 0, "dup");
    close(lowest);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)lowest + 1;
    HCT_REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
    __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE);
    double t0 = hct_now_ms(), c0 = cpu_ms();
    HCT_OK(NULL, hc_boot_create(&ba, &rec, sizeof rec, all, &b));
    a->wall_ms = hct_now_ms() - t0;
    a->cpu_ms = cpu_ms() - c0;
    HCT_REQUIRE(all[0] == 100 && all[1] == 101, "table");
    hc_boot_destroy(b);
    return 0;
}

START_TEST(emfile)
{
    emfile_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 0, .timeout_ms = 30000 };
    hct_result_t res[3];
    ck_assert_int_eq(hct_run(&o, rank_emfile, a, res), 0);
    printf("emfile: the root waited %.0f ms without fds and used %.0f ms of CPU\n", a->wall_ms,
           a->cpu_ms);
    ck_assert_msg(a->wall_ms >= EMFILE_HOLD_MS * 0.8, "joined after %.0f ms: no EMFILE?",
                  a->wall_ms);
    /* Spinning on the readable listener would use about all of it. */
    ck_assert_msg(a->cpu_ms < a->wall_ms * 0.25, "%.0f ms of CPU in %.0f ms", a->cpu_ms,
                  a->wall_ms);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A hand-written root against a real client                                 */
/* ------------------------------------------------------------------------ */

enum fake_mode {
    F_OK_FLIP0,     /* AUTH_OK, MAC bit 0 flipped */
    F_OK_FLIP255,   /* AUTH_OK, MAC bit 255 flipped */
    F_ERROR,        /* ERROR(TIMEOUT, "...") without any proof */
    F_REFUSE_BAD,   /* REFUSE whose MAC is one bit off */
    F_REFUSE_GOOD,  /* REFUSE(INVALID_ARG) with the right MAC */
};

typedef struct fake_root {
    int lfd, mode, served;
    hc_sockaddr_t addr;
} fake_root_t;

static const unsigned char fake_key[HC_BOOT_KEY_BYTES] = { 7, 7, 7 };

static int recv_all(int fd, void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        struct pollfd pf = { fd, POLLIN, 0 };
        if (poll(&pf, 1, 5000) <= 0)
            return -1;
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0)
            return -1;
        p += n, len -= (size_t)n;
    }
    return 0;
}

static void fake_serve_one(fake_root_t *f, int fd)
{
    unsigned char h[16], c[16 + HC_BWIRE_CHALLENGE_BYTES], a[16 + HC_BWIRE_AUTH_BYTES];
    unsigned char m[16 + HC_BWIRE_MAC_BYTES + 64];
    if (recv_all(fd, h, sizeof h) != 0)
        return;
    hc_bwire_pack(c, HC_BMSG_CHALLENGE, HC_BWIRE_CHALLENGE_BYTES, 0);
    hc_random_bytes(c + 16, HC_BWIRE_NONCE_BYTES + HC_BWIRE_SALT_BYTES);
    hc_bwire_put32(c + 16 + HC_BWIRE_NONCE_BYTES + HC_BWIRE_SALT_BYTES, 0);
    if (send(fd, c, sizeof c, MSG_NOSIGNAL) != (ssize_t)sizeof c || recv_all(fd, a, sizeof a) != 0)
        return;
    const unsigned char *nonce_s = c + 16, *body = a + 16, *nonce_c = body + 12;
    const char *text = "custom words of a stranger";
    size_t len = 16;
    switch (f->mode) {
    case F_OK_FLIP0:
    case F_OK_FLIP255:
        hc_bwire_pack(m, HC_BMSG_AUTH_OK, HC_BWIRE_MAC_BYTES, 0);
        hc_bwire_mac(fake_key, 'S', nonce_s, nonce_c, hc_bwire_get32(body),
                     hc_bwire_get32(body + 4), hc_bwire_get32(body + 8), m + 16);
        if (f->mode == F_OK_FLIP0)
            m[16] ^= 1;
        else
            m[16 + 31] ^= 0x80;
        len += HC_BWIRE_MAC_BYTES;
        break;
    case F_ERROR:
        hc_bwire_pack(m, HC_BMSG_ERROR, (uint32_t)strlen(text), HCOLL_ERR_TIMEOUT);
        memcpy(m + 16, text, strlen(text));
        len += strlen(text);
        break;
    default:
        text = f->mode == F_REFUSE_GOOD ? "go away, checked" : "go away, unchecked";
        hc_bwire_pack(m, HC_BMSG_REFUSE, (uint32_t)(HC_BWIRE_MAC_BYTES + strlen(text)),
                      HCOLL_ERR_INVALID_ARG);
        hc_bwire_refuse_mac(fake_key, nonce_s, nonce_c, HCOLL_ERR_INVALID_ARG, text,
                            strlen(text), m + 16);
        if (f->mode == F_REFUSE_BAD)
            m[16 + 31] ^= 0x80;
        memcpy(m + 16 + HC_BWIRE_MAC_BYTES, text, strlen(text));
        len += HC_BWIRE_MAC_BYTES + strlen(text);
        break;
    }
    (void)!send(fd, m, len, MSG_NOSIGNAL);
    __atomic_add_fetch(&f->served, 1, __ATOMIC_ACQ_REL);
}

static void *fake_root_thread(void *arg)
{
    fake_root_t *f = arg;
    for (;;) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        fake_serve_one(f, fd);
        close(fd);
    }
}

static hcoll_status_t fake_run(int mode, int *served_out, double *ms_out)
{
    fake_root_t f = { .mode = mode };
    f.addr.sin.sin_family = AF_INET;
    f.addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(hc_boot_socket(&f.addr, HC_BOOT_SOCK_LISTEN, NULL, 0, "fake", &f.lfd,
                                    &f.addr), HCOLL_SUCCESS);
    /* The thread blocks in accept until the listener is shut. */
    fcntl(f.lfd, F_SETFL, fcntl(f.lfd, F_GETFL) & ~O_NONBLOCK);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, fake_root_thread, &f), 0);
    hc_boot_args_t ba;
    memset(&ba, 0, sizeof ba);
    ba.rank = 1;
    ba.nranks = 2;
    ba.root = f.addr;
    ba.listen_fd = -1;
    memcpy(ba.key, fake_key, sizeof ba.key);
    ba.authenticated = 1;
    ba.timeout_ms = 3000;
    ba.init_timeout_ms = 5000;
    uint64_t rec = 1, all[2];
    hc_boot_t *b = NULL;
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_boot_create(&ba, &rec, sizeof rec, all, &b);
    *ms_out = hct_now_ms() - t0;
    shutdown(f.lfd, SHUT_RDWR);
    pthread_join(t, NULL);
    close(f.lfd);
    ck_assert_ptr_null(b);
    *served_out = f.served;
    return st;
}

START_TEST(fake_root_auth_ok_near_miss)
{
    /* One bit off at either end of the MAC: init fails at once. */
    for (int mode = F_OK_FLIP0; mode <= F_OK_FLIP255; mode++) {
        int served;
        double ms;
        hcoll_status_t st = fake_run(mode, &served, &ms);
        const char *msg = hc_errbuf_get(hc_errbuf_thread());
        ck_assert_msg(st == HCOLL_ERR_MISMATCH, "mode %d: %s (%s)", mode, hcoll_status_name(st),
                      msg);
        ck_assert_msg(strstr(msg, "did not prove that it holds the job's secret"), "%s", msg);
        ck_assert_int_eq(served, 1);
    }
}
END_TEST

START_TEST(fake_root_unverified_refusals)
{
    /* A stranger's ERROR and a REFUSE with a wrong MAC are not honoured:
     * the client retries on new connections, then fails with MISMATCH of
     * its own, quoting the words as unverified. */
    for (int mode = F_ERROR; mode <= F_REFUSE_BAD; mode++) {
        int served;
        double ms;
        hcoll_status_t st = fake_run(mode, &served, &ms);
        const char *msg = hc_errbuf_get(hc_errbuf_thread());
        ck_assert_msg(st == HCOLL_ERR_MISMATCH, "mode %d: %s (%s)", mode, hcoll_status_name(st),
                      msg);
        ck_assert_msg(strstr(msg, "unverified") && strstr(msg, mode == F_ERROR
                                                                   ? "custom words of a stranger"
                                                                   : "go away, unchecked"),
                      "%s", msg);
        ck_assert_int_eq(served, HC_BOOT_UNVERIFIED_MAX);
        ck_assert_msg(ms < 2000, "%.0f ms", ms);
    }
}
END_TEST

START_TEST(fake_root_verified_refusal)
{
    int served;
    double ms;
    hcoll_status_t st = fake_run(F_REFUSE_GOOD, &served, &ms);
    const char *msg = hc_errbuf_get(hc_errbuf_thread());
    ck_assert_msg(st == HCOLL_ERR_INVALID_ARG, "%s (%s)", hcoll_status_name(st), msg);
    ck_assert_msg(strstr(msg, "refused this rank: go away, checked"), "%s", msg);
    ck_assert_int_eq(served, 1);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_DEBUG_FILE");
    signal(SIGPIPE, SIG_IGN);

    Suite *s = suite_create("boot_flood");
    TCase *imp = tcase_create("impostors");
    tcase_set_timeout(imp, 60);
    tcase_add_test(imp, fake_root_auth_ok_near_miss);
    tcase_add_test(imp, fake_root_unverified_refusals);
    tcase_add_test(imp, fake_root_verified_refusal);
    suite_add_tcase(s, imp);

    TCase *pres = tcase_create("pressure");
    tcase_set_timeout(pres, 180);
    tcase_add_test(pres, paused_root);
    tcase_add_test(pres, emfile);
    suite_add_tcase(s, pres);

    TCase *fl = tcase_create("flood");
    tcase_set_timeout(fl, 180);
    tcase_add_test(fl, flood);
    suite_add_tcase(s, fl);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
