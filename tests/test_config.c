/* Config table, knob parsing, list syntax, status strings, logging. */
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
#include "base/log.h"
#include "hcoll.h"
#include "sys/envlist.h"

static void clear_env(void)
{
    size_t n;
    const hc_knob_t *k = hc_knobs(&n);
    for (size_t i = 0; i < n; i++)
        unsetenv(k[i].name);
}

/* ---- status ---------------------------------------------------------- */

START_TEST(status_every_code_has_text)
{
    static const struct { hcoll_status_t st; const char *name; } want[] = {
        { HCOLL_SUCCESS, "HCOLL_SUCCESS" },
        { HCOLL_IN_PROGRESS, "HCOLL_IN_PROGRESS" },
        { HCOLL_ERR_INVALID_ARG, "HCOLL_ERR_INVALID_ARG" },
        { HCOLL_ERR_NO_MEMORY, "HCOLL_ERR_NO_MEMORY" },
        { HCOLL_ERR_SYSTEM, "HCOLL_ERR_SYSTEM" },
        { HCOLL_ERR_NETWORK, "HCOLL_ERR_NETWORK" },
        { HCOLL_ERR_TIMEOUT, "HCOLL_ERR_TIMEOUT" },
        { HCOLL_ERR_PEER_FAILED, "HCOLL_ERR_PEER_FAILED" },
        { HCOLL_ERR_ABORTED, "HCOLL_ERR_ABORTED" },
        { HCOLL_ERR_UNSUPPORTED, "HCOLL_ERR_UNSUPPORTED" },
        { HCOLL_ERR_CUDA, "HCOLL_ERR_CUDA" },
        { HCOLL_ERR_NCCL, "HCOLL_ERR_NCCL" },
        { HCOLL_ERR_RDMA, "HCOLL_ERR_RDMA" },
        { HCOLL_ERR_INTERNAL, "HCOLL_ERR_INTERNAL" },
        { HCOLL_ERR_MISMATCH, "HCOLL_ERR_MISMATCH" },
    };
    ck_assert_int_eq(HC_ARRAY_LEN(want), HCOLL_STATUS_COUNT_);
    for (size_t i = 0; i < HC_ARRAY_LEN(want); i++) {
        ck_assert_str_eq(hcoll_status_name(want[i].st), want[i].name);
        const char *text = hcoll_strerror(want[i].st);
        ck_assert_ptr_nonnull(text);
        ck_assert_str_ne(text, "unknown status");
        ck_assert_int_gt(strlen(text), 3);
        /* Texts are distinct, so a message always tells codes apart. */
        for (size_t j = 0; j < i; j++)
            ck_assert_str_ne(text, hcoll_strerror(want[j].st));
    }
    ck_assert_str_eq(hcoll_strerror((hcoll_status_t)-1), "unknown status");
    ck_assert_str_eq(hcoll_strerror(HCOLL_STATUS_COUNT_), "unknown status");
    ck_assert_str_eq(hcoll_status_name((hcoll_status_t)9999), "unknown status");
}
END_TEST

START_TEST(version_matches_header)
{
    ck_assert_int_eq(hcoll_version(), HCOLL_VERSION_CODE);
    ck_assert_int_eq(HCOLL_VERSION_CODE,
                     HCOLL_VERSION_MAJOR * 10000 + HCOLL_VERSION_MINOR * 100 + HCOLL_VERSION_PATCH);
}
END_TEST

START_TEST(dtype_and_op_names)
{
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_FLOAT32), 4);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_FLOAT16), 2);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_BFLOAT16), 2);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_FLOAT64), 8);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_INT8), 1);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_UINT8), 1);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_INT32), 4);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_INT64), 8);
    ck_assert_uint_eq(hcoll_dtype_size(HCOLL_DTYPE_COUNT_), 0);
    ck_assert_uint_eq(hcoll_dtype_size((hcoll_dtype_t)-3), 0);
    ck_assert_str_eq(hcoll_dtype_name(HCOLL_BFLOAT16), "bfloat16");
    ck_assert_str_eq(hcoll_dtype_name((hcoll_dtype_t)42), "unknown");
    ck_assert_str_eq(hcoll_op_name(HCOLL_AVG), "avg");
    ck_assert_str_eq(hcoll_op_name((hcoll_op_t)42), "unknown");
}
END_TEST

/* ---- config ----------------------------------------------------------- */

START_TEST(defaults_load)
{
    clear_env();
    hc_params_t p;
    char err[256] = "";
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.timeout_ms, 30000);
    ck_assert_uint_eq(p.chunk_bytes, 256u << 10);
    ck_assert_int_eq(p.net, HC_NET_AUTO);
    ck_assert_int_eq(p.nsocks_perpeer, 1);
    ck_assert_int_eq(p.ib_gid_index, -1);
    ck_assert_int_eq(p.ib_timeout, 20);
    ck_assert_int_eq(p.ib_retry_cnt, 7);
    ck_assert_int_eq(p.gdr_level, HC_GDR_PXB);
    ck_assert_str_eq(p.socket_ifname, "");
    ck_assert_str_eq(p.hostid, "");
}
END_TEST

START_TEST(env_values_parse)
{
    clear_env();
    setenv("HCOLL_TIMEOUT_MS", "1500", 1);
    setenv("HCOLL_CHUNK_BYTES", "256KiB", 1);
    setenv("HCOLL_NET", "TCP", 1);
    setenv("HCOLL_SOCKET_IFNAME", "^=lo,docker", 1);
    setenv("HCOLL_NET_GDR_LEVEL", "3", 1);
    setenv("HCOLL_HOSTID", "nodeA", 1);
    setenv("HCOLL_SOCKET_BUF", "4M", 1);
    hc_params_t p;
    char err[256] = "";
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.timeout_ms, 1500);
    ck_assert_uint_eq(p.chunk_bytes, 256u << 10);
    ck_assert_int_eq(p.net, HC_NET_TCP);
    ck_assert_str_eq(p.socket_ifname, "^=lo,docker");
    ck_assert_int_eq(p.gdr_level, HC_GDR_PHB);
    ck_assert_str_eq(p.hostid, "nodeA");
    ck_assert_uint_eq(p.socket_buf, 4u << 20);
    setenv("HCOLL_NET_GDR_LEVEL", "sys", 1);
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.gdr_level, HC_GDR_SYS);
    clear_env();
}
END_TEST

/* Each malformed value is refused with a message naming the variable and
 * the value. */
static const struct { const char *name, *value, *needle; } bad_values[] = {
    { "HCOLL_TIMEOUT_MS", "abc", "not an integer" },
    { "HCOLL_TIMEOUT_MS", "12x", "not an integer" },
    { "HCOLL_TIMEOUT_MS", "0", "out of range" },
    { "HCOLL_TIMEOUT_MS", "99999999999999999999", "not an integer" },
    { "HCOLL_CHUNK_BYTES", "1Q", "not a size" },
    { "HCOLL_CHUNK_BYTES", "-5", "not a size" },
    { "HCOLL_CHUNK_BYTES", "12", "out of range" },
    { "HCOLL_CHUNK_BYTES", "2G", "out of range" },
    { "HCOLL_CHUNK_BYTES", "1MX", "not a size" },
    { "HCOLL_NET", "rdma", "expected one of auto, ib, tcp" },
    { "HCOLL_NET_GDR_LEVEL", "7", "expected one of" },
    { "HCOLL_IB_GID_INDEX", "-2", "out of range" },
    { "HCOLL_IB_SL", "16", "out of range" },
    { "HCOLL_NSOCKS_PERPEER", "0", "out of range" },
    { "HCOLL_SOCKET_IFNAME", "eth0,,eth1", "empty entry" },
    { "HCOLL_SOCKET_IFNAME", "^", "no names" },
    { "HCOLL_IB_HCA", "mlx5_0:x", "port" },
    { "HCOLL_DEBUG", "LOUD", "expected one of" },
    { "HCOLL_DEBUG_SUBSYS", "INIT,BOGUS", "unknown subsystem" },
    { "HCOLL_RANK", "-1", "out of range" },
    { "HCOLL_CPU_KERNELS", "sse9", "expected one of auto, generic, avx2" },
};

START_TEST(malformed_values_rejected)
{
    clear_env();
    const char *name = bad_values[_i].name, *value = bad_values[_i].value;
    setenv(name, value, 1);
    hc_params_t p;
    char err[256] = "";
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, name), "message '%s' does not name %s", err, name);
    ck_assert_msg(strstr(err, bad_values[_i].needle), "message '%s' lacks '%s'", err,
                  bad_values[_i].needle);
    unsetenv(name);
}
END_TEST

START_TEST(config_struct_rules)
{
    clear_env();
    setenv("HCOLL_TIMEOUT_MS", "1500", 1);
    setenv("HCOLL_NET", "ib", 1);
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    hc_params_t p;
    char err[256] = "";

    /* Untouched initializer: environment wins. */
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.timeout_ms, 1500);
    ck_assert_int_eq(p.net, HC_NET_IB);

    /* Explicit fields win over the environment. */
    cfg.timeout_ms = 777;
    cfg.net = "tcp";
    cfg.chunk_bytes = 65536;
    cfg.socket_ifname = "=eth1";
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.timeout_ms, 777);
    ck_assert_int_eq(p.net, HC_NET_TCP);
    ck_assert_uint_eq(p.chunk_bytes, 65536);
    ck_assert_str_eq(p.socket_ifname, "=eth1");

    /* A bad explicit field is an error that says it came from the config. */
    cfg.timeout_ms = -5;
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "config field timeout_ms"));
    ck_assert_msg(strstr(err, "HCOLL_TIMEOUT_MS='-5': out of range (expected 1..86400000)"), "%s",
                  err);
    cfg.timeout_ms = 777;
    cfg.net = "carrier-pigeon";
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "config field net"));
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_NET"));
    cfg.net = "tcp";
    cfg.socket_ifname = "eth0,";
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "config field socket_ifname"));
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_SOCKET_IFNAME"));
    cfg.socket_ifname = NULL;

    /* A config that did not come from the initializer. */
    hcoll_config_t raw;
    memset(&raw, 0, sizeof raw);
    ck_assert_int_eq(hc_params_load(&p, &raw, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_CONFIG_INITIALIZER"));
    hcoll_config_t newer = HCOLL_CONFIG_INITIALIZER;
    newer.version = HCOLL_CONFIG_VERSION + 1;
    ck_assert_int_eq(hc_params_load(&p, &newer, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "newer"));

    /* An older, smaller struct (only the header and timeout_ms): the
     * fields it lacks are defaulted, never read. */
    struct {
        hcoll_config_t c;
        char canary[64];
    } old;
    memset(&old, 0xff, sizeof old);
    old.c.size = offsetof(hcoll_config_t, timeout_ms) + sizeof(int);
    old.c.magic = HCOLL_CONFIG_MAGIC;
    old.c.version = 1;
    old.c.timeout_ms = 4321;
    ck_assert_int_eq(hc_params_load(&p, &old.c, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.timeout_ms, 4321);
    ck_assert_int_eq(p.net, HC_NET_IB); /* from the environment */
    clear_env();
}
END_TEST

/* The typed fields of hcoll_config_t are checked as numbers against the
 * bounds of their variable: each bound is accepted, one past it refused
 * with a message naming the field, the variable and the rule. */
static const struct {
    int is_timeout;
    long long value;
    int ok;
} field_bounds[] = {
    { 1, 1, 1 },
    { 1, 86400000, 1 },
    { 1, 0, 0 },
    { 1, 86400001, 0 },
    { 1, -1, 0 },
    { 1, 2147483647, 0 },
    { 0, 4096, 1 },
    { 0, 1ll << 30, 1 },
    { 0, 4095, 0 },
    { 0, (1ll << 30) + 1, 0 },
    { 0, 1, 0 },
};

START_TEST(config_field_bounds)
{
    clear_env();
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    hc_params_t p;
    char err[256] = "";
    const int timeout = field_bounds[_i].is_timeout;
    const long long v = field_bounds[_i].value;
    if (timeout)
        cfg.timeout_ms = (int)v;
    else
        cfg.chunk_bytes = (size_t)v;
    hcoll_status_t st = hc_params_load(&p, &cfg, err, sizeof err);
    if (field_bounds[_i].ok) {
        ck_assert_msg(st == HCOLL_SUCCESS, "%lld: %s", v, err);
        if (timeout)
            ck_assert_int_eq(p.timeout_ms, v);
        else
            ck_assert_uint_eq(p.chunk_bytes, (uint64_t)v);
        return;
    }
    ck_assert_int_eq(st, HCOLL_ERR_INVALID_ARG);
    char want[160];
    if (timeout)
        snprintf(want, sizeof want,
                 "config field timeout_ms (same rules as the variable): HCOLL_TIMEOUT_MS='%lld': "
                 "out of range (expected 1..86400000)",
                 v);
    else
        snprintf(want, sizeof want,
                 "config field chunk_bytes (same rules as the variable): HCOLL_CHUNK_BYTES='%lld': "
                 "out of range (expected 4096..1073741824 bytes)",
                 v);
    ck_assert_msg(strcmp(err, want) == 0, "got '%s', want '%s'", err, want);
}
END_TEST

/* An explicit field does not hide a malformed variable of the same knob:
 * every variable in the environment is checked. */
START_TEST(config_field_over_bad_env)
{
    clear_env();
    setenv("HCOLL_TIMEOUT_MS", "soon", 1);
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 1000;
    hc_params_t p;
    char err[256] = "";
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_TIMEOUT_MS='soon'"));
    clear_env();
}
END_TEST

/* Config version 3's op_timeout_ms: a per-communicator HCOLL_OP_TIMEOUT_MS
 * (torch's "hcoll" backend passes its group timeout there). It wins over
 * the environment, keeps the variable's bounds (0 = no limit) and is not
 * read from a version-2 struct. */
START_TEST(config_op_timeout_field)
{
    clear_env();
    setenv("HCOLL_OP_TIMEOUT_MS", "5000", 1);
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    hc_params_t p;
    char err[256] = "";
    ck_assert_int_eq(cfg.op_timeout_ms, HCOLL_CONFIG_UNDEF_INT);
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.op_timeout_ms, 5000);
    cfg.op_timeout_ms = 1234;
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.op_timeout_ms, 1234);
    cfg.op_timeout_ms = 0;
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.op_timeout_ms, 0);
    cfg.op_timeout_ms = -1;
    ck_assert_int_eq(hc_params_load(&p, &cfg, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "config field op_timeout_ms (same rules as the variable): "
                              "HCOLL_OP_TIMEOUT_MS='-1': out of range (expected 0..86400000)"),
                  "%s", err);
    /* A version-2 struct ends before the field: the environment rules. */
    struct {
        hcoll_config_t c;
    } v2;
    memset(&v2, 0, sizeof v2);
    v2.c = (hcoll_config_t)HCOLL_CONFIG_INITIALIZER;
    v2.c.size = offsetof(hcoll_config_t, op_timeout_ms);
    v2.c.version = 2;
    v2.c.op_timeout_ms = 99; /* past size: never read */
    ck_assert_int_eq(hc_params_load(&p, &v2.c, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.op_timeout_ms, 5000);
    clear_env();
}
END_TEST

START_TEST(size_parser)
{
    uint64_t v;
    ck_assert_int_eq(hc_parse_size("0", &v), HCOLL_SUCCESS);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(hc_parse_size("4096", &v), HCOLL_SUCCESS);
    ck_assert_uint_eq(v, 4096);
    ck_assert_int_eq(hc_parse_size("64k", &v), HCOLL_SUCCESS);
    ck_assert_uint_eq(v, 65536);
    ck_assert_int_eq(hc_parse_size("2MB", &v), HCOLL_SUCCESS);
    ck_assert_uint_eq(v, 2u << 20);
    ck_assert_int_eq(hc_parse_size("1GiB", &v), HCOLL_SUCCESS);
    ck_assert_uint_eq(v, 1u << 30);
    ck_assert_int_eq(hc_parse_size("", &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_parse_size("M", &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_parse_size("1.5M", &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_parse_size("99999999999999999999T", &v), HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_parse_size("20000000000T", &v), HCOLL_ERR_INVALID_ARG);
}
END_TEST

START_TEST(table_is_documented)
{
    size_t n;
    const hc_knob_t *k = hc_knobs(&n);
    ck_assert_uint_gt(n, 15);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(strncmp(k[i].name, "HCOLL_", 6) == 0, "%s", k[i].name);
        ck_assert_msg(k[i].help && strlen(k[i].help) > 10, "%s has no help", k[i].name);
        ck_assert_ptr_eq(hc_knob_find(k[i].name), &k[i]);
        /* Every default parses. */
        char err[256];
        if (k[i].defval[0])
            ck_assert_msg(hc_knob_parse(&k[i], k[i].defval, NULL, err, sizeof err) ==
                              HCOLL_SUCCESS,
                          "default of %s: %s", k[i].name, err);
    }
    /* Every knob of DESIGN.md is in the table. */
    static const char *const design[] = {
        "HCOLL_DEBUG", "HCOLL_DEBUG_SUBSYS", "HCOLL_DEBUG_FILE", "HCOLL_NET",
        "HCOLL_SOCKET_IFNAME", "HCOLL_IB_HCA", "HCOLL_IB_GID_INDEX", "HCOLL_IB_TC",
        "HCOLL_IB_SL", "HCOLL_IB_TIMEOUT", "HCOLL_IB_RETRY_CNT", "HCOLL_NET_GDR_LEVEL",
        "HCOLL_TIMEOUT_MS", "HCOLL_CHUNK_BYTES", "HCOLL_HOSTID",
    };
    for (size_t i = 0; i < HC_ARRAY_LEN(design); i++)
        ck_assert_msg(hc_knob_find(design[i]) != NULL, "%s missing", design[i]);
    ck_assert_ptr_null(hc_knob_find("HCOLL_NOPE"));
}
END_TEST

/* ---- list syntax ------------------------------------------------------ */

START_TEST(list_syntax)
{
    hc_list_t l;
    char err[200];

    ck_assert_int_eq(hc_list_parse(NULL, &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert(hc_list_match(&l, "anything", -1));
    ck_assert_int_eq(hc_list_parse("", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert(hc_list_match(&l, "eth0", 1));

    ck_assert_int_eq(hc_list_parse("eth,ib", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(l.count, 2);
    ck_assert(hc_list_match(&l, "eth0", -1));
    ck_assert(hc_list_match(&l, "ib1", -1));
    ck_assert(!hc_list_match(&l, "lo", -1));
    ck_assert(hc_list_names(&l, "eth3"));

    ck_assert_int_eq(hc_list_parse("=eth0,eth1", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert(l.exact && !l.exclude);
    ck_assert(hc_list_match(&l, "eth0", -1));
    ck_assert(!hc_list_match(&l, "eth01", -1));
    ck_assert(!hc_list_match(&l, "eth2", -1));

    ck_assert_int_eq(hc_list_parse("^docker,lo", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert(l.exclude && !l.exact);
    ck_assert(!hc_list_match(&l, "docker0", -1));
    ck_assert(!hc_list_match(&l, "lo", -1));
    ck_assert(hc_list_match(&l, "eth0", -1));
    ck_assert(!hc_list_names(&l, "eth0"));

    ck_assert_int_eq(hc_list_parse("^=mlx5_1", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert(l.exclude && l.exact);
    ck_assert(!hc_list_match(&l, "mlx5_1", 1));
    ck_assert(hc_list_match(&l, "mlx5_10", 1));
    ck_assert(hc_list_match(&l, "mlx5_0", 1));

    ck_assert_int_eq(hc_list_parse("mlx5_0:1,mlx5_bond", &l, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(l.entries[0].port, 1);
    ck_assert_int_eq(l.entries[1].port, -1);
    ck_assert(hc_list_match(&l, "mlx5_0", 1));
    ck_assert(!hc_list_match(&l, "mlx5_0", 2));
    ck_assert(hc_list_match(&l, "mlx5_bond_3", 2));
    ck_assert(!hc_list_match(&l, "mlx5_1", 1));

    static const char *const bad[] = { "a,,b", ",a", "a,", "^", "=", "^=", ":1", "a:", "a:x",
                                       "a:300", "a:-1", "a:1:2" };
    for (size_t i = 0; i < HC_ARRAY_LEN(bad); i++)
        ck_assert_msg(hc_list_parse(bad[i], &l, err, sizeof err) == HCOLL_ERR_INVALID_ARG,
                      "'%s' accepted", bad[i]);

    char longname[100];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ck_assert_int_eq(hc_list_parse(longname, &l, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    char many[200] = "";
    for (int i = 0; i < HC_LIST_MAX_ENTRIES + 1; i++)
        strcat(many, i ? ",e" : "e");
    ck_assert_int_eq(hc_list_parse(many, &l, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "more than"));
}
END_TEST

/* ---- logging ---------------------------------------------------------- */

/* Logging's variables go through the table's parser like every other. */
static hcoll_status_t log_value(const char *name, const char *text, hc_knob_value_t *v,
                                char *err, size_t errlen)
{
    return hc_knob_value(hc_knob_find(name), text, v, err, errlen);
}

START_TEST(log_levels_and_subsys)
{
    hc_knob_value_t v;
    char err[200];
    ck_assert_int_eq(log_value("HCOLL_DEBUG", "info", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(v.choice, HC_LOG_INFO);
    ck_assert_int_eq(log_value("HCOLL_DEBUG", "TRACE", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(v.choice, HC_LOG_TRACE);
    ck_assert_int_eq(log_value("HCOLL_DEBUG", "NONE", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(v.choice, HC_LOG_NONE);
    ck_assert_int_eq(log_value("HCOLL_DEBUG", "version", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(v.choice, HC_LOG_WARN);
    ck_assert_int_eq(log_value("HCOLL_DEBUG", "loud", &v, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "HCOLL_DEBUG='loud'"), "%s", err);

    ck_assert_int_eq(log_value("HCOLL_DEBUG_SUBSYS", "INIT,net", &v, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_uint_eq(v.mask, HC_INIT | HC_NET);
    ck_assert_int_eq(log_value("HCOLL_DEBUG_SUBSYS", "^NET", &v, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_uint_eq(v.mask, HC_ALL & ~HC_NET);
    ck_assert_int_eq(log_value("HCOLL_DEBUG_SUBSYS", "ALL", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_uint_eq(v.mask, HC_ALL);
    ck_assert_int_eq(log_value("HCOLL_DEBUG_SUBSYS", "NET,FOO", &v, err, sizeof err),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "FOO"));
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_DEBUG_SUBSYS"));

    ck_assert_int_eq(log_value("HCOLL_DEBUG_FILE", "/tmp/x.%p", &v, err, sizeof err),
                     HCOLL_SUCCESS);
    ck_assert_str_eq(v.str, "/tmp/x.%p");

    /* hc_knob_env reads the variable in force, else the default. */
    unsetenv("HCOLL_DEBUG_SUBSYS");
    ck_assert_int_eq(hc_knob_env("HCOLL_DEBUG_SUBSYS", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_uint_eq(v.mask, HC_ALL);
    setenv("HCOLL_DEBUG_SUBSYS", "GDR", 1);
    ck_assert_int_eq(hc_knob_env("HCOLL_DEBUG_SUBSYS", &v, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_uint_eq(v.mask, HC_GDR);
    unsetenv("HCOLL_DEBUG_SUBSYS");
    ck_assert_int_eq(hc_knob_env("HCOLL_NOPE", &v, err, sizeof err), HCOLL_ERR_INTERNAL);
}
END_TEST

/* Logging reads its environment once per process, so each case runs in a
 * fresh child that logs into a file we then read. */
static char *log_in_child(const char *level, const char *subsys, const char *file_pat,
                          char *path_out, size_t path_len)
{
    char dir[] = "/tmp/hcoll-log-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char pat[256];
    snprintf(pat, sizeof pat, "%s/%s", dir, file_pat);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("HCOLL_DEBUG", level, 1);
        if (subsys)
            setenv("HCOLL_DEBUG_SUBSYS", subsys, 1);
        setenv("HCOLL_DEBUG_FILE", pat, 1);
        HC_INFO(HC_NET, 3, "net info %d", 42);
        HC_INFO(HC_INIT, 3, "init info");
        HC_TRACE(HC_NET, 3, "net trace");
        HC_WARN(HC_BOOT, -1, "boot warning");
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    char host[64];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot)
        *dot = '\0';
    /* Expand %h and %p the way the library does. */
    char name[256] = "";
    for (const char *p = file_pat; *p; p++) {
        if (p[0] == '%' && p[1] == 'h') {
            strcat(name, host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            snprintf(name + strlen(name), sizeof name - strlen(name), "%d", (int)pid);
            p++;
        } else {
            size_t l = strlen(name);
            name[l] = *p;
            name[l + 1] = '\0';
        }
    }
    snprintf(path_out, path_len, "%s/%s", dir, name);
    static char buf[8192];
    memset(buf, 0, sizeof buf);
    int fd = open(path_out, O_RDONLY);
    if (fd < 0) {
        rmdir(dir);
        return NULL; /* HCOLL_DEBUG=NONE opens no file */
    }
    ck_assert_int_ge(read(fd, buf, sizeof buf - 1), 0);
    close(fd);
    unlink(path_out);
    rmdir(dir);
    return buf;
}

START_TEST(log_file_and_filtering)
{
    char path[512];
    char *out = log_in_child("INFO", "NET", "log.%h.%p", path, sizeof path);
    ck_assert_ptr_nonnull(out);
    char host[64];
    gethostname(host, sizeof host);
    ck_assert_msg(strstr(out, "[3] NET INFO net info 42"), "got: %s", out);
    ck_assert_msg(!strstr(out, "init info"), "INIT not filtered: %s", out);
    ck_assert_msg(!strstr(out, "net trace"), "TRACE shown at INFO: %s", out);
    /* Warnings pass every subsystem filter. */
    ck_assert_msg(strstr(out, "[-] BOOT WARN boot warning"), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(path, "log."));

    out = log_in_child("TRACE", "^NET", "plain.log", path, sizeof path);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(strstr(out, "INIT INFO init info"), "got: %s", out);
    ck_assert_msg(!strstr(out, "net"), "NET not excluded: %s", out);

    /* NONE: not even the file is created. */
    out = log_in_child("NONE", NULL, "none.log", path, sizeof path);
    ck_assert_ptr_null(out);
}
END_TEST

/* Logging has no caller to fail, so a malformed setting leaves that
 * setting at the table's default and the others as given. */
START_TEST(log_malformed_keeps_default)
{
    char path[512];
    char *out = log_in_child("LOUD", "NET", "loud.log", path, sizeof path);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(strstr(out, "[-] BOOT WARN boot warning"), "got: %s", out);
    ck_assert_msg(!strstr(out, "info"), "INFO shown at the default level: %s", out);

    out = log_in_child("INFO", "INIT,BOGUS", "bogus.log", path, sizeof path);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(strstr(out, "NET INFO net info 42"), "subsystems not ALL: %s", out);
    ck_assert_msg(strstr(out, "INIT INFO init info"), "subsystems not ALL: %s", out);
    ck_assert_msg(!strstr(out, "net trace"), "TRACE shown at INFO: %s", out);
}
END_TEST

/* Runs fn in a child (logging is set once per process); the child exits 0
 * when every check there passed, else 1 after printing the one that failed. */
static void in_child(void (*fn)(void))
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        fn();
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child failed a check (its message is above)");
}

#define CHILD_CHECK(cond)                                                     \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            _exit(1);                                                         \
        }                                                                     \
    } while (0)

/* A malformed HCOLL_DEBUG or HCOLL_DEBUG_SUBSYS fails the calls that
 * start a communicator, naming the variable, although logging itself went
 * on at its default. */
static void child_bad_debug(void)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    clear_env();
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_DEBUG", "LOUD", 1);
    HC_INFO(HC_INIT, -1, "logging starts before any communicator");
    CHILD_CHECK(hcoll_get_unique_id(&id) == HCOLL_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(hcoll_comm_last_error(NULL), "HCOLL_DEBUG='LOUD'") != NULL);

    unsetenv("HCOLL_DEBUG");
    CHILD_CHECK(hcoll_get_unique_id(&id) == HCOLL_SUCCESS);
    setenv("HCOLL_DEBUG_SUBSYS", "INIT,BOGUS", 1);
    CHILD_CHECK(hcoll_comm_init(&comm, 1, 0, &id, NULL) == HCOLL_ERR_INVALID_ARG);
    CHILD_CHECK(comm == NULL);
    CHILD_CHECK(strstr(hcoll_comm_last_error(NULL), "HCOLL_DEBUG_SUBSYS='INIT,BOGUS'") != NULL);
}

START_TEST(init_rejects_malformed_debug)
{
    in_child(child_bad_debug);
}
END_TEST

/* Valid settings are honoured by a process that starts a communicator. */
static char good_log[256];

static void child_good_debug(void)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    clear_env();
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_DEBUG", "info", 1);
    setenv("HCOLL_DEBUG_SUBSYS", "INIT", 1);
    setenv("HCOLL_DEBUG_FILE", good_log, 1);
    CHILD_CHECK(hcoll_get_unique_id(&id) == HCOLL_SUCCESS);
    CHILD_CHECK(hcoll_comm_init(&comm, 1, 0, &id, NULL) == HCOLL_SUCCESS);
    HC_INFO(HC_NET, 0, "filtered out");
    CHILD_CHECK(hcoll_comm_destroy(comm) == HCOLL_SUCCESS);
}

START_TEST(init_honours_valid_debug)
{
    char dir[] = "/tmp/hcoll-log-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(good_log, sizeof good_log, "%s/init.log", dir);
    in_child(child_good_debug);
    static char buf[16384];
    memset(buf, 0, sizeof buf);
    int fd = open(good_log, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(read(fd, buf, sizeof buf - 1), 0);
    close(fd);
    unlink(good_log);
    rmdir(dir);
    ck_assert_msg(strstr(buf, " INIT INFO "), "no INIT INFO line: %s", buf);
    ck_assert_msg(!strstr(buf, "filtered out"), "NET not filtered: %s", buf);
}
END_TEST

START_TEST(thread_error_buffer)
{
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    setenv("HCOLL_DEBUG", "NONE", 1);
    ck_assert_int_eq(hc_err_set(&eb, HC_INIT, 0, HCOLL_ERR_TIMEOUT, "rank %d late", 5),
                     HCOLL_ERR_TIMEOUT);
    ck_assert_str_eq(hc_errbuf_get(&eb), "HCOLL_ERR_TIMEOUT: rank 5 late");
    hc_errbuf_fini(&eb);
    /* Calls without a communicator report through hcoll_comm_last_error(NULL). */
    hcoll_status_t st = hcoll_get_unique_id(NULL);
    ck_assert_int_eq(st, HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(hcoll_comm_last_error(NULL), "id_out"));
}
END_TEST

START_TEST(null_handles_are_noops)
{
    ck_assert_int_eq(hcoll_comm_destroy(NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_comm_abort(NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hcoll_request_free(NULL), HCOLL_SUCCESS);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("status");
    tcase_add_test(tc, status_every_code_has_text);
    tcase_add_test(tc, version_matches_header);
    tcase_add_test(tc, dtype_and_op_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("knobs");
    tcase_add_test(tc, defaults_load);
    tcase_add_test(tc, env_values_parse);
    tcase_add_loop_test(tc, malformed_values_rejected, 0, (int)HC_ARRAY_LEN(bad_values));
    tcase_add_test(tc, config_struct_rules);
    tcase_add_loop_test(tc, config_field_bounds, 0, (int)HC_ARRAY_LEN(field_bounds));
    tcase_add_test(tc, config_field_over_bad_env);
    tcase_add_test(tc, config_op_timeout_field);
    tcase_add_test(tc, size_parser);
    tcase_add_test(tc, table_is_documented);
    suite_add_tcase(s, tc);

    tc = tcase_create("list");
    tcase_add_test(tc, list_syntax);
    suite_add_tcase(s, tc);

    tc = tcase_create("log");
    tcase_add_test(tc, log_levels_and_subsys);
    tcase_add_test(tc, log_file_and_filtering);
    tcase_add_test(tc, log_malformed_keeps_default);
    tcase_add_test(tc, init_rejects_malformed_debug);
    tcase_add_test(tc, init_honours_valid_debug);
    tcase_add_test(tc, thread_error_buffer);
    tcase_add_test(tc, null_handles_are_noops);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
