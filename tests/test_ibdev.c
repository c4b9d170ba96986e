/*
 * RDMA device discovery on sysfs fixture trees (tests/fixtures): link-rate
 * parsing, port scan, HCOLL_IB_HCA filtering in NCCL syntax, NIC per local
 * rank (by name, and by PCI proximity to the rank's GPU), and GID choice
 * across RoCE v1/v2 mixes, link-local, IPv6-only and explicit indices.
 */
#include <arpa/inet.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sys/ibdev.h"
#include "sys/pci.h"

#define ROCE "tests/fixtures/sysfs-roce"
#define IB   "tests/fixtures/sysfs-ib"
#define NONE "tests/fixtures/sysfs-none"

START_TEST(rate_parsing)
{
    ck_assert_double_eq(hc_ibdev_parse_rate("200 Gb/sec (4X HDR)"), 200.0);
    ck_assert_double_eq(hc_ibdev_parse_rate("100 Gb/sec (2X EDR)"), 100.0);
    ck_assert_double_eq(hc_ibdev_parse_rate("25 Gb/sec (1X EDR)"), 25.0);
    ck_assert_double_eq(hc_ibdev_parse_rate("10 Gb/sec (4X QDR)"), 10.0);
    ck_assert_double_eq(hc_ibdev_parse_rate("2.5 Gb/sec (1X SDR)"), 2.5);
    ck_assert_double_eq(hc_ibdev_parse_rate("400 Gb/sec (4X NDR)"), 400.0);
    ck_assert_double_eq(hc_ibdev_parse_rate("53.125 Gb/sec (1X HDR)"), 53.125);
    ck_assert_double_eq(hc_ibdev_parse_rate("800 Mb/sec"), 0.8);
    ck_assert(hc_ibdev_parse_rate("") < 0);
    ck_assert(hc_ibdev_parse_rate("fast") < 0);
    ck_assert(hc_ibdev_parse_rate("200 Gbps") < 0);
    ck_assert(hc_ibdev_parse_rate(NULL) < 0);
    ck_assert_int_eq(hc_ibdev_rate_gbps(ROCE, "mlx5_bond_0", 1), 200);
    ck_assert_int_eq(hc_ibdev_rate_gbps(ROCE, "mlx5_bond_2", 1), 400);
    ck_assert_int_eq(hc_ibdev_rate_gbps(IB, "mlx5_2", 1), 25);
    ck_assert_int_eq(hc_ibdev_rate_gbps(IB, "mlx5_9", 1), 0); /* no such device */
}
END_TEST

START_TEST(scan_ports)
{
    hc_ibport_t p[HC_IBDEV_MAX_PORTS];
    int n = hc_ibdev_scan(IB, p, HC_IBDEV_MAX_PORTS);
    ck_assert_int_eq(n, 6);
    /* natural order: mlx4_0, mlx5_0, mlx5_1:1, mlx5_1:2, mlx5_2, mlx5_10 */
    const char *want[] = { "mlx4_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_10" };
    for (int i = 0; i < n; i++)
        ck_assert_str_eq(p[i].dev, want[i]);
    ck_assert_int_eq(p[3].port, 2);
    ck_assert(!p[0].active); /* INIT */
    ck_assert(p[1].active);
    ck_assert(!p[3].active); /* DOWN */
    ck_assert_int_eq(p[1].link_layer, HC_IB_LINK_IB);
    ck_assert_str_eq(p[1].rate, "200 Gb/sec (4X HDR)");
    ck_assert_double_eq(p[5].rate_gbps, 400.0);
    ck_assert_int_eq(p[1].active_mtu, 0); /* only verbs knows it */

    n = hc_ibdev_scan(ROCE, p, HC_IBDEV_MAX_PORTS);
    ck_assert_int_eq(n, 4);
    ck_assert_str_eq(p[0].dev, "mlx5_4");
    ck_assert_str_eq(p[1].dev, "mlx5_bond_0");
    ck_assert_int_eq(p[1].link_layer, HC_IB_LINK_ETH);
    ck_assert_str_eq(hc_ib_link_name(p[1].link_layer), "RoCE");

    ck_assert_int_eq(hc_ibdev_scan(NONE, p, HC_IBDEV_MAX_PORTS), 0);
    ck_assert_int_eq(hc_ibdev_scan("tests/fixtures/does-not-exist", p, HC_IBDEV_MAX_PORTS), 0);
}
END_TEST

/* Select with spec; compare "dev:port,dev:port". */
static void expect_sel(const char *root, const char *spec, const char *want)
{
    hc_ibport_t p[HC_IBDEV_MAX_PORTS];
    char err[200] = "", got[HC_IBDEV_MAX_PORTS * 48] = "";
    int n = -1;
    ck_assert_msg(hc_ibdev_select(root, spec, NULL, p, HC_IBDEV_MAX_PORTS, &n, err, sizeof err) ==
                      HCOLL_SUCCESS,
                  "spec '%s': %s", spec ? spec : "(null)", err);
    for (int i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%.32s:%d", i ? "," : "",
                 p[i].dev, p[i].port);
    ck_assert_msg(strcmp(got, want) == 0, "spec '%s': got '%s', want '%s'",
                  spec ? spec : "(null)", got, want);
}

START_TEST(hca_filter)
{
    expect_sel(IB, NULL, "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_10:1");
    expect_sel(IB, "", "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_10:1");
    expect_sel(IB, "mlx5_1", "mlx5_1:1,mlx5_10:1");         /* prefix */
    expect_sel(IB, "=mlx5_1", "mlx5_1:1");                  /* exact */
    expect_sel(IB, "^mlx5_1", "mlx5_0:1,mlx5_2:1");         /* exclude prefix */
    expect_sel(IB, "^=mlx5_1", "mlx5_0:1,mlx5_2:1,mlx5_10:1"); /* exclude exact */
    expect_sel(IB, "mlx5_1:2", "");                         /* DOWN port */
    expect_sel(IB, "=mlx5_1:1,mlx5_0:1", "mlx5_0:1,mlx5_1:1");
    expect_sel(IB, "mlx4", "");                             /* INIT only */
    expect_sel(ROCE, "mlx5_bond", "mlx5_bond_0:1,mlx5_bond_1:1,mlx5_bond_2:1");
    expect_sel(ROCE, "^=mlx5_bond_1", "mlx5_bond_0:1,mlx5_bond_2:1");

    hc_ibport_t p[4];
    char err[200] = "";
    int n = -1;
    ck_assert_int_eq(hc_ibdev_select(IB, "mlx5_0:x", NULL, p, 4, &n, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(err[0], "a malformed list says why");
    ck_assert_int_eq(n, -1); /* outputs only on success */
}
END_TEST

START_TEST(nic_per_rank_by_name)
{
    hc_ib_choice_t c;
    char err[256];
    const char *want[] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_0" };
    for (int r = 0; r < 5; r++) {
        ck_assert_msg(hc_ibdev_for_rank(IB, NULL, r, NULL, -1, 0, &c, err, sizeof err) ==
                          HCOLL_SUCCESS,
                      "%s", err);
        ck_assert_str_eq(c.port.dev, want[r]);
        ck_assert_int_eq(c.index, r % 4);
        ck_assert_int_eq(c.nselected, 4);
        ck_assert_int_eq(c.gid_index, 0); /* InfiniBand */
    }
    ck_assert_int_eq(hc_ibdev_for_rank(IB, "^=mlx5_0", 0, NULL, -1, 0, &c, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_str_eq(c.port.dev, "mlx5_1");
}
END_TEST

START_TEST(nic_per_rank_by_gpu)
{
    static const struct { const char *gpu, *nic; int dist; } tab[] = {
        { "0000:03:00.0", "mlx5_bond_0", HC_PCI_PIX }, /* same switch */
        { "0000:07:00.0", "mlx5_bond_1", HC_PCI_PIX },
        { "0000:83:00.0", "mlx5_bond_2", HC_PCI_PXB }, /* behind a second switch */
        { "0000:87:00.0", "mlx5_bond_2", HC_PCI_PHB }, /* same root complex */
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        char gpu[HC_PCI_PATH_MAX], err[256];
        ck_assert_int_eq(hc_pci_bdf_path(ROCE, tab[i].gpu, gpu, sizeof gpu), 0);
        hc_ib_choice_t c;
        /* Explicit GID index: bond_2 has no automatic RoCE v2 GID. */
        hcoll_status_t st =
            hc_ibdev_for_rank(ROCE, "mlx5_bond", (int)i, gpu, 1, 0, &c, err, sizeof err);
        ck_assert_msg(st == HCOLL_SUCCESS, "%s: %s", tab[i].gpu, err);
        ck_assert_msg(strcmp(c.port.dev, tab[i].nic) == 0, "GPU %s: got %s want %s", tab[i].gpu,
                      c.port.dev, tab[i].nic);
        ck_assert_int_eq(c.port.pci_dist, tab[i].dist);
    }
}
END_TEST

START_TEST(nic_errors_say_what_was_found)
{
    hc_ib_choice_t c;
    char err[256] = "";
    ck_assert_int_eq(hc_ibdev_for_rank(NONE, NULL, 0, NULL, -1, 0, &c, err, sizeof err),
                     HCOLL_ERR_RDMA);
    ck_assert_msg(strstr(err, "no RDMA device found"), "%s", err);
    ck_assert_int_eq(hc_ibdev_for_rank(IB, "=mlx4_0", 0, NULL, -1, 0, &c, err, sizeof err),
                     HCOLL_ERR_RDMA);
    ck_assert_msg(strstr(err, "no ACTIVE port matching HCOLL_IB_HCA==mlx4_0"), "%s", err);
    ck_assert_int_eq(hc_ibdev_for_rank(ROCE, "=mlx5_bond_2", 0, NULL, -1, 0, &c, err, sizeof err),
                     HCOLL_ERR_RDMA);
    ck_assert_msg(strstr(err, "no usable RoCE v2 GID") && strstr(err, "HCOLL_IB_GID_INDEX"), "%s",
                  err);
    /* A malformed list and an empty forced GID index are the caller's
     * arguments. */
    ck_assert_int_eq(hc_ibdev_for_rank(IB, "mlx5_0:x", 0, NULL, -1, 0, &c, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_ibdev_for_rank(ROCE, "=mlx5_bond_0", 0, NULL, 77, 0, &c, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "HCOLL_IB_GID_INDEX=77"), "%s", err);
}
END_TEST

static int choose(const char *dev, long forced, uint32_t ip, hc_gid_entry_t *g, char *why)
{
    int idx = -1;
    return hc_ibdev_gid_choose(ROCE, dev, 1, HC_IB_LINK_ETH, forced, ip, &idx, g, why, 200) ==
                   HCOLL_SUCCESS
               ? idx
               : -1;
}

START_TEST(gid_choice)
{
    hc_gid_entry_t g;
    char why[200], txt[64];
    /* v1/v2 mix with link-local entries: the IPv4-mapped RoCE v2 one. */
    ck_assert_int_eq(choose("mlx5_bond_0", -1, 0, &g, why), 3);
    hc_gid_format(g.raw, txt, sizeof txt);
    ck_assert_str_eq(txt, "::ffff:10.0.0.1");
    ck_assert_int_eq(g.type, HC_GID_TYPE_ROCE_V2);
    /* The rail's own address wins over the first IPv4 GID. */
    uint32_t ip;
    inet_pton(AF_INET, "192.168.1.5", &ip);
    ck_assert_int_eq(choose("mlx5_bond_0", -1, ip, &g, why), 4);
    ck_assert_msg(strstr(why, "rail"), "%s", why);
    /* IPv6-only: the global RoCE v2 GID, never the link-local one. */
    ck_assert_int_eq(choose("mlx5_bond_1", -1, 0, &g, why), 3);
    ck_assert_msg(strstr(why, "2001:db8::5") && strstr(why, "IPv6"), "%s", why);
    /* Link-local only: refused, with what the table holds. */
    ck_assert_int_eq(choose("mlx5_bond_2", -1, 0, &g, why), -1);
    ck_assert_msg(strstr(why, "2 non-zero GIDs: 1 RoCE v2 link-local"), "%s", why);
    /* Explicit index: taken as is, even a v1 link-local one. */
    ck_assert_int_eq(choose("mlx5_bond_2", 0, 0, &g, why), 0);
    ck_assert_msg(strstr(why, "HCOLL_IB_GID_INDEX"), "%s", why);
    ck_assert_int_eq(g.type, HC_GID_TYPE_ROCE_V1);
    /* Explicit index on a zero or absent entry: refused. */
    ck_assert_int_eq(choose("mlx5_bond_0", 5, 0, &g, why), -1);
    ck_assert_int_eq(choose("mlx5_bond_0", 77, 0, &g, why), -1);
    ck_assert_msg(strstr(why, "HCOLL_IB_GID_INDEX=77"), "%s", why);
    /* InfiniBand: index 0. */
    int idx = -1;
    ck_assert_int_eq(hc_ibdev_gid_choose(IB, "mlx5_0", 1, HC_IB_LINK_IB, -1, 0, &idx, &g, why,
                                         sizeof why),
                     HCOLL_SUCCESS);
    ck_assert_int_eq(idx, 0);
    /* The table lists non-zero entries only. */
    hc_gid_entry_t tab[16];
    ck_assert_int_eq(hc_ibdev_gids(ROCE, "mlx5_bond_0", 1, tab, 16), 5);
}
END_TEST

START_TEST(gid_text)
{
    uint8_t raw[16];
    uint32_t ip;
    ck_assert_int_eq(hc_gid_parse("0000:0000:0000:0000:0000:ffff:0a00:0001", raw), 0);
    ck_assert(hc_gid_is_ipv4(raw, &ip));
    ck_assert_uint_eq(ntohl(ip), 0x0a000001u);
    ck_assert(!hc_gid_is_link_local(raw));
    ck_assert_int_eq(hc_gid_parse("fe80:0000:0000:0000:0a00:27ff:fe00:0001", raw), 0);
    ck_assert(hc_gid_is_link_local(raw));
    ck_assert(!hc_gid_is_ipv4(raw, NULL));
    ck_assert_int_eq(hc_gid_parse("fe80::1", raw), -1);
    ck_assert_int_eq(hc_gid_parse("0000:0000:0000:0000:0000:0000:0000:0000", raw), 0);
    ck_assert(hc_gid_is_zero(raw));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ibdev");
    TCase *tc = tcase_create("sysfs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, rate_parsing);
    tcase_add_test(tc, scan_ports);
    tcase_add_test(tc, hca_filter);
    tcase_add_test(tc, nic_per_rank_by_name);
    tcase_add_test(tc, nic_per_rank_by_gpu);
    tcase_add_test(tc, nic_errors_say_what_was_found);
    tcase_add_test(tc, gid_choice);
    tcase_add_test(tc, gid_text);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
