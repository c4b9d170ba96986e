/*
 * The bootstrap under attack and under failure, across forked ranks:
 * stray connections at the root port during init (garbage, HTTP, a
 * truncated header, an oversized length, a wrong secret, a duplicate rank,
 * a flood of idle connections), missing and killed ranks, mismatched and
 * timed-out set-up collectives. Every case must end well within its
 * deadline; none may hang.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/hmac.h"
#include "boot/uid.h"
#include "common/ranks.h"
#include "core/comm.h"

static hcoll_config_t cfg_timeout(int ms)
{
    hcoll_config_t c = HCOLL_CONFIG_INITIALIZER;
    c.timeout_ms = ms;
    return c;
}

static int wait_flag(volatile int *f, int ms)
{
    double end = hct_now_ms() + ms;
    while (!__atomic_load_n(f, __ATOMIC_ACQUIRE)) {
        if (hct_now_ms() > end)
            return -1;
        usleep(1000);
    }
    return 0;
}

static void set_flag(volatile int *f)
{
    __atomic_store_n(f, 1, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------------ */
/* A hostile client, speaking the wire format of boot.h by hand             */
/* ------------------------------------------------------------------------ */

static int dial(const hc_sockaddr_t *root)
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

/* Read until the peer closes; 1 when it did within ms. What it sent is
 * kept in buf (up to len; *got_out bytes). */
static int until_closed(int fd, int ms, unsigned char *buf, size_t len, size_t *got_out)
{
    size_t got = 0;
    double end = hct_now_ms() + ms;
    unsigned char junk[512];
    for (;;) {
        int left = (int)(end - hct_now_ms());
        if (left <= 0)
            break;
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, left) <= 0)
            continue;
        unsigned char *dst = buf && got < len ? buf + got : junk;
        size_t room = buf && got < len ? len - got : sizeof junk;
        ssize_t n = recv(fd, dst, room, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            if (got_out)
                *got_out = got;
            return 1;
        }
        if (n > 0 && dst != junk)
            got += (size_t)n;
    }
    if (got_out)
        *got_out = got;
    return 0;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static void hdr(unsigned char *p, unsigned type, uint32_t len)
{
    put32(p, 0x48434254u);
    p[4] = 0, p[5] = 2;
    p[6] = 0, p[7] = (unsigned char)type;
    put32(p + 8, len);
    put32(p + 12, 0);
}

/* Say HELLO, read the challenge, answer as `rank` with `key` (a unique
 * id's key: the challenge must not ask for stretching), the MAC's bit
 * flip_bit flipped (-1: none); return the type of what the root sent back
 * before closing (expected: ERROR 6 or REFUSE 11) with its text in text
 * (NUL-ended), or -1 when the root did not close. */
static int fake_auth(const hc_sockaddr_t *root, const unsigned char *key, uint32_t rank,
                     uint32_t nranks, int flip_bit, char *text, size_t textlen)
{
    int fd = dial(root);
    if (fd < 0)
        return -1;
    unsigned char hello[16];
    hdr(hello, 10, 0);
    if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) {
        close(fd);
        return -1;
    }
    unsigned char ch[16 + 52];
    size_t got = 0;
    while (got < sizeof ch) {
        ssize_t n = recv(fd, ch + got, sizeof ch - got, 0);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    unsigned char m[16 + 76], nums[13];
    hdr(m, 2, 76);
    put32(m + 16, rank);
    put32(m + 20, nranks);
    put32(m + 24, HC_COMM_REC_BYTES);
    hc_random_bytes(m + 28, 32);
    nums[0] = 'C';
    put32(nums + 1, rank), put32(nums + 5, nranks), put32(nums + 9, HC_COMM_REC_BYTES);
    hc_hmac_t h;
    hc_hmac_init(&h, key, 32);
    hc_hmac_update(&h, "hcoll-boot-v1", 13);
    hc_hmac_update(&h, ch + 16, 32);
    hc_hmac_update(&h, m + 28, 32);
    hc_hmac_update(&h, nums, sizeof nums);
    hc_hmac_final(&h, m + 60);
    if (flip_bit >= 0)
        m[60 + flip_bit / 8] ^= (unsigned char)(1u << (flip_bit % 8));
    if (send(fd, m, sizeof m, MSG_NOSIGNAL) != (ssize_t)sizeof m) {
        close(fd);
        return -1;
    }
    unsigned char back[400];
    size_t n = 0;
    int closed = until_closed(fd, 5000, back, sizeof back - 1, &n);
    close(fd);
    if (!closed || n < 16 || (back[7] != 6 && back[7] != 11))
        return -1;
    back[n] = '\0';
    snprintf(text, textlen, "%s", (char *)back + 16 + (back[7] == 11 ? 32 : 0));
    return back[7];
}

typedef struct stray_arg {
    hct_id_slot_t slot;
    volatile int rank1_started, strays_done, done;
    char logpath[64];
    char failure[512]; /* the attacker's first unmet expectation */
} stray_arg_t;

#define ATTACK_REQUIRE(cond, ...)                                              \
    do {                                                                       \
        if (!(cond)) {                                                         \
            snprintf(a->failure, sizeof a->failure, __VA_ARGS__);              \
            fprintf(stderr, "attacker: %s\n", a->failure);                     \
            set_flag(&a->strays_done);                                         \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static int attacker(stray_arg_t *a)
{
    hcoll_unique_id_t id;
    hc_uid_t u;
    char text[300];
    ATTACK_REQUIRE(hct_share_unique_id(&a->slot, 1, 20000, &id) == 0, "no id");
    ATTACK_REQUIRE(hc_uid_decode(&id, NULL, 1, &u) == HCOLL_SUCCESS, "decode: %s",
                   hc_errbuf_get(hc_errbuf_thread()));
    /* Strike while ranks 0 and 1 are in init, after rank 1 registered. */
    ATTACK_REQUIRE(wait_flag(&a->rank1_started, 20000) == 0, "rank 1 never started");
    usleep(300 * 1000);

    /* Truncated header, held open: the root must drop it at its time cap
     * for unauthenticated connections (a quarter of the 8 s timeout). */
    int trunc = dial(&u.root);
    ATTACK_REQUIRE(trunc >= 0, "dial");
    unsigned char h[16];
    hdr(h, 2, 76);
    ATTACK_REQUIRE(send(trunc, h, 5, 0) == 5, "send");
    double t0 = hct_now_ms();
    ATTACK_REQUIRE(until_closed(trunc, 5000, NULL, 0, NULL), "truncated header never dropped");
    ATTACK_REQUIRE(hct_now_ms() - t0 > 1500, "truncated header dropped too early");
    close(trunc);

    /* Port scan: connect and leave. */
    int fd = dial(&u.root);
    ATTACK_REQUIRE(fd >= 0, "dial");
    close(fd);

    /* Garbage bytes. */
    unsigned char junk[64];
    memset(junk, 0xa5, sizeof junk);
    fd = dial(&u.root);
    ATTACK_REQUIRE(fd >= 0 && send(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk, "garbage");
    ATTACK_REQUIRE(until_closed(fd, 3000, NULL, 0, NULL), "garbage connection not refused");
    close(fd);

    /* An HTTP request. */
    const char *get = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
    fd = dial(&u.root);
    ATTACK_REQUIRE(fd >= 0 && send(fd, get, strlen(get), 0) == (ssize_t)strlen(get), "http");
    ATTACK_REQUIRE(until_closed(fd, 3000, NULL, 0, NULL), "HTTP GET not refused");
    close(fd);

    /* A valid header announcing 4 GiB. */
    hdr(h, 2, 0xfffffff0u);
    fd = dial(&u.root);
    ATTACK_REQUIRE(fd >= 0 && send(fd, h, 16, 0) == 16, "oversized");
    ATTACK_REQUIRE(until_closed(fd, 3000, NULL, 0, NULL), "oversized length not refused");
    close(fd);

    /* The right magic but a message type out of order. */
    hdr(h, 4, HC_COMM_REC_BYTES);
    fd = dial(&u.root);
    ATTACK_REQUIRE(fd >= 0 && send(fd, h, 16, 0) == 16, "out of order");
    ATTACK_REQUIRE(until_closed(fd, 3000, NULL, 0, NULL), "record before auth not refused");
    close(fd);

    /* A wrong secret. */
    unsigned char wrong[32];
    hc_random_bytes(wrong, sizeof wrong);
    ATTACK_REQUIRE(fake_auth(&u.root, wrong, 2, 3, -1, text, sizeof text) == 6,
                   "wrong secret not refused with an error");
    ATTACK_REQUIRE(strstr(text, "authentication failed"), "wrong secret: '%s'", text);
    /* The right secret, but a MAC one bit off: the first bit and the last
     * (a comparison that stops short of the last byte accepts it). */
    ATTACK_REQUIRE(fake_auth(&u.root, u.secret, 2, 3, 0, text, sizeof text) == 6 &&
                       strstr(text, "authentication failed"),
                   "AUTH MAC with bit 0 flipped: not refused ('%s')", text);
    ATTACK_REQUIRE(fake_auth(&u.root, u.secret, 2, 3, 255, text, sizeof text) == 6 &&
                       strstr(text, "authentication failed"),
                   "AUTH MAC with bit 255 flipped: not refused ('%s')", text);

    /* The right secret, but rank 1 is taken, and rank 9 does not exist:
     * refusals with the root's MAC (REFUSE), which the client honours. */
    ATTACK_REQUIRE(fake_auth(&u.root, u.secret, 1, 3, -1, text, sizeof text) == 11,
                   "duplicate rank not refused");
    ATTACK_REQUIRE(strstr(text, "duplicate rank 1"), "duplicate: '%s'", text);
    ATTACK_REQUIRE(fake_auth(&u.root, u.secret, 9, 3, -1, text, sizeof text) == 11,
                   "rank 9 of 3 not refused");
    ATTACK_REQUIRE(fake_auth(&u.root, u.secret, 2, 4, -1, text, sizeof text) == 11,
                   "nranks mismatch not refused");

    /* A flood of idle connections beyond the cap, held while rank 2 joins. */
    int flood[HC_BOOT_PENDING_MAX + 8];
    for (int i = 0; i < HC_BOOT_PENDING_MAX + 8; i++) {
        flood[i] = dial(&u.root);
        ATTACK_REQUIRE(flood[i] >= 0, "flood dial %d", i);
    }
    usleep(100 * 1000);
    set_flag(&a->strays_done);

    ATTACK_REQUIRE(wait_flag(&a->done, 20000) == 0, "real ranks did not finish");
    for (int i = 0; i < HC_BOOT_PENDING_MAX + 8; i++)
        close(flood[i]);
    return 0;
}

static int rank_stray(int rank, int nranks, void *argp)
{
    stray_arg_t *a = argp;
    (void)nranks;
    if (rank == 3)
        return attacker(a);
    if (rank == 0) {
        setenv("HCOLL_DEBUG_FILE", a->logpath, 1);
    }
    if (rank == 2)
        HCT_REQUIRE(wait_flag(&a->strays_done, 30000) == 0, "attacker never finished");
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(8000);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no id");
    if (rank == 1)
        set_flag(&a->rank1_started);
    HCT_OK(NULL, hcoll_comm_init(&comm, 3, rank, &id, &cfg));
    int v = rank * 3, all[3];
    HCT_OK(comm, hc_boot_allgather(comm->boot, &v, all, sizeof v));
    HCT_REQUIRE(all[0] == 0 && all[1] == 3 && all[2] == 6, "allgather after the attack");
    HCT_OK(comm, hc_boot_barrier(comm->boot));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    if (rank == 0) {
        set_flag(&a->done);
        FILE *f = fopen(a->logpath, "r");
        HCT_REQUIRE(f, "no log");
        char line[1200];
        int drops = 0, http = 0, auth = 0, dup = 0, cap = 0, trunc = 0;
        while (fgets(line, sizeof line, f)) {
            if (!strstr(line, "BOOT WARN bootstrap: dropped connection from 127.0.0.1"))
                continue;
            drops++;
            http += strstr(line, "an HTTP request") != NULL;
            auth += strstr(line, "authentication failed") != NULL;
            dup += strstr(line, "duplicate rank 1") != NULL;
            cap += strstr(line, "sent nothing valid; dropping") != NULL || strstr(line, "sent nothing valid (at most") != NULL;
            trunc += strstr(line, "did not complete the handshake") != NULL;
        }
        fclose(f);
        HCT_REQUIRE(http == 1 && auth == 3 && dup == 1 && cap >= 8 && trunc == 1 && drops >= 16,
                    "root log: %d drops, http %d auth %d dup %d cap %d trunc %d", drops, http,
                    auth, dup, cap, trunc);
    }
    return 0;
}

START_TEST(stray_connections)
{
    stray_arg_t *a = hct_shared_alloc(sizeof *a);
    snprintf(a->logpath, sizeof a->logpath, "/tmp/hct-stray-%d.log", (int)getpid());
    unlink(a->logpath);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_stray, a, res);
    unlink(a->logpath);
    ck_assert_msg(bad == 0, "%d process(es) failed; attacker: %s", bad,
                  a->failure[0] ? a->failure : "ok");
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Missing and killed ranks                                                  */
/* ------------------------------------------------------------------------ */

#define SHORT_MS 2000

typedef struct fail_arg {
    hct_id_slot_t slot;
    int absent;  /* this rank never calls init */
    int victim;  /* killed by the harness during init (-1: none) */
    volatile int finished;
    hcoll_status_t want;
    int max_ms;  /* every present rank must fail within this */
    char expect_text[32];
} fail_arg_t;

static int rank_fail(int rank, int nranks, void *argp)
{
    fail_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    if (rank == a->absent) {
        if (rank == 0) /* make the id (parking the listener) but never serve it */
            HCT_REQUIRE(hct_share_unique_id(&a->slot, 0, SHORT_MS, &id) == 0, "no id");
        /* Stay until every other rank has its verdict: exiting would close
         * a parked listener under ranks still waiting in its backlog. */
        const int others = nranks - 1 - (a->victim >= 0);
        double end = hct_now_ms() + 15000;
        while (__atomic_load_n(&a->finished, __ATOMIC_ACQUIRE) < others && hct_now_ms() < end)
            usleep(1000);
        return 0;
    }
    hcoll_config_t cfg = cfg_timeout(a->victim >= 0 ? 10000 : SHORT_MS);
    /* The arrival of every rank has its own deadline since liveness. */
    setenv("HCOLL_INIT_TIMEOUT_MS", a->victim >= 0 ? "10000" : "2000", 1);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 10000, &id) == 0, "no id");
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    double dt = hct_now_ms() - t0;
    if (rank == a->victim) /* killed before it gets here, normally */
        return st == HCOLL_SUCCESS ? 0 : 1;
    const char *msg = hcoll_comm_last_error(NULL);
    HCT_REQUIRE(st == a->want, "init -> %s, want %s (%s)", hcoll_status_name(st),
                hcoll_status_name(a->want), msg);
    HCT_REQUIRE(dt <= a->max_ms, "failed after %.0f ms (limit %d)", dt, a->max_ms);
    HCT_REQUIRE(strstr(msg, a->expect_text), "message '%s' lacks '%s'", msg, a->expect_text);
    HCT_REQUIRE(comm == NULL, "comm_out written on failure");
    __atomic_add_fetch(&a->finished, 1, __ATOMIC_ACQ_REL);
    return 0;
}

static void kill_victim(const pid_t *pids, int nranks, void *argp)
{
    fail_arg_t *a = argp;
    if (a->victim < 0 || a->victim >= nranks)
        return;
    usleep(800 * 1000); /* everyone but the absent rank is in init by now */
    kill(pids[a->victim], SIGKILL);
}

static void run_fail(int nranks, int absent, int victim, hcoll_status_t want, int max_ms,
                     const char *text)
{
    fail_arg_t *a = hct_shared_alloc(sizeof *a);
    a->absent = absent;
    a->victim = victim;
    a->want = want;
    a->max_ms = max_ms;
    snprintf(a->expect_text, sizeof a->expect_text, "%s", text);
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 2, .timeout_ms = 30000,
                     .on_started = kill_victim };
    hct_result_t res[8];
    hct_run(&o, rank_fail, a, res);
    for (int r = 0; r < nranks; r++) {
        if (r == victim)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL, "victim %d not killed", r);
        else
            ck_assert_msg(res[r].exited && res[r].code == 0 && !res[r].killed,
                          "rank %d failed (absent %d, victim %d)", r, absent, victim);
    }
    hct_shared_free(a, sizeof *a);
}

START_TEST(missing_rank_times_out)
{
    /* Everyone else fails with TIMEOUT within the deadline plus one second,
     * naming the missing rank. */
    run_fail(4, 3, -1, HCOLL_ERR_TIMEOUT, SHORT_MS + 1000, "rank(s) 3 of 4 never joined");
    run_fail(5, 2, -1, HCOLL_ERR_TIMEOUT, SHORT_MS + 1000, "rank(s) 2 of 5 never joined");
}
END_TEST

START_TEST(missing_root_times_out)
{
    run_fail(3, 0, -1, HCOLL_ERR_TIMEOUT, SHORT_MS + 1000, "rank 0");
}
END_TEST

START_TEST(killed_rank_fails_init)
{
    /* Rank 2 is late (absent), rank 3 dies while waiting: the others fail
     * fast with PEER_FAILED instead of sitting out the 10 s timeout. */
    run_fail(4, 2, 3, HCOLL_ERR_PEER_FAILED, 4000, "rank 3 closed");
    /* The root dies: its connections close under every waiting rank. */
    run_fail(4, 2, 0, HCOLL_ERR_PEER_FAILED, 4000, "rank 0");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Set-up collectives: sizes, mismatches, timeouts                           */
/* ------------------------------------------------------------------------ */

enum { C_BIG, C_OP_MISMATCH, C_LEN_MISMATCH, C_TIMEOUT };

typedef struct coll_arg {
    hct_id_slot_t slot;
    int mode;
    volatile int flag;
} coll_arg_t;

static int rank_coll(int rank, int nranks, void *argp)
{
    coll_arg_t *a = argp;
    hcoll_unique_id_t id;
    hcoll_comm_t comm;
    hcoll_config_t cfg = cfg_timeout(a->mode == C_TIMEOUT ? 1500 : 20000);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    hcoll_status_t st;
    switch (a->mode) {
    case C_BIG: {
        /* Far beyond socket buffers, so the root's gather must interleave
         * partial reads from every rank. */
        const size_t len = (size_t)3 << 20;
        unsigned char *mine = malloc(len), *all = malloc(len * (size_t)nranks);
        HCT_REQUIRE(mine && all, "malloc");
        for (size_t i = 0; i < len; i++)
            mine[i] = (unsigned char)(i * 31 + (size_t)rank * 7);
        HCT_OK(comm, hc_boot_allgather(comm->boot, mine, all, len));
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < len; i += 4093)
                HCT_REQUIRE(all[(size_t)r * len + i] == (unsigned char)(i * 31 + (size_t)r * 7),
                            "rank %d byte %zu", r, i);
        if (rank == 1)
            memcpy(mine, "broadcast!", 11);
        HCT_OK(comm, hc_boot_bcast(comm->boot, mine, len, 1));
        HCT_REQUIRE(memcmp(mine, "broadcast!", 11) == 0, "bcast");
        free(mine);
        free(all);
        HCT_OK(comm, hc_boot_barrier(comm->boot));
        break;
    }
    case C_OP_MISMATCH: {
        uint64_t x = 1, all[4];
        st = rank == 1 ? hc_boot_allgather(comm->boot, &x, all, sizeof x)
                       : hc_boot_barrier(comm->boot);
        HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "-> %s", hcoll_status_name(st));
        HCT_REQUIRE(strstr(hcoll_comm_last_error(comm), "different order"), "text: %s",
                    hcoll_comm_last_error(comm));
        break;
    }
    case C_LEN_MISMATCH: {
        uint64_t x[2] = { 1, 2 }, all[8];
        st = hc_boot_allgather(comm->boot, x, all, rank == 2 ? 16 : 8);
        HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "-> %s", hcoll_status_name(st));
        break;
    }
    case C_TIMEOUT: {
        if (rank == 2) {
            wait_flag(&a->flag, 10000);
            st = hc_boot_barrier(comm->boot);
            HCT_REQUIRE(st == HCOLL_ERR_TIMEOUT || st == HCOLL_ERR_PEER_FAILED, "late -> %s",
                        hcoll_status_name(st));
            break;
        }
        double t0 = hct_now_ms();
        st = hc_boot_barrier(comm->boot);
        double dt = hct_now_ms() - t0;
        if (rank == 0)
            set_flag(&a->flag);
        HCT_REQUIRE(st == HCOLL_ERR_TIMEOUT, "-> %s", hcoll_status_name(st));
        HCT_REQUIRE(dt < 1500 + 1000, "took %.0f ms", dt);
        HCT_REQUIRE(strstr(hcoll_comm_last_error(comm), "rank(s) 2 did not take part"),
                    "text: %s", hcoll_comm_last_error(comm));
        hcoll_status_t ae;
        HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
        HCT_REQUIRE(ae == HCOLL_ERR_TIMEOUT, "async %s", hcoll_status_name(ae));
        break;
    }
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run_coll(int mode, int nranks)
{
    coll_arg_t *a = hct_shared_alloc(sizeof *a);
    a->mode = mode;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 2, .timeout_ms = 60000 };
    hct_result_t res[8];
    ck_assert_msg(hct_run(&o, rank_coll, a, res) == 0, "mode %d", mode);
    hct_shared_free(a, sizeof *a);
}

START_TEST(coll_big) { run_coll(C_BIG, 4); }
END_TEST
START_TEST(coll_op_mismatch) { run_coll(C_OP_MISMATCH, 3); }
END_TEST
START_TEST(coll_len_mismatch) { run_coll(C_LEN_MISMATCH, 3); }
END_TEST
START_TEST(coll_timeout) { run_coll(C_TIMEOUT, 3); }
END_TEST

/* A real rank with the wrong HCOLL_SECRET is refused at once with a
 * message; the others time out naming it. */
typedef struct secret_arg {
    int port;
} secret_arg_t;

static int rank_secret(int rank, int nranks, void *argp)
{
    secret_arg_t *a = argp;
    char root[64];
    snprintf(root, sizeof root, "127.0.0.1:%d", a->port);
    char s[16];
    snprintf(s, sizeof s, "%d", rank);
    setenv("HCOLL_RANK", s, 1);
    snprintf(s, sizeof s, "%d", nranks);
    setenv("HCOLL_NRANKS", s, 1);
    setenv("HCOLL_ROOT", root, 1);
    setenv("HCOLL_SECRET", rank == 1 ? "not-the-secret" : "the-secret", 1);
    hcoll_comm_t comm = NULL;
    hcoll_config_t cfg = cfg_timeout(SHORT_MS);
    setenv("HCOLL_INIT_TIMEOUT_MS", "2000", 1);
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_comm_init_env(&comm, &cfg);
    double dt = hct_now_ms() - t0;
    const char *msg = hcoll_comm_last_error(NULL);
    if (rank == 1) {
        HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "-> %s", hcoll_status_name(st));
        HCT_REQUIRE(strstr(msg, "authentication failed"), "text: %s", msg);
        HCT_REQUIRE(dt < SHORT_MS, "took %.0f ms", dt);
    } else {
        HCT_REQUIRE(st == HCOLL_ERR_TIMEOUT, "-> %s", hcoll_status_name(st));
        HCT_REQUIRE(strstr(msg, "rank(s) 1 of 3"), "text: %s", msg);
        HCT_REQUIRE(dt < SHORT_MS + 1000, "took %.0f ms", dt);
    }
    return 0;
}

START_TEST(wrong_secret_rank)
{
    secret_arg_t *a = hct_shared_alloc(sizeof *a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof sa;
    ck_assert(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&sa, &l) == 0);
    close(fd);
    a->port = ntohs(sa.sin_port);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[3];
    ck_assert_int_eq(hct_run(&o, rank_secret, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_DEBUG_FILE");

    Suite *s = suite_create("boot");
    TCase *stray = tcase_create("stray");
    tcase_set_timeout(stray, 120);
    tcase_add_test(stray, stray_connections);
    tcase_add_test(stray, wrong_secret_rank);
    suite_add_tcase(s, stray);

    TCase *fail = tcase_create("failures");
    tcase_set_timeout(fail, 120);
    tcase_add_test(fail, missing_rank_times_out);
    tcase_add_test(fail, missing_root_times_out);
    tcase_add_test(fail, killed_rank_fails_init);
    suite_add_tcase(s, fail);

    TCase *coll = tcase_create("collectives");
    tcase_set_timeout(coll, 120);
    tcase_add_test(coll, coll_big);
    tcase_add_test(coll, coll_op_mismatch);
    tcase_add_test(coll, coll_len_mismatch);
    tcase_add_test(coll, coll_timeout);
    suite_add_tcase(s, coll);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
