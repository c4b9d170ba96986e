/* Units for the tools' flags: sizes, rates, times, types. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

/* A finite number >= 0 followed by a suffix; *rest_out points at it. */
static int parse_number(const char *s, double *v_out, const char **rest_out)
{
    if (!s || !*s || isspace((unsigned char)*s) || *s == '-' || *s == '+')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    *v_out = v;
    *rest_out = end;
    return 0;
}

typedef struct unit {
    const char *name;
    double mult;
} unit_t;

static int match_unit(const unit_t *units, const char *suffix, double *mult_out)
{
    for (; units->name; units++) {
        if (strcmp(units->name, suffix) == 0) {
            *mult_out = units->mult;
            return 0;
        }
    }
    return -1;
}

int hp_parse_size(const char *s, uint64_t *bytes_out)
{
    /* Single letters follow nccl-tests (-e 128M is 2^27); B/KB/MB with an
     * explicit B are SI, as disk and network vendors write them. */
    static const unit_t units[] = {
        { "", 1 }, { "B", 1 },
        { "K", 0x1p10 }, { "k", 0x1p10 }, { "KiB", 0x1p10 }, { "KB", 1e3 }, { "kB", 1e3 },
        { "M", 0x1p20 }, { "m", 0x1p20 }, { "MiB", 0x1p20 }, { "MB", 1e6 },
        { "G", 0x1p30 }, { "g", 0x1p30 }, { "GiB", 0x1p30 }, { "GB", 1e9 },
        { "T", 0x1p40 }, { "t", 0x1p40 }, { "TiB", 0x1p40 }, { "TB", 1e12 },
        { NULL, 0 },
    };
    double v, mult;
    const char *rest;
    if (parse_number(s, &v, &rest) != 0 || match_unit(units, rest, &mult) != 0)
        return -1;
    double b = v * mult;
    if (b >= 0x1p63 || b != floor(b))
        return -1;
    *bytes_out = (uint64_t)b;
    return 0;
}

int hp_parse_rate(const char *s, double *bytes_per_s_out)
{
    static const unit_t units[] = {
        { "", 1 }, { "B/s", 1 }, { "Bps", 1 },
        { "KB/s", 1e3 }, { "MB/s", 1e6 }, { "GB/s", 1e9 }, { "TB/s", 1e12 },
        { "KiB/s", 0x1p10 }, { "MiB/s", 0x1p20 }, { "GiB/s", 0x1p30 },
        { "bit", 1 / 8.0 }, { "bit/s", 1 / 8.0 }, { "bps", 1 / 8.0 }, { "b/s", 1 / 8.0 },
        { "Kbit", 1e3 / 8 }, { "Kbit/s", 1e3 / 8 }, { "Kbps", 1e3 / 8 }, { "Kb/s", 1e3 / 8 },
        { "Mbit", 1e6 / 8 }, { "Mbit/s", 1e6 / 8 }, { "Mbps", 1e6 / 8 }, { "Mb/s", 1e6 / 8 },
        { "Gbit", 1e9 / 8 }, { "Gbit/s", 1e9 / 8 }, { "Gbps", 1e9 / 8 }, { "Gb/s", 1e9 / 8 },
        { "Tbit", 1e12 / 8 }, { "Tbit/s", 1e12 / 8 }, { "Tbps", 1e12 / 8 }, { "Tb/s", 1e12 / 8 },
        { NULL, 0 },
    };
    double v, mult;
    const char *rest;
    if (parse_number(s, &v, &rest) != 0 || match_unit(units, rest, &mult) != 0 || v <= 0)
        return -1;
    *bytes_per_s_out = v * mult;
    return 0;
}

int hp_parse_time(const char *s, double default_unit_s, double *seconds_out)
{
    static const unit_t units[] = {
        { "ns", 1e-9 }, { "us", 1e-6 }, { "ms", 1e-3 }, { "s", 1 }, { "min", 60 },
        { NULL, 0 },
    };
    double v, mult;
    const char *rest;
    if (parse_number(s, &v, &rest) != 0)
        return -1;
    if (*rest == '\0')
        mult = default_unit_s;
    else if (match_unit(units, rest, &mult) != 0)
        return -1;
    *seconds_out = v * mult;
    return 0;
}

int hp_parse_int(const char *s, int min, int max, int *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < min || v > max)
        return -1;
    *out = (int)v;
    return 0;
}

int hp_parse_dtype(const char *s, hcoll_dtype_t *out)
{
    static const struct { const char *name; hcoll_dtype_t t; } names[] = {
        { "float", HCOLL_FLOAT32 }, { "float32", HCOLL_FLOAT32 }, { "fp32", HCOLL_FLOAT32 },
        { "half", HCOLL_FLOAT16 }, { "float16", HCOLL_FLOAT16 }, { "fp16", HCOLL_FLOAT16 },
        { "bfloat16", HCOLL_BFLOAT16 }, { "bf16", HCOLL_BFLOAT16 },
        { "double", HCOLL_FLOAT64 }, { "float64", HCOLL_FLOAT64 }, { "fp64", HCOLL_FLOAT64 },
        { "int8", HCOLL_INT8 }, { "char", HCOLL_INT8 }, { "uint8", HCOLL_UINT8 },
        { "int32", HCOLL_INT32 }, { "int", HCOLL_INT32 }, { "int64", HCOLL_INT64 },
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].t;
            return 0;
        }
    }
    return -1;
}

int hp_parse_op(const char *s, hcoll_op_t *out)
{
    static const struct { const char *name; hcoll_op_t op; } names[] = {
        { "sum", HCOLL_SUM }, { "prod", HCOLL_PROD }, { "max", HCOLL_MAX },
        { "min", HCOLL_MIN }, { "avg", HCOLL_AVG },
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].op;
            return 0;
        }
    }
    return -1;
}

static const struct {
    const char *name;
    hp_coll_t c;
} coll_names[] = {
    { "allreduce", HP_COLL_ALLREDUCE },         { "all_reduce", HP_COLL_ALLREDUCE },
    { "reduce_scatter", HP_COLL_REDUCE_SCATTER }, { "reducescatter", HP_COLL_REDUCE_SCATTER },
    { "allgather", HP_COLL_ALLGATHER },         { "all_gather", HP_COLL_ALLGATHER },
    { "broadcast", HP_COLL_BROADCAST },         { "bcast", HP_COLL_BROADCAST },
};

int hp_parse_coll(const char *s, hp_coll_t *out)
{
    for (size_t i = 0; s && i < sizeof coll_names / sizeof coll_names[0]; i++) {
        if (strcmp(s, coll_names[i].name) == 0) {
            *out = coll_names[i].c;
            return 0;
        }
    }
    return -1;
}

const char *hp_coll_name(hp_coll_t c)
{
    switch (c) {
    case HP_COLL_ALLREDUCE: return "allreduce";
    case HP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case HP_COLL_ALLGATHER: return "allgather";
    case HP_COLL_BROADCAST: return "broadcast";
    case HP_NCOLLS: break;
    }
    return "?";
}

void hp_format_bytes(double bytes, int si, char *buf, size_t len)
{
    static const char *bin[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    static const char *dec[] = { "B", "KB", "MB", "GB", "TB" };
    double base = si ? 1000 : 1024, v = bytes;
    int u = 0;
    while (v >= base && u < 4)
        v /= base, u++;
    if (v == floor(v))
        snprintf(buf, len, "%.0f %s", v, si ? dec[u] : bin[u]);
    else
        snprintf(buf, len, "%.2f %s", v, si ? dec[u] : bin[u]);
}
