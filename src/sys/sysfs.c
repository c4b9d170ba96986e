/*
 * sysfs access under a root directory (see sysfs.h). Files are tiny and
 * read in one go; nothing is cached, the callers run at set-up only.
 */
#include "sys/sysfs.h"
#include "sys/envlist.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int hc_sysfs_path(const char *root, const char *rel, char *out, size_t outlen)
{
    if (!root || !root[0])
        root = "/";
    while (*rel == '/')
        rel++;
    size_t rl = strlen(root);
    int sep = rl > 0 && root[rl - 1] != '/';
    int n = snprintf(out, outlen, "%s%s%s", root, sep ? "/" : "", rel);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

int hc_sysfs_read(const char *root, const char *rel, char *buf, size_t len)
{
    char path[HC_SYSFS_PATH_MAX];
    if (len == 0 || hc_sysfs_path(root, rel, path, sizeof path) != 0)
        return -ENAMETOOLONG;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t got = 0;
    while (got + 1 < len) {
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    size_t b = 0;
    while (b < got && isspace((unsigned char)buf[b]))
        b++;
    size_t e = got;
    while (e > b && isspace((unsigned char)buf[e - 1]))
        e--;
    memmove(buf, buf + b, e - b);
    buf[e - b] = '\0';
    return 0;
}

int hc_sysfs_read_long(const char *root, const char *rel, long *out)
{
    char buf[64];
    int rc = hc_sysfs_read(root, rel, buf, sizeof buf);
    if (rc != 0)
        return rc;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 0);
    if (errno || end == buf || *end != '\0')
        return -EINVAL;
    *out = v;
    return 0;
}

int hc_sysfs_exists(const char *root, const char *rel)
{
    char path[HC_SYSFS_PATH_MAX];
    struct stat sb;
    return hc_sysfs_path(root, rel, path, sizeof path) == 0 && stat(path, &sb) == 0;
}

int hc_sysfs_realpath(const char *root, const char *rel, char *out, size_t outlen)
{
    char path[HC_SYSFS_PATH_MAX];
    if (hc_sysfs_path(root, rel, path, sizeof path) != 0)
        return -ENAMETOOLONG;
    char *full = realpath(path, NULL);
    if (!full)
        return -errno;
    char *base = realpath(root && root[0] ? root : "/", NULL);
    if (!base) {
        int e = errno;
        free(full);
        return -e;
    }
    size_t bl = strlen(base);
    if (strcmp(base, "/") == 0)
        bl = 0;
    int rc = 0;
    /* A link that leaves the root (a fixture pointing at the host's /sys)
     * would mix two worlds: refuse it. */
    if (strncmp(full, base, bl) != 0 || (full[bl] != '/' && full[bl] != '\0'))
        rc = -EXDEV;
    else if ((size_t)snprintf(out, outlen, "%s", full[bl] ? full + bl : "/") >= outlen)
        rc = -ENAMETOOLONG;
    free(base);
    free(full);
    return rc;
}

static int natcmp_q(const void *x, const void *y)
{
    return hc_name_natcmp((const char *)x, (const char *)y);
}

int hc_sysfs_list(const char *root, const char *rel, char (*names)[HC_SYSFS_NAME_MAX], int max)
{
    char path[HC_SYSFS_PATH_MAX];
    if (hc_sysfs_path(root, rel, path, sizeof path) != 0)
        return -ENAMETOOLONG;
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        size_t len = strlen(e->d_name);
        if (len >= HC_SYSFS_NAME_MAX)
            continue;
        memcpy(names[n++], e->d_name, len + 1);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], natcmp_q);
    return n;
}
