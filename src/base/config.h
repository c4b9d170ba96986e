/*
 * Every HCOLL_* knob lives in one table (config.c): name, kind, default,
 * bounds and help text. hcoll_info --env prints it; hc_params_load turns
 * environment + hcoll_config_t into one communicator's hc_params_t.
 *
 * Precedence: an explicit hcoll_config_t field, then the environment, then
 * the table's default. A malformed value is an error naming the variable,
 * the value and what was expected: never silently replaced by a default.
 *
 * This is the only place that reads or parses an HCOLL_* variable. Logging
 * (base/log.c) takes HCOLL_DEBUG* from here too, once per process and before
 * any communicator exists; it keeps its default for a malformed value, which
 * hc_params_load, run by every communicator init, then rejects. So that
 * log.c can call it, config.c calls nothing in base (no log, no hc_err_set).
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
    /* Communicator splitting and non-blocking init (core/comm.c). */
    int64_t rail;                         /* -1: the default rail (hcoll.h) */
    int blocking;                         /* config field only: 1 block, 0 not */
    /* Liveness (core/live.c): which wait each bounds is in the table. */
    int64_t liveness_ms;                  /* no sign of life this long: dead */
    int64_t op_timeout_ms;                /* an operation waits this long; 0 = none */
    int64_t init_timeout_ms;              /* init waits this long for every rank */
    int64_t ib_spin_us;                   /* verbs waits poll this long before sleeping */
    int64_t check_args;                   /* 1: ranks agree on every host call's arguments */
    int64_t ib_qps_per_peer;              /* verbs: RC QPs per peer, puts striped over them */
    int64_t ib_relaxed_ordering;          /* -1 auto, 0 off, 1 on */
    /* Algorithm choice by size (core/algo.c). */
    char algo[HC_PARAM_STR_MAX];          /* HCOLL_ALGO, parsed by core/algo.c */
    int64_t spin_us;                      /* latency path: poll this long before sleeping */
    uint64_t tcp_rcvlowat;                /* TCP: largest SO_RCVLOWAT, 0 = never set */
    char algo_model[HC_PARAM_STR_MAX];    /* HCOLL_ALGO_MODEL, parsed by core/algo_model.c */
} hc_params_t;

typedef enum hc_knob_kind {
    HC_KNOB_INT,    /* int64_t within [min, max] */
    HC_KNOB_SIZE,   /* uint64_t, suffixes K/M/G(iB), within [min, max] */
    HC_KNOB_ENUM,   /* int: index into choices (case-insensitive) */
    HC_KNOB_STR,    /* char[HC_PARAM_STR_MAX] */
    HC_KNOB_LIST,   /* like STR, validated as NCCL list syntax */
    HC_KNOB_SUBSYS, /* logging subsystems (base/log.h): comma list, ^ excludes */
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

/* One parsed value, in the member its knob's kind names. */
typedef union hc_knob_value {
    int64_t i;       /* INT */
    uint64_t size;   /* SIZE */
    int choice;      /* ENUM: index into choices */
    unsigned mask;   /* SUBSYS: HC_INIT | HC_NET ... (base/log.h) */
    const char *str; /* STR, LIST: the text itself, not copied */
} hc_knob_value_t;

/*
 * Every function below that can fail returns HCOLL_SUCCESS, or
 * HCOLL_ERR_INVALID_ARG with a message in err naming the variable (or the
 * config field), the value and what was expected. They record nothing
 * themselves: logging reads its settings through them, so the caller
 * (layer >= 2, holding an hc_errbuf_t) records the message with hc_err_set.
 */

/* The table, in display order. */
const hc_knob_t *hc_knobs(size_t *count_out);
const hc_knob_t *hc_knob_find(const char *name);

/* Parse text as knob k: the one parser of every HCOLL_* variable. */
hcoll_status_t hc_knob_value(const hc_knob_t *k, const char *text, hc_knob_value_t *value_out,
                             char *err, size_t errlen);

/* hc_knob_value, then store the value into p when p is not NULL and k has
 * a field there (p NULL: validate only). */
hcoll_status_t hc_knob_parse(const hc_knob_t *k, const char *text, hc_params_t *p, char *err,
                             size_t errlen);

/* The value in force from the environment, or the default when unset or
 * empty; *from_env_out (may be NULL) tells which. */
const char *hc_knob_current(const hc_knob_t *k, int *from_env_out);

/* hc_knob_value of the text in force for the variable called name (the
 * process-wide knobs, such as logging's, read one variable at a time). */
hcoll_status_t hc_knob_env(const char *name, hc_knob_value_t *value_out, char *err,
                           size_t errlen);

/* Check that cfg came from HCOLL_CONFIG_INITIALIZER (NULL is fine). */
hcoll_status_t hc_config_check(const hcoll_config_t *cfg, char *err, size_t errlen);

/* Environment + cfg (may be NULL) → params, written only on success. */
hcoll_status_t hc_params_load(hc_params_t *params_out, const hcoll_config_t *cfg, char *err,
                              size_t errlen);

/* "64M" → 67108864. HCOLL_SUCCESS, or HCOLL_ERR_INVALID_ARG when s is not
 * a size (no message: the caller knows what s stands for). */
hcoll_status_t hc_parse_size(const char *s, uint64_t *out);

#endif
