/*
 * NCCL's entry points, loaded at run time (dlopen libnccl.so.2) once per
 * process into a read-only table: the intra-node backend (nccl.c) and the
 * benchmark's NCCL peer (tools/hcoll_perf.c) share it, so that libhcoll and
 * its tools never link NCCL and need no NCCL header.
 *
 * The enums and the NCCL 2.14 prefix of ncclConfig_t below are NCCL's
 * stable ABI (NCCL reads a config by its version field, so an older prefix
 * stays valid on newer libraries).
 */
#ifndef HC_NCCL_API_H
#define HC_NCCL_API_H

#include <stddef.h>

#include "hcoll.h"

#define HC_NCCL_SUCCESS 0
#define HC_NCCL_IN_PROGRESS 7
#define HC_NCCL_UNIQUE_ID_BYTES 128
#define HC_NCCL_VERSION_2_14 21400

typedef int hc_nccl_res_t;
typedef void *hc_nccl_comm_t;
typedef struct { char internal[HC_NCCL_UNIQUE_ID_BYTES]; } hc_nccl_uid_t;
/* ncclConfig_t as of NCCL 2.14 (what version says). */
typedef struct {
    size_t size;
    unsigned magic;
    unsigned version;
    int blocking;
    int cga_cluster_size;
    int min_ctas;
    int max_ctas;
    const char *net_name;
} hc_nccl_config_t;

typedef struct hc_nccl_api {
    int version;
    hc_nccl_res_t (*get_version)(int *);
    const char *(*err_string)(hc_nccl_res_t);
    hc_nccl_res_t (*get_unique_id)(hc_nccl_uid_t *);
    hc_nccl_res_t (*init_rank_config)(hc_nccl_comm_t *, int, hc_nccl_uid_t, int,
                                      hc_nccl_config_t *);
    hc_nccl_res_t (*get_async_error)(hc_nccl_comm_t, hc_nccl_res_t *);
    hc_nccl_res_t (*finalize)(hc_nccl_comm_t);
    hc_nccl_res_t (*destroy)(hc_nccl_comm_t);
    hc_nccl_res_t (*abort)(hc_nccl_comm_t);
    hc_nccl_res_t (*reduce_scatter)(const void *, void *, size_t, int, int, hc_nccl_comm_t,
                                    void *);
    hc_nccl_res_t (*all_gather)(const void *, void *, size_t, int, hc_nccl_comm_t, void *);
    hc_nccl_res_t (*all_reduce)(const void *, void *, size_t, int, int, hc_nccl_comm_t, void *);
    hc_nccl_res_t (*reduce)(const void *, void *, size_t, int, int, int, hc_nccl_comm_t, void *);
    hc_nccl_res_t (*broadcast)(const void *, void *, size_t, int, int, hc_nccl_comm_t, void *);
    hc_nccl_res_t (*group_start)(void);
    hc_nccl_res_t (*group_end)(void);
    /* ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) and
     * ncclRedOpDestroy(op, comm) (NCCL 2.11). */
    hc_nccl_res_t (*premul_create)(int *, void *, int, int, hc_nccl_comm_t);
    hc_nccl_res_t (*premul_destroy)(int, hc_nccl_comm_t);
} hc_nccl_api_t;

/* The table, or NULL with the reason in why (may be NULL): libnccl.so.2 not
 * loadable, a symbol missing, or older than NCCL 2.14. Thread-safe. */
const hc_nccl_api_t *hc_nccl_api(char *why, size_t whylen);

/* A config for ncclCommInitRankConfig: NCCL's defaults, blocking or not. */
void hc_nccl_config_init(hc_nccl_config_t *cfg, int blocking);

/* ncclDataType_t of dtype, or -1 when NCCL has none. */
int hc_nccl_dtype(hcoll_dtype_t dtype);
/* ncclRedOp_t of op, or -1. AVG maps to ncclSum when avg_as_sum (the
 * caller divides once, at the end) and to ncclAvg (NCCL >= 2.10) when not. */
int hc_nccl_op(hcoll_op_t op, int avg_as_sum);

#endif
