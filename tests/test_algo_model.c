/*
 * The all-reduce's cost model (core/algo_model.c): rd's critical path,
 * the crossovers it computes for given latencies, bandwidths and layouts
 * (checked against the costs worked out by hand here), HCOLL_ALGO_MODEL's
 * parsing; then end to end on 2 emulated nodes x 2 ranks: the given
 * model's choice is what runs (hcoll_comm_last_algo) and sums right (the
 * inline split included),
 * HCOLL_ALGO still overrides it, the probe chooses rd for 4 KiB, and bad
 * or unequal HCOLL_ALGO_MODEL values fail init.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "core/algo.h"

#define TIMEOUT_MS 30000
#define RD_CAP (256u << 10)

static hc_algo_model_t given(double a, double b)
{
    hc_algo_model_t m = { .mode = HC_MODEL_GIVEN, .alpha_us = a, .beta = b };
    return m;
}

START_TEST(steps)
{
    static const int want[9] = { 0, 0, 1, 3, 2, 4, 4, 4, 3 }; /* N = 0..8 */
    for (int n = 1; n <= 8; n++)
        ck_assert_int_eq(hc_algo_model_steps(n), want[n]);
}
END_TEST

/* 3 x 2 at 500 Mbit/s (62.5 MB/s), alpha 60 us, the agreement inline up
 * to 64 KiB, the fused ring up to 32 KiB: rd 3a + 3S/b against the ring
 * 3a (agreement) + 4a + 4S/(3b): rd up to S = 2.4 a b = 9000 bytes. */
START_TEST(cluster_3x2)
{
    const hc_algo_model_t m = given(60, 62.5);
    const hc_algo_layout_t l = { .nnodes = 3, .rails = 2, .small_bytes = 32 << 10,
                                 .check_args = 1, .inline_cap = 64 << 10 };
    uint64_t rd_max;
    size_t inl;
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 8960); /* 9000 down to a multiple of 64 */
    ck_assert_uint_eq(inl, 8960);
    ck_assert(hc_algo_cost_rd(&m, &l, 8960) <= hc_algo_cost_ring(&m, &l, 8960));
    ck_assert(hc_algo_cost_rd(&m, &l, 9024) > hc_algo_cost_ring(&m, &l, 9024));
    /* 4 KiB by rd, 64 KiB by the ring, as measured on the cluster. */
    ck_assert(hc_algo_cost_rd(&m, &l, 4096) < hc_algo_cost_ring(&m, &l, 4096));
    ck_assert(hc_algo_cost_rd(&m, &l, 65536) > hc_algo_cost_ring(&m, &l, 65536));
}
END_TEST

/* 4 x 2 at 1 Gbit/s (125 MB/s). alpha 100: above the fused ring's 32 KiB
 * rd 2a + 2S/b against 8a + 0.75 S/b: up to 4.8 a b = 60000 bytes. alpha
 * 210: past the inline limit, rd 4a + 2S/b against 8a + 0.75 S/b: up to
 * 3.2 a b = 84000 bytes; inline up to its 64 KiB. */
START_TEST(cluster_4x2)
{
    const hc_algo_layout_t l = { .nnodes = 4, .rails = 2, .small_bytes = 32 << 10,
                                 .check_args = 1, .inline_cap = 64 << 10 };
    uint64_t rd_max;
    size_t inl;
    hc_algo_model_t m = given(100, 125);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 59968);
    ck_assert_uint_eq(inl, 59968);
    m = given(210, 125);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 83968);
    ck_assert_uint_eq(inl, 64 << 10);
    /* A probed node step of 50 us: the ring pays the agreement's (fused)
     * and the three stages' second; rd past the inline limit the
     * agreement's. alpha 100: 200 + 2S/b against 900 + 0.75 S/b up to the
     * inline limit, then 450 + 2S/b: rd up to the 64 KiB cap. */
    const hc_algo_model_t m0 = given(100, 125);
    m = m0;
    m.node_us = 50;
    ck_assert_double_eq_tol(hc_algo_cost_ring(&m, &l, 4096) - hc_algo_cost_ring(&m0, &l, 4096),
                            50, 1e-6);
    ck_assert_double_eq_tol(hc_algo_cost_ring(&m, &l, 65536) - hc_algo_cost_ring(&m0, &l, 65536),
                            100, 1e-6);
    ck_assert_double_eq_tol(hc_algo_cost_rd(&m, &l, 65536), hc_algo_cost_rd(&m0, &l, 65536), 1e-6);
    ck_assert_double_eq_tol(hc_algo_cost_rd(&m, &l, 65600) - hc_algo_cost_rd(&m0, &l, 65600), 50,
                            1e-6);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 64 << 10);
}
END_TEST

/* The same 4 x 2, with the split priced: inline vectors from split_from
 * cost 2a + S/b + 2 (a + node step) by rd, where the whole vector cost
 * 2a + 2S/b. alpha 100, no node step: the split limit is 2 (100) 125 =
 * 25000 bytes (hc_algo_model_inline_split: 25024), and split rd 4a + S/b
 * beats the ring's 8a + 0.75 S/b up to 4ab = 50000 bytes... past the
 * inline limit, where rd is whole again: rd up to the 64 KiB the
 * whole-vector model stopped short of (59968, above). alpha 20, the fused
 * ring up to 4 KiB: the split (from 5056) costs 4a + S/b against 8a +
 * 0.75 S/b and loses from 16ab = 40000 bytes on, inside its piece; whole
 * rd alone had lost from 12000 (2a + 2S/b against 8a + 0.75 S/b). */
START_TEST(cluster_4x2_split)
{
    hc_algo_layout_t l = { .nnodes = 4, .rails = 2, .small_bytes = 32 << 10,
                           .check_args = 1, .inline_cap = 64 << 10 };
    uint64_t rd_max;
    size_t inl;
    hc_algo_model_t m = given(100, 125);
    l.split_from = hc_algo_model_inline_split(&m, &l);
    ck_assert_uint_eq(l.split_from, 25024);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 64 << 10);
    ck_assert_uint_eq(inl, 64 << 10);
    m = given(20, 125);
    l.small_bytes = 4 << 10;
    l.split_from = hc_algo_model_inline_split(&m, &l);
    ck_assert_uint_eq(l.split_from, 5056); /* 5000 */
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, 40000);
    ck_assert_uint_eq(inl, 40000);
    ck_assert(hc_algo_cost_rd(&m, &l, 40064) > hc_algo_cost_ring(&m, &l, 40064));
    /* Never split (0, past the inline cap, SIZE_MAX as init passes it):
     * the whole vector's crossing. */
    static const size_t never[] = { 0, (64 << 10) + 64, SIZE_MAX };
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) {
        l.split_from = never[i];
        hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
        ck_assert_uint_eq(rd_max, 11968);
    }
}
END_TEST

/* The broadcast travels with the agreement as one rd of its bytes up to
 * where that stops beating the tree after the agreement. 3 x 2 at 500
 * Mbit/s, alpha 60: the tree (depth 2) 3a + 2a + 2S/b against rd's 3a +
 * 3S/b: up to 2ab = 7500 bytes. On 4 nodes the tree is as deep as rd's
 * rounds: up to the cap; and on fast links. */
START_TEST(inline_limits)
{
    hc_algo_layout_t l = { .nnodes = 3, .rails = 2, .small_bytes = 32 << 10, .check_args = 1,
                           .inline_cap = 64 << 10 };
    hc_algo_model_t m = given(60, 62.5);
    ck_assert_uint_eq(hc_algo_model_inline_bcast(&m, &l, 8960), 7488); /* 7500 to 64s */
    ck_assert_uint_eq(hc_algo_model_inline_bcast(&m, &l, 2048), 2048); /* never above the cap */
    l.nnodes = 4;
    ck_assert_uint_eq(hc_algo_model_inline_bcast(&m, &l, 65536), 65536);
    l.nnodes = 3;
    m = given(50, 1e6);
    ck_assert_uint_eq(hc_algo_model_inline_bcast(&m, &l, 65536), 65536);
}
END_TEST

/* The split's limit, worked out by hand: 2 (alpha + node step) beta L /
 * (steps (L - 1)), rounded up to 64 bytes. */
START_TEST(split_limit)
{
    hc_algo_layout_t l = { .nnodes = 4, .rails = 2 };
    hc_algo_model_t m = given(250, 100);
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), 50048); /* 50000, 2 steps */
    m.node_us = 50;
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), 60032); /* 60000 */
    m.node_us = 0;
    l.nnodes = 3; /* a fold: 3 steps */
    m = given(100, 68);
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), 9088); /* 9066.7 */
    l = (hc_algo_layout_t){ .nnodes = 2, .rails = 3 };
    m = given(10, 100);
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), 3008); /* 3000 */
    m = given(0.1, 1); /* 0.3 bytes: never under one cache line */
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), 64);
    l.rails = 1; /* one rail: nothing to split */
    ck_assert_uint_eq(hc_algo_model_inline_split(&m, &l), SIZE_MAX);
}
END_TEST

/* No bandwidth cost (loopback's memcpy speed): rd up to its slot; and
 * without the agreement on 2 x 1 rd has fewer messages at every size. */
START_TEST(fast_links)
{
    hc_algo_layout_t l = { .nnodes = 2, .rails = 2, .small_bytes = 32 << 10, .check_args = 1,
                           .inline_cap = 64 << 10 };
    uint64_t rd_max;
    size_t inl;
    hc_algo_model_t m = given(50, 1e6);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, RD_CAP);
    ck_assert_uint_eq(inl, 64 << 10);
    l = (hc_algo_layout_t){ .nnodes = 2, .rails = 1 };
    m = given(50, 100);
    hc_algo_model_choose(&m, &l, RD_CAP, &rd_max, &inl);
    ck_assert_uint_eq(rd_max, RD_CAP);
    ck_assert_uint_eq(inl, 0);
}
END_TEST

START_TEST(parse)
{
    hc_algo_model_t m;
    ck_assert_int_eq(hc_algo_model_parse("probe", &m), 0);
    ck_assert_int_eq(m.mode, HC_MODEL_PROBE);
    ck_assert_int_eq(hc_algo_model_parse("TABLE", &m), 0);
    ck_assert_int_eq(m.mode, HC_MODEL_TABLE);
    ck_assert_int_eq(hc_algo_model_parse("50:117.5", &m), 0);
    ck_assert_int_eq(m.mode, HC_MODEL_GIVEN);
    ck_assert(m.alpha_us == 50 && m.beta == 117.5);
    static const char *const bad[] = { "50", "x:1", "50:0", "50:abc", "-1:5", "fast", "50:1:2" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(hc_algo_model_parse(bad[i], &m) != 0, "'%s' accepted", bad[i]);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* End to end: 2 emulated nodes x 2 ranks on loopback                        */
/* ------------------------------------------------------------------------ */

typedef struct run {
    hct_id_slot_t slot;
    const char *model[2]; /* HCOLL_ALGO_MODEL for even and odd ranks */
    const char *algo;     /* HCOLL_ALGO */
    hcoll_status_t want_init;
    const char *text;     /* in init's message when it fails */
    size_t sizes[2];      /* bytes of two all-reduces... */
    const char *want[2];  /* ...and what hcoll_comm_last_algo must say */
    int bcast;            /* then a broadcast of each size from rank 1, the same */
} run_t;

static int rank_run(int rank, int nranks, void *argp)
{
    run_t *r = argp;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-model-%d-node%d", (int)getppid(), rank / 2);
    setenv("HCOLL_HOSTID", hostid, 1);
    setenv("HCOLL_ALGO_MODEL", r->model[rank & 1], 1);
    setenv("HCOLL_ALGO", r->algo, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    HCT_REQUIRE(hct_share_unique_id(&r->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    hcoll_comm_t comm = NULL;
    hcoll_status_t st = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    if (r->want_init != HCOLL_SUCCESS) {
        const char *msg = hcoll_comm_last_error(NULL);
        HCT_REQUIRE(st == r->want_init, "init -> %s, want %s", hcoll_status_name(st),
                    hcoll_status_name(r->want_init));
        HCT_REQUIRE(msg && strstr(msg, r->text), "message '%s'", msg ? msg : "(none)");
        return 0;
    }
    HCT_OK(NULL, st);
    for (int k = 0; k < 2; k++) {
        const size_t n = r->sizes[k] / 4;
        float *v = malloc(r->sizes[k]);
        HCT_REQUIRE(v, "no memory");
        for (size_t i = 0; i < n; i++)
            v[i] = (float)(rank + 1) * (float)(i % 7);
        HCT_OK(comm, hcoll_allreduce(comm, v, v, n, HCOLL_FLOAT32, HCOLL_SUM, NULL));
        for (size_t i = 0; i < n; i++)
            HCT_REQUIRE(v[i] == 10.0f * (float)(i % 7), "%zu bytes: [%zu] = %g", r->sizes[k], i,
                        (double)v[i]);
        free(v);
        const char *name = NULL;
        HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
        HCT_REQUIRE(name && strcmp(name, r->want[k]) == 0, "%s, %s: %zu bytes ran '%s', want %s",
                    r->model[rank & 1], r->algo, r->sizes[k], name ? name : "(none)",
                    r->want[k]);
        if (!r->bcast)
            continue;
        unsigned char *b = malloc(r->sizes[k]);
        HCT_REQUIRE(b, "no memory");
        for (size_t i = 0; i < r->sizes[k]; i++)
            b[i] = (unsigned char)(rank == 1 ? i * 37 + 11 : 0xee);
        HCT_OK(comm, hcoll_broadcast(comm, b, b, r->sizes[k], HCOLL_UINT8, 1, NULL));
        for (size_t i = 0; i < r->sizes[k]; i++)
            HCT_REQUIRE(b[i] == (unsigned char)(i * 37 + 11), "broadcast of %zu bytes: [%zu] = %u",
                        r->sizes[k], i, b[i]);
        free(b);
        HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
        HCT_REQUIRE(name && strcmp(name, r->want[k]) == 0, "%s: a broadcast of %zu bytes ran '%s', "
                    "want %s", r->model[rank & 1], r->sizes[k], name ? name : "(none)", r->want[k]);
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run(const run_t *spec)
{
    run_t *r = hct_shared_alloc(sizeof *r);
    ck_assert_ptr_nonnull(r);
    *r = *spec;
    hct_opts_t o = { .nranks = 4, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_run, r, res);
    ck_assert_msg(bad == 0, "HCOLL_ALGO_MODEL=%s/%s HCOLL_ALGO=%s: %d rank(s) failed",
                  spec->model[0], spec->model[1], spec->algo, bad);
    hct_shared_free(r, sizeof *r);
}

/* 2 x 2, alpha 100 us, 50 MB/s: rd a + S/b against the ring's 3a + S/b
 * (fused, up to 32 KiB) or 3a + S/(2b). Split (from 20032 bytes) rd costs
 * 3a + S/(2b), what the ring costs on two nodes, and a tie goes to rd: rd
 * up to the inline 64 KiB; past it the agreement goes first and whole rd
 * costs 2a + S/b, more than the ring from 2ab = 10000 bytes. So 4 KiB rd
 * and 128 KiB the (three-stage) ring. */
START_TEST(given_runs)
{
    run(&(run_t){ .model = { "100:50", "100:50" }, .algo = "auto",
                  .sizes = { 4096, 131072 }, .want = { "rd", "ring" } });
}
END_TEST

/* Slow given links (1 us, 10 MB/s): 32 bytes go whole, 1 KiB split (from
 * 2 * 1 * 10 * 2 / 1 = 40, so 64 bytes); the sums are right either way,
 * and a broadcast of each size (its inline limit is the cap here) runs
 * the same and delivers the root's bytes. */
START_TEST(split_runs)
{
    run(&(run_t){ .model = { "1:10", "1:10" }, .algo = "auto",
                  .sizes = { 32, 1024 }, .want = { "rd", "rd-split" }, .bcast = 1 });
}
END_TEST

START_TEST(override_wins)
{
    run(&(run_t){ .model = { "100:50", "100:50" }, .algo = "rd",
                  .sizes = { 4096, 65536 }, .want = { "rd", "rd" } });
    run(&(run_t){ .model = { "100:50", "100:50" }, .algo = "ring",
                  .sizes = { 4096, 65536 }, .want = { "fused-ring", "ring" } });
}
END_TEST

/* The probe on loopback: 4 KiB costs rd one message against the ring's
 * three, whatever the figures. */
START_TEST(probe_runs)
{
    run(&(run_t){ .model = { "probe", "probe" }, .algo = "auto",
                  .sizes = { 4096, 4096 }, .want = { "rd", "rd" } });
}
END_TEST

START_TEST(bad_values)
{
    run(&(run_t){ .model = { "fast", "fast" }, .algo = "auto",
                  .want_init = HCOLL_ERR_INVALID_ARG, .text = "HCOLL_ALGO_MODEL: bad value 'fast'" });
    run(&(run_t){ .model = { "probe", "table" }, .algo = "auto",
                  .want_init = HCOLL_ERR_MISMATCH, .text = "HCOLL_ALGO_MODEL" });
    run(&(run_t){ .model = { "100:50", "100:60" }, .algo = "auto",
                  .want_init = HCOLL_ERR_MISMATCH, .text = "HCOLL_ALGO_MODEL" });
}
END_TEST

int main(void)
{
    Suite *s = suite_create("algo_model");
    TCase *t = tcase_create("model");
    tcase_add_test(t, steps);
    tcase_add_test(t, cluster_3x2);
    tcase_add_test(t, cluster_4x2);
    tcase_add_test(t, cluster_4x2_split);
    tcase_add_test(t, inline_limits);
    tcase_add_test(t, split_limit);
    tcase_add_test(t, fast_links);
    tcase_add_test(t, parse);
    suite_add_tcase(s, t);
    TCase *e = tcase_create("end to end");
    tcase_set_timeout(e, 120);
    tcase_add_test(e, given_runs);
    tcase_add_test(e, split_runs);
    tcase_add_test(e, override_wins);
    tcase_add_test(e, probe_runs);
    tcase_add_test(e, bad_values);
    suite_add_tcase(s, e);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
