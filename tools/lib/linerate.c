/*
 * Where a NIC's line rate comes from, in this order: the RDMA
 * devices, else --line-rate, else the rate limit of the chosen interfaces
 * (tc shaping, as on the emulated cluster, else a real link speed), else
 * unknown.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perf.h"
#include "sys/envlist.h"
#include "sys/ibdev.h"

int hp_line_rate_rdma(const char *root, const char *hca_spec, double *bps_out, char *source_out,
                      size_t srclen)
{
    /* The ports the verbs transport could use (ACTIVE, passing
     * HCOLL_IB_HCA); each rank drives one, so the slowest is the rate every
     * rail can count on. */
    hc_ibport_t ports[64];
    char err[256];
    int n = 0;
    if (hc_ibdev_select(root, hca_spec, NULL, ports, 64, &n, err, sizeof err) != HCOLL_SUCCESS)
        return -1;
    double best = 0;
    const hc_ibport_t *slow = NULL;
    for (int i = 0; i < n; i++) {
        int gbps = hc_ibdev_rate_gbps(root, ports[i].dev, ports[i].port);
        if (gbps > 0 && (best == 0 || gbps * 1e9 / 8 < best)) {
            best = gbps * 1e9 / 8;
            slow = &ports[i];
        }
    }
    if (!slow)
        return -1;
    *bps_out = best;
    snprintf(source_out, srclen, "RDMA port %s:%d, the slowest of %d usable", slow->dev,
             slow->port, n);
    return 0;
}

int hp_tc_parse_qdisc_json(const char *json, double *bps_out)
{
    /* iproute2 prints a tbf qdisc as {"kind":"tbf",...,"options":{"rate":
     * BYTES_PER_SECOND,...}}; look for a rate after each tbf kind. */
    double best = 0;
    for (const char *p = json; p && (p = strstr(p, "\"kind\":\"tbf\"")) != NULL; p++) {
        const char *end = strstr(p + 1, "\"kind\":");
        const char *r = strstr(p, "\"rate\":");
        if (!r || (end && r > end))
            continue;
        double v = strtod(r + 7, NULL);
        if (v > 0 && (best == 0 || v < best))
            best = v;
    }
    if (best <= 0)
        return -1;
    *bps_out = best;
    return 0;
}

int hp_tc_parse_class_text(const char *text, double *bps_out)
{
    /* "class htb 1:1 root prio 0 rate 10Gbit ceil 10Gbit burst ..." */
    static const struct { const char *suffix; double mult; } units[] = {
        { "Tbit", 1e12 / 8 }, { "Gbit", 1e9 / 8 }, { "Mbit", 1e6 / 8 }, { "Kbit", 1e3 / 8 },
        { "bit", 1 / 8.0 }, { "Tbps", 1e12 }, { "Gbps", 1e9 }, { "Mbps", 1e6 },
        { "Kbps", 1e3 }, { "bps", 1 },
    };
    double best = 0;
    for (const char *p = text; p && (p = strstr(p, " rate ")) != NULL; p++) {
        char *end;
        double v = strtod(p + 6, &end);
        if (end == p + 6 || v <= 0)
            continue;
        for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
            size_t n = strlen(units[k].suffix);
            if (strncmp(end, units[k].suffix, n) == 0 && !isalpha((unsigned char)end[n])) {
                double bps = v * units[k].mult;
                if (best == 0 || bps < best)
                    best = bps;
                break;
            }
        }
    }
    if (best <= 0)
        return -1;
    *bps_out = best;
    return 0;
}

/* The output of argv (no shell), at most len-1 bytes; -1 on failure. */
static int run_capture(char *const argv[], char *buf, size_t len)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 2);
        close(fds[0]), close(fds[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < len && (n = read(fds[0], buf + got, len - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int read_long(const char *path, long *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%ld", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

int hp_iface_rate_limit(const char *ifname, const char *sysroot, int use_tc, double *bps_out,
                        char *source_out, size_t srclen)
{
    double bps;
    if (use_tc) {
        char buf[16384];
        char *qargv[] = { "tc", "-j", "qdisc", "show", "dev", (char *)ifname, NULL };
        if (run_capture(qargv, buf, sizeof buf) == 0 && hp_tc_parse_qdisc_json(buf, &bps) == 0) {
            snprintf(source_out, srclen, "tc tbf rate of %s", ifname);
            *bps_out = bps;
            return 0;
        }
        char *cargv[] = { "tc", "class", "show", "dev", (char *)ifname, NULL };
        if (run_capture(cargv, buf, sizeof buf) == 0 && hp_tc_parse_class_text(buf, &bps) == 0) {
            snprintf(source_out, srclen, "tc class rate of %s", ifname);
            *bps_out = bps;
            return 0;
        }
    }
    /* Virtual links (veth, bridges) report made-up speeds; only a device
     * behind the interface makes the speed a line rate. */
    char path[512];
    struct stat st;
    long mbps;
    snprintf(path, sizeof path, "%s/class/net/%s/device", sysroot, ifname);
    if (stat(path, &st) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/class/net/%s/speed", sysroot, ifname);
    if (read_long(path, &mbps) != 0 || mbps <= 0)
        return -1;
    *bps_out = mbps * 1e6 / 8;
    snprintf(source_out, srclen, "link speed of %s (%ld Mb/s)", ifname, mbps);
    return 0;
}

/* HCOLL_SOCKET_IFNAME in the library's own list syntax; unset means the
 * automatic choice, which never takes lo. */
static int list_selects(const hc_list_t *list, const char *name)
{
    if (list->count == 0)
        return strcmp(name, "lo") != 0;
    return hc_list_match(list, name, -1);
}

int hp_line_rate_resolve(double given_bps, const char *ifname_list, const char *sysroot,
                         int use_tc, double *bps_out, char *source_out, size_t srclen)
{
    double bps;
    /* sysroot names the sysfs mount ("/sys"); discovery wants the root
     * above it. */
    char root[512];
    snprintf(root, sizeof root, "%s/..", sysroot);
    if (hp_line_rate_rdma(root, getenv("HCOLL_IB_HCA"), &bps, source_out, srclen) == 0) {
        *bps_out = bps;
        return 0;
    }
    hc_list_t list;
    char lerr[160];
    if (hc_list_parse(ifname_list, &list, lerr, sizeof lerr) != HCOLL_SUCCESS) {
        snprintf(source_out, srclen, "unknown: HCOLL_SOCKET_IFNAME %s", lerr);
        return -1;
    }
    if (given_bps > 0) {
        snprintf(source_out, srclen, "--line-rate");
        *bps_out = given_bps;
        return 0;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/class/net", sysroot);
    DIR *d = opendir(dir);
    if (!d)
        goto unknown;
    double best = 0;
    char src[160] = "";
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !list_selects(&list, e->d_name))
            continue;
        char s[160];
        if (hp_iface_rate_limit(e->d_name, sysroot, use_tc, &bps, s, sizeof s) == 0 &&
            (best == 0 || bps < best)) {
            best = bps;
            snprintf(src, sizeof src, "%s", s);
        }
    }
    closedir(d);
    if (best > 0) {
        snprintf(source_out, srclen, "%s", src);
        *bps_out = best;
        return 0;
    }
unknown:
    snprintf(source_out, srclen, "unknown: no RDMA device, no --line-rate, no rate limit on %s",
             ifname_list && *ifname_list ? ifname_list : "the interfaces");
    return -1;
}
