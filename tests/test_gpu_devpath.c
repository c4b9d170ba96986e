/*
 * The device-buffer path without a GPU: whether the kernels are built as
 * recorded, and what a device-buffer call answers on a host without a
 * CUDA driver (or, on a machine with one, what a host buffer with a stream
 * answers). The schedule's arithmetic is tested in test_devsched.c.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/ranks.h"
#include "core/coll_dev.h"
#include "gdr/gdr.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"

START_TEST(kernels_built_as_recorded)
{
    ck_assert_int_eq(hc_gdr_kern_built(), HCOLL_BUILD_KERNELS);
    char why[200] = "";
    hc_gdr_kern_t *k = NULL;
    if (!hc_gdr_cu(why, sizeof why)) {
        /* No driver: loading fails and says why. */
        ck_assert_int_eq(hc_gdr_kern_load(&k, why, sizeof why), HCOLL_ERR_UNSUPPORTED);
        ck_assert(strlen(why) > 10);
        ck_assert(k == NULL);
    }
}
END_TEST

/* ---- Device calls through the public API, one rank ---------------------- */

static hcoll_comm_t one_rank_comm(void)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    ck_assert_int_eq(hcoll_get_unique_id(&id), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_init(&comm, 1, 0, &id, NULL), HCOLL_SUCCESS);
    return comm;
}

START_TEST(stream_calls_without_gpu)
{
    char why[200] = "";
    int have_driver = hc_gdr_cu(why, sizeof why) != NULL;
    hcoll_comm_t comm = one_rank_comm();
    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i;
    /* Any non-NULL value is "a stream" to the API. */
    void *fake_stream = (void *)(uintptr_t)0x1; /* CU_STREAM_LEGACY's value */
    hcoll_status_t st = hcoll_allreduce(comm, in, out, 16, HCOLL_FLOAT32, HCOLL_SUM, fake_stream);
    const char *msg = hcoll_comm_last_error(comm);
    if (have_driver) {
        /* Host buffers with a stream are refused as such. */
        ck_assert_int_eq(st, HCOLL_ERR_INVALID_ARG);
        ck_assert_msg(strstr(msg, "host memory") != NULL, "message: %s", msg);
    } else {
        /* The reason is the loader's: no libcuda.so.1, or a driver whose
         * cuInit finds no GPU (CUDA_VISIBLE_DEVICES="", HCMOCK_NDEV=0). */
        ck_assert_int_eq(st, HCOLL_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(msg, "CUDA stream") != NULL &&
                          (strstr(msg, "libcuda") != NULL || strstr(msg, "cuInit") != NULL),
                      "message: %s", msg);
    }
    hcoll_request_t req = (hcoll_request_t)(uintptr_t)0x1234;
    st = hcoll_allreduce_async(comm, in, out, 16, HCOLL_FLOAT32, HCOLL_SUM, fake_stream, &req);
    ck_assert_int_eq(st, have_driver ? HCOLL_ERR_INVALID_ARG : HCOLL_ERR_UNSUPPORTED);
    ck_assert(req == (hcoll_request_t)(uintptr_t)0x1234); /* untouched on failure */
    /* Bad dtype is still an argument error, stream or not. */
    st = hcoll_allreduce(comm, in, out, 16, (hcoll_dtype_t)99, HCOLL_SUM, fake_stream);
    ck_assert_int_eq(st, HCOLL_ERR_INVALID_ARG);
    /* The refusals left the communicator healthy: host calls still work. */
    memset(out, 0, sizeof out);
    ck_assert_int_eq(hcoll_allreduce(comm, in, out, 16, HCOLL_FLOAT32, HCOLL_SUM, NULL),
                     HCOLL_SUCCESS);
    ck_assert(memcmp(in, out, sizeof in) == 0);
    hcoll_status_t async = HCOLL_IN_PROGRESS;
    ck_assert_int_eq(hcoll_comm_get_async_error(comm, &async), HCOLL_SUCCESS);
    ck_assert_int_eq(async, HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_destroy(comm), HCOLL_SUCCESS);
}
END_TEST

START_TEST(zero_count_with_stream)
{
    /* count 0 moves nothing and needs no GPU: it succeeds and its request
     * completes, in order with the others. */
    hcoll_comm_t comm = one_rank_comm();
    void *fake_stream = (void *)(uintptr_t)0x1;
    hcoll_request_t req = NULL;
    ck_assert_int_eq(hcoll_allreduce_async(comm, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM,
                                           fake_stream, &req),
                     HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_wait(req), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_request_free(req), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_allreduce(comm, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM, fake_stream),
                     HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_destroy(comm), HCOLL_SUCCESS);
}
END_TEST

START_TEST(buffer_id_not_reused)
{
    /* The verbs registration cache keys device memory by CUDA's buffer id:
     * an allocation freed and made again (often at the same address) must
     * get a new one, or a stale registration would be used. */
    char why[200] = "";
    if (!hc_gdr_cu(why, sizeof why)) {
        printf("SKIP: buffer_id_not_reused needs a CUDA driver: %s\n", why);
        return;
    }
    const hc_cu_api_t *cu = gpu_open(0);
    ck_assert(cu);
    hc_cu_dptr_t a, b;
    ck_assert_int_eq(cu->mem_alloc(&a, 1 << 20), HC_CU_SUCCESS);
    void *pa = (void *)(uintptr_t)a;
    int dev = -1;
    ck_assert_int_eq(hc_gdr_ptr_kind(pa, &dev), HC_MEM_DEVICE);
    ck_assert_int_eq(dev, 0);
    uint64_t id1 = hc_gdr_ptr_buffer_id(pa);
    ck_assert_int_eq(cu->mem_free(a), HC_CU_SUCCESS);
    ck_assert_int_eq(cu->mem_alloc(&b, 1 << 20), HC_CU_SUCCESS);
    uint64_t id2 = hc_gdr_ptr_buffer_id((void *)(uintptr_t)b);
    ck_assert_msg(id1 != 0 && id2 != 0 && id1 != id2,
                  "buffer ids %llu then %llu (addresses %#llx, %#llx)", (unsigned long long)id1,
                  (unsigned long long)id2, (unsigned long long)a, (unsigned long long)b);
    /* An address inside the allocation has the allocation's id. */
    ck_assert(hc_gdr_ptr_buffer_id((void *)(uintptr_t)(b + 4096)) == id2);
    cu->mem_free(b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpu_devpath");
    TCase *tc = tcase_create("logic");
    tcase_add_test(tc, kernels_built_as_recorded);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, stream_calls_without_gpu);
    tcase_add_test(tc, zero_count_with_stream);
    tcase_add_test(tc, buffer_id_not_reused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
