/*
 * What rank 0 of hcoll_perf prints (see perf_rank.h): nccl-tests' table
 * with hcoll's NIC and stage columns, the summary lines, the NIC verdict
 * on the plateau, and the -J (JSON) and --plot (gnuplot PNG) outputs.
 * The format is what scripts and tests read: change it only with them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perf_rank.h"

static void fmt_time(char *b, size_t n, double us)
{
    snprintf(b, n, us >= 10000 ? "%.0f" : "%.2f", us);
}

static void print_result(const hp_result_t *r)
{
    char t[32], w[32];
    fmt_time(t, sizeof t, r->time_us);
    if (r->wrong >= 0)
        snprintf(w, sizeof w, "%lld", (long long)r->wrong);
    else
        snprintf(w, sizeof w, "N/A");
    printf("  %9s  %7.2f  %7.2f  %6s", t, r->algbw, r->busbw, w);
}

void hp_print_row(const hp_perf_t *p, const hp_row_t *r)
{
    printf("%12llu  %12zu  %8s  %14s  %6s  %5s", (unsigned long long)r->bytes, r->count,
           hcoll_dtype_name(r->dtype), hp_coll_name(r->coll),
           hp_coll_reduces(r->coll) ? hcoll_op_name(r->op) : "-", r->impl);
    print_result(&r->oop);
    print_result(&r->ip);
    char nic[32] = "-", pct[32] = "-";
    if (r->nic_gbs >= 0)
        snprintf(nic, sizeof nic, "%.2f", r->nic_gbs);
    if (r->nic_pct >= 0)
        snprintf(pct, sizeof pct, "%.1f", r->nic_pct);
    printf("  %7s  %6s", nic, pct);
    if (p->o.stages) {
        /* A stage the library did not time (< 0) shows '-', and then no
         * split is given. */
        char us[HP_NSTAGES][16], pc[HP_NSTAGES][16];
        double sum = 0;
        int all = r->have_stages;
        for (int k = 0; k < HP_NSTAGES; k++) {
            if (r->have_stages && r->stage_us[k] >= 0) {
                snprintf(us[k], sizeof us[k], "%.1f", r->stage_us[k]);
                sum += r->stage_us[k];
            } else {
                snprintf(us[k], sizeof us[k], "-");
                all = 0;
            }
        }
        for (int k = 0; k < HP_NSTAGES; k++) {
            if (all)
                snprintf(pc[k], sizeof pc[k], "%.1f", 100 * r->stage_us[k] / (sum > 0 ? sum : 1));
            else
                snprintf(pc[k], sizeof pc[k], "-");
        }
        printf("  %8s %8s %8s  %5s %5s %5s", us[0], us[1], us[2], pc[0], pc[1], pc[2]);
    }
    printf("  %10s", r->algo[0] ? r->algo : "-");
    if (p->peer) {
        if (r->ratio >= 0)
            printf("  %9.2f", r->ratio);
        else
            printf("  %9s", "-");
    }
    putchar('\n');
    fflush(stdout);
}

void hp_print_header(const hp_perf_t *p)
{
    printf("#\n#%66s  %-35s  %-35s  %-15s", "", "out-of-place", "in-place", "NIC");
    if (p->o.stages)
        printf("  %-45s", "stages: intra RS / inter / intra AG");
    printf("  %10s", "");
    printf("\n#%11s  %12s  %8s  %14s  %6s  %5s", "size", "count", "type", "coll", "redop", "impl");
    for (int k = 0; k < 2; k++)
        printf("  %9s  %7s  %7s  %6s", "time", "algbw", "busbw", "#wrong");
    printf("  %7s  %6s", "nicbw", "%line");
    if (p->o.stages)
        printf("  %8s %8s %8s  %5s %5s %5s", "rs", "inter", "ag", "rs%", "int%", "ag%");
    printf("  %10s", "algo");
    if (p->peer)
        printf("  %9s", "hcoll/peer");
    printf("\n#%11s  %12s  %8s  %14s  %6s  %5s", "(B)", "(elements)", "", "", "", "");
    for (int k = 0; k < 2; k++)
        printf("  %9s  %7s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
    printf("  %7s  %6s", "(GB/s)", "");
    if (p->o.stages)
        printf("  %8s %8s %8s  %5s %5s %5s", "(us)", "(us)", "(us)", "", "", "");
    printf("  %10s", "");
    if (p->peer)
        printf("  %9s", "(busbw)");
    printf("\n");
}

double hp_row_best_busbw(const hp_row_t *r)
{
    return r->oop.busbw > r->ip.busbw ? r->oop.busbw : r->ip.busbw;
}

static const char *print_verdict(const hp_perf_t *p, double *pct_out)
{
    double pct, nic, bus;
    uint64_t from;
    char sz[64];
    *pct_out = -1;
    if (hp_plateau(p->rows, p->nrows, "hcoll", &pct, &nic, &bus, &from) == 0)
        return "unknown";
    hp_format_bytes((double)from, 0, sz, sizeof sz);
    printf("#\n# NIC verdict (plateau: %s%s):\n", from >= HP_PLATEAU_BYTES ? "sizes >= " : "",
           from >= HP_PLATEAU_BYTES ? sz : strcat(sz, ", the largest size run"));
    if (p->nodes <= 1) {
        printf("#   none: all %d ranks are on one node, nothing crosses a NIC "
               "(--ranks-per-node emulates nodes)\n", p->nranks);
        return "unknown";
    }
    if (pct < 0) {
        printf("#   unknown: NIC bandwidth %.2f GB/s per NIC, but the line rate is %s; "
               "give --line-rate\n", nic, p->line_src);
        return "unknown";
    }
    hp_verdict_t v = hp_verdict_of(pct);
    printf("#   NIC bandwidth %.2f GB/s per NIC = %.1f%% of the line rate %.2f GB/s (%s)\n", nic,
           pct, p->line_bps / 1e9, p->line_src);
    printf("#   %s (%s)\n", hp_verdict_name(v), hp_verdict_range(v));
    if (v == HP_VERDICT_PROBLEM || v == HP_VERDICT_POOR) {
        printf("#   the usual suspects:\n");
        const char *s = hp_verdict_suspects();
        while (*s) {
            size_t n = strcspn(s, "\n");
            printf("# %.*s\n", (int)n, s);
            s += n + (s[n] == '\n');
        }
    }
    *pct_out = pct;
    return hp_verdict_name(v);
}

static int write_plot(const hp_perf_t *p, const char *png)
{
    char dir[] = "/tmp/hcoll_perf_plot.XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "hcoll_perf: --plot: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    const char *impls[2] = { "hcoll", p->peer ? p->peer->name : NULL };
    char path[2][256];
    for (int k = 0; k < 2 && impls[k]; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s.dat", dir, impls[k]);
        FILE *f = fopen(path[k], "w");
        if (!f)
            return -1;
        for (int i = 0; i < p->nrows; i++)
            if (strcmp(p->rows[i].impl, impls[k]) == 0)
                fprintf(f, "%llu %g %g\n", (unsigned long long)p->rows[i].bytes,
                        hp_row_best_busbw(&p->rows[i]),
                        p->rows[i].nic_pct >= 0 ? p->rows[i].nic_pct : NAN);
        fclose(f);
    }
    char script[256];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *g = fopen(script, "w");
    if (!g)
        return -1;
    fprintf(g, "set terminal png size 1000,600 noenhanced\nset output '%s'\n", png);
    fprintf(g, "set title 'hcoll_perf %s: %d ranks, %d nodes x %d, %s %s'\n",
            hp_coll_name(p->o.coll), p->nranks, p->nodes, p->local_size,
            hcoll_dtype_name(p->o.dtype),
            hp_coll_reduces(p->o.coll) ? hcoll_op_name(p->o.op) : "");
    fprintf(g, "set logscale x 2\nset format x '%%.0b %%BB'\nset xlabel 'size'\nset ylabel 'busbw (GB/s)'\n"
               "set y2label 'NIC %% of line rate'\nset y2tics\nset ytics nomirror\n"
               "set key top left\nset grid\nset datafile missing 'nan'\n");
    fprintf(g, "plot '%s' u 1:2 w lp t 'hcoll busbw', '%s' u 1:3 axes x1y2 w lp t 'hcoll NIC %%'",
            path[0], path[0]);
    if (impls[1])
        fprintf(g, ", '%s' u 1:2 w lp t '%s busbw', '%s' u 1:3 axes x1y2 w lp t '%s NIC %%'",
                path[1], impls[1], path[1], impls[1]);
    fprintf(g, "\n");
    fclose(g);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        fprintf(stderr, "hcoll_perf: --plot: cannot run gnuplot (%s); install gnuplot-nox\n",
                strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "hcoll_perf: --plot: gnuplot failed; data and script kept in %s\n", dir);
        return -1;
    }
    unlink(path[0]);
    if (impls[1])
        unlink(path[1]);
    unlink(script);
    rmdir(dir);
    printf("# plot: %s\n", png);
    return 0;
}

void hp_print_preamble(const hp_perf_t *p)
{
    const hp_opts_t *o = &p->o;
    static const char *avg_names[] = { "rank 0's", "mean over ranks", "min over ranks",
                                       "max over ranks" };
    printf("# hcoll_perf (hcoll %s): %s, %d ranks, %d nodes x %d ranks/node, %s %s, -n %d "
           "-m %d -w %d -c %d -z %d, times: %s (-a %d)\n",
           HCOLL_VERSION_STRING, hp_coll_name(o->coll), p->nranks, p->nodes, p->local_size,
           hcoll_dtype_name(o->dtype), hp_coll_reduces(o->coll) ? hcoll_op_name(o->op) : "(no op)",
           o->iters, o->agg, o->warmup, o->check, o->blocking, avg_names[o->average],
           (int)o->average);
    if (o->coll == HP_COLL_REDUCE_SCATTER || o->coll == HP_COLL_ALLGATHER)
        printf("# size = the whole vector, nranks x count elements (count: each rank's %s)\n",
               o->coll == HP_COLL_REDUCE_SCATTER ? "recvcount" : "sendcount");
    if (o->coll == HP_COLL_BROADCAST)
        printf("# root: rank %d\n", o->root);
    if (p->gpu.cu)
        printf("# buffers: device memory; local rank i on GPU i mod #GPUs (rank 0: GPU %d, "
               "%s), one CUDA stream per rank\n", p->gpu.ordinal, p->gpu.busid);
    if (p->line_bps > 0)
        printf("# line rate: %.2f GB/s per NIC (%s)\n", p->line_bps / 1e9, p->line_src);
    else
        printf("# line rate: %s\n", p->line_src);
    if (o->check > 0 && !hp_checkable(p))
        printf("# -c: %d ranks is too many for exact %s %s values: #wrong not checked\n",
               p->nranks, hcoll_dtype_name(o->dtype), hcoll_op_name(o->op));
    if (p->peer)
        printf("# peer: %s on one flat communicator over all %d ranks, same buffers, "
               "alternating with hcoll per size\n", p->peer->name, p->nranks);
    hp_print_header(p);
}

/* -J: the rows and the verdict as JSON. 0 ok, 1 on a write error. */
static int write_json(const hp_perf_t *p, const char *verdict, double pct)
{
    int rc = 0;
    hp_meta_t m = { p->nranks, p->nodes,  p->local_size, p->line_bps,
                    p->line_src, verdict, pct,       p->o.coll };
    FILE *f = fopen(p->o.json, "w");
    if (!f || hp_json_write(f, &m, p->rows, p->nrows) != 0) {
        fprintf(stderr, "hcoll_perf: -J %s: %s\n", p->o.json, strerror(errno));
        rc = 1;
    }
    if (f && fclose(f) != 0)
        rc = 1;
    return rc;
}

/* -F: one CSV line per row (nccl-tests' columns, one header line, an
 * "impl" column first). 0 ok, 1 on a write error. */
static int write_csv(const hp_perf_t *p)
{
    FILE *f = fopen(p->o.csv, "w");
    int bad = !f;
    if (f) {
        fprintf(f, "impl,size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                   "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
        for (int i = 0; i < p->nrows; i++) {
            const hp_row_t *r = &p->rows[i];
            fprintf(f, "%s,%llu,%zu,%s,%s,%d,%.2f,%.4f,%.4f,%lld,%.2f,%.4f,%.4f,%lld\n", r->impl,
                    (unsigned long long)r->bytes, r->count, hcoll_dtype_name(r->dtype),
                    hp_coll_reduces(r->coll) ? hcoll_op_name(r->op) : "none",
                    r->coll == HP_COLL_BROADCAST ? p->o.root : -1, r->oop.time_us, r->oop.algbw,
                    r->oop.busbw, (long long)r->oop.wrong, r->ip.time_us, r->ip.algbw,
                    r->ip.busbw, (long long)r->ip.wrong);
        }
        bad = ferror(f) != 0;
        bad |= fclose(f) != 0;
    }
    if (bad)
        fprintf(stderr, "hcoll_perf: -F %s: %s\n", p->o.csv, strerror(errno));
    return bad;
}

int hp_print_summary(const hp_perf_t *p)
{
    const hp_opts_t *o = &p->o;
    int rc = 0;
    int64_t wrong = 0;
    for (int i = 0; i < p->nrows; i++)
        wrong += (p->rows[i].oop.wrong > 0 ? p->rows[i].oop.wrong : 0) +
                 (p->rows[i].ip.wrong > 0 ? p->rows[i].ip.wrong : 0);
    printf("# Out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n", hp_avg_busbw(p->rows, p->nrows, "hcoll"));
    if (p->peer)
        printf("# Avg bus bandwidth (%s) : %g\n", p->peer->name,
               hp_avg_busbw(p->rows, p->nrows, p->peer->name));
    if (o->stages && !p->stages_known)
        printf("# --stages: this library does not report per-stage times yet ('-')\n");
    double pct;
    const char *verdict = print_verdict(p, &pct);
    printf("#\n");
    if (wrong)
        rc = HP_EXIT_WRONG;
    if (o->json && write_json(p, verdict, pct) != 0)
        rc = 1;
    if (o->plot && write_plot(p, o->plot) != 0)
        rc = 1;
    if (o->csv && write_csv(p) != 0)
        rc = 1;
    return rc;
}
