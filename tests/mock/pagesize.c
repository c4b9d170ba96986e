/*
 * A host with bigger pages than this one (64 KiB on aarch64 kernels such as
 * Grace's), for the tests: LD_PRELOAD=build/mock/libhcmock_page.so with
 * HCMOCK_PAGE_SIZE=65536 makes sysconf(_SC_PAGESIZE) and getpagesize()
 * answer that size in the whole process, libhcoll and the emulated CUDA
 * driver (whose dma-buf export wants page-aligned ranges) alike. The
 * kernel's pages stay 4 KiB, so everything aligned to the bigger size is
 * aligned for the real one too.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

static long big_page(void)
{
    const char *v = getenv("HCMOCK_PAGE_SIZE");
    /* Digits by hand, not atol: under ASan (make test-asan) sysconf is
     * called during ASan's own start-up, when its atol interceptor
     * refuses to run. */
    long n = 0;
    for (; v && *v >= '0' && *v <= '9' && n < (1L << 40); v++)
        n = n * 10 + (*v - '0');
    return n >= 4096 && (n & (n - 1)) == 0 ? n : 0;
}

API long sysconf(int name)
{
    static long (*real)(int);
    if (!real)
        real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    long big = big_page();
    if ((name == _SC_PAGESIZE) && big)
        return big;
    return real ? real(name) : -1;
}

API int getpagesize(void)
{
    static int (*real)(void);
    if (!real)
        real = (int (*)(void))dlsym(RTLD_NEXT, "getpagesize");
    long big = big_page();
    return big ? (int)big : real ? real() : 4096;
}
