/*
 * Every HCOLL_* knob lives in one table (config.c): name, kind, default,
 * bounds and help text. hcoll_info --env prints it; hc_params_load turns
 * environment + hcoll_config_t into one communicator's hc_params_t.
 *
 * Precedence: an explicit hcoll_config_t field, then the environment, then
 * the table's default. A malformed value is an error naming the variable,
 * the value and what was expected: never silently replaced by a default.
 */
#ifndef HC_CONFIG_H
#define HC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "hcoll.h"

#define HC_PARAM_STR_MAX 256

enum hc_net_kind { HC_NET_AUTO = 0, HC_NET_IB = 1, HC_NET_TCP = 2 };
enum hc_gdr_level { HC_GDR_LOC = 0, HC_GDR_PIX, HC_GDR_PXB, HC_GDR_PHB, HC_GDR_SYS };

typedef struct hc_params {
    int net;                              /* enum hc_net_kind */
    char socket_ifname[HC_PARAM_STR_MAX]; /* NCCL list syntax */
    int64_t nsocks_perpeer;
    uint64_t socket_buf;                  /* 0: kernel autotuning */
    char ib_hca[HC_PARAM_STR_MAX];
    int64_t ib_gid_index;                 /* -1: choose automatically */
    int64_t ib_tc;
    int64_t ib_sl;
    int64_t ib_timeout;
    int64_t ib_retry_cnt;
    int gdr_level;                        /* enum hc_gdr_level */
    int64_t gdr_flush;                    /* -1 auto, 0 off, 1 on */
    char sysfs_root[HC_PARAM_STR_MAX];    /* "" = "/" */
    int64_t timeout_ms;
    uint64_t chunk_bytes;
    uint64_t small_bytes;                 /* at most this: latency path (coll.c) */
    char hostid[HC_PARAM_STR_MAX];        /* "" = hostname + boot id */
} hc_params_t;

typedef enum hc_knob_kind {
    HC_KNOB_INT,  /* int64_t within [min, max] */
    HC_KNOB_SIZE, /* uint64_t, suffixes K/M/G(iB), within [min, max] */
    HC_KNOB_ENUM, /* int: index into choices (case-insensitive) */
    HC_KNOB_STR,  /* char[HC_PARAM_STR_MAX] */
    HC_KNOB_LIST, /* like STR, validated as NCCL list syntax */
} hc_knob_kind_t;

#define HC_KNOB_NOT_STORED SIZE_MAX

typedef struct hc_knob {
    const char *name;            /* full variable name, HCOLL_... */
    hc_knob_kind_t kind;
    const char *defval;          /* as a user would write it; "" = unset */
    int64_t min, max;            /* INT and SIZE */
    const char *const *choices;  /* ENUM: NULL-terminated */
    int numeric_choices;         /* ENUM: also accept 0..n-1 */
    int secret;                  /* never print the value */
    size_t offset;               /* into hc_params_t, or HC_KNOB_NOT_STORED */
    const char *help;
} hc_knob_t;

/* The table, in display order. */
const hc_knob_t *hc_knobs(size_t *count_out);
const hc_knob_t *hc_knob_find(const char *name);

/* Parse value as knob k into p (p may be NULL to validate only). Returns 0,
 * or -1 with a message naming the variable, value and expectation. */
int hc_knob_parse(const hc_knob_t *k, const char *value, hc_params_t *p, char *err,
                  size_t errlen);

/* The value in force from the environment, or the default when unset or
 * empty; *from_env_out (may be NULL) tells which. */
const char *hc_knob_current(const hc_knob_t *k, int *from_env_out);

/* Check that cfg came from HCOLL_CONFIG_INITIALIZER (NULL is fine). */
int hc_config_check(const hcoll_config_t *cfg, char *err, size_t errlen);

/* Environment + cfg (may be NULL) → params. HCOLL_SUCCESS, or
 * HCOLL_ERR_INVALID_ARG with the message in err. */
hcoll_status_t hc_params_load(hc_params_t *params_out, const hcoll_config_t *cfg, char *err,
                              size_t errlen);

/* "64M" → 67108864. Returns 0, or -1 when not a size. */
int hc_parse_size(const char *s, uint64_t *out);

#endif
