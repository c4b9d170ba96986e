/*
 * Lifecycle cycles on a 2 x 2 job (forked ranks, HCOLL_HOSTID nodes, TCP on
 * loopback), each rank measuring what it holds before and after:
 *   init_destroy   init, an all-reduce every tenth cycle, destroy
 *   split_destroy  split of a parent (by local rank: rail groups, ring; by
 *                  node: shared memory), an all-reduce every tenth, destroy
 *   abort_destroy  init, an all-reduce, then one rank (a different one each
 *                  cycle) aborts while the others wait for it in an
 *                  all-reduce: they must fail with an error, not hang, and
 *                  destroy; the next cycle starts afresh
 * None may leak: open fds and threads exactly as before, malloc's bytes in
 * use within 64 kB and RSS within 5 % (+ 1 MiB: a small process's noise)
 * of what they were after the first cycles (warm-up: lazily created
 * globals), and no hcoll shared-memory segment left in /dev/shm (one that
 * appeared during the test, still exists and is mapped by no process).
 * HCOLL_LIFECYCLE_CYCLES (default 100; `make soak` runs 1000) sets the
 * count of init/destroy and split/destroy cycles; abort cycles are a tenth
 * of it (at least 10).
 */
#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/ranks.h"
#include "soak_proc.h"

#define NRANKS 4
#define RPN 2
#define TIMEOUT_MS 30000
#define WARM 10
#define MAX_CYCLES 10000
#define HEAP_SLACK (64 << 10)
#define MAX_SHM 256

typedef struct lc_world {
    hct_barrier_t bar;
    int cycles;
    hct_id_slot_t slot[MAX_CYCLES + 1];
} lc_world_t;

static int cycles_from_env(void)
{
    const char *e = getenv("HCOLL_LIFECYCLE_CYCLES");
    int n = e ? atoi(e) : 100;
    return n < WARM + 1 ? WARM + 1 : n > MAX_CYCLES ? MAX_CYCLES : n;
}

static hcoll_config_t cfg_make(void)
{
    hcoll_config_t c = HCOLL_CONFIG_INITIALIZER;
    c.timeout_ms = TIMEOUT_MS;
    return c;
}

static int init_comm(lc_world_t *w, int slot, int rank, hcoll_comm_t *c)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = cfg_make();
    HCT_REQUIRE(hct_share_unique_id(&w->slot[slot], rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(c, NRANKS, rank, &id, &cfg));
    return 0;
}

/* Sum of (rank+1) * (i % 13 + 1) over the communicator's ranks, checked. */
static int allreduce_check(hcoll_comm_t c, int myval, int expect)
{
    int32_t v[1031];
    for (int i = 0; i < 1031; i++)
        v[i] = myval * (i % 13 + 1);
    HCT_OK(c, hcoll_allreduce(c, v, v, 1031, HCOLL_INT32, HCOLL_SUM, NULL));
    for (int i = 0; i < 1031; i++)
        HCT_REQUIRE(v[i] == expect * (i % 13 + 1), "element %d: %d", i, v[i]);
    return 0;
}

/* What this rank holds now against the warm-up sample; 0 when nothing grew. */
static int no_growth(int rank, const char *what, const hct_proc_t *a, int cycles)
{
    hct_proc_t b = hct_proc_settle(a->fds, a->threads);
    printf("rank %d %s: %d cycles: fds %d -> %d, threads %d -> %d, RSS %ld -> %ld kB, malloc "
           "in use %ld -> %ld B\n", rank, what, cycles, a->fds, b.fds, a->threads, b.threads,
           a->rss_kb, b.rss_kb, a->heap_bytes, b.heap_bytes);
    fflush(stdout);
    HCT_REQUIRE(b.fds == a->fds, "%s: fds %d -> %d", what, a->fds, b.fds);
    HCT_REQUIRE(b.threads == a->threads, "%s: threads %d -> %d", what, a->threads, b.threads);
    HCT_REQUIRE(b.heap_bytes <= a->heap_bytes + HEAP_SLACK, "%s: malloc in use %ld -> %ld B",
                what, a->heap_bytes, b.heap_bytes);
    HCT_REQUIRE(b.rss_kb <= a->rss_kb * 1.05 + 1024, "%s: RSS %ld -> %ld kB", what, a->rss_kb,
                b.rss_kb);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* /dev/shm                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct shm_names {
    int n;
    char name[MAX_SHM][96];
} shm_names_t;

static void shm_scan(shm_names_t *l)
{
    l->n = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) && l->n < MAX_SHM)
        if (strncmp(e->d_name, "hcoll-", 6) == 0)
            snprintf(l->name[l->n++], sizeof l->name[0], "%.90s", e->d_name);
    if (d)
        closedir(d);
}

static int shm_has(const shm_names_t *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->name[i], name) == 0)
            return 1;
    return 0;
}

/* Whether any process maps /dev/shm/NAME (another job's live segment). */
static int shm_mapped(const char *name)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    char path[300], line[512];
    int found = 0;
    while (!found && d && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/maps", e->d_name);
        FILE *f = fopen(path, "r");
        while (f && !found && fgets(line, sizeof line, f))
            found = strstr(line, name) != NULL;
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

/* A segment new since `before`, still there after 2 s, mapped by nobody. */
static const char *shm_leftover(const shm_names_t *before)
{
    static shm_names_t now;
    for (int tries = 0; tries < 20; tries++) {
        shm_scan(&now);
        int left = -1;
        for (int i = 0; i < now.n && left < 0; i++)
            if (!shm_has(before, now.name[i]) && !shm_mapped(now.name[i]))
                left = i;
        if (left < 0)
            return NULL;
        if (tries == 19)
            return now.name[left];
        usleep(100000);
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The cycles                                                                 */
/* ------------------------------------------------------------------------ */

static int rank_init_destroy(int rank, int nranks, void *arg)
{
    lc_world_t *w = arg;
    hct_proc_t warm = { 0 };
    (void)nranks;
    for (int it = 0; it < w->cycles; it++) {
        hcoll_comm_t c;
        if (it == WARM)
            warm = hct_proc_sample();
        if (init_comm(w, it, rank, &c))
            return 1;
        if (it % 10 == 0 && allreduce_check(c, rank + 1, 10))
            return 1;
        HCT_OK(c, hcoll_comm_destroy(c));
    }
    return no_growth(rank, "init/destroy", &warm, w->cycles - WARM);
}

static int rank_split_destroy(int rank, int nranks, void *arg)
{
    lc_world_t *w = arg;
    hcoll_comm_t p;
    hct_proc_t warm = { 0 };
    (void)nranks;
    if (init_comm(w, 0, rank, &p))
        return 1;
    for (int it = 0; it < w->cycles; it++) {
        hcoll_comm_t c;
        if (it == WARM)
            warm = hct_proc_sample();
        /* Odd cycles: by node (shared memory); even: by local rank (ring). */
        int color = it % 2 ? rank / RPN : rank % RPN;
        HCT_OK(p, hcoll_comm_split(p, color, 0, NULL, &c));
        if (it % 10 == 0) {
            int expect = it % 2 ? 2 * (rank / RPN) * RPN + 3 : 2 * (rank % RPN) + 4;
            if (allreduce_check(c, rank + 1, expect))
                return 1;
        }
        HCT_OK(c, hcoll_comm_destroy(c));
    }
    if (no_growth(rank, "split/destroy", &warm, w->cycles - WARM))
        return 1;
    HCT_OK(p, hcoll_comm_destroy(p));
    return 0;
}

/* One cycle: `victim` aborts while the others are in an all-reduce that
 * waits for it; they must fail (not hang), then destroy. */
static int abort_cycle(lc_world_t *w, int it, int rank, int victim)
{
    hcoll_comm_t c;
    if (init_comm(w, it, rank, &c) || allreduce_check(c, rank + 1, 10))
        return 1;
    /* Every rank has its result before the abort resets the connections
     * (the victim's last sends may otherwise still be in flight). */
    HCT_REQUIRE(hct_barrier_wait(&w->bar, NRANKS, TIMEOUT_MS) == 0, "barrier");
    if (rank == victim) {
        usleep(20000);
        HCT_OK(c, hcoll_comm_abort(c));
    } else {
        int32_t v[64] = { 0 };
        double t0 = hct_now_ms();
        hcoll_status_t st = hcoll_allreduce(c, v, v, 64, HCOLL_INT32, HCOLL_SUM, NULL);
        HCT_REQUIRE(st != HCOLL_SUCCESS, "cycle %d: all-reduce succeeded without rank %d", it,
                    victim);
        HCT_REQUIRE(hct_now_ms() - t0 < 10000, "cycle %d: failure took %.0f ms (%s)", it,
                    hct_now_ms() - t0, hcoll_status_name(st));
        HCT_OK(c, hcoll_comm_destroy(c));
    }
    /* Nobody starts the next cycle's init while a peer is still tearing down. */
    HCT_REQUIRE(hct_barrier_wait(&w->bar, NRANKS, TIMEOUT_MS) == 0, "barrier");
    return 0;
}

static int rank_abort_destroy(int rank, int nranks, void *arg)
{
    lc_world_t *w = arg;
    hct_proc_t warm = { 0 };
    const int n = w->cycles / 10 < WARM + 1 ? WARM + 1 : w->cycles / 10;
    for (int it = 0; it < n; it++) {
        if (it == 2)
            warm = hct_proc_sample();
        if (abort_cycle(w, it, rank, it % nranks))
            return 1;
    }
    return no_growth(rank, "abort/destroy", &warm, n - 2);
}

static void run_cycles(hct_rank_fn fn, const char *what)
{
    lc_world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->cycles = cycles_from_env();
    shm_names_t *before = malloc(sizeof *before);
    ck_assert_ptr_nonnull(before);
    shm_scan(before);
    hct_opts_t o = { .nranks = NRANKS, .ranks_per_node = RPN,
                     .timeout_ms = 60000 + w->cycles * 500 };
    hct_result_t res[NRANKS];
    double t0 = hct_now_ms();
    int bad = hct_run(&o, fn, w, res);
    printf("%s: %d cycles in %.1f s\n", what,
           fn == rank_abort_destroy ? (w->cycles / 10 < WARM + 1 ? WARM + 1 : w->cycles / 10)
                                    : w->cycles, (hct_now_ms() - t0) / 1e3);
    const char *left = shm_leftover(before);
    free(before);
    hct_shared_free(w, sizeof *w);
    ck_assert_msg(bad == 0, "%s: %d rank(s) failed", what, bad);
    ck_assert_msg(left == NULL, "%s: /dev/shm/%s left behind", what, left);
}

START_TEST(init_destroy_cycles) { run_cycles(rank_init_destroy, "init/destroy"); }
END_TEST
START_TEST(split_destroy_cycles) { run_cycles(rank_split_destroy, "split/destroy"); }
END_TEST
START_TEST(abort_destroy_cycles) { run_cycles(rank_abort_destroy, "abort/destroy"); }
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_RAIL");
    Suite *s = suite_create("lifecycle");
    TCase *tc = tcase_create("cycles");
    tcase_set_timeout(tc, 60 + cycles_from_env() * 2);
    tcase_add_test(tc, init_destroy_cycles);
    tcase_add_test(tc, split_destroy_cycles);
    tcase_add_test(tc, abort_destroy_cycles);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
