/*
 * PCI distance from sysfs device paths (see pci.h for the classes).
 *
 * A resolved path is "/sys/devices/pciDDDD:BB/<bdf>/<bdf>/.../<bdf>": the
 * host bridge (root complex), then every bridge down to the device. Two
 * devices share a prefix of that chain; what is left on each side says how
 * many bridges a transfer between them crosses.
 */
#include "sys/pci.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "sys/sysfs.h"

#define PCI_CHAIN_MAX 32
#define PCI_ELEM_MAX  32

typedef struct pci_chain {
    char host[PCI_ELEM_MAX]; /* "pci0000:00" */
    int n;
    char elem[PCI_CHAIN_MAX][PCI_ELEM_MAX]; /* bdfs, root port first */
} pci_chain_t;

const char *hc_pci_dist_name(int dist)
{
    static const char *const names[] = { "LOC", "PIX", "PXB", "PHB", "SYS" };
    return dist >= 0 && dist <= HC_PCI_SYS ? names[dist] : "?";
}

int hc_pci_ibdev_path(const char *root, const char *ibdev, char *out, size_t outlen)
{
    char rel[HC_SYSFS_PATH_MAX];
    snprintf(rel, sizeof rel, "sys/class/infiniband/%s/device", ibdev);
    return hc_sysfs_realpath(root, rel, out, outlen);
}

int hc_pci_bdf_path(const char *root, const char *bdf, char *out, size_t outlen)
{
    char low[PCI_ELEM_MAX];
    size_t i;
    for (i = 0; bdf[i] && i + 1 < sizeof low; i++)
        low[i] = (char)tolower((unsigned char)bdf[i]);
    low[i] = '\0';
    char rel[HC_SYSFS_PATH_MAX];
    snprintf(rel, sizeof rel, "sys/bus/pci/devices/%s", low);
    return hc_sysfs_realpath(root, rel, out, outlen);
}

/* A PCI address "dddd:bb:dd.f". */
static int is_bdf(const char *s)
{
    unsigned d, b, dv, f;
    char tail;
    return sscanf(s, "%x:%x:%x.%x%c", &d, &b, &dv, &f, &tail) == 4;
}

static int chain_parse(const char *path, pci_chain_t *c)
{
    memset(c, 0, sizeof *c);
    const char *p = strstr(path, "/pci");
    if (!p)
        return -1;
    p++;
    size_t n = strcspn(p, "/");
    if (n >= PCI_ELEM_MAX)
        return -1;
    memcpy(c->host, p, n);
    p += n;
    while (*p == '/') {
        p++;
        n = strcspn(p, "/");
        if (n == 0 || n >= PCI_ELEM_MAX)
            break;
        char e[PCI_ELEM_MAX];
        memcpy(e, p, n);
        e[n] = '\0';
        /* Stop at the first non-PCI component (a device's own subdirs). */
        if (!is_bdf(e))
            break;
        if (c->n == PCI_CHAIN_MAX)
            return -1;
        memcpy(c->elem[c->n++], e, n + 1);
        p += n;
    }
    return c->n > 0 ? 0 : -1;
}

/* numa_node of the device at a resolved path; -1 when unknown. */
static long numa_of(const char *root, const char *path)
{
    char rel[HC_SYSFS_PATH_MAX + 16];
    snprintf(rel, sizeof rel, "%s/numa_node", path);
    long v;
    return hc_sysfs_read_long(root, rel, &v) == 0 ? v : -1;
}

/* Same device up to the function number ("0000:03:00.0" vs ".1"). */
static int same_device(const char *a, const char *b)
{
    const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
    return da && db && da - a == db - b && strncasecmp(a, b, (size_t)(da - a)) == 0;
}

int hc_pci_distance(const char *root, const char *path_a, const char *path_b)
{
    pci_chain_t a, b;
    if (chain_parse(path_a, &a) != 0 || chain_parse(path_b, &b) != 0)
        return HC_PCI_SYS;
    if (strcasecmp(a.host, b.host) != 0) {
        long na = numa_of(root, path_a), nb = numa_of(root, path_b);
        return na >= 0 && na == nb ? HC_PCI_PHB : HC_PCI_SYS;
    }
    int c = 0;
    while (c < a.n && c < b.n && strcasecmp(a.elem[c], b.elem[c]) == 0)
        c++;
    if (c == a.n && c == b.n)
        return HC_PCI_LOC;
    if (c == a.n - 1 && c == b.n - 1 && same_device(a.elem[c], b.elem[c]))
        return HC_PCI_LOC;
    if (c == 0)
        return HC_PCI_PHB; /* different root ports: through the host bridge */
    /* Bridges between each device and the deepest common bridge. A switch
     * shows as upstream port (common) + one downstream port per side. */
    int up_a = a.n - 1 - c, up_b = b.n - 1 - c;
    if (up_a < 0)
        up_a = 0;
    if (up_b < 0)
        up_b = 0;
    return up_a <= 1 && up_b <= 1 ? HC_PCI_PIX : HC_PCI_PXB;
}
