/*
 * bench/p2p_bench.c — pc-p2p-bench, one load generator for the p2p read path
 * and for the servers it is compared with (memcached, redis, a plain socket).
 *
 * Owns: the client side of bench/p2p_bench.sh. Threads: main parses the
 * options, stores the values (setup), learns the directory records, connects
 * every worker and starts them; each worker owns its connections, buffers and
 * histogram outright (no locks, nothing shared on the hot path but the
 * read-only key table and records); main joins them and reports.
 *
 * A worker runs a closed loop of batches: --pipeline batches in flight per
 * worker, a new one issued each time the oldest completes. One batch is
 * --batch distinct random keys:
 *   p2p        dir.get of the batch on each key's directory owner (MessagePack-
 *              RPC; skipped with --no-lookup, records cached from setup), then
 *              one READ per page pipelined on the worker's data connection to
 *              the producer, as a reading node does;
 *   redis      --batch pipelined GETs (RESP);
 *   memcached  one multi-get "get k1 ... kB" (text protocol);
 *   tcp        8 bytes asking our --serve-tcp sink for batch x value bytes;
 *   dir        dir.get of the batch only, keys/s (no payload).
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
 * A failure stops the worker with a message naming the item; main reports it
 * and exits 1.
 *
 * Invariants: at most THREADS_MAX workers, PIPELINE_MAX batches in flight,
 * BATCH_MAX keys per batch, MEMBERS_MAX members and data endpoints; every
 * wait is bounded (--timeout of silence on a socket); only loopback
 * addresses are contacted, including every member and data endpoint the node
 * names; no allocation after the workers start but an RPC connection's
 * reply buffer on first use; sizes a peer declares are checked before use
 * (lg_mp_skip fails a reply over RPC_REPLY_MAX as soon as its header says
 * so; payload lengths must equal what was stored).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
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

#include "lg_hist.h"
#include "lg_msgpack.h"
#include "common/util.h"

#define THREADS_MAX 64u
#define PIPELINE_MAX 64u
#define BATCH_MAX 1024u
#define MEMBERS_MAX 16u          /* ring members and data endpoints */
#define KEY_BYTES_MAX 48u
#define KEYS_MAX (4u << 20)
#define VALUE_BYTES_MIN 16u      /* room for the two 8-byte stamps */
#define VALUE_BYTES_MAX (64ull << 20)
#define SETUP_MSG_BYTES (48u << 20) /* one setup request: under the node's
				     * rpc_max_message_bytes (64 MiB) */
#define RPC_REPLY_MAX (2u << 20) /* largest reply we take (dir.get: 4096
				  * records of ~70 bytes at setup) */
#define SETUP_CALL_KEYS 1024u
#define DIR_CHUNK_KEYS 4096u     /* keys per dir.get while learning records */
#define DST_BYTES_MAX (4ull << 30) /* destination memory over all workers */
#define ITEM_HDR_BYTES 128u      /* framing bytes of one item: head + tail */
#define ITEM_TAIL_OFF 120u       /* where an item's trailing "\r\n" goes */
#define SERVE_BUF_BYTES (4u << 20)
#define SERVE_ASK_MAX (1ull << 32)

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

/* ------------------------------------------------------------ options ---- */

enum target_id { T_P2P, T_REDIS, T_MEMCACHED, T_TCP, T_DIR };

struct opts {
	enum target_id target;
	const char *target_name;
	const char *host;
	uint16_t port;
	unsigned threads;
	unsigned batch;
	unsigned pipeline;
	uint64_t value_bytes;
	unsigned keys;
	double duration_s;
	double warmup_s;
	unsigned timeout_ms;
	bool lookup;     /* p2p: dir.get per batch (false: records cached) */
	bool setup;      /* store the values first */
	bool run;        /* then measure */
	bool json;
	bool serve_tcp;
	const char *prefix;
	uint64_t seed;
};

/* ------------------------------------------------------------- errors ---- */

/* The last failure of this thread, shown by whoever reports it. */
static _Thread_local char t_err[512];

/* Records a failure message; returns -err (err a positive errno). */
PC_PRINTF(2, 3) static int fail(int err, const char *fmt, ...)
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

struct conn {
	int fd;
	unsigned timeout_ms;
	char name[80];      /* "what host:port", for messages */
	uint8_t *rbuf;      /* RPC replies received but not consumed */
	size_t rbeg, rend;
};

/* Loopback only: this tool never sends traffic anywhere else. */
static bool host_ok(const char *host)
{
	struct in_addr a;
	return inet_pton(AF_INET, host, &a) == 1 &&
	       (ntohl(a.s_addr) >> 24) == 127;
}

static int conn_open(struct conn *c, const char *what, const char *host,
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

static void conn_close(struct conn *c)
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

/* A growable request buffer; grows at setup and on a worker's first batch. */
struct wbuf {
	uint8_t *p;
	size_t len, cap;
};

static void wb_reserve(struct wbuf *b, size_t more)
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

struct addr {
	char text[64];  /* "host:port" as the node wrote it */
	char host[INET_ADDRSTRLEN];
	uint16_t port;
};

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

/* Where a page lives, from dir.get. */
struct rec {
	uint64_t addr;
	uint64_t gen;
	uint32_t rkey;
	uint32_t len;
	uint8_t peer;   /* index into bench.peers */
	uint8_t owner;  /* index into bench.members: who answered */
	bool found;
};

struct bench {
	struct opts o;
	unsigned nkeys;
	char (*name)[KEY_BYTES_MAX];
	uint8_t *name_len;
	struct rec *recs;                   /* p2p, dir */
	struct addr members[MEMBERS_MAX];   /* RPC endpoints of the ring */
	unsigned nmembers;
	struct addr peers[MEMBERS_MAX];     /* data endpoints */
	unsigned npeers;
	/* Keys the batches draw from: dir draws each batch from one owner's
	 * keys (one call per batch); the other targets from pool 0, all keys. */
	unsigned *pool[MEMBERS_MAX];
	unsigned npool[MEMBERS_MAX];
	unsigned npools;
	uint64_t t_measure, t_end;          /* the measured window, ns */
	double setup_s;
};

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

static void keys_make(struct bench *b)
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
static int setup_p2p(struct bench *b, struct conn *c)
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
static int setup_text(struct bench *b, struct conn *c, bool redis)
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
static int learn_records(struct bench *b, struct conn *seed)
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
static int pools_make(struct bench *b)
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

/* ------------------------------------------------------------ workers ---- */

/* One batch in flight. */
struct slot {
	unsigned *keys;      /* batch keys */
	struct rec *recs;    /* p2p: the records the reads use */
	uint8_t *hdr;        /* ITEM_HDR_BYTES of framing per item, + tail */
	uint8_t *dst;        /* batch x value_bytes: payloads land here */
	uint64_t t_issue;
	uint64_t id_base;    /* p2p: data request id of item 0 */
	uint32_t msgid;      /* dir */
};

struct worker {
	struct bench *b;
	unsigned idx;
	pthread_t th;
	struct conn rpc[MEMBERS_MAX];   /* p2p, dir: one per member */
	struct conn data[MEMBERS_MAX];  /* p2p: one per data endpoint */
	struct conn srv;                /* redis, memcached, tcp */
	struct slot *slots;
	unsigned fifo[PIPELINE_MAX];    /* slots in flight, oldest first */
	unsigned nfifo;
	unsigned *perm[MEMBERS_MAX];    /* per pool: partial Fisher-Yates state */
	struct wbuf req;
	struct iovec *iov;              /* 3 per item + 1 */
	char size_text[40];             /* "$N\r\n" (redis), " 0 N\r\n" (memcached) */
	size_t size_text_len;
	uint64_t rng;
	uint64_t seq;                   /* next data request id */
	uint32_t msgid;
	unsigned next_pool;
	struct lg_hist hist;
	uint64_t batches, items, bytes;
	int rc;
	char err[512];
};

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

static int p2p_issue(struct worker *w, struct slot *s)
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

static int p2p_complete(struct worker *w, struct slot *s, struct slot **done)
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

static int redis_issue(struct worker *w, struct slot *s)
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

static int mc_issue(struct worker *w, struct slot *s)
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
static int text_complete(struct worker *w, struct slot *s, struct slot **done)
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

static int tcp_issue(struct worker *w, struct slot *s)
{
	(void)s; /* every batch asks the same */
	uint64_t ask = htole64((uint64_t)w->b->o.batch * w->b->o.value_bytes);
	return send_all(&w->srv, &ask, sizeof(ask));
}

static int tcp_complete(struct worker *w, struct slot *s, struct slot **done)
{
	size_t got;
	*done = s;
	w->iov[0] = (struct iovec){s->dst,
				   (size_t)w->b->o.batch * w->b->o.value_bytes};
	return recv_iov(&w->srv, w->iov, 1, &got);
}

/* --- dir ----------------------------------------------------------------- */

static int dir_issue(struct worker *w, struct slot *s)
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
static int dir_complete(struct worker *w, struct slot *oldest, struct slot **done)
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

/* --- the loop ------------------------------------------------------------ */

/* How each target issues a batch and receives the oldest one's reply. */
struct target_ops {
	const char *name;
	int (*issue)(struct worker *w, struct slot *s);
	/* Receives a reply on the connection of the oldest batch in flight;
	 * *done is the batch it completed (the oldest, but for dir). */
	int (*complete)(struct worker *w, struct slot *oldest, struct slot **done);
	bool payload;  /* counts value bytes (all but dir) */
};

static const struct target_ops targets[] = {
	[T_P2P] = {"p2p", p2p_issue, p2p_complete, true},
	[T_REDIS] = {"redis", redis_issue, text_complete, true},
	[T_MEMCACHED] = {"memcached", mc_issue, text_complete, true},
	[T_TCP] = {"tcp", tcp_issue, tcp_complete, true},
	[T_DIR] = {"dir", dir_issue, dir_complete, false},
};

static int worker_run(struct worker *w)
{
	struct bench *b = w->b;
	const struct target_ops *t = &targets[b->o.target];
	int ret;
	for (unsigned i = 0; i < b->o.pipeline; i++) {
		w->slots[i].t_issue = pc_now_ns();
		if ((ret = t->issue(w, &w->slots[i])) < 0)
			return ret;
		w->fifo[w->nfifo++] = i;
	}
	for (;;) {
		struct slot *s;
		if ((ret = t->complete(w, &w->slots[w->fifo[0]], &s)) < 0)
			return ret;
		uint64_t now = pc_now_ns();
		unsigned si = (unsigned)(s - w->slots), i = 0;
		while (w->fifo[i] != si)
			i++;
		memmove(&w->fifo[i], &w->fifo[i + 1],
			(w->nfifo - i - 1) * sizeof(w->fifo[0]));
		w->nfifo--;
		if (now >= b->t_measure && now <= b->t_end) {
			w->batches++;
			w->items += b->o.batch;
			if (t->payload)
				w->bytes += (uint64_t)b->o.batch * b->o.value_bytes;
			lg_hist_record(&w->hist, now - s->t_issue);
		}
		if (now >= b->t_end)
			return 0;
		s->t_issue = now;
		if ((ret = t->issue(w, s)) < 0)
			return ret;
		w->fifo[w->nfifo++] = si;
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	w->rc = worker_run(w);
	if (w->rc < 0)
		snprintf(w->err, sizeof(w->err), "%s", t_err);
	return NULL;
}

/* Connections and buffers, made before any worker starts. */
static int worker_init(struct worker *w, struct bench *b, unsigned idx)
{
	const struct opts *o = &b->o;
	int ret = 0;
	w->b = b;
	w->idx = idx;
	w->rng = (o->seed + idx + 1) * 0x9e3779b97f4a7c15ull | 1;
	w->srv.fd = -1;
	for (unsigned m = 0; m < MEMBERS_MAX; m++)
		w->rpc[m].fd = w->data[m].fd = -1;
	if (o->target == T_P2P || o->target == T_DIR) {
		for (unsigned m = 0; m < b->nmembers && ret == 0; m++)
			ret = conn_open(&w->rpc[m], "rpc", b->members[m].host,
					b->members[m].port, o->timeout_ms);
		for (unsigned p = 0; p < b->npeers && ret == 0 && o->target == T_P2P; p++)
			ret = conn_open(&w->data[p], "data", b->peers[p].host,
					b->peers[p].port, o->timeout_ms);
	} else {
		ret = conn_open(&w->srv, o->target_name, o->host, o->port,
				o->timeout_ms);
	}
	if (ret < 0)
		return ret;
	w->size_text_len = (size_t)snprintf(w->size_text, sizeof(w->size_text),
					    o->target == T_REDIS ? "$%" PRIu64 "\r\n"
								 : " 0 %" PRIu64 "\r\n",
					    o->value_bytes);
	w->iov = pc_xcalloc(3u * o->batch + 1, sizeof(*w->iov));
	w->slots = pc_xcalloc(o->pipeline, sizeof(*w->slots));
	for (unsigned i = 0; i < o->pipeline; i++) {
		struct slot *s = &w->slots[i];
		s->keys = pc_xcalloc(o->batch, sizeof(*s->keys));
		s->recs = pc_xcalloc(o->batch, sizeof(*s->recs));
		s->hdr = pc_xcalloc((size_t)o->batch + 1, ITEM_HDR_BYTES);
		if (targets[o->target].payload) {
			/* Touched now, so page faults stay out of the run. */
			s->dst = pc_xcalloc(o->batch, o->value_bytes);
			memset(s->dst, 0xee, (size_t)o->batch * o->value_bytes);
		}
	}
	for (unsigned p = 0; p < b->npools; p++) {
		w->perm[p] = pc_xcalloc(b->npool[p], sizeof(unsigned));
		memcpy(w->perm[p], b->pool[p], b->npool[p] * sizeof(unsigned));
	}
	wb_reserve(&w->req, (size_t)o->batch * (KEY_BYTES_MAX + 40) + 64);
	return 0;
}

static void worker_free(struct worker *w)
{
	for (unsigned m = 0; m < MEMBERS_MAX; m++) {
		conn_close(&w->rpc[m]);
		conn_close(&w->data[m]);
	}
	conn_close(&w->srv);
	for (unsigned i = 0; w->slots && i < w->b->o.pipeline; i++) {
		free(w->slots[i].keys);
		free(w->slots[i].recs);
		free(w->slots[i].hdr);
		free(w->slots[i].dst);
	}
	for (unsigned p = 0; p < MEMBERS_MAX; p++)
		free(w->perm[p]);
	free(w->slots);
	free(w->iov);
	free(w->req.p);
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
static int serve_tcp(const struct opts *o)
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

/* ------------------------------------------------------------ options ---- */

static void usage(FILE *out)
{
	fprintf(out,
		"usage: pc-p2p-bench --target T --port P [options]\n"
		"       pc-p2p-bench --serve-tcp [--port P]\n"
		"\n"
		"One closed-loop load generator for the p2p read path and the servers\n"
		"it is compared with. Per batch of --batch distinct random keys:\n"
		"  p2p        dir.get of the batch on the key owners, then one READ per\n"
		"             page pipelined on the data port (--port: the node's RPC)\n"
		"  redis      pipelined GET of each key (RESP)\n"
		"  memcached  one multi-get 'get k1 ... kB' (text protocol)\n"
		"  tcp        batch x value bytes from a --serve-tcp sink\n"
		"  dir        dir.get of the batch only; keys/s\n"
		"Payloads are received straight into each thread's destination buffer.\n"
		"\n"
		"  --target T         p2p | redis | memcached | tcp | dir (required)\n"
		"  --host H           server address, loopback only (default 127.0.0.1)\n"
		"  --port P           RPC port (p2p, dir), server port, or sink port\n"
		"  --threads T        reader threads, one connection each (default 1, max %u)\n"
		"  --batch B          keys per batch (default 32, max %u)\n"
		"  --pipeline P       batches in flight per thread (default 1, max %u)\n"
		"  --value-bytes N    value size, suffixes k m (KiB, MiB) (default 1m;\n"
		"                     %u .. 64m)\n"
		"  --keys K           working set (default max(64, 512 MiB / N), at\n"
		"                     most 1M; max %u)\n"
		"  --no-lookup        p2p: no dir.get per batch, records from setup\n"
		"  --no-setup         values already stored (p2p, dir still learn the\n"
		"                     records with dir.get)\n"
		"  --setup-only       store the values and exit\n"
		"  --duration SEC     measured window (default 3)\n"
		"  --warmup SEC       load before the window, not measured (default 1)\n"
		"  --timeout SEC      longest silence on a socket (default 5)\n"
		"  --prefix STR       key prefix (default pcb); keys are PREFIX:N:i\n"
		"  --seed S           random seed (default 1)\n"
		"  --json             one JSON object on stdout\n"
		"  --serve-tcp        be the tcp sink: listen (port 0: any) and print\n"
		"                     'listening: tcp on HOST:PORT' on stderr\n"
		"\n"
		"Exit status: 0 on a clean run, 1 on a failure (message on stderr),\n"
		"2 on bad usage.\n",
		THREADS_MAX, BATCH_MAX, PIPELINE_MAX, VALUE_BYTES_MIN, KEYS_MAX);
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, bool sized,
		      uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return false;
	if (sized && (*end == 'k' || *end == 'K')) {
		v <<= 10;
		end++;
	} else if (sized && (*end == 'm' || *end == 'M')) {
		v <<= 20;
		end++;
	}
	if (*end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static bool parse_secs(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end || !(v >= lo && v <= hi))
		return false;
	*out = v;
	return true;
}

enum { O_TARGET = 256, O_HOST, O_PORT, O_THREADS, O_BATCH, O_PIPELINE,
       O_VALUE, O_KEYS, O_NO_LOOKUP, O_NO_SETUP, O_SETUP_ONLY, O_DURATION,
       O_WARMUP, O_TIMEOUT, O_PREFIX, O_SEED, O_JSON, O_SERVE, O_HELP };

/* Returns 0, 1 for --help, or -EINVAL with the message printed. */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"target", 1, NULL, O_TARGET}, {"host", 1, NULL, O_HOST},
		{"port", 1, NULL, O_PORT}, {"threads", 1, NULL, O_THREADS},
		{"batch", 1, NULL, O_BATCH}, {"pipeline", 1, NULL, O_PIPELINE},
		{"value-bytes", 1, NULL, O_VALUE}, {"keys", 1, NULL, O_KEYS},
		{"no-lookup", 0, NULL, O_NO_LOOKUP}, {"no-setup", 0, NULL, O_NO_SETUP},
		{"setup-only", 0, NULL, O_SETUP_ONLY},
		{"duration", 1, NULL, O_DURATION}, {"warmup", 1, NULL, O_WARMUP},
		{"timeout", 1, NULL, O_TIMEOUT}, {"prefix", 1, NULL, O_PREFIX},
		{"seed", 1, NULL, O_SEED}, {"json", 0, NULL, O_JSON},
		{"serve-tcp", 0, NULL, O_SERVE}, {"help", 0, NULL, O_HELP},
		{NULL, 0, NULL, 0},
	};
	*o = (struct opts){.host = "127.0.0.1", .threads = 1, .batch = 32,
			   .pipeline = 1, .value_bytes = 1u << 20,
			   .duration_s = 3, .warmup_s = 1, .timeout_ms = 5000,
			   .lookup = true, .setup = true, .run = true,
			   .prefix = "pcb", .seed = 1};
	bool have_target = false, have_port = false;
	int c;
/* A bounded integer option into o->field (any unsigned width). */
#define NUM(field, lo_, hi_, sized)                                           \
	if ((ok = parse_u64(optarg, lo_, hi_, sized, &v)))                     \
		o->field = (__typeof__(o->field))v;                            \
	break
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		uint64_t v = 0;
		double d = 0;
		bool ok = true;
		switch (c) {
		case O_TARGET:
			ok = false;
			for (unsigned i = 0; i < PC_ARRAY_LEN(targets); i++)
				if (!strcmp(optarg, targets[i].name)) {
					o->target = (enum target_id)i;
					ok = have_target = true;
				}
			break;
		case O_HOST: o->host = optarg; break;
		case O_PORT: have_port = true; NUM(port, 0, 65535, false);
		case O_THREADS: NUM(threads, 1, THREADS_MAX, false);
		case O_BATCH: NUM(batch, 1, BATCH_MAX, false);
		case O_PIPELINE: NUM(pipeline, 1, PIPELINE_MAX, false);
		case O_VALUE: NUM(value_bytes, VALUE_BYTES_MIN, VALUE_BYTES_MAX, true);
		case O_KEYS: NUM(keys, 1, KEYS_MAX, false);
		case O_SEED: NUM(seed, 0, UINT64_MAX, false);
		case O_NO_LOOKUP: o->lookup = false; break;
		case O_NO_SETUP: o->setup = false; break;
		case O_SETUP_ONLY: o->run = false; break;
		case O_DURATION: ok = parse_secs(optarg, 0.01, 86400, &o->duration_s); break;
		case O_WARMUP: ok = parse_secs(optarg, 0, 86400, &o->warmup_s); break;
		case O_TIMEOUT:
			if ((ok = parse_secs(optarg, 0.01, 3600, &d)))
				o->timeout_ms = (unsigned)(d * 1000);
			break;
		case O_PREFIX:
			o->prefix = optarg;
			ok = strlen(optarg) >= 1 && strlen(optarg) <= 16 &&
			     !strpbrk(optarg, " \t\r\n");
			break;
		case O_JSON: o->json = true; break;
		case O_SERVE: o->serve_tcp = true; break;
		case O_HELP: usage(stdout); return 1;
		default: usage(stderr); return -EINVAL;
		}
#undef NUM
		if (!ok) {
			const char *name = "?";
			for (unsigned i = 0; lo[i].name; i++)
				if (lo[i].val == c)
					name = lo[i].name;
			fprintf(stderr, "pc-p2p-bench: bad value for --%s: '%s'\n",
				name, optarg);
			return -EINVAL;
		}
	}
	const char *why = NULL;
	if (optind < argc)
		why = "unexpected argument";
	else if (o->serve_tcp)
		return 0;
	else if (!have_target)
		why = "--target is required";
	else if (!have_port || o->port == 0)
		why = "--port is required";
	else if (!o->setup && !o->run)
		why = "--no-setup with --setup-only leaves nothing to do";
	if (!o->keys)
		o->keys = (unsigned)PC_MAX(64, PC_MIN(1u << 20, (512ull << 20) / o->value_bytes));
	if (!why && o->keys < o->batch)
		why = "--keys must be at least --batch (keys in a batch are distinct)";
	if (!why && (double)o->threads * o->pipeline * o->batch * o->value_bytes >
			    (double)DST_BYTES_MAX)
		why = "threads x pipeline x batch x value bytes is over 4 GiB";
	if (why) {
		fprintf(stderr, "pc-p2p-bench: %s (see --help)\n", why);
		return -EINVAL;
	}
	o->target_name = targets[o->target].name;
	return 0;
}

/* ------------------------------------------------------------- report ---- */

static void report(const struct bench *b, const struct lg_hist *h,
		   uint64_t batches, uint64_t items, uint64_t bytes)
{
	const struct opts *o = &b->o;
	double d = o->duration_s;
	double gbps = (double)bytes / d / 1e9, ips = (double)items / d;
	double us[6] = {
		(double)lg_hist_quantile_ns(h, 0.5) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.9) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.99) / 1e3,
		(double)lg_hist_quantile_ns(h, 0.999) / 1e3,
		(double)h->max_ns / 1e3,
		h->total ? (double)h->sum_ns / (double)h->total / 1e3 : 0,
	};
	if (o->json) {
		printf("{\"target\":\"%s\",\"lookup\":%s,\"value_bytes\":%" PRIu64
		       ",\"batch\":%u,\"threads\":%u,\"pipeline\":%u,\"keys\":%u,"
		       "\"members\":%u,\"warmup_s\":%g,\"duration_s\":%g,"
		       "\"setup_s\":%.3f,\"batches\":%" PRIu64 ",\"items\":%" PRIu64
		       ",\"bytes\":%" PRIu64 ",\"gb_per_s\":%.4f,"
		       "\"items_per_s\":%.1f,\"batches_per_s\":%.1f,"
		       "\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
		       "\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
		       "\"errors\":0}\n",
		       o->target_name,
		       o->target == T_P2P && o->lookup ? "true" : "false",
		       o->value_bytes, o->batch, o->threads, o->pipeline, o->keys,
		       b->nmembers, o->warmup_s, d, b->setup_s, batches, items,
		       bytes, gbps, ips, (double)batches / d, us[0], us[1], us[2],
		       us[3], us[4], us[5]);
		return;
	}
	printf("%s%s: %u threads x %u keys x %" PRIu64 " B, pipeline %u, %u keys:"
	       " %.3f GB/s, %.0f %s/s; batch latency p50 %.1f us, p99 %.1f us,"
	       " max %.1f us (%" PRIu64 " batches in %g s)\n",
	       o->target_name, o->target == T_P2P && !o->lookup ? " (no lookup)" : "",
	       o->threads, o->batch, o->value_bytes, o->pipeline, o->keys, gbps,
	       ips, o->target == T_DIR ? "keys" : "values", us[0], us[2], us[4],
	       batches, d);
}

/* --------------------------------------------------------------- main ---- */

/* Stores the values and learns the records, on the main thread. */
static int setup(struct bench *b)
{
	const struct opts *o = &b->o;
	struct conn c;
	uint64_t t0 = pc_now_ns();
	int ret;
	if (o->target == T_TCP)
		return 0;
	if ((ret = conn_open(&c, o->target_name, o->host, o->port, o->timeout_ms)) < 0)
		return ret;
	if (o->setup)
		ret = o->target == T_REDIS || o->target == T_MEMCACHED
			      ? setup_text(b, &c, o->target == T_REDIS)
			      : setup_p2p(b, &c);
	if (ret == 0 && o->run && (o->target == T_P2P || o->target == T_DIR))
		ret = learn_records(b, &c);
	conn_close(&c);
	b->setup_s = (double)(pc_now_ns() - t0) / 1e9;
	return ret;
}

static int measure(struct bench *b)
{
	const struct opts *o = &b->o;
	struct worker *w = pc_xcalloc(o->threads, sizeof(*w));
	unsigned started = 0;
	int ret = pools_make(b);
	for (unsigned i = 0; i < o->threads && ret == 0; i++)
		ret = worker_init(&w[i], b, i);
	if (ret == 0) {
		uint64_t t0 = pc_now_ns();
		b->t_measure = t0 + (uint64_t)(o->warmup_s * 1e9);
		b->t_end = b->t_measure + (uint64_t)(o->duration_s * 1e9);
		for (; started < o->threads; started++)
			if (pthread_create(&w[started].th, NULL, worker_main,
					   &w[started]) != 0) {
				ret = fail(EAGAIN, "pthread_create failed");
				break;
			}
	}
	struct lg_hist *h = pc_xcalloc(1, sizeof(*h));
	uint64_t batches = 0, items = 0, bytes = 0;
	for (unsigned i = 0; i < started; i++) {
		pthread_join(w[i].th, NULL);
		if (w[i].rc < 0 && ret == 0) {
			/* %.480s: the worker message fits with its prefix. */
			snprintf(t_err, sizeof(t_err), "thread %u: %.480s", i,
				 w[i].err);
			ret = w[i].rc;
		}
		lg_hist_merge(h, &w[i].hist);
		batches += w[i].batches;
		items += w[i].items;
		bytes += w[i].bytes;
	}
	if (ret == 0 && batches == 0)
		ret = fail(ETIMEDOUT, "no batch completed in the measured window");
	if (ret == 0)
		report(b, h, batches, items, bytes);
	for (unsigned i = 0; i < o->threads; i++)
		if (w[i].b)
			worker_free(&w[i]);
	free(w);
	free(h);
	return ret;
}

int main(int argc, char **argv)
{
	static struct bench b;
	int ret = parse_opts(argc, argv, &b.o);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (b.o.serve_tcp) {
		serve_tcp(&b.o);
		fprintf(stderr, "pc-p2p-bench: %s\n", t_err);
		return 1;
	}
	b.nkeys = b.o.keys;
	keys_make(&b);
	ret = setup(&b);
	if (ret == 0 && !b.o.run) {
		if (b.o.json)
			printf("{\"target\":\"%s\",\"setup_only\":true,\"keys\":%u,"
			       "\"value_bytes\":%" PRIu64 ",\"setup_s\":%.3f}\n",
			       b.o.target_name, b.nkeys, b.o.value_bytes, b.setup_s);
		else
			printf("%s: stored %u values of %" PRIu64 " B in %.2f s\n",
			       b.o.target_name, b.nkeys, b.o.value_bytes, b.setup_s);
	}
	if (ret == 0 && b.o.run)
		ret = measure(&b);
	if (ret < 0) {
		fprintf(stderr, "pc-p2p-bench: %s: %s\n", b.o.target_name, t_err);
		return 1;
	}
	return 0;
}
