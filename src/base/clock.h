/*
 * The one clock every deadline and timing in the library reads: monotonic,
 * so a wall-clock step never cuts a wait short or stretches it.
 */
#ifndef HC_CORE_CLOCK_H
#define HC_CORE_CLOCK_H

#include <time.h>

static inline double hc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline double hc_now_us(void)
{
    return hc_now_ms() * 1e3;
}

#endif
