/*
 * PCI distance classes (LOC/PIX/PXB/PHB/SYS) from resolved sysfs paths, on
 * the fixture tree's switches, root ports, root complexes and NUMA nodes.
 */
#include <check.h>
#include <string.h>

#include "sys/pci.h"

#define ROCE "tests/fixtures/sysfs-roce"

static void path_of_gpu(const char *bdf, char *out)
{
    ck_assert_msg(hc_pci_bdf_path(ROCE, bdf, out, HC_PCI_PATH_MAX) == 0, "%s", bdf);
}

static void path_of_nic(const char *dev, char *out)
{
    ck_assert_msg(hc_pci_ibdev_path(ROCE, dev, out, HC_PCI_PATH_MAX) == 0, "%s", dev);
}

START_TEST(resolved_paths)
{
    char p[HC_PCI_PATH_MAX];
    path_of_nic("mlx5_bond_0", p);
    ck_assert_str_eq(p, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0");
    path_of_gpu("0000:03:00.0", p);
    ck_assert_str_eq(p, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
    /* Upper-case bus ids (as some tools print them) resolve too. */
    ck_assert_int_eq(hc_pci_bdf_path(ROCE, "0000:83:00.0", p, sizeof p), 0);
    ck_assert_int_lt(hc_pci_bdf_path(ROCE, "0000:99:00.0", p, sizeof p), 0);
    ck_assert_int_lt(hc_pci_ibdev_path("tests/fixtures/sysfs-ib", "mlx5_0", p, sizeof p), 0);
}
END_TEST

START_TEST(distance_classes)
{
    static const struct { const char *gpu, *nic; int want; } tab[] = {
        { "0000:03:00.0", "mlx5_bond_0", HC_PCI_PIX }, /* one switch */
        { "0000:03:00.0", "mlx5_bond_1", HC_PCI_PHB }, /* other root port, same RC */
        { "0000:03:00.0", "mlx5_4", HC_PCI_PHB },      /* other RC, same NUMA node */
        { "0000:03:00.0", "mlx5_bond_2", HC_PCI_SYS }, /* other NUMA node */
        { "0000:83:00.0", "mlx5_bond_2", HC_PCI_PXB }, /* two switch levels */
        { "0000:87:00.0", "mlx5_bond_2", HC_PCI_PHB },
        { "0000:87:00.0", "mlx5_bond_0", HC_PCI_SYS },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char g[HC_PCI_PATH_MAX], n[HC_PCI_PATH_MAX];
        path_of_gpu(tab[i].gpu, g);
        path_of_nic(tab[i].nic, n);
        int d = hc_pci_distance(ROCE, g, n);
        ck_assert_msg(d == tab[i].want, "%s <-> %s: %s, want %s", tab[i].gpu, tab[i].nic,
                      hc_pci_dist_name(d), hc_pci_dist_name(tab[i].want));
        ck_assert_int_eq(hc_pci_distance(ROCE, n, g), d); /* symmetric */
    }
}
END_TEST

START_TEST(distance_edge_cases)
{
    const char *a = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0";
    ck_assert_int_eq(hc_pci_distance(ROCE, a, a), HC_PCI_LOC);
    ck_assert_int_eq(hc_pci_distance(ROCE, a,
                                     "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                     "0000:02:00.0/0000:03:00.1"),
                     HC_PCI_LOC);
    /* Unknown NUMA on different root complexes: assume the worst. */
    ck_assert_int_eq(hc_pci_distance(ROCE, "/sys/devices/pci0000:20/0000:20:01.0",
                                     "/sys/devices/pci0000:30/0000:30:01.0"),
                     HC_PCI_SYS);
    ck_assert_int_eq(hc_pci_distance(ROCE, "/sys/devices/virtual/net/rxe0", a), HC_PCI_SYS);
    ck_assert_str_eq(hc_pci_dist_name(HC_PCI_PXB), "PXB");
    ck_assert_str_eq(hc_pci_dist_name(9), "?");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pci");
    TCase *tc = tcase_create("distance");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, resolved_paths);
    tcase_add_test(tc, distance_classes);
    tcase_add_test(tc, distance_edge_cases);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
