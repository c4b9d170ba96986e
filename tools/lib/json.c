/*
 * hcoll_perf's JSON: one object, one row per line, so that hcoll_plan (and
 * grep, and a notebook) can read it without a JSON library. The reader
 * reads only what this writer writes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

/* JSON has no NaN or infinity; unknown values are null. */
static void num(FILE *f, const char *key, double v, int known)
{
    if (known && isfinite(v))
        fprintf(f, "\"%s\": %.6g", key, v);
    else
        fprintf(f, "\"%s\": null", key);
}

static void result(FILE *f, const char *key, const hp_result_t *r)
{
    fprintf(f, "\"%s\": {", key);
    num(f, "time_us", r->time_us, 1);
    fputs(", ", f);
    num(f, "algbw", r->algbw, 1);
    fputs(", ", f);
    num(f, "busbw", r->busbw, 1);
    fputs(", ", f);
    if (r->wrong >= 0)
        fprintf(f, "\"wrong\": %lld}", (long long)r->wrong);
    else
        fputs("\"wrong\": null}", f);
}

/* Strings come from our own tables and file names; escape what JSON needs. */
static void str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int hp_json_write(FILE *f, const hp_meta_t *m, const hp_row_t *rows, int nrows)
{
    fputs("{\n  \"tool\": \"hcoll_perf\", \"coll\": ", f);
    str(f, hp_coll_name(m->coll));
    fputs(",\n", f);
    fprintf(f, "  \"nranks\": %d, \"nodes\": %d, \"ranks_per_node\": %d,\n", m->nranks, m->nodes,
            m->ranks_per_node);
    fputs("  ", f);
    num(f, "line_rate_GBps", m->line_bps / 1e9, m->line_bps > 0);
    fputs(", \"line_rate_source\": ", f);
    str(f, m->line_source);
    fputs(",\n  \"verdict\": ", f);
    str(f, m->verdict);
    fputs(", ", f);
    num(f, "plateau_nic_pct", m->plateau_pct, m->plateau_pct >= 0);
    fputs(",\n  \"rows\": [\n", f);
    for (int i = 0; i < nrows; i++) {
        const hp_row_t *r = &rows[i];
        fputs("    {\"impl\": ", f);
        str(f, r->impl);
        fputs(", \"coll\": ", f);
        str(f, hp_coll_name(r->coll));
        fprintf(f, ", \"size\": %llu, \"count\": %zu, \"type\": ", (unsigned long long)r->bytes,
                r->count);
        str(f, hcoll_dtype_name(r->dtype));
        fputs(", \"redop\": ", f);
        if (hp_coll_reduces(r->coll))
            str(f, hcoll_op_name(r->op));
        else
            fputs("null", f);
        fputs(", ", f);
        result(f, "oop", &r->oop);
        fputs(", ", f);
        result(f, "ip", &r->ip);
        fputs(", ", f);
        num(f, "nic_GBps", r->nic_gbs, r->nic_gbs >= 0);
        fputs(", ", f);
        num(f, "nic_pct", r->nic_pct, r->nic_pct >= 0);
        fputs(", ", f);
        if (r->have_stages) {
            /* A stage the library did not time (< 0) is null. */
            static const char *keys[HP_NSTAGES] = { "intra_rs", "inter", "intra_ag" };
            fputs("\"stages_us\": {", f);
            for (int k = 0; k < HP_NSTAGES; k++) {
                num(f, keys[k], r->stage_us[k], r->stage_us[k] >= 0);
                fputs(k + 1 < HP_NSTAGES ? ", " : "}", f);
            }
        } else
            fputs("\"stages_us\": null", f);
        fputs(", ", f);
        num(f, "hcoll_over_peer", r->ratio, r->ratio >= 0);
        fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
    }
    fputs("  ]\n}\n", f);
    return ferror(f) ? -1 : 0;
}

/* The number after "key": in line, or NAN (null or absent). */
static double field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p)
        return NAN;
    p += strlen(pat);
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

int hp_json_read_busbw(const char *path, double *busbw_out, double *latency_us_out,
                       int *nranks_out, int *nodes_out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    hp_row_t *rows = NULL;
    int nrows = 0, cap = 0, nranks = 0, nodes = 0, is_perf = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "\"tool\": \"hcoll_perf\"")) {
            is_perf = 1;
            /* Older files name no collective: they are all-reduces. */
            const char *c = strstr(line, "\"coll\": \"");
            if (c && strncmp(c + strlen("\"coll\": \""), "allreduce\"", 10) != 0)
                is_perf = -1;
        }
        if (strstr(line, "\"nranks\": ")) {
            nranks = (int)field(line, "nranks");
            nodes = (int)field(line, "nodes");
        }
        if (!strstr(line, "{\"impl\": \"hcoll\""))
            continue;
        /* Only busbw and time matter here; the two results are found in
         * order, oop first. */
        const char *ip = strstr(line, "\"ip\": {");
        const char *oop = strstr(line, "\"oop\": {");
        double size = field(line, "size");
        if (!ip || !oop || !isfinite(size))
            continue;
        if (nrows == cap) {
            cap = cap ? 2 * cap : 32;
            hp_row_t *n = realloc(rows, (size_t)cap * sizeof *n);
            if (!n)
                break;
            rows = n;
        }
        hp_row_t *r = &rows[nrows++];
        memset(r, 0, sizeof *r);
        snprintf(r->impl, sizeof r->impl, "hcoll");
        r->bytes = (uint64_t)size;
        r->oop.busbw = field(oop, "busbw");
        r->oop.time_us = field(oop, "time_us");
        r->ip.busbw = field(ip, "busbw");
        r->ip.time_us = field(ip, "time_us");
        r->nic_gbs = r->nic_pct = -1;
    }
    fclose(f);
    int rc = -1;
    double pct, nic, bus;
    uint64_t from;
    if (!is_perf) {
        snprintf(err, errlen, "%s: not a JSON file written by hcoll_perf -J", path);
    } else if (is_perf < 0) {
        snprintf(err, errlen, "%s: not an all-reduce run (hcoll_perf -o allreduce)", path);
    } else if (nrows == 0 || hp_plateau(rows, nrows, "hcoll", &pct, &nic, &bus, &from) == 0 ||
               !isfinite(bus) || bus <= 0) {
        snprintf(err, errlen, "%s: no hcoll rows with a busbw", path);
    } else {
        double lat = INFINITY;
        uint64_t smallest = UINT64_MAX;
        for (int i = 0; i < nrows; i++) {
            if (rows[i].bytes < smallest) {
                smallest = rows[i].bytes;
                lat = fmin(rows[i].oop.time_us, rows[i].ip.time_us);
            }
        }
        *busbw_out = bus;
        *latency_us_out = isfinite(lat) ? lat : -1;
        *nranks_out = nranks;
        *nodes_out = nodes;
        rc = 0;
    }
    free(rows);
    return rc;
}
