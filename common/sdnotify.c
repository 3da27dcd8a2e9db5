/*
 * common/sdnotify.c — see sdnotify.h. A fresh datagram socket per message:
 * the node sends a handful in its lifetime (ready, reloads, stopping), so
 * keeping a descriptor open would buy nothing. The address is parsed here
 * rather than by libsystemd, which the node does not link.
 */
#include "sdnotify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SD_MSG_MAX 1024

int pc_sd_notify(const char *state)
{
	const char *addr = getenv("NOTIFY_SOCKET");
	if (!addr || !*addr)
		return 0;
	if (addr[0] != '/' && addr[0] != '@')
		return -EAFNOSUPPORT;
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	size_t n = strlen(addr);
	if (n >= sizeof(sun.sun_path))
		return -ENAMETOOLONG;
	memcpy(sun.sun_path, addr, n);
	/* An abstract name: a leading NUL, and the length counts exactly the
	 * name's bytes (no terminator); a path is NUL-terminated. */
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	if (addr[0] == '@')
		sun.sun_path[0] = '\0';
	else
		len++;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
			   (struct sockaddr *)&sun, len);
	int ret = w < 0 ? -errno : 1;
	close(fd);
	return ret;
}

int pc_sd_notifyf(const char *fmt, ...)
{
	char msg[SD_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(msg))
		return -EMSGSIZE;
	return pc_sd_notify(msg);
}
