/*
 * Waiting in the shared-memory backend (shm.h), and the health of the
 * node's segment.
 *
 * Waiting: a brief spin (only with two cores per local rank), a few
 * sched_yield, then FUTEX_WAIT on one event counter in the segment, in
 * slices of HC_SHM_SLICE_MS. Every writer bumps the counter and wakes when
 * somebody sleeps. Between slices: the abort/failure word, the deadline,
 * and the liveness of the ranks still awaited: exit (pidfd, else
 * kill(pid,0) and /proc zombie state), found within milliseconds, and the
 * heartbeat counter each rank's liveness thread bumps (hc_shm_beat): a
 * rank whose counter stands still for liveness_ms is stopped or hung. A
 * rank that is alive but late is waited for up to op_timeout_ms: the
 * deadline is for progress, the heartbeat for life. The first rank that sees a failure poisons the
 * segment so that every other rank's wait ends at once too.
 */
#include "intra/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

/* ------------------------------------------------------------------------ */
/* Events: one futex word for the whole segment                              */
/* ------------------------------------------------------------------------ */

void hc_shm_wake(hc_shm_hdr_t *hdr)
{
    /* seq_cst RMW then seq_cst load pairs with the waiter's nwaiters
     * increment then condition re-check: one of the two sees the other. */
    __atomic_add_fetch(&hdr->ev, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&hdr->nwaiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &hdr->ev, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void hc_shm_sleep(hc_shm_hdr_t *hdr, uint32_t seen, double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1e3);
    ts.tv_nsec = (long)((ms - ts.tv_sec * 1e3) * 1e6);
    /* Not FUTEX_PRIVATE: the word is shared between processes. EAGAIN (the
     * word moved), EINTR and ETIMEDOUT all just mean "look again". */
    syscall(SYS_futex, &hdr->ev, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* Health: abort, poison, liveness                                           */
/* ------------------------------------------------------------------------ */

void hc_shm_poison(hc_shm_t *s, hcoll_status_t st, int culprit)
{
    uint64_t expect = 0;
    uint64_t v = HC_SHM_FAIL(st, culprit < 0 ? 0xffff : culprit, s->lrank);
    __atomic_compare_exchange_n(&s->hdr->fail, &expect, v, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
}

/* HCOLL_SUCCESS, or the error (recorded) that ends this call. */
hcoll_status_t hc_shm_check_health(hc_shm_t *s, const char *what)
{
    if (__atomic_load_n(&s->aborted, __ATOMIC_ACQUIRE))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_ABORTED,
                          "intra-node shm %s: aborted on this rank", what);
    if (!s->hdr)
        return HCOLL_SUCCESS;
    uint64_t f = __atomic_load_n(&s->hdr->fail, __ATOMIC_SEQ_CST);
    if (!f)
        return HCOLL_SUCCESS;
    hcoll_status_t fst = (hcoll_status_t)(f & 0xffff);
    int culprit = (int)((f >> 16) & 0xffff), reporter = (int)((f >> 32) & 0xffff);
    hcoll_status_t st = fst;
    const char *how;
    switch (fst) {
    case HCOLL_ERR_ABORTED: how = "aborted"; st = HCOLL_ERR_PEER_FAILED; break;
    case HCOLL_ERR_PEER_FAILED: how = "failed"; break;
    case HCOLL_ERR_TIMEOUT: how = "did not respond in time"; break;
    case HCOLL_ERR_MISMATCH: how = "called with different arguments"; break;
    default: how = "failed"; st = HCOLL_ERR_PEER_FAILED; break;
    }
    if (culprit == s->lrank)
        return hc_err_set(s->eb, HC_SHM, s->rank, st,
                          "intra-node shm %s: local rank %d reported that this rank (local "
                          "%d) %s", what, reporter, culprit, how);
    if (culprit == 0xffff)
        return hc_err_set(s->eb, HC_SHM, s->rank, st,
                          "intra-node shm %s: the node's segment was marked failed "
                          "(%s) by local rank %d", what, hcoll_status_name(fst), reporter);
    return hc_err_set(s->eb, HC_SHM, s->rank, st,
                      "intra-node shm %s: local rank %d %s (reported by local rank %d)",
                      what, culprit, how, reporter);
}

void hc_shm_beat(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (s && s->hdr)
        __atomic_add_fetch(&s->hdr->ranks[s->lrank].beat, 1, __ATOMIC_RELAXED);
}

hcoll_status_t hc_shm_health(hc_intra_t *ctx, const char *what)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    return s ? hc_shm_check_health(s, what) : HCOLL_SUCCESS;
}

void hc_shm_poison_op(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (s && s->hdr)
        hc_shm_poison(s, HCOLL_ERR_PEER_FAILED, -1);
}

/* 1 when rank q's heartbeat has stood still for liveness_ms. The clock
 * starts at the first look, so a rank is never judged on time before
 * anybody watched it. */
static int hc_shm_peer_frozen(hc_shm_t *s, int q, double now)
{
    if (s->liveness_ms <= 0)
        return 0;
    uint64_t b = __atomic_load_n(&s->hdr->ranks[q].beat, __ATOMIC_RELAXED);
    if (s->seen_at[q] == 0 || b != s->seen_beat[q]) {
        s->seen_beat[q] = b;
        s->seen_at[q] = now;
        return 0;
    }
    return now - s->seen_at[q] > s->liveness_ms;
}

/* 0 alive, 1 exited, 2 left the segment (destroyed its context). */
static int hc_shm_peer_gone(const hc_shm_t *s, int q)
{
    uint32_t state = __atomic_load_n(&s->hdr->ranks[q].state, __ATOMIC_ACQUIRE);
    if (state == HC_SHM_ST_LEFT || state == HC_SHM_ST_ABORTED)
        return 2;
    if (s->pidfd[q] >= 0) {
        /* A pidfd turns readable when the process exits, zombie or not, and
         * never refers to a recycled pid. */
        struct pollfd p = { .fd = s->pidfd[q], .events = POLLIN };
        return poll(&p, 1, 0) > 0 ? 1 : 0;
    }
    pid_t pid = s->pid[q];
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    /* kill() succeeds on a zombie that nobody has reaped yet. */
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 1 : 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && (rp[1] == ' ') && (rp[2] == 'Z' || rp[2] == 'X') ? 1 : 0;
}

/* Every other local rank, whether awaited or not (intra.h, alive): one that
 * left in order is not a failure, one that died or stopped beating is. */
hcoll_status_t hc_shm_alive(hc_intra_t *ctx, const char *what)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st = s ? hc_shm_check_health(s, what) : HCOLL_SUCCESS;
    if (st != HCOLL_SUCCESS || !s->hdr)
        return st;
    const double now = hc_now_ms();
    for (int r = 0; r < s->L; r++) {
        if (r == s->lrank)
            continue;
        const int gone = hc_shm_peer_gone(s, r);
        if (gone == 1 || (gone == 0 && hc_shm_peer_frozen(s, r, now))) {
            hc_shm_poison(s, HCOLL_ERR_PEER_FAILED, r);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                              "intra-node shm %s: local rank %d (pid %d) %s", what, r,
                              (int)s->pid[r],
                              gone ? "died"
                                   : "showed no sign of life for HCOLL_LIVENESS_MS (stopped "
                                     "or hung)");
        }
    }
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                    */
/* ------------------------------------------------------------------------ */

int hc_shm_pending_posted(const hc_shm_t *s, int q, uint64_t target)
{
    return __atomic_load_n(&s->hdr->ranks[q].posted, __ATOMIC_SEQ_CST) < target;
}

int hc_shm_pending_done(const hc_shm_t *s, int q, uint64_t target)
{
    return __atomic_load_n(&s->hdr->ranks[q].done, __ATOMIC_SEQ_CST) < target;
}

int hc_shm_pending_attach(const hc_shm_t *s, int q, uint64_t target)
{
    (void)target;
    return __atomic_load_n(&s->hdr->ranks[q].state, __ATOMIC_SEQ_CST) == HC_SHM_ST_NONE;
}

/* First rank other than self, from `from` on (cyclically), still pending;
 * -1 when none. Starting where the last scan stopped keeps rescans short. */
static int hc_shm_first_pending(const hc_shm_t *s, hc_shm_pending_fn pending,
                                uint64_t target, int from)
{
    for (int i = 0; i < s->L; i++) {
        int q = (from + i) % s->L;
        if (q != s->lrank && pending(s, q, target))
            return q;
    }
    return -1;
}

/* The ranks still awaited: one that exited, left or (beats: 1) stopped
 * beating ends the wait, and the segment is poisoned so that every other
 * local rank's wait ends too. One that finished its part and went away is
 * not a failure. */
static hcoll_status_t hc_shm_check_awaited(hc_shm_t *s, hc_shm_pending_fn pending,
                                           uint64_t target, const char *what, int beats,
                                           double now)
{
    for (int r = 0; r < s->L; r++) {
        if (r == s->lrank || !pending(s, r, target))
            continue;
        int gone = hc_shm_peer_gone(s, r);
        if (gone) {
            hc_shm_poison(s, HCOLL_ERR_PEER_FAILED, r);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                              "intra-node shm %s: local rank %d (pid %d) %s", what, r,
                              (int)s->pid[r], gone == 2 ? "left the node's segment" : "died");
        }
        if (beats && hc_shm_peer_frozen(s, r, now)) {
            hc_shm_poison(s, HCOLL_ERR_PEER_FAILED, r);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                              "intra-node shm %s: local rank %d (pid %d) showed no sign of "
                              "life for %d ms (stopped or hung; HCOLL_LIVENESS_MS)",
                              what, r, (int)s->pid[r], s->liveness_ms);
        }
    }
    return HCOLL_SUCCESS;
}

/*
 * Wait until no other rank is pending. Errors: ABORTED (here), whatever
 * poisoned the segment, PEER_FAILED (an awaited rank exited, left or
 * stopped beating), TIMEOUT (no progress from the awaited ranks within
 * the wait's limit).
 */
hcoll_status_t hc_shm_wait(hc_shm_t *s, hc_shm_pending_fn pending, uint64_t target,
                           const char *what)
{
    hc_shm_hdr_t *hdr = s->hdr;
    int q = hc_shm_first_pending(s, pending, target, 0);
    if (q < 0)
        return HCOLL_SUCCESS;
    for (int i = 0; i < s->spins; i++) {
        hc_shm_cpu_relax();
        if (!pending(s, q, target) && (q = hc_shm_first_pending(s, pending, target, q)) < 0)
            return HCOLL_SUCCESS;
    }

    hcoll_status_t st;
    /* Create waits for ranks to attach (set-up: timeout_ms, and no
     * heartbeat yet); an operation waits for progress (op_timeout_ms). */
    const int setup = pending == hc_shm_pending_attach;
    const int limit = setup ? s->timeout_ms : s->op_timeout_ms;
    double now = hc_now_ms();
    double deadline = limit > 0 ? now + limit : -1;
    double next_check = now + HC_SHM_LIVE_MS;
    int yields = 0;
    for (;;) {
        if ((st = hc_shm_check_health(s, what)) != HCOLL_SUCCESS)
            return st;
        now = hc_now_ms();
        if (now >= next_check) {
            next_check = now + HC_SHM_LIVE_MS;
            if ((st = hc_shm_check_awaited(s, pending, target, what, !setup, now)) !=
                HCOLL_SUCCESS)
                return st;
        }
        if (deadline >= 0 && now >= deadline) {
            hc_shm_poison(s, HCOLL_ERR_TIMEOUT, q);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_TIMEOUT,
                              "intra-node shm %s: local rank %d made no progress in %d ms "
                              "(alive, but not in this call: %s)",
                              what, q, limit, setup ? "HCOLL_TIMEOUT_MS" : "HCOLL_OP_TIMEOUT_MS");
        }
        if (yields < HC_SHM_YIELDS) {
            yields++;
            sched_yield();
        } else {
            uint32_t seen = __atomic_load_n(&hdr->ev, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&hdr->nwaiters, 1, __ATOMIC_SEQ_CST);
            if (pending(s, q, target) && !__atomic_load_n(&s->aborted, __ATOMIC_SEQ_CST) &&
                !__atomic_load_n(&hdr->fail, __ATOMIC_SEQ_CST)) {
                double left = deadline >= 0 ? deadline - now : HC_SHM_SLICE_MS;
                hc_shm_sleep(hdr, seen, left < HC_SHM_SLICE_MS ? left : HC_SHM_SLICE_MS);
            }
            __atomic_sub_fetch(&hdr->nwaiters, 1, __ATOMIC_SEQ_CST);
        }
        if (!pending(s, q, target) && (q = hc_shm_first_pending(s, pending, target, q)) < 0) {
            /* Progress: the deadline bounds a wait without any. */
            return HCOLL_SUCCESS;
        }
    }
}
