/* hcoll_plan's arithmetic and flags: the README's worked example (4 GB
 * per rank, 100 ms backward, 64 ranks, busbw 180 vs 40 GB/s), the verdict
 * boundaries, the bucket rule. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lib/perf.h"

static hp_plan_out_t plan_b(double bytes, double back_s, int nodes, int rpn, double busbw,
                            double lat_s, double bucket)
{
    hp_plan_in_t in = { bytes, back_s, nodes, rpn, busbw, lat_s, bucket };
    hp_plan_out_t out;
    ck_assert_int_eq(hp_plan_compute(&in, &out), 0);
    return out;
}

static hp_plan_out_t plan(double bytes, double back_s, int nodes, int rpn, double busbw,
                          double lat_s)
{
    return plan_b(bytes, back_s, nodes, rpn, busbw, lat_s, 0);
}

/* The overlap model step by step: bucket i is full at b x (bytes up to its
 * end) / S, and its all-reduce starts then or when bucket i-1's ends. */
static double simulate_exposed(const hp_plan_out_t *o, double bytes, double back_s, double busbw)
{
    double done = 0, filled = 0;
    for (uint64_t i = 0; i < o->nbuckets; i++) {
        double b = fmin((double)o->bucket_bytes, bytes - filled);
        filled += b;
        double ready = back_s * filled / bytes;
        done = fmax(done, ready) + o->latency_s + b * o->factor / busbw;
    }
    return fmax(0, done - back_s);
}

START_TEST(worked_example)
{
    /* 180 GB/s: t = 4e9 · 126/64 / 180e9 = 43.75 ms, hidden. */
    hp_plan_out_t a = plan(4e9, 0.1, 8, 8, 180e9, 0);
    ck_assert_int_eq(a.nranks, 64);
    ck_assert_double_eq_tol(a.factor, 126.0 / 64, 1e-12);
    ck_assert_double_eq_tol(a.t_s, 0.04375, 1e-9);
    ck_assert_double_eq_tol(a.naive_t_s, 4e9 / 180e9, 1e-12);
    ck_assert_double_eq_tol(a.bw_exposed_s, 0, 1e-12);
    ck_assert_int_eq(a.verdict, HP_PLAN_HIDDEN);
    /* ...but for its last bucket: 30 of 128 MiB, the last 107685888 bytes,
     * 80 us + 107685888 x 126/64 / 180e9 = 1.2578 ms, starting when
     * backward ends. */
    ck_assert_uint_eq(a.bucket_bytes, 128u << 20);
    ck_assert_uint_eq(a.nbuckets, 30);
    ck_assert_double_eq_tol(a.last_bucket_s, 80e-6 + 107685888.0 * 126 / 64 / 180e9, 1e-12);
    ck_assert_double_eq_tol(a.exposed_s, a.last_bucket_s, 1e-12);
    /* busbw to hide it: S · factor / backward = 78.75 GB/s */
    ck_assert_double_eq_tol(a.busbw_needed, 78.75e9, 1e3);

    /* 40 GB/s: t = 196.875 ms, 96.875 ms exposed; S/busbw would say exactly
     * 100 ms ("just hidden") — the mistake the 2(n-1)/n avoids. */
    hp_plan_out_t b = plan(4e9, 0.1, 8, 8, 40e9, 0);
    ck_assert_double_eq_tol(b.t_s, 0.196875, 1e-9);
    ck_assert_double_eq_tol(b.bw_exposed_s, 0.096875, 1e-9);
    /* With 239 buckets of 16 MiB, each paying 80 us: the all-reduce falls
     * behind backward and ends 116.4 ms after it. */
    ck_assert_uint_eq(b.bucket_bytes, 16u << 20);
    ck_assert_double_eq_tol(b.exposed_s, simulate_exposed(&b, 4e9, 0.1, 40e9), 1e-9);
    ck_assert(b.exposed_s > 0.1164 && b.exposed_s < 0.1165);
    ck_assert_double_eq_tol(b.naive_t_s, 0.1, 1e-12);
    ck_assert_int_eq(b.verdict, HP_PLAN_EXPOSED);
    ck_assert_double_eq_tol(b.busbw_needed, 78.75e9, 1e3);
    /* The node split does not change t, only the default latency. */
    hp_plan_out_t c = plan(4e9, 0.1, 64, 1, 40e9, 0);
    ck_assert_double_eq_tol(c.t_s, b.t_s, 1e-12);
}
END_TEST

START_TEST(verdict_boundaries)
{
    /* n = 2 (factor 1), 10 buckets of 1 MB over a 10 ms backward: one is
     * full every 1 ms. Latency 1 ps, so a bucket takes c = 1e6 / busbw. */
    const double S = 10e6, B = 1e6, b = 0.010, lat = 1e-12;
    /* c = 0.5 ms: it keeps pace; only the last bucket is exposed. */
    hp_plan_out_t h = plan_b(S, b, 2, 1, 2e9, lat, B);
    ck_assert_int_eq(h.verdict, HP_PLAN_HIDDEN);
    ck_assert_double_eq_tol(h.exposed_s, 0.5e-3, 1e-11);
    /* c = 1 ms: exactly keeps pace, still hidden. */
    ck_assert_int_eq(plan_b(S, b, 2, 1, 1e9, lat, B).verdict, HP_PLAN_HIDDEN);
    /* Behind: the last ends at 1 ms + 10 c; beyond the tail is 9 (c - 1 ms),
     * partly exposed up to 0.25 x 10 ms, so c <= 1.2778 ms. */
    hp_plan_out_t p = plan_b(S, b, 2, 1, 1e6 / 1.27e-3, lat, B);
    ck_assert_int_eq(p.verdict, HP_PLAN_PARTLY_EXPOSED);
    ck_assert_double_eq_tol(p.exposed_s, 1e-3 + 10 * 1.27e-3 - b, 1e-9);
    ck_assert_int_eq(plan_b(S, b, 2, 1, 1e6 / 1.29e-3, lat, B).verdict, HP_PLAN_EXPOSED);
    /* t <= backward is no longer enough: t = 9.6 ms with 1 ms buckets of
     * 0.96 ms each plus 100 us latency falls behind. */
    hp_plan_out_t l = plan_b(S, b, 2, 1, 1e6 / 0.96e-3, 100e-6, B);
    ck_assert(l.t_s < b);
    ck_assert_int_eq(l.verdict, HP_PLAN_PARTLY_EXPOSED);
    /* One bucket: nothing overlaps, all of it is exposed and judged. */
    hp_plan_out_t one_b = plan_b(S, b, 2, 1, 2e9, lat, 2 * S);
    ck_assert_uint_eq(one_b.nbuckets, 1);
    ck_assert_uint_eq(one_b.bucket_bytes, (uint64_t)S);
    ck_assert_double_eq_tol(one_b.exposed_s, 5e-3, 1e-11);
    ck_assert_int_eq(one_b.verdict, HP_PLAN_EXPOSED); /* 5 ms > 2.5 ms */
    ck_assert_int_eq(plan_b(S, 0.1, 2, 1, 2e9, lat, 2 * S).verdict, HP_PLAN_PARTLY_EXPOSED);
    /* No backward: nothing overlaps. */
    ck_assert_int_eq(plan(1e9, 0.0, 2, 1, 1e9, 0).verdict, HP_PLAN_EXPOSED);
    ck_assert(isinf(plan(1e9, 0.0, 2, 1, 1e9, 0).busbw_needed));
    /* One rank: nothing to move, no latency. */
    hp_plan_out_t one = plan(1e9, 0.1, 1, 1, 1e9, 0);
    ck_assert_double_eq_tol(one.t_s, 0, 1e-12);
    ck_assert_double_eq_tol(one.exposed_s, 0, 1e-12);
    ck_assert_int_eq(one.verdict, HP_PLAN_HIDDEN);
    hp_plan_in_t bad = { 0, 0.1, 2, 2, 1e9, 0, 0 };
    hp_plan_out_t out;
    ck_assert_int_eq(hp_plan_compute(&bad, &out), -1);
    bad.bytes = 1e9, bad.busbw = 0;
    ck_assert_int_eq(hp_plan_compute(&bad, &out), -1);
    bad.busbw = 1e9, bad.bucket_bytes = -1;
    ck_assert_int_eq(hp_plan_compute(&bad, &out), -1);
    ck_assert_str_eq(hp_plan_verdict_name(HP_PLAN_PARTLY_EXPOSED), "partly exposed");
}
END_TEST

START_TEST(last_bucket_always_exposed)
{
    /* The closed form against the step-by-step schedule, over sizes that
     * leave a short last bucket or none, fast and slow networks, short and
     * long backward passes: equal, and never below the last bucket. */
    const double sizes[] = { 1e6, 4.5e6, 8 << 20, 1e9 + 7 };
    const double backs[] = { 0, 1e-3, 0.05, 2.0 };
    const double rates[] = { 1e8, 5e9, 200e9 };
    const double buckets[] = { 0, 1 << 20, 3e6 };
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++)
            for (size_t k = 0; k < 3; k++)
                for (size_t m = 0; m < 3; m++) {
                    hp_plan_out_t o = plan_b(sizes[i], backs[j], 2, 2, rates[k], 20e-6, buckets[m]);
                    double want = simulate_exposed(&o, sizes[i], backs[j], rates[k]);
                    ck_assert_msg(fabs(o.exposed_s - want) <= 1e-9 * want + 1e-15,
                                  "S %g b %g busbw %g bucket %g: %g, schedule says %g", sizes[i],
                                  backs[j], rates[k], buckets[m], o.exposed_s, want);
                    ck_assert(o.exposed_s >= o.last_bucket_s - 1e-14); /* (b + c) - b rounds */
                    ck_assert(o.last_bucket_s > 0);
                    if (buckets[m] > 0 && buckets[m] < sizes[i])
                        ck_assert_uint_eq(o.bucket_bytes, (uint64_t)buckets[m]);
                }
}
END_TEST

START_TEST(bucket_rule)
{
    /* latency 100 us, busbw 100 GB/s, n = 64: transfer(B) >= 1 ms needs
     * B >= 1e-3 · 100e9 / (126/64) = 50.8 MB -> 64 MiB. */
    hp_plan_out_t o = plan(4e9, 0.1, 8, 8, 100e9, 100e-6);
    ck_assert_uint_eq(o.bucket_bytes, 64u << 20);
    ck_assert_uint_eq(o.nbuckets, (uint64_t)ceil(4e9 / (64 << 20)));
    double transfer = (double)o.bucket_bytes * o.factor / 100e9;
    ck_assert(transfer >= HP_PLAN_LAT_RATIO * 100e-6);
    ck_assert(transfer / 2 < HP_PLAN_LAT_RATIO * 100e-6); /* the smallest such power of 2 */
    ck_assert_double_eq_tol(o.bucket_t_s, 100e-6 + transfer, 1e-12);
    /* Default latency: 5 us per step, 2(N-1) inter + 2 intra. */
    hp_plan_out_t d = plan(4e9, 0.1, 8, 8, 100e9, 0);
    ck_assert_double_eq_tol(d.latency_s, 16 * 5e-6, 1e-12);
    /* Never above the gradients themselves, never below 1 MiB. */
    ck_assert_uint_eq(plan(3e6, 0.1, 8, 8, 100e9, 1e-3).bucket_bytes, 3000000);
    ck_assert_uint_eq(plan(4e9, 0.1, 2, 1, 1e6, 1e-9).bucket_bytes, 1u << 20);
}
END_TEST

START_TEST(line_rate_to_busbw)
{
    /* 8 x 8 ranks on 50 GB/s NICs at 80 %: 40 GB/s per NIC x 63/7. */
    ck_assert_double_eq_tol(hp_busbw_from_nic(40, 8, 8), 360, 1e-9);
    ck_assert_double_eq_tol(hp_busbw_from_nic(40, 1, 8), 0, 1e-12);
}
END_TEST

static int parse(hp_plan_opts_t *o, char *err, const char *a0, ...)
{
    char *argv[40];
    int argc = 0;
    argv[argc++] = "hcoll_plan";
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 39; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    hp_plan_opts_default(o);
    return hp_plan_opts_parse(argc, argv, o, err, 300);
}

#define BASE "-s", "4GB", "-t", "100ms", "-N", "8", "-L", "8"

START_TEST(flags)
{
    hp_plan_opts_t o;
    char err[300];
    ck_assert_msg(parse(&o, err, BASE, "--busbw", "180,40", NULL) == 0, "%s", err);
    ck_assert_double_eq_tol(o.bytes, 4e9, 1);
    ck_assert_double_eq_tol(o.backward_s, 0.1, 1e-12);
    ck_assert_int_eq(o.nbusbw, 2);
    ck_assert_double_eq_tol(o.busbw[0], 180e9, 1);
    ck_assert_double_eq_tol(o.busbw[1], 40e9, 1);
    ck_assert_int_eq(parse(&o, err, "--bytes=4GiB", "--backward", "0.1s", "--nodes", "2",
                           "--ranks-per-node=4", "-B", "25GB/s", "--latency", "50us", NULL), 0);
    ck_assert_double_eq_tol(o.bytes, 4294967296.0, 1);
    ck_assert_double_eq_tol(o.busbw[0], 25e9, 1);
    ck_assert_double_eq_tol(o.latency_s, 50e-6, 1e-12);
    ck_assert_int_eq(parse(&o, err, BASE, "--line-rate", "400Gbps", "--efficiency", "80%", NULL),
                     0);
    ck_assert_double_eq_tol(o.efficiency, 0.8, 1e-12);
    ck_assert_int_eq(parse(&o, err, BASE, "-J", "x.json", NULL), 0);
    ck_assert_int_eq(parse(&o, err, BASE, "-B", "10", "--bucket", "25MiB", "--terse", NULL), 0);
    ck_assert_double_eq_tol(o.bucket, 25 << 20, 1e-6);
    ck_assert_int_eq(o.terse, 1);
    ck_assert_int_eq(parse(&o, err, "-h", NULL), 0);
    ck_assert_int_eq(o.help, 1);

    const char *bad[][4] = {
        { "--busbw", "fast", NULL },   { "--busbw", "0", NULL },
        { "--busbw", "1,2,3,4,5,6,7,8,9", NULL },
        { "--line-rate", "400Gbps", NULL }, /* no efficiency */
        { "--line-rate", "4", "--efficiency", "1.5" },
        { "--busbw", "1", "-J", "x.json" },  /* two sources */
        { NULL },                            /* no source */
        { "--busbw", "1", "--latency", "0" },
        { "--busbw", "1", "--bogus" },
        { "--busbw", "1", "--bucket", "0" },
        { "--busbw", "1", "--bucket", "big" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(parse(&o, err, BASE, bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL) ==
                          -1,
                      "case %zu accepted", i);
        ck_assert_int_gt(strlen(err), 5);
    }
    ck_assert_int_eq(parse(&o, err, "-s", "0", "-t", "1", "-N", "1", "-L", "1", "-B", "1", NULL),
                     -1);
    ck_assert_int_eq(parse(&o, err, "-s", "1G", "-t", "soon", "-N", "1", "-L", "1", "-B", "1",
                           NULL), -1);
    ck_assert_int_eq(parse(&o, err, "-s", "1G", "-t", "1", "-N", "0", "-L", "1", "-B", "1", NULL),
                     -1);
    ck_assert_int_eq(parse(&o, err, "-t", "1", "-N", "1", "-L", "1", "-B", "1", NULL), -1);
    ck_assert_int_eq(parse(&o, err, "-s", "1G", "-t", "1", "-N", "1", "-L", "1", "--line-rate",
                           "1GB/s", "--efficiency", "0.5", NULL), -1); /* one node: no NIC */
    /* --help explains the factor. */
    ck_assert_ptr_nonnull(strstr(hp_plan_usage(), "2(n-1)/n"));
    ck_assert_ptr_nonnull(strstr(hp_plan_usage(), "S/busbw"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, worked_example);
    tcase_add_test(tc, verdict_boundaries);
    tcase_add_test(tc, last_bucket_always_exposed);
    tcase_add_test(tc, bucket_rule);
    tcase_add_test(tc, line_rate_to_busbw);
    tcase_add_test(tc, flags);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
