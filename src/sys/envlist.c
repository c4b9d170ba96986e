#include "sys/envlist.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

hcoll_status_t hc_list_parse(const char *spec, hc_list_t *list_out, char *err, size_t errlen)
{
    hc_list_t l;
    memset(&l, 0, sizeof l);
    if (!spec) {
        *list_out = l;
        return HCOLL_SUCCESS;
    }
    const char *s = spec;
    if (*s == '^') {
        l.exclude = 1;
        s++;
    }
    if (*s == '=') {
        l.exact = 1;
        s++;
    }
    if (*s == '\0') {
        if (s != spec) {
            snprintf(err, errlen, "'%s': a list marker with no names", spec);
            return HCOLL_ERR_INVALID_ARG;
        }
        *list_out = l;
        return HCOLL_SUCCESS;
    }
    for (;;) {
        size_t n = strcspn(s, ",");
        if (n == 0) {
            snprintf(err, errlen, "'%s': empty entry", spec);
            return HCOLL_ERR_INVALID_ARG;
        }
        if (l.count == HC_LIST_MAX_ENTRIES) {
            snprintf(err, errlen, "'%s': more than %d entries", spec, HC_LIST_MAX_ENTRIES);
            return HCOLL_ERR_INVALID_ARG;
        }
        hc_list_entry_t *e = &l.entries[l.count++];
        e->port = -1;
        const char *colon = memchr(s, ':', n);
        size_t namelen = colon ? (size_t)(colon - s) : n;
        if (namelen == 0 || namelen >= HC_LIST_NAME_MAX) {
            snprintf(err, errlen, "'%s': entry '%.*s' has %s name", spec, (int)n, s,
                     namelen == 0 ? "an empty" : "too long a");
            return HCOLL_ERR_INVALID_ARG;
        }
        memcpy(e->name, s, namelen);
        e->name[namelen] = '\0';
        if (colon) {
            char buf[16];
            size_t plen = n - namelen - 1;
            char *end;
            if (plen == 0 || plen >= sizeof buf) {
                snprintf(err, errlen, "'%s': entry '%.*s' has a bad port", spec, (int)n, s);
                return HCOLL_ERR_INVALID_ARG;
            }
            memcpy(buf, colon + 1, plen);
            buf[plen] = '\0';
            errno = 0;
            long p = strtol(buf, &end, 10);
            if (errno || *end || p < 0 || p > 255) {
                snprintf(err, errlen, "'%s': port '%s' is not a number in 0..255", spec, buf);
                return HCOLL_ERR_INVALID_ARG;
            }
            e->port = (int)p;
        }
        s += n;
        if (*s == '\0')
            break;
        s++; /* ',' */
        if (*s == '\0') {
            snprintf(err, errlen, "'%s': trailing comma", spec);
            return HCOLL_ERR_INVALID_ARG;
        }
    }
    *list_out = l;
    return HCOLL_SUCCESS;
}

static int entry_match(const hc_list_t *l, const hc_list_entry_t *e, const char *name, int port)
{
    int name_ok = l->exact ? strcmp(name, e->name) == 0
                           : strncmp(name, e->name, strlen(e->name)) == 0;
    return name_ok && (e->port < 0 || port < 0 || e->port == port);
}

int hc_list_match(const hc_list_t *list, const char *name, int port)
{
    if (list->count == 0)
        return 1;
    int hit = 0;
    for (int i = 0; i < list->count && !hit; i++)
        hit = entry_match(list, &list->entries[i], name, port);
    return list->exclude ? !hit : hit;
}

int hc_list_names(const hc_list_t *list, const char *name)
{
    if (list->exclude || list->count == 0)
        return 0;
    return hc_list_match(list, name, -1);
}

int hc_name_natcmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1]))
                a++;
            while (*b == '0' && isdigit((unsigned char)b[1]))
                b++;
            size_t na = 0, nb = 0;
            while (isdigit((unsigned char)a[na]))
                na++;
            while (isdigit((unsigned char)b[nb]))
                nb++;
            if (na != nb)
                return na < nb ? -1 : 1;
            int c = strncmp(a, b, na);
            if (c)
                return c;
            a += na;
            b += nb;
        } else {
            if (*a != *b)
                return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return *a ? 1 : *b ? -1 : 0;
}
