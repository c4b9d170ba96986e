/*
 * Reading sysfs (and /proc) under a root directory, so that every function
 * built on these runs unchanged on a fixture tree in tests:
 *
 *   root "/" (or NULL)          → the real /sys/...
 *   root "tests/fixtures/x"     → tests/fixtures/x/sys/...
 *
 * Paths passed as `rel` are relative to the root ("sys/class/infiniband"),
 * a leading '/' is tolerated. Depends on nothing of ours.
 *
 * Error convention of src/sys (layer 1, below base/err.h):
 *   - A function that can fail and has something to say returns
 *     hcoll_status_t (hcoll.h) and writes its message into the caller's
 *     char buffer (err/why, errlen); it logs nothing and records nothing.
 *     The caller (layer >= 2) records the message with hc_err_set, once,
 *     unchanged or behind its own prefix, or drops it when the failure is
 *     an answer (hcoll_info, the TCP fallback).
 *   - Counts and other results travel in *_out arguments, written only on
 *     success.
 *   - Lookups whose failure is an answer rather than an error (the file
 *     reads below, PCI paths, GID text) return 0 or -errno (-1 where no
 *     errno applies) and take no buffer: callers test for absence
 *     (-ENOENT) and move on.
 */
#ifndef HC_SYS_SYSFS_H
#define HC_SYS_SYSFS_H

#include <stddef.h>

#define HC_SYSFS_PATH_MAX 512
#define HC_SYSFS_NAME_MAX 64

/* root + "/" + rel into out. Returns 0, or -1 when it does not fit. */
int hc_sysfs_path(const char *root, const char *rel, char *out, size_t outlen);

/* Contents of a small file, surrounding whitespace trimmed. Returns 0, or
 * -errno (-ENOENT for a missing file; sysfs answers -EINVAL for unused GID
 * attribute slots). */
int hc_sysfs_read(const char *root, const char *rel, char *buf, size_t len);

/* As hc_sysfs_read, parsed as a decimal (or 0x hex) integer. */
int hc_sysfs_read_long(const char *root, const char *rel, long *out);

/* Does root/rel exist (file, directory or link target)? */
int hc_sysfs_exists(const char *root, const char *rel);

/* realpath(root/rel) expressed relative to realpath(root), starting with '/'
 * ("/sys/devices/pci0000:00/..."), so that a fixture's symlinks resolve as
 * the kernel's do. Returns 0, or -errno. */
int hc_sysfs_realpath(const char *root, const char *rel, char *out, size_t outlen);

/* Names in directory root/rel (without "." and ".."), sorted in natural
 * order (mlx5_2 before mlx5_10), at most max of them. Returns the count, or
 * -errno when the directory cannot be opened. */
int hc_sysfs_list(const char *root, const char *rel, char (*names)[HC_SYSFS_NAME_MAX], int max);


#endif
