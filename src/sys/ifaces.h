/*
 * Network interfaces for the bootstrap and the TCP rails.
 *
 * Which interfaces, in which order:
 *   - HCOLL_SOCKET_IFNAME in NCCL's list syntax (sys/envlist.h). An
 *     including list ("eth", "=eth0,eth1") takes exactly what it names, lo
 *     included when named, ordered by the first list entry each interface
 *     matches, so the user decides which interface is rail 0. An excluding
 *     list ("^eth2") removes names from the automatic choice below.
 *   - Automatic: every up interface except loopback and container or VM
 *     bridges (docker*, br-* as Docker names its networks, virbr*). Bridges
 *     are used only when nothing else exists, loopback only when nothing at
 *     all exists. Names such as veth* or rail0 are never excluded by
 *     name: emulated clusters use them for real rails.
 *   - One address per interface: its first IPv4 address, else its first
 *     global IPv6 address (link-local IPv6 needs a scope id on every peer and
 *     is skipped). Interfaces come in natural name order (rail2 before
 *     rail10) so that every node lists its rails alike and local rank i can
 *     bind the i-th address.
 */
#ifndef HC_SYS_IFACES_H
#define HC_SYS_IFACES_H

#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

#include "hcoll.h"

#define HC_IFACE_MAX 16

typedef union hc_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
} hc_sockaddr_t;

typedef struct hc_iface {
    char name[IF_NAMESIZE];
    unsigned flags;     /* IFF_UP, IFF_LOOPBACK... */
    hc_sockaddr_t addr; /* port 0 */
} hc_iface_t;

/*
 * The pure part, testable without real interfaces: from n candidate
 * (name, flags, address) entries, keep those the rules above allow and
 * write at most max_out of them, ordered, to out, and their number to
 * *count_out. spec is HCOLL_SOCKET_IFNAME ("" or NULL: automatic).
 * HCOLL_SUCCESS; HCOLL_ERR_INVALID_ARG when spec is not valid list syntax;
 * HCOLL_ERR_NETWORK when no interface is left (err says why); messages in
 * err, as sys/sysfs.h describes.
 */
hcoll_status_t hc_ifaces_select(const hc_iface_t *in, int n, const char *spec, hc_iface_t *out,
                                int max_out, int *count_out, char *err, size_t errlen);

/* getifaddrs + hc_ifaces_select: the same results, or HCOLL_ERR_SYSTEM
 * when getifaddrs fails. */
hcoll_status_t hc_ifaces_list(const char *spec, hc_iface_t *out, int max_out, int *count_out,
                              char *err, size_t errlen);

/* sockaddr helpers shared by bootstrap and transports. */
socklen_t hc_sockaddr_len(const hc_sockaddr_t *a);
int hc_sockaddr_port(const hc_sockaddr_t *a);
void hc_sockaddr_set_port(hc_sockaddr_t *a, int port);
/* "1.2.3.4:5" or "[::1]:5" (port omitted when 0). */
const char *hc_sockaddr_str(const hc_sockaddr_t *a, char *buf, size_t len);


#endif
