/*
 * A bootstrap's life: hc_boot_create checks the arguments, sets up the
 * hc_boot_t (connections, abort eventfd, call lock) and runs one side of
 * the rendezvous (root.c or client.c); abort and destroy end it. The wire
 * format is in wire.c, the connection I/O in io.c and the set-up
 * collectives in coll.c.
 */
#include "boot/boot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "boot/hmac.h"
#include "boot/io.h"
#include "boot/rendezvous.h"

hcoll_status_t hc_boot_create(const hc_boot_args_t *args, const void *rec, size_t rec_len,
                              void *all_recs_out, hc_boot_t **boot_out)
{
    hcoll_status_t st;
    int lfd = args->listen_fd;
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks || rec_len == 0 ||
        rec_len > HC_BOOT_REC_MAX || args->timeout_ms <= 0 ||
        (size_t)args->nranks > HC_BOOT_COLL_MAX / rec_len) {
        st = hc_err_set(args->eb, HC_BOOT, args->rank, HCOLL_ERR_INVALID_ARG,
                        "bootstrap: bad arguments (rank %d of %d, record %zu bytes)", args->rank,
                        args->nranks, rec_len);
        goto clean_listener;
    }
    hc_boot_t *b = calloc(1, sizeof *b);
    if (!b) {
        st = hc_err_set(args->eb, HC_BOOT, args->rank, HCOLL_ERR_NO_MEMORY, "out of memory");
        goto clean_listener;
    }
    b->rank = args->rank;
    b->nranks = args->nranks;
    b->timeout_ms = args->timeout_ms;
    b->init_timeout_ms = args->init_timeout_ms > 0 ? args->init_timeout_ms : args->timeout_ms;
    b->liveness_ms = args->liveness_ms > 0 ? args->liveness_ms : 0;
    b->eb = args->eb;
    b->root = args->root;
    memcpy(b->prekey, args->key, sizeof b->prekey);
    b->kdf_iters = args->kdf_iters;
    atomic_init(&b->aborted, 0);
    atomic_init(&b->broken, HCOLL_SUCCESS);
    pthread_mutex_init(&b->call_lock, NULL);
    b->conn = malloc((size_t)b->nranks * sizeof *b->conn);
    if (!b->conn) {
        st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NO_MEMORY, "out of memory");
        goto clean_boot;
    }
    for (int r = 0; r < b->nranks; r++)
        b->conn[r] = -1;
    b->abort_fd = args->cancel_fd ? fcntl(*args->cancel_fd, F_DUPFD_CLOEXEC, 0)
                                  : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->abort_fd < 0) {
        st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "eventfd: %s", strerror(errno));
        goto clean_conn_table;
    }

    if (b->rank == 0) {
        if (lfd < 0) {
            HC_CHECK(hc_boot_socket(&b->root, HC_BOOT_SOCK_LISTEN | HC_BOOT_SOCK_REUSEADDR, b->eb, 0, "init",
                                    &lfd, &b->root),
                     clean_abortfd);
        } else {
            socklen_t l = sizeof b->root;
            getsockname(lfd, &b->root.sa, &l);
            hc_bio_nonblock(lfd);
        }
        if (hc_log_enabled(HC_LOG_INFO, HC_BOOT)) {
            char as[80];
            HC_INFO(HC_BOOT, 0, "bootstrap: root listening on %s for %d ranks (%s)",
                    hc_sockaddr_str(&b->root, as, sizeof as), b->nranks,
                    args->authenticated ? "authenticated" : "NOT authenticated");
        }
        /* The root's rendezvous owns lfd from here and closes it in every case. */
        st = hc_boot_root_rendezvous(b, lfd, rec, rec_len, all_recs_out);
        lfd = -1;
    } else {
        st = hc_boot_client_rendezvous(b, rec, rec_len, all_recs_out);
    }
    /* Only the session key is kept (hc_boot_key). */
    hc_secure_zero(b->prekey, sizeof b->prekey);
    if (st != HCOLL_SUCCESS)
        goto clean_conns;
    *boot_out = b;
    return HCOLL_SUCCESS;

clean_conns:
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            close(b->conn[r]);
clean_abortfd:
    close(b->abort_fd);
clean_conn_table:
    free(b->conn);
clean_boot:
    pthread_mutex_destroy(&b->call_lock);
    hc_secure_zero(b, sizeof *b);
    free(b);
clean_listener:
    if (lfd >= 0)
        close(lfd);
    return st;
}

void hc_boot_key(const hc_boot_t *b, unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    memcpy(key_out, b->key, HC_BOOT_KEY_BYTES);
}

void hc_boot_set_errbuf(hc_boot_t *b, hc_errbuf_t *eb)
{
    b->eb = eb;
}

hcoll_status_t hc_boot_status(const hc_boot_t *b)
{
    return (hcoll_status_t)atomic_load(&((hc_boot_t *)b)->broken);
}

void hc_boot_abort(hc_boot_t *b)
{
    if (!b || atomic_exchange(&b->aborted, 1))
        return;
    uint64_t one = 1;
    ssize_t w = write(b->abort_fd, &one, sizeof one);
    (void)w;
    /* Shut, do not close: a call blocked in poll on these fds in another
     * thread must not see them reused. Peers see EOF and fail promptly. */
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            shutdown(b->conn[r], SHUT_RDWR);
}

void hc_boot_destroy(hc_boot_t *b)
{
    if (!b)
        return;
    /* Wait for a call in flight on another thread (hc_boot_abort made it
     * return promptly). */
    pthread_mutex_lock(&b->call_lock);
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            close(b->conn[r]);
    close(b->abort_fd);
    pthread_mutex_unlock(&b->call_lock);
    pthread_mutex_destroy(&b->call_lock);
    free(b->conn);
    hc_secure_zero(b, sizeof *b);
    free(b);
}
