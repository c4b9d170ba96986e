/* Interface choice (HCOLL_SOCKET_IFNAME list syntax, automatic order), host
 * ids and the unique id's encoding: all without real network set-up. */
#include <arpa/inet.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot/uid.h"
#include "sys/host.h"
#include "sys/envlist.h"
#include "sys/ifaces.h"

static hc_iface_t mk(const char *name, const char *addr, unsigned flags)
{
    hc_iface_t f;
    memset(&f, 0, sizeof f);
    snprintf(f.name, sizeof f.name, "%s", name);
    f.flags = flags;
    if (strchr(addr, ':')) {
        f.addr.sin6.sin6_family = AF_INET6;
        inet_pton(AF_INET6, addr, &f.addr.sin6.sin6_addr);
    } else {
        f.addr.sin.sin_family = AF_INET;
        inet_pton(AF_INET, addr, &f.addr.sin.sin_addr);
    }
    return f;
}

#define UP IFF_UP
#define LOOP (IFF_UP | IFF_LOOPBACK)

/* A host with a bit of everything, in getifaddrs-like order. */
static int fixture(hc_iface_t *in)
{
    int n = 0;
    in[n++] = mk("lo", "127.0.0.1", LOOP);
    in[n++] = mk("eth0", "fe80::1", UP);     /* link-local: skipped */
    in[n++] = mk("eth0", "2001:db8::1", UP); /* IPv4 of eth0 wins */
    in[n++] = mk("eth0", "10.0.0.1", UP);
    in[n++] = mk("docker0", "172.17.0.1", UP);
    in[n++] = mk("rail10", "10.10.0.1", UP);
    in[n++] = mk("eth1", "10.0.1.1", UP);
    in[n++] = mk("ib0", "192.168.0.1", UP);
    in[n++] = mk("rail2", "10.2.0.1", UP);
    in[n++] = mk("eth2", "10.0.2.1", 0); /* down */
    in[n++] = mk("virbr0", "192.168.122.1", UP);
    in[n++] = mk("br-1234", "172.18.0.1", UP);
    in[n++] = mk("veth7", "10.7.0.1", UP);
    in[n++] = mk("ens6", "2001:db8::6", UP); /* IPv6 only */
    in[n++] = mk("lo", "::1", LOOP);
    return n;
}

/* Select with spec and compare the names, comma-joined. */
static void expect(const hc_iface_t *in, int n, const char *spec, const char *want)
{
    hc_iface_t out[HC_IFACE_MAX];
    char err[200] = "", got[512] = "";
    int k = 0;
    hcoll_status_t st = hc_ifaces_select(in, n, spec, out, HC_IFACE_MAX, &k, err, sizeof err);
    /* Nothing left is an error that says why; anything else is a list. */
    if (want[0] == '\0') {
        ck_assert_msg(st == HCOLL_ERR_NETWORK, "spec '%s': status %d", spec ? spec : "(null)",
                      st);
        ck_assert_msg(strlen(err) > 0, "no interface but no reason");
        return;
    }
    ck_assert_msg(st == HCOLL_SUCCESS, "spec '%s': %s", spec ? spec : "(null)", err);
    for (int i = 0; i < k; i++) {
        if (i)
            strcat(got, ",");
        strcat(got, out[i].name);
    }
    ck_assert_msg(strcmp(got, want) == 0, "spec '%s': got '%s', want '%s'", spec ? spec : "(null)",
                  got, want);
}

START_TEST(select_auto)
{
    hc_iface_t in[32];
    int n = fixture(in);
    expect(in, n, NULL, "ens6,eth0,eth1,ib0,rail2,rail10,veth7");
    expect(in, n, "", "ens6,eth0,eth1,ib0,rail2,rail10,veth7");

    hc_iface_t out[HC_IFACE_MAX];
    char err[200];
    int k = 0;
    ck_assert_int_eq(hc_ifaces_select(in, n, NULL, out, HC_IFACE_MAX, &k, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_int_eq(k, 7);
    /* eth0: IPv4 preferred over its global IPv6; ens6 keeps its IPv6. */
    ck_assert_int_eq(out[1].addr.sa.sa_family, AF_INET);
    ck_assert_int_eq(out[0].addr.sa.sa_family, AF_INET6);
    char s[80];
    ck_assert_str_eq(hc_sockaddr_str(&out[1].addr, s, sizeof s), "10.0.0.1");
    ck_assert_str_eq(hc_sockaddr_str(&out[0].addr, s, sizeof s), "2001:db8::6");

    /* Bridges only when nothing else, loopback only when nothing at all. */
    hc_iface_t few[4];
    few[0] = mk("lo", "127.0.0.1", LOOP);
    few[1] = mk("docker0", "172.17.0.1", UP);
    few[2] = mk("virbr0", "192.168.122.1", UP);
    expect(few, 3, NULL, "docker0,virbr0");
    expect(few, 1, NULL, "lo");
    expect(few, 0, NULL, "");
    /* A link-local-only interface counts as having no address. */
    few[0] = mk("eth0", "fe80::2", UP);
    few[1] = mk("lo", "127.0.0.1", LOOP);
    expect(few, 2, NULL, "lo");
}
END_TEST

START_TEST(select_lists)
{
    hc_iface_t in[32];
    int n = fixture(in);
    expect(in, n, "eth", "eth0,eth1");          /* prefix; eth2 is down */
    expect(in, n, "=eth1,eth0", "eth1,eth0");   /* list order is rail order */
    expect(in, n, "ib,eth0", "ib0,eth0");
    expect(in, n, "=eth", "");                  /* exact: no interface is named "eth" */
    expect(in, n, "^eth,ib", "ens6,rail2,rail10,veth7");
    expect(in, n, "^=eth0", "ens6,eth1,ib0,rail2,rail10,veth7");
    expect(in, n, "lo", "lo");                  /* named: loopback allowed */
    expect(in, n, "=lo", "lo");
    expect(in, n, "docker", "docker0");         /* named: bridges allowed */
    expect(in, n, "rail", "rail2,rail10");
    expect(in, n, "veth,rail", "veth7,rail2,rail10");
    expect(in, n, "^lo", "ens6,eth0,eth1,ib0,rail2,rail10,veth7");
    expect(in, n, "nomatch", "");

    /* Malformed lists are errors, not silently "everything". */
    const char *bad[] = { "eth,", ",eth", "^", "=", "^=", "eth,,ib", "eth0:x",
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hc_iface_t out[HC_IFACE_MAX];
        char err[200] = "";
        int k = -1;
        ck_assert_msg(hc_ifaces_select(in, n, bad[i], out, HC_IFACE_MAX, &k, err, sizeof err) ==
                          HCOLL_ERR_INVALID_ARG,
                      "'%s' accepted", bad[i]);
        ck_assert_int_eq(k, -1); /* outputs only on success */
        ck_assert_msg(strlen(err) > 0, "'%s': no message", bad[i]);
    }

    /* max_out truncates, keeping the order. */
    hc_iface_t out[2];
    char err[200];
    int k = 0;
    ck_assert_int_eq(hc_ifaces_select(in, n, NULL, out, 2, &k, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(k, 2);
    ck_assert_str_eq(out[0].name, "ens6");
    ck_assert_str_eq(out[1].name, "eth0");
}
END_TEST

START_TEST(natural_order)
{
    ck_assert_int_lt(hc_name_natcmp("rail2", "rail10"), 0);
    ck_assert_int_gt(hc_name_natcmp("rail10", "rail9"), 0);
    ck_assert_int_eq(hc_name_natcmp("eth0", "eth0"), 0);
    ck_assert_int_lt(hc_name_natcmp("eth", "eth0"), 0);
    ck_assert_int_lt(hc_name_natcmp("eth1", "ib0"), 0);
    ck_assert_int_lt(hc_name_natcmp("eth01", "eth2"), 0);
    ck_assert_int_lt(hc_name_natcmp("a1b2", "a1b10"), 0);
}
END_TEST

START_TEST(real_loopback)
{
    hc_iface_t out[HC_IFACE_MAX];
    char err[200], s[80];
    int k = 0;
    hcoll_status_t st = hc_ifaces_list("=lo", out, HC_IFACE_MAX, &k, err, sizeof err);
    ck_assert_msg(st == HCOLL_SUCCESS && k == 1, "lo: status %d, %d (%s)", st, k, err);
    ck_assert_str_eq(out[0].name, "lo");
    ck_assert_str_eq(hc_sockaddr_str(&out[0].addr, s, sizeof s), "127.0.0.1");
    ck_assert_int_eq(hc_ifaces_list("^", out, HC_IFACE_MAX, &k, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_ifaces_list("=no-such-if0", out, HC_IFACE_MAX, &k, err, sizeof err),
                     HCOLL_ERR_NETWORK);
    ck_assert_ptr_nonnull(strstr(err, "no-such-if0"));
}
END_TEST

START_TEST(host_ids)
{
    uint64_t a, b, c, d;
    char la[64], lb[64], lc[64], ld[64];
    hc_host_id(NULL, &a, la, sizeof la);
    hc_host_id("", &b, lb, sizeof lb);
    ck_assert(a == b); /* stable, and "" means automatic */
    ck_assert_str_eq(la, lb);
    hc_host_id("node1", &c, lc, sizeof lc);
    hc_host_id("node2", &d, ld, sizeof ld);
    ck_assert(c != d && c != a);
    ck_assert_str_eq(lc, "node1");
    uint64_t c2;
    hc_host_id("node1", &c2, lc, sizeof lc);
    ck_assert(c == c2);
}
END_TEST

START_TEST(unique_id_encoding)
{
    hc_uid_t u, v;
    hcoll_unique_id_t id;
    char s1[80], s2[80];
    memset(&u, 0, sizeof u);
    u.root.sin.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &u.root.sin.sin_addr);
    hc_sockaddr_set_port(&u.root, 40000);
    for (int i = 0; i < HC_UID_SECRET_BYTES; i++)
        u.secret[i] = (unsigned char)(i * 13 + 1);
    hc_uid_encode(&u, &id);
    ck_assert_int_eq(hc_uid_decode(&id, NULL, -1, &v), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&v.root, s1, sizeof s1), "127.0.0.1:40000");
    ck_assert(memcmp(u.secret, v.secret, sizeof u.secret) == 0);

    memset(&u.root, 0, sizeof u.root);
    u.root.sin6.sin6_family = AF_INET6;
    inet_pton(AF_INET6, "2001:db8::42", &u.root.sin6.sin6_addr);
    u.root.sin6.sin6_scope_id = 7;
    hc_sockaddr_set_port(&u.root, 1234);
    hc_uid_encode(&u, &id);
    ck_assert_int_eq(hc_uid_decode(&id, NULL, -1, &v), HCOLL_SUCCESS);
    ck_assert_str_eq(hc_sockaddr_str(&v.root, s2, sizeof s2), "[2001:db8::42]:1234");
    ck_assert_int_eq(v.root.sin6.sin6_scope_id, 7);

    /* Any changed byte in the covered part is caught. */
    for (int i = 0; i < 64; i++) {
        hcoll_unique_id_t bad = id;
        bad.internal[i] ^= 0x01;
        ck_assert_msg(hc_uid_decode(&bad, NULL, -1, &v) == HCOLL_ERR_INVALID_ARG, "byte %d", i);
    }
    hcoll_unique_id_t zero;
    memset(&zero, 0, sizeof zero);
    ck_assert_int_eq(hc_uid_decode(&zero, NULL, -1, &v), HCOLL_ERR_INVALID_ARG);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ifaces");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, select_auto);
    tcase_add_test(tc, select_lists);
    tcase_add_test(tc, natural_order);
    tcase_add_test(tc, real_loopback);
    tcase_add_test(tc, host_ids);
    tcase_add_test(tc, unique_id_encoding);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
