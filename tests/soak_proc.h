/*
 * What a process holds, read from /proc/self: resident memory, threads,
 * open fds, and the heap bytes malloc has handed out. Shared by the soak
 * (tests/soak.c) and the lifecycle test (tests/test_lifecycle.c), which fail
 * when any of them grows.
 */
#ifndef HCT_SOAK_PROC_H
#define HCT_SOAK_PROC_H

#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct hct_proc {
    long rss_kb;     /* VmRSS */
    long anon_kb, shmem_kb; /* its anonymous and shared-memory parts */
    int threads;     /* entries of /proc/self/task */
    int fds;         /* entries of /proc/self/fd, less opendir's own */
    long heap_bytes; /* malloc's bytes in use, every arena, mmapped chunks too */
    long arena_bytes; /* what malloc holds from the system (in use or free) */
} hct_proc_t;

static inline int hct_count_dir(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static inline long hct_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            sscanf(line + kl + 1, "%ld", &v);
            break;
        }
    fclose(f);
    return v;
}

static inline hct_proc_t hct_proc_sample(void)
{
    hct_proc_t s;
    s.rss_kb = hct_status_kb("VmRSS");
    s.anon_kb = hct_status_kb("RssAnon");
    s.shmem_kb = hct_status_kb("RssShmem");
    s.threads = hct_count_dir("/proc/self/task", "");
    s.fds = hct_count_dir("/proc/self/fd", "") - 1;
    struct mallinfo2 mi = mallinfo2();
    s.heap_bytes = (long)(mi.uordblks + mi.hblkhd);
    s.arena_bytes = (long)(mi.arena + mi.hblkhd);
    return s;
}

/*
 * A sample taken once the process holds at most `fds` fds and `threads`
 * threads, or after 2 s. pthread_join returns when the kernel clears the
 * thread's tid, which is before the task leaves /proc/self/task; on a busy
 * machine a joined thread can stay listed for a while. A thread or fd that
 * really leaked is still there after 2 s.
 */
static inline hct_proc_t hct_proc_settle(int fds, int threads)
{
    hct_proc_t s = hct_proc_sample();
    for (int i = 0; i < 200 && (s.fds > fds || s.threads > threads); i++) {
        usleep(10000);
        s = hct_proc_sample();
    }
    return s;
}

#endif
