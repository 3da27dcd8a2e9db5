/*
 * bench/p2p_wire.c — pc-p2p-bench's wire: failure messages, loopback
 * connections and the one receive path, the MessagePack-RPC writer and
 * reader (p2p_wire.h).
 *
 * Owns: wire_err, one per thread. Every function works on the caller's
 * connection or buffer only, so any thread may use it on its own.
 *
 * Every reply is received with recvmsg(MSG_WAITALL) over an iovec the caller
 * lays out (wire_recv_iov): framing bytes into a small per-item area, each
 * payload straight into its final place. No intermediate copy for any
 * target, the same receive path for all, so the comparison is between
 * servers.
 *
 * Invariants: every wait is bounded (--timeout of silence on a socket); only
 * loopback addresses are contacted; an RPC connection allocates its reply
 * buffer on first use, nothing else here allocates but a wire_buf growing;
 * sizes a peer declares are checked before use (lg_mp_skip fails a reply
 * over WIRE_REPLY_MAX as soon as its header says so).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2p_wire.h"

/* ------------------------------------------------------------- errors ---- */

/* The last failure of this thread, shown by whoever reports it. */
_Thread_local char wire_err[512];

/* Records a failure message; returns -err (err a positive errno). */
PC_PRINTF(2, 3) int wire_fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(wire_err, sizeof(wire_err), fmt, ap);
	va_end(ap);
	return -err;
}

/* Printable excerpt of bytes that were not what we expected. */
const char *wire_show(const uint8_t *p, size_t n, char *out, size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 5 < cap; i++) {
		if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
			out[o++] = (char)p[i];
		else
			o += (size_t)snprintf(out + o, cap - o, "\\x%02x", p[i]);
	}
	out[o] = '\0';
	return out;
}

/* -------------------------------------------------------- connections ---- */

/* Loopback only: this tool never sends traffic anywhere else. */
bool wire_host_ok(const char *host)
{
	struct in_addr a;
	return inet_pton(AF_INET, host, &a) == 1 &&
	       (ntohl(a.s_addr) >> 24) == 127;
}

int wire_conn_open(struct wire_conn *c, const char *what, const char *host,
		   uint16_t port, unsigned timeout_ms)
{
	*c = (struct wire_conn){.fd = -1, .timeout_ms = timeout_ms};
	snprintf(c->name, sizeof(c->name), "%s %s:%u", what, host, port);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (!wire_host_ok(host) || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return wire_fail(EINVAL, "%s: not a loopback IPv4 address", c->name);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return wire_fail(errno, "socket: %s", strerror(errno));
	int one = 1;
	struct timeval tv = {.tv_sec = timeout_ms / 1000,
			     .tv_usec = (timeout_ms % 1000) * 1000};
	/* SO_SNDTIMEO also bounds connect(). */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return wire_fail(e, "%s: connect: %s", c->name, strerror(e));
	}
	c->fd = fd;
	return 0;
}

void wire_conn_close(struct wire_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->rbuf);
	c->fd = -1;
	c->rbuf = NULL;
}

int wire_send(struct wire_conn *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return wire_fail(ETIMEDOUT, "%s: send blocked for %u ms",
					 c->name, c->timeout_ms);
		if (n < 0)
			return wire_fail(errno, "%s: send: %s", c->name, strerror(errno));
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Fills iov[0..n) from c (the iovecs are consumed). *got counts the bytes
 * that arrived, also on failure, so the caller can say which item went
 * wrong. A silence of timeout_ms fails; a slow but moving transfer does not.
 */
int wire_recv_iov(struct wire_conn *c, struct iovec *iov, unsigned n, size_t *got)
{
	unsigned i = 0;
	*got = 0;
	while (i < n && iov[i].iov_len == 0)
		i++;
	while (i < n) {
		struct msghdr m = {.msg_iov = iov + i,
				   .msg_iovlen = PC_MIN(n - i, (unsigned)IOV_MAX)};
		ssize_t r = recvmsg(c->fd, &m, MSG_WAITALL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return wire_fail(ETIMEDOUT, "%s: reply stopped after %zu bytes"
					 " (silent for %u ms)", c->name, *got,
					 c->timeout_ms);
		if (r < 0)
			return wire_fail(errno, "%s: recv: %s", c->name, strerror(errno));
		if (r == 0)
			return wire_fail(ECONNRESET, "%s: closed after %zu bytes of a"
					 " reply", c->name, *got);
		*got += (size_t)r;
		size_t left = (size_t)r;
		while (i < n && left >= iov[i].iov_len) {
			left -= iov[i].iov_len;
			iov[i++].iov_len = 0;
		}
		if (left) {
			iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
			iov[i].iov_len -= left;
		}
	}
	return 0;
}

/*
 * Reads one whole MessagePack object (an RPC reply) into c->rbuf, allocated
 * on first use with room for WIRE_REPLY_MAX; *obj stays valid until the next
 * read on c. A larger reply fails as soon as its declared size shows it.
 */
int wire_read_obj(struct wire_conn *c, const uint8_t **obj, size_t *len)
{
	if (!c->rbuf)
		c->rbuf = pc_xcalloc(1, WIRE_REPLY_MAX);
	for (;;) {
		ssize_t n = lg_mp_skip(c->rbuf + c->rbeg, c->rend - c->rbeg,
				       WIRE_REPLY_MAX);
		if (n > 0) {
			*obj = c->rbuf + c->rbeg;
			*len = (size_t)n;
			c->rbeg += (size_t)n;
			return 0;
		}
		if (n < 0)
			return wire_fail(EPROTO, "%s: reply is not MessagePack or over"
					 " %u bytes", c->name, WIRE_REPLY_MAX);
		if (c->rbeg) {
			memmove(c->rbuf, c->rbuf + c->rbeg, c->rend - c->rbeg);
			c->rend -= c->rbeg;
			c->rbeg = 0;
		}
		ssize_t r = recv(c->fd, c->rbuf + c->rend, WIRE_REPLY_MAX - c->rend, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return wire_fail(ETIMEDOUT, "%s: no reply within %u ms",
					 c->name, c->timeout_ms);
		if (r < 0)
			return wire_fail(errno, "%s: recv: %s", c->name, strerror(errno));
		if (r == 0)
			return wire_fail(ECONNRESET, "%s: connection closed", c->name);
		c->rend += (size_t)r;
	}
}

/* ------------------------------------------------------- MessagePack ---- */

void wire_buf_reserve(struct wire_buf *b, size_t more)
{
	if (b->len + more <= b->cap)
		return;
	size_t cap = PC_MAX(b->cap * 2, b->len + more + 4096);
	uint8_t *p = realloc(b->p, cap);
	PC_ASSERT(p != NULL);
	b->p = p;
	b->cap = cap;
}

void wire_buf_put(struct wire_buf *b, const void *p, size_t n)
{
	wire_buf_reserve(b, n);
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

size_t wire_put_field(uint8_t *out, uint8_t marker, uint64_t v, unsigned n)
{
	out[0] = marker;
	for (unsigned i = 0; i < n; i++)
		out[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	return 1 + n;
}

static void buf_field(struct wire_buf *b, uint8_t marker, uint64_t v, unsigned n)
{
	uint8_t t[9];
	wire_buf_put(b, t, wire_put_field(t, marker, v, n));
}

void wire_mp_array(struct wire_buf *b, uint32_t n)
{
	if (n < 16)
		buf_field(b, (uint8_t)(0x90 | n), 0, 0);
	else if (n <= 0xffff)
		buf_field(b, 0xdc, n, 2);
	else
		buf_field(b, 0xdd, n, 4);
}

void wire_mp_str(struct wire_buf *b, const char *s, size_t n)
{
	if (n < 32)
		buf_field(b, (uint8_t)(0xa0 | n), 0, 0);
	else if (n <= 0xff)
		buf_field(b, 0xd9, n, 1);
	else
		buf_field(b, 0xda, n, 2);
	wire_buf_put(b, s, n);
}

void wire_mp_bin_head(struct wire_buf *b, uint64_t n)
{
	if (n <= 0xff)
		buf_field(b, 0xc4, n, 1);
	else if (n <= 0xffff)
		buf_field(b, 0xc5, n, 2);
	else
		buf_field(b, 0xc6, n, 4);
}

void wire_mp_uint(struct wire_buf *b, uint64_t v)
{
	PC_ASSERT(v <= UINT32_MAX);
	if (v < 128)
		buf_field(b, (uint8_t)v, 0, 0);
	else
		buf_field(b, 0xce, v, 4);
}

/* Starts [0, msgid, method, ...]: the caller appends the params array. */
void wire_rpc_begin(struct wire_buf *b, uint32_t msgid, const char *method)
{
	b->len = 0;
	wire_mp_array(b, 4);
	wire_mp_uint(b, 0);
	buf_field(b, 0xce, msgid, 4);
	wire_mp_str(b, method, strlen(method));
}

int wire_rd_head(struct wire_rd *r, struct lg_mp_head *h)
{
	ssize_t n = lg_mp_head(r->p, (size_t)(r->end - r->p), h);
	if (n <= 0 || h->payload > (uint64_t)(r->end - r->p - n))
		return -EPROTO;
	r->p += n;
	return 0;
}

int wire_rd_array(struct wire_rd *r, uint64_t *n)
{
	struct lg_mp_head h;
	if (wire_rd_head(r, &h) < 0 || h.kind != LG_MP_ARRAY)
		return -EPROTO;
	*n = h.val;
	return 0;
}

int wire_rd_uint(struct wire_rd *r, uint64_t *v)
{
	struct lg_mp_head h;
	return wire_rd_head(r, &h) < 0 || !lg_mp_head_u64(&h, v) ? -EPROTO : 0;
}

int wire_rd_str(struct wire_rd *r, const char **s, size_t *n)
{
	struct lg_mp_head h;
	if (wire_rd_head(r, &h) < 0 || h.kind != LG_MP_STR)
		return -EPROTO;
	*s = (const char *)r->p;
	*n = h.payload;
	r->p += h.payload;
	return 0;
}

int wire_rd_bool(struct wire_rd *r, bool *v)
{
	struct lg_mp_head h;
	if (wire_rd_head(r, &h) < 0 || h.kind != LG_MP_BOOL)
		return -EPROTO;
	*v = h.val != 0;
	return 0;
}

bool wire_rd_nil(struct wire_rd *r)
{
	if (r->p < r->end && *r->p == 0xc0) {
		r->p++;
		return true;
	}
	return false;
}

int wire_rd_skip(struct wire_rd *r)
{
	ssize_t n = lg_mp_skip(r->p, (size_t)(r->end - r->p),
			       (size_t)(r->end - r->p));
	if (n <= 0)
		return -EPROTO;
	r->p += n;
	return 0;
}

/*
 * Reads the reply to msgid on c: [1, msgid, error, result]. On success *res
 * reads the result. A reply for another msgid, or carrying an error, fails.
 */
int wire_rpc_reply(struct wire_conn *c, const char *method, uint32_t msgid,
		     struct wire_rd *res)
{
	const uint8_t *obj;
	size_t len;
	int ret = wire_read_obj(c, &obj, &len);
	if (ret < 0)
		return ret;
	struct wire_rd r = {obj, obj + len};
	uint64_t n, type, id;
	if (wire_rd_array(&r, &n) < 0 || n != 4 || wire_rd_uint(&r, &type) < 0 ||
	    type != 1 || wire_rd_uint(&r, &id) < 0)
		return wire_fail(EPROTO, "%s: %s: not a MessagePack-RPC response",
				 c->name, method);
	if (id != msgid)
		return wire_fail(EPROTO, "%s: %s: reply for msgid %" PRIu64 ", expected"
				 " %u", c->name, method, id, msgid);
	if (!wire_rd_nil(&r)) {
		char text[256];
		struct lg_text t = {text, sizeof(text), 0};
		text[0] = '\0';
		lg_mp_render(r.p, (size_t)(r.end - r.p), 0, &t);
		return wire_fail(EPROTO, "%s: %s failed: %s", c->name, method, text);
	}
	*res = r;
	return 0;
}

int wire_rpc_call0(struct wire_conn *c, struct wire_buf *b, uint32_t msgid,
		   const char *method, struct wire_rd *res)
{
	wire_rpc_begin(b, msgid, method);
	wire_mp_array(b, 0);
	int ret = wire_send(c, b->p, b->len);
	return ret < 0 ? ret : wire_rpc_reply(c, method, msgid, res);
}
