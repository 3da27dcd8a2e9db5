/*
 * bench/p2p_sink.c — pc-p2p-bench --serve-tcp: the plain socket sender the
 * tcp target reads from, the floor every server is compared with.
 *
 * Owns: the sink's send buffer (one, filled once, read by every thread).
 * Runs alone in its process: the accepting thread, and a thread per
 * connection doing blocking writes.
 *
 * Invariants: listens on loopback only; a request asks 1..SERVE_ASK_MAX
 * bytes, anything else closes the connection.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2p_bench.h"

/* ---------------------------------------------------- the tcp sink ---- */

static uint8_t *serve_buf;

/* One client: per 8-byte request (u64 LE bytes asked), writes that many. */
static void *serve_conn(void *arg)
{
	int fd = (int)(intptr_t)arg;
	uint64_t ask;
	for (;;) {
		ssize_t n = recv(fd, &ask, sizeof(ask), MSG_WAITALL);
		if (n != (ssize_t)sizeof(ask))
			break;
		ask = le64toh(ask);
		if (ask == 0 || ask > SERVE_ASK_MAX)
			break;
		while (ask) {
			n = send(fd, serve_buf, PC_MIN(ask, SERVE_BUF_BYTES),
				 MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				goto out;
			ask -= (uint64_t)n;
		}
	}
out:
	close(fd);
	return NULL;
}

/* --serve-tcp: the plain socket sender the tcp target reads from; a thread
 * per connection, blocking writes from one pre-touched buffer. Runs until
 * killed. */
int sink_serve_tcp(const struct opts *o)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
	socklen_t sl = sizeof(sa);
	int one = 1;
	if (!wire_host_ok(o->host) || inet_pton(AF_INET, o->host, &sa.sin_addr) != 1)
		return wire_fail(EINVAL, "--host %s: not a loopback IPv4 address", o->host);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 128) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0)
		return wire_fail(errno, "listen on %s:%u: %s", o->host, o->port,
				 strerror(errno));
	serve_buf = pc_xcalloc(1, SERVE_BUF_BYTES);
	memset(serve_buf, 's', SERVE_BUF_BYTES);
	fprintf(stderr, "pc-p2p-bench: listening: tcp on %s:%u\n", o->host,
		ntohs(sa.sin_port));
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
				continue;
			return wire_fail(errno, "accept: %s", strerror(errno));
		}
		pthread_t th;
		pthread_attr_t at;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &at, serve_conn, (void *)(intptr_t)fd) != 0)
			close(fd);
		pthread_attr_destroy(&at);
	}
}
