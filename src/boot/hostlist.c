/*
 * Slurm host-list expansion (see hostlist.h). An item is cut into
 * segments, literal text and brackets, which are checked first; then the
 * names are produced by a recursion over the segments, one level per
 * segment, so nothing is allocated and a bracket of a billion numbers
 * costs nothing when the caller stops after the first name.
 */
#include "boot/hostlist.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define HOSTLIST_DIGITS_MAX 9
#define HOSTLIST_SEGS_MAX (2 * HC_HOSTLIST_GROUPS_MAX + 1)

typedef struct seg {
    const char *p; /* literal text, or a bracket's content without [ ] */
    size_t len;
    int group;
} seg_t;

typedef struct item {
    seg_t seg[HOSTLIST_SEGS_MAX];
    int nseg;
} item_t;

typedef struct walk {
    hc_hostlist_fn fn;
    void *ctx;
    int stop;
    char *err;
    size_t errlen;
    char name[HC_HOSTLIST_NAME_MAX];
} walk_t;

/* One number of a bracket at *pp (before end): 0 and the value, its digit
 * count; -1 when there are no digits or too many. */
static int read_number(const char **pp, const char *end, unsigned long *v, int *digits)
{
    const char *p = *pp;
    unsigned long x = 0;
    int n = 0;
    while (p < end && isdigit((unsigned char)*p)) {
        if (++n > HOSTLIST_DIGITS_MAX)
            return -1;
        x = x * 10 + (unsigned long)(*p++ - '0');
    }
    if (n == 0)
        return -1;
    *pp = p;
    *v = x;
    *digits = n;
    return 0;
}

/* The range at *pp in a bracket's content [*pp, end): "lo" or "lo-hi",
 * followed by ',' or the end, which it steps over. */
static int read_range(const char **pp, const char *end, unsigned long *lo, unsigned long *hi,
                      int *width, const char *list, char *err, size_t errlen)
{
    const char *p = *pp;
    int wlo, whi;
    if (read_number(&p, end, lo, &wlo) != 0)
        goto bad;
    *hi = *lo;
    if (p < end && *p == '-') {
        p++;
        if (read_number(&p, end, hi, &whi) != 0)
            goto bad;
        if (*hi < *lo) {
            snprintf(err, errlen, "range %.*s at character %d ends below its start",
                     (int)(p - *pp), *pp, (int)(*pp - list) + 1);
            return -1;
        }
    }
    if (p < end && *p != ',')
        goto bad;
    if (p < end && p + 1 == end) {
        snprintf(err, errlen, "empty range at character %d", (int)(p - list) + 2);
        return -1;
    }
    *width = wlo;
    *pp = p < end ? p + 1 : p;
    return 0;
bad:
    snprintf(err, errlen, "bad range at character %d (want numbers of up to %d digits: "
                          "[1-4,7])", (int)(p - list) + 1, HOSTLIST_DIGITS_MAX);
    return -1;
}

static int emit(const item_t *it, int k, size_t used, walk_t *w, const char *list)
{
    if (k == it->nseg) {
        w->stop = w->fn(w->name, w->ctx) != 0;
        return 0;
    }
    const seg_t *s = &it->seg[k];
    const size_t room = sizeof w->name - used;
    if (!s->group) {
        if (s->len >= room)
            goto too_long;
        memcpy(w->name + used, s->p, s->len);
        w->name[used + s->len] = '\0';
        return emit(it, k + 1, used + s->len, w, list);
    }
    const char *p = s->p, *end = s->p + s->len;
    while (p < end && !w->stop) {
        unsigned long lo, hi;
        int width;
        if (read_range(&p, end, &lo, &hi, &width, list, w->err, w->errlen) != 0)
            return -1;
        for (unsigned long v = lo; v <= hi && !w->stop; v++) {
            int n = snprintf(w->name + used, room, "%0*lu", width, v);
            if (n < 0 || (size_t)n >= room)
                goto too_long;
            if (emit(it, k + 1, used + (size_t)n, w, list) != 0)
                return -1;
        }
    }
    return 0;
too_long:
    snprintf(w->err, w->errlen, "host name longer than %d characters", HC_HOSTLIST_NAME_MAX - 1);
    return -1;
}

/* Cut the item at *pp into segments and check every bracket; *pp ends on
 * the ',' or NUL after it. */
static int parse_item(const char **pp, const char *list, item_t *it, char *err, size_t errlen)
{
    const char *p = *pp;
    int groups = 0;
    size_t longest = 0; /* the item's longest name */
    it->nseg = 0;
    while (*p && *p != ',') {
        if (it->nseg == HOSTLIST_SEGS_MAX || (*p == '[' && groups == HC_HOSTLIST_GROUPS_MAX)) {
            snprintf(err, errlen, "more than %d brackets in one name at character %d",
                     HC_HOSTLIST_GROUPS_MAX, (int)(p - list) + 1);
            return -1;
        }
        seg_t *s = &it->seg[it->nseg++];
        if (*p == '[') {
            const char *open = p++;
            while (*p && *p != ']' && *p != '[')
                p++;
            if (*p != ']') {
                snprintf(err, errlen, *p ? "nested '[' at character %d"
                                         : "unclosed '[' at character %d",
                         (int)((*p ? p : open) - list) + 1);
                return -1;
            }
            *s = (seg_t){ open + 1, (size_t)(p - open - 1), 1 };
            groups++;
            p++;
            const char *q = s->p, *end = s->p + s->len;
            if (q == end) {
                snprintf(err, errlen, "empty brackets at character %d", (int)(open - list) + 1);
                return -1;
            }
            size_t widest = 0;
            while (q < end) {
                unsigned long lo, hi;
                int width;
                if (read_range(&q, end, &lo, &hi, &width, list, err, errlen) != 0)
                    return -1;
                int n = snprintf(NULL, 0, "%0*lu", width, hi);
                widest = (size_t)n > widest ? (size_t)n : widest;
            }
            longest += widest;
            continue;
        }
        const char *start = p;
        while (*p && *p != ',' && *p != '[' && *p != ']' && isgraph((unsigned char)*p))
            p++;
        if (p == start) {
            snprintf(err, errlen, *p == ']' ? "']' without '[' at character %d"
                                            : "unexpected character 0x%02x at character %d",
                     *p == ']' ? (int)(p - list) + 1 : (unsigned char)*p, (int)(p - list) + 1);
            return -1;
        }
        *s = (seg_t){ start, (size_t)(p - start), 0 };
        longest += s->len;
    }
    if (it->nseg == 0) {
        snprintf(err, errlen, "empty host name at character %d", (int)(p - list) + 1);
        return -1;
    }
    /* Here, not at the name: a caller that stops after the first name
     * (hc_hostlist_first) must see the same verdict as a full expansion. */
    if (longest >= HC_HOSTLIST_NAME_MAX) {
        snprintf(err, errlen, "host name longer than %d characters", HC_HOSTLIST_NAME_MAX - 1);
        return -1;
    }
    *pp = p;
    return 0;
}

hcoll_status_t hc_hostlist_expand(const char *list, hc_hostlist_fn fn, void *ctx, char *err,
                                  size_t errlen)
{
    walk_t w = { .fn = fn, .ctx = ctx, .err = err, .errlen = errlen };
    item_t it;
    const char *p = list;
    if (!*p) {
        snprintf(err, errlen, "empty host list");
        return HCOLL_ERR_INVALID_ARG;
    }
    for (;;) {
        if (parse_item(&p, list, &it, err, errlen) != 0)
            return HCOLL_ERR_INVALID_ARG;
        if (!w.stop && emit(&it, 0, 0, &w, list) != 0)
            return HCOLL_ERR_INVALID_ARG;
        if (!*p)
            return HCOLL_SUCCESS;
        p++; /* the ',' */
    }
}

typedef struct first {
    char *host;
    size_t len;
    int fits;
} first_t;

static int take_first(const char *host, void *ctx)
{
    first_t *f = ctx;
    f->fits = snprintf(f->host, f->len, "%s", host) < (int)f->len;
    return 1;
}

hcoll_status_t hc_hostlist_first(const char *list, char *host, size_t hostlen, char *err,
                                 size_t errlen)
{
    first_t f = { host, hostlen, 0 };
    hcoll_status_t st = hc_hostlist_expand(list, take_first, &f, err, errlen);
    if (st == HCOLL_SUCCESS && !f.fits) {
        snprintf(err, errlen, "first host name does not fit in %zu bytes", hostlen);
        st = HCOLL_ERR_INVALID_ARG;
    }
    return st;
}
