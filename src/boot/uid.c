#include "boot/uid.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "boot/boot.h"
#include "boot/hmac.h"

#define UID_MAGIC "HCID"
#define UID_VERSION 1
#define UID_CHECKED 60

/* Every way an id can be unreadable is the caller's argument at fault; the
 * message reads as the init step's, which is the one that decodes ids. */
static hcoll_status_t bad_id(hc_errbuf_t *eb, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hcoll_status_t bad_id(hc_errbuf_t *eb, int rank, const char *fmt, ...)
{
    char why[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return hc_err_set(eb, HC_INIT, rank, HCOLL_ERR_INVALID_ARG, "init: %s", why);
}

void hc_uid_encode(const hc_uid_t *u, hcoll_unique_id_t *id_out)
{
    unsigned char *p = id_out->internal;
    memset(p, 0, HCOLL_UNIQUE_ID_BYTES);
    memcpy(p, UID_MAGIC, 4);
    p[4] = UID_VERSION;
    int port = hc_sockaddr_port(&u->root);
    p[6] = (unsigned char)(port >> 8), p[7] = (unsigned char)port;
    if (u->root.sa.sa_family == AF_INET6) {
        p[5] = 6;
        memcpy(p + 8, &u->root.sin6.sin6_addr, 16);
        uint32_t sc = u->root.sin6.sin6_scope_id;
        p[24] = (unsigned char)(sc >> 24), p[25] = (unsigned char)(sc >> 16);
        p[26] = (unsigned char)(sc >> 8), p[27] = (unsigned char)sc;
    } else {
        p[5] = 4;
        memcpy(p + 8, &u->root.sin.sin_addr, 4);
    }
    memcpy(p + 28, u->secret, HC_UID_SECRET_BYTES);
    unsigned char d[HC_SHA256_BYTES];
    hc_sha256(p, UID_CHECKED, d);
    memcpy(p + UID_CHECKED, d, 4);
}

hcoll_status_t hc_uid_decode(const hcoll_unique_id_t *id, hc_errbuf_t *eb, int rank,
                             hc_uid_t *u_out)
{
    const unsigned char *p = id->internal;
    unsigned char d[HC_SHA256_BYTES];
    if (memcmp(p, UID_MAGIC, 4) != 0)
        return bad_id(eb, rank, "not a unique id made by hcoll_get_unique_id (bad magic)");
    if (p[4] != UID_VERSION)
        return bad_id(eb, rank, "unique id version %u (this library reads %u)", p[4], UID_VERSION);
    hc_sha256(p, UID_CHECKED, d);
    if (memcmp(p + UID_CHECKED, d, 4) != 0)
        return bad_id(eb, rank, "unique id is corrupted (check bytes differ: not copied whole?)");
    hc_uid_t u;
    memset(&u, 0, sizeof u);
    int port = p[6] << 8 | p[7];
    if (p[5] == 6) {
        u.root.sin6.sin6_family = AF_INET6;
        memcpy(&u.root.sin6.sin6_addr, p + 8, 16);
        u.root.sin6.sin6_scope_id = (uint32_t)p[24] << 24 | (uint32_t)p[25] << 16 |
                                    (uint32_t)p[26] << 8 | p[27];
    } else if (p[5] == 4) {
        u.root.sin.sin_family = AF_INET;
        memcpy(&u.root.sin.sin_addr, p + 8, 4);
    } else {
        return bad_id(eb, rank, "unique id has unknown address family %u", p[5]);
    }
    if (port == 0)
        return bad_id(eb, rank, "unique id has port 0");
    hc_sockaddr_set_port(&u.root, port);
    memcpy(u.secret, p + 28, HC_UID_SECRET_BYTES);
    *u_out = u;
    return HCOLL_SUCCESS;
}

/* See uid.h for why this table exists and why it is safe. */
static struct {
    pthread_mutex_t lock;
    unsigned long seq;
    struct {
        int fd; /* 0: free slot (fd 0 is never a socket we made: stdin) */
        int pid; /* the process that parked it */
        unsigned long seq;
        unsigned char secret[HC_UID_SECRET_BYTES];
    } e[HC_UID_PARKED_MAX];
} parked = { .lock = PTHREAD_MUTEX_INITIALIZER };
static pthread_once_t parked_atfork_once = PTHREAD_ONCE_INIT;

/* With parked.lock held: drop the entries another process parked (this
 * is its forked child), closing this process's copies of their fds. */
static void parked_drop_inherited(void)
{
    const int me = (int)getpid();
    for (int i = 0; i < HC_UID_PARKED_MAX; i++)
        if (parked.e[i].fd > 0 && parked.e[i].pid != me) {
            close(parked.e[i].fd);
            parked.e[i].fd = 0;
            hc_secure_zero(parked.e[i].secret, HC_UID_SECRET_BYTES);
        }
}

/* fork: the table is taken whole (prepare) so that the child gets it
 * consistent, and the child closes its copies at once. Those copies are
 * the parent's very sockets: a child that took one for its own rank 0
 * would listen on the parent's socket, which then accepts in the parent
 * for ever after; one that just lives on (a data loader) would keep the
 * socket, listening once the parent's rank 0 listens, open after the
 * parent closed it. */
static void parked_prefork(void)
{
    pthread_mutex_lock(&parked.lock);
}

static void parked_postfork_parent(void)
{
    pthread_mutex_unlock(&parked.lock);
}

static void parked_postfork_child(void)
{
    parked_drop_inherited();
    pthread_mutex_unlock(&parked.lock);
}

static void parked_atfork(void)
{
    pthread_atfork(parked_prefork, parked_postfork_parent, parked_postfork_child);
}

void hc_uid_park(const unsigned char secret[HC_UID_SECRET_BYTES], int fd)
{
    pthread_once(&parked_atfork_once, parked_atfork);
    pthread_mutex_lock(&parked.lock);
    int slot = -1;
    for (int i = 0; i < HC_UID_PARKED_MAX && slot < 0; i++)
        if (parked.e[i].fd <= 0)
            slot = i;
    if (slot < 0) {
        slot = 0;
        for (int i = 1; i < HC_UID_PARKED_MAX; i++)
            if (parked.e[i].seq < parked.e[slot].seq)
                slot = i;
        close(parked.e[slot].fd);
    }
    parked.e[slot].fd = fd;
    parked.e[slot].pid = (int)getpid();
    parked.e[slot].seq = ++parked.seq;
    memcpy(parked.e[slot].secret, secret, HC_UID_SECRET_BYTES);
    pthread_mutex_unlock(&parked.lock);
}

int hc_uid_take(const unsigned char secret[HC_UID_SECRET_BYTES])
{
    int fd = -1;
    pthread_mutex_lock(&parked.lock);
    /* A child forked without the atfork handlers (a raw clone) still
     * never takes its parent's socket. */
    parked_drop_inherited();
    for (int i = 0; i < HC_UID_PARKED_MAX; i++) {
        if (parked.e[i].fd > 0 && hc_ct_equal(parked.e[i].secret, secret, HC_UID_SECRET_BYTES)) {
            fd = parked.e[i].fd;
            parked.e[i].fd = 0;
            hc_secure_zero(parked.e[i].secret, HC_UID_SECRET_BYTES);
            break;
        }
    }
    pthread_mutex_unlock(&parked.lock);
    return fd;
}

hcoll_status_t hc_uid_reserve(const hc_sockaddr_t *addr, hc_errbuf_t *eb, int *fd_out,
                              hc_sockaddr_t *addr_out)
{
    /* Never SO_REUSEADDR on the maker's parked socket (see uid.h). */
    return hc_boot_socket(addr, HC_BOOT_SOCK_REUSEPORT, eb, -1, "get_unique_id", fd_out,
                          addr_out);
}

hcoll_status_t hc_uid_listen(const hc_uid_t *u, hc_errbuf_t *eb, int *fd_out)
{
    int fd = hc_uid_take(u->secret);
    if (fd < 0)
        return hc_boot_socket(&u->root,
                              HC_BOOT_SOCK_REUSEPORT | HC_BOOT_SOCK_REUSEADDR |
                                  HC_BOOT_SOCK_LISTEN,
                              eb, 0, "init", fd_out, NULL);
    if (listen(fd, HC_BOOT_BACKLOG) != 0) {
        char as[80];
        hcoll_status_t st = hc_err_set(eb, HC_BOOT, 0, HCOLL_ERR_NETWORK,
                                       "init: listen on %s: %s",
                                       hc_sockaddr_str(&u->root, as, sizeof as), strerror(errno));
        close(fd);
        return st;
    }
    *fd_out = fd;
    return HCOLL_SUCCESS;
}
