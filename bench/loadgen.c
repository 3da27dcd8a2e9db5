/*
 * bench/loadgen.c — pc-loadgen, a closed-loop TCP load generator.
 *
 * Owns: the benchmark's client side. N connections are opened up front, spread
 * round-robin over T worker threads; each thread owns its connections, its
 * epoll instance and its latency histogram outright, so the hot path shares
 * nothing and takes no locks. The main thread only parses options, connects,
 * starts the workers, joins them and merges their results.
 *
 * Closed loop: every connection keeps exactly `pipeline` requests in flight.
 * Each time one whole reply has arrived, the latency of the request it answers
 * is recorded and one new request is sent, so the offered load follows the
 * server's speed (this measures round trips, not an open-loop arrival rate).
 *
 * The wire protocol sits behind struct lg_proto: "how to build a request" and
 * "how long is the first reply in these bytes, and which msgid does it
 * answer". Two modes: raw (fixed request, fixed reply length, content not
 * checked, replies in request order) and msgpack-rpc (MessagePack-RPC
 * requests [0, msgid, method, params]; replies [1, msgid, error, result]
 * framed by skipping one msgpack object, matched to requests by msgid in
 * whatever order they come back).
 *
 * Invariants:
 *  - per connection, 0 <= inflight <= pipeline; every in-flight request owns
 *    one slot of a table of slot_count = pow2 >= pipeline entries, and its
 *    msgid carries the slot in its low bits, so a reply finds its request in
 *    O(1) and two requests in flight never share a msgid;
 *  - ordered modes use the slots as a FIFO ring (oldest at ring_head);
 *    unordered modes take them from a free stack;
 *  - unsent request bytes (tx_len - tx_off) always belong to in-flight
 *    requests, so the tx buffer never needs more than pipeline * request max;
 *  - the rx buffer holds at least one maximal reply, and a mode reports a
 *    reply longer than reply_bytes_max as an error rather than waiting for
 *    more bytes, so a partial reply never fills the buffer;
 *  - no worker runs past the end of the measured window: every wait is
 *    bounded, connects have a deadline, and a connection that stops answering
 *    is declared dead after --timeout seconds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/util.h"

/* Limits; each one is an option bound checked at parse time. */
#define LG_CONNS_MAX 10000
#define LG_THREADS_MAX 256
#define LG_PIPELINE_MAX 4096
#define LG_REQUEST_BYTES_MAX 65536
#define LG_REPLY_BYTES_MAX (1u << 20)
#define LG_DURATION_S_MAX 86400.0
/* The rx buffer is sized for the replies that can be outstanding, within these
 * bounds: small enough that 10k connections stay cheap, big enough that one
 * read() usually drains a whole pipelined burst. */
#define LG_RX_BYTES_MIN 512
#define LG_RX_BYTES_CAP 65536
/* Upper bound on one epoll_wait, so workers notice the end of the window, a
 * stop signal and stalled connections promptly even when nothing arrives. */
#define LG_TICK_MS 100
#define LG_EVENTS_MAX 256

/* ------------------------------------------------------------------------ */
/* Latency histogram                                                         */
/* ------------------------------------------------------------------------ */

/*
 * HDR-style log-linear histogram over nanoseconds. Values below 2^SUB_BITS are
 * counted exactly; above, each power-of-two octave [2^k, 2^(k+1)) is split into
 * 2^SUB_BITS equal buckets, so a bucket is at most 1/128 (0.78%) of its value
 * wide. Octaves run up to 2^34 ns (17 s), which covers the 1 us .. 10 s we
 * care about; larger values land in the last bucket (the exact max is kept on
 * the side). Fixed 3584 counters = 28 KiB per thread, no allocation on record.
 */
#define LG_HIST_SUB_BITS 7
#define LG_HIST_SUB (1u << LG_HIST_SUB_BITS)
#define LG_HIST_VALUE_BITS 34
#define LG_HIST_BUCKETS \
	((LG_HIST_VALUE_BITS - LG_HIST_SUB_BITS + 1) * LG_HIST_SUB)

struct lg_hist {
	uint64_t counts[LG_HIST_BUCKETS];
	uint64_t total;	  /* number of recorded values */
	uint64_t sum_ns;  /* exact sum, for the mean */
	uint64_t max_ns;  /* exact maximum, also clamps the top percentiles */
};

static unsigned lg_hist_index(uint64_t v_ns)
{
	if (v_ns >= (1ull << LG_HIST_VALUE_BITS))
		v_ns = (1ull << LG_HIST_VALUE_BITS) - 1;
	if (v_ns < LG_HIST_SUB)
		return (unsigned)v_ns;
	unsigned k = 63u - (unsigned)__builtin_clzll(v_ns);
	unsigned shift = k - LG_HIST_SUB_BITS;
	/* (v >> shift) is in [SUB, 2*SUB): octave k starts at index (shift+1)*SUB. */
	return (shift << LG_HIST_SUB_BITS) + (unsigned)(v_ns >> shift);
}

/* Midpoint of a bucket: halves the worst-case error against either edge. */
static uint64_t lg_hist_bucket_mid_ns(unsigned idx)
{
	if (idx < 2 * LG_HIST_SUB)
		return idx;
	unsigned shift = (idx >> LG_HIST_SUB_BITS) - 1;
	uint64_t sub = idx - ((uint64_t)shift << LG_HIST_SUB_BITS);
	uint64_t lower = sub << shift;
	return lower + ((1ull << shift) - 1) / 2;
}

static inline void lg_hist_record(struct lg_hist *h, uint64_t v_ns)
{
	h->counts[lg_hist_index(v_ns)]++;
	h->total++;
	h->sum_ns += v_ns;
	if (v_ns > h->max_ns)
		h->max_ns = v_ns;
}

static void lg_hist_merge(struct lg_hist *dst, const struct lg_hist *src)
{
	for (unsigned i = 0; i < LG_HIST_BUCKETS; i++)
		dst->counts[i] += src->counts[i];
	dst->total += src->total;
	dst->sum_ns += src->sum_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
}

/* Value at quantile q in [0, 1]: the bucket holding the ceil(q*total)-th value. */
static uint64_t lg_hist_quantile_ns(const struct lg_hist *h, double q)
{
	if (h->total == 0)
		return 0;
	uint64_t rank = (uint64_t)ceil(q * (double)h->total);
	if (rank < 1)
		rank = 1;
	if (rank > h->total)
		rank = h->total;
	uint64_t seen = 0;
	for (unsigned i = 0; i < LG_HIST_BUCKETS; i++) {
		seen += h->counts[i];
		if (seen >= rank)
			return PC_MIN(lg_hist_bucket_mid_ns(i), h->max_ns);
	}
	return h->max_ns;
}

/* ------------------------------------------------------------------------ */
/* MessagePack reading                                                       */
/* ------------------------------------------------------------------------ */

/*
 * Just enough MessagePack to frame replies: decode one header, skip one whole
 * object, render a small one for a message. Every size here comes from the
 * peer, so nothing allocates or recurses on it: the skipper keeps one count of
 * objects still to skip (a container adds its children to it), and as every
 * object is at least one byte, that count is also a lower bound on the bytes
 * still to come, which lets a declared array32 of 4 billion elements fail at
 * once against the size limit instead of being waited for.
 */
enum lg_mp_kind {
	LG_MP_INVALID,	/* 0xc1, the one marker msgpack never uses */
	LG_MP_NIL,
	LG_MP_BOOL,
	LG_MP_UINT,
	LG_MP_INT,	/* the signed encodings, negative fixint included */
	LG_MP_FLOAT,
	LG_MP_STR,
	LG_MP_BIN,
	LG_MP_EXT,
	LG_MP_ARRAY,
	LG_MP_MAP,
};

struct lg_mp_head {
	enum lg_mp_kind kind;
	/* UINT: the value; INT: the value in two's complement; BOOL: 0 or 1;
	 * ARRAY: elements; MAP: pairs. */
	uint64_t val;
	uint64_t payload;   /* bytes after the header: str/bin/ext data, float */
	uint64_t children;  /* objects after the payload: array n, map 2n */
	int8_t ext_type;
};

/* Markers 0xc0..0xdf; the fix* ranges outside it are decoded in code. */
struct lg_mp_marker {
	uint8_t kind;
	uint8_t field_bytes;	/* big-endian length or value after the marker */
	uint8_t type_bytes;	/* ext: the type byte after the length */
	uint8_t fixed_payload;	/* float, fixext: data size the marker implies */
};

static const struct lg_mp_marker lg_mp_markers[] = {
	{ LG_MP_NIL, 0, 0, 0 },	   /* 0xc0 nil */
	{ LG_MP_INVALID, 0, 0, 0 }, /* 0xc1 never used */
	{ LG_MP_BOOL, 0, 0, 0 },   /* 0xc2 false */
	{ LG_MP_BOOL, 0, 0, 0 },   /* 0xc3 true */
	{ LG_MP_BIN, 1, 0, 0 },	   /* 0xc4 bin8 */
	{ LG_MP_BIN, 2, 0, 0 },	   /* 0xc5 bin16 */
	{ LG_MP_BIN, 4, 0, 0 },	   /* 0xc6 bin32 */
	{ LG_MP_EXT, 1, 1, 0 },	   /* 0xc7 ext8 */
	{ LG_MP_EXT, 2, 1, 0 },	   /* 0xc8 ext16 */
	{ LG_MP_EXT, 4, 1, 0 },	   /* 0xc9 ext32 */
	{ LG_MP_FLOAT, 0, 0, 4 },  /* 0xca float32 */
	{ LG_MP_FLOAT, 0, 0, 8 },  /* 0xcb float64 */
	{ LG_MP_UINT, 1, 0, 0 },   /* 0xcc uint8 */
	{ LG_MP_UINT, 2, 0, 0 },   /* 0xcd uint16 */
	{ LG_MP_UINT, 4, 0, 0 },   /* 0xce uint32 */
	{ LG_MP_UINT, 8, 0, 0 },   /* 0xcf uint64 */
	{ LG_MP_INT, 1, 0, 0 },	   /* 0xd0 int8 */
	{ LG_MP_INT, 2, 0, 0 },	   /* 0xd1 int16 */
	{ LG_MP_INT, 4, 0, 0 },	   /* 0xd2 int32 */
	{ LG_MP_INT, 8, 0, 0 },	   /* 0xd3 int64 */
	{ LG_MP_EXT, 0, 1, 1 },	   /* 0xd4 fixext1 */
	{ LG_MP_EXT, 0, 1, 2 },	   /* 0xd5 fixext2 */
	{ LG_MP_EXT, 0, 1, 4 },	   /* 0xd6 fixext4 */
	{ LG_MP_EXT, 0, 1, 8 },	   /* 0xd7 fixext8 */
	{ LG_MP_EXT, 0, 1, 16 },   /* 0xd8 fixext16 */
	{ LG_MP_STR, 1, 0, 0 },	   /* 0xd9 str8 */
	{ LG_MP_STR, 2, 0, 0 },	   /* 0xda str16 */
	{ LG_MP_STR, 4, 0, 0 },	   /* 0xdb str32 */
	{ LG_MP_ARRAY, 2, 0, 0 },  /* 0xdc array16 */
	{ LG_MP_ARRAY, 4, 0, 0 },  /* 0xdd array32 */
	{ LG_MP_MAP, 2, 0, 0 },	   /* 0xde map16 */
	{ LG_MP_MAP, 4, 0, 0 },	   /* 0xdf map32 */
};
_Static_assert(PC_ARRAY_LEN(lg_mp_markers) == 0xe0 - 0xc0,
	       "one entry per marker 0xc0..0xdf");

/* Decodes the header of the object at p[0..len). Returns the header's length,
 * 0 when len does not cover it yet, or -EPROTO for the unused marker. */
static ssize_t lg_mp_head(const uint8_t *p, size_t len, struct lg_mp_head *h)
{
	if (len == 0)
		return 0;
	uint8_t b = p[0];
	*h = (struct lg_mp_head){ .kind = LG_MP_UINT };
	if (b <= 0x7f) {
		h->val = b;
		return 1;
	}
	if (b >= 0xe0) {
		h->kind = LG_MP_INT;
		h->val = (uint64_t)(int64_t)(int8_t)b;
		return 1;
	}
	if (b <= 0x8f) {
		h->kind = LG_MP_MAP;
		h->val = b & 0x0fu;
		h->children = 2 * h->val;
		return 1;
	}
	if (b <= 0x9f) {
		h->kind = LG_MP_ARRAY;
		h->val = h->children = b & 0x0fu;
		return 1;
	}
	if (b <= 0xbf) {
		h->kind = LG_MP_STR;
		h->payload = b & 0x1fu;
		return 1;
	}
	const struct lg_mp_marker *m = &lg_mp_markers[b - 0xc0];
	if (m->kind == LG_MP_INVALID)
		return -EPROTO;
	size_t hdr = 1u + m->field_bytes + m->type_bytes;
	if (len < hdr)
		return 0;
	uint64_t field = 0;
	for (unsigned i = 0; i < m->field_bytes; i++)
		field = field << 8 | p[1 + i];
	h->kind = (enum lg_mp_kind)m->kind;
	switch (h->kind) {
	case LG_MP_BOOL:
		h->val = b & 1u;
		break;
	case LG_MP_UINT:
		h->val = field;
		break;
	case LG_MP_INT: {
		unsigned shift = 64u - 8u * m->field_bytes;
		h->val = (uint64_t)((int64_t)(field << shift) >> shift);
		break;
	}
	case LG_MP_STR:
	case LG_MP_BIN:
		h->payload = field;
		break;
	case LG_MP_EXT:
		h->payload = m->field_bytes ? field : m->fixed_payload;
		h->ext_type = (int8_t)p[1 + m->field_bytes];
		break;
	case LG_MP_FLOAT:
		h->payload = m->fixed_payload;
		break;
	case LG_MP_ARRAY:
		h->val = h->children = field;
		break;
	case LG_MP_MAP:
		h->val = field;
		h->children = 2 * field;
		break;
	default:
		break;
	}
	return (ssize_t)hdr;
}

/* True, with the value, when h is an integer >= 0 in any encoding. */
static bool lg_mp_head_u64(const struct lg_mp_head *h, uint64_t *out)
{
	if (h->kind == LG_MP_UINT ||
	    (h->kind == LG_MP_INT && (int64_t)h->val >= 0)) {
		*out = h->val;
		return true;
	}
	return false;
}

/*
 * Skips one complete object at p[0..len), nested ones included. Returns its
 * length; 0 when len does not cover it yet; -EPROTO when the bytes are not
 * msgpack (the unused marker 0xc1); -EMSGSIZE as soon as the object is known
 * to need more than limit bytes. Runs at most one iteration per byte.
 */
static ssize_t lg_mp_skip(const uint8_t *p, size_t len, size_t limit)
{
	uint64_t left = 1;  /* objects still to skip; each is >= 1 byte */
	size_t pos = 0;

	while (left > 0) {
		/* left <= limit + 2 * UINT32_MAX after any step: no overflow. */
		if (pos + left > limit)
			return -EMSGSIZE;
		struct lg_mp_head h;
		ssize_t n = lg_mp_head(p + pos, len - pos, &h);
		if (n < 0)
			return n;
		if (n == 0)  /* the object needs more than len bytes */
			return len >= limit ? -EMSGSIZE : 0;
		pos += (size_t)n;
		if (h.payload > limit || pos + h.payload > limit)
			return -EMSGSIZE;
		if (h.payload > len - pos)
			return 0;  /* pos + payload <= limit, so len < limit */
		pos += (size_t)h.payload;
		left = left - 1 + h.children;
	}
	return (ssize_t)pos;
}

/* Bounded text for messages; a full buffer silently truncates. */
struct lg_text {
	char *buf;
	size_t cap;
	size_t len;
};

static PC_PRINTF(2, 3) void lg_text_add(struct lg_text *t, const char *fmt, ...)
{
	if (t->len + 1 >= t->cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->len = PC_MIN(t->len + (size_t)n, t->cap - 1);
}

/* Rendering limits: an error object is shown, not archived. */
#define LG_RENDER_DEPTH_MAX 4
#define LG_RENDER_ITEMS_MAX 8
#define LG_RENDER_STR_MAX 80

/*
 * Renders the object at p[0..len) into t, JSON-like, nested at most
 * LG_RENDER_DEPTH_MAX deep (recursion bounded by that, not by the data).
 * Error path only. Returns the object's length or a negative errno.
 */
static ssize_t lg_mp_render(const uint8_t *p, size_t len, unsigned depth,
			    struct lg_text *t)
{
	struct lg_mp_head h;
	ssize_t total = lg_mp_skip(p, len, len);
	if (total <= 0)
		return total < 0 ? total : -EPROTO;
	ssize_t n = lg_mp_head(p, len, &h);
	if (n <= 0)
		return -EPROTO;
	const uint8_t *d = p + n;  /* the payload, or the first child */

	switch (h.kind) {
	case LG_MP_NIL:
		lg_text_add(t, "nil");
		break;
	case LG_MP_BOOL:
		lg_text_add(t, h.val ? "true" : "false");
		break;
	case LG_MP_UINT:
		lg_text_add(t, "%llu", (unsigned long long)h.val);
		break;
	case LG_MP_INT:
		lg_text_add(t, "%lld", (long long)(int64_t)h.val);
		break;
	case LG_MP_FLOAT: {
		uint64_t bits = 0;
		for (uint64_t i = 0; i < h.payload; i++)
			bits = bits << 8 | d[i];
		double v;
		if (h.payload == 4) {
			uint32_t b32 = (uint32_t)bits;
			float f;
			memcpy(&f, &b32, sizeof(f));
			v = f;
		} else {
			memcpy(&v, &bits, sizeof(v));
		}
		lg_text_add(t, "%g", v);
		break;
	}
	case LG_MP_STR: {
		size_t shown = (size_t)PC_MIN(h.payload, (uint64_t)LG_RENDER_STR_MAX);
		lg_text_add(t, "\"");
		for (size_t i = 0; i < shown; i++) {
			if (d[i] >= 0x20 && d[i] < 0x7f && d[i] != '"' &&
			    d[i] != '\\')
				lg_text_add(t, "%c", d[i]);
			else
				lg_text_add(t, "\\x%02x", d[i]);
		}
		lg_text_add(t, "%s\"", shown < h.payload ? "..." : "");
		break;
	}
	case LG_MP_BIN:
		lg_text_add(t, "<bin %llu bytes>", (unsigned long long)h.payload);
		break;
	case LG_MP_EXT:
		lg_text_add(t, "<ext type %d, %llu bytes>", h.ext_type,
			    (unsigned long long)h.payload);
		break;
	case LG_MP_ARRAY:
	case LG_MP_MAP: {
		bool map = h.kind == LG_MP_MAP;
		lg_text_add(t, map ? "{" : "[");
		if (h.val > 0 && depth >= LG_RENDER_DEPTH_MAX) {
			lg_text_add(t, "...");
		} else {
			size_t end = (size_t)total, off = (size_t)n;
			for (uint64_t i = 0; i < h.children; i++) {
				if (i / (map ? 2 : 1) == LG_RENDER_ITEMS_MAX) {
					lg_text_add(t, ", ...");
					break;
				}
				if (i > 0)
					lg_text_add(t, map && (i & 1) ? ": " : ", ");
				ssize_t c = lg_mp_render(p + off, end - off,
							 depth + 1, t);
				if (c < 0)
					return c;
				off += (size_t)c;
			}
		}
		lg_text_add(t, map ? "}" : "]");
		break;
	}
	default:
		return -EPROTO;
	}
	return total;
}

/* ------------------------------------------------------------------------ */
/* Protocols                                                                 */
/* ------------------------------------------------------------------------ */

/* What the options say about the wire, shared read-only by every thread. */
struct lg_proto_cfg {
	const uint8_t *request;	    /* raw: bytes of one request */
	size_t request_bytes;	    /* raw: their length */
	bool request_given;	    /* --request was on the command line */
	size_t reply_bytes;	    /* raw: fixed reply length; rpc: largest
				       reply accepted; 0 = mode default */
	const char *method;	    /* rpc: method name, NULL if not given */
	const uint8_t *params;	    /* rpc: encoded params, NULL = [] */
	size_t params_bytes;
	/* Set by setup(): */
	uint8_t *tmpl;		    /* rpc: one request with msgid 0 (owned) */
	size_t tmpl_bytes;
	size_t msgid_off;	    /* rpc: where the uint32 msgid sits in tmpl */
	size_t request_bytes_max;   /* sizes the tx buffer */
	size_t reply_bytes_max;	    /* sizes the rx buffer */
};

/* What one framed reply says, beyond its length. */
struct lg_reply {
	uint32_t msgid;		/* the request it answers */
	uint32_t err_off;	/* the error object inside the reply, */
	uint32_t err_len;	/* err_len 0 when the error is nil */
};

/*
 * A protocol mode. The loop never looks at bytes itself; it asks the mode to
 * build requests and to frame replies. The loop picks every msgid (unique
 * among the connection's requests in flight, and carrying the slot that
 * holds the request's send time); a mode whose requests carry no msgid just
 * ignores it.
 */
struct lg_proto {
	const char *name;
	/* Replies come back in request order and carry no msgid: the loop
	 * passes the oldest in-flight msgid to reply_frame, which echoes it. */
	bool ordered;
	/* Validates cfg and fills the fields setup owns. 0, or a negative
	 * errno with *why saying which option is wrong. */
	int (*setup)(struct lg_proto_cfg *cfg, const char **why);
	/* Writes one request carrying msgid into buf[0..cap). Returns the bytes
	 * written, or -ENOSPC (cap is request_bytes_max, so only on a bug). */
	ssize_t (*request_build)(const struct lg_proto_cfg *cfg, uint32_t msgid,
				 uint8_t *buf, size_t cap);
	/* Looks at received bytes buf[0..len) starting at a reply boundary.
	 * Returns the length of the first reply and fills *out when it is
	 * complete; 0 when more bytes are needed (never once len reaches
	 * reply_bytes_max); or a negative errno: -EPROTO not the protocol's
	 * encoding, -EBADMSG well-formed but not a reply, -EMSGSIZE longer
	 * than reply_bytes_max. expect_msgid is the oldest in-flight request,
	 * meaningful for ordered modes only. */
	ssize_t (*reply_frame)(const struct lg_proto_cfg *cfg,
			       uint32_t expect_msgid, const uint8_t *buf,
			       size_t len, struct lg_reply *out);
};

static int lg_raw_setup(struct lg_proto_cfg *cfg, const char **why)
{
	if (cfg->method || cfg->params) {
		*why = "--method and --params-hex need --mode msgpack-rpc";
		return -EINVAL;
	}
	/* Default: an echo server answers with the request itself. */
	if (cfg->reply_bytes == 0)
		cfg->reply_bytes = cfg->request_bytes;
	if (cfg->request_bytes == 0) {
		*why = "an empty --request";
		return -EINVAL;
	}
	cfg->request_bytes_max = cfg->request_bytes;
	cfg->reply_bytes_max = cfg->reply_bytes;
	return 0;
}

static ssize_t lg_raw_request_build(const struct lg_proto_cfg *cfg,
				    uint32_t msgid, uint8_t *buf, size_t cap)
{
	if (cap < cfg->request_bytes)
		return -ENOSPC;
	memcpy(buf, cfg->request, cfg->request_bytes);
	return (ssize_t)cfg->request_bytes;
}

/* Length only: redis answers "+PONG\r\n" to "PING\r\n" and an echo server
 * "PING\r\n"; both are right, and checking content would cost the client
 * time that belongs to the measurement. */
static ssize_t lg_raw_reply_frame(const struct lg_proto_cfg *cfg,
				  uint32_t expect_msgid, const uint8_t *buf,
				  size_t len, struct lg_reply *out)
{
	if (len < cfg->reply_bytes)
		return 0;
	out->msgid = expect_msgid;
	return (ssize_t)cfg->reply_bytes;
}

static const struct lg_proto lg_proto_raw = {
	.name = "raw",
	.ordered = true,
	.setup = lg_raw_setup,
	.request_build = lg_raw_request_build,
	.reply_frame = lg_raw_reply_frame,
};

/* MessagePack-RPC, https://github.com/msgpack-rpc/msgpack-rpc/blob/master/spec.md */
#define LG_RPC_REQUEST 0
#define LG_RPC_RESPONSE 1
/* Largest reply accepted unless --reply-bytes says otherwise: ample for a
 * health map, small enough that 10k connections' rx buffers stay cheap. */
#define LG_RPC_REPLY_BYTES_DEFAULT 16384
#define LG_RPC_METHOD_BYTES_MAX 255

/*
 * Every request differs only in its msgid, so setup encodes one whole request
 * once, msgid as a fixed-width uint32 (0xce: any msgpack decoder accepts the
 * wider form), and request_build copies it and patches four bytes.
 */
static int lg_rpc_setup(struct lg_proto_cfg *cfg, const char **why)
{
	static const uint8_t params_empty[] = { 0x90 };	 /* [] */

	if (cfg->request_given) {
		*why = "--request is for --mode raw; msgpack-rpc builds requests from --method and --params-hex";
		return -EINVAL;
	}
	if (!cfg->method || !*cfg->method) {
		*why = "needs --method NAME (e.g. node.health)";
		return -EINVAL;
	}
	size_t mlen = strlen(cfg->method);
	if (mlen > LG_RPC_METHOD_BYTES_MAX) {
		*why = "--method is longer than 255 bytes";
		return -EINVAL;
	}
	const uint8_t *params = cfg->params ? cfg->params : params_empty;
	size_t plen = cfg->params ? cfg->params_bytes : sizeof(params_empty);
	struct lg_mp_head h;
	if (lg_mp_skip(params, plen, plen) != (ssize_t)plen ||
	    lg_mp_head(params, plen, &h) <= 0 || h.kind != LG_MP_ARRAY) {
		*why = "--params-hex is not exactly one msgpack array";
		return -EINVAL;
	}

	size_t cap = 1 + 1 + 5 + 2 + mlen + plen;
	if (cap > LG_REQUEST_BYTES_MAX) {
		*why = "the request would exceed 65536 bytes";
		return -EINVAL;
	}
	uint8_t *b = pc_xcalloc(cap, 1);
	size_t n = 0;
	b[n++] = 0x94;			/* fixarray, 4 elements */
	b[n++] = LG_RPC_REQUEST;	/* positive fixint */
	b[n++] = 0xce;			/* uint32 msgid, patched per request */
	cfg->msgid_off = n;
	n += 4;
	if (mlen <= 31) {
		b[n++] = (uint8_t)(0xa0 | mlen);  /* fixstr */
	} else {
		b[n++] = 0xd9;			   /* str8 */
		b[n++] = (uint8_t)mlen;
	}
	memcpy(b + n, cfg->method, mlen);
	n += mlen;
	memcpy(b + n, params, plen);
	n += plen;

	cfg->tmpl = b;
	cfg->tmpl_bytes = n;
	cfg->request_bytes_max = n;
	cfg->reply_bytes_max = cfg->reply_bytes ? cfg->reply_bytes
						: LG_RPC_REPLY_BYTES_DEFAULT;
	return 0;
}

static ssize_t lg_rpc_request_build(const struct lg_proto_cfg *cfg,
				    uint32_t msgid, uint8_t *buf, size_t cap)
{
	if (cap < cfg->tmpl_bytes)
		return -ENOSPC;
	memcpy(buf, cfg->tmpl, cfg->tmpl_bytes);
	uint8_t *m = buf + cfg->msgid_off;
	m[0] = (uint8_t)(msgid >> 24);
	m[1] = (uint8_t)(msgid >> 16);
	m[2] = (uint8_t)(msgid >> 8);
	m[3] = (uint8_t)msgid;
	return (ssize_t)cfg->tmpl_bytes;
}

/*
 * One reply is one msgpack object; it must be [1, msgid, error, result] with
 * a msgid that fits 32 bits. Integers are accepted in any width the spec
 * allows, not only the shortest. Whether the msgid is in flight is the loop's
 * question, not the framer's.
 */
static ssize_t lg_rpc_reply_frame(const struct lg_proto_cfg *cfg,
				  uint32_t expect_msgid, const uint8_t *buf,
				  size_t len, struct lg_reply *out)
{
	size_t limit = cfg->reply_bytes_max;
	/* Frame first: "complete or not" must not depend on which of the
	 * checks below a partial reply happens to reach. */
	ssize_t total = lg_mp_skip(buf, len, limit);
	if (total <= 0)
		return total;

	struct lg_mp_head h;
	uint64_t v;
	size_t pos = 0;
	/* total bytes are one complete object, so no step below runs short. */
	ssize_t n = lg_mp_head(buf, (size_t)total, &h);
	if (n <= 0 || h.kind != LG_MP_ARRAY || h.val != 4)
		return -EBADMSG;
	pos += (size_t)n;
	n = lg_mp_head(buf + pos, (size_t)total - pos, &h);
	if (n <= 0 || !lg_mp_head_u64(&h, &v) || v != LG_RPC_RESPONSE)
		return -EBADMSG;
	pos += (size_t)n;
	n = lg_mp_head(buf + pos, (size_t)total - pos, &h);
	if (n <= 0 || !lg_mp_head_u64(&h, &v) || v > UINT32_MAX)
		return -EBADMSG;
	out->msgid = (uint32_t)v;
	pos += (size_t)n;
	n = lg_mp_skip(buf + pos, (size_t)total - pos, (size_t)total - pos);
	if (n <= 0)
		return -EBADMSG;
	if (buf[pos] != 0xc0) {	 /* anything but nil is an error */
		out->err_off = (uint32_t)pos;
		out->err_len = (uint32_t)n;
	}
	return total;
}

static const struct lg_proto lg_proto_rpc = {
	.name = "msgpack-rpc",
	.ordered = false,
	.setup = lg_rpc_setup,
	.request_build = lg_rpc_request_build,
	.reply_frame = lg_rpc_reply_frame,
};

/* Every mode --mode accepts; a new protocol is one more line here. */
static const struct lg_proto *const lg_protos[] = {
	&lg_proto_raw,
	&lg_proto_rpc,
};

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

struct lg_opts {
	const char *host;
	const char *port;
	unsigned conns;
	unsigned threads;
	double duration_s;
	double warmup_s;
	double timeout_s;  /* connect deadline, and silence before a conn is dead */
	unsigned pipeline;
	uint8_t request[LG_REQUEST_BYTES_MAX];	/* raw: --request */
	size_t request_bytes;
	bool request_given;
	size_t reply_bytes;  /* 0 until given: the mode picks a default */
	const char *method;  /* msgpack-rpc: --method */
	uint8_t params[LG_REQUEST_BYTES_MAX];	/* msgpack-rpc: --params-hex */
	size_t params_bytes;
	bool params_given;
	const struct lg_proto *proto;
	bool json;
};

static void lg_usage(FILE *out)
{
	fprintf(out,
		"usage: pc-loadgen --port P [options]\n"
		"\n"
		"Closed-loop TCP load generator: every connection keeps --pipeline\n"
		"requests in flight and sends a new one each time a reply completes.\n"
		"\n"
		"  --host H          server address (default 127.0.0.1)\n"
		"  --port P          server port (required)\n"
		"  --conns N         connections (default 1, max %d)\n"
		"  --threads T       worker threads, connections spread round-robin\n"
		"                    (default 1, max %d, at most N)\n"
		"  --duration SEC    measured window (default 5)\n"
		"  --warmup SEC      load before the window, not measured (default 1)\n"
		"  --pipeline K      requests in flight per connection (default 1, max %d)\n"
		"  --mode M          wire protocol: raw (default) or msgpack-rpc\n"
		"  --reply-bytes B   raw: reply bytes per request (default: request\n"
		"                    length, i.e. an echo server; redis PING needs 7);\n"
		"                    msgpack-rpc: largest reply accepted (default %d)\n"
		"\n"
		"raw mode: a fixed request, replies framed by length only.\n"
		"  --request STR     request bytes; escapes \\r \\n \\t \\0 \\\\ \\xNN\n"
		"                    (default \"PING\\r\\n\")\n"
		"\n"
		"msgpack-rpc mode: requests [0, msgid, method, params]; replies\n"
		"[1, msgid, error, result] matched by msgid in any order; a reply\n"
		"whose error is not nil is counted in reply_errors, not in ops.\n"
		"  --method NAME     method to call (required), e.g. node.health\n"
		"  --params-hex HEX  params as one pre-encoded msgpack array in hex\n"
		"                    (default 90, i.e. [])\n"
		"\n"
		"  --timeout SEC     connect deadline and longest silence from a busy\n"
		"                    connection before it counts as dead (default 2)\n"
		"  --json            print one JSON object instead of a text line\n"
		"  --help            this text\n"
		"\n"
		"Exit status: 0 on a clean run, 1 when a connection failed, a reply\n"
		"carried an error or no request completed, 2 on bad usage.\n",
		LG_CONNS_MAX, LG_THREADS_MAX, LG_PIPELINE_MAX,
		LG_RPC_REPLY_BYTES_DEFAULT);
}

static int lg_parse_uint(const char *s, unsigned lo, unsigned hi,
			 unsigned *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

static int lg_parse_seconds(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int lg_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* C-style unescape of s into out[0..cap). Returns the byte count or -EINVAL. */
static ssize_t lg_unescape(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	while (*s) {
		uint8_t c = (uint8_t)*s++;
		if (c == '\\') {
			switch (*s++) {
			case 'r': c = '\r'; break;
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case '0': c = '\0'; break;
			case '\\': c = '\\'; break;
			case '"': c = '"'; break;
			case '\'': c = '\''; break;
			case 'x': {
				int hi = lg_hex_digit(s[0]);
				int lo = hi < 0 ? -1 : lg_hex_digit(s[1]);
				if (lo < 0)
					return -EINVAL;
				c = (uint8_t)(hi << 4 | lo);
				s += 2;
				break;
			}
			default:
				return -EINVAL;
			}
		}
		if (n == cap)
			return -EINVAL;
		out[n++] = c;
	}
	return (ssize_t)n;
}

/* Hex string into out[0..cap). Returns the byte count or -EINVAL. */
static ssize_t lg_unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	for (; s[0]; s += 2) {
		int hi = lg_hex_digit(s[0]);
		int lo = hi < 0 ? -1 : lg_hex_digit(s[1]);
		if (lo < 0 || n == cap)
			return -EINVAL;
		out[n++] = (uint8_t)(hi << 4 | lo);
	}
	return (ssize_t)n;
}

/* Same order as lg_longopts: error messages index the table by c - HOST. */
enum {
	LG_OPT_HOST = 256,
	LG_OPT_PORT,
	LG_OPT_CONNS,
	LG_OPT_THREADS,
	LG_OPT_DURATION,
	LG_OPT_WARMUP,
	LG_OPT_PIPELINE,
	LG_OPT_REQUEST,
	LG_OPT_REPLY_BYTES,
	LG_OPT_MODE,
	LG_OPT_TIMEOUT,
	LG_OPT_JSON,
	LG_OPT_METHOD,
	LG_OPT_PARAMS_HEX,
	LG_OPT_HELP,
};

static const struct option lg_longopts[] = {
	{ "host", required_argument, NULL, LG_OPT_HOST },
	{ "port", required_argument, NULL, LG_OPT_PORT },
	{ "conns", required_argument, NULL, LG_OPT_CONNS },
	{ "threads", required_argument, NULL, LG_OPT_THREADS },
	{ "duration", required_argument, NULL, LG_OPT_DURATION },
	{ "warmup", required_argument, NULL, LG_OPT_WARMUP },
	{ "pipeline", required_argument, NULL, LG_OPT_PIPELINE },
	{ "request", required_argument, NULL, LG_OPT_REQUEST },
	{ "reply-bytes", required_argument, NULL, LG_OPT_REPLY_BYTES },
	{ "mode", required_argument, NULL, LG_OPT_MODE },
	{ "timeout", required_argument, NULL, LG_OPT_TIMEOUT },
	{ "json", no_argument, NULL, LG_OPT_JSON },
	{ "method", required_argument, NULL, LG_OPT_METHOD },
	{ "params-hex", required_argument, NULL, LG_OPT_PARAMS_HEX },
	{ "help", no_argument, NULL, LG_OPT_HELP },
	{ NULL, 0, NULL, 0 },
};

/* Returns 0, 1 when --help was printed, or -EINVAL after a message. */
static int lg_opts_parse(int argc, char **argv, struct lg_opts *o)
{
	unsigned port = 0, reply = 0;
	int c;

	o->host = "127.0.0.1";
	o->conns = 1;
	o->threads = 1;
	o->duration_s = 5.0;
	o->warmup_s = 1.0;
	o->timeout_s = 2.0;
	o->pipeline = 1;
	o->request_bytes = (size_t)lg_unescape("PING\\r\\n", o->request,
					       sizeof(o->request));
	o->proto = &lg_proto_raw;

	while ((c = getopt_long(argc, argv, "", lg_longopts, NULL)) != -1) {
		int rc = 0;
		ssize_t n;
		switch (c) {
		case LG_OPT_HOST:
			o->host = optarg;
			break;
		case LG_OPT_PORT:
			rc = lg_parse_uint(optarg, 1, 65535, &port);
			o->port = optarg;
			break;
		case LG_OPT_CONNS:
			rc = lg_parse_uint(optarg, 1, LG_CONNS_MAX, &o->conns);
			break;
		case LG_OPT_THREADS:
			rc = lg_parse_uint(optarg, 1, LG_THREADS_MAX,
					   &o->threads);
			break;
		case LG_OPT_DURATION:
			rc = lg_parse_seconds(optarg, 0.001, LG_DURATION_S_MAX,
					      &o->duration_s);
			break;
		case LG_OPT_WARMUP:
			rc = lg_parse_seconds(optarg, 0.0, LG_DURATION_S_MAX,
					      &o->warmup_s);
			break;
		case LG_OPT_TIMEOUT:
			rc = lg_parse_seconds(optarg, 0.001, 3600.0,
					      &o->timeout_s);
			break;
		case LG_OPT_PIPELINE:
			rc = lg_parse_uint(optarg, 1, LG_PIPELINE_MAX,
					   &o->pipeline);
			break;
		case LG_OPT_REQUEST:
			n = lg_unescape(optarg, o->request, sizeof(o->request));
			if (n <= 0) {
				fprintf(stderr,
					"pc-loadgen: --request: empty, longer than %d bytes, or a bad escape\n",
					LG_REQUEST_BYTES_MAX);
				return -EINVAL;
			}
			o->request_bytes = (size_t)n;
			o->request_given = true;
			break;
		case LG_OPT_REPLY_BYTES:
			rc = lg_parse_uint(optarg, 1, LG_REPLY_BYTES_MAX, &reply);
			o->reply_bytes = reply;
			break;
		case LG_OPT_MODE:
			o->proto = NULL;
			for (size_t i = 0; i < PC_ARRAY_LEN(lg_protos); i++)
				if (strcmp(optarg, lg_protos[i]->name) == 0)
					o->proto = lg_protos[i];
			if (!o->proto) {
				fprintf(stderr, "pc-loadgen: unknown --mode '%s'\n",
					optarg);
				return -EINVAL;
			}
			break;
		case LG_OPT_JSON:
			o->json = true;
			break;
		case LG_OPT_METHOD:
			o->method = optarg;
			break;
		case LG_OPT_PARAMS_HEX:
			n = lg_unhex(optarg, o->params, sizeof(o->params));
			if (n <= 0) {
				fprintf(stderr,
					"pc-loadgen: --params-hex: empty, odd length, not hex, or longer than %d bytes\n",
					LG_REQUEST_BYTES_MAX);
				return -EINVAL;
			}
			o->params_bytes = (size_t)n;
			o->params_given = true;
			break;
		case LG_OPT_HELP:
			lg_usage(stdout);
			return 1;
		default:
			lg_usage(stderr);
			return -EINVAL;
		}
		if (rc < 0) {
			fprintf(stderr, "pc-loadgen: bad value '%s' for --%s\n",
				optarg, lg_longopts[c - LG_OPT_HOST].name);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pc-loadgen: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	if (!o->port) {
		fprintf(stderr, "pc-loadgen: --port is required (see --help)\n");
		return -EINVAL;
	}
	/* More threads than connections would only spin idle loops. */
	if (o->threads > o->conns)
		o->threads = o->conns;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Connections and workers                                                   */
/* ------------------------------------------------------------------------ */

/* One request in flight. */
struct lg_slot {
	uint64_t send_ns;	/* when it was queued: latency starts here */
	uint32_t msgid;		/* what its reply must carry */
	uint32_t busy;		/* 1 while in flight */
};

struct lg_conn {
	int fd;
	unsigned id;		 /* index over all connections, for messages */
	bool dead;		 /* failed and closed; skipped from then on */
	bool want_out;		 /* EPOLLOUT armed: a send was short */
	uint32_t seq;		 /* requests built; the msgid's high bits */
	uint32_t inflight;	 /* requests sent or queued, not yet answered */
	uint32_t ring_head;	 /* ordered modes: slot of the oldest request */
	uint32_t nfree;		 /* unordered modes: slots on the free stack */
	uint32_t *free_slots;	 /* unordered modes: [pipeline] free stack */
	struct lg_slot *slots;	 /* [slot_count] requests, indexed by slot */
	uint64_t last_rx_ns;	 /* last progress, for the stall check */
	uint8_t *tx;		 /* requests not yet accepted by the kernel */
	size_t tx_off, tx_len, tx_cap;
	uint8_t *rx;		 /* received bytes not yet framed into replies */
	size_t rx_len, rx_cap;
};

/* Read-only after start, shared by every worker. */
struct lg_run {
	const struct lg_opts *opts;
	struct lg_proto_cfg cfg;
	char target[300];	/* "host:port", for messages and output */
	/* msgid = seq << slot_bits | slot; slot_count = 1 << slot_bits is
	 * the smallest power of two >= pipeline. */
	unsigned slot_bits;
	uint32_t slot_mask;
	uint64_t measure_start_ns;  /* end of warmup */
	uint64_t measure_end_ns;
	uint64_t timeout_ns;
};

struct lg_worker {
	const struct lg_run *run;
	pthread_t tid;
	int epfd;
	struct lg_conn *conns;	/* owned by this worker only */
	unsigned nconns;
	unsigned live;		/* connections not dead */
	/* Results, read by main after join. */
	uint64_t ops;		/* good replies completed inside the window */
	uint64_t reply_bytes;	/* their bytes, for the mean reply size */
	uint64_t reply_errors;	/* replies carrying an error, whole run */
	uint64_t errors;	/* connections that failed */
	uint64_t stop_ns;	/* when the loop ended (early on failure) */
	int fatal;		/* negative errno from epoll itself */
	struct lg_hist hist;	/* its last line (total, sum) is hot */
	/* Workers sit side by side in one array: keep the next worker's
	 * read-mostly header off the cache line this one writes per op. */
	char pad_[64];
};

/* SIGINT/SIGTERM end the run early; workers poll it at least every tick. */
static atomic_int lg_stop;

static void lg_on_signal(int sig)
{
	atomic_store_explicit(&lg_stop, 1, memory_order_relaxed);
}

static void lg_conn_fail(struct lg_worker *w, struct lg_conn *c,
			 const char *what, int err)
{
	char buf[128];
	/* Workers fail concurrently; strerror's buffer is not theirs to share. */
	if (err)
		fprintf(stderr, "pc-loadgen: conn %u to %s: %s: %s\n", c->id,
			w->run->target, what, strerror_r(err, buf, sizeof(buf)));
	else
		fprintf(stderr, "pc-loadgen: conn %u to %s: %s\n", c->id,
			w->run->target, what);
	close(c->fd);	/* also drops it from the epoll set */
	c->fd = -1;
	c->dead = true;
	w->live--;
	w->errors++;
}

static int lg_conn_set_out(struct lg_worker *w, struct lg_conn *c, bool on)
{
	struct epoll_event ev = {
		.events = EPOLLIN | (on ? EPOLLOUT : 0),
		.data.ptr = c,
	};
	if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		return -errno;
	c->want_out = on;
	return 0;
}

/* Queues one request stamped with now_ns; the caller flushes. */
static int lg_conn_queue_request(struct lg_worker *w, struct lg_conn *c,
				 uint64_t now_ns)
{
	const struct lg_run *run = w->run;
	const struct lg_proto_cfg *cfg = &run->cfg;
	bool ordered = run->opts->proto->ordered;
	PC_DASSERT(c->inflight < run->opts->pipeline);

	if (c->tx_off == c->tx_len) {
		c->tx_off = c->tx_len = 0;
	} else if (c->tx_cap - c->tx_len < cfg->request_bytes_max) {
		memmove(c->tx, c->tx + c->tx_off, c->tx_len - c->tx_off);
		c->tx_len -= c->tx_off;
		c->tx_off = 0;
	}
	/* Peek at the slot; it is taken only once the request is built. */
	uint32_t slot = ordered ? (c->ring_head + c->inflight) & run->slot_mask
				: c->free_slots[c->nfree - 1];
	uint32_t msgid = c->seq << run->slot_bits | slot;
	ssize_t n = run->opts->proto->request_build(
		cfg, msgid, c->tx + c->tx_len, c->tx_cap - c->tx_len);
	if (n < 0)
		return (int)n;
	c->tx_len += (size_t)n;
	c->seq++;
	if (!ordered)
		c->nfree--;
	PC_DASSERT(!c->slots[slot].busy);
	c->slots[slot] = (struct lg_slot){
		.send_ns = now_ns, .msgid = msgid, .busy = 1 };
	c->inflight++;
	return 0;
}

/* The slot of the in-flight request msgid names, or NULL: a reply to a
 * request never sent, already answered, or from a previous slot user. */
static struct lg_slot *lg_conn_slot_find(const struct lg_run *run,
					 struct lg_conn *c, uint32_t msgid)
{
	struct lg_slot *s = &c->slots[msgid & run->slot_mask];
	return s->busy && s->msgid == msgid ? s : NULL;
}

static void lg_conn_slot_release(const struct lg_run *run, struct lg_conn *c,
				 struct lg_slot *s)
{
	uint32_t slot = (uint32_t)(s - c->slots);
	s->busy = 0;
	c->inflight--;
	if (run->opts->proto->ordered) {
		/* The framer answered with the oldest msgid, so this is it. */
		PC_ASSERT(slot == c->ring_head);
		c->ring_head = (c->ring_head + 1) & run->slot_mask;
	} else {
		c->free_slots[c->nfree++] = slot;
	}
}

/* First few error replies of the whole process go to stderr; the rest are
 * only counted, so a server failing every call cannot flood the terminal. */
#define LG_ERRORS_SHOWN_MAX 5
static atomic_uint lg_errors_shown;

static void lg_reply_error_show(const struct lg_worker *w,
				const struct lg_conn *c, uint32_t msgid,
				const uint8_t *err, size_t err_len)
{
	unsigned k = atomic_fetch_add_explicit(&lg_errors_shown, 1,
					       memory_order_relaxed);
	if (k >= LG_ERRORS_SHOWN_MAX)
		return;
	char buf[320];
	struct lg_text t = { .buf = buf, .cap = sizeof(buf) };
	buf[0] = '\0';
	if (lg_mp_render(err, err_len, 0, &t) < 0)
		lg_text_add(&t, "<%zu bytes that do not render>", err_len);
	fprintf(stderr, "pc-loadgen: conn %u to %s: msgid %u answered with error %s%s\n",
		c->id, w->run->target, msgid, buf,
		k + 1 == LG_ERRORS_SHOWN_MAX ? " (further errors only counted)" : "");
}

/* Why a mode rejected reply bytes, in words, into buf. */
static const char *lg_frame_strerror(const struct lg_run *run, int err,
				     char *buf, size_t cap)
{
	switch (err) {
	case EPROTO:
		return run->opts->proto->ordered
			       ? "malformed reply"
			       : "malformed reply: not msgpack (byte 0xc1)";
	case EBADMSG:
		return "reply is not a MessagePack-RPC response [1, msgid, error, result]";
	case EMSGSIZE:
		snprintf(buf, cap,
			 "reply longer than %zu bytes (raise --reply-bytes)",
			 run->cfg.reply_bytes_max);
		return buf;
	default:
		return "malformed reply";
	}
}

/* Hands queued bytes to the kernel; arms EPOLLOUT only while a send is short,
 * so the common case costs no epoll_ctl. Returns 0 or a negative errno. */
static int lg_conn_flush(struct lg_worker *w, struct lg_conn *c)
{
	while (c->tx_off < c->tx_len) {
		ssize_t n = send(c->fd, c->tx + c->tx_off, c->tx_len - c->tx_off,
				 MSG_NOSIGNAL);
		if (n > 0) {
			c->tx_off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return c->want_out ? 0 : lg_conn_set_out(w, c, true);
		return n < 0 ? -errno : -EIO;
	}
	return c->want_out ? lg_conn_set_out(w, c, false) : 0;
}

/*
 * One read per readiness event: epoll is level-triggered, so whatever the
 * read leaves behind is reported again on the next wait, and we save the
 * EAGAIN read that draining would cost on every round trip.
 */
static void lg_conn_on_readable(struct lg_worker *w, struct lg_conn *c)
{
	const struct lg_run *run = w->run;
	const struct lg_proto *proto = run->opts->proto;
	ssize_t n;

	/* Framing consumes every complete reply and fails a reply that would
	 * outgrow reply_bytes_max <= rx_cap, so what stays leaves room. */
	PC_ASSERT(c->rx_len < c->rx_cap);
	do {
		n = read(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			lg_conn_fail(w, c, "read", errno);
		return;
	}
	if (n == 0) {
		lg_conn_fail(w, c, "server closed the connection", 0);
		return;
	}
	/* One clock read per batch: it is both the arrival time of every reply
	 * in this read and the send time of the requests they trigger. */
	uint64_t now_ns = pc_now_ns();
	bool in_window = now_ns >= run->measure_start_ns &&
			 now_ns < run->measure_end_ns;
	c->rx_len += (size_t)n;
	c->last_rx_ns = now_ns;

	size_t off = 0;
	while (off < c->rx_len) {
		if (c->inflight == 0) {
			lg_conn_fail(w, c, "server sent bytes with no request in flight (is --reply-bytes right?)", 0);
			return;
		}
		struct lg_reply rep = { 0 };
		ssize_t len = proto->reply_frame(&run->cfg,
						 c->slots[c->ring_head].msgid,
						 c->rx + off, c->rx_len - off,
						 &rep);
		if (len == 0)
			break;
		if (len < 0) {
			char why[96];
			lg_conn_fail(w, c, lg_frame_strerror(run, (int)-len, why,
							     sizeof(why)), 0);
			return;
		}
		struct lg_slot *s = lg_conn_slot_find(run, c, rep.msgid);
		if (!s) {
			char what[128];
			snprintf(what, sizeof(what),
				 "reply for msgid %u, which no request in flight carries",
				 rep.msgid);
			lg_conn_fail(w, c, what, 0);
			return;
		}
		if (rep.err_len) {
			w->reply_errors++;
			lg_reply_error_show(w, c, rep.msgid,
					    c->rx + off + rep.err_off, rep.err_len);
		} else if (in_window) {
			lg_hist_record(&w->hist, now_ns - s->send_ns);
			w->ops++;
			w->reply_bytes += (uint64_t)len;
		}
		off += (size_t)len;
		lg_conn_slot_release(run, c, s);
		int rc = lg_conn_queue_request(w, c, now_ns);
		if (rc == -ENOSPC) {
			/* The tx buffer holds pipeline requests, so it is only
			 * full when a request still in it got "answered": the
			 * server sent more bytes than the requests we sent. */
			lg_conn_fail(w, c, "reply bytes ran ahead of the requests sent (is --reply-bytes right?)", 0);
			return;
		}
		if (rc < 0) {
			lg_conn_fail(w, c, "building a request", -rc);
			return;
		}
	}
	if (off > 0) {
		c->rx_len -= off;
		memmove(c->rx, c->rx + off, c->rx_len);
	}
	int rc = lg_conn_flush(w, c);
	if (rc < 0)
		lg_conn_fail(w, c, "send", -rc);
}

/* A connection with requests out and nothing back for --timeout is dead:
 * without this an unresponsive server would only show as a low figure. */
static void lg_worker_check_stalls(struct lg_worker *w, uint64_t now_ns)
{
	for (unsigned i = 0; i < w->nconns; i++) {
		struct lg_conn *c = &w->conns[i];
		if (c->dead || c->inflight == 0 ||
		    now_ns - c->last_rx_ns < w->run->timeout_ns)
			continue;
		char what[192];
		snprintf(what, sizeof(what),
			 "no complete reply for %.1f s with %u request(s) in flight and %zu byte(s) of a partial reply; server unresponsive%s",
			 (double)(now_ns - c->last_rx_ns) / 1e9, c->inflight,
			 c->rx_len,
			 c->rx_len ? ", or --reply-bytes too large" : "");
		lg_conn_fail(w, c, what, 0);
	}
}

static void *lg_worker_main(void *arg)
{
	struct lg_worker *w = arg;
	const struct lg_run *run = w->run;
	struct epoll_event events[LG_EVENTS_MAX];
	uint64_t now_ns = pc_now_ns();
	uint64_t next_check_ns = now_ns + LG_TICK_MS * 1000000ull;

	/* Fill every pipeline before the first wait. */
	for (unsigned i = 0; i < w->nconns; i++) {
		struct lg_conn *c = &w->conns[i];
		c->last_rx_ns = now_ns;
		int rc = 0;
		for (unsigned k = 0; k < run->opts->pipeline && rc == 0; k++)
			rc = lg_conn_queue_request(w, c, now_ns);
		if (rc == 0)
			rc = lg_conn_flush(w, c);
		if (rc < 0)
			lg_conn_fail(w, c, "send", -rc);
	}

	while (w->live > 0 &&
	       !atomic_load_explicit(&lg_stop, memory_order_relaxed)) {
		now_ns = pc_now_ns();
		if (now_ns >= run->measure_end_ns)
			break;
		uint64_t left_ms = (run->measure_end_ns - now_ns + 999999) / 1000000;
		int timeout_ms = (int)PC_MIN(left_ms, (uint64_t)LG_TICK_MS);
		int n = epoll_wait(w->epfd, events, LG_EVENTS_MAX, timeout_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			w->fatal = -errno;
			break;
		}
		for (int i = 0; i < n; i++) {
			struct lg_conn *c = events[i].data.ptr;
			if (c->dead)
				continue;
			/* ERR/HUP go through read, which names the error. */
			if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				lg_conn_on_readable(w, c);
			if (!c->dead && (events[i].events & EPOLLOUT)) {
				int rc = lg_conn_flush(w, c);
				if (rc < 0)
					lg_conn_fail(w, c, "send", -rc);
			}
		}
		now_ns = pc_now_ns();
		if (now_ns >= next_check_ns) {
			lg_worker_check_stalls(w, now_ns);
			next_check_ns = now_ns + LG_TICK_MS * 1000000ull;
		}
	}
	w->stop_ns = pc_now_ns();
	return NULL;
}

/* Non-blocking connect with a deadline, so a black-holed address cannot hold
 * us for the kernel's SYN retry time. Returns the fd or a negative errno. */
static int lg_connect_one(const struct addrinfo *ai, uint64_t timeout_ns)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
					       SOCK_CLOEXEC,
			ai->ai_protocol);
	if (fd < 0)
		return -errno;
	/* Small requests must leave at once; Nagle would hold pipelined ones. */
	int one = 1;
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
		goto fail;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS)
			goto fail;
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		int ms = (int)PC_MIN(timeout_ns / 1000000ull, (uint64_t)INT_MAX);
		int rc;
		do {
			rc = poll(&pfd, 1, ms);
		} while (rc < 0 && errno == EINTR);
		if (rc < 0)
			goto fail;
		if (rc == 0) {
			close(fd);
			return -ETIMEDOUT;
		}
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			goto fail;
		if (err) {
			close(fd);
			return -err;
		}
	}
	return fd;
fail:;
	int err = errno;
	close(fd);
	return -err;
}

/* Many connections outrun the usual soft limit of 1024 descriptors; raise it
 * to the hard limit instead of failing half-way through connecting. */
static void lg_raise_fd_limit(unsigned conns)
{
	struct rlimit rl;
	rlim_t want = (rlim_t)conns + 64;  /* + epoll fds, stdio, slack */
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want
						   : PC_MIN(want, rl.rlim_max);
	setrlimit(RLIMIT_NOFILE, &rl);  /* best effort: connect says if short */
}

/* Allocates every connection's buffers and connects it. Start-up only; says
 * what failed on stderr itself, the caller only exits. */
static int lg_workers_setup(struct lg_run *run, struct lg_worker *workers,
			    const struct addrinfo *ai)
{
	const struct lg_opts *o = run->opts;
	size_t rx_cap = PC_MAX((size_t)o->pipeline * run->cfg.reply_bytes_max,
			       (size_t)LG_RX_BYTES_MIN);
	rx_cap = PC_MAX(PC_MIN(rx_cap, (size_t)LG_RX_BYTES_CAP),
			run->cfg.reply_bytes_max);
	size_t tx_cap = (size_t)o->pipeline * run->cfg.request_bytes_max;

	for (unsigned t = 0; t < o->threads; t++) {
		struct lg_worker *w = &workers[t];
		w->run = run;
		w->nconns = o->conns / o->threads + (t < o->conns % o->threads);
		w->conns = pc_xcalloc(w->nconns, sizeof(*w->conns));
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (w->epfd < 0) {
			int err = errno;
			fprintf(stderr, "pc-loadgen: epoll_create1: %s\n",
				strerror(err));
			return -err;
		}
		for (unsigned i = 0; i < w->nconns; i++)
			w->conns[i].fd = -1;
	}
	for (unsigned id = 0; id < o->conns; id++) {
		struct lg_worker *w = &workers[id % o->threads];
		struct lg_conn *c = &w->conns[id / o->threads];
		c->id = id;
		c->slots = pc_xcalloc((size_t)run->slot_mask + 1,
				      sizeof(*c->slots));
		if (!o->proto->ordered) {
			c->free_slots = pc_xcalloc(o->pipeline,
						   sizeof(*c->free_slots));
			/* Reversed, so slot 0 is taken first. */
			for (uint32_t k = 0; k < o->pipeline; k++)
				c->free_slots[k] = o->pipeline - 1 - k;
			c->nfree = o->pipeline;
		}
		c->tx = pc_xcalloc(tx_cap, 1);
		c->tx_cap = tx_cap;
		c->rx = pc_xcalloc(rx_cap, 1);
		c->rx_cap = rx_cap;
		int fd = lg_connect_one(ai, run->timeout_ns);
		if (fd < 0) {
			fprintf(stderr, "pc-loadgen: connect %u of %u to %s: %s\n",
				id + 1, o->conns, run->target, strerror(-fd));
			return fd;
		}
		c->fd = fd;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			int err = errno;
			fprintf(stderr, "pc-loadgen: epoll_ctl: %s\n",
				strerror(err));
			return -err;
		}
		w->live++;
	}
	return 0;
}

static void lg_workers_free(struct lg_worker *workers, unsigned n)
{
	for (unsigned t = 0; t < n; t++) {
		struct lg_worker *w = &workers[t];
		for (unsigned i = 0; w->conns && i < w->nconns; i++) {
			struct lg_conn *c = &w->conns[i];
			if (c->fd >= 0)
				close(c->fd);
			free(c->slots);
			free(c->free_slots);
			free(c->tx);
			free(c->rx);
		}
		free(w->conns);
		if (w->epfd >= 0)
			close(w->epfd);
	}
	free(workers);
}

/* ------------------------------------------------------------------------ */
/* Report                                                                    */
/* ------------------------------------------------------------------------ */

struct lg_result {
	double duration_s;
	uint64_t ops;
	double ops_per_s;
	double p50_us, p90_us, p99_us, p999_us, max_us, mean_us;
	double reply_bytes_mean;  /* over the good replies in the window */
	uint64_t errors;	  /* connections that failed */
	uint64_t reply_errors;	  /* replies whose error was not nil */
};

/* JSON string body: the target comes from the command line, so escape it. */
static void lg_json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(out, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(out, "\\u%04x", ch);
		else
			fputc(ch, out);
	}
	fputc('"', out);
}

static void lg_report(const struct lg_run *run, const struct lg_result *r)
{
	const struct lg_opts *o = run->opts;
	if (o->json) {
		printf("{\"target\":");
		lg_json_str(stdout, run->target);
		printf(",\"mode\":\"%s\",", o->proto->name);
		if (o->method) {
			printf("\"method\":");
			lg_json_str(stdout, o->method);
			printf(",");
		}
		/* reply_bytes: the fixed length (raw) or the largest accepted
		 * (msgpack-rpc); reply_bytes_mean: what actually came back. */
		printf("\"conns\":%u,\"threads\":%u,\"pipeline\":%u,"
		       "\"request_bytes\":%zu,\"reply_bytes\":%zu,"
		       "\"warmup_s\":%.3f,\"duration_s\":%.3f,\"ops\":%llu,"
		       "\"ops_per_s\":%.1f,\"p50_us\":%.2f,\"p90_us\":%.2f,"
		       "\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,"
		       "\"mean_us\":%.2f,\"errors\":%llu,"
		       "\"reply_errors\":%llu,\"reply_bytes_mean\":%.1f}\n",
		       o->conns, o->threads, o->pipeline,
		       run->cfg.request_bytes_max, run->cfg.reply_bytes_max,
		       o->warmup_s, r->duration_s, (unsigned long long)r->ops,
		       r->ops_per_s, r->p50_us, r->p90_us, r->p99_us,
		       r->p999_us, r->max_us, r->mean_us,
		       (unsigned long long)r->errors,
		       (unsigned long long)r->reply_errors,
		       r->reply_bytes_mean);
	} else {
		printf("%s %s%s%s conns=%u threads=%u pipeline=%u: %llu ops in "
		       "%.2f s = %.0f ops/s; latency us p50=%.1f p90=%.1f "
		       "p99=%.1f p99.9=%.1f max=%.1f mean=%.1f; errors=%llu "
		       "reply_errors=%llu\n",
		       run->target, o->proto->name, o->method ? " " : "",
		       o->method ? o->method : "", o->conns, o->threads,
		       o->pipeline, (unsigned long long)r->ops, r->duration_s,
		       r->ops_per_s, r->p50_us, r->p90_us, r->p99_us,
		       r->p999_us, r->max_us, r->mean_us,
		       (unsigned long long)r->errors,
		       (unsigned long long)r->reply_errors);
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct lg_opts *o = pc_xcalloc(1, sizeof(*o));
	int rc = lg_opts_parse(argc, argv, o);
	if (rc != 0) {
		free(o);
		return rc > 0 ? 0 : 2;
	}

	struct lg_run run = { .opts = o };
	run.cfg.request = o->request;
	run.cfg.request_bytes = o->request_bytes;
	run.cfg.request_given = o->request_given;
	run.cfg.reply_bytes = o->reply_bytes;
	run.cfg.method = o->method;
	run.cfg.params = o->params_given ? o->params : NULL;
	run.cfg.params_bytes = o->params_bytes;
	const char *why = "invalid options";
	rc = o->proto->setup(&run.cfg, &why);
	if (rc < 0) {
		fprintf(stderr, "pc-loadgen: --mode %s: %s\n", o->proto->name,
			why);
		free(o);
		return 2;
	}
	/* Limits checked at parse time keep both inside their types. */
	PC_ASSERT(run.cfg.reply_bytes_max <= LG_REPLY_BYTES_MAX);
	uint64_t slot_count = pc_roundup_pow2(o->pipeline);
	run.slot_bits = (unsigned)__builtin_ctzll(slot_count);
	run.slot_mask = (uint32_t)(slot_count - 1);
	run.timeout_ns = (uint64_t)(o->timeout_s * 1e9);
	if (strchr(o->host, ':'))
		snprintf(run.target, sizeof(run.target), "[%s]:%s", o->host,
			 o->port);
	else
		snprintf(run.target, sizeof(run.target), "%s:%s", o->host,
			 o->port);

	struct addrinfo hints = { .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int gai = getaddrinfo(o->host, o->port, &hints, &ai);
	if (gai != 0) {
		fprintf(stderr, "pc-loadgen: cannot resolve %s: %s\n",
			run.target, gai_strerror(gai));
		free(run.cfg.tmpl);
		free(o);
		return 1;
	}

	struct sigaction sa = { .sa_handler = lg_on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	lg_raise_fd_limit(o->conns);
	struct lg_worker *workers = pc_xcalloc(o->threads, sizeof(*workers));
	for (unsigned t = 0; t < o->threads; t++)
		workers[t].epfd = -1;  /* so a partial setup frees cleanly */
	rc = lg_workers_setup(&run, workers, ai);
	freeaddrinfo(ai);
	if (rc < 0) {
		lg_workers_free(workers, o->threads);
		free(run.cfg.tmpl);
		free(o);
		return 1;
	}

	/* Window boundaries are fixed before the first worker starts, so every
	 * thread measures the same interval without talking to the others. */
	uint64_t start_ns = pc_now_ns();
	run.measure_start_ns = start_ns + (uint64_t)(o->warmup_s * 1e9);
	run.measure_end_ns = run.measure_start_ns + (uint64_t)(o->duration_s * 1e9);

	unsigned started = 0;
	for (; started < o->threads; started++) {
		rc = pthread_create(&workers[started].tid, NULL, lg_worker_main,
				    &workers[started]);
		if (rc != 0) {
			fprintf(stderr, "pc-loadgen: pthread_create: %s\n",
				strerror(rc));
			atomic_store(&lg_stop, 1);
			break;
		}
	}

	struct lg_hist *hist = pc_xcalloc(1, sizeof(*hist));
	struct lg_result r = { 0 };
	uint64_t stop_ns = run.measure_start_ns;
	uint64_t reply_bytes = 0;
	int fatal = 0;
	for (unsigned t = 0; t < started; t++) {
		pthread_join(workers[t].tid, NULL);
		lg_hist_merge(hist, &workers[t].hist);
		r.ops += workers[t].ops;
		r.errors += workers[t].errors;
		r.reply_errors += workers[t].reply_errors;
		reply_bytes += workers[t].reply_bytes;
		stop_ns = PC_MAX(stop_ns, workers[t].stop_ns);
		if (workers[t].fatal)
			fatal = workers[t].fatal;
	}
	if (fatal)
		fprintf(stderr, "pc-loadgen: epoll_wait: %s\n", strerror(-fatal));

	/* A run cut short (signal, every connection dead) is rated over the
	 * time it actually measured, not the window it asked for. */
	stop_ns = PC_MIN(stop_ns, run.measure_end_ns);
	r.duration_s = (double)(stop_ns - run.measure_start_ns) / 1e9;
	r.ops_per_s = r.duration_s > 0 ? (double)r.ops / r.duration_s : 0.0;
	r.p50_us = (double)lg_hist_quantile_ns(hist, 0.50) / 1e3;
	r.p90_us = (double)lg_hist_quantile_ns(hist, 0.90) / 1e3;
	r.p99_us = (double)lg_hist_quantile_ns(hist, 0.99) / 1e3;
	r.p999_us = (double)lg_hist_quantile_ns(hist, 0.999) / 1e3;
	r.max_us = (double)hist->max_ns / 1e3;
	r.mean_us = hist->total ? (double)hist->sum_ns / (double)hist->total / 1e3
				: 0.0;
	r.reply_bytes_mean = r.ops ? (double)reply_bytes / (double)r.ops : 0.0;
	lg_report(&run, &r);

	int status = 0;
	if (r.errors || fatal || started < o->threads) {
		fprintf(stderr, "pc-loadgen: %llu of %u connection(s) failed; figures are not trustworthy\n",
			(unsigned long long)r.errors, o->conns);
		status = 1;
	} else if (r.reply_errors) {
		fprintf(stderr, "pc-loadgen: %llu repl%s carried an error (not counted in ops); figures are not trustworthy\n",
			(unsigned long long)r.reply_errors,
			r.reply_errors == 1 ? "y" : "ies");
		status = 1;
	} else if (atomic_load(&lg_stop)) {
		fprintf(stderr, "pc-loadgen: interrupted; figures cover %.2f s\n",
			r.duration_s);
		status = 1;
	} else if (r.ops == 0) {
		fprintf(stderr, "pc-loadgen: no request completed in the measured window\n");
		status = 1;
	}
	free(hist);
	lg_workers_free(workers, o->threads);
	free(run.cfg.tmpl);
	free(o);
	return status;
}
