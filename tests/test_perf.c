/* hcoll_perf's logic without ranks: flags, units, busbw / NIC arithmetic,
 * verdict thresholds, exact check values, JSON, line-rate sources. The
 * end-to-end runs are in tests/perf-run.test.sh. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/reduce.h"
#include "hcoll.h"
#include "lib/perf.h"

/* Parse a NULL-terminated flag list after a program name. */
static int parse(hp_opts_t *o, char *err, const char *a0, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "hcoll_perf";
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    hp_opts_default(o);
    return hp_opts_parse(argc, argv, o, err, 300);
}

#define GOOD(...) ck_assert_msg(parse(&o, err, __VA_ARGS__, NULL) == 0, "%s", err)
#define BAD(...)                                                                    \
    do {                                                                            \
        ck_assert_int_eq(parse(&o, err, __VA_ARGS__, NULL), -1);                    \
        ck_assert_int_gt(strlen(err), 5);                                           \
    } while (0)

START_TEST(flags_defaults_are_nccl_tests)
{
    hp_opts_t o;
    hp_opts_default(&o);
    ck_assert_uint_eq(o.minbytes, 32u << 20);
    ck_assert_uint_eq(o.maxbytes, 32u << 20);
    ck_assert_uint_eq(o.stepbytes, 1u << 20);
    ck_assert_int_eq(o.iters, 20);
    ck_assert_int_eq(o.warmup, 5);
    ck_assert_int_eq(o.agg, 1);
    ck_assert_int_eq(o.average, HP_AVG_MEAN);
    ck_assert_int_eq(o.root, 0);
    ck_assert_int_eq(o.check, 1);
    ck_assert_int_eq(o.dtype, HCOLL_FLOAT32);
    ck_assert_int_eq(o.op, HCOLL_SUM);
    ck_assert_int_eq(o.blocking, 0);
}
END_TEST

START_TEST(flags_every_flag_good)
{
    hp_opts_t o;
    char err[300];
    GOOD("-b", "4K", "-e", "64M", "-f", "2", "-n", "5", "-w", "0", "-c", "0", "-d", "half",
         "-o", "max", "-z", "1", "--stages", "--line-rate", "25GB/s", "-np", "4",
         "--ranks-per-node", "2", "-J", "x.json", "--plot", "x.png", "--deadline", "30");
    ck_assert_uint_eq(o.minbytes, 4096);
    ck_assert_uint_eq(o.maxbytes, 64u << 20);
    ck_assert_int_eq(o.stepfactor, 2);
    ck_assert_int_eq(o.iters, 5);
    ck_assert_int_eq(o.warmup, 0);
    ck_assert_int_eq(o.check, 0);
    ck_assert_int_eq(o.dtype, HCOLL_FLOAT16);
    ck_assert_int_eq(o.op, HCOLL_MAX);
    ck_assert_int_eq(o.blocking, 1);
    ck_assert_int_eq(o.stages, 1);
    ck_assert_double_eq_tol(o.line_rate, 25e9, 1);
    ck_assert_int_eq(o.np, 4);
    ck_assert_int_eq(o.ranks_per_node, 2);
    ck_assert_str_eq(o.json, "x.json");
    ck_assert_str_eq(o.plot, "x.png");
    ck_assert_double_eq_tol(o.deadline_s, 30, 1e-9);

    /* Attached values, long forms, --x=v, -i, and the other peers/types. */
    GOOD("-b8", "-e128M", "-i", "1M", "--iters=3", "--datatype", "bfloat16", "--op=avg",
         "--peer", "nccl", "--blocking", "0", "--check", "2", "--warmup_iters", "4");
    ck_assert_uint_eq(o.minbytes, 8);
    ck_assert_uint_eq(o.maxbytes, 128u << 20);
    ck_assert_uint_eq(o.stepbytes, 1u << 20);
    ck_assert_int_eq(o.iters, 3);
    ck_assert_int_eq(o.dtype, HCOLL_BFLOAT16);
    ck_assert_int_eq(o.op, HCOLL_AVG);
    ck_assert_int_eq(o.peer, HP_PEER_NCCL);
    ck_assert_int_eq(o.mem, HP_MEM_DEVICE); /* NCCL needs GPU memory */
    GOOD("--mem", "device");
    ck_assert_int_eq(o.mem, HP_MEM_DEVICE);
    ck_assert_int_eq(o.peer, HP_PEER_NONE);
    GOOD("--mem=host");
    ck_assert_int_eq(o.mem, HP_MEM_HOST);
    GOOD("--peer", "nccl", "--mem", "device");
    ck_assert_int_eq(o.mem, HP_MEM_DEVICE);
    GOOD("--peer", "mpi", "-d", "int64", "-o", "prod", "--line-rate", "200Gbps");
    ck_assert_int_eq(o.peer, HP_PEER_MPI);
    ck_assert_int_eq(o.mem, HP_MEM_HOST);
    ck_assert_double_eq_tol(o.line_rate, 25e9, 1);
    GOOD("-h");
    ck_assert_int_eq(o.help, 1);
    static const struct { const char *name; hcoll_dtype_t t; } types[] = {
        { "float", HCOLL_FLOAT32 }, { "double", HCOLL_FLOAT64 }, { "int8", HCOLL_INT8 },
        { "uint8", HCOLL_UINT8 }, { "int32", HCOLL_INT32 }, { "float16", HCOLL_FLOAT16 },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        GOOD("-d", types[i].name);
        ck_assert_int_eq(o.dtype, types[i].t);
    }
    const char *ops[] = { "sum", "prod", "max", "min", "avg" };
    for (int i = 0; i < 5; i++) {
        GOOD("-o", ops[i]);
        ck_assert_int_eq(o.op, i);
        ck_assert_int_eq(o.coll, HP_COLL_ALLREDUCE);
    }
}
END_TEST

/*
 * nccl-tests' documented flag set (its README, "Arguments"), short and long
 * forms: every command line of all_reduce_perf that hcoll_perf can honour
 * parses unchanged, and each flag lands where it should.
 */
START_TEST(flags_nccl_tests_set)
{
    hp_opts_t o;
    char err[300];
    GOOD("-t", "1", "-g", "1", "-b", "8", "-e", "128M", "-f", "2", "-o", "sum", "-d", "float",
         "-r", "0", "-n", "20", "-w", "5", "-m", "1", "-a", "1", "-p", "0", "-c", "1", "-z", "0",
         "-G", "0", "-F", "out.csv");
    ck_assert_int_eq(o.np, 0);
    ck_assert_int_eq(o.stages, 0); /* -p is parallel init now, not the stage split */
    ck_assert_str_eq(o.csv, "out.csv");
    GOOD("--nthreads", "1", "--ngpus", "1", "--minbytes", "1K", "--maxbytes", "1M",
         "--stepbytes", "4K", "--op", "max", "--datatype", "double", "--root", "3", "--iters",
         "7", "--warmup_iters", "2", "--agg_iters", "4", "--average", "3", "--parallel_init",
         "1", "--check", "0", "--blocking", "1", "--cudagraph", "0", "--output_file", "o.csv");
    ck_assert_uint_eq(o.stepbytes, 4096);
    ck_assert_int_eq(o.op, HCOLL_MAX);
    ck_assert_int_eq(o.dtype, HCOLL_FLOAT64);
    ck_assert_int_eq(o.root, 3);
    ck_assert_int_eq(o.iters, 7);
    ck_assert_int_eq(o.warmup, 2);
    ck_assert_int_eq(o.agg, 4);
    ck_assert_int_eq(o.average, HP_AVG_MAX);
    ck_assert_int_eq(o.parallel_init, 1);
    ck_assert_int_eq(o.blocking, 1);
    for (int a = 0; a <= 3; a++) {
        char v[2] = { (char)('0' + a), 0 };
        GOOD("-a", v);
        ck_assert_int_eq(o.average, a);
    }
    /* -t x -g ranks in one process: hcoll_perf launches that many instead. */
    GOOD("-g", "8", "-b", "8", "-e", "128M", "-f", "2");
    ck_assert_int_eq(o.np, 8);
    GOOD("-t", "2", "-g", "2");
    ck_assert_int_eq(o.np, 4);
    GOOD("-g", "4", "-np", "4");
    ck_assert_int_eq(o.np, 4);
    GOOD("--stages");
    ck_assert_int_eq(o.stages, 1);
    /* What hcoll_perf cannot honour is refused with a message. */
    BAD("-g", "4", "-np", "2");
    BAD("-G", "1");
    BAD("-a", "4");
    BAD("-r", "all");
    BAD("-r", "-1");
    BAD("-m", "0");
    BAD("-p"); /* value missing: the stage split is --stages */
    BAD("-F", "");
    BAD("-n", "1000000", "-m", "1000");
}
END_TEST

/* -o names the collective as well as the op (nccl-tests' -o); the names
 * never overlap, so both can be given. */
START_TEST(flags_collective)
{
    hp_opts_t o;
    char err[300];
    static const struct { const char *name; hp_coll_t c; } colls[] = {
        { "allreduce", HP_COLL_ALLREDUCE },       { "all_reduce", HP_COLL_ALLREDUCE },
        { "reduce_scatter", HP_COLL_REDUCE_SCATTER }, { "reducescatter", HP_COLL_REDUCE_SCATTER },
        { "allgather", HP_COLL_ALLGATHER },       { "all_gather", HP_COLL_ALLGATHER },
        { "broadcast", HP_COLL_BROADCAST },       { "bcast", HP_COLL_BROADCAST },
    };
    for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
        GOOD("-o", colls[i].name);
        ck_assert_int_eq(o.coll, colls[i].c);
        ck_assert_int_eq(o.op, HCOLL_SUM);
        ck_assert_str_eq(hp_coll_name(colls[i].c), colls[i].name[0] == 'b' ? "broadcast"
                                                   : colls[i].c == HP_COLL_ALLREDUCE ? "allreduce"
                                                   : colls[i].c == HP_COLL_ALLGATHER ? "allgather"
                                                                                     : "reduce_scatter");
    }
    GOOD("-o", "reduce_scatter", "-o", "max");
    ck_assert_int_eq(o.coll, HP_COLL_REDUCE_SCATTER);
    ck_assert_int_eq(o.op, HCOLL_MAX);
    GOOD("--op=avg", "--op", "allgather");
    ck_assert_int_eq(o.coll, HP_COLL_ALLGATHER);
    ck_assert_int_eq(o.op, HCOLL_AVG);
    BAD("-o", "alltoall");
    ck_assert_ptr_nonnull(strstr(err, "alltoall"));
    ck_assert_ptr_nonnull(strstr(err, "reduce_scatter"));
    ck_assert_ptr_nonnull(strstr(err, "sum"));
    BAD("-o", "");
    BAD("-o", "Broadcast");
    ck_assert(hp_coll_reduces(HP_COLL_ALLREDUCE) && hp_coll_reduces(HP_COLL_REDUCE_SCATTER));
    ck_assert(!hp_coll_reduces(HP_COLL_ALLGATHER) && !hp_coll_reduces(HP_COLL_BROADCAST));
    ck_assert_ptr_nonnull(strstr(hp_usage(), "reduce_scatter"));
    ck_assert_ptr_nonnull(strstr(hp_usage(), "(N-1)/N x S/L"));
}
END_TEST

/* busbw and bytes per NIC of each collective (perf.h's table). */
START_TEST(arith_collectives)
{
    /* nccl-tests: 2(n-1)/n, (n-1)/n, (n-1)/n, 1. */
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_ALLREDUCE, 8), 1.75, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_REDUCE_SCATTER, 8), 0.875, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_ALLGATHER, 6), 5.0 / 6, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_BROADCAST, 8), 1.0, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_REDUCE_SCATTER, 1), 0.0, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_ALLGATHER, 1), 0.0, 1e-12);
    ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_BROADCAST, 1), 1.0, 1e-12);
    for (int n = 1; n <= 64; n++)
        ck_assert_double_eq_tol(hp_coll_bus_factor(HP_COLL_ALLREDUCE, n), hp_ring_factor(n),
                                1e-12);
    /* Bytes per NIC over S/L: 2(N-1)/N, (N-1)/N, (N-1)/N, 1; none on one node. */
    ck_assert_double_eq_tol(hp_coll_nic_factor(HP_COLL_ALLREDUCE, 4), 1.5, 1e-12);
    ck_assert_double_eq_tol(hp_coll_nic_factor(HP_COLL_REDUCE_SCATTER, 3), 2.0 / 3, 1e-12);
    ck_assert_double_eq_tol(hp_coll_nic_factor(HP_COLL_ALLGATHER, 4), 0.75, 1e-12);
    ck_assert_double_eq_tol(hp_coll_nic_factor(HP_COLL_BROADCAST, 4), 1.0, 1e-12);
    for (int c = 0; c < HP_NCOLLS; c++)
        ck_assert_double_eq_tol(hp_coll_nic_factor((hp_coll_t)c, 1), 0.0, 1e-12);

    /* Sizes: the whole vector, whole elements per rank. */
    uint64_t run;
    ck_assert_uint_eq(hp_coll_count(HP_COLL_ALLREDUCE, 4096, 4, 6, &run), 1024);
    ck_assert_uint_eq(run, 4096);
    ck_assert_uint_eq(hp_coll_count(HP_COLL_BROADCAST, 4098, 4, 6, &run), 1024);
    ck_assert_uint_eq(run, 4096);
    ck_assert_uint_eq(hp_coll_count(HP_COLL_REDUCE_SCATTER, 4096, 4, 6, &run), 170);
    ck_assert_uint_eq(run, 170 * 6 * 4);
    ck_assert_uint_eq(hp_coll_count(HP_COLL_ALLGATHER, 64 << 20, 2, 8, &run), 4u << 20);
    ck_assert_uint_eq(run, 64u << 20);
    ck_assert_uint_eq(hp_coll_count(HP_COLL_ALLGATHER, 20, 4, 8, &run), 0); /* < 1 each */
    ck_assert_uint_eq(run, 0);

    /* A row of each: 1 GB in 1 s on 3 nodes x 2 (n = 6), line rate 1 GB/s. */
    const double want_bus[HP_NCOLLS] = { 10.0 / 6, 5.0 / 6, 5.0 / 6, 1.0 };
    const double want_nic[HP_NCOLLS] = { 2.0 * 2 / 3 * 0.5, 2.0 / 3 * 0.5, 2.0 / 3 * 0.5, 0.5 };
    for (int c = 0; c < HP_NCOLLS; c++) {
        hp_row_t row;
        memset(&row, 0, sizeof row);
        row.coll = (hp_coll_t)c;
        row.bytes = 1000000000;
        hp_coll_result_fill(&row.oop, (hp_coll_t)c, 1e9, 1e6, 6, 0);
        hp_coll_result_fill(&row.ip, (hp_coll_t)c, 1e9, 2e6, 6, 0);
        ck_assert_double_eq_tol(row.oop.algbw, 1.0, 1e-12);
        ck_assert_double_eq_tol(row.oop.busbw, want_bus[c], 1e-12);
        ck_assert_double_eq_tol(row.ip.busbw, want_bus[c] / 2, 1e-12);
        hp_row_nic(&row, 3, 2, 1e9);
        ck_assert_double_eq_tol(row.nic_gbs, want_nic[c], 1e-12);
        ck_assert_double_eq_tol(row.nic_pct, 100 * want_nic[c], 1e-9);
    }
}
END_TEST

/* The copy values of the all-gather and broadcast checks: a block from the
 * wrong rank, a stale byte or an unwritten element counts. */
START_TEST(check_copy_values)
{
    const int n = 4;
    const size_t count = 1024; /* a power of two, as the sweep's sizes */
    for (int t = 0; t < HCOLL_DTYPE_COUNT_; t++) {
        size_t es = hcoll_dtype_size((hcoll_dtype_t)t);
        unsigned char *v = malloc(count * n * es);
        for (int r = 0; r < n; r++)
            hp_check_fill_copy(v + (size_t)r * count * es, count, (size_t)r * count,
                               (hcoll_dtype_t)t);
        ck_assert_uint_eq(hp_check_count_wrong_copy(v, count * n, (hcoll_dtype_t)t), 0);
        /* Blocks 1 and 2 swapped: every element of both is wrong. */
        unsigned char *tmp = malloc(count * es);
        memcpy(tmp, v + count * es, count * es);
        memcpy(v + count * es, v + 2 * count * es, count * es);
        memcpy(v + 2 * count * es, tmp, count * es);
        ck_assert_uint_eq(hp_check_count_wrong_copy(v, count * n, (hcoll_dtype_t)t),
                          2 * count);
        memset(v, 0xa5, count * n * es); /* never written */
        ck_assert_uint_eq(hp_check_count_wrong_copy(v, count * n, (hcoll_dtype_t)t), count * n);
        free(tmp);
        free(v);
    }
    /* The reduce-scatter's block r is the reduced vector's elements from r x count. */
    const size_t rc = 257;
    float *in = malloc(rc * n * sizeof *in), *sum = calloc(rc * n, sizeof *sum);
    for (int r = 0; r < n; r++) {
        hp_check_fill(in, rc * n, HCOLL_FLOAT32, HCOLL_SUM, r, n);
        for (size_t i = 0; i < rc * n; i++)
            sum[i] += in[i];
    }
    for (int r = 0; r < n; r++)
        ck_assert_uint_eq(hp_check_count_wrong_at(sum + (size_t)r * rc, rc, (size_t)r * rc,
                                                  HCOLL_FLOAT32, HCOLL_SUM, n), 0);
    /* Block 1 read as block 0: values of another block are wrong. */
    ck_assert_uint_gt(hp_check_count_wrong_at(sum + rc, rc, 0, HCOLL_FLOAT32, HCOLL_SUM, n),
                      rc / 2);
    free(in);
    free(sum);
}
END_TEST

START_TEST(flags_bad_values)
{
    hp_opts_t o;
    char err[300];
    BAD("-b", "lots");
    BAD("-b", "-4K");
    BAD("-e", "4X");
    BAD("-e", "");
    BAD("-b", "64M", "-e", "4K"); /* min > max */
    BAD("-i", "0");
    BAD("-f", "1");
    BAD("-f", "two");
    BAD("-f", "2", "-i", "1M"); /* exclusive */
    BAD("-n", "0");
    BAD("-n", "-3");
    BAD("-n", "5x");
    BAD("-w", "x");
    BAD("-c", "-1");
    BAD("-d", "float8");
    BAD("-o", "xor");
    BAD("-z", "2");
    BAD("-p", "1x");
    BAD("-p=1");
    BAD("--line-rate", "fast");
    BAD("--line-rate", "0GB/s");
    BAD("--line-rate", "25GB");
    BAD("-np", "0");
    BAD("-np", "x");
    BAD("--ranks-per-node", "0");
    BAD("-np", "5", "--ranks-per-node", "2"); /* not a multiple */
    BAD("-np", "4", "--peer", "mpi");         /* MPI launches its ranks */
    BAD("--peer", "gloo");
    BAD("--mem", "gpu");
    BAD("--mem", "");
    BAD("--peer", "nccl", "--mem", "host"); /* NCCL reduces GPU memory */
    BAD("-J", "");
    BAD("--plot", "");
    BAD("--deadline", "0");
    BAD("--bogus");
    BAD("-q");
    BAD("stray");
    BAD("-n"); /* value missing */
    BAD("-e", "1", "-d", "double"); /* smaller than one element */
}
END_TEST

START_TEST(units_sizes_rates_times)
{
    uint64_t b;
    double r, t;
    ck_assert_int_eq(hp_parse_size("4K", &b), 0); ck_assert_uint_eq(b, 4096);
    ck_assert_int_eq(hp_parse_size("4KiB", &b), 0); ck_assert_uint_eq(b, 4096);
    ck_assert_int_eq(hp_parse_size("4KB", &b), 0); ck_assert_uint_eq(b, 4000);
    ck_assert_int_eq(hp_parse_size("4GB", &b), 0); ck_assert_uint_eq(b, 4000000000ull);
    ck_assert_int_eq(hp_parse_size("1.5G", &b), 0); ck_assert_uint_eq(b, 3ull << 29);
    ck_assert_int_eq(hp_parse_size("0", &b), 0); ck_assert_uint_eq(b, 0);
    ck_assert_int_eq(hp_parse_size("1.5", &b), -1); /* not whole bytes */
    ck_assert_int_eq(hp_parse_size("4 Q", &b), -1);
    ck_assert_int_eq(hp_parse_rate("25GB/s", &r), 0); ck_assert_double_eq_tol(r, 25e9, 1);
    ck_assert_int_eq(hp_parse_rate("400Gb/s", &r), 0); ck_assert_double_eq_tol(r, 50e9, 1);
    ck_assert_int_eq(hp_parse_rate("100Gbit", &r), 0); ck_assert_double_eq_tol(r, 12.5e9, 1);
    ck_assert_int_eq(hp_parse_rate("1e9", &r), 0); ck_assert_double_eq_tol(r, 1e9, 1);
    ck_assert_int_eq(hp_parse_rate("0", &r), -1);
    ck_assert_int_eq(hp_parse_time("100ms", 1, &t), 0); ck_assert_double_eq_tol(t, 0.1, 1e-12);
    ck_assert_int_eq(hp_parse_time("100", 1e-3, &t), 0); ck_assert_double_eq_tol(t, 0.1, 1e-12);
    ck_assert_int_eq(hp_parse_time("2500us", 1, &t), 0);
        ck_assert_double_eq_tol(t, 2.5e-3, 1e-12);
    ck_assert_int_eq(hp_parse_time("1h", 1, &t), -1);
}
END_TEST

START_TEST(sizes_sweep)
{
    hp_opts_t o;
    char err[300];
    uint64_t want[] = { 4096, 16384, 65536, 0 };
    GOOD("-b", "4K", "-e", "64K", "-f", "4");
    uint64_t s = 0;
    for (int i = 0; i < 4; i++) {
        s = hp_next_size(&o, s);
        ck_assert_uint_eq(s, want[i]);
        if (!s)
            break;
    }
    /* -i adds; sizes are whole elements (double: 8 bytes). */
    GOOD("-b", "10", "-e", "40", "-i", "10", "-d", "double");
    ck_assert_uint_eq(hp_next_size(&o, 0), 8);
    ck_assert_uint_eq(hp_next_size(&o, 8), 16);
    ck_assert_uint_eq(hp_next_size(&o, 16), 24);
    ck_assert_uint_eq(hp_next_size(&o, 24), 32);
    ck_assert_uint_eq(hp_next_size(&o, 32), 40);
    ck_assert_uint_eq(hp_next_size(&o, 40), 0);
}
END_TEST

START_TEST(arith_busbw_and_nic)
{
    /* 1 GB in 1 s on 4 ranks: algbw 1, busbw 1.5 (2·3/4). */
    ck_assert_double_eq_tol(hp_algbw(1e9, 1.0), 1.0, 1e-12);
    ck_assert_double_eq_tol(hp_busbw(1.0, 4), 1.5, 1e-12);
    ck_assert_double_eq_tol(hp_busbw(1.0, 1), 0.0, 1e-12);
    ck_assert_double_eq_tol(hp_busbw(2.0, 64), 2.0 * 126 / 64, 1e-12);
    /* NIC: 2(N-1)/N · S/L / t. 2 nodes x 2: 1 · 0.5 GB / 1 s. */
    ck_assert_double_eq_tol(hp_nic_bw(1e9, 1.0, 2, 2), 0.5, 1e-12);
    /* 8 nodes x 8 ranks, 4 GB in 0.1 s: 2·7/8 · 0.5 GB / 0.1 s = 8.75 GB/s. */
    ck_assert_double_eq_tol(hp_nic_bw(4e9, 0.1, 8, 8), 8.75, 1e-9);
    ck_assert_double_eq_tol(hp_nic_bw(1e9, 1.0, 1, 4), 0.0, 1e-12); /* one node */
    /* busbw = nic · (n-1)/(N-1), consistent with the two formulas. */
    double bus = hp_busbw(hp_algbw(4e9, 0.1), 64);
    ck_assert_double_eq_tol(hp_busbw_from_nic(8.75, 8, 8), bus, 1e-9);

    hp_row_t row;
    memset(&row, 0, sizeof row);
    row.bytes = 1000000000;
    hp_result_fill(&row.oop, 1e9, 2e6, 4, 0); /* 2 s */
    hp_result_fill(&row.ip, 1e9, 1e6, 4, 0);  /* 1 s: the faster one counts */
    ck_assert_double_eq_tol(row.oop.algbw, 0.5, 1e-12);
    ck_assert_double_eq_tol(row.oop.busbw, 0.75, 1e-12);
    hp_row_nic(&row, 2, 2, 1e9);
    ck_assert_double_eq_tol(row.nic_gbs, 0.5, 1e-12);
    ck_assert_double_eq_tol(row.nic_pct, 50.0, 1e-9);
    hp_row_nic(&row, 2, 2, 0); /* unknown line rate */
    ck_assert_double_eq_tol(row.nic_gbs, 0.5, 1e-12);
    ck_assert(row.nic_pct < 0);
    hp_row_nic(&row, 1, 4, 1e9); /* one node: no NIC traffic */
    ck_assert(row.nic_gbs < 0 && row.nic_pct < 0);
}
END_TEST

START_TEST(verdict_thresholds)
{
    ck_assert_int_eq(hp_verdict_of(100), HP_VERDICT_HEALTHY);
    ck_assert_int_eq(hp_verdict_of(80), HP_VERDICT_HEALTHY);
    ck_assert_int_eq(hp_verdict_of(79.99), HP_VERDICT_ACCEPTABLE);
    ck_assert_int_eq(hp_verdict_of(60), HP_VERDICT_ACCEPTABLE);
    ck_assert_int_eq(hp_verdict_of(59.99), HP_VERDICT_POOR);
    ck_assert_int_eq(hp_verdict_of(50), HP_VERDICT_POOR);
    ck_assert_int_eq(hp_verdict_of(49.99), HP_VERDICT_PROBLEM);
    ck_assert_int_eq(hp_verdict_of(0), HP_VERDICT_PROBLEM);
    ck_assert_int_eq(hp_verdict_of(-1), HP_VERDICT_UNKNOWN);
    ck_assert_int_eq(hp_verdict_of(NAN), HP_VERDICT_UNKNOWN);
    ck_assert_str_eq(hp_verdict_name(HP_VERDICT_PROBLEM), "problem");
    ck_assert_str_eq(hp_verdict_name(HP_VERDICT_POOR), "poor");
    const char *s = hp_verdict_suspects();
    ck_assert_ptr_nonnull(strstr(s, "GPU-direct"));
    ck_assert_ptr_nonnull(strstr(s, "PFC"));
    ck_assert_ptr_nonnull(strstr(s, "GID index"));
    ck_assert_ptr_nonnull(strstr(s, "one NIC for several ranks"));
}
END_TEST

static hp_row_t mkrow(const char *impl, uint64_t bytes, double busbw, double pct)
{
    hp_row_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.impl, sizeof r.impl, "%s", impl);
    r.bytes = bytes;
    r.oop.busbw = busbw;
    r.ip.busbw = busbw / 2;
    r.oop.time_us = 10;
    r.ip.time_us = 20;
    r.nic_gbs = busbw / 3;
    r.nic_pct = pct;
    return r;
}

START_TEST(verdict_plateau_selection)
{
    hp_row_t rows[] = {
        mkrow("hcoll", 1 << 20, 1, 10),    mkrow("mpi", 1 << 20, 9, 90),
        mkrow("hcoll", 64 << 20, 3, 30),   mkrow("hcoll", 256 << 20, 8, 82),
        mkrow("hcoll", 512 << 20, 10, 86), mkrow("mpi", 512 << 20, 5, 40),
    };
    double pct, nic, bus;
    uint64_t from;
    /* Sizes >= 256 MiB were run: their mean. */
    ck_assert_int_eq(hp_plateau(rows, 6, "hcoll", &pct, &nic, &bus, &from), 2);
    ck_assert_double_eq_tol(pct, 84, 1e-9);
    ck_assert_double_eq_tol(bus, 9, 1e-9);
    ck_assert_uint_eq(from, 256u << 20);
    ck_assert_int_eq(hp_verdict_of(pct), HP_VERDICT_HEALTHY);
    /* Without them: the largest size only. */
    ck_assert_int_eq(hp_plateau(rows, 3, "hcoll", &pct, &nic, &bus, &from), 1);
    ck_assert_double_eq_tol(pct, 30, 1e-9);
    ck_assert_uint_eq(from, 64u << 20);
    ck_assert_int_eq(hp_plateau(rows, 6, "mpi", &pct, &nic, &bus, &from), 1);
    ck_assert_double_eq_tol(pct, 40, 1e-9);
    ck_assert_int_eq(hp_plateau(rows, 6, "nccl", &pct, &nic, &bus, &from), 0);
    /* Unknown line rate anywhere on the plateau: unknown. */
    rows[4].nic_pct = -1;
    hp_plateau(rows, 6, "hcoll", &pct, &nic, &bus, &from);
    ck_assert(pct < 0);
    /* nccl-tests' average: mean of oop and ip busbw over the rows. */
    ck_assert_double_eq_tol(hp_avg_busbw(rows, 6, "mpi"), (9 + 4.5 + 5 + 2.5) / 4, 1e-9);
}
END_TEST

/* The check values reduce exactly in any order: reduce them with the
 * library's own kernels forwards and backwards, and compare. AVG of floats
 * multiplies each input by 1/n first (hcoll.h), which is exact only for n
 * a power of two: elsewhere the tool must say it does not check. */
START_TEST(check_values_exact_in_any_order)
{
    const int nranks_list[] = { 1, 2, 3, 4, 8 };
    const size_t count = 1003;
    for (int t = 0; t < HCOLL_DTYPE_COUNT_; t++) {
        size_t es = hcoll_dtype_size((hcoll_dtype_t)t);
        for (int op = 0; op < HCOLL_OP_COUNT_; op++) {
            for (size_t k = 0; k < sizeof nranks_list / sizeof nranks_list[0]; k++) {
                int n = nranks_list[k];
                const int scaled = op == HCOLL_AVG && hc_dtype_is_float((hcoll_dtype_t)t);
                if (scaled && (n & (n - 1)) != 0) {
                    ck_assert(!hp_check_exact((hcoll_dtype_t)t, (hcoll_op_t)op, n));
                    continue;
                }
                ck_assert(hp_check_exact((hcoll_dtype_t)t, (hcoll_op_t)op, n));
                const hcoll_op_t rop = scaled ? HCOLL_SUM : (hcoll_op_t)op;
                unsigned char *in = malloc(count * es * (size_t)n);
                unsigned char *fw = malloc(count * es), *bw = malloc(count * es);
                for (int r = 0; r < n; r++) {
                    unsigned char *p = in + (size_t)r * count * es;
                    hp_check_fill(p, count, (hcoll_dtype_t)t, (hcoll_op_t)op, r, n);
                    if (scaled)
                        hc_reduce_scale(p, p, count, (hcoll_dtype_t)t,
                                        hc_scalar_avg((hcoll_dtype_t)t, n));
                }
                memcpy(fw, in, count * es);
                for (int r = 1; r < n; r++)
                    hc_reduce(fw, fw, in + (size_t)r * count * es, count, (hcoll_dtype_t)t,
                              rop);
                memcpy(bw, in + (size_t)(n - 1) * count * es, count * es);
                for (int r = n - 2; r >= 0; r--)
                    hc_reduce(bw, in + (size_t)r * count * es, bw, count, (hcoll_dtype_t)t, rop);
                hc_reduce_avg_finish(fw, count, (hcoll_dtype_t)t, rop, n);
                hc_reduce_avg_finish(bw, count, (hcoll_dtype_t)t, rop, n);
                ck_assert_msg(hp_check_count_wrong(fw, count, (hcoll_dtype_t)t, (hcoll_op_t)op,
                                                   n) == 0,
                              "%s %s n=%d", hcoll_dtype_name(t), hcoll_op_name(op), n);
                ck_assert_uint_eq(hp_check_count_wrong(bw, count, (hcoll_dtype_t)t,
                                                       (hcoll_op_t)op, n), 0);
                /* One flipped byte is one wrong element. */
                fw[17 * es] ^= 0x40;
                ck_assert_uint_eq(hp_check_count_wrong(fw, count, (hcoll_dtype_t)t,
                                                       (hcoll_op_t)op, n), 1);
                free(in), free(fw), free(bw);
            }
        }
    }
    /* Too many ranks for exact bf16 averages: said, not silently wrong. */
    ck_assert(!hp_check_exact(HCOLL_BFLOAT16, HCOLL_AVG, 128));
}
END_TEST

START_TEST(json_roundtrip)
{
    hp_row_t rows[] = {
        mkrow("hcoll", 4096, 0.5, 10), mkrow("mpi", 4096, 0.7, 12),
        mkrow("hcoll", 64 << 20, 3.0, 60), mkrow("mpi", 64 << 20, 2.0, 40),
    };
    rows[0].oop.time_us = 123.5;
    rows[0].ip.time_us = 130;
    rows[0].oop.wrong = 0, rows[0].ip.wrong = -1;
    rows[1].ratio = 0.7;
    char path[] = "/tmp/hcoll_test_perf_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    hp_meta_t m = { 4, 2, 2, 0, "unknown \"x\"", "unknown", -1, HP_COLL_ALLREDUCE };
    ck_assert_int_eq(hp_json_write(f, &m, rows, 4), 0);
    fclose(f);
    double bus, lat;
    int n, nodes;
    char err[200];
    ck_assert_int_eq(hp_json_read_busbw(path, &bus, &lat, &n, &nodes, err, sizeof err), 0);
    ck_assert_double_eq_tol(bus, 3.0, 1e-9);  /* the hcoll plateau, not mpi's */
    ck_assert_double_eq_tol(lat, 123.5, 1e-9); /* smallest size's faster time */
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(nodes, 2);
    /* Valid JSON: python parses it when present. */
    if (access("/usr/bin/python3", X_OK) == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(\"%s\")); "
                 "assert len(d[\"rows\"])==4 and d[\"rows\"][0][\"ip\"][\"wrong\"] is None'",
                 path);
        ck_assert_int_eq(system(cmd), 0);
    }
    unlink(path);

    /* Another collective's rows name it (and have no redop where none
     * applies); hcoll_plan's reader refuses such a file. */
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    m.coll = HP_COLL_ALLGATHER;
    for (int i = 0; i < 4; i++)
        rows[i].coll = HP_COLL_ALLGATHER;
    ck_assert_int_eq(hp_json_write(f, &m, rows, 4), 0);
    fclose(f);
    ck_assert_int_eq(hp_json_read_busbw(path, &bus, &lat, &n, &nodes, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not an all-reduce"));
    if (access("/usr/bin/python3", X_OK) == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(\"%s\")); "
                 "assert d[\"coll\"]==\"allgather\" and all(r[\"coll\"]==\"allgather\" and "
                 "r[\"redop\"] is None for r in d[\"rows\"])'",
                 path);
        ck_assert_int_eq(system(cmd), 0);
    }
    unlink(path);
    ck_assert_int_eq(hp_json_read_busbw("/nonexistent/x.json", &bus, &lat, &n, &nodes, err,
                                        sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.json"));
}
END_TEST

START_TEST(linerate_tc_parsers)
{
    double bps;
    const char *tbf = "[{\"kind\":\"tbf\",\"handle\":\"8001:\",\"root\":true,\"refcnt\":3,"
                      "\"options\":{\"rate\":250000000,\"burst\":262000,\"lat\":50000}}]";
    ck_assert_int_eq(hp_tc_parse_qdisc_json(tbf, &bps), 0);
    ck_assert_double_eq_tol(bps, 250e6, 1);
    const char *fifo = "[{\"kind\":\"pfifo_fast\",\"handle\":\"0:\",\"dev\":\"eth0\","
                       "\"options\":{\"bands\":3}}]";
    ck_assert_int_eq(hp_tc_parse_qdisc_json(fifo, &bps), -1);
    /* A rate in a later qdisc's options belongs to that one only. */
    const char *mixed = "[{\"kind\":\"htb\",\"options\":{}},{\"kind\":\"netem\",\"options\":"
                        "{\"rate\":5}}]";
    ck_assert_int_eq(hp_tc_parse_qdisc_json(mixed, &bps), -1);
    const char *htb = "class htb 1:1 root rate 10Gbit ceil 10Gbit burst 0b cburst 0b \n"
                      "class htb 1:10 parent 1:1 prio 0 rate 800Mbit ceil 10Gbit burst 1600b\n";
    ck_assert_int_eq(hp_tc_parse_class_text(htb, &bps), 0);
    ck_assert_double_eq_tol(bps, 100e6, 1);
    ck_assert_int_eq(hp_tc_parse_class_text("", &bps), -1);
}
END_TEST

static void put(const char *root, const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void dir(const char *root, const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    ck_assert_int_eq(mkdir(path, 0755), 0);
}

START_TEST(linerate_sysfs_fixture_and_order)
{
    char root[] = "/tmp/hcoll_test_sys_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(root));
    dir(root, "class");
    dir(root, "class/net");
    dir(root, "class/net/lo");
    dir(root, "class/net/eth9"); /* a real 100 Gb/s link */
    dir(root, "class/net/eth9/device");
    put(root, "class/net/eth9/speed", "100000\n");
    dir(root, "class/net/eth8"); /* a real link, down */
    dir(root, "class/net/eth8/device");
    put(root, "class/net/eth8/speed", "-1\n");
    dir(root, "class/net/veth0"); /* virtual: its speed is made up */
    put(root, "class/net/veth0/speed", "10000\n");
    double bps;
    char src[200];
    ck_assert_int_eq(hp_iface_rate_limit("eth9", root, 0, &bps, src, sizeof src), 0);
    ck_assert_double_eq_tol(bps, 12.5e9, 1);
    ck_assert_ptr_nonnull(strstr(src, "eth9"));
    ck_assert_int_eq(hp_iface_rate_limit("eth8", root, 0, &bps, src, sizeof src), -1);
    ck_assert_int_eq(hp_iface_rate_limit("veth0", root, 0, &bps, src, sizeof src), -1);
    ck_assert_int_eq(hp_iface_rate_limit("nope", root, 0, &bps, src, sizeof src), -1);

    /* Order: (no RDMA device yet) --line-rate, then interfaces, else unknown. */
    ck_assert_int_eq(hp_line_rate_resolve(3e9, "eth9", root, 0, &bps, src, sizeof src), 0);
    ck_assert_double_eq_tol(bps, 3e9, 1);
    ck_assert_str_eq(src, "--line-rate");
    ck_assert_int_eq(hp_line_rate_resolve(0, "eth", root, 0, &bps, src, sizeof src), 0);
    ck_assert_double_eq_tol(bps, 12.5e9, 1);
    ck_assert_int_eq(hp_line_rate_resolve(0, NULL, root, 0, &bps, src, sizeof src), 0);
    ck_assert_int_eq(hp_line_rate_resolve(0, "^eth9", root, 0, &bps, src, sizeof src), -1);
    ck_assert_ptr_nonnull(strstr(src, "unknown"));
    ck_assert_int_eq(hp_line_rate_resolve(0, "=eth", root, 0, &bps, src, sizeof src), -1);
    ck_assert_int_eq(hp_line_rate_resolve(0, "lo,veth", root, 0, &bps, src, sizeof src), -1);
    ck_assert_int_eq(hp_line_rate_rdma(root, NULL, &bps, src, sizeof src), -1);
    /* RDMA ports come first, the slowest usable one sets the rate. */
    ck_assert_int_eq(hp_line_rate_rdma("tests/fixtures/sysfs-roce", NULL, &bps, src, sizeof src), 0);
    ck_assert_msg(bps > 0 && strstr(src, "RDMA port"), "%s", src);
    double roce = bps;
    ck_assert_int_eq(hp_line_rate_resolve(3e9, "eth", "tests/fixtures/sysfs-roce/sys", 0, &bps, src,
                                          sizeof src), 0);
    ck_assert_double_eq_tol(bps, roce, 1);
    ck_assert_ptr_nonnull(strstr(src, "RDMA port"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("perf");
    TCase *tc = tcase_create("perf");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, flags_defaults_are_nccl_tests);
    tcase_add_test(tc, flags_every_flag_good);
    tcase_add_test(tc, flags_nccl_tests_set);
    tcase_add_test(tc, flags_bad_values);
    tcase_add_test(tc, flags_collective);
    tcase_add_test(tc, arith_collectives);
    tcase_add_test(tc, check_copy_values);
    tcase_add_test(tc, units_sizes_rates_times);
    tcase_add_test(tc, sizes_sweep);
    tcase_add_test(tc, arith_busbw_and_nic);
    tcase_add_test(tc, verdict_thresholds);
    tcase_add_test(tc, verdict_plateau_selection);
    tcase_add_test(tc, check_values_exact_in_any_order);
    tcase_add_test(tc, json_roundtrip);
    tcase_add_test(tc, linerate_tc_parsers);
    tcase_add_test(tc, linerate_sysfs_fixture_and_order);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
