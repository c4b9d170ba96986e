/*
 * Reading sysfs (and /proc) under a root directory, so that every function
 * built on these runs unchanged on a fixture tree in tests:
 *
 *   root "/" (or NULL)          → the real /sys/...
 *   root "tests/fixtures/x"     → tests/fixtures/x/sys/...
 *
 * Paths passed as `rel` are relative to the root ("sys/class/infiniband"),
 * a leading '/' is tolerated. Depends on nothing of ours.
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
