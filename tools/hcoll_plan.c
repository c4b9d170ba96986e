/*
 * hcoll_plan: can the gradient all-reduce hide behind the backward pass?
 *
 *   S bytes/rank, busbw ─► t = S · 2(n-1)/n / busbw ─► bucket size, max(0, t - b)
 *                        ─► exposed with buckets (the last one always: it starts
 *                           when backward ends) ─► verdict, busbw needed
 *
 * busbw comes from a measurement (--busbw), an hcoll_perf -J file
 * (--from-json), or a NIC line rate × efficiency. The arithmetic and the
 * thresholds live in tools/lib/plan.c; --help explains the 2(n-1)/n.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lib/perf.h"

static void fmt_time(double s, char *buf, size_t len)
{
    if (s == 0)
        snprintf(buf, len, "0 ms");
    else if (s >= 1)
        snprintf(buf, len, "%.2f s", s);
    else if (s >= 1e-3)
        snprintf(buf, len, "%.1f ms", s * 1e3);
    else
        snprintf(buf, len, "%.1f us", s * 1e6);
}

static void report(const hp_plan_in_t *in, const hp_plan_out_t *o, const char *source)
{
    char t[32], naive[32], bwexp[32], exp[32], back[32], bt[32], lat[32], last[32], bucket[32],
        bytes[32];
    fmt_time(o->t_s, t, sizeof t);
    fmt_time(o->naive_t_s, naive, sizeof naive);
    fmt_time(o->bw_exposed_s, bwexp, sizeof bwexp);
    fmt_time(o->exposed_s, exp, sizeof exp);
    fmt_time(in->backward_s, back, sizeof back);
    fmt_time(o->bucket_t_s, bt, sizeof bt);
    fmt_time(o->latency_s, lat, sizeof lat);
    fmt_time(o->last_bucket_s, last, sizeof last);
    hp_format_bytes((double)o->bucket_bytes, 0, bucket, sizeof bucket);
    hp_format_bytes(in->bytes, 1, bytes, sizeof bytes);
    printf("busbw %.1f GB/s (%s)\n", in->busbw / 1e9, source);
    printf("  all-reduce time  t = %s x 2(%d-1)/%d / %.1f GB/s = %s   (S/busbw would say %s)\n",
           bytes, o->nranks, o->nranks, in->busbw / 1e9, t, naive);
    printf("  bucket           %s (%llu buckets%s): %s per bucket, of which %s fixed latency\n",
           bucket, (unsigned long long)o->nbuckets, in->bucket_bytes > 0 ? ", given" : "", bt,
           lat);
    printf("  exposed          max(0, t - backward %s) = %s by bandwidth alone\n", back, bwexp);
    printf("  with buckets     %s exposed: each starts once backward has filled it, so the "
           "last (%s) starts only when backward ends\n", exp, last);
    const char *why = o->nbuckets < 2                ? "one bucket, nothing overlaps"
                      : o->verdict == HP_PLAN_HIDDEN ? "all but the last bucket hides"
                                                     : "the all-reduce falls behind backward";
    if (o->exposed_s == 0)
        printf("  verdict          hidden (nothing to move)\n");
    else
        printf("  verdict          %s: %s; the step grows by %s, %.1f%% of the backward pass\n",
               hp_plan_verdict_name(o->verdict), why, exp,
               in->backward_s > 0 ? 100 * o->exposed_s / in->backward_s : INFINITY);
    if (isfinite(o->busbw_needed))
        printf("  busbw to hide it %.1f GB/s (t = backward)\n", o->busbw_needed / 1e9);
    else
        printf("  busbw to hide it none: the backward time is 0\n");
}

/* --terse: what a program reads back (times in seconds). */
static void report_terse(const hp_plan_in_t *in, const hp_plan_out_t *o)
{
    printf("busbw=%.6g t_s=%.6g bw_exposed_s=%.6g exposed_s=%.6g last_bucket_s=%.6g "
           "bucket_bytes=%llu buckets=%llu latency_s=%.6g verdict=%s\n", in->busbw, o->t_s,
           o->bw_exposed_s, o->exposed_s, o->last_bucket_s, (unsigned long long)o->bucket_bytes,
           (unsigned long long)o->nbuckets, o->latency_s,
           o->verdict == HP_PLAN_PARTLY_EXPOSED ? "partly_exposed"
                                                : hp_plan_verdict_name(o->verdict));
}

int main(int argc, char **argv)
{
    hp_plan_opts_t o;
    char err[300];
    hp_plan_opts_default(&o);
    if (hp_plan_opts_parse(argc, argv, &o, err, sizeof err) != 0) {
        fprintf(stderr, "hcoll_plan: %s\n%s", err, hp_plan_usage());
        return 2;
    }
    if (o.help) {
        fputs(hp_plan_usage(), stdout);
        return 0;
    }
    hp_plan_in_t in = { o.bytes,     o.backward_s, o.nodes, o.ranks_per_node,
                        0 /* busbw */, o.latency_s, o.bucket };
    int n = o.nodes * o.ranks_per_node;
    char bytes[32], back[32];
    hp_format_bytes(o.bytes, 1, bytes, sizeof bytes);
    snprintf(back, sizeof back, "%g ms", o.backward_s * 1e3);
    if (!o.terse)
        printf("# %s of gradients per rank, backward %s, %d nodes x %d ranks = %d ranks\n",
               bytes, back, o.nodes, o.ranks_per_node, n);

    double list[8];
    char sources[8][200];
    int nlist = 0;
    if (o.nbusbw) {
        for (int i = 0; i < o.nbusbw; i++) {
            list[nlist] = o.busbw[i];
            snprintf(sources[nlist++], sizeof sources[0], "given");
        }
    } else if (o.json) {
        double busbw, lat_us;
        int jn, jnodes;
        if (hp_json_read_busbw(o.json, &busbw, &lat_us, &jn, &jnodes, err, sizeof err) != 0) {
            fprintf(stderr, "hcoll_plan: %s\n", err);
            return 1;
        }
        list[nlist] = busbw * 1e9;
        snprintf(sources[nlist++], sizeof sources[0],
                 "plateau of %s, measured on %d ranks / %d nodes", o.json, jn, jnodes);
        if (jn != n && !o.terse)
            printf("# note: busbw was measured on %d ranks, the plan is for %d; busbw usually "
                   "holds across scale on the same NICs, but measure at scale when you can\n",
                   jn, n);
        if (in.latency_s <= 0 && lat_us > 0)
            in.latency_s = lat_us * 1e-6;
    } else {
        list[nlist] = hp_busbw_from_nic(o.line_rate * o.efficiency / 1e9, o.nodes,
                                        o.ranks_per_node) * 1e9;
        snprintf(sources[nlist++], sizeof sources[0],
                 "line rate %.1f GB/s x %.0f%% per NIC x (n-1)/(N-1) = %d/%d", o.line_rate / 1e9,
                 o.efficiency * 100, n - 1, o.nodes - 1);
    }
    int rc = 0;
    for (int i = 0; i < nlist; i++) {
        hp_plan_out_t out;
        in.busbw = list[i];
        if (hp_plan_compute(&in, &out) != 0) {
            fprintf(stderr, "hcoll_plan: invalid input\n");
            return 2;
        }
        if (o.terse) {
            report_terse(&in, &out);
            continue;
        }
        printf("\n");
        report(&in, &out, sources[i]);
    }
    return rc;
}
