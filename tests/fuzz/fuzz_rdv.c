/* The rendezvous handshake, both sides (boot/root.c, client.c), through
 * real sockets into the real code. Byte 0 picks the side.
 *
 * Root: a root of 3 ranks serves two connections whose clients are a
 * script: raw bytes, a HELLO, an AUTH answering the challenge the root
 * sent (with the right MAC, one bit of it flipped, or the input's claims
 * of rank, nranks and record length), a RECORD header of the input's
 * length, EOF, and serving passes between them. Checked: a registered
 * rank is one whose connection proved the key and claimed that rank, and
 * its record is what its script sent behind a RECORD header.
 *
 * Client: a fake root in a thread answers the client's HELLO with a
 * CHALLENGE (well formed with the input's salt and cost, or raw input),
 * then its AUTH with AUTH_OK (its MAC right or one bit off), a REFUSE
 * (MAC right or wrong) or raw input, then the rest of the input (the
 * TABLE, ERROR, heartbeats...) and EOF. Checked: a handshake accepted
 * means the fake root was told to prove the key; a fatal end leaves a
 * message; an unverified refusal's text is printable; no wait ends in a
 * timeout, since the fake root always closes its end. */
#include "fuzz.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "boot/hmac.h"
#include "boot/io.h"
#include "boot/rendezvous.h"

#define NR 3
#define REC 8

static const unsigned char key[HC_BOOT_KEY_BYTES] = "fuzz_rdv's key, 32 bytes long..";

static const uint8_t *in_p;
static size_t in_n;

static unsigned take8(void)
{
    if (!in_n)
        return 0;
    in_n--;
    return *in_p++;
}

static uint32_t take32(void)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | take8();
    return v;
}

static void take(void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)dst)[i] = (uint8_t)take8();
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        c += w, n -= (size_t)w;
    }
}

/* Read exactly n bytes, or fewer at EOF. */
static size_t recv_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

static void boot_init(hc_boot_t *b, int rank, int *conn, hc_errbuf_t *eb)
{
    memset(b, 0, sizeof *b);
    b->rank = rank;
    b->nranks = NR;
    b->timeout_ms = 2000;
    b->init_timeout_ms = 2000;
    b->eb = eb;
    b->conn = conn;
    for (int r = 0; r < NR; r++)
        conn[r] = -1;
    b->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    FUZZ_CHECK(b->abort_fd >= 0);
    atomic_init(&b->aborted, 0);
    atomic_init(&b->broken, HCOLL_SUCCESS);
    pthread_mutex_init(&b->call_lock, NULL);
    memcpy(b->prekey, key, sizeof key);
    b->kdf_iters = take8() & 1; /* 0: the key as it is; 1: one PBKDF2 round */
}

static void boot_fini(hc_boot_t *b)
{
    for (int r = 0; r < NR; r++)
        if (b->conn[r] >= 0)
            close(b->conn[r]);
    close(b->abort_fd);
    pthread_mutex_destroy(&b->call_lock);
}

/* ---- the root's side ------------------------------------------------------ */

typedef struct client {
    int fd;           /* the script's end; -1 once closed */
    unsigned char chal[HC_BWIRE_HDR_BYTES + HC_BWIRE_CHALLENGE_BYTES];
    size_t chal_got;
    int auths;        /* AUTH messages sent */
    int auth_rank;    /* the first one's claim, when its MAC and claims were right */
    unsigned char post[64]; /* what was sent after that AUTH */
    size_t npost;
    unsigned char rec[REC];
    size_t rec_sent;  /* record body bytes sent after a RECORD header */
    int rec_hdr;
} client_t;

static void client_send(client_t *c, const void *p, size_t n)
{
    if (c->auth_rank > 0)
        for (size_t i = 0; i < n && c->npost < sizeof c->post; i++)
            c->post[c->npost++] = ((const unsigned char *)p)[i];
    send_all(c->fd, p, n);
}

/* Whatever the root sent: the first bytes are its CHALLENGE. */
static void client_read(client_t *c)
{
    unsigned char junk[512];
    for (;;) {
        ssize_t r;
        if (c->chal_got < sizeof c->chal)
            r = recv(c->fd, c->chal + c->chal_got, sizeof c->chal - c->chal_got, MSG_DONTWAIT);
        else
            r = recv(c->fd, junk, sizeof junk, MSG_DONTWAIT);
        if (r <= 0)
            return;
        if (c->chal_got < sizeof c->chal)
            c->chal_got += (size_t)r;
    }
}

static void client_auth(client_t *c, const hc_boot_t *b)
{
    unsigned mode = take8();
    uint32_t rank = take8() % 5, nranks = mode & 2 ? take8() % 5 : NR;
    uint32_t rec_len = mode & 4 ? take8() % 16 : REC;
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES], *a = m + HC_BWIRE_HDR_BYTES;
    client_read(c);
    if (c->chal_got < sizeof c->chal)
        return;
    const unsigned char *nonce_s = c->chal + HC_BWIRE_HDR_BYTES;
    hc_bwire_pack(m, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES, 0);
    hc_bwire_put32(a, rank);
    hc_bwire_put32(a + 4, nranks);
    hc_bwire_put32(a + 8, rec_len);
    take(a + 12, HC_BWIRE_NONCE_BYTES);
    /* The session key is the root's (b->key after open): the script holds
     * the secret. */
    hc_bwire_mac(b->key, 'C', nonce_s, a + 12, rank, nranks, rec_len,
                 a + 12 + HC_BWIRE_NONCE_BYTES);
    if (mode & 8) {
        unsigned bit = take8();
        a[12 + HC_BWIRE_NONCE_BYTES + bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    client_send(c, m, sizeof m); /* a second one is bytes after the first */
    /* Only the first can be read as an AUTH; it may still be refused (a
     * duplicate rank). */
    if (c->auths++ == 0 && !(mode & 8) && nranks == NR && rec_len == REC && rank >= 1 &&
        rank < NR)
        c->auth_rank = (int)rank;
}

static void client_step(client_t *c, const hc_boot_t *b)
{
    unsigned char buf[64];
    unsigned what = take8();
    if (c->fd < 0)
        return;
    switch (what % 6) {
    case 0: { /* raw bytes */
        size_t n = take8() % sizeof buf;
        take(buf, n);
        client_send(c, buf, n);
        break;
    }
    case 1: /* a header of the input's type, length and arg */
        hc_bwire_pack(buf, take8() % 13, take32() % 300, take32());
        client_send(c, buf, HC_BWIRE_HDR_BYTES);
        break;
    case 2:
        hc_bwire_pack(buf, HC_BMSG_HELLO, 0, 0);
        client_send(c, buf, HC_BWIRE_HDR_BYTES);
        break;
    case 3: client_auth(c, b); break;
    case 4: { /* the record, whole or in part */
        size_t n = take8() % (REC + 1);
        if (!c->rec_hdr) {
            hc_bwire_pack(buf, HC_BMSG_RECORD, REC, 0);
            client_send(c, buf, HC_BWIRE_HDR_BYTES);
            c->rec_hdr = 1;
        }
        if (n > REC - c->rec_sent)
            n = REC - c->rec_sent;
        take(c->rec + c->rec_sent, n);
        client_send(c, c->rec + c->rec_sent, n);
        c->rec_sent += n;
        break;
    }
    default: /* the client goes away */
        close(c->fd);
        c->fd = -1;
        break;
    }
}

static void fuzz_root(void)
{
    hc_boot_t b;
    hc_errbuf_t eb;
    int conn[NR];
    hc_errbuf_init(&eb);
    boot_init(&b, 0, conn, &eb);
    unsigned char mine[REC] = "root rec", recs[NR * REC];
    hc_boot_root_t *rc = NULL;
    FUZZ_CHECK(hc_boot_root_open(&b, mine, REC, recs, &rc) == HCOLL_SUCCESS);
    client_t cl[2];
    int ends[2];
    for (int k = 0; k < 2; k++) {
        int sv[2];
        FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
        memset(&cl[k], 0, sizeof cl[k]);
        cl[k].fd = sv[1];
        cl[k].auth_rank = -1;
        ends[k] = sv[0];
        hc_bio_nonblock(sv[0]);
        hc_boot_root_adopt(rc, sv[0]);
    }
    int nreg = 0;
    while (in_n) {
        unsigned who = take8();
        client_step(&cl[who & 1], &b);
        if (who & 2)
            nreg = hc_boot_root_serve(rc);
    }
    nreg = hc_boot_root_serve(rc);
    /* Who got in: a connection that proved the key, as the rank it
     * claimed, with the record it sent. */
    FUZZ_CHECK(nreg >= 0 && nreg <= 2);
    int seen = 0;
    for (int r = 1; r < NR; r++) {
        if (conn[r] < 0)
            continue;
        seen++;
        int k = conn[r] == ends[0] ? 0 : 1;
        FUZZ_CHECK(conn[r] == ends[k] && cl[k].auth_rank == r);
        /* After its AUTH: a RECORD header of REC bytes, then the record. */
        hc_bwire_hdr_t h;
        FUZZ_CHECK(cl[k].npost >= HC_BWIRE_HDR_BYTES + REC);
        hc_bwire_unpack(cl[k].post, &h);
        FUZZ_CHECK(h.magic == HC_BWIRE_MAGIC && h.type == HC_BMSG_RECORD && h.len == REC);
        FUZZ_CHECK(memcmp(recs + (size_t)r * REC, cl[k].post + HC_BWIRE_HDR_BYTES, REC) == 0);
    }
    FUZZ_CHECK(seen == nreg);
    FUZZ_SAY("rdv root: %d rank(s) registered\n", nreg);
    FUZZ_CHECK(memcmp(recs, mine, REC) == 0);
    hc_boot_root_close(rc);
    for (int k = 0; k < 2; k++)
        if (cl[k].fd >= 0)
            close(cl[k].fd);
    boot_fini(&b);
    hc_errbuf_fini(&eb);
}

/* ---- the client's side ---------------------------------------------------- */

typedef struct fake_root {
    int fd;
    uint32_t iters;
    int proves; /* it sent AUTH_OK with the right MAC */
} fake_root_t;

static void *fake_root(void *arg)
{
    fake_root_t *f = arg;
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES + 300];
    unsigned char auth[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES];
    unsigned char nonce_s[HC_BWIRE_NONCE_BYTES], salt[HC_BWIRE_SALT_BYTES];
    unsigned char k[HC_BOOT_KEY_BYTES];
    unsigned mode = take8();
    if (recv_all(f->fd, m, HC_BWIRE_HDR_BYTES) < HC_BWIRE_HDR_BYTES)
        goto out;
    if (mode & 1) { /* a well-formed challenge */
        take(nonce_s, sizeof nonce_s);
        take(salt, sizeof salt);
        uint32_t iters = mode & 2 ? take8() % 3 : f->iters;
        hc_bwire_pack(m, HC_BMSG_CHALLENGE, HC_BWIRE_CHALLENGE_BYTES, 0);
        memcpy(m + HC_BWIRE_HDR_BYTES, nonce_s, sizeof nonce_s);
        memcpy(m + HC_BWIRE_HDR_BYTES + sizeof nonce_s, salt, sizeof salt);
        hc_bwire_put32(m + HC_BWIRE_HDR_BYTES + sizeof nonce_s + sizeof salt, iters);
        send_all(f->fd, m, HC_BWIRE_HDR_BYTES + HC_BWIRE_CHALLENGE_BYTES);
        if (iters)
            hc_bwire_kdf(key, salt, iters, k);
        else
            memcpy(k, key, sizeof k);
    } else {
        size_t n = take8() % 100;
        take(m, n);
        send_all(f->fd, m, n);
        goto rest;
    }
    if (recv_all(f->fd, auth, sizeof auth) < sizeof auth)
        goto out;
    const unsigned char *a = auth + HC_BWIRE_HDR_BYTES, *nonce_c = a + 12;
    uint32_t rank = hc_bwire_get32(a), nranks = hc_bwire_get32(a + 4),
             rec_len = hc_bwire_get32(a + 8);
    if (mode & 4) { /* AUTH_OK */
        hc_bwire_pack(m, HC_BMSG_AUTH_OK, HC_BWIRE_MAC_BYTES, 0);
        hc_bwire_mac(k, 'S', nonce_s, nonce_c, rank, nranks, rec_len, m + HC_BWIRE_HDR_BYTES);
        if (mode & 8) {
            unsigned bit = take8();
            m[HC_BWIRE_HDR_BYTES + bit / 8] ^= (unsigned char)(1u << (bit % 8));
        } else {
            f->proves = 1;
        }
        send_all(f->fd, m, HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES);
    } else if (mode & 16) { /* REFUSE, its text from the input */
        size_t n = take8() % 300;
        uint32_t st = take32();
        char *text = (char *)m + HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES;
        take(text, n);
        hc_bwire_pack(m, HC_BMSG_REFUSE, (uint32_t)(HC_BWIRE_MAC_BYTES + n), st);
        hc_bwire_refuse_mac(k, nonce_s, nonce_c, st, text, n, m + HC_BWIRE_HDR_BYTES);
        if (mode & 8)
            m[HC_BWIRE_HDR_BYTES] ^= 1;
        send_all(f->fd, m, HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES + n);
    }
rest:
    while (in_n) {
        unsigned char buf[256];
        size_t n = in_n < sizeof buf ? in_n : sizeof buf;
        take(buf, n);
        send_all(f->fd, buf, n);
    }
out:
    shutdown(f->fd, SHUT_WR);
    return NULL;
}

static void fuzz_client(void)
{
    hc_boot_t b;
    hc_errbuf_t eb;
    int conn[NR];
    hc_errbuf_init(&eb);
    boot_init(&b, 1 + (int)(take8() & 1), conn, &eb);
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    hc_bio_nonblock(sv[0]);
    fake_root_t f = { .fd = sv[1], .iters = b.kdf_iters };
    pthread_t th;
    FUZZ_CHECK(pthread_create(&th, NULL, fake_root, &f) == 0);
    char why[HC_BWIRE_ERRTEXT_MAX + 1] = "";
    int end = -1, hs_ok;
    /* The fake root always ends with EOF: no wait may last until this. */
    const double deadline = hc_now_ms() + 5000;
    hcoll_status_t st = hc_boot_client_handshake(&b, sv[0], REC, deadline, &end, why, sizeof why);
    hs_ok = st == HCOLL_SUCCESS;
    if (hs_ok) {
        unsigned char mine[REC] = "my rec..", recs[NR * REC];
        st = hc_bio_send_msg(&b, sv[0], HC_BMSG_RECORD, 0, mine, REC, deadline);
        if (st == HCOLL_SUCCESS)
            st = hc_boot_client_wait_table(&b, sv[0], recs, sizeof recs, deadline);
        if (st != HCOLL_SUCCESS)
            FUZZ_CHECK(hc_errbuf_get(&eb)[0] != '\0');
    } else if (end == 0) {
        FUZZ_CHECK(hc_errbuf_get(&eb)[0] != '\0');
    } else {
        FUZZ_CHECK(end == 1 || end == 2);
        FUZZ_CHECK(memchr(why, '\0', sizeof why) != NULL);
        for (const char *c = why; *c; c++)
            FUZZ_CHECK(*c >= 0x20 && *c < 0x7f);
    }
    FUZZ_SAY("rdv client: handshake %s, end %d, status %s: %s\n", hs_ok ? "ok" : "failed", end,
             hcoll_status_name(st), hc_errbuf_get(&eb));
    /* A timeout only as the root's own verdict: an ERROR it sent, or a
     * REFUSE that carries that status (with the right MAC). */
    if (st == HCOLL_ERR_TIMEOUT)
        FUZZ_CHECK(strstr(hc_errbuf_get(&eb), "reports") != NULL ||
                   strstr(hc_errbuf_get(&eb), "the root refused this rank") != NULL);
    close(sv[0]);
    pthread_join(th, NULL);
    close(sv[1]);
    /* Accepted only after the root proved the key (joined: the fake
     * root's flag is final). */
    if (hs_ok)
        FUZZ_CHECK(f.proves);
    boot_fini(&b);
    hc_errbuf_fini(&eb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 16 * 1024)
        return 0;
    in_p = data + 1, in_n = size - 1;
    if (data[0] & 1)
        fuzz_root();
    else
        fuzz_client();
    return 0;
}
