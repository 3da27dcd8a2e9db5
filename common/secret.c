/*
 * common/secret.c — see secret.h. A secret file is checked before it is
 * read: a secret that every local user can read protects nothing, so such a
 * file is refused rather than used with a warning nobody reads.
 */
#include "secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int pc_secret_read_file(const char *path, char *out, size_t cap,
			int *group_readable, char *err, size_t errlen)
{
	if (cap <= PC_SECRET_MAX) {
		snprintf(err, errlen, "%s: internal: buffer too small", path);
		return -EINVAL;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "%s: cannot open the secret file: %s",
			 path, strerror(e));
		return -e;
	}
	struct stat st;
	int ret = 0;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
	} else if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		snprintf(err, errlen, "%s: the secret file is not a regular "
			 "file", path);
	} else if (st.st_mode & (S_IROTH | S_IWOTH)) {
		ret = -EPERM;
		snprintf(err, errlen, "%s: the secret file is accessible to "
			 "every user (mode %03o); make it private: chmod 600 "
			 "%s", path, (unsigned)(st.st_mode & 0777), path);
	} else if (st.st_size > PC_SECRET_MAX + 64) {
		ret = -EFBIG;
		snprintf(err, errlen, "%s: the secret file is %lld bytes; a "
			 "secret has at most %d", path, (long long)st.st_size,
			 PC_SECRET_MAX);
	}
	if (ret < 0) {
		close(fd);
		return ret;
	}
	if (group_readable)
		*group_readable = (st.st_mode & (S_IRGRP | S_IWGRP)) != 0;
	char buf[PC_SECRET_MAX + 65];
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-ret));
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len == sizeof(buf)) {
			ret = -EFBIG;
			snprintf(err, errlen, "%s: the secret file is too long "
				 "(a secret has at most %d bytes)", path,
				 PC_SECRET_MAX);
			break;
		}
	}
	close(fd);
	while (ret == 0 && len &&
	       (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
		buf[len - 1] == ' ' || buf[len - 1] == '\t'))
		len--;
	if (ret == 0 && len == 0) {
		ret = -EINVAL;
		snprintf(err, errlen, "%s: the secret file is empty", path);
	} else if (ret == 0 && len > PC_SECRET_MAX) {
		ret = -EFBIG;
		snprintf(err, errlen, "%s: the secret is %zu bytes; at most %d",
			 path, len, PC_SECRET_MAX);
	} else if (ret == 0 && memchr(buf, '\0', len)) {
		ret = -EINVAL;
		snprintf(err, errlen, "%s: the secret contains a NUL byte",
			 path);
	}
	if (ret == 0) {
		memcpy(out, buf, len);
		out[len] = '\0';
		ret = (int)len;
	}
	explicit_bzero(buf, sizeof(buf));
	return ret;
}
