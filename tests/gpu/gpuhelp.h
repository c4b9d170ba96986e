/*
 * Helpers for the GPU tests (tests/test_gpu_*.c): find out whether this
 * machine has a usable GPU without initialising CUDA in the calling
 * process (CUDA does not survive fork, and the multi-rank tests fork), and
 * the few driver calls the tests make through hcoll's own loader.
 */
#ifndef HCT_GPUHELP_H
#define HCT_GPUHELP_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gdr/gdr.h"

/* Number of GPUs (0: why says why), probed in a child process. */
static inline int gpu_probe(char *why, size_t whylen)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        char msg[256] = "";
        int n = 0;
        const hc_cu_api_t *cu = hc_gdr_cu(msg, sizeof msg);
        if (cu) {
            int d;
            while (n < 64 && cu->device_get(&d, n) == HC_CU_SUCCESS)
                n++;
            if (n == 0)
                snprintf(msg, sizeof msg, "the CUDA driver reports no device");
        }
        char out[300];
        int len = snprintf(out, sizeof out, "%d %s", n, msg);
        if (write(fds[1], out, (size_t)len) < 0)
            _exit(1);
        _exit(0);
    }
    close(fds[1]);
    char buf[300] = "";
    ssize_t got = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    int n = 0, off = 0;
    if (got <= 0 || sscanf(buf, "%d %n", &n, &off) < 1) {
        snprintf(why, whylen, "the probe process failed");
        return 0;
    }
    snprintf(why, whylen, "%s", buf + off);
    return n;
}

/* Retain device dev's primary context and make it current on this thread. */
static inline const hc_cu_api_t *gpu_open(int dev)
{
    char why[256];
    const hc_cu_api_t *cu = hc_gdr_cu(why, sizeof why);
    if (!cu) {
        fprintf(stderr, "no CUDA driver: %s\n", why);
        return NULL;
    }
    int d;
    void *ctx;
    if (cu->device_get(&d, dev) != HC_CU_SUCCESS || cu->primary_retain(&ctx, d) != HC_CU_SUCCESS ||
        cu->ctx_set_current(ctx) != HC_CU_SUCCESS) {
        fprintf(stderr, "cannot open GPU %d\n", dev);
        return NULL;
    }
    return cu;
}

/* The emulated driver's name ("hcoll-mock-cuda", tests/mock/cuda.c) when
 * the libcuda.so.1 in this process is that emulation, else NULL. Speeds
 * measured on it mean nothing, and its "GPU" is two slow CPU cores. Call
 * after the driver was loaded (gpu_open). */
static inline const char *gpu_mock_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return NULL;
    const char *(*name)(void) = (const char *(*)(void))dlsym(h, "hcmock_driver");
    const char *n = name ? name() : NULL;
    dlclose(h);
    return n;
}

#define GPU_OK(call)                                                                         \
    do {                                                                                     \
        hc_cu_res_t gr_ = (call);                                                            \
        if (gr_ != HC_CU_SUCCESS) {                                                          \
            char gb_[200];                                                                   \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,                  \
                    hc_gdr_cu_errstr(gr_, gb_, sizeof gb_));                                 \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

#endif
