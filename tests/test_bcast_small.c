/*
 * The small broadcast (core/coll_bcast.c, inter/tree.c): a binomial tree
 * of whole messages across nodes on the root's rail, then the node's shm
 * bcast step; the chain above the crossover. End to end through forked
 * ranks in emulated nodes:
 *
 *   shape    plan     the tree among
 *   2x2      3stage   2 nodes, on the root's rail
 *   3x1      ring     3 ranks (no node step)
 *   3x2      3stage   3 nodes, two rails
 *   2,2,1    flat     5 ranks (unequal nodes: the flat fallback)
 *   1x3      intra    nobody (the node step alone)
 *
 * Every rank runs the same cases on communicators made with
 * HCOLL_ALGO=broadcast=tree, =chain, =auto (where a broadcast up to the
 * inline limit travels with the argument agreement), and tree with
 * HCOLL_CHECK_ARGS=0 (no agreement before each call: partners run ahead
 * and their messages land early, slots must be handed back): every root,
 * counts 0, 1, 7, 4093, at and just above the 256 KiB crossover (and
 * over one tree slot of 256 KiB under tree), dtypes of 1, 2, 4 and 8
 * bytes, in place and not. The root's bytes are a hash of (root, case,
 * index): every rank compares its recvbuf with them byte for byte, checks
 * that nothing past the end was written and that hcoll_comm_last_algo
 * names what should have run. Then: the same on communicators split from
 * 3x2 (one rank per node: the flat tree), a bad HCOLL_ALGO broadcast
 * value fails init with INVALID_ARG, unequal ones with MISMATCH.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"

#define MAX_RANKS 6
#define TIMEOUT_MS 30000
#define GUARD 32
#define CROSS_BYTES (256 << 10) /* core/algo.c's table: the tree up to 256 KiB */
#define SEG_BYTES (256 << 10)  /* the tree's slot under broadcast=tree */
#define BIG_BYTES (SEG_BYTES * 2 + 4099)
#define NCONF 4
#define INLINE_BYTES (64 << 10) /* core/algo.h's inline cap */

/* auto's link figures are given (alpha 1 ms, 1000 MB/s: rd beats the
 * ring at every size it may take), so its inline limit is the cap: every
 * case up to INLINE_BYTES travels with the agreement. */
static const struct {
    const char *algo, *check_args, *model, *name;
} confs[NCONF] = {
    { "broadcast=tree", "1", "probe", "tree" },
    { "broadcast=chain", "1", "probe", "chain" },
    { "auto", "1", "1000:1000", "auto" },
    { "broadcast=tree", "0", "probe", "tree-nocheck" },
};

static const hcoll_dtype_t dtypes[] = { HCOLL_UINT8, HCOLL_FLOAT16, HCOLL_FLOAT32, HCOLL_INT64 };
#define NDT ((int)(sizeof dtypes / sizeof dtypes[0]))

typedef struct shape {
    hct_id_slot_t slot[NCONF + 1];
    char name[16];
    int nranks, nnodes;
    int node_of[MAX_RANKS];
    int split;       /* run on communicators split by local rank instead */
} shape_t;

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return h;
}

/* The root's byte i of case ci: any bits (NaN patterns included). */
static unsigned char root_byte(int root, int ci, size_t i)
{
    return (unsigned char)mix((uint64_t)i * 1000003u + (uint64_t)root * 7919u +
                              (uint64_t)ci * 104729u + 1);
}

/* What a case's size says should run: tree, chain, or intra on one node;
 * under auto, up to the inline cap, the agreement's exchange (rd, or the
 * node step alone on one node). */
static const char *want_algo(const shape_t *s, int conf, size_t bytes, int nnodes)
{
    if (nnodes == 1 && !s->split)
        return "intra";
    if (conf == 2 && bytes > 0 && bytes <= INLINE_BYTES)
        return "rd";
    if (conf == 1)
        return "chain";
    if (conf == 2 && bytes > CROSS_BYTES)
        return "chain";
    return "tree";
}

/* One communicator's cases; *ci counts them across calls (the data). */
static int run_cases(const shape_t *s, hcoll_comm_t comm, int conf, int *ci,
                     unsigned char *send, unsigned char *recv)
{
    int rank, n, nnodes;
    HCT_OK(comm, hcoll_comm_rank(comm, &rank));
    HCT_OK(comm, hcoll_comm_size(comm, &n));
    HCT_OK(comm, hcoll_comm_node_count(comm, &nnodes));
    for (int d = 0; d < NDT; d++) {
        const hcoll_dtype_t dt = dtypes[d];
        const size_t es = hcoll_dtype_size(dt);
        size_t counts[8] = { 0, 1, 7, 4093, CROSS_BYTES / es, CROSS_BYTES / es + 1 };
        int nc = 6;
        if (conf == 0 || conf == 3)
            counts[nc++] = BIG_BYTES / es; /* segments: more than one slot */
        for (int j = 0; j < nc; j++)
            for (int root = 0; root < n; root++, (*ci)++) {
                const size_t count = counts[j], bytes = count * es;
                const int inplace = (*ci + root) & 1;
                unsigned char *dst = recv, *src = inplace ? recv : send;
                memset(recv, 0x5a, bytes + GUARD);
                if (rank == root)
                    for (size_t i = 0; i < bytes; i++)
                        src[i] = root_byte(root, *ci, i);
                hcoll_status_t st = hcoll_broadcast(comm, src, dst, count, dt, root, NULL);
                HCT_REQUIRE(st == HCOLL_SUCCESS, "%s %s rank %d: root %d %s count %zu: %s (%s)",
                            s->name, confs[conf].name, rank, root, hcoll_dtype_name(dt), count,
                            hcoll_status_name(st), hcoll_comm_last_error(comm));
                for (size_t i = 0; i < bytes; i++)
                    HCT_REQUIRE(dst[i] == root_byte(root, *ci, i),
                                "%s %s rank %d: root %d %s count %zu%s: byte %zu is %02x, want "
                                "%02x",
                                s->name, confs[conf].name, rank, root, hcoll_dtype_name(dt),
                                count, inplace ? " in place" : "", i, dst[i],
                                root_byte(root, *ci, i));
                for (size_t g = 0; g < GUARD; g++)
                    HCT_REQUIRE(recv[bytes + g] == 0x5a, "%s %s rank %d: wrote past the end",
                                s->name, confs[conf].name, rank);
                const char *name = NULL, *want = want_algo(s, conf, bytes, nnodes);
                HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
                HCT_REQUIRE(strcmp(name, want) == 0, "%s %s: %zu bytes ran '%s', want '%s'",
                            s->name, confs[conf].name, bytes, name, want);
            }
    }
    return 0;
}

static int rank_main(int rank, int nranks, void *arg)
{
    shape_t *s = arg;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-bsmall-%d-%s-node%d", (int)getppid(), s->name,
             s->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    unsigned char *send = malloc(BIG_BYTES + GUARD), *recv = malloc(BIG_BYTES + GUARD);
    HCT_REQUIRE(send && recv, "no memory");
    int ci = 0;
    for (int conf = 0; conf < NCONF; conf++) {
        setenv("HCOLL_ALGO", confs[conf].algo, 1);
        setenv("HCOLL_CHECK_ARGS", confs[conf].check_args, 1);
        setenv("HCOLL_ALGO_MODEL", confs[conf].model, 1);
        hcoll_unique_id_t id;
        hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
        cfg.timeout_ms = TIMEOUT_MS;
        HCT_REQUIRE(hct_share_unique_id(&s->slot[conf], rank, TIMEOUT_MS, &id) == 0, "no id");
        hcoll_comm_t comm, use;
        HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
        use = comm;
        if (s->split) {
            /* Local rank as the color: one rank per node in each. */
            int lr;
            HCT_OK(comm, hcoll_comm_local_rank(comm, &lr));
            HCT_OK(comm, hcoll_comm_split(comm, lr, rank, &cfg, &use));
        }
        if (run_cases(s, use, conf, &ci, send, recv)) {
            hcoll_comm_abort(use);
            if (use != comm)
                hcoll_comm_abort(comm);
            return 1;
        }
        if (use != comm)
            HCT_OK(use, hcoll_comm_destroy(use));
        HCT_OK(comm, hcoll_comm_destroy(comm));
    }
    free(send);
    free(recv);
    return 0;
}

static void run_shape(const char *name, const int *sizes, int nnodes, int split)
{
    shape_t *s = hct_shared_alloc(sizeof *s);
    ck_assert_ptr_nonnull(s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->nnodes = nnodes;
    s->split = split;
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < sizes[nd]; k++)
            s->node_of[s->nranks++] = nd;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = s->nranks, .timeout_ms = 240000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_main, s, res);
    fprintf(stderr, "[time] bcast_small shape %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "shape %s: %d rank(s) failed (see stderr)", name, bad);
    hct_shared_free(s, sizeof *s);
}

START_TEST(tree_2x2) { run_shape("2x2", (int[]){ 2, 2 }, 2, 0); }
END_TEST
START_TEST(tree_3x1) { run_shape("3x1", (int[]){ 1, 1, 1 }, 3, 0); }
END_TEST
START_TEST(tree_3x2) { run_shape("3x2", (int[]){ 2, 2, 2 }, 3, 0); }
END_TEST
START_TEST(tree_uneven) { run_shape("221", (int[]){ 2, 2, 1 }, 3, 0); }
END_TEST
START_TEST(tree_one_node) { run_shape("1x3", (int[]){ 3 }, 1, 0); }
END_TEST
START_TEST(tree_split) { run_shape("3x2split", (int[]){ 2, 2, 2 }, 3, 1); }
END_TEST

/* ------------------------------------------------------------------------ */
/* Bad and unequal HCOLL_ALGO broadcast values                                */
/* ------------------------------------------------------------------------ */

typedef struct bad_arg {
    hct_id_slot_t slot;
    const char *value[2]; /* for even and odd ranks */
    hcoll_status_t want;
    const char *text;     /* in the message */
} bad_arg_t;

static int rank_bad(int rank, int nranks, void *argp)
{
    bad_arg_t *b = argp;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-bsmall-bad-%d-node%d", (int)getppid(), rank / 2);
    setenv("HCOLL_HOSTID", hostid, 1);
    setenv("HCOLL_ALGO", b->value[rank & 1], 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    HCT_REQUIRE(hct_share_unique_id(&b->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    hcoll_comm_t comm = NULL;
    hcoll_status_t st = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    const char *msg = hcoll_comm_last_error(NULL);
    HCT_REQUIRE(st == b->want, "HCOLL_ALGO=%s: init -> %s, want %s", b->value[rank & 1],
                hcoll_status_name(st), hcoll_status_name(b->want));
    HCT_REQUIRE(msg && strstr(msg, b->text), "HCOLL_ALGO=%s: message '%s'", b->value[rank & 1],
                msg ? msg : "(none)");
    return 0;
}

static void run_bad(const char *even, const char *odd, hcoll_status_t want, const char *text)
{
    bad_arg_t *b = hct_shared_alloc(sizeof *b);
    ck_assert_ptr_nonnull(b);
    b->value[0] = even;
    b->value[1] = odd;
    b->want = want;
    b->text = text;
    hct_opts_t o = { .nranks = 4, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_bad, b, res);
    ck_assert_msg(bad == 0, "HCOLL_ALGO=%s/%s: %d rank(s) failed", even, odd, bad);
    hct_shared_free(b, sizeof *b);
}

START_TEST(bad_value)
{
    run_bad("broadcast=fast", "broadcast=fast", HCOLL_ERR_INVALID_ARG,
            "bad broadcast algorithm 'fast'");
    run_bad("broadcast=tree:12Q", "broadcast=tree:12Q", HCOLL_ERR_INVALID_ARG,
            "bad broadcast algorithm");
    run_bad("broadcast=rd", "broadcast=rd", HCOLL_ERR_INVALID_ARG, "bad broadcast algorithm");
}
END_TEST

START_TEST(unequal_values)
{
    run_bad("broadcast=tree", "broadcast=chain", HCOLL_ERR_MISMATCH, "broadcast limit");
    run_bad("broadcast=tree:4K", "broadcast=tree:8K", HCOLL_ERR_MISMATCH, "broadcast limit");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bcast_small");
    TCase *t = tcase_create("tree");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, tree_2x2);
    tcase_add_test(t, tree_3x1);
    tcase_add_test(t, tree_3x2);
    tcase_add_test(t, tree_uneven);
    tcase_add_test(t, tree_one_node);
    tcase_add_test(t, tree_split);
    suite_add_tcase(s, t);
    TCase *b = tcase_create("knob");
    tcase_set_timeout(b, 120);
    tcase_add_test(b, bad_value);
    tcase_add_test(b, unequal_values);
    suite_add_tcase(s, b);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
