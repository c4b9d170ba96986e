/* The node's shared-memory segment as other processes wrote it
 * (intra/shm.c, shm_wait.c, shm_steps.c): this process attaches as local
 * rank 1..L-1 to a segment that the target made in local rank 0's place,
 * with the hellos of a fake local exchange, then runs one or two
 * operations against the other ranks' words in it. The input is
 *   - the shape: L (2..4), this rank, the operation, its count, dtype
 *     and op, and whether the segment has the announced size;
 *   - local rank 0's hello (its status, nonce, segment size) and the
 *     peers' pid namespaces, where the input overrides them;
 *   - patches (offset, bytes) over the header, the per-rank words
 *     (posted, done, slot descriptors, state, beat) and the failure word,
 *     written over what correct peers would have there: attached, every
 *     step posted and consumed, descriptors of the same call.
 * Waits are 1 ms, so a peer that never moves costs little. Promises
 * checked beyond memory safety: a failure leaves a message; a segment
 * nobody patched is accepted (so that a change of the layout, which this
 * target mirrors, shows up in the replay instead of hiding every path). */
#include "fuzz.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "intra/shm.h"

static const uint8_t *in_p;
static size_t in_n;

static unsigned take8(void)
{
    if (!in_n)
        return 0;
    in_n--;
    return *in_p++;
}

static uint64_t take64(void)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | take8();
    return v;
}

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

typedef struct fz_shape {
    int L, me, what, count;
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    size_t slot_bytes, data_offset, seg_bytes;
    uint64_t nonce, pidns;
} fz_shape_t;

typedef struct fz_ag {
    const fz_shape_t *sh;
    unsigned flags;
    hc_shm_hello_t rank0;
} fz_ag_t;

/* The local exchange: the other ranks' hellos, rank 0's possibly not what
 * it wrote in the segment. */
static hcoll_status_t fz_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    fz_ag_t *a = ctx;
    FUZZ_CHECK(len == sizeof(hc_shm_hello_t));
    hc_shm_hello_t *h = all;
    for (int q = 0; q < a->sh->L; q++) {
        h[q] = (hc_shm_hello_t){ .pid = (int32_t)getpid(), .pidns = a->sh->pidns };
        if (a->flags & 1)
            h[q].pidns ^= 1; /* another pid namespace: watched by state only */
    }
    h[0] = a->rank0;
    memcpy(&h[a->sh->me], mine, len);
    return HCOLL_SUCCESS;
}

/* What correct local ranks would have written by the time this one
 * attaches and calls. */
static void fill(hc_shm_hdr_t *h, const fz_shape_t *sh, int kind)
{
    h->nonce = sh->nonce;
    h->version = HC_SHM_VERSION;
    h->L = (uint32_t)sh->L;
    h->nslots = HC_SHM_NSLOTS;
    h->creator_pid = (int32_t)getpid();
    h->slot_bytes = sh->slot_bytes;
    h->data_offset = sh->data_offset;
    h->seg_bytes = sh->seg_bytes;
    h->creator_ns = sh->pidns;
    for (int q = 0; q < sh->L; q++) {
        if (q == sh->me)
            continue;
        hc_shm_rank_t *r = &h->ranks[q];
        r->posted = r->done = 1u << 20;
        /* A barrier is a call of no elements of uint8. */
        const int bar = kind == HC_SHM_KIND_BARRIER;
        for (int k = 0; k < HC_SHM_NSLOTS; k++)
            r->desc[k] = (hc_shm_desc_t){ .step = (uint64_t)k,
                                          .count = bar ? 0 : (uint64_t)sh->count,
                                          .kind = (uint32_t)kind,
                                          .dtype = bar ? HCOLL_UINT8 : (uint32_t)sh->dtype,
                                          .op = (uint32_t)sh->op };
        r->pid = (int32_t)getpid();
        r->state = HC_SHM_ST_ATTACHED;
    }
    h->magic = HC_SHM_MAGIC;
}

static int patch(unsigned char *seg, size_t limit)
{
    int n = 0;
    while (in_n >= 3) {
        size_t off = (take8() << 8 | take8()) % limit, len = take8() % 16;
        for (size_t i = 0; i < len && off + i < limit; i++)
            seg[off + i] = (unsigned char)take8();
        n++;
    }
    return n;
}

static hcoll_status_t run_op(hc_intra_t *ctx, const fz_shape_t *sh, int what, void *buf)
{
    const hc_intra_ops_t *o = &hc_intra_shm_ops;
    switch (what) {
    case 0: return o->allreduce(ctx, buf, buf, (size_t)sh->count, sh->dtype, sh->op, NULL);
    case 1: return o->reduce_scatter(ctx, buf, buf, (size_t)sh->count, sh->dtype, sh->op, NULL);
    case 2: return o->all_gather(ctx, buf, (size_t)sh->count, sh->dtype, NULL);
    case 3: return o->barrier(ctx);
    default: return o->alive(ctx, "fuzz");
    }
}

static const int kinds[5] = { HC_SHM_KIND_AR, HC_SHM_KIND_RS, HC_SHM_KIND_AG,
                              HC_SHM_KIND_BARRIER, HC_SHM_KIND_AR };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5 || size > 16 * 1024)
        return 0;
    in_p = data, in_n = size;
    unsigned shape = take8(), flags = take8();
    fz_shape_t sh = { .L = 2 + (int)(shape % 3) };
    sh.me = 1 + (int)((shape >> 2) % (unsigned)(sh.L - 1));
    sh.what = (int)((shape >> 4) % 5);
    sh.count = (int)take8();
    sh.dtype = (hcoll_dtype_t)(take8() % 8);
    sh.op = (hcoll_op_t)(take8() % 5);
    /* shm_new's layout (intra/shm.c), for a chunk of one page. */
    sh.slot_bytes = round_up(HC_SHM_PAGE > (size_t)sh.L * HC_SHM_LINE ? HC_SHM_PAGE
                                                                       : (size_t)sh.L * HC_SHM_LINE,
                             HC_SHM_PAGE);
    sh.data_offset = round_up(sizeof(hc_shm_hdr_t) + (size_t)sh.L * sizeof(hc_shm_rank_t),
                              HC_SHM_PAGE);
    sh.seg_bytes = sh.data_offset + (size_t)sh.L * HC_SHM_NSLOTS * sh.slot_bytes;
    sh.nonce = 0x5eed0000u + shape;
    struct stat ns;
    sh.pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;

    fz_ag_t ag = { .sh = &sh, .flags = flags,
                   .rank0 = { .pid = (int32_t)getpid(), .pidns = sh.pidns, .nonce = sh.nonce,
                              .seg_bytes = sh.seg_bytes } };
    if (flags & 2)
        ag.rank0.status = (int32_t)(take8() % 20);
    if (flags & 4)
        ag.rank0.nonce = take64();
    if (flags & 8)
        ag.rank0.seg_bytes = take64() % (2 * sh.seg_bytes);
    size_t real_bytes = flags & 16 ? (size_t)take64() % (2 * sh.seg_bytes) + 1 : sh.seg_bytes;

    char name[64];
    snprintf(name, sizeof name, "/hcoll-fuzz-%d", (int)getpid());
    shm_unlink(name);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(ftruncate(fd, (off_t)real_bytes) == 0);
    unsigned char *seg = mmap(NULL, real_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    FUZZ_CHECK(seg != MAP_FAILED);
    close(fd);
    if (real_bytes >= sh.data_offset)
        fill((hc_shm_hdr_t *)seg, &sh, kinds[sh.what]);
    int patched = patch(seg, real_bytes < sh.data_offset ? real_bytes : sh.data_offset);

    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    hc_intra_params_t prm = { .local_rank = sh.me, .local_size = sh.L, .name = name,
                              .chunk_bytes = HC_SHM_PAGE, .timeout_ms = 1, .op_timeout_ms = 1,
                              .liveness_ms = flags & 32 ? 1 : 0, .errbuf = &eb, .rank = sh.me,
                              .allgather = fz_allgather, .allgather_ctx = &ag };
    hc_intra_t *ctx = NULL;
    hcoll_status_t st = hc_intra_shm_ops.create(&prm, &ctx);
    if (!patched && !(flags & 0x1e))
        FUZZ_CHECK(st == HCOLL_SUCCESS);
    if (st == HCOLL_SUCCESS) {
        size_t es = hcoll_dtype_size(sh.dtype);
        void *buf = calloc((size_t)sh.count + 1, es);
        FUZZ_CHECK(buf);
        for (int k = 0; k < 1 + (int)((flags >> 6) & 1); k++) {
            st = run_op(ctx, &sh, k ? (int)(flags >> 7) * 3 : sh.what, buf);
            if (st != HCOLL_SUCCESS)
                FUZZ_CHECK(hc_errbuf_get(&eb)[0] != '\0');
            FUZZ_SAY("shm: op %d: %s %s\n", k, hcoll_status_name(st),
                     st ? hc_errbuf_get(&eb) : "");
        }
        hc_intra_shm_ops.health(ctx, "fuzz");
        hc_intra_shm_ops.destroy(ctx);
        free(buf);
    } else {
        FUZZ_CHECK(hc_errbuf_get(&eb)[0] != '\0');
        FUZZ_SAY("shm: create: %s\n", hc_errbuf_get(&eb));
    }
    hc_errbuf_fini(&eb);
    munmap(seg, real_bytes);
    shm_unlink(name);
    return 0;
}
