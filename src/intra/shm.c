/*
 * Shared-memory intra-node backend for host buffers: the node's segment
 * and the backend's ops table. One POSIX segment per node and
 * communicator; every local rank owns NSLOTS slots in it (the steps that
 * use them: shm_steps.c; the waiting: shm_wait.c).
 *
 * Segment life: local rank 0 creates it (O_EXCL), announces a nonce over
 * the caller's allgather, the others attach and check the nonce, then every
 * rank waits for all to be attached and unlinks the name (the first unlink
 * wins). From then on a crash leaves nothing behind. On any failure during
 * create (a rank that never attaches within timeout_ms, one that died, a
 * failed allgather) every surviving rank unlinks the name too, so a dead
 * creator is covered by the others. What can remain: the name, if every
 * local rank dies (SIGKILL, node failure) between rank 0's shm_open and the
 * first unlink, a window of one allgather plus the attach; the next create
 * on the node reaps such a name (hc_shm_reap: ours, hcoll's header, its
 * creator gone, or no header after a minute). Peers in another
 * pid namespace cannot be watched by pid; for them only the deadline and
 * the "left"/"aborted" state words tell.
 */
#include "intra/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

static size_t hc_shm_round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                           */
/* ------------------------------------------------------------------------ */

static void hc_shm_free(hc_shm_t *s)
{
    if (s->pidfd) {
        for (int q = 0; q < s->L; q++)
            if (s->pidfd[q] >= 0)
                close(s->pidfd[q]);
    }
    free(s->pidfd);
    free(s->pid);
    free(s->seen_beat);
    free(s->seen_at);
    free(s);
}

static void hc_shm_destroy(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (!s)
        return;
    if (s->hdr) {
        /* A peer still waiting on us learns at once that we are gone. */
        uint32_t none = HC_SHM_ST_ATTACHED;
        __atomic_compare_exchange_n(&s->hdr->ranks[s->lrank].state, &none, HC_SHM_ST_LEFT, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        hc_shm_wake(s->hdr);
        munmap(s->hdr, s->seg_bytes);
    }
    hc_shm_free(s);
}

static uint64_t hc_shm_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

void (*hc_shm_test_hook)(const char *point);

/* 1 when the segment behind fd (a name under /dev/shm) is a leftover: this
 * user's, hcoll's header with a creator that is gone from our pid
 * namespace, or still no header a minute after it was made (its creator
 * died between shm_open and writing it). The name can only still exist
 * before every local rank attached, so nobody can attach to it any more
 * once the creator is gone: removing the name takes nothing from anyone. */
static int hc_shm_stale(int fd, uint64_t my_ns)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() ||
        (size_t)st.st_size < sizeof(hc_shm_hdr_t))
        return 0;
    hc_shm_hdr_t *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return 0;
    int stale = 0;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == HC_SHM_MAGIC)
        stale = h->creator_pid > 0 && h->creator_ns == my_ns &&
                kill((pid_t)h->creator_pid, 0) != 0 && errno == ESRCH;
    else if (h->magic == 0)
        stale = time(NULL) - st.st_mtime > 60;
    munmap(h, sizeof *h);
    return stale;
}

/* Unlink the leftovers of creates whose every rank died before the name
 * went (see the top of this file). Best effort, never an error. */
static void hc_shm_reap(const hc_shm_t *s, uint64_t my_ns)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "hcoll-", 6) != 0)
            continue;
        char name[NAME_MAX + 2];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (hc_shm_stale(fd, my_ns) && shm_unlink(name) == 0)
            HC_INFO(HC_SHM, s->rank, "intra-node shm: removed %s, left by a job whose ranks "
                    "all died while creating it", name);
        close(fd);
    }
    closedir(d);
}

static hcoll_status_t hc_shm_segment_create(hc_shm_t *s, size_t seg_bytes, uint64_t nonce)
{
    hc_shm_reap(s, hc_shm_pidns());
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                          "intra-node shm: cannot create segment %s: %s%s", s->name,
                          strerror(errno),
                          errno == EEXIST ? " (name not unique, or left by a crashed job)" : "");
    hcoll_status_t st = HCOLL_SUCCESS;
    /* Reserve the pages now: on a full /dev/shm a write into a sparse
     * segment would be a SIGBUS, not an error. */
    int rc = posix_fallocate(fd, 0, (off_t)seg_bytes);
    if (rc == EOPNOTSUPP || rc == EINVAL)
        rc = ftruncate(fd, (off_t)seg_bytes) == 0 ? 0 : errno;
    if (rc != 0) {
        st = hc_err_set(s->eb, HC_SHM, s->rank,
                        rc == ENOSPC ? HCOLL_ERR_NO_MEMORY : HCOLL_ERR_SYSTEM,
                        "intra-node shm: cannot size segment %s to %zu bytes: %s%s", s->name,
                        seg_bytes, strerror(rc),
                        rc == ENOSPC ? " (is /dev/shm large enough?)" : "");
        goto clean_segment;
    }
    void *p = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                        "intra-node shm: mmap of %s (%zu bytes): %s", s->name, seg_bytes,
                        strerror(errno));
        goto clean_segment;
    }
    close(fd);
    hc_shm_hdr_t *hdr = p;
    hdr->nonce = nonce;
    hdr->version = HC_SHM_VERSION;
    hdr->L = (uint32_t)s->L;
    hdr->nslots = HC_SHM_NSLOTS;
    hdr->slot_bytes = s->slot_bytes;
    hdr->seg_bytes = seg_bytes;
    hdr->data_offset = s->data_offset;
    hdr->creator_pid = (int32_t)getpid();
    hdr->creator_ns = hc_shm_pidns();
    __atomic_store_n(&hdr->magic, HC_SHM_MAGIC, __ATOMIC_RELEASE);
    s->hdr = hdr;
    if (hc_shm_test_hook)
        hc_shm_test_hook("created");
    return HCOLL_SUCCESS;

clean_segment:
    close(fd);
    shm_unlink(s->name);
    return st;
}

static hcoll_status_t hc_shm_segment_attach(hc_shm_t *s, size_t seg_bytes, uint64_t nonce)
{
    int fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
    /* The name is unlinked early only by a rank that saw set-up fail (the
     * normal unlink waits until everyone has attached), so a missing name
     * means a local rank failed: report it as that, not as a system error. */
    if (fd < 0 && errno == ENOENT)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                          "intra-node shm create: segment %s was removed before this rank "
                          "attached: another local rank failed during set-up",
                          s->name);
    if (fd < 0)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                          "intra-node shm: cannot open segment %s made by local rank 0: %s",
                          s->name, strerror(errno));
    hcoll_status_t st = HCOLL_SUCCESS;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != seg_bytes) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INTERNAL,
                        "intra-node shm: segment %s has %lld bytes, local rank 0 announced %zu",
                        s->name, (long long)sb.st_size, seg_bytes);
        goto out;
    }
    void *p = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                        "intra-node shm: mmap of %s (%zu bytes): %s", s->name, seg_bytes,
                        strerror(errno));
        goto out;
    }
    hc_shm_hdr_t *hdr = p;
    if (__atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE) != HC_SHM_MAGIC || hdr->nonce != nonce ||
        hdr->version != HC_SHM_VERSION || hdr->L != (uint32_t)s->L ||
        hdr->slot_bytes != s->slot_bytes) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INTERNAL,
                        "intra-node shm: segment %s is not the one local rank 0 created "
                        "(stale or foreign)", s->name);
        munmap(p, seg_bytes);
        goto out;
    }
    s->hdr = hdr;
out:
    close(fd);
    return st;
}

/* The context, before anything is shared: its sizes and how it waits. */
static hcoll_status_t shm_new(const hc_intra_params_t *prm, hc_shm_t **out)
{
    hc_errbuf_t *eb = prm->errbuf;
    hc_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return hc_err_set(eb, HC_SHM, prm->rank, HCOLL_ERR_NO_MEMORY, "intra-node shm: calloc");
    s->base.ops = &hc_intra_shm_ops;
    s->lrank = prm->local_rank;
    s->L = prm->local_size;
    s->rank = prm->rank;
    s->eb = eb;
    s->timeout_ms = prm->timeout_ms;
    s->op_timeout_ms = prm->op_timeout_ms ? prm->op_timeout_ms : prm->timeout_ms;
    s->liveness_ms = prm->liveness_ms > 0 ? prm->liveness_ms : 0;
    if (s->L == 1) {
        *out = s; /* nothing to share */
        return HCOLL_SUCCESS;
    }
    snprintf(s->name, sizeof s->name, "%s", prm->name);
    s->pidfd = malloc((size_t)s->L * sizeof *s->pidfd);
    s->pid = calloc((size_t)s->L, sizeof *s->pid);
    s->seen_beat = calloc((size_t)s->L, sizeof *s->seen_beat);
    s->seen_at = calloc((size_t)s->L, sizeof *s->seen_at);
    if (!s->pidfd || !s->pid || !s->seen_beat || !s->seen_at) {
        hc_shm_free(s);
        return hc_err_set(eb, HC_SHM, prm->rank, HCOLL_ERR_NO_MEMORY, "intra-node shm: calloc");
    }
    for (int q = 0; q < s->L; q++)
        s->pidfd[q] = -1;

    /* Spinning only pays when the rank awaited is running: every rank
     * needs a core to itself and another for the thread that drives its
     * network stage (the ring thread, a progress thread). Otherwise the
     * spin burns the very core the awaited rank is queued for: with 4
     * ranks and their ring threads on 2 cores, a 2000-pause spin made a
     * 4 KiB all-reduce 1.6 times slower than going to sleep at once.
     * The cores counted are those this process may run on. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
        ncpu = CPU_COUNT(&cpus);
    s->spins = ncpu >= 2L * s->L ? HC_SHM_SPINS : 0;

    size_t chunk = prm->chunk_bytes < HC_SHM_PAGE ? HC_SHM_PAGE : prm->chunk_bytes;
    size_t min_slot = (size_t)s->L * HC_SHM_LINE;
    s->slot_bytes = hc_shm_round_up(chunk > min_slot ? chunk : min_slot, HC_SHM_PAGE);
    size_t hdr_bytes = sizeof(hc_shm_hdr_t) + (size_t)s->L * sizeof(hc_shm_rank_t);
    s->data_offset = hc_shm_round_up(hdr_bytes, HC_SHM_PAGE);
    s->seg_bytes = s->data_offset + (size_t)s->L * HC_SHM_NSLOTS * s->slot_bytes;
    *out = s;
    return HCOLL_SUCCESS;
}

/* Watch the other local ranks' processes (all: their hellos). */
static hcoll_status_t shm_watch_peers(hc_shm_t *s, const hc_shm_hello_t *all,
                                      const hc_shm_hello_t *mine)
{
    for (int q = 0; q < s->L; q++) {
        if (q == s->lrank || all[q].pidns != mine->pidns)
            continue; /* another pid namespace: its pid means nothing here */
        s->pid[q] = all[q].pid;
        s->pidfd[q] = (int)syscall(SYS_pidfd_open, (pid_t)all[q].pid, 0);
        if (s->pidfd[q] < 0 && errno == ESRCH) {
            hcoll_status_t st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                                           "intra-node shm create: local rank %d (pid %d) is "
                                           "gone", q, (int)all[q].pid);
            hc_shm_poison(s, st, q);
            return st;
        }
    }
    return HCOLL_SUCCESS;
}

/* The collective part of create: local rank 0 makes the segment, every
 * rank learns of it over the allgather, attaches, waits for all others to
 * attach, and unlinks the name. */
static hcoll_status_t shm_join(hc_shm_t *s, const hc_intra_params_t *prm)
{
    hcoll_status_t st;
    hc_errbuf_t *eb = s->eb;
    const int rank = s->rank;
    hc_shm_hello_t *all = calloc((size_t)s->L, sizeof *all);
    if (!all)
        return hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_NO_MEMORY, "intra-node shm: calloc");
    hc_shm_hello_t mine = { .pid = (int32_t)getpid(), .pidns = hc_shm_pidns() };
    if (s->lrank == 0) {
        uint64_t nonce = 0;
        mine.nonce = nonce;
        mine.seg_bytes = s->seg_bytes;
        /* No guessable fallback: the nonce tells our segment from a planted one. */
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            mine.status = hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_SYSTEM,
                                     "intra-node shm: getrandom: %s", strerror(errno));
        else
            mine.status = hc_shm_segment_create(s, s->seg_bytes, nonce);
        mine.nonce = nonce;
    }
    /* Rank 0 takes part even after a failure, so nobody waits for it. */
    st = prm->allgather(prm->allgather_ctx, &mine, all, sizeof mine);
    if (st != HCOLL_SUCCESS) {
        if (!eb || !hc_errbuf_get(eb)[0])
            hc_err_set(eb, HC_SHM, rank, st, "intra-node shm create: local allgather failed");
        goto clean_name;
    }
    /* Rank 0 cleaned up after its own failure; the name may belong to
     * somebody else (EEXIST), so nobody unlinks it. */
    if (s->lrank == 0 && mine.status != HCOLL_SUCCESS) {
        st = (hcoll_status_t)mine.status;
        goto clean_hello;
    }
    if (all[0].status != HCOLL_SUCCESS) {
        st = hc_err_set(eb, HC_SHM, rank, (hcoll_status_t)all[0].status,
                        "intra-node shm create: local rank 0 could not create segment %s",
                        s->name);
        goto clean_hello;
    }
    if (s->lrank != 0)
        HC_CHECK(hc_shm_segment_attach(s, all[0].seg_bytes, all[0].nonce), clean_name);
    s->data = (unsigned char *)s->hdr + s->data_offset;
    HC_CHECK(shm_watch_peers(s, all, &mine), clean_map);
    __atomic_store_n(&s->hdr->ranks[s->lrank].pid, mine.pid, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hdr->ranks[s->lrank].state, HC_SHM_ST_ATTACHED, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    HC_CHECK(hc_shm_wait(s, hc_shm_pending_attach, 0, "create"), clean_map);
    /* Everybody has it mapped: the name can go, so that no crash from now
     * on leaves anything in /dev/shm. Each rank tries; the first wins. */
    if (shm_unlink(s->name) != 0 && errno != ENOENT)
        HC_WARN(HC_SHM, rank, "intra-node shm: shm_unlink(%s): %s", s->name, strerror(errno));
    free(all);
    return HCOLL_SUCCESS;

clean_map:
    if (s->hdr) {
        hc_shm_poison(s, st, -1);
        munmap(s->hdr, s->seg_bytes);
        s->hdr = NULL;
    }
clean_name:
    /* Whoever fails unlinks: local rank 0 may be the one that died. */
    shm_unlink(s->name);
clean_hello:
    free(all);
    return st;
}

static hcoll_status_t hc_shm_create(const hc_intra_params_t *prm, hc_intra_t **out)
{
    hcoll_status_t st;
    hc_errbuf_t *eb = prm ? prm->errbuf : NULL;
    int rank = prm ? prm->rank : -1;
    if (!prm || !out || prm->local_size < 1 || prm->local_size > 0xfffe ||
        prm->local_rank < 0 || prm->local_rank >= prm->local_size || prm->timeout_ms <= 0 ||
        (prm->local_size > 1 && (!prm->allgather || !prm->name || prm->name[0] != '/' ||
                                 strchr(prm->name + 1, '/') ||
                                 strlen(prm->name) > NAME_MAX)))
        return hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm create: bad parameters (local rank %d of %d, "
                          "name '%s', timeout %d ms)",
                          prm ? prm->local_rank : -1, prm ? prm->local_size : -1,
                          prm && prm->name ? prm->name : "(null)", prm ? prm->timeout_ms : -1);
    hc_shm_t *s = NULL;
    HC_CHECK(shm_new(prm, &s), out);
    if (s->L > 1) {
        HC_CHECK(shm_join(s, prm), clean_shm);
        HC_INFO(HC_SHM, rank, "intra-node shm: local rank %d of %d attached %s (%zu bytes, "
                "%d slots of %zu bytes per rank)", s->lrank, s->L, s->name, s->seg_bytes,
                HC_SHM_NSLOTS, s->slot_bytes);
    }
    *out = &s->base;
    return HCOLL_SUCCESS;

clean_shm:
    hc_shm_free(s);
out:
    return st;
}

/* The note rides in each step's descriptor (shm.h), read where the
 * descriptors are checked: every step of every other rank is consumed. */
static void shm_note_set(hc_intra_t *ctx, uint32_t note)
{
    ((hc_shm_t *)ctx)->note_out = note;
}

static uint32_t shm_note_take(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    const uint32_t n = s->note_in;
    s->note_in = 0;
    return n;
}

const hc_intra_ops_t hc_intra_shm_ops = {
    .name = "shm",
    .create = hc_shm_create,
    .reduce_scatter = hc_shm_reduce_scatter,
    .reduce_scatter_blocks = hc_shm_reduce_scatter_blocks,
    .all_gather_blocks = hc_shm_all_gather_blocks,
    .all_gather = hc_shm_all_gather,
    .allreduce = hc_shm_allreduce,
    .agree = hc_shm_agree,
    .barrier = hc_shm_barrier,
    .abort = hc_shm_abort,
    .destroy = hc_shm_destroy,
    .beat = hc_shm_beat,
    .health = hc_shm_health,
    .alive = hc_shm_alive,
    .poison = hc_shm_poison_op,
    .scatter = hc_shm_scatter,
    .bcast = hc_shm_bcast,
    .note_set = shm_note_set,
    .note_take = shm_note_take,
};
