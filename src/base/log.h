/*
 * Logging in NCCL's manner: HCOLL_DEBUG picks the level (NONE, WARN, INFO,
 * TRACE), HCOLL_DEBUG_SUBSYS the subsystems (comma list, ^ to exclude),
 * HCOLL_DEBUG_FILE the destination (%h host, %p pid; default stderr).
 * Every line carries host, pid and rank:
 *   myhost:4242:4247 [3] NET INFO rank 3 -> rail 1 eth1 198.18.1.2
 *
 * The settings are read once per process, through the config table's
 * parser (base/config.h), and never change afterwards, so they are not
 * shared mutable state. A malformed value leaves its setting at the table's
 * default here (logging has no caller to fail); every communicator init
 * rejects it, naming the variable.
 */
#ifndef HC_LOG_H
#define HC_LOG_H

#include <stdarg.h>
#include <stddef.h>

typedef enum hc_log_level {
    HC_LOG_NONE  = 0,
    HC_LOG_WARN  = 1,
    HC_LOG_INFO  = 2,
    HC_LOG_TRACE = 3,
} hc_log_level_t;

/* Subsystems: one bit each. Names as HCOLL_DEBUG_SUBSYS spells them. */
#define HC_SUBSYS_MAP(X) \
    X(INIT, 0)           \
    X(BOOT, 1)           \
    X(NET,  2)           \
    X(ENV,  3)           \
    X(COLL, 4)           \
    X(SHM,  5)           \
    X(GDR,  6)           \
    X(TUNE, 7)

#define HC_SUBSYS_ENUM_(name, bit) HC_##name = 1u << (bit),
enum { HC_SUBSYS_MAP(HC_SUBSYS_ENUM_) HC_ALL = 0xffu };
#undef HC_SUBSYS_ENUM_

/* Is a message of this level and subsystem printed? Cheap; use it to skip
 * building expensive messages. */
int hc_log_enabled(hc_log_level_t level, unsigned subsys);

/* rank < 0 prints as [-]. */
void hc_log(hc_log_level_t level, unsigned subsys, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void hc_vlog(hc_log_level_t level, unsigned subsys, int rank, const char *fmt,
             va_list ap);

#define HC_WARN(sub, rank, ...)  hc_log(HC_LOG_WARN, (sub), (rank), __VA_ARGS__)
#define HC_INFO(sub, rank, ...)                                     \
    do {                                                            \
        if (hc_log_enabled(HC_LOG_INFO, (sub)))                     \
            hc_log(HC_LOG_INFO, (sub), (rank), __VA_ARGS__);        \
    } while (0)
#define HC_TRACE(sub, rank, ...)                                    \
    do {                                                            \
        if (hc_log_enabled(HC_LOG_TRACE, (sub)))                    \
            hc_log(HC_LOG_TRACE, (sub), (rank), __VA_ARGS__);       \
    } while (0)

#endif
