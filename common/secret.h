/*
 * common/secret.h — reading a shared secret from a file, safely.
 *
 * Owns: the one rule for secret files used by peercached
 * (cluster_secret_file) and the peercache tool (--secret-file): a regular
 * file, not readable or writable by other users (like ssh's private keys),
 * 1..256 bytes once trailing whitespace is stripped. Threading: any thread.
 */
#ifndef PC_COMMON_SECRET_H
#define PC_COMMON_SECRET_H

#include <stddef.h>

#define PC_SECRET_MAX 256 /* bytes of a secret */

/*
 * Read the secret in path into out (NUL-terminated, cap > PC_SECRET_MAX).
 * Returns its length, or -errno with a sentence in err (naming the file and
 * what to do). A file readable by group members is accepted; *group_readable
 * (may be NULL) tells, so the caller can say so.
 */
int pc_secret_read_file(const char *path, char *out, size_t cap,
			int *group_readable, char *err, size_t errlen);

#endif /* PC_COMMON_SECRET_H */
