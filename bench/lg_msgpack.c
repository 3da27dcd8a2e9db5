/*
 * bench/lg_msgpack.c — pc-loadgen's MessagePack header decoder, object skipper
 * and error renderer (see lg_msgpack.h for why it is not rpc/mp.c).
 *
 * Owns: the read-only marker table. Any thread: workers frame replies with
 * it concurrently, and it keeps no state between calls.
 *
 * Invariants: no function reads past len; none allocates; lg_mp_skip runs at
 * most one iteration per byte and fails a declared size beyond its limit
 * before waiting for the bytes; lg_mp_render recursion is bounded by
 * LG_RENDER_DEPTH_MAX.
 */
#include "lg_msgpack.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

ssize_t lg_mp_head(const uint8_t *p, size_t len, struct lg_mp_head *h)
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

bool lg_mp_head_u64(const struct lg_mp_head *h, uint64_t *out)
{
	if (h->kind == LG_MP_UINT ||
	    (h->kind == LG_MP_INT && (int64_t)h->val >= 0)) {
		*out = h->val;
		return true;
	}
	return false;
}

ssize_t lg_mp_skip(const uint8_t *p, size_t len, size_t limit)
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

PC_PRINTF(2, 3) void lg_text_add(struct lg_text *t, const char *fmt, ...)
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

ssize_t lg_mp_render(const uint8_t *p, size_t len, unsigned depth,
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
