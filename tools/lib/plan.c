/*
 * hcoll_plan's arithmetic: can the all-reduce of S gradient bytes per rank
 * hide behind a backward pass of b seconds?
 *
 *   t = S · 2(n-1)/n / busbw      busbw is defined so that this holds: a
 *                                 ring (and the three-stage pattern) moves
 *                                 2(n-1)/n · S through every rank's link,
 *                                 so S / busbw underestimates t by almost 2x
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

/* When the last of k buckets finishes, backward filling S bytes evenly over
 * b seconds and each bucket's all-reduce (c, the last one c_last) starting
 * once it is full and its predecessor is done. finish = max over j of
 * (ready_j + the time of buckets j..k-1); ready_j is linear in j, and so is
 * the sum up to the last bucket, so the maximum is at j = 0, k-2 or k-1. */
static double plan_finish(double bytes, double b, uint64_t bucket, uint64_t k, double c,
                          double c_last)
{
    double finish = b + c_last; /* j = k-1: ready when backward ends */
    if (k >= 2) {
        double first = b * (double)bucket / bytes + (double)(k - 1) * c + c_last;
        double before_last = b * (double)(k - 1) * (double)bucket / bytes + c + c_last;
        finish = fmax(finish, fmax(first, before_last));
    }
    return finish;
}

/* The bucket: the caller's, else the smallest power of two (>= 1 MiB)
 * whose transfer time is HP_PLAN_LAT_RATIO x the latency; never above S. */
static uint64_t plan_bucket(const hp_plan_in_t *in, const hp_plan_out_t *o)
{
    uint64_t b;
    if (in->bucket_bytes > 0) {
        b = (uint64_t)ceil(in->bucket_bytes);
    } else {
        /* transfer(B) = B·factor/busbw >= RATIO · latency */
        double need = o->factor > 0 ? HP_PLAN_LAT_RATIO * o->latency_s * in->busbw / o->factor : 0;
        b = 1u << 20; /* never below 1 MiB: below that, launch costs dominate */
        while ((double)b < need && b < (1ull << 40))
            b <<= 1;
    }
    return (double)b > in->bytes ? (uint64_t)in->bytes : b;
}

int hp_plan_compute(const hp_plan_in_t *in, hp_plan_out_t *out)
{
    if (!(in->bytes > 0) || !(in->backward_s >= 0) || in->nodes < 1 || in->ranks_per_node < 1 ||
        !(in->busbw > 0) || !(in->bucket_bytes >= 0))
        return -1;
    hp_plan_out_t o;
    memset(&o, 0, sizeof o);
    o.nranks = in->nodes * in->ranks_per_node;
    o.factor = hp_ring_factor(o.nranks);
    o.t_s = in->bytes * o.factor / in->busbw;
    o.naive_t_s = in->bytes / in->busbw;
    o.bw_exposed_s = o.t_s > in->backward_s ? o.t_s - in->backward_s : 0;
    o.busbw_needed = in->backward_s > 0 ? in->bytes * o.factor / in->backward_s : INFINITY;
    /* The fixed cost of one all-reduce: 2(N-1) inter-node ring steps plus
     * the two intra-node stages, each about one hop, unless measured. One
     * rank moves nothing and costs nothing. */
    o.latency_s = in->latency_s > 0
                      ? in->latency_s
                      : (2.0 * (in->nodes - 1) + (in->ranks_per_node > 1 ? 2 : 0)) *
                            HP_PLAN_HOP_US * 1e-6;
    if (o.nranks == 1)
        o.latency_s = 0;
    o.bucket_bytes = plan_bucket(in, &o);
    o.nbuckets = (uint64_t)ceil(in->bytes / (double)o.bucket_bytes);
    o.bucket_t_s = o.latency_s + (double)o.bucket_bytes * o.factor / in->busbw;
    double last = in->bytes - (double)(o.nbuckets - 1) * (double)o.bucket_bytes;
    o.last_bucket_s = o.latency_s + last * o.factor / in->busbw;
    double finish = plan_finish(in->bytes, in->backward_s, o.bucket_bytes, o.nbuckets,
                                o.bucket_t_s, o.last_bucket_s);
    o.exposed_s = fmax(0, finish - in->backward_s);
    /* Judged on what is exposed beyond the tail no schedule can hide; with
     * one bucket nothing overlaps, so all of it counts. */
    double beyond = o.exposed_s - (o.nbuckets >= 2 ? o.last_bucket_s : 0);
    if (beyond <= 1e-9 * (in->backward_s + o.exposed_s)) /* rounding */
        o.verdict = HP_PLAN_HIDDEN;
    else if (beyond <= in->backward_s * (HP_PLAN_PARTLY_MAX - 1))
        o.verdict = HP_PLAN_PARTLY_EXPOSED;
    else
        o.verdict = HP_PLAN_EXPOSED;
    *out = o;
    return 0;
}

const char *hp_plan_verdict_name(hp_plan_verdict_t v)
{
    switch (v) {
    case HP_PLAN_HIDDEN: return "hidden";
    case HP_PLAN_PARTLY_EXPOSED: return "partly exposed";
    case HP_PLAN_EXPOSED: return "exposed";
    }
    return "unknown";
}

const char *hp_plan_usage(void)
{
    return "usage: hcoll_plan -s BYTES -t BACKWARD -N NODES -L RANKS_PER_NODE BUSBW-SOURCE\n"
           "  -s, --bytes SIZE         gradient bytes per rank (4GB = 4e9, 4GiB = 2^32)\n"
           "  -t, --backward TIME      backward-pass time (100ms, 0.1s; bare number = ms)\n"
           "  -N, --nodes N            nodes\n"
           "  -L, --ranks-per-node L   ranks per node (n = N x L ranks in all)\n"
           "busbw, one of:\n"
           "  -B, --busbw RATE[,RATE]  measured bus bandwidth(s) (180GB/s; a list compares)\n"
           "  -J, --from-json FILE     hcoll_perf -J output: plateau busbw, and the smallest\n"
           "                           size's time as the per-all-reduce latency\n"
           "  --line-rate RATE --efficiency E   per-NIC line rate x efficiency (0.8 or 80%):\n"
           "                           busbw = NIC rate x (n-1)/(N-1) for the three-stage pattern\n"
           "  --latency TIME           fixed cost of one all-reduce (default: from the JSON,\n"
           "                           else 5us per ring step: 2(N-1) inter + 2 intra)\n"
           "  --bucket SIZE            gradient bucket to model (default: the rule below)\n"
           "  --terse                  one line of key=value per busbw, for programs\n"
           "  -h, --help               this text\n"
           "\n"
           "Output: t = S x 2(n-1)/n / busbw; a bucket size whose transfer time is at least\n"
           "10x the per-all-reduce latency (power of two, >= 1 MiB); max(0, t - backward),\n"
           "what bandwidth alone leaves exposed; the exposed time with buckets: backward\n"
           "fills the gradients evenly, each bucket's all-reduce starts when it is full and\n"
           "the previous one is done, so the last bucket starts only when backward ends and\n"
           "its time is always exposed; the verdict on what is exposed beyond that last\n"
           "bucket (all of it with one bucket: hidden: nothing; partly exposed: up to 0.25 x\n"
           "backward; exposed: more); the busbw that makes t = backward.\n"
           "\n"
           "Why 2(n-1)/n and not S/busbw: busbw is defined (nccl-tests, hcoll_perf) as\n"
           "algbw x 2(n-1)/n, the rate at which each rank's link carries the ring's traffic;\n"
           "a ring all-reduce moves 2(n-1)/n x S through every link (reduce-scatter then\n"
           "all-gather). So t = S / algbw = S x 2(n-1)/n / busbw, nearly twice S / busbw\n"
           "for large n. Worked example, 4 GB per rank, 100 ms backward, 64 ranks:\n"
           "  busbw 180 GB/s: t = 4e9 x 126/64 / 180e9 = 43.8 ms  -> hidden but the last\n"
           "                  128 MiB bucket: 1.3 ms exposed\n"
           "  busbw  40 GB/s: t = 196.9 ms, 96.9 ms exposed by bandwidth alone, 116.4 ms\n"
           "                  with 239 buckets of 16 MiB (80 us each)  -> exposed\n"
           "  (S / busbw would say 100 ms at 40 GB/s: 'just hidden', which is wrong.)\n";
}

void hp_plan_opts_default(hp_plan_opts_t *o)
{
    memset(o, 0, sizeof *o);
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* "--flag value" or "--flag=value" or "-x value" or "-xvalue". */
static const char *take(int argc, char **argv, int *i, const char *s, const char *l)
{
    const char *a = argv[*i];
    size_t ln = strlen(l);
    if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, l, ln) == 0) {
        if (a[2 + ln] == '=')
            return a + 3 + ln;
        if (a[2 + ln] == '\0')
            return *i + 1 < argc ? argv[++*i] : "";
        return NULL;
    }
    if (s && a[0] == '-' && a[1] == s[0] && a[1] != '-') {
        if (a[2])
            return a + 2;
        return *i + 1 < argc ? argv[++*i] : "";
    }
    return NULL;
}

int hp_plan_opts_parse(int argc, char **argv, hp_plan_opts_t *o, char *err, size_t errlen)
{
    int have_bytes = 0, have_back = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            o->help = 1;
        } else if ((v = take(argc, argv, &i, "s", "bytes"))) {
            uint64_t b;
            if (hp_parse_size(v, &b) != 0 || b == 0)
                return bad(err, errlen, "--bytes: '%s' is not a positive size (4GB, 512MiB)", v);
            o->bytes = (double)b;
            have_bytes = 1;
        } else if ((v = take(argc, argv, &i, "t", "backward"))) {
            if (hp_parse_time(v, 1e-3, &o->backward_s) != 0)
                return bad(err, errlen, "--backward: '%s' is not a time (100ms, 0.1s)", v);
            have_back = 1;
        } else if ((v = take(argc, argv, &i, "N", "nodes"))) {
            if (hp_parse_int(v, 1, 1 << 20, &o->nodes) != 0)
                return bad(err, errlen, "--nodes: '%s' is not a count >= 1", v);
        } else if ((v = take(argc, argv, &i, "L", "ranks-per-node"))) {
            if (hp_parse_int(v, 1, 1 << 16, &o->ranks_per_node) != 0)
                return bad(err, errlen, "--ranks-per-node: '%s' is not a count >= 1", v);
        } else if ((v = take(argc, argv, &i, "B", "busbw"))) {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", v);
            o->nbusbw = 0;
            for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                if (o->nbusbw == 8)
                    return bad(err, errlen, "--busbw: at most 8 values");
                /* A bare number is GB/s: that is how busbw is quoted. */
                double r;
                if (hp_parse_rate(tok, &r) != 0)
                    return bad(err, errlen, "--busbw: '%s' is not a rate (180GB/s)", tok);
                if (strspn(tok, "0123456789.") == strlen(tok))
                    r *= 1e9;
                o->busbw[o->nbusbw++] = r;
            }
            if (o->nbusbw == 0)
                return bad(err, errlen, "--busbw: no value");
        } else if ((v = take(argc, argv, &i, "J", "from-json"))) {
            if (!*v)
                return bad(err, errlen, "--from-json: empty file name");
            o->json = v;
        } else if ((v = take(argc, argv, &i, NULL, "line-rate"))) {
            if (hp_parse_rate(v, &o->line_rate) != 0)
                return bad(err, errlen, "--line-rate: '%s' is not a rate (25GB/s, 200Gbps)", v);
        } else if ((v = take(argc, argv, &i, NULL, "efficiency"))) {
            double e;
            char *end;
            e = strtod(v, &end);
            if (end == v)
                return bad(err, errlen, "--efficiency: '%s' is not a number", v);
            if (*end == '%')
                e /= 100, end++;
            if (*end || !(e > 0) || e > 1)
                return bad(err, errlen, "--efficiency: '%s' is not in (0, 1] (or 1-100%%)", v);
            o->efficiency = e;
        } else if ((v = take(argc, argv, &i, NULL, "bucket"))) {
            uint64_t b;
            if (hp_parse_size(v, &b) != 0 || b == 0)
                return bad(err, errlen, "--bucket: '%s' is not a positive size (25MiB)", v);
            o->bucket = (double)b;
        } else if (strcmp(a, "--terse") == 0) {
            o->terse = 1;
        } else if ((v = take(argc, argv, &i, NULL, "latency"))) {
            if (hp_parse_time(v, 1e-6, &o->latency_s) != 0 || o->latency_s <= 0)
                return bad(err, errlen, "--latency: '%s' is not a positive time (50us)", v);
        } else {
            return bad(err, errlen, "unknown flag '%s'", a);
        }
    }
    if (o->help)
        return 0;
    if (!have_bytes)
        return bad(err, errlen, "--bytes is required (gradient bytes per rank)");
    if (!have_back)
        return bad(err, errlen, "--backward is required (backward-pass time)");
    if (o->nodes < 1 || o->ranks_per_node < 1)
        return bad(err, errlen, "--nodes and --ranks-per-node are required");
    int sources = (o->nbusbw > 0) + (o->json != NULL) + (o->line_rate > 0);
    if (sources != 1)
        return bad(err, errlen,
                   "give exactly one busbw source: --busbw, --from-json, or --line-rate "
                   "with --efficiency");
    if ((o->line_rate > 0) != (o->efficiency > 0))
        return bad(err, errlen, "--line-rate and --efficiency go together");
    if (o->line_rate > 0 && o->nodes < 2)
        return bad(err, errlen, "--line-rate needs --nodes >= 2 (one node uses no NIC)");
    return 0;
}
