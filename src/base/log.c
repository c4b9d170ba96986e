#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

/* Written once under pthread_once, read-only afterwards. */
static struct {
    pthread_once_t once;
    hc_log_level_t level;
    unsigned subsys;
    int fd;
    char host[64];
} g_log = { .once = PTHREAD_ONCE_INIT, .level = HC_LOG_WARN, .subsys = HC_ALL, .fd = 2 };

static const char *const level_names[] = { "NONE", "WARN", "INFO", "TRACE" };

#define HC_SUBSYS_NAME_(name, bit) { #name, 1u << (bit) },
static const struct { const char *name; unsigned bit; } subsys_names[] = {
    HC_SUBSYS_MAP(HC_SUBSYS_NAME_)
    { "ALL", HC_ALL },
};
#undef HC_SUBSYS_NAME_

int hc_log_level_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    /* NCCL users write VERSION; treat it as WARN (the version is logged at
     * INIT anyway). */
    if (strcasecmp(s, "VERSION") == 0)
        return HC_LOG_WARN;
    return -1;
}

int hc_log_subsys_parse(const char *s, unsigned *mask_out, char *err, size_t errlen)
{
    int exclude = 0;
    unsigned mask = 0;
    if (*s == '^') {
        exclude = 1;
        s++;
    }
    while (*s) {
        size_t n = strcspn(s, ",");
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
            if (strlen(subsys_names[i].name) == n && strncasecmp(s, subsys_names[i].name, n) == 0)
                bit = subsys_names[i].bit;
        if (n > 0 && !bit) {
            snprintf(err, errlen, "unknown subsystem '%.*s' (known: INIT,BOOT,NET,ENV,COLL,SHM,GDR,TUNE,ALL)",
                     (int)n, s);
            return -1;
        }
        mask |= bit;
        s += n;
        if (*s == ',')
            s++;
    }
    *mask_out = exclude ? (HC_ALL & ~mask) : mask;
    return 0;
}

/* Expand %h (host) and %p (pid) in a HCOLL_DEBUG_FILE pattern. */
static void expand_path(const char *pat, char *out, size_t outlen)
{
    size_t o = 0;
    for (const char *p = pat; *p && o + 1 < outlen; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            int n = p[1] == 'h' ? snprintf(out + o, outlen - o, "%s", g_log.host)
                                : snprintf(out + o, outlen - o, "%d", (int)getpid());
            if (n < 0 || (size_t)n >= outlen - o)
                break;
            o += (size_t)n;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static void log_write(hc_log_level_t level, unsigned subsys, int rank, const char *fmt,
                      va_list ap);

/* Warnings found while reading the settings: printed directly, since
 * hc_log would re-enter pthread_once. */
static void init_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void init_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_write(HC_LOG_WARN, HC_ENV, -1, fmt, ap);
    va_end(ap);
}

static void log_init(void)
{
    char err[160];

    if (gethostname(g_log.host, sizeof g_log.host) != 0)
        strcpy(g_log.host, "?");
    g_log.host[sizeof g_log.host - 1] = '\0';
    char *dot = strchr(g_log.host, '.');
    if (dot)
        *dot = '\0';

    const char *lv = getenv("HCOLL_DEBUG");
    if (lv && *lv) {
        int l = hc_log_level_parse(lv);
        if (l < 0) {
            init_warn("HCOLL_DEBUG='%s' is not a level (NONE, WARN, INFO, TRACE); using WARN", lv);
        } else {
            g_log.level = (hc_log_level_t)l;
        }
    }
    const char *ss = getenv("HCOLL_DEBUG_SUBSYS");
    if (ss && *ss) {
        unsigned mask;
        if (hc_log_subsys_parse(ss, &mask, err, sizeof err) != 0) {
            init_warn("HCOLL_DEBUG_SUBSYS: %s; logging all", err);
        } else {
            g_log.subsys = mask;
        }
    }
    const char *file = getenv("HCOLL_DEBUG_FILE");
    if (file && *file && g_log.level > HC_LOG_NONE) {
        char path[4096];
        expand_path(file, path, sizeof path);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0)
            init_warn("HCOLL_DEBUG_FILE: cannot open '%s': %s; logging to stderr", path,
                      strerror(errno));
        else
            g_log.fd = fd;
    }
}

int hc_log_enabled(hc_log_level_t level, unsigned subsys)
{
    pthread_once(&g_log.once, log_init);
    /* Warnings are never filtered by subsystem: they are what a user needs. */
    if (level == HC_LOG_WARN)
        return g_log.level >= HC_LOG_WARN;
    return g_log.level >= level && (g_log.subsys & subsys);
}

static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
        if (subsys_names[i].bit == subsys)
            return subsys_names[i].name;
    return "ALL";
}

void hc_vlog(hc_log_level_t level, unsigned subsys, int rank, const char *fmt, va_list ap)
{
    if (hc_log_enabled(level, subsys))
        log_write(level, subsys, rank, fmt, ap);
}

static void log_write(hc_log_level_t level, unsigned subsys, int rank, const char *fmt,
                      va_list ap)
{
    char line[1024];
    int n;
    if (rank >= 0)
        n = snprintf(line, sizeof line, "%s:%d:%d [%d] %s %s ", g_log.host, (int)getpid(),
                     (int)gettid(), rank, subsys_name(subsys), level_names[level]);
    else
        n = snprintf(line, sizeof line, "%s:%d:%d [-] %s %s ", g_log.host, (int)getpid(),
                     (int)gettid(), subsys_name(subsys), level_names[level]);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = m < 0 ? (size_t)n : (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* One write per line so that lines of concurrent threads and processes
     * sharing the file do not interleave. */
    ssize_t w;
    do {
        w = write(g_log.fd, line, len);
    } while (w < 0 && errno == EINTR);
}

void hc_log(hc_log_level_t level, unsigned subsys, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hc_vlog(level, subsys, rank, fmt, ap);
    va_end(ap);
}
