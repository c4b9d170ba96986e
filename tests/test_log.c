/*
 * The log file (HCOLL_DEBUG_FILE): created owner-only, never opened through
 * a symbolic link (the library then logs to stderr and says why). Logging
 * reads its settings once per process, so each case runs in a fresh child.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"

/* A child logs one warning with HCOLL_DEBUG_FILE=path, its stderr going
 * to errpath. */
static void log_once(const char *path, const char *errpath)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        umask(0); /* the mode is what the library asks for, not the umask's */
        int e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(e, 2);
        setenv("HCOLL_DEBUG", "WARN", 1);
        setenv("HCOLL_DEBUG_FILE", path, 1);
        HC_WARN(HC_BOOT, -1, "a warning for the file");
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int file_has(const char *path, const char *what)
{
    char buf[4096] = "";
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, what) != NULL;
}

START_TEST(log_file_owner_only)
{
    char dir[] = "/tmp/hcoll-logt-XXXXXX", path[256], err[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/h.log", dir);
    snprintf(err, sizeof err, "%s/stderr", dir);
    log_once(path, err);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_msg((st.st_mode & 0777) == 0600, "mode %o", st.st_mode & 0777);
    ck_assert(file_has(path, "a warning for the file"));
    unlink(path);
    unlink(err);
    rmdir(dir);
}
END_TEST

START_TEST(log_file_symlink_refused)
{
    char dir[] = "/tmp/hcoll-logt-XXXXXX", path[256], target[256], err[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/h.log", dir);
    snprintf(target, sizeof target, "%s/victim", dir);
    snprintf(err, sizeof err, "%s/stderr", dir);
    ck_assert_int_eq(symlink(target, path), 0);
    log_once(path, err);
    /* Nothing created or written through the link; stderr says so and
     * has the warning instead. */
    ck_assert_int_ne(access(target, F_OK), 0);
    ck_assert(file_has(err, "HCOLL_DEBUG_FILE: cannot open"));
    ck_assert(file_has(err, "a warning for the file"));
    unlink(path);
    unlink(err);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, log_file_owner_only);
    tcase_add_test(tc, log_file_symlink_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
