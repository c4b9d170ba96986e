/*
 * Verbs transport on a host without RDMA devices: what can run here.
 * libibverbs loads at run time (or its absence is reported), HCOLL_NET=auto
 * falls back to TCP with an INFO line, HCOLL_NET=ib fails with what was
 * found, create() on a fixture tree whose devices libibverbs cannot open
 * fails cleanly, completion-status texts, MTU arithmetic and the
 * registration cache. The data path itself needs NICs: scripts/ib-check.sh.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/config.h"
#include "base/err.h"
#include "inter/ib/ib.h"
#include "inter/transport.h"

/* The communicator's settings as hcoll_comm_init reads them (from this
 * test's environment), with the fixture tree and HCA list given. */
static hc_params_t fixture_params(const char *root, const char *hca)
{
    hc_params_t p;
    char err[200];
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_SUCCESS);
    snprintf(p.sysfs_root, sizeof p.sysfs_root, "%s", root);
    snprintf(p.ib_hca, sizeof p.ib_hca, "%s", hca);
    return p;
}

static hc_ib_config_t fixture_cfg(const char *root, const char *hca)
{
    hc_params_t p = fixture_params(root, hca);
    hc_ib_config_t c;
    hc_ib_config_from_params(&p, &c);
    return c;
}

START_TEST(config_defaults)
{
    unsetenv("HCOLL_IB_TIMEOUT");
    unsetenv("HCOLL_IB_RETRY_CNT");
    setenv("HCOLL_IB_TC", "106", 1);
    setenv("HCOLL_IB_HCA", "^=mlx5_1", 1);
    hc_params_t p;
    hc_ib_config_t c;
    char err[200];
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_SUCCESS);
    hc_ib_config_from_params(&p, &c);
    ck_assert_int_eq(c.timeout, 20);
    ck_assert_int_eq(c.retry_cnt, 7);
    ck_assert_int_eq(c.tc, 106);
    ck_assert_int_eq(c.gid_index, -1);
    ck_assert_str_eq(c.hca, "^=mlx5_1");
    ck_assert_str_eq(c.sysfs_root, "/");
    setenv("HCOLL_IB_TIMEOUT", "40", 1);
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "HCOLL_IB_TIMEOUT"), "%s", err);
    unsetenv("HCOLL_IB_TIMEOUT");
    unsetenv("HCOLL_IB_TC");
    unsetenv("HCOLL_IB_HCA");
}
END_TEST

START_TEST(usable_on_fixtures)
{
    char why[300] = "";
    hc_ib_choice_t ch;
    if (!hc_ib_verbs_loadable(why, sizeof why)) {
        /* Without libibverbs every answer is "no", with the loader's reason. */
        hc_ib_config_t c = fixture_cfg("tests/fixtures/sysfs-ib", "");
        ck_assert_int_eq(hc_ib_usable(&c, 0, -1, &ch, why, sizeof why), 0);
        ck_assert_msg(strstr(why, "libibverbs"), "%s", why);
        return;
    }
    hc_ib_config_t c = fixture_cfg("tests/fixtures/sysfs-ib", "");
    ck_assert_int_eq(hc_ib_usable(&c, 1, -1, &ch, why, sizeof why), 1);
    ck_assert_str_eq(ch.port.dev, "mlx5_1");
    c = fixture_cfg("tests/fixtures/sysfs-ib", "=mlx4_0");
    ck_assert_int_eq(hc_ib_usable(&c, 0, -1, &ch, why, sizeof why), 0);
    ck_assert_msg(strstr(why, "no ACTIVE port matching HCOLL_IB_HCA==mlx4_0"), "%s", why);
    c = fixture_cfg("tests/fixtures/sysfs-none", "");
    ck_assert_int_eq(hc_ib_usable(&c, 0, -1, &ch, why, sizeof why), 0);
    ck_assert_msg(strstr(why, "no RDMA device found"), "%s", why);
}
END_TEST

/* In a child: logging settings are read once per process. */
START_TEST(auto_falls_back_to_tcp_with_info)
{
    if (access("/sys/class/infiniband", F_OK) == 0) {
        printf("SKIP: this host has /sys/class/infiniband; the fallback is for hosts without\n");
        return;
    }
    char path[] = "/tmp/hcoll-test-ib-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("HCOLL_DEBUG", "INFO", 1);
        setenv("HCOLL_DEBUG_SUBSYS", "NET", 1);
        setenv("HCOLL_DEBUG_FILE", path, 1);
        const hc_transport_ops_t *ops = NULL;
        hc_params_t cfg;
        char err[200];
        if (hc_params_load(&cfg, NULL, err, sizeof err) != HCOLL_SUCCESS)
            _exit(4);
        hc_select_params_t sp = { .settings = &cfg, .rank = 0, .local_rank = 0, .gpu = -1 };
        cfg.net = HC_NET_AUTO;
        if (hc_transport_select(&sp, &ops) != HCOLL_SUCCESS || ops != &hc_tcp_ops)
            _exit(1);
        hc_errbuf_t e;
        hc_errbuf_init(&e);
        ops = NULL;
        cfg.net = HC_NET_IB;
        sp.errbuf = &e;
        if (hc_transport_select(&sp, &ops) != HCOLL_ERR_UNSUPPORTED || ops)
            _exit(2);
        const char *m = hc_errbuf_get(&e);
        if (!strstr(m, "HCOLL_NET=ib") ||
            !(strstr(m, "no RDMA device found") || strstr(m, "libibverbs")))
            _exit(3);
        _exit(0);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child failed: %d", WEXITSTATUS(ws));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int seen = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "NET INFO NET: ") && strstr(line, ", using TCP") &&
            (strstr(line, "no RDMA device found") || strstr(line, "libibverbs")))
            seen = 1;
    fclose(f);
    unlink(path);
    ck_assert_msg(seen, "no INFO line saying why TCP was chosen");
}
END_TEST

START_TEST(create_fails_cleanly)
{
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    hc_transport_params_t p = { 0, 2, "127.0.0.1", NULL, 0, 0, 1000, 1, 0, &eb, 0, -1, NULL, NULL,
                                NULL, NULL, NULL };
    hc_transport_t *tr = NULL;
    /* No settings: refused before anything is touched. */
    ck_assert_int_eq(hc_ib_ops.create(&p, &tr), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_null(tr);
    /* Real root on this host: no device. */
    hc_params_t c = fixture_params("/", "");
    p.settings = &c;
    if (access("/sys/class/infiniband", F_OK) != 0) {
        ck_assert_int_eq(hc_ib_ops.create(&p, &tr), HCOLL_ERR_RDMA);
        ck_assert_ptr_null(tr);
        const char *m = hc_errbuf_get(&eb);
        ck_assert_msg(strstr(m, "no RDMA device found") || strstr(m, "libibverbs"), "%s", m);
    }
    /* A fixture that lists devices libibverbs does not have. */
    char why[200];
    if (hc_ib_verbs_loadable(why, sizeof why)) {
        c = fixture_params("tests/fixtures/sysfs-ib", "");
        ck_assert_int_eq(hc_ib_ops.create(&p, &tr), HCOLL_ERR_RDMA);
        ck_assert_ptr_null(tr);
        const char *m = hc_errbuf_get(&eb);
        ck_assert_msg(strstr(m, "sysfs lists mlx5_0 but libibverbs cannot open it"), "%s", m);
    }
    hc_ib_ops.destroy(NULL, 1);
    hc_errbuf_fini(&eb);
}
END_TEST

START_TEST(status_texts)
{
    ck_assert_str_eq(hc_ib_wc_status_text(12, 1),
                     "transport retry counter exceeded: peer unreachable over RoCE — check GID "
                     "index, traffic class/PFC and that both NICs reach each other");
    ck_assert_ptr_nonnull(strstr(hc_ib_wc_status_text(12, 0), "InfiniBand"));
    ck_assert_ptr_nonnull(strstr(hc_ib_wc_status_text(13, 1), "receiver-not-ready"));
    ck_assert_ptr_nonnull(strstr(hc_ib_wc_status_text(10, 1), "remote access"));
    ck_assert_ptr_nonnull(strstr(hc_ib_wc_status_text(5, 1), "flushed"));
    ck_assert_str_eq(hc_ib_wc_status_text(99, 1), "unknown completion status");
}
END_TEST

START_TEST(mtu)
{
    ck_assert_int_eq(hc_ib_mtu_bytes(1), 256);
    ck_assert_int_eq(hc_ib_mtu_bytes(5), 4096);
    ck_assert_int_eq(hc_ib_mtu_bytes(0), 0);
    ck_assert_int_eq(hc_ib_mtu_min(5, 3), 3); /* 4096 vs 1024: 1024 */
    ck_assert_int_eq(hc_ib_mtu_min(3, 5), 3);
}
END_TEST

/* ---- registration cache -------------------------------------------------- */

static int deregs;
static void fake_dereg(void *ctx, hc_mrc_entry_t *e)
{
    (void)ctx;
    deregs++;
    free(e);
}

static hc_mrc_entry_t *fake_reg(hc_mrc_t *c, void *base, size_t len, uint64_t gen)
{
    hc_mrc_entry_t *e = hc_mrc_find(c, base, len, gen);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    e->base = base;
    e->len = len;
    e->gen = gen;
    e->dmabuf_fd = -1;
    hc_mrc_insert(c, e);
    return e;
}

START_TEST(mr_cache)
{
    static char buf[4][4096];
    hc_mrc_t c;
    deregs = 0;
    hc_mrc_init(&c, 2, fake_dereg, NULL);
    /* The same device buffer every iteration: registered once. */
    for (int it = 0; it < 100; it++) {
        hc_mrc_entry_t *e = fake_reg(&c, buf[0], 4096, 5);
        hc_mrc_release(&c, e);
    }
    ck_assert_uint_eq(c.misses, 1);
    ck_assert_uint_eq(c.hits, 99);
    ck_assert_int_eq(c.count, 1);
    /* A sub-range of a registered buffer hits; one past its end misses. */
    hc_mrc_entry_t *a = fake_reg(&c, buf[0] + 100, 1000, 5);
    ck_assert_ptr_eq(a->base, buf[0]);
    ck_assert_int_eq(a->refs, 1);
    hc_mrc_entry_t *b = fake_reg(&c, buf[0] + 100, 4000, 5);
    ck_assert_ptr_ne(a, b);
    /* Another allocation id at the same address (a reallocated GPU buffer)
     * never hits the old entry. */
    hc_mrc_entry_t *g = fake_reg(&c, buf[0], 4096, 42);
    ck_assert_ptr_ne(g, a);
    hc_mrc_release(&c, a);
    hc_mrc_release(&c, b);
    hc_mrc_release(&c, g);
    /* Three idle entries, two kept: the least recently used went. */
    ck_assert_int_eq(deregs, 1);
    ck_assert_int_eq(c.count, 2);
    /* A new allocation (id 7) over buf[0]: the two idle entries there are
     * of freed buffers (ids 5 and 42) and go at once, not by age. */
    hc_mrc_entry_t *u[4];
    u[0] = fake_reg(&c, buf[0], 4096, 7);
    ck_assert_int_eq(deregs, 3);
    ck_assert_uint_eq(c.stale, 2);
    ck_assert_int_eq(c.count, 1);
    /* Entries in use are never evicted, stale or not. */
    hc_mrc_entry_t *keep = fake_reg(&c, buf[1], 4096, 8);
    for (int i = 1; i < 4; i++)
        u[i] = fake_reg(&c, buf[i], 4096, 7);
    ck_assert_ptr_nonnull(keep->base);
    ck_assert_int_eq(c.count, 5);
    hc_mrc_release(&c, keep);
    for (int i = 0; i < 4; i++)
        hc_mrc_release(&c, u[i]);
    ck_assert_int_eq(c.count, 2);

    /* Host memory (no allocation id): shared while in use, deregistered as
     * soon as the last user lets go, so a freed-and-reallocated buffer can
     * never hit stale pinned pages. */
    int before = deregs;
    hc_mrc_entry_t *h1 = fake_reg(&c, buf[3], 4096, 0);
    hc_mrc_entry_t *h2 = fake_reg(&c, buf[3] + 8, 64, 0);
    ck_assert_ptr_eq(h1, h2);
    hc_mrc_release(&c, h2);
    ck_assert_int_eq(deregs, before);
    hc_mrc_release(&c, h1);
    ck_assert_int_eq(deregs, before + 1);
    ck_assert_int_eq(c.count, 2);
    ck_assert_ptr_null(hc_mrc_find(&c, buf[3], 4096, 0));

    hc_mrc_fini(&c);
    ck_assert_int_eq(c.count, 0);
    ck_assert_int_eq(deregs, 9);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ib");
    TCase *tc = tcase_create("no-device");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, config_defaults);
    tcase_add_test(tc, usable_on_fixtures);
    tcase_add_test(tc, auto_falls_back_to_tcp_with_info);
    tcase_add_test(tc, create_fails_cleanly);
    tcase_add_test(tc, status_texts);
    tcase_add_test(tc, mtu);
    tcase_add_test(tc, mr_cache);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
