/*
 * bench/tool/net.c — peercache-bench: the plain TCP plumbing of the
 * baseline targets (net.h): address parsing, connect with a timeout,
 * requests sent from iovecs, a buffered reader, all bounded by the call's
 * deadline.
 *
 * Owns: nothing global. A pcb_net_conn belongs to one driver thread, a
 * pcb_net_proc is read only after pcb_net_proc_open.
 *
 * Invariants: no wait outlasts the call's deadline (poll with what is left
 * of it); nothing here allocates after conn_open; a length a server sends
 * is never used to size or index memory (readers take the caller's
 * destination and a count the caller has checked).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "net.h"

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events or the deadline passes: 0, -ETIMEDOUT
 * or a negative errno. */
static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
	for (;;) {
		uint64_t now = now_ms();
		if (now >= deadline_ms)
			return -ETIMEDOUT;
		uint64_t left = deadline_ms - now;
		struct pollfd p = {.fd = fd, .events = events};
		int rc = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (rc > 0)
			return 0; /* ready, or an error the next call reports */
		if (rc < 0 && errno != EINTR)
			return -errno;
	}
}

/* ------------------------------------------------------------ addresses */

/* Split "host:port", "[v6]:port", "host" or a bare IPv6 address. */
static int split_addr(const char *addr, const char *default_port, char *host,
		      size_t hostlen, char *port, size_t portlen)
{
	const char *h = addr, *p = NULL;
	size_t hl;

	if (addr[0] == '[') {
		const char *close = strchr(addr, ']');
		if (!close || (close[1] != '\0' && close[1] != ':'))
			return -EINVAL;
		h = addr + 1;
		hl = (size_t)(close - h);
		if (close[1] == ':')
			p = close + 2;
	} else {
		const char *colon = strchr(addr, ':');
		if (colon && !strchr(colon + 1, ':')) {
			hl = (size_t)(colon - addr);
			p = colon + 1;
		} else {
			hl = strlen(addr); /* no port, or a bare IPv6 address */
		}
	}
	if (hl == 0 || hl >= hostlen || (p && (!*p || strlen(p) >= portlen)))
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	snprintf(port, portlen, "%s", p ? p : default_port);
	return 0;
}

int pcb_net_proc_open(const struct pcb_target *t,
		      const struct pcb_backend *be, const char *default_port,
		      void **proc, char *err, size_t errlen)
{
	const char *target = be->target;
	char host[256], port[32];
	const char *addr = t->addr && *t->addr ? t->addr : "127.0.0.1";

	*proc = NULL;
	if (t->page_bytes == 0 || t->batch == 0 ||
	    t->page_bytes > SIZE_MAX / t->batch || t->timeout_ms == 0) {
		snprintf(err, errlen,
			 "%s: page bytes, batch and timeout must be > 0 (and "
			 "batch x page bytes must fit in memory)", target);
		return -EINVAL;
	}
	if (split_addr(addr, default_port, host, sizeof(host), port,
		       sizeof(port)) < 0) {
		snprintf(err, errlen,
			 "%s: address '%s' is not host:port, host, [ipv6]:port "
			 "or an IPv6 address", target, addr);
		return -EINVAL;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM}, *res;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g != 0) {
		snprintf(err, errlen, "%s: cannot resolve '%s' port '%s': %s",
			 target, host, port, gai_strerror(g));
		return -EHOSTUNREACH;
	}
	struct pcb_net_proc *p = calloc(1, sizeof(*p));
	if (!p) {
		freeaddrinfo(res);
		snprintf(err, errlen, "%s: out of memory", target);
		return -ENOMEM;
	}
	p->be = be;
	p->target = target;
	snprintf(p->where, sizeof(p->where), "%s", addr);
	for (struct addrinfo *a = res; a && p->naddrs < PCB_NET_ADDRS_MAX;
	     a = a->ai_next) {
		if (a->ai_addrlen > sizeof(p->addrs[0]))
			continue;
		memcpy(&p->addrs[p->naddrs], a->ai_addr, a->ai_addrlen);
		p->addrlens[p->naddrs++] = a->ai_addrlen;
	}
	freeaddrinfo(res);
	if (p->naddrs == 0) {
		snprintf(err, errlen, "%s: '%s' resolves to no usable address",
			 target, addr);
		free(p);
		return -EHOSTUNREACH;
	}
	p->timeout_ms = t->timeout_ms;
	p->page_bytes = t->page_bytes;
	p->batch = t->batch;
	*proc = p;
	return 0;
}

void pcb_net_proc_close(void *proc)
{
	free(proc);
}

/* ------------------------------------------------------------ connections */

/* Connect to one address by the deadline: a blocking socket, or -errno. */
static int connect_one(const struct sockaddr *sa, socklen_t len,
		       uint64_t deadline_ms)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
			0);
	if (fd < 0)
		return -errno;
	int rc = 0;
	if (connect(fd, sa, len) < 0) {
		if (errno != EINPROGRESS) {
			rc = -errno;
		} else if ((rc = wait_fd(fd, POLLOUT, deadline_ms)) == 0) {
			int soerr = 0;
			socklen_t sl = sizeof(soerr);
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
				rc = -errno;
			else
				rc = -soerr;
		}
	}
	int one = 1;
	if (rc == 0 && (fcntl(fd, F_SETFL, 0) < 0 ||
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
				   sizeof(one)) < 0))
		rc = -errno;
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

int pcb_net_conn_open(void *proc, unsigned idx, struct pcb_conn **out,
		      char *err, size_t errlen)
{
	const struct pcb_net_proc *p = proc;
	struct pcb_net_conn *c = calloc(1, sizeof(*c));
	size_t page_area = (size_t)p->batch * p->page_bytes;

	*out = NULL;
	if (!c) {
		snprintf(err, errlen, "%s: out of memory", p->target);
		return -ENOMEM;
	}
	c->base.be = p->be;
	c->proc = p;
	c->fd = -1;
	c->out.cap = (size_t)p->batch * (PCB_KEY_MAX + PCB_NET_KEY_TEXT) + 64;
	/* per key: text, page, and the text that ends them */
	c->out.iov_cap = 2 * p->batch + 2;
	c->out.stage = malloc(c->out.cap);
	c->out.iov = calloc(c->out.iov_cap, sizeof(*c->out.iov));
	c->rd.buf = malloc(PCB_NET_RD_BYTES);
	void *pages = NULL;
	if (posix_memalign(&pages, 4096, page_area) != 0)
		pages = NULL;
	c->base.buf = pages;
	if (!c->out.stage || !c->out.iov || !c->rd.buf || !c->base.buf) {
		snprintf(err, errlen, "%s: out of memory (%zu bytes of pages)",
			 p->target, page_area);
		pcb_net_conn_close(&c->base);
		return -ENOMEM;
	}
	memset(c->base.buf, 0, page_area);

	uint64_t deadline = now_ms() + p->timeout_ms;
	int rc = -EHOSTUNREACH;
	for (unsigned i = 0; i < p->naddrs; i++) {
		rc = connect_one((const struct sockaddr *)&p->addrs[i],
				 p->addrlens[i], deadline);
		if (rc >= 0)
			break;
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s %s: cannot connect: %s", p->target,
			 p->where, rc == -ETIMEDOUT ? "no answer in time"
						    : strerror(-rc));
		pcb_net_conn_close(&c->base);
		return rc;
	}
	c->fd = rc;
	*out = &c->base;
	return 0;
}

void pcb_net_conn_close(struct pcb_conn *base)
{
	struct pcb_net_conn *c = (struct pcb_net_conn *)base;

	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c->out.stage);
	free(c->out.iov);
	free(c->rd.buf);
	free(c->base.buf);
	free(c);
}

/* c->err = "<target> <where>: " and the message (cut to fit). */
static void vnote(struct pcb_net_conn *c, const char *fmt, va_list ap)
{
	int n = snprintf(c->base.err, sizeof(c->base.err), "%s %s: ",
			 c->proc->target, c->proc->where);

	if (n < 0 || (size_t)n >= sizeof(c->base.err))
		return;
	vsnprintf(c->base.err + n, sizeof(c->base.err) - (size_t)n, fmt, ap);
}

void pcb_net_note(struct pcb_net_conn *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(c, fmt, ap);
	va_end(ap);
}

int pcb_net_fail(struct pcb_net_conn *c, int rc, const char *fmt, ...)
{
	char what[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	switch (rc) {
	case -ETIMEDOUT:
		pcb_net_note(c, "%s: no answer within %u ms", what,
			     c->proc->timeout_ms);
		break;
	case -ECONNRESET:
		pcb_net_note(c, "%s: connection closed by the server", what);
		break;
	case -EPROTO:
		pcb_net_note(c, "%s: protocol violation", what);
		break;
	default:
		pcb_net_note(c, "%s: %s", what, strerror(-rc));
	}
	if (rc != -EINVAL && rc != -EREMOTEIO)
		c->broken = true;
	return rc;
}

int pcb_net_begin(struct pcb_net_conn *c, const size_t *keylens, size_t n,
		  size_t *hits)
{
	*hits = 0;
	if (c->broken) {
		pcb_net_note(c, "connection out of step after an earlier "
			     "failure: reopen it");
		return -ENOTCONN;
	}
	if (n > c->proc->batch)
		return pcb_net_fail(c, -EINVAL, "%zu keys in one call (batch "
				    "is %u)", n, c->proc->batch);
	for (size_t i = 0; i < n; i++)
		if (keylens[i] == 0 || keylens[i] >= PCB_KEY_MAX)
			return pcb_net_fail(c, -EINVAL, "key %zu is %zu bytes "
					    "(1 to %d)", i, keylens[i],
					    PCB_KEY_MAX - 1);
	c->base.err[0] = '\0';
	c->deadline_ms = now_ms() + c->proc->timeout_ms;
	c->out.len = c->out.seg = 0;
	c->out.niov = 0;
	return n > 0;
}

/* ---------------------------------------------------------------- sending */

static void out_push(struct pcb_net_out *o, const void *p, size_t n)
{
	assert(o->niov < o->iov_cap);
	o->iov[o->niov++] = (struct iovec){.iov_base = (void *)p, .iov_len = n};
}

/* Close the stage bytes not yet covered into an iovec. */
static void out_cut(struct pcb_net_out *o)
{
	if (o->len > o->seg)
		out_push(o, o->stage + o->seg, o->len - o->seg);
	o->seg = o->len;
}

void pcb_net_out_fmt(struct pcb_net_out *o, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(o->stage + o->len, o->cap - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->cap - o->len)
		abort(); /* pcb_net_begin bounds keys and their count */
	o->len += (size_t)n;
}

void pcb_net_out_bytes(struct pcb_net_out *o, const void *p, size_t n)
{
	if (n > o->cap - o->len)
		abort(); /* as above */
	memcpy(o->stage + o->len, p, n);
	o->len += n;
}

void pcb_net_out_value(struct pcb_net_out *o, const void *p, size_t n)
{
	out_cut(o);
	out_push(o, p, n);
	pcb_net_out_bytes(o, "\r\n", 2);
}

int pcb_net_send(struct pcb_net_conn *c, const char *what)
{
	struct pcb_net_out *o = &c->out;
	struct iovec *iov = o->iov;
	unsigned left;

	out_cut(o);
	left = o->niov;
	while (left > 0) {
		struct msghdr m = {.msg_iov = iov,
				   .msg_iovlen = left > IOV_MAX ? IOV_MAX : left};
		ssize_t w = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0) {
			int rc = -errno;
			if (rc == -EINTR)
				continue;
			if (rc == -EAGAIN) {
				rc = wait_fd(c->fd, POLLOUT, c->deadline_ms);
				if (rc == 0)
					continue;
			}
			if (rc == -EPIPE)
				rc = -ECONNRESET;
			return pcb_net_fail(c, rc, "sending %s", what);
		}
		size_t done = (size_t)w;
		while (left > 0 && done >= iov->iov_len) {
			done -= iov->iov_len;
			iov++;
			left--;
		}
		if (left > 0) {
			iov->iov_base = (char *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	o->len = o->seg = 0;
	o->niov = 0;
	return 0;
}

int pcb_net_send_each(struct pcb_net_conn *c, const char *cmd,
		      char *const *keys, const size_t *keylens, size_t n,
		      bool values, pcb_net_head_fn *head)
{
	uint64_t page = c->proc->page_bytes;

	for (size_t i = 0; i < n; i++) {
		head(&c->out, cmd, keys[i], keylens[i], values,
		     values ? page : 0);
		if (values)
			pcb_net_out_value(&c->out, c->base.buf + i * page, page);
	}
	return pcb_net_send(c, cmd);
}

/* ---------------------------------------------------------------- reading */

/* One receive by the deadline into p (at most n bytes): count, or -errno
 * (-ECONNRESET for a closed connection). */
static ssize_t recv_some(struct pcb_net_conn *c, void *p, size_t n)
{
	for (;;) {
		ssize_t r = recv(c->fd, p, n, MSG_DONTWAIT);
		if (r > 0)
			return r;
		if (r == 0)
			return -ECONNRESET;
		int rc = -errno;
		if (rc == -EINTR)
			continue;
		if (rc != -EAGAIN)
			return rc == -EPIPE ? -ECONNRESET : rc;
		rc = wait_fd(c->fd, POLLIN, c->deadline_ms);
		if (rc < 0)
			return rc;
	}
}

/* Receive more into the reader's buffer (moving what is unread to its
 * start first): 0, -EPROTO when it is full, or -errno. */
static int rd_fill(struct pcb_net_conn *c)
{
	struct pcb_net_rd *r = &c->rd;

	if (r->head > 0) {
		memmove(r->buf, r->buf + r->head, r->tail - r->head);
		r->tail -= r->head;
		r->head = 0;
	}
	if (r->tail == PCB_NET_RD_BYTES)
		return -EPROTO;
	ssize_t got = recv_some(c, r->buf + r->tail, PCB_NET_RD_BYTES - r->tail);
	if (got < 0)
		return (int)got;
	r->tail += (size_t)got;
	return 0;
}

int pcb_net_read_line(struct pcb_net_conn *c, const char **line, size_t *len)
{
	struct pcb_net_rd *r = &c->rd;
	size_t scanned = 0; /* bytes from head known to hold no CRLF end */

	for (;;) {
		size_t avail = r->tail - r->head;
		const uint8_t *base = r->buf + r->head;
		if (avail > scanned) {
			const uint8_t *nl = memchr(base + scanned, '\n',
						   avail - scanned);
			if (nl) {
				size_t n = (size_t)(nl - base);
				if (n == 0 || base[n - 1] != '\r')
					return -EPROTO; /* a bare LF */
				*line = (const char *)base;
				*len = n - 1;
				r->head += n + 1;
				return 0;
			}
			scanned = avail;
		}
		int rc = rd_fill(c);
		if (rc < 0)
			return rc;
	}
}

int pcb_net_read_exact(struct pcb_net_conn *c, void *dst, uint64_t n)
{
	struct pcb_net_rd *r = &c->rd;
	uint8_t *d = dst;

	while (n > 0) {
		size_t avail = r->tail - r->head;
		if (avail > 0) {
			size_t k = avail < n ? avail : (size_t)n;
			if (d) {
				memcpy(d, r->buf + r->head, k);
				d += k;
			}
			r->head += k;
			n -= k;
			continue;
		}
		if (d && n >= PCB_NET_RD_BYTES) {
			/* a large remainder: straight into its place */
			ssize_t got = recv_some(c, d, (size_t)n);
			if (got < 0)
				return (int)got;
			d += got;
			n -= (uint64_t)got;
			continue;
		}
		r->head = r->tail = 0;
		int rc = rd_fill(c);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int pcb_net_read_crlf(struct pcb_net_conn *c)
{
	char end[2];
	int rc = pcb_net_read_exact(c, end, 2);

	if (rc < 0)
		return rc;
	return end[0] == '\r' && end[1] == '\n' ? 0 : -EPROTO;
}

/* ---------------------------------------------------------------- parsing */

int pcb_net_parse_int(const char *s, size_t len, int64_t *out)
{
	bool neg = len > 0 && s[0] == '-';
	size_t i = neg ? 1 : 0;
	int64_t v = 0;

	if (len == i || len - i > 18)
		return -EPROTO;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EPROTO;
		v = v * 10 + (s[i] - '0');
	}
	*out = neg ? -v : v;
	return 0;
}

const char *pcb_net_show(const void *s, size_t len, char *out, size_t cap)
{
	const unsigned char *p = s;
	size_t i;

	if (cap == 0)
		return out;
	for (i = 0; i < len && i + 1 < cap; i++)
		out[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
	out[i] = '\0';
	return out;
}
