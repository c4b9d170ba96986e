/*
 * gloo_bench: Gloo's all-reduce algorithms (Debian's libgloo-dev, TCP
 * transport) against hcoll and, when built with mpicxx and run under
 * mpirun, Open MPI's MPI_Allreduce, on the same processes, call by call.
 *
 *   per size -b..-e (x -f): per library: one checked call on exact data
 *     ─► zero the buffers ─► -w warm-up calls of each, round robin
 *     ─► -n rounds: barrier, one timed call of each library (the first
 *        library of a round rotates, so none always runs right after the
 *        barrier) ─► per call: max over ranks ─► rank 0: median, mean,
 *        p99 (nearest rank), min; algbw and busbw from the mean
 *
 * Every library runs float32 sum in place on its own buffer. The Gloo
 * variants are Gloo's own names: gloo = gloo::allreduce (the ring that
 * torch.distributed's gloo backend calls, options built per call as torch
 * does), gloo_ring = AllreduceRing (every rank's whole buffer goes round:
 * P·S bytes on the wire), gloo_ring_chunked = AllreduceRingChunked
 * (reduce-scatter then all-gather, 2·S), gloo_hd = AllreduceHalvingDoubling,
 * gloo_bcube = AllreduceBcube. The legacy algorithms bind their buffer when
 * built, so they are built once per size, outside the timing, each on a
 * full mesh of its own (see connect()).
 *
 * Launch: under mpirun (build with mpicxx: the mpi peer and its barrier),
 * or -np N: fork N ranks here. Gloo's rendezvous is a FileStore in a fresh
 * directory under /tmp (made by the parent, or by rank 0 and sent with
 * MPI_Bcast), so every rank must see the same /tmp (one host, or network
 * namespaces of one host). hcoll's unique id travels through that store.
 * --ranks-per-node L groups ranks into emulated nodes (HCOLL_HOSTID); Gloo
 * and Open MPI do not see nodes (Gloo is TCP between every pair; Open MPI
 * uses its own shared memory between ranks of one host).
 *
 * Exit: 0; 1 on an error, a wrong result or the deadline; 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "hcoll.h"
}

#ifndef GLOO_BENCH_MPI
#define GLOO_BENCH_MPI 0
#endif
#if GLOO_BENCH_MPI
#include <mpi.h>
#endif

namespace {

enum Lib { L_HCOLL, L_MPI, L_GLOO, L_RING, L_RING_CHUNKED, L_HD, L_BCUBE, L_COUNT };
const char *const lib_names[L_COUNT] = {"hcoll",   "mpi",    "gloo",      "gloo_ring",
                                        "gloo_ring_chunked", "gloo_hd", "gloo_bcube"};

struct Opts {
    size_t min_bytes = 4096, max_bytes = 64u << 20;
    double factor = 4;
    int iters = 20, warmup = 5, check = 1, np = 0, ranks_per_node = 0, deadline_s = 600;
    std::vector<Lib> libs;
    std::string iface, json;
};

struct Rank {
    Opts o;
    int rank = 0, nranks = 1;
    bool mpi = false;
    std::shared_ptr<gloo::rendezvous::Context> ctx; /* gloo::allreduce, barrier, results */
    std::shared_ptr<gloo::rendezvous::Context> legacy_ctx[L_COUNT];
    uint32_t tag = 0; /* each Gloo collective its own tag, as torch's ProcessGroupGloo */
    hcoll_comm_t comm = nullptr;
};

/* Per size: one buffer per library, and the legacy Gloo algorithm bound to it. */
struct Slot {
    Lib lib;
    std::vector<float> buf;
    std::unique_ptr<gloo::Algorithm> algo;
};

[[noreturn]] void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gloo_bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nusage: gloo_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
          "                  [-A LIB,...] [-np N] [--ranks-per-node L] [--iface IF]\n"
          "                  [-J FILE] [--deadline SEC]   (gloo_bench --help)\n",
          stderr);
    exit(2);
}

void help()
{
    printf("gloo_bench: Gloo's all-reduce against hcoll (and MPI_Allreduce under mpirun),\n"
           "float32 sum in place, alternating call by call on the same processes.\n"
           "  -b, -e SIZE        smallest, largest size in bytes (K, M, G suffixes; 4K, 64M)\n"
           "  -f FACTOR          size step (4)\n"
           "  -n ITERS           timed calls per size and library (20)\n"
           "  -w WARMUP          untimed calls first (5)\n"
           "  -c 0|1             one checked call per size and library first (1)\n"
           "  -A LIB,...         among hcoll mpi gloo gloo_ring gloo_ring_chunked gloo_hd\n"
           "                     gloo_bcube (hcoll,[mpi,]gloo,gloo_ring_chunked,gloo_hd)\n"
           "  -np N              fork N ranks on this host (else: a rank of mpirun)\n"
           "  --ranks-per-node L emulated nodes of L ranks for hcoll (HCOLL_HOSTID)\n"
           "  --iface IF         Gloo's interface ($GLOO_SOCKET_IFNAME, else lo)\n"
           "  -J FILE            rows as JSON too\n"
           "  --deadline SEC     -np: kill the ranks after SEC seconds; Gloo's timeout (600)\n"
           "Times per call are the slowest rank's; median, mean, p99 (nearest rank) and\n"
           "min over the ITERS calls; algbw = size / mean, busbw = algbw x 2(n-1)/n.\n");
}

size_t parse_size(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (end == s || *end || errno || v < 4 / mult || v * mult > 16.0 * (1u << 30))
        usage_error("%s: '%s' is not a size from 4 bytes to 16G", flag, s);
    return (size_t)(v * mult);
}

int parse_int(const char *flag, const char *s, int lo, int hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        usage_error("%s: '%s' is not an integer from %d to %d", flag, s, lo, hi);
    return (int)v;
}

std::vector<Lib> parse_libs(const char *s)
{
    std::vector<Lib> out;
    std::string all(s);
    size_t pos = 0;
    while (pos <= all.size()) {
        size_t comma = all.find(',', pos);
        std::string name = all.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        int found = -1;
        for (int l = 0; l < L_COUNT; l++)
            if (name == lib_names[l]) found = l;
        if (found < 0)
            usage_error("-A: '%s' is none of hcoll mpi gloo gloo_ring gloo_ring_chunked gloo_hd "
                        "gloo_bcube", name.c_str());
        if (std::find(out.begin(), out.end(), (Lib)found) == out.end())
            out.push_back((Lib)found);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return out;
}

bool under_mpirun() { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"); }

Opts parse_args(int argc, char **argv)
{
    Opts o;
    const char *libs = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") { help(); exit(0); }
        if (i + 1 >= argc) usage_error("%s: missing value (or unknown flag)", argv[i]);
        const char *v = argv[++i];
        if (a == "-b") o.min_bytes = parse_size("-b", v);
        else if (a == "-e") o.max_bytes = parse_size("-e", v);
        else if (a == "-f") o.factor = parse_int("-f", v, 2, 1024);
        else if (a == "-n") o.iters = parse_int("-n", v, 1, 1000000);
        else if (a == "-w") o.warmup = parse_int("-w", v, 0, 1000000);
        else if (a == "-c") o.check = parse_int("-c", v, 0, 1);
        else if (a == "-A") libs = v;
        else if (a == "-np") o.np = parse_int("-np", v, 1, 1024);
        else if (a == "--ranks-per-node") o.ranks_per_node = parse_int(a.c_str(), v, 1, 1024);
        else if (a == "--iface") o.iface = v;
        else if (a == "-J") o.json = v;
        else if (a == "--deadline") o.deadline_s = parse_int(a.c_str(), v, 1, 86400);
        else usage_error("unknown flag '%s'", a.c_str());
    }
    if (o.min_bytes > o.max_bytes) usage_error("-b is larger than -e");
    if (o.np && o.ranks_per_node && o.np % o.ranks_per_node)
        usage_error("-np %d is not a multiple of --ranks-per-node %d", o.np, o.ranks_per_node);
    bool mpi = GLOO_BENCH_MPI && !o.np && under_mpirun();
    if (!o.np && !under_mpirun())
        usage_error("no ranks: run under mpirun or give -np N");
    if (libs) {
        o.libs = parse_libs(libs);
        if (!mpi && std::find(o.libs.begin(), o.libs.end(), L_MPI) != o.libs.end())
            usage_error("-A mpi needs a build with mpicxx, run under mpirun without -np");
    } else {
        o.libs = {L_HCOLL, L_GLOO, L_RING_CHUNKED, L_HD};
        if (mpi) o.libs.insert(o.libs.begin() + 1, L_MPI);
    }
    if (o.iface.empty()) {
        const char *e = getenv("GLOO_SOCKET_IFNAME");
        o.iface = e && *e ? e : "lo";
    }
    return o;
}

double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hc_check(Rank &r, hcoll_status_t st, const char *what)
{
    if (st != HCOLL_SUCCESS)
        throw std::runtime_error(std::string(what) + ": " + hcoll_status_name(st) + ": " +
                                 hcoll_comm_last_error(r.comm));
}

void barrier(Rank &r)
{
#if GLOO_BENCH_MPI
    if (r.mpi) { MPI_Barrier(MPI_COMM_WORLD); return; }
#endif
    gloo::BarrierOptions opts(r.ctx);
    opts.setTag(++r.tag);
    gloo::barrier(opts);
}

/* A full mesh of its own under prefix in the store. */
std::shared_ptr<gloo::rendezvous::Context> mesh(Rank &r, gloo::rendezvous::Store &files,
                                                std::shared_ptr<gloo::transport::Device> &dev,
                                                const std::string &prefix)
{
    gloo::rendezvous::PrefixStore store(prefix, files);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(r.rank, r.nranks);
    ctx->setTimeout(std::chrono::seconds(r.o.deadline_s));
    ctx->connectFullMesh(store, dev);
    return ctx;
}

/* Gloo's meshes, then hcoll's communicator on an id rank 0 puts in the store.
 * Every legacy algorithm gets a mesh of its own: one built on the mesh that
 * gloo::allreduce uses, even once destroyed, slowed gloo::allreduce there
 * by up to 200x from 1 MiB up (Debian's 0.0~git20220518: 4 MiB in 3.7 s
 * instead of 17 ms), which no torch job sees. */
void connect(Rank &r, const std::string &store_dir)
{
    gloo::transport::tcp::attr attr;
    attr.iface = r.o.iface;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore files(store_dir);
    r.ctx = mesh(r, files, dev, "gloo");
    for (Lib l : r.o.libs)
        if (l != L_HCOLL && l != L_MPI && l != L_GLOO)
            r.legacy_ctx[l] = mesh(r, files, dev, lib_names[l]);

    bool want_hcoll = std::find(r.o.libs.begin(), r.o.libs.end(), L_HCOLL) != r.o.libs.end();
    if (!want_hcoll) return;
    if (r.o.ranks_per_node) {
        char host[96];
        snprintf(host, sizeof host, "gloo-bench-%s-node%d", strrchr(store_dir.c_str(), '/') + 1,
                 r.rank / r.o.ranks_per_node);
        setenv("HCOLL_HOSTID", host, 1);
    }
    gloo::rendezvous::PrefixStore hstore("hcoll", files);
    hcoll_unique_id_t id;
    if (r.rank == 0) {
        hc_check(r, hcoll_get_unique_id(&id), "hcoll_get_unique_id");
        hstore.set("id", std::vector<char>((char *)id.internal, (char *)id.internal + sizeof id.internal));
    }
    hstore.wait({"id"}, std::chrono::seconds(r.o.deadline_s));
    std::vector<char> got = hstore.get("id");
    if (got.size() != sizeof id.internal) throw std::runtime_error("hcoll id: wrong size in store");
    memcpy(id.internal, got.data(), sizeof id.internal);
    hc_check(r, hcoll_comm_init(&r.comm, r.nranks, r.rank, &id, nullptr), "hcoll_comm_init");
}

std::unique_ptr<gloo::Algorithm> make_legacy(Rank &r, Lib lib, float *p, int count)
{
    std::vector<float *> ptrs{p};
    const auto &c = r.legacy_ctx[lib];
    switch (lib) {
    case L_RING: return std::make_unique<gloo::AllreduceRing<float>>(c, ptrs, count);
    case L_RING_CHUNKED: return std::make_unique<gloo::AllreduceRingChunked<float>>(c, ptrs, count);
    case L_HD: return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(c, ptrs, count);
    case L_BCUBE: return std::make_unique<gloo::AllreduceBcube<float>>(c, ptrs, count);
    default: return nullptr;
    }
}

void run_one(Rank &r, Slot &s)
{
    size_t count = s.buf.size();
    float *p = s.buf.data();
    switch (s.lib) {
    case L_HCOLL:
        hc_check(r, hcoll_allreduce(r.comm, p, p, count, HCOLL_FLOAT32, HCOLL_SUM, nullptr),
                 "hcoll_allreduce");
        return;
    case L_MPI:
#if GLOO_BENCH_MPI
        MPI_Allreduce(MPI_IN_PLACE, p, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
#endif
        return;
    case L_GLOO: {
        gloo::AllreduceOptions opts(r.ctx);
        opts.setOutput(p, count);
        opts.setTag(++r.tag);
        opts.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
            &gloo::sum<float>));
        gloo::allreduce(opts);
        return;
    }
    default:
        s.algo->run();
    }
}

/* Exact in float whatever the order: small integers. */
float pattern(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 13 + 1)); }

double check_one(Rank &r, Slot &s)
{
    for (size_t i = 0; i < s.buf.size(); i++) s.buf[i] = pattern(r.rank, i);
    run_one(r, s);
    double wrong = 0, tri = r.nranks * (r.nranks + 1) / 2.0;
    for (size_t i = 0; i < s.buf.size(); i++)
        if (s.buf[i] != (float)(tri * (double)(i % 13 + 1))) wrong++;
    return wrong;
}

void reduce_all(Rank &r, std::vector<double> &v, void (*fn)(void *, const void *, const void *, size_t))
{
    if (v.empty() || r.nranks == 1) return;
    gloo::AllreduceOptions opts(r.ctx);
    opts.setOutput(v.data(), v.size());
    opts.setReduceFunction(fn);
    opts.setTag(++r.tag);
    gloo::allreduce(opts);
}

struct Row {
    size_t bytes;
    Lib lib;
    double median_us, mean_us, p99_us, min_us, algbw, busbw, wrong;
};

Row summarize(const Rank &r, size_t bytes, Lib lib, std::vector<double> t, double wrong)
{
    std::sort(t.begin(), t.end());
    size_t n = t.size();
    double mean = 0;
    for (double x : t) mean += x;
    mean /= (double)n;
    double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    size_t k = (size_t)std::ceil(0.99 * (double)n);
    double p99 = t[k ? k - 1 : 0];
    double algbw = (double)bytes / mean / 1e9;
    double busbw = algbw * 2.0 * (r.nranks - 1) / r.nranks;
    return Row{bytes, lib, median * 1e6, mean * 1e6, p99 * 1e6, t[0] * 1e6, algbw, busbw, wrong};
}

/* One size: check, warm up, time; rows on rank 0. */
void run_size(Rank &r, size_t bytes, std::vector<Row> &rows)
{
    size_t count = bytes / sizeof(float);
    std::vector<Slot> slots(r.o.libs.size());
    for (size_t k = 0; k < slots.size(); k++) {
        slots[k].lib = r.o.libs[k];
        slots[k].buf.assign(count, 0.0f);
        slots[k].algo = make_legacy(r, slots[k].lib, slots[k].buf.data(), (int)count);
    }
    std::vector<double> wrong(slots.size(), 0.0);
    if (r.o.check)
        for (size_t k = 0; k < slots.size(); k++) {
            wrong[k] = check_one(r, slots[k]);
            std::fill(slots[k].buf.begin(), slots[k].buf.end(), 0.0f);
        }
    size_t nl = slots.size(), n = (size_t)r.o.iters;
    for (int w = 0; w < r.o.warmup; w++)
        for (Slot &s : slots) run_one(r, s);
    std::vector<double> t(nl * n);
    for (size_t it = 0; it < n; it++)
        for (size_t j = 0; j < nl; j++) {
            size_t k = (it + j) % nl;
            barrier(r);
            double t0 = now_s();
            run_one(r, slots[k]);
            t[k * n + it] = now_s() - t0;
        }
    reduce_all(r, t, &gloo::max<double>);
    reduce_all(r, wrong, &gloo::sum<double>);
    for (size_t k = 0; k < nl; k++) {
        std::vector<double> tk(t.begin() + (long)(k * n), t.begin() + (long)((k + 1) * n));
        rows.push_back(summarize(r, count * sizeof(float), slots[k].lib, tk, wrong[k]));
        const Row &w = rows.back();
        if (r.rank == 0)
            printf("%12zu %-18s %12.1f %12.1f %12.1f %12.1f %9.4f %9.4f %7.0f\n", w.bytes,
                   lib_names[w.lib], w.median_us, w.mean_us, w.p99_us, w.min_us, w.algbw, w.busbw,
                   w.wrong);
    }
    if (r.rank == 0) fflush(stdout);
}

void write_json(const Rank &r, const std::vector<Row> &rows)
{
    FILE *f = fopen(r.o.json.c_str(), "w");
    if (!f) throw std::runtime_error("-J " + r.o.json + ": " + strerror(errno));
    fprintf(f, "{\"tool\": \"gloo_bench\", \"nranks\": %d, \"ranks_per_node\": %d, \"iters\": %d, "
               "\"warmup\": %d, \"dtype\": \"float32\", \"op\": \"sum\", \"in_place\": true,\n"
               " \"time\": \"per call, max over ranks; algbw and busbw from the mean\",\n"
               " \"rows\": [\n",
            r.nranks, r.o.ranks_per_node, r.o.iters, r.o.warmup);
    for (size_t i = 0; i < rows.size(); i++) {
        const Row &w = rows[i];
        fprintf(f, "  {\"bytes\": %zu, \"lib\": \"%s\", \"median_us\": %.3f, \"mean_us\": %.3f, "
                   "\"p99_us\": %.3f, \"min_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, "
                   "\"wrong\": %.0f}%s\n",
                w.bytes, lib_names[w.lib], w.median_us, w.mean_us, w.p99_us, w.min_us, w.algbw,
                w.busbw, w.wrong, i + 1 < rows.size() ? "," : "");
    }
    fprintf(f, " ]}\n");
    if (fclose(f) != 0) throw std::runtime_error("-J " + r.o.json + ": " + strerror(errno));
}

void print_header(const Rank &r)
{
    printf("# gloo_bench: %d ranks", r.nranks);
    if (r.o.ranks_per_node)
        printf(" (%d emulated nodes x %d for hcoll)", r.nranks / r.o.ranks_per_node,
               r.o.ranks_per_node);
    printf(", float32 sum in place, Gloo over TCP on %s, %d timed calls after %d warm-up\n",
           r.o.iface.c_str(), r.o.iters, r.o.warmup);
    printf("# time per call = slowest rank; algbw = size / mean; busbw = algbw x 2(n-1)/n\n");
    printf("# %10s %-18s %12s %12s %12s %12s %9s %9s %7s\n", "size(B)", "lib", "median(us)",
           "mean(us)", "p99(us)", "min(us)", "algbw", "busbw", "#wrong");
}

/* A rank's whole run; returns the exit code. */
int rank_main(Rank &r, const std::string &store_dir)
{
    int rc = 0;
    try {
        /* An unwritable -J fails before minutes of sweeping, not after. */
        if (r.rank == 0 && !r.o.json.empty()) {
            FILE *f = fopen(r.o.json.c_str(), "w");
            if (!f) throw std::runtime_error("-J " + r.o.json + ": " + strerror(errno));
            fclose(f);
        }
        connect(r, store_dir);
        if (r.rank == 0) print_header(r);
        std::vector<Row> rows;
        for (double b = (double)r.o.min_bytes; b <= (double)r.o.max_bytes * 1.0001; b *= r.o.factor)
            run_size(r, std::max<size_t>(sizeof(float), (size_t)b), rows);
        double wrong = 0;
        for (const Row &w : rows) wrong += w.wrong;
        if (r.rank == 0) {
            if (!r.o.json.empty()) write_json(r, rows);
            printf("# %s\n", wrong ? "WRONG RESULTS (see #wrong)" : "all results correct");
        }
        rc = wrong ? 1 : 0;
        barrier(r);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_bench: rank %d: %s\n", r.rank, e.what());
        rc = 1;
#if GLOO_BENCH_MPI
        /* The others wait in a collective this rank will never enter:
         * end the job now rather than at mpirun's deadline. */
        if (r.mpi) {
            fflush(stdout);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
#endif
    }
    if (r.comm) hcoll_comm_destroy(r.comm);
    r.ctx.reset();
    for (auto &c : r.legacy_ctx) c.reset();
    return rc;
}

void remove_dir(const std::string &dir)
{
    DIR *d = opendir(dir.c_str());
    if (d) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

std::string make_store_dir()
{
    char tmpl[] = "/tmp/gloo-bench.XXXXXX";
    if (!mkdtemp(tmpl)) {
        fprintf(stderr, "gloo_bench: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    return tmpl;
}

/* -np: fork the ranks, wait for them until the deadline; one that fails
 * takes the others down (they would wait for it until Gloo's timeout). */
int fork_ranks(const Opts &o)
{
    std::string dir = make_store_dir();
    std::vector<pid_t> pids;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 0);
    fflush(stdout);
    for (int i = 0; i < o.np; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("gloo_bench: fork"); break; }
        if (pid == 0) {
            Rank r;
            r.o = o, r.rank = i, r.nranks = o.np;
            if (i != 0 && !freopen("/dev/null", "w", stdout)) _exit(1);
            int rc = rank_main(r, dir);
            fflush(stdout); /* _exit flushes nothing */
            _exit(rc);
        }
        pids.push_back(pid);
    }
    int rc = (int)pids.size() == o.np ? 0 : 1;
    double end = now_s() + o.deadline_s;
    size_t left = pids.size();
    while (left && rc == 0) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
        } else if (now_s() > end) {
            fprintf(stderr, "gloo_bench: ranks still running after --deadline %d s\n", o.deadline_s);
            rc = 1;
        } else {
            usleep(10000);
        }
    }
    for (pid_t p : pids) kill(p, SIGKILL); /* the finished ones are zombies: harmless */
    while (waitpid(-1, nullptr, 0) > 0) {}
    remove_dir(dir);
    return rc;
}

int mpi_main(const Opts &o, int argc, char **argv)
{
#if GLOO_BENCH_MPI
    MPI_Init(&argc, &argv);
    Rank r;
    r.o = o, r.mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.nranks);
    char dir[64] = {0};
    if (r.rank == 0) snprintf(dir, sizeof dir, "%s", make_store_dir().c_str());
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    int rc = rank_main(r, dir);
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (r.rank == 0) remove_dir(dir);
    MPI_Finalize();
    return worst;
#else
    (void)o, (void)argc, (void)argv;
    fprintf(stderr, "gloo_bench: built without MPI: use -np N\n");
    return 2;
#endif
}

} // namespace

int main(int argc, char **argv)
{
    Opts o = parse_args(argc, argv);
    if (o.np) return fork_ranks(o);
    return mpi_main(o, argc, argv);
}
