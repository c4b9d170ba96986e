/*
 * GPUDirect decisions without a GPU: peermem / dma-buf detection on fixture
 * trees, the registration path chosen from them, HCOLL_NET_GDR_LEVEL
 * against PCI distances with NCCL's log line, the flush decision, and host
 * pointers reported as host memory when no CUDA driver is present.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "gdr/gdr.h"
#include "sys/pci.h"

START_TEST(peermem_and_dmabuf_probe)
{
    hc_gdr_caps_t c;
    hc_gdr_probe("tests/fixtures/sysfs-roce", &c);
    ck_assert(c.peermem);
    ck_assert_str_eq(c.peermem_how, "/sys/kernel/mm/memory_peers/nv_mem/version");
    ck_assert(c.dmabuf_kernel); /* 5.15 */
    ck_assert_str_eq(c.kernel, "5.15.0-91-generic");

    hc_gdr_probe("tests/fixtures/sysfs-ib", &c);
    ck_assert(c.peermem);
    ck_assert_str_eq(c.peermem_how, "/sys/module/nvidia_peermem");
    ck_assert(!c.dmabuf_kernel); /* 5.4 */

    hc_gdr_probe("tests/fixtures/sysfs-none", &c);
    ck_assert(!c.peermem);
    ck_assert(c.dmabuf_kernel); /* 6.8 */

    hc_gdr_probe("tests/fixtures/does-not-exist", &c);
    ck_assert(!c.peermem && !c.dmabuf_kernel);
}
END_TEST

START_TEST(registration_path)
{
    hc_gdr_caps_t both = { 1, "x", 1, "6.8" }, peer = { 1, "x", 0, "5.4" },
                  dmabuf = { 0, "", 1, "6.8" }, none = { 0, "", 0, "5.4" };
    ck_assert_int_eq(hc_gdr_reg_choose(&both, 1, 1), HC_GDR_REG_DMABUF);
    ck_assert_int_eq(hc_gdr_reg_choose(&both, 0, 1), HC_GDR_REG_PEERMEM); /* GPU lacks it */
    ck_assert_int_eq(hc_gdr_reg_choose(&both, 1, 0), HC_GDR_REG_PEERMEM); /* old verbs */
    ck_assert_int_eq(hc_gdr_reg_choose(&peer, 1, 1), HC_GDR_REG_PEERMEM); /* old kernel */
    ck_assert_int_eq(hc_gdr_reg_choose(&dmabuf, 1, 1), HC_GDR_REG_DMABUF);
    ck_assert_int_eq(hc_gdr_reg_choose(&dmabuf, 0, 1), HC_GDR_REG_STAGING);
    ck_assert_int_eq(hc_gdr_reg_choose(&none, 1, 1), HC_GDR_REG_STAGING);
    ck_assert_str_eq(hc_gdr_reg_name(HC_GDR_REG_DMABUF), "dma-buf");
    ck_assert_str_eq(hc_gdr_reg_name(HC_GDR_REG_STAGING), "host staging");
}
END_TEST

START_TEST(level_decision)
{
    char line[200];
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_PXB, HC_PCI_PHB, 0, "mlx5_bond_0", -1, line,
                                         sizeof line),
                     1);
    ck_assert_str_eq(line, "GPU Direct RDMA Enabled for GPU 0 / HCA mlx5_bond_0 (distance PXB <= PHB)");
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_SYS, HC_PCI_PHB, 3, "mlx5_bond_0", -1, line,
                                         sizeof line),
                     0);
    ck_assert_str_eq(line, "GPU Direct RDMA Disabled for GPU 3 / HCA mlx5_bond_0 (distance SYS > PHB)");
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_PIX, HC_PCI_PIX, 1, "m", -1, NULL, 0), 1);
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_PXB, HC_PCI_PIX, 1, "m", -1, NULL, 0), 0);
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_SYS, HC_PCI_SYS, 1, "m", -1, NULL, 0), 1);
    ck_assert_int_eq(hc_gdr_level_allows(HC_PCI_LOC, HC_PCI_LOC, 1, "m", -1, NULL, 0), 1);

    /* End to end on the fixture: GPU 2 sits two switches from its NIC. */
    char g[HC_PCI_PATH_MAX], n[HC_PCI_PATH_MAX];
    ck_assert_int_eq(hc_pci_bdf_path("tests/fixtures/sysfs-roce", "0000:83:00.0", g, sizeof g), 0);
    ck_assert_int_eq(hc_pci_ibdev_path("tests/fixtures/sysfs-roce", "mlx5_bond_2", n, sizeof n), 0);
    int d = hc_pci_distance("tests/fixtures/sysfs-roce", g, n);
    ck_assert_int_eq(hc_gdr_level_allows(d, HC_PCI_PXB, 2, "mlx5_bond_2", -1, NULL, 0), 1);
    ck_assert_int_eq(hc_gdr_level_allows(d, HC_PCI_PIX, 2, "mlx5_bond_2", -1, NULL, 0), 0);
}
END_TEST

/* The write-ordering attribute decides where the driver gives it; the
 * generation only where it does not (-1); the knob always wins. */
START_TEST(flush_decision_ordering)
{
    ck_assert_int_eq(hc_gdr_flush_decide(-1, 9, 0), 1);   /* Hopper on a path that orders nothing */
    ck_assert_int_eq(hc_gdr_flush_decide(-1, 8, 100), 0); /* OWNER */
    ck_assert_int_eq(hc_gdr_flush_decide(-1, 8, 200), 0); /* ALL_DEVICES */
    ck_assert_int_eq(hc_gdr_flush_decide(-1, 8, -1), 1);  /* unknown: by generation */
    ck_assert_int_eq(hc_gdr_flush_decide(-1, 9, -1), 0);
    ck_assert_int_eq(hc_gdr_flush_decide(0, 9, 0), 0);
    ck_assert_int_eq(hc_gdr_flush_decide(1, 9, 100), 1);
}
END_TEST

START_TEST(host_pointers_without_driver)
{
    char why[200] = "";
    int have = hc_gdr_cuda_available(why, sizeof why);
    void *p = malloc(64);
    ck_assert_int_eq(hc_gdr_ptr_kind(p, NULL), HC_MEM_HOST); /* with or without a driver */
    ck_assert_int_eq(hc_gdr_ptr_kind(NULL, NULL), HC_MEM_HOST);
    free(p);
    if (!have) {
        ck_assert_msg(why[0], "no driver: a reason is given");
        int fd;
        uint64_t off;
        size_t len;
        ck_assert_int_eq(hc_gdr_dmabuf_fd((void *)0x1000, 10, &fd, &off, &len, why, sizeof why),
                         HCOLL_ERR_UNSUPPORTED);
        ck_assert_int_eq(hc_gdr_gpu_info(0, NULL, 0, NULL, NULL), HCOLL_ERR_UNSUPPORTED);
        /* Nothing loaded libcuda into this process. */
        ck_assert_int_eq(hc_gdr_cuda_in_process(), 0);
    } else {
        /* hc_gdr_cuda_available loaded it. */
        ck_assert_int_eq(hc_gdr_cuda_in_process(), 1);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gdr");
    TCase *tc = tcase_create("decisions");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, peermem_and_dmabuf_probe);
    tcase_add_test(tc, registration_path);
    tcase_add_test(tc, level_decision);
    tcase_add_test(tc, flush_decision_ordering);
    tcase_add_test(tc, host_pointers_without_driver);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
