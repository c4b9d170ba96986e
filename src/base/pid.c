#include "base/pid.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

/* A copy of a fact the kernel keeps, per process by nature; nothing a
 * communicator could own instead. */
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;
static atomic_int pid_now;

static void pid_refresh(void)
{
    atomic_store_explicit(&pid_now, (int)getpid(), memory_order_relaxed);
}

static void pid_start(void)
{
    pid_refresh();
    /* glibc drops a library's fork handlers when it is unloaded. */
    pthread_atfork(NULL, NULL, pid_refresh);
}

int hc_pid(void)
{
    pthread_once(&pid_once, pid_start);
    return atomic_load_explicit(&pid_now, memory_order_relaxed);
}
