/*
 * Host identity: which ranks share a node. Two processes are on the same
 * node when their host ids are equal. The id is a 64-bit hash of the host
 * name and the kernel's boot id (so that two containers or VMs that share a
 * host name but not a kernel are apart), unless an override string is given
 * (HCOLL_HOSTID, as NCCL_HOSTID), which is hashed instead: that is how tests
 * emulate several nodes on one host.
 */
#ifndef HC_SYS_HOST_H
#define HC_SYS_HOST_H

#include <stddef.h>
#include <stdint.h>

/* override: "" or NULL for the automatic id. label_out gets a short human
 * name for logs: the override, else the host name. Never fails: a host
 * without /proc/sys/kernel/random/boot_id hashes the host name alone. */
void hc_host_id(const char *override, uint64_t *id_out, char *label_out, size_t label_len);

/* FNV-1a, 64 bits: stable across processes and builds. */
uint64_t hc_hash64(const void *data, size_t len, uint64_t seed);

#endif
