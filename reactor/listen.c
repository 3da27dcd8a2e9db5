/*
 * reactor/listen.c — TCP and Unix listening sockets with multishot accept.
 *
 * Owns: struct rx_listener and its socket. Thread: the reactor's.
 * One multishot accept per listener yields a completion per new connection;
 * the accepted fd goes to the owner's callback, which decides (attach it as a
 * connection, or refuse it). When the kernel ends the multishot (resource
 * errors such as EMFILE), the accept is re-armed after a short pause instead
 * of spinning. Closing cancels the accept; the struct is freed on the final
 * completion, the socket closed then, and a Unix path unlinked at once so a
 * successor can bind it.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "rx_internal.h"

#define LOG_MOD "listen"
#define REARM_DELAY_MS 100

static void listener_arm(struct rx_listener *l);

static void rearm_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	listener_arm(t->arg);
}

static void listener_free(struct rx_listener *l)
{
	struct rx_reactor *r = l->r;
	rx_timer_stop(r, &l->rearm_timer);
	RX_LIST_DEL(r->listeners, l);
	if (l->fd >= 0)
		close(l->fd);
	free(l->unix_path);
	free(l);
}

static void listener_arm(struct rx_listener *l)
{
	struct rx_reactor *r = l->r;
	if (l->op != RX_NO_OP || (l->flags & RXL_CLOSING))
		return;
	uint32_t idx;
	struct io_uring_sqe *sqe = rx_op_start(r, RX_OP_ACCEPT, l, &idx);
	if (!sqe) {
		rx_timer_start(r, &l->rearm_timer, RX_MS(REARM_DELAY_MS), 0);
		return;
	}
	io_uring_prep_multishot_accept(sqe, l->fd, NULL, NULL,
				       SOCK_NONBLOCK | SOCK_CLOEXEC);
	rx_op_tag(r, sqe, idx);
	l->op = idx;
}

static struct rx_listener *listener_new(struct rx_reactor *r, int fd,
					rx_accept_fn cb, void *arg)
{
	struct rx_listener *l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->r = r;
	l->fd = fd;
	l->op = RX_NO_OP;
	l->cb = cb;
	l->arg = arg;
	rx_timer_init(&l->rearm_timer, rearm_fired, l);
	RX_LIST_ADD(r->listeners, l);
	return l;
}

static void listener_on_accept(struct rx_reactor *r, struct rx_op *op,
			       const struct io_uring_cqe *cqe, uint32_t idx)
{
	struct rx_listener *l = op->obj;
	bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
	int res = cqe->res;
	if (!more) {
		rx_op_free(r, idx);
		l->op = RX_NO_OP;
	}
	if (res >= 0) {
		if (l->flags & RXL_CLOSING) {
			close(res);
		} else {
			RX_STAT_INC(r->st.conns_accepted);
			l->cb(l, res, l->arg);
		}
	} else if (res != -ECANCELED) {
		RX_STAT_INC(r->st.accept_errors);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "accept on port %u failed: %s",
			  l->port, strerror(-res));
	}
	if (more)
		return;
	if (l->flags & RXL_CLOSING) {
		listener_free(l);
	} else if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS ||
		   res == -ENOMEM) {
		/* Out of descriptors or memory: back off, do not spin. */
		rx_timer_start(r, &l->rearm_timer, RX_MS(REARM_DELAY_MS), 0);
	} else {
		listener_arm(l);
	}
}

static int sock_listen(int fd, int backlog)
{
	if (listen(fd, backlog > 0 ? backlog : 1024) < 0)
		return -errno;
	return 0;
}

struct rx_listener *rx_listen_tcp(struct rx_reactor *r, const char *host,
				  uint16_t port, bool reuseport, int backlog,
				  rx_accept_fn cb, void *arg, int *err)
{
	struct addrinfo hints, *res = NULL;
	char portstr[8];
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(portstr, sizeof(portstr), "%u", port);
	int gai = getaddrinfo(host && *host ? host : NULL, portstr, &hints, &res);
	if (gai != 0) {
		PC_LOGE(LOG_MOD, "cannot resolve listen address '%s': %s",
			host ? host : "", gai_strerror(gai));
		*err = -EINVAL;
		return NULL;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK |
						SOCK_CLOEXEC, 0);
	int ret = 0;
	if (fd < 0) {
		ret = -errno;
		goto fail;
	}
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (reuseport &&
	    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) {
		ret = -errno;
		goto fail;
	}
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
		ret = -errno;
		goto fail;
	}
	if ((ret = sock_listen(fd, backlog)) < 0)
		goto fail;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uint16_t bound = port;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		bound = ntohs(ss.ss_family == AF_INET6
				      ? ((struct sockaddr_in6 *)&ss)->sin6_port
				      : ((struct sockaddr_in *)&ss)->sin_port);
	freeaddrinfo(res);
	struct rx_listener *l = listener_new(r, fd, cb, arg);
	if (!l) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	l->port = bound;
	listener_arm(l);
	*err = 0;
	return l;
fail:
	PC_LOGE(LOG_MOD, "cannot listen on %s:%u: %s", host ? host : "*", port,
		strerror(-ret));
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	*err = ret;
	return NULL;
}

/* A socket file nobody accepts on is stale; one with a listener is live. */
static int unix_path_check(const char *path, const struct sockaddr_un *sun)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode)) {
		PC_LOGE(LOG_MOD, "%s exists and is not a socket; refusing to "
			"replace it", path);
		return -EEXIST;
	}
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe < 0)
		return -errno;
	int live = connect(probe, (const struct sockaddr *)sun, sizeof(*sun));
	close(probe);
	if (live == 0) {
		PC_LOGE(LOG_MOD, "another process is listening on %s", path);
		return -EADDRINUSE;
	}
	PC_LOGI(LOG_MOD, "removing stale socket %s", path);
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

struct rx_listener *rx_listen_unix(struct rx_reactor *r, const char *path,
				   unsigned mode, int backlog, rx_accept_fn cb,
				   void *arg, int *err)
{
	struct sockaddr_un sun;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sun.sun_path)) {
		PC_LOGE(LOG_MOD, "socket path is too long (%zu bytes, max %zu): "
			"%s", strlen(path), sizeof(sun.sun_path) - 1, path);
		*err = -ENAMETOOLONG;
		return NULL;
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);
	int ret = unix_path_check(path, &sun);
	int fd = -1;
	if (ret < 0)
		goto fail;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		goto fail;
	}
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		ret = -errno;
		goto fail;
	}
	if (chmod(path, mode) < 0 || (ret = sock_listen(fd, backlog)) < 0) {
		if (!ret)
			ret = -errno;
		unlink(path);
		goto fail;
	}
	struct rx_listener *l = listener_new(r, fd, cb, arg);
	if (!l || !(l->unix_path = strdup(path))) {
		if (l) {
			l->fd = -1;
			listener_free(l);
		}
		close(fd);
		unlink(path);
		*err = -ENOMEM;
		return NULL;
	}
	listener_arm(l);
	*err = 0;
	return l;
fail:
	if (ret != -EEXIST && ret != -EADDRINUSE)
		PC_LOGE(LOG_MOD, "cannot listen on unix socket %s: %s", path,
			strerror(-ret));
	if (fd >= 0)
		close(fd);
	*err = ret;
	return NULL;
}

uint16_t rx_listener_port(const struct rx_listener *l)
{
	return l->port;
}

struct rx_reactor *rx_listener_reactor(const struct rx_listener *l)
{
	return l->r;
}

void rx_listener_close(struct rx_listener *l)
{
	if (l->flags & RXL_CLOSING)
		return;
	l->flags |= RXL_CLOSING;
	if (l->unix_path)
		unlink(l->unix_path);
	rx_timer_stop(l->r, &l->rearm_timer);
	if (l->op != RX_NO_OP)
		rx_cancel_op(l->r, l->op); /* freed on the final completion */
	else
		listener_free(l);
}

void rx_listeners_close_all(struct rx_reactor *r)
{
	for (struct rx_listener *l = r->listeners, *next; l; l = next) {
		next = l->next;
		rx_listener_close(l);
	}
}

void rx_listeners_destroy(struct rx_reactor *r)
{
	while (r->listeners) {
		struct rx_listener *l = r->listeners;
		if (l->unix_path && !(l->flags & RXL_CLOSING))
			unlink(l->unix_path);
		listener_free(l);
	}
}

void rx_listen_ops_register(struct rx_reactor *r)
{
	rx_op_register(r, RX_OP_ACCEPT, listener_on_accept);
}
