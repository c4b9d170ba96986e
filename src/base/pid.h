/*
 * This process's id without a system call. The fork checks (a
 * communicator or request used in a forked child is refused) run on every
 * collective, and a getpid() costs about 1 µs on a paravirtualised host,
 * two of them a 4 KiB all-reduce's rank. Read once, and again in the child
 * of every fork() through pthread_atfork; a child made by a raw clone() or
 * syscall(SYS_fork) runs no fork handlers and keeps the parent's value.
 */
#ifndef HC_BASE_PID_H
#define HC_BASE_PID_H

int hc_pid(void);

#endif
