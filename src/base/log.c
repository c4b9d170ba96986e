#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/config.h"

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

/* Warnings found while applying the settings: printed directly, since
 * hc_log would re-enter pthread_once. */
static void init_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void init_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_write(HC_LOG_WARN, HC_ENV, -1, fmt, ap);
    va_end(ap);
}

/* The value of a logging knob: the environment's, or the table's default
 * when the environment's is malformed. */
static int log_knob(const char *name, hc_knob_value_t *v)
{
    char err[256];
    if (hc_knob_env(name, v, err, sizeof err) == HCOLL_SUCCESS)
        return 1;
    const hc_knob_t *k = hc_knob_find(name);
    return k && hc_knob_value(k, k->defval, v, err, sizeof err) == HCOLL_SUCCESS;
}

/*
 * The settings come from the config table's parser (base/config.c), the
 * one place that parses HCOLL_* variables. Logging runs before any
 * communicator exists and has nowhere to return an error, so a malformed
 * value leaves that setting at its default here; hc_params_load, run by
 * every communicator init, rejects the same value with a message naming
 * the variable, so it is reported once, where the caller can see it.
 */
static void log_init(void)
{
    hc_knob_value_t v;

    if (gethostname(g_log.host, sizeof g_log.host) != 0)
        strcpy(g_log.host, "?");
    g_log.host[sizeof g_log.host - 1] = '\0';
    char *dot = strchr(g_log.host, '.');
    if (dot)
        *dot = '\0';

    if (log_knob("HCOLL_DEBUG", &v))
        g_log.level = (hc_log_level_t)v.choice;
    if (log_knob("HCOLL_DEBUG_SUBSYS", &v))
        g_log.subsys = v.mask;
    if (g_log.level > HC_LOG_NONE && log_knob("HCOLL_DEBUG_FILE", &v) && v.str[0]) {
        char path[4096];
        expand_path(v.str, path, sizeof path);
        /* Owner-only (messages name hosts, ports and peers), and never
         * through a symbolic link: on a shared /tmp another user could
         * plant one at the name to have us append to a file of theirs. */
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
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
