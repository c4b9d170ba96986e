#include "sys/host.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

uint64_t hc_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = seed ? seed : FNV_OFFSET;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static void read_boot_id(char *buf, size_t len)
{
    buf[0] = '\0';
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        n = 0;
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
}

void hc_host_id(const char *override, uint64_t *id_out, char *label_out, size_t label_len)
{
    /* Domain separation keeps an override equal to some "host\nboot" string
     * from colliding with a real host by accident. */
    if (override && *override) {
        uint64_t h = hc_hash64("override:", 9, 0);
        *id_out = hc_hash64(override, strlen(override), h);
        snprintf(label_out, label_len, "%s", override);
        return;
    }
    char host[256] = "";
    char boot[64];
    if (gethostname(host, sizeof host - 1) != 0)
        strcpy(host, "?");
    host[sizeof host - 1] = '\0';
    read_boot_id(boot, sizeof boot);
    uint64_t h = hc_hash64("host:", 5, 0);
    h = hc_hash64(host, strlen(host), h);
    h = hc_hash64("\n", 1, h);
    *id_out = hc_hash64(boot, strlen(boot), h);
    snprintf(label_out, label_len, "%s", host);
}
