/*
 * hcoll_info: what a cluster user runs first. Prints the library version
 * and build options and every HCOLL_* knob with its value in force.
 *
 *   hcoll_info            everything
 *   hcoll_info --env      the knob table only
 *   hcoll_info --build    version and build options only
 */
#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "core/reduce.h"
#include "hc_build.h"
#include "hcoll.h"

static void print_build(void)
{
    int v = hcoll_version();
    printf("hcoll %d.%d.%d (header %s)\n", v / 10000, v / 100 % 100, v % 100,
           HCOLL_VERSION_STRING);
    if (v != HCOLL_VERSION_CODE)
        printf("  WARNING: the library loaded is not the one this program was built with\n");
    printf("Build options:\n");
    printf("  CUDA     %s (CUDA_HOME %s)\n", HCOLL_BUILD_CUDA ? "found" : "not found",
           HCOLL_BUILD_CUDA_HOME);
    printf("  NCCL     %s\n", HCOLL_BUILD_NCCL ? "found" : "not found");
    printf("  verbs    %s\n", HCOLL_BUILD_VERBS ? "headers found" : "not found");
    printf("  rdmacm   %s\n", HCOLL_BUILD_RDMACM ? "headers found" : "not found");
    printf("  host reduction kernels: %s\n", hc_reduce_impl_name());
}

static const char *kind_name(hc_knob_kind_t k)
{
    switch (k) {
    case HC_KNOB_INT: return "int";
    case HC_KNOB_SIZE: return "size";
    case HC_KNOB_ENUM: return "choice";
    case HC_KNOB_STR: return "string";
    case HC_KNOB_LIST: return "list";
    }
    return "?";
}

/* Returns the number of variables whose current value is malformed. */
static int print_env(void)
{
    size_t n;
    const hc_knob_t *k = hc_knobs(&n);
    int bad = 0;
    printf("Environment (HCOLL_*; an explicit hcoll_config_t field wins over these):\n");
    for (size_t i = 0; i < n; i++) {
        int from_env;
        const char *v = hc_knob_current(&k[i], &from_env);
        char err[256] = "";
        int ok = !from_env || hc_knob_parse(&k[i], v, NULL, err, sizeof err) == 0;
        const char *shown = k[i].secret && from_env ? "(set, hidden)" : (v[0] ? v : "(unset)");
        printf("  %-22s = %-16s %s [%s, default %s]\n", k[i].name, shown,
               from_env ? "(env)    " : "(default)", kind_name(k[i].kind),
               k[i].defval[0] ? k[i].defval : "unset");
        printf("      %s\n", k[i].help);
        if (!ok) {
            printf("      ERROR: %s\n", err);
            bad++;
        }
    }
    return bad;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: hcoll_info [--env | --build | --help]\n"
               "  --env     every HCOLL_* knob with its value, default and help\n"
               "  --build   library version and build options\n");
}

int main(int argc, char **argv)
{
    int env = 0, build = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--env") == 0)
            env = 1;
        else if (strcmp(argv[i], "--build") == 0)
            build = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "hcoll_info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!env && !build)
        env = build = 1;
    int bad = 0;
    if (build)
        print_build();
    if (env) {
        if (build)
            printf("\n");
        bad = print_env();
    }
    if (bad)
        printf("\n%d variable(s) above are malformed: hcoll_comm_init will refuse them.\n", bad);
    return bad ? 1 : 0;
}
