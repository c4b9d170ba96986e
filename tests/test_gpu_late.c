/*
 * Device all-reduce with a local rank that is late or dead, 2 nodes x 2
 * ranks (NCCL intra-node stages; needs 2 GPUs, which the emulated driver
 * gives under tests/gpu-mock.test.sh):
 *   - late: rank 3 enters its second all-reduce 3 s after the others, with
 *     HCOLL_TIMEOUT_MS=1000. Its node's other rank waits for the NCCL
 *     stage on its stream (the host stage's event) past that timeout,
 *     bounded by HCOLL_OP_TIMEOUT_MS and liveness instead, and every rank
 *     gets the right sum;
 *   - dead: rank 3 is SIGKILLed instead: every survivor fails within 2 s.
 * Skips (77) without a GPU.
 */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "gpu/gpuhelp.h"

#define NR 4
#define COUNT 4096
#define LATE_MS 3000

static int ngpus;

typedef struct shared {
    hct_id_slot_t id;
    int kill;                 /* 1: the victim dies instead of coming late */
    volatile double event_ms; /* when the victim died */
} shared_t;

static int rank_late(int rank, int nranks, void *arg)
{
    shared_t *sh = arg;
    const hc_cu_api_t *cu = gpu_open((rank % 2) % ngpus);
    HCT_REQUIRE(cu, "no GPU");
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    setenv("HCOLL_OP_TIMEOUT_MS", "20000", 1);
    setenv("HCOLL_LIVENESS_MS", "1000", 1);
    hcoll_unique_id_t id;
    HCT_REQUIRE(hct_share_unique_id(&sh->id, rank, 20000, &id) == 0, "no unique id");
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 1000; /* HCOLL_TIMEOUT_MS: the late rank is 3 times as late */
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    hc_cu_dptr_t buf;
    GPU_OK(cu->mem_alloc(&buf, COUNT * sizeof(float)));
    float *h = malloc(COUNT * sizeof *h);
    HCT_REQUIRE(h, "no memory");
    for (int it = 0; it < 2; it++) {
        GPU_OK(cu->memset_d32(buf, 0x3f800000u, COUNT)); /* 1.0f */
        GPU_OK(cu->stream_synchronize(NULL));
        if (it == 1 && rank == 3) {
            if (sh->kill) {
                sh->event_ms = hct_now_ms();
                raise(SIGKILL);
            }
            usleep(LATE_MS * 1000);
        }
        const double t = hct_now_ms();
        hcoll_status_t st = hcoll_allreduce(comm, (void *)(uintptr_t)buf, (void *)(uintptr_t)buf,
                                            COUNT, HCOLL_FLOAT32, HCOLL_SUM, stream);
        if (sh->kill && it == 1) {
            /* The stream holds NCCL work that waits for the dead rank: the
             * failure shows in the communicator, not by syncing. */
            const double end = hct_now_ms() + 5000;
            while (st == HCOLL_SUCCESS && hct_now_ms() < end) {
                hcoll_status_t async = HCOLL_SUCCESS;
                hcoll_comm_get_async_error(comm, &async);
                st = async;
                usleep(1000);
            }
            const double dt = hct_now_ms() - sh->event_ms;
            HCT_REQUIRE(st != HCOLL_SUCCESS, "rank %d: succeeded with rank 3 dead", rank);
            HCT_REQUIRE(dt < 2000, "rank %d failed %.0f ms after rank 3 died: %s", rank, dt,
                        hcoll_comm_last_error(comm));
            fprintf(stderr, "rank %d failed %.0f ms after the kill: %s\n", rank, dt,
                    hcoll_comm_last_error(comm));
            hcoll_comm_abort(comm);
            return 0;
        }
        if (st == HCOLL_SUCCESS && cu->stream_synchronize(stream) != HC_CU_SUCCESS)
            st = HCOLL_ERR_CUDA;
        hcoll_status_t async = HCOLL_SUCCESS;
        if (st == HCOLL_SUCCESS) /* the error of a call that had already returned */
            hcoll_comm_get_async_error(comm, &async), st = async;
        HCT_REQUIRE(st == HCOLL_SUCCESS, "rank %d: all-reduce %d -> %s (%s)", rank, it,
                    hcoll_status_name(st), hcoll_comm_last_error(comm));
        GPU_OK(cu->memcpy_dtoh_async(h, buf, COUNT * sizeof *h, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (int i = 0; i < COUNT; i++)
            HCT_REQUIRE(h[i] == (float)nranks, "rank %d: element %d is %g", rank, i, h[i]);
        if (it == 1 && rank != 3)
            fprintf(stderr, "rank %d: the late all-reduce took %.0f ms\n", rank,
                    hct_now_ms() - t);
    }
    free(h);
    cu->mem_free(buf);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->stream_destroy(stream);
    return 0;
}

static void run(int kill)
{
    shared_t *sh = hct_shared_alloc(sizeof *sh);
    sh->kill = kill;
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 40000 };
    hct_result_t res[NR];
    hct_run(&o, rank_late, sh, res);
    for (int r = 0; r < NR; r++) {
        if (kill && r == 3)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL, "rank 3 did not die");
        else
            ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d failed (see stderr)", r);
    }
    hct_shared_free(sh, sizeof *sh);
}

START_TEST(late_local_rank)
{
    run(0);
}
END_TEST

START_TEST(dead_local_rank)
{
    run(1);
}
END_TEST

int main(void)
{
    char why[256];
    ngpus = gpu_probe(why, sizeof why);
    if (ngpus < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    if (ngpus < 2)
        HCT_SKIP_ALL("2 nodes x 2 need 2 GPUs (an NCCL communicator cannot have two ranks on "
                     "one GPU); this machine has %d", ngpus);
    unsetenv("HCOLL_HOSTID");
    Suite *s = suite_create("gpu_late");
    TCase *tc = tcase_create("late");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, late_local_rank);
    tcase_add_test(tc, dead_local_rank);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf == 0 ? 0 : 1;
}
