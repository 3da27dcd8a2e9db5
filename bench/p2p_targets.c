/*
 * bench/p2p_targets.c — pc-p2p-bench's wire side: loopback connections and
 * the one receive path, the MessagePack-RPC writer and reader, the keys and
 * their stamped values, setup (storing the values, learning the members and
 * records), each target's issue and complete (p2p, redis, memcached, tcp,
 * dir; the loop that calls them is in p2p_bench.c) and the --serve-tcp sink.
 *
 * Owns: t_err, one per thread, and the sink's buffer. Setup runs on the main
 * thread before any worker starts; issue and complete run on each worker's
 * thread, over the worker's own connections and buffers, and only read
 * struct bench. The sink (--serve-tcp) runs alone in its process, a thread
 * per connection.
 *
 * Every reply is received with recvmsg(MSG_WAITALL) over an iovec that puts
 * framing bytes (response headers, page headers, "$N\r\n", "VALUE ...") into a
 * small per-item area and each payload straight into its final place in the
 * worker's destination buffer: no intermediate copy for any target, the same
 * receive path for all, so the comparison is between servers.
 *
 * Checks, all cheap and all on the hot path: framing bytes are exactly what a
 * hit looks like; the data response's magic, status, id and length; the page
 * header's magic, generation and length against the record; and for every
 * value target except tcp the first and last 8 bytes of each payload, stamped
 * at setup with the key's number (a reply for the wrong key fails the run).
 * A failure returns -errno with a message in t_err that names the item.
 *
 * Invariants: every wait is bounded (--timeout of silence on a socket); only
 * loopback addresses are contacted, including every member and data endpoint
 * the node names; no allocation after the workers start but an RPC
 * connection's reply buffer on first use; sizes a peer declares are checked
 * before use (lg_mp_skip fails a reply over RPC_REPLY_MAX as soon as its
 * header says so; payload lengths must equal what was stored).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "p2p_bench.h"
#include "lg_msgpack.h"
#include "common/util.h"

/* The data port (docs/protocol.md "Data port"), little-endian. */
#define DP_MAGIC_REQ 0x31444350u  /* "PCD1" */
#define DP_MAGIC_RESP 0x31524350u /* "PCR1" */
#define DP_OP_READ 1
#define PAGE_MAGIC 0x31504350u    /* "PCP1" */
#define PAGE_HDR_BYTES 64u

struct dp_req {
	uint32_t magic;
	uint16_t op;
	uint16_t flags;
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint64_t id;
};
_Static_assert(sizeof(struct dp_req) == 32, "data request is 32 bytes");

struct dp_resp {
	uint32_t magic;
	int32_t status;
	uint64_t id;
	uint64_t len;
};
_Static_assert(sizeof(struct dp_resp) == 24, "data response is 24 bytes");

struct page_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint64_t key_hi;
	uint64_t key_lo;
	uint64_t gen;
	uint64_t len;
	uint64_t checksum;
	uint8_t pad[16];
};
_Static_assert(sizeof(struct page_hdr) == PAGE_HDR_BYTES, "page header is 64 bytes");
_Static_assert(sizeof(struct dp_resp) + PAGE_HDR_BYTES <= ITEM_TAIL_OFF &&
	       KEY_BYTES_MAX + 40 <= ITEM_TAIL_OFF,
	       "an item's framing (data headers, \"VALUE <key> 0 <N>\") fits its area");

/* ------------------------------------------------------------- errors ---- */

/* The last failure of this thread, shown by whoever reports it. */
_Thread_local char t_err[512];

/* Records a failure message; returns -err (err a positive errno). */
PC_PRINTF(2, 3) int fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t_err, sizeof(t_err), fmt, ap);
	va_end(ap);
	return -err;
}

/* Printable excerpt of bytes that were not what we expected. */
static const char *show(const uint8_t *p, size_t n, char *out, size_t cap)
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
static bool host_ok(const char *host)
{
	struct in_addr a;
	return inet_pton(AF_INET, host, &a) == 1 &&
	       (ntohl(a.s_addr) >> 24) == 127;
}

int conn_open(struct conn *c, const char *what, const char *host,
	      uint16_t port, unsigned timeout_ms)
{
	*c = (struct conn){.fd = -1, .timeout_ms = timeout_ms};
	snprintf(c->name, sizeof(c->name), "%s %s:%u", what, host, port);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (!host_ok(host) || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return fail(EINVAL, "%s: not a loopback IPv4 address", c->name);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(errno, "socket: %s", strerror(errno));
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
		return fail(e, "%s: connect: %s", c->name, strerror(e));
	}
	c->fd = fd;
	return 0;
}

void conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->rbuf);
	c->fd = -1;
	c->rbuf = NULL;
}

static int send_all(struct conn *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return fail(ETIMEDOUT, "%s: send blocked for %u ms",
				    c->name, c->timeout_ms);
		if (n < 0)
			return fail(errno, "%s: send: %s", c->name, strerror(errno));
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
static int recv_iov(struct conn *c, struct iovec *iov, unsigned n, size_t *got)
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
			return fail(ETIMEDOUT, "%s: reply stopped after %zu bytes"
				    " (silent for %u ms)", c->name, *got,
				    c->timeout_ms);
		if (r < 0)
			return fail(errno, "%s: recv: %s", c->name, strerror(errno));
		if (r == 0)
			return fail(ECONNRESET, "%s: closed after %zu bytes of a"
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
 * on first use with room for RPC_REPLY_MAX; *obj stays valid until the next
 * read on c. A larger reply fails as soon as its declared size shows it.
 */
static int conn_read_obj(struct conn *c, const uint8_t **obj, size_t *len)
{
	if (!c->rbuf)
		c->rbuf = pc_xcalloc(1, RPC_REPLY_MAX);
	for (;;) {
		ssize_t n = lg_mp_skip(c->rbuf + c->rbeg, c->rend - c->rbeg,
				       RPC_REPLY_MAX);
		if (n > 0) {
			*obj = c->rbuf + c->rbeg;
			*len = (size_t)n;
			c->rbeg += (size_t)n;
			return 0;
		}
		if (n < 0)
			return fail(EPROTO, "%s: reply is not MessagePack or over"
				    " %u bytes", c->name, RPC_REPLY_MAX);
		if (c->rbeg) {
			memmove(c->rbuf, c->rbuf + c->rbeg, c->rend - c->rbeg);
			c->rend -= c->rbeg;
			c->rbeg = 0;
		}
		ssize_t r = recv(c->fd, c->rbuf + c->rend, RPC_REPLY_MAX - c->rend, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return fail(ETIMEDOUT, "%s: no reply within %u ms",
				    c->name, c->timeout_ms);
		if (r < 0)
			return fail(errno, "%s: recv: %s", c->name, strerror(errno));
		if (r == 0)
			return fail(ECONNRESET, "%s: connection closed", c->name);
		c->rend += (size_t)r;
	}
}

/* ------------------------------------------------------- MessagePack ---- */

void wb_reserve(struct wbuf *b, size_t more)
{
	if (b->len + more <= b->cap)
		return;
	size_t cap = PC_MAX(b->cap * 2, b->len + more + 4096);
	uint8_t *p = realloc(b->p, cap);
	PC_ASSERT(p != NULL);
	b->p = p;
	b->cap = cap;
}

static void wb_put(struct wbuf *b, const void *p, size_t n)
{
	wb_reserve(b, n);
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

/* Marker then an n-byte big-endian field. */
static void wb_field(struct wbuf *b, uint8_t marker, uint64_t v, unsigned n)
{
	uint8_t t[9];
	t[0] = marker;
	for (unsigned i = 0; i < n; i++)
		t[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	wb_put(b, t, 1 + n);
}

static void mp_array(struct wbuf *b, uint32_t n)
{
	if (n < 16)
		wb_field(b, (uint8_t)(0x90 | n), 0, 0);
	else if (n <= 0xffff)
		wb_field(b, 0xdc, n, 2);
	else
		wb_field(b, 0xdd, n, 4);
}

static void mp_str(struct wbuf *b, const char *s, size_t n)
{
	if (n < 32)
		wb_field(b, (uint8_t)(0xa0 | n), 0, 0);
	else if (n <= 0xff)
		wb_field(b, 0xd9, n, 1);
	else
		wb_field(b, 0xda, n, 2);
	wb_put(b, s, n);
}

static void mp_bin_head(struct wbuf *b, uint64_t n)
{
	if (n <= 0xff)
		wb_field(b, 0xc4, n, 1);
	else if (n <= 0xffff)
		wb_field(b, 0xc5, n, 2);
	else
		wb_field(b, 0xc6, n, 4);
}

static void mp_uint(struct wbuf *b, uint64_t v)
{
	PC_ASSERT(v <= UINT32_MAX);
	if (v < 128)
		wb_field(b, (uint8_t)v, 0, 0);
	else
		wb_field(b, 0xce, v, 4);
}

/* Starts [0, msgid, method, ...]: the caller appends the params array. */
static void rpc_begin(struct wbuf *b, uint32_t msgid, const char *method)
{
	b->len = 0;
	mp_array(b, 4);
	mp_uint(b, 0);
	wb_field(b, 0xce, msgid, 4);
	mp_str(b, method, strlen(method));
}

/* A reader over one decoded object. */
struct mrd {
	const uint8_t *p, *end;
};

static int mrd_head(struct mrd *r, struct lg_mp_head *h)
{
	ssize_t n = lg_mp_head(r->p, (size_t)(r->end - r->p), h);
	if (n <= 0 || h->payload > (uint64_t)(r->end - r->p - n))
		return -EPROTO;
	r->p += n;
	return 0;
}

static int mrd_array(struct mrd *r, uint64_t *n)
{
	struct lg_mp_head h;
	if (mrd_head(r, &h) < 0 || h.kind != LG_MP_ARRAY)
		return -EPROTO;
	*n = h.val;
	return 0;
}

static int mrd_uint(struct mrd *r, uint64_t *v)
{
	struct lg_mp_head h;
	return mrd_head(r, &h) < 0 || !lg_mp_head_u64(&h, v) ? -EPROTO : 0;
}

static int mrd_str(struct mrd *r, const char **s, size_t *n)
{
	struct lg_mp_head h;
	if (mrd_head(r, &h) < 0 || h.kind != LG_MP_STR)
		return -EPROTO;
	*s = (const char *)r->p;
	*n = h.payload;
	r->p += h.payload;
	return 0;
}

static int mrd_bool(struct mrd *r, bool *v)
{
	struct lg_mp_head h;
	if (mrd_head(r, &h) < 0 || h.kind != LG_MP_BOOL)
		return -EPROTO;
	*v = h.val != 0;
	return 0;
}

static bool mrd_nil(struct mrd *r)
{
	if (r->p < r->end && *r->p == 0xc0) {
		r->p++;
		return true;
	}
	return false;
}

static int mrd_skip(struct mrd *r)
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
static int rpc_reply(struct conn *c, const char *method, uint32_t msgid,
		     struct mrd *res)
{
	const uint8_t *obj;
	size_t len;
	int ret = conn_read_obj(c, &obj, &len);
	if (ret < 0)
		return ret;
	struct mrd r = {obj, obj + len};
	uint64_t n, type, id;
	if (mrd_array(&r, &n) < 0 || n != 4 || mrd_uint(&r, &type) < 0 ||
	    type != 1 || mrd_uint(&r, &id) < 0)
		return fail(EPROTO, "%s: %s: not a MessagePack-RPC response",
			    c->name, method);
	if (id != msgid)
		return fail(EPROTO, "%s: %s: reply for msgid %" PRIu64 ", expected"
			    " %u", c->name, method, id, msgid);
	if (!mrd_nil(&r)) {
		char text[256];
		struct lg_text t = {text, sizeof(text), 0};
		text[0] = '\0';
		lg_mp_render(r.p, (size_t)(r.end - r.p), 0, &t);
		return fail(EPROTO, "%s: %s failed: %s", c->name, method, text);
	}
	*res = r;
	return 0;
}

/* --------------------------------------------------- keys and values ---- */

/* Parses "host:port" with a loopback IPv4 host. */
static int addr_parse(const char *s, size_t n, struct addr *a)
{
	if (n == 0 || n >= sizeof(a->text))
		return fail(EINVAL, "address of %zu bytes", n);
	memcpy(a->text, s, n);
	a->text[n] = '\0';
	const char *colon = strrchr(a->text, ':');
	char *end;
	unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
	size_t hl = colon ? (size_t)(colon - a->text) : 0;
	if (!colon || *end || port == 0 || port > 65535 || hl == 0 ||
	    hl >= sizeof(a->host))
		return fail(EINVAL, "'%s' is not host:port", a->text);
	memcpy(a->host, a->text, hl);
	a->host[hl] = '\0';
	a->port = (uint16_t)port;
	if (!host_ok(a->host))
		return fail(EINVAL, "'%s' is not on loopback; this tool talks to"
			    " 127.0.0.0/8 only", a->text);
	return 0;
}

/* The stamp of key k: in the first and last 8 bytes of its value. */
static uint64_t stamp(const struct bench *b, unsigned k)
{
	return (0x9e3779b97f4a7c15ull * (k + 1)) ^ b->o.value_bytes;
}

static void value_fill(const struct bench *b, uint8_t *dst, unsigned k)
{
	uint64_t st = stamp(b, k);
	size_t n = b->o.value_bytes;
	memset(dst, 'a' + (int)(k % 26), n);
	memcpy(dst, &st, 8);
	memcpy(dst + n - 8, &st, 8);
}

static bool value_ok(const struct bench *b, const uint8_t *p, unsigned k)
{
	uint64_t st = stamp(b, k), a, z;
	memcpy(&a, p, 8);
	memcpy(&z, p + b->o.value_bytes - 8, 8);
	return a == st && z == st;
}

void keys_make(struct bench *b)
{
	b->name = pc_xcalloc(b->nkeys, KEY_BYTES_MAX);
	b->name_len = pc_xcalloc(b->nkeys, 1);
	for (unsigned k = 0; k < b->nkeys; k++) {
		int n = snprintf(b->name[k], KEY_BYTES_MAX, "%s:%" PRIu64 ":%u",
				 b->o.prefix, b->o.value_bytes, k);
		PC_ASSERT(n > 0 && n < (int)KEY_BYTES_MAX);
		b->name_len[k] = (uint8_t)n;
	}
}

/* -------------------------------------------------------------- setup ---- */

static unsigned setup_keys_per_request(const struct bench *b)
{
	uint64_t n = SETUP_MSG_BYTES / (b->o.value_bytes + 128);
	return (unsigned)PC_MAX(1, PC_MIN(n, SETUP_CALL_KEYS));
}

/* kv.set of every key on the serving node, in calls under the message limit. */
int setup_p2p(struct bench *b, struct conn *c)
{
	struct wbuf w = {0};
	unsigned per = setup_keys_per_request(b);
	int ret = 0;
	for (unsigned k0 = 0, id = 1; k0 < b->nkeys && ret == 0; k0 += per, id++) {
		unsigned m = PC_MIN(per, b->nkeys - k0);
		rpc_begin(&w, id, "kv.set");
		mp_array(&w, 2);
		mp_array(&w, m);
		for (unsigned k = k0; k < k0 + m; k++)
			mp_str(&w, b->name[k], b->name_len[k]);
		mp_array(&w, m);
		for (unsigned k = k0; k < k0 + m; k++) {
			mp_bin_head(&w, b->o.value_bytes);
			wb_reserve(&w, b->o.value_bytes);
			value_fill(b, w.p + w.len, k);
			w.len += b->o.value_bytes;
		}
		struct mrd r;
		uint64_t n;
		if ((ret = send_all(c, w.p, w.len)) < 0 ||
		    (ret = rpc_reply(c, "kv.set", id, &r)) < 0)
			break;
		if (mrd_array(&r, &n) < 0 || n != m) {
			ret = fail(EPROTO, "kv.set: expected %u results", m);
			break;
		}
		for (unsigned k = k0; k < k0 + m && ret == 0; k++) {
			bool ok;
			if (mrd_bool(&r, &ok) < 0 || !ok)
				ret = fail(ENOSPC, "kv.set refused %s (pool too small"
					   " for the working set?)", b->name[k]);
		}
	}
	free(w.p);
	return ret;
}

/* SET (redis) or set (memcached) of every key, pipelined under the limit. */
int setup_text(struct bench *b, struct conn *c, bool redis)
{
	static const char ok_redis[] = "+OK\r\n", ok_mc[] = "STORED\r\n";
	const char *ok = redis ? ok_redis : ok_mc;
	size_t okn = strlen(ok);
	unsigned per = setup_keys_per_request(b);
	struct wbuf w = {0};
	uint8_t *replies = pc_xcalloc(per, okn);
	struct iovec iov = {0};
	char hdr[160], shown[96];
	int ret = 0;
	for (unsigned k0 = 0; k0 < b->nkeys && ret == 0; k0 += per) {
		unsigned m = PC_MIN(per, b->nkeys - k0);
		w.len = 0;
		for (unsigned k = k0; k < k0 + m; k++) {
			int n = redis ? snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n"
						 "$%u\r\n%s\r\n$%" PRIu64 "\r\n",
						 b->name_len[k], b->name[k],
						 b->o.value_bytes)
				      : snprintf(hdr, sizeof(hdr), "set %s 0 0 %"
						 PRIu64 "\r\n", b->name[k],
						 b->o.value_bytes);
			wb_put(&w, hdr, (size_t)n);
			wb_reserve(&w, b->o.value_bytes + 2);
			value_fill(b, w.p + w.len, k);
			w.len += b->o.value_bytes;
			wb_put(&w, "\r\n", 2);
		}
		size_t got;
		iov = (struct iovec){replies, m * okn};
		if ((ret = send_all(c, w.p, w.len)) < 0)
			break;
		int rret = recv_iov(c, &iov, 1, &got);
		for (unsigned i = 0; i < m && (i + 1) * okn <= got && ret == 0; i++)
			if (memcmp(replies + i * okn, ok, okn) != 0)
				ret = fail(EPROTO, "%s: storing %s: %s...", c->name,
					   b->name[k0 + i],
					   show(replies + i * okn,
						PC_MIN(got - i * okn, 40), shown,
						sizeof(shown)));
		if (ret == 0)
			ret = rret;
	}
	free(w.p);
	free(replies);
	return ret;
}

/* Index of data endpoint text[0..n) in b->peers; adds it when may_add. */
static int peer_index(struct bench *b, const char *text, size_t n, bool may_add)
{
	for (unsigned i = 0; i < b->npeers; i++)
		if (strlen(b->peers[i].text) == n && !memcmp(b->peers[i].text, text, n))
			return (int)i;
	if (!may_add)
		return fail(EPROTO, "a record names data endpoint %.*s, unknown at"
			    " setup", (int)n, text);
	if (b->npeers == MEMBERS_MAX)
		return fail(ENOSPC, "more than %u data endpoints", MEMBERS_MAX);
	int ret = addr_parse(text, n, &b->peers[b->npeers]);
	return ret < 0 ? ret : (int)b->npeers++;
}

/* One record [node, data, addr, rkey, len, gen, resident]. */
static int rec_read(struct bench *b, struct mrd *r, struct rec *out,
		    bool may_add)
{
	uint64_t n, addr, rkey, len, gen;
	const char *node, *data;
	size_t nn, dn;
	bool resident;
	if (mrd_array(r, &n) < 0 || n != 7 || mrd_str(r, &node, &nn) < 0 ||
	    mrd_str(r, &data, &dn) < 0 || mrd_uint(r, &addr) < 0 ||
	    mrd_uint(r, &rkey) < 0 || mrd_uint(r, &len) < 0 ||
	    mrd_uint(r, &gen) < 0 || mrd_bool(r, &resident) < 0 ||
	    rkey > UINT32_MAX || len > UINT32_MAX)
		return fail(EPROTO, "dir.get: a record is not [node, data, addr,"
			    " rkey, len, gen, resident]");
	int p = peer_index(b, data, dn, may_add);
	if (p < 0)
		return p;
	*out = (struct rec){.addr = addr, .gen = gen, .rkey = (uint32_t)rkey,
			    .len = (uint32_t)len, .peer = (uint8_t)p,
			    .found = true};
	return 0;
}

/* cluster.members -> b->members (every id a loopback host:port). */
static int learn_members(struct bench *b, struct conn *c)
{
	struct wbuf w = {0};
	struct mrd r;
	uint64_t n;
	rpc_begin(&w, 1, "cluster.members");
	mp_array(&w, 0);
	int ret = send_all(c, w.p, w.len);
	free(w.p);
	if (ret < 0 || (ret = rpc_reply(c, "cluster.members", 1, &r)) < 0)
		return ret;
	if (mrd_array(&r, &n) < 0 || n == 0 || n > MEMBERS_MAX)
		return fail(EPROTO, "cluster.members: expected 1..%u members",
			    MEMBERS_MAX);
	for (unsigned i = 0; i < n; i++) {
		struct lg_mp_head h;
		const char *id = NULL, *s;
		size_t idn = 0, sn;
		if (mrd_head(&r, &h) < 0 || h.kind != LG_MP_MAP)
			return fail(EPROTO, "cluster.members: member %u is not a map", i);
		for (uint64_t j = 0; j < h.val; j++) {
			if (mrd_str(&r, &s, &sn) < 0)
				return fail(EPROTO, "cluster.members: a key is not a str");
			if (sn == 2 && !memcmp(s, "id", 2)) {
				if (mrd_str(&r, &id, &idn) < 0)
					return fail(EPROTO, "cluster.members: id not a str");
			} else if (mrd_skip(&r) < 0) {
				return fail(EPROTO, "cluster.members: malformed");
			}
		}
		if (!id)
			return fail(EPROTO, "cluster.members: member %u has no id", i);
		if ((ret = addr_parse(id, idn, &b->members[i])) < 0)
			return ret;
	}
	b->nmembers = (unsigned)n;
	return 0;
}

/*
 * Learns every key's record: asks each member dir.get for all keys and keeps
 * the first record found, and which member answered it (the owner a reader
 * asks). Every key must be known to some owner, with a payload of
 * value_bytes.
 */
int learn_records(struct bench *b, struct conn *seed)
{
	int ret = learn_members(b, seed);
	if (ret < 0)
		return ret;
	b->recs = pc_xcalloc(b->nkeys, sizeof(*b->recs));
	struct wbuf w = {0};
	for (unsigned m = 0; m < b->nmembers && ret == 0; m++) {
		struct conn c;
		if ((ret = conn_open(&c, "member", b->members[m].host,
				     b->members[m].port, b->o.timeout_ms)) < 0)
			break;
		for (unsigned k0 = 0, id = 1; k0 < b->nkeys && ret == 0;
		     k0 += DIR_CHUNK_KEYS, id++) {
			unsigned cnt = PC_MIN(DIR_CHUNK_KEYS, b->nkeys - k0);
			struct mrd r;
			uint64_t n;
			rpc_begin(&w, id, "dir.get");
			mp_array(&w, 1);
			mp_array(&w, cnt);
			for (unsigned k = k0; k < k0 + cnt; k++)
				mp_str(&w, b->name[k], b->name_len[k]);
			if ((ret = send_all(&c, w.p, w.len)) < 0 ||
			    (ret = rpc_reply(&c, "dir.get", id, &r)) < 0)
				break;
			if (mrd_array(&r, &n) < 0 || n != cnt) {
				ret = fail(EPROTO, "dir.get: expected %u entries", cnt);
				break;
			}
			for (unsigned k = k0; k < k0 + cnt && ret == 0; k++) {
				struct rec rec;
				if (mrd_nil(&r))
					continue;
				if ((ret = rec_read(b, &r, &rec, true)) < 0)
					break;
				if (!b->recs[k].found) {
					rec.owner = (uint8_t)m;
					b->recs[k] = rec;
				}
			}
		}
		conn_close(&c);
	}
	free(w.p);
	for (unsigned k = 0; k < b->nkeys && ret == 0; k++) {
		if (!b->recs[k].found)
			ret = fail(ENOENT, "no directory owner knows %s (stored? "
				   "evicted?)", b->name[k]);
		else if (b->recs[k].len != b->o.value_bytes)
			ret = fail(EPROTO, "%s: the record says %u bytes, not %"
				   PRIu64, b->name[k], b->recs[k].len,
				   b->o.value_bytes);
	}
	return ret;
}

/* The key pools batches draw from (see struct bench). */
int pools_make(struct bench *b)
{
	b->npools = b->o.target == T_DIR ? b->nmembers : 1;
	for (unsigned p = 0; p < b->npools; p++)
		b->pool[p] = pc_xcalloc(b->nkeys, sizeof(unsigned));
	for (unsigned k = 0; k < b->nkeys; k++) {
		unsigned p = b->o.target == T_DIR ? b->recs[k].owner : 0;
		b->pool[p][b->npool[p]++] = k;
	}
	/* Drop empty pools (a member that owns none of our keys). */
	unsigned kept = 0;
	for (unsigned p = 0; p < b->npools; p++) {
		if (b->npool[p] >= b->o.batch) {
			b->pool[kept] = b->pool[p];
			b->npool[kept++] = b->npool[p];
		} else {
			free(b->pool[p]);
		}
	}
	b->npools = kept;
	if (!kept)
		return fail(EINVAL, "no owner holds --batch %u of the keys; raise"
			    " --keys", b->o.batch);
	return 0;
}

/* ------------------------------------------------ batches, per target ---- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* batch distinct random keys of pool p: a partial Fisher-Yates shuffle that
 * carries on from the previous draw, O(batch) and uniform. */
static void pick_keys(struct worker *w, struct slot *s, unsigned p)
{
	unsigned n = w->b->npool[p], *perm = w->perm[p];
	for (unsigned i = 0; i < w->b->o.batch; i++) {
		unsigned j = i + (unsigned)(((rng_next(&w->rng) >> 32) * (n - i)) >> 32);
		unsigned t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
		s->keys[i] = perm[i];
	}
}

static uint8_t *item_dst(const struct worker *w, const struct slot *s, unsigned j)
{
	return s->dst + (size_t)j * w->b->o.value_bytes;
}

/* --- p2p ---------------------------------------------------------------- */

/* dir.get of the slot's keys on their owners; the records go to s->recs. */
static int p2p_lookup(struct worker *w, struct slot *s)
{
	struct bench *b = w->b;
	unsigned batch = b->o.batch;
	uint32_t ids[MEMBERS_MAX];
	unsigned cnt[MEMBERS_MAX] = {0};
	int ret;
	for (unsigned j = 0; j < batch; j++)
		cnt[b->recs[s->keys[j]].owner]++;
	for (unsigned m = 0; m < b->nmembers; m++) {
		if (!cnt[m])
			continue;
		ids[m] = ++w->msgid;
		rpc_begin(&w->req, ids[m], "dir.get");
		mp_array(&w->req, 1);
		mp_array(&w->req, cnt[m]);
		for (unsigned j = 0; j < batch; j++) {
			unsigned k = s->keys[j];
			if (b->recs[k].owner == m)
				mp_str(&w->req, b->name[k], b->name_len[k]);
		}
		if ((ret = send_all(&w->rpc[m], w->req.p, w->req.len)) < 0)
			return ret;
	}
	for (unsigned m = 0; m < b->nmembers; m++) {
		struct mrd r;
		uint64_t n;
		if (!cnt[m])
			continue;
		if ((ret = rpc_reply(&w->rpc[m], "dir.get", ids[m], &r)) < 0)
			return ret;
		if (mrd_array(&r, &n) < 0 || n != cnt[m])
			return fail(EPROTO, "dir.get: expected %u entries", cnt[m]);
		for (unsigned j = 0; j < batch; j++) {
			unsigned k = s->keys[j];
			if (b->recs[k].owner != m)
				continue;
			if (mrd_nil(&r))
				return fail(ENOENT, "dir.get: %s not found", b->name[k]);
			if ((ret = rec_read(b, &r, &s->recs[j], false)) < 0)
				return ret;
			if (s->recs[j].len != b->o.value_bytes)
				return fail(EPROTO, "dir.get: %s is %u bytes now",
					    b->name[k], s->recs[j].len);
		}
	}
	return 0;
}

int p2p_issue(struct worker *w, struct slot *s)
{
	struct bench *b = w->b;
	int ret;
	pick_keys(w, s, 0);
	if (b->o.lookup) {
		if ((ret = p2p_lookup(w, s)) < 0)
			return ret;
	} else {
		for (unsigned j = 0; j < b->o.batch; j++)
			s->recs[j] = b->recs[s->keys[j]];
	}
	s->id_base = w->seq;
	w->seq += b->o.batch;
	/* Per data endpoint, its items in batch order: one send each. */
	for (unsigned p = 0; p < b->npeers; p++) {
		w->req.len = 0;
		for (unsigned j = 0; j < b->o.batch; j++) {
			const struct rec *r = &s->recs[j];
			if (r->peer != p)
				continue;
			struct dp_req q = {
				.magic = htole32(DP_MAGIC_REQ),
				.op = htole16(DP_OP_READ),
				.rkey = htole32(r->rkey),
				.len = htole32(PAGE_HDR_BYTES + r->len),
				.addr = htole64(r->addr),
				.id = htole64(s->id_base + j),
			};
			wb_put(&w->req, &q, sizeof(q));
		}
		if (w->req.len && (ret = send_all(&w->data[p], w->req.p, w->req.len)) < 0)
			return ret;
	}
	return 0;
}

/* Checks the items of endpoint p whose bytes all arrived (got of them). */
static int p2p_check(struct worker *w, struct slot *s, unsigned p, size_t got)
{
	const struct bench *b = w->b;
	size_t off = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		const struct rec *r = &s->recs[j];
		if (r->peer != p)
			continue;
		const uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		struct dp_resp q;
		struct page_hdr ph;
		if (off + sizeof(q) > got)
			return 0;
		memcpy(&q, h, sizeof(q));
		if (le32toh(q.magic) != DP_MAGIC_RESP)
			return fail(EPROTO, "%s: read of %s: not a data response",
				    w->data[p].name, b->name[s->keys[j]]);
		if (le64toh(q.id) != s->id_base + j)
			return fail(EPROTO, "%s: read of %s: response id %" PRIu64
				    ", expected %" PRIu64, w->data[p].name,
				    b->name[s->keys[j]], (uint64_t)le64toh(q.id),
				    s->id_base + j);
		if ((int32_t)le32toh((uint32_t)q.status) != 0)
			return fail(EPROTO, "%s: read of %s refused: %s",
				    w->data[p].name, b->name[s->keys[j]],
				    strerror(-(int32_t)le32toh((uint32_t)q.status)));
		if (le64toh(q.len) != PAGE_HDR_BYTES + r->len)
			return fail(EPROTO, "%s: read of %s: %" PRIu64 " bytes, "
				    "expected %u", w->data[p].name,
				    b->name[s->keys[j]], (uint64_t)le64toh(q.len),
				    PAGE_HDR_BYTES + r->len);
		off += sizeof(q) + PAGE_HDR_BYTES + r->len;
		if (off > got)
			return 0;
		memcpy(&ph, h + sizeof(q), sizeof(ph));
		if (le32toh(ph.magic) != PAGE_MAGIC || le64toh(ph.len) != r->len ||
		    le64toh(ph.gen) != r->gen)
			return fail(ESTALE, "%s: %s: page header does not match the "
				    "record (magic %08x, gen %" PRIu64 "/%" PRIu64
				    ", len %" PRIu64 "/%u)", w->data[p].name,
				    b->name[s->keys[j]], le32toh(ph.magic),
				    (uint64_t)le64toh(ph.gen), r->gen,
				    (uint64_t)le64toh(ph.len), r->len);
		if (!value_ok(b, item_dst(w, s, j), s->keys[j]))
			return fail(EPROTO, "%s: %s: payload of another key",
				    w->data[p].name, b->name[s->keys[j]]);
	}
	return 0;
}

int p2p_complete(struct worker *w, struct slot *s, struct slot **done)
{
	const struct bench *b = w->b;
	*done = s;
	for (unsigned p = 0; p < b->npeers; p++) {
		unsigned n = 0;
		for (unsigned j = 0; j < b->o.batch; j++) {
			if (s->recs[j].peer != p)
				continue;
			uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
			w->iov[n++] = (struct iovec){h, sizeof(struct dp_resp) +
							 PAGE_HDR_BYTES};
			w->iov[n++] = (struct iovec){item_dst(w, s, j),
						     s->recs[j].len};
		}
		if (!n)
			continue;
		size_t got;
		int ret = recv_iov(&w->data[p], w->iov, n, &got);
		int chk = p2p_check(w, s, p, got);
		if (chk < 0 || ret < 0)
			return chk < 0 ? chk : ret;
	}
	return 0;
}

/* --- redis, memcached ---------------------------------------------------- */

/* Text framing is built with memcpy, not snprintf: the client's CPU is the
 * servers' CPU on this machine, and every target should cost it alike. */
static size_t put_dec(char *out, uint64_t v)
{
	char t[24];
	size_t n = 0;
	do
		t[n++] = (char)('0' + v % 10);
	while ((v /= 10));
	for (size_t i = 0; i < n; i++)
		out[i] = t[n - 1 - i];
	return n;
}

int redis_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	char t[KEY_BYTES_MAX + 40];
	pick_keys(w, s, 0);
	w->req.len = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		unsigned k = s->keys[j];
		size_t n = sizeof("*2\r\n$3\r\nGET\r\n$") - 1;
		memcpy(t, "*2\r\n$3\r\nGET\r\n$", n);
		n += put_dec(t + n, b->name_len[k]);
		memcpy(t + n, "\r\n", 2);
		memcpy(t + n + 2, b->name[k], b->name_len[k]);
		n += 2 + b->name_len[k];
		memcpy(t + n, "\r\n", 2);
		wb_put(&w->req, t, n + 2);
	}
	return send_all(&w->srv, w->req.p, w->req.len);
}

int mc_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	pick_keys(w, s, 0);
	w->req.len = 0;
	wb_put(&w->req, "get", 3);
	for (unsigned j = 0; j < b->o.batch; j++) {
		unsigned k = s->keys[j];
		wb_put(&w->req, " ", 1);
		wb_put(&w->req, b->name[k], b->name_len[k]);
	}
	wb_put(&w->req, "\r\n", 2);
	return send_all(&w->srv, w->req.p, w->req.len);
}

/* What a hit of item j looks like before its value: "$N\r\n" (redis) or
 * "VALUE <key> 0 N\r\n" (memcached); out holds ITEM_TAIL_OFF bytes. */
static size_t text_head(const struct worker *w, const struct slot *s,
			unsigned j, char *out)
{
	const struct bench *b = w->b;
	unsigned k = s->keys[j];
	if (b->o.target == T_REDIS) {
		memcpy(out, w->size_text, w->size_text_len);
		return w->size_text_len;
	}
	memcpy(out, "VALUE ", 6);
	memcpy(out + 6, b->name[k], b->name_len[k]);
	memcpy(out + 6 + b->name_len[k], w->size_text, w->size_text_len);
	return 6 + b->name_len[k] + w->size_text_len;
}

/* redis: "$N\r\n" value "\r\n" per key; memcached: "VALUE k 0 N\r\n" value
 * "\r\n" per key, then "END\r\n". */
int text_complete(struct worker *w, struct slot *s, struct slot **done)
{
	const struct bench *b = w->b;
	*done = s;
	bool mc = b->o.target == T_MEMCACHED;
	char want[ITEM_TAIL_OFF], shown[160];
	size_t hl[BATCH_MAX];
	unsigned n = 0;
	for (unsigned j = 0; j < b->o.batch; j++) {
		uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		hl[j] = text_head(w, s, j, want);
		w->iov[n++] = (struct iovec){h, hl[j]};
		w->iov[n++] = (struct iovec){item_dst(w, s, j), b->o.value_bytes};
		w->iov[n++] = (struct iovec){h + ITEM_TAIL_OFF, 2};
	}
	uint8_t *end = s->hdr + (size_t)b->o.batch * ITEM_HDR_BYTES;
	if (mc)
		w->iov[n++] = (struct iovec){end, 5};
	size_t got, off = 0;
	int ret = recv_iov(&w->srv, w->iov, n, &got);
	for (unsigned j = 0; j < b->o.batch && off < got; j++) {
		const uint8_t *h = s->hdr + (size_t)j * ITEM_HDR_BYTES;
		unsigned k = s->keys[j];
		size_t have = PC_MIN(hl[j], got - off);
		text_head(w, s, j, want);
		/* Even a partial head can show a miss ("$-1", no VALUE line). */
		if (memcmp(h, want, have) != 0)
			return fail(EPROTO, "%s: %s: expected \"%.*s...\", got \"%s"
				    "...\" (a miss?)", w->srv.name, b->name[k],
				    (int)(hl[j] - 2), want,
				    show(h, have, shown, sizeof(shown)));
		off += hl[j] + b->o.value_bytes + 2;
		if (off > got)
			return ret;
		if (memcmp(h + ITEM_TAIL_OFF, "\r\n", 2) != 0 ||
		    !value_ok(b, item_dst(w, s, j), k))
			return fail(EPROTO, "%s: %s: wrong value", w->srv.name,
				    b->name[k]);
	}
	if (mc && off + 5 <= got && memcmp(end, "END\r\n", 5) != 0)
		return fail(EPROTO, "%s: multi-get not closed by END", w->srv.name);
	return ret;
}

/* --- tcp ----------------------------------------------------------------- */

int tcp_issue(struct worker *w, struct slot *s)
{
	(void)s; /* every batch asks the same */
	uint64_t ask = htole64((uint64_t)w->b->o.batch * w->b->o.value_bytes);
	return send_all(&w->srv, &ask, sizeof(ask));
}

int tcp_complete(struct worker *w, struct slot *s, struct slot **done)
{
	size_t got;
	*done = s;
	w->iov[0] = (struct iovec){s->dst,
				   (size_t)w->b->o.batch * w->b->o.value_bytes};
	return recv_iov(&w->srv, w->iov, 1, &got);
}

/* --- dir ----------------------------------------------------------------- */

int dir_issue(struct worker *w, struct slot *s)
{
	const struct bench *b = w->b;
	unsigned p = w->next_pool++ % b->npools;
	pick_keys(w, s, p);
	s->msgid = ++w->msgid;
	rpc_begin(&w->req, s->msgid, "dir.get");
	mp_array(&w->req, 1);
	mp_array(&w->req, b->o.batch);
	for (unsigned j = 0; j < b->o.batch; j++)
		mp_str(&w->req, b->name[s->keys[j]], b->name_len[s->keys[j]]);
	return send_all(&w->rpc[b->recs[s->keys[0]].owner], w->req.p, w->req.len);
}

/* Replies on one connection may come back in any order: the one that came
 * is matched by msgid among the slots in flight to that member. */
int dir_complete(struct worker *w, struct slot *oldest, struct slot **done)
{
	struct bench *b = w->b;
	unsigned m = b->recs[oldest->keys[0]].owner;
	struct conn *c = &w->rpc[m];
	const uint8_t *obj;
	size_t len;
	uint64_t n, type, id;
	int ret = conn_read_obj(c, &obj, &len);
	if (ret < 0)
		return ret;
	struct mrd r = {obj, obj + len};
	if (mrd_array(&r, &n) < 0 || n != 4 || mrd_uint(&r, &type) < 0 ||
	    type != 1 || mrd_uint(&r, &id) < 0)
		return fail(EPROTO, "%s: not a MessagePack-RPC response", c->name);
	struct slot *s = NULL;
	for (unsigned i = 0; i < w->nfifo && !s; i++) {
		struct slot *t = &w->slots[w->fifo[i]];
		if (t->msgid == id && b->recs[t->keys[0]].owner == m)
			s = t;
	}
	if (!s)
		return fail(EPROTO, "%s: reply for msgid %" PRIu64 ", not in flight",
			    c->name, id);
	if (!mrd_nil(&r) || mrd_array(&r, &n) < 0 || n != b->o.batch)
		return fail(EPROTO, "%s: dir.get failed or answered the wrong "
			    "count", c->name);
	for (unsigned j = 0; j < b->o.batch; j++) {
		const struct rec *want = &b->recs[s->keys[j]];
		struct rec got;
		if (mrd_nil(&r))
			return fail(ENOENT, "%s: dir.get: %s not found", c->name,
				    b->name[s->keys[j]]);
		if ((ret = rec_read(b, &r, &got, false)) < 0)
			return ret;
		if (got.addr != want->addr || got.gen != want->gen ||
		    got.len != want->len)
			return fail(ESTALE, "%s: dir.get: %s changed since setup",
				    c->name, b->name[s->keys[j]]);
	}
	*done = s;
	return 0;
}

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
int serve_tcp(const struct opts *o)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
	socklen_t sl = sizeof(sa);
	int one = 1;
	if (!host_ok(o->host) || inet_pton(AF_INET, o->host, &sa.sin_addr) != 1)
		return fail(EINVAL, "--host %s: not a loopback IPv4 address", o->host);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 128) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0)
		return fail(errno, "listen on %s:%u: %s", o->host, o->port,
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
			return fail(errno, "accept: %s", strerror(errno));
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
