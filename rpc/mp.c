/*
 * rpc/mp.c — the MessagePack scanner, cursor reader and write buffer.
 *
 * Owns: nothing global (mp_scan_held allocates its caller's scan state).
 * Any thread. Invariants: no function here allocates from a count read off
 * the wire; the scanner never reads past len and never
 * recurses (an explicit stack of at most MP_DEPTH_MAX counts); the cursor
 * never reads past end.
 */
#include "mp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* What one header byte sequence says. */
struct mp_head {
	enum mp_type type;
	size_t hlen;     /* bytes of the header (type byte + length fields) */
	uint64_t plen;   /* payload bytes after the header (str/bin/ext/num) */
	uint64_t count;  /* array: elements; map: pairs */
	uint64_t u;      /* UINT: value; INT/BOOL: raw bits */
};

static uint64_t be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

/* Header lengths by type byte for 0xc0..0xdf (0 = invalid). */
static const uint8_t head_len[32] = {
	1, 0, 1, 1, 2, 3, 5, 3, 4, 6, 5, 9, 2, 3, 5, 9,
	2, 3, 5, 9, 2, 2, 2, 2, 2, 2, 3, 5, 3, 5, 3, 5,
};

/*
 * Decode the header at p with avail bytes. Returns 1 when decoded, 0 when
 * more bytes are needed (h->hlen says how many the header has), or -EBADMSG.
 */
static int mp_head(const uint8_t *p, size_t avail, struct mp_head *h)
{
	uint8_t b = p[0];
	memset(h, 0, sizeof(*h));
	h->hlen = 1;
	if (b <= 0x7f) {
		h->type = MP_T_UINT;
		h->u = b;
		return 1;
	}
	if (b >= 0xe0) {
		h->type = MP_T_INT;
		h->u = (uint64_t)(int64_t)(int8_t)b;
		return 1;
	}
	if (b <= 0x8f) {
		h->type = MP_T_MAP;
		h->count = b & 0x0f;
		return 1;
	}
	if (b <= 0x9f) {
		h->type = MP_T_ARRAY;
		h->count = b & 0x0f;
		return 1;
	}
	if (b <= 0xbf) {
		h->type = MP_T_STR;
		h->plen = b & 0x1f;
		return 1;
	}
	h->hlen = head_len[b - 0xc0];
	if (h->hlen == 0)
		return -EBADMSG;
	if (avail < h->hlen)
		return 0;
	const uint8_t *q = p + 1;
	switch (b) {
	case 0xc0: h->type = MP_T_NIL; break;
	case 0xc2: case 0xc3: h->type = MP_T_BOOL; h->u = b & 1; break;
	case 0xc4: case 0xc5: case 0xc6:
		h->type = MP_T_BIN;
		h->plen = be(q, (unsigned)h->hlen - 1);
		break;
	case 0xc7: case 0xc8: case 0xc9:
		h->type = MP_T_EXT; /* length fields, then the ext type byte */
		h->plen = be(q, (unsigned)h->hlen - 2);
		break;
	case 0xca: h->type = MP_T_FLOAT; h->u = be(q, 4); break;
	case 0xcb: h->type = MP_T_FLOAT; h->u = be(q, 8); break;
	case 0xcc: case 0xcd: case 0xce: case 0xcf:
		h->type = MP_T_UINT;
		h->u = be(q, (unsigned)h->hlen - 1);
		break;
	case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
		unsigned n = (unsigned)h->hlen - 1;
		uint64_t raw = be(q, n);
		int64_t v = n == 8 ? (int64_t)raw
				   : (int64_t)(raw << (64 - 8 * n)) >> (64 - 8 * n);
		h->type = v < 0 ? MP_T_INT : MP_T_UINT;
		h->u = (uint64_t)v;
		break;
	}
	case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
		h->type = MP_T_EXT;
		h->plen = 1u << (b - 0xd4);
		break;
	case 0xd9: case 0xda: case 0xdb:
		h->type = MP_T_STR;
		h->plen = be(q, (unsigned)h->hlen - 1);
		break;
	case 0xdc: case 0xdd:
		h->type = MP_T_ARRAY;
		h->count = be(q, (unsigned)h->hlen - 1);
		break;
	case 0xde: case 0xdf:
		h->type = MP_T_MAP;
		h->count = be(q, (unsigned)h->hlen - 1);
		break;
	}
	return 1;
}

void mp_scan_begin(struct mp_scan_state *st)
{
	st->pos = 0;
	st->objects = 1;
	st->depth = 0;
	st->left[0] = 1;
}

/*
 * The state is always at an object boundary, or past the end of an object
 * whose payload has not all arrived (pos > len): an object is counted off
 * its level only once its whole header is here, so a call that stops for
 * want of bytes leaves nothing half done.
 */
/* Stop for more bytes: the scan stands at pos; need is what to wait for. */
static int need_more(struct mp_scan_state *st, size_t pos, size_t need,
		     size_t *size)
{
	st->pos = pos;
	*size = need;
	return MP_NEED_MORE;
}

int mp_scan_resume(struct mp_scan_state *st, const uint8_t *p, size_t len,
		   const struct mp_limits *lim, size_t *size)
{
	uint32_t max_depth = PC_MIN(lim->max_depth, (uint32_t)MP_DEPTH_MAX);
	size_t pos = st->pos;
	for (;;) {
		if (pos > len) /* a payload that has not all arrived */
			return need_more(st, pos, pos, size);
		while (st->left[st->depth] == 0 && st->depth > 0)
			st->depth--;
		if (st->left[st->depth] == 0) {
			*size = pos;
			return MP_COMPLETE;
		}
		if (pos >= len)
			return need_more(st, pos, pos + 1, size);
		struct mp_head h;
		int ret = mp_head(p + pos, len - pos, &h);
		if (ret < 0)
			return ret;
		if (ret == 0)
			return need_more(st, pos, pos + h.hlen, size);
		st->left[st->depth]--;
		if (h.type == MP_T_ARRAY || h.type == MP_T_MAP) {
			if (h.count > lim->max_elements)
				return -E2BIG;
			uint64_t n = h.type == MP_T_MAP ? 2 * h.count : h.count;
			st->objects += n;
			if (st->objects > lim->max_objects)
				return -E2BIG;
			/* Each element takes at least one byte. */
			if (pos + h.hlen + n > lim->max_bytes)
				return -EMSGSIZE;
			if (n > 0) {
				if (st->depth + 1 > max_depth)
					return -ELOOP;
				st->left[++st->depth] = n;
			}
		}
		if (h.plen > lim->max_bytes ||
		    pos + h.hlen + h.plen > lim->max_bytes)
			return -EMSGSIZE;
		pos += h.hlen + (size_t)h.plen;
	}
}

int mp_scan(const uint8_t *p, size_t len, const struct mp_limits *lim,
	    size_t *size)
{
	struct mp_scan_state st;
	mp_scan_begin(&st);
	return mp_scan_resume(&st, p, len, lim, size);
}

int mp_scan_held(struct mp_scan_state **held, const uint8_t *p, size_t len,
		 const struct mp_limits *lim, size_t *size)
{
	struct mp_scan_state here, *st = *held;
	if (!st) {
		st = &here;
		mp_scan_begin(st);
	}
	int ret = mp_scan_resume(st, p, len, lim, size);
	if (ret == MP_NEED_MORE && !*held) {
		*held = malloc(sizeof(**held));
		if (*held)
			**held = here;
	} else if (ret != MP_NEED_MORE) {
		free(*held);
		*held = NULL;
	}
	return ret;
}

/* ------------------------------------------------------------------ reader */

/* Decode the next header; -EBADMSG when it does not fit in the buffer. */
static int rd_head(const struct mp_rd *r, struct mp_head *h)
{
	if (r->p >= r->end)
		return -EBADMSG;
	int ret = mp_head(r->p, (size_t)(r->end - r->p), h);
	if (ret <= 0)
		return -EBADMSG;
	if (h->hlen + h->plen > (uint64_t)(r->end - r->p))
		return -EBADMSG;
	return 0;
}

enum mp_type mp_peek(const struct mp_rd *r)
{
	struct mp_head h;
	if (r->p >= r->end)
		return MP_T_END;
	return rd_head(r, &h) < 0 ? MP_T_BAD : h.type;
}

const char *mp_type_name(enum mp_type t)
{
	static const char *const names[] = {
		"nil", "bool", "unsigned integer", "negative integer", "float",
		"str", "bin", "array", "map", "ext", "nothing", "invalid"};
	return (unsigned)t < PC_ARRAY_LEN(names) ? names[t] : "?";
}

/* Read the next header if it has type t (or one of two types). */
static int rd_expect(struct mp_rd *r, struct mp_head *h, enum mp_type t,
		     enum mp_type t2)
{
	int ret = rd_head(r, h);
	if (ret < 0)
		return ret;
	if (h->type != t && h->type != t2)
		return -EINVAL;
	r->p += h->hlen;
	return 0;
}

int mp_rd_nil(struct mp_rd *r)
{
	struct mp_head h;
	return rd_expect(r, &h, MP_T_NIL, MP_T_NIL);
}

bool mp_rd_try_nil(struct mp_rd *r)
{
	return mp_rd_nil(r) == 0;
}

int mp_rd_bool(struct mp_rd *r, bool *v)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_BOOL, MP_T_BOOL);
	if (ret == 0)
		*v = h.u != 0;
	return ret;
}

int mp_rd_uint(struct mp_rd *r, uint64_t *v)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_UINT, MP_T_UINT);
	if (ret == 0)
		*v = h.u;
	return ret;
}

int mp_rd_int(struct mp_rd *r, int64_t *v)
{
	struct mp_head h;
	int ret = rd_head(r, &h);
	if (ret < 0)
		return ret;
	if (h.type == MP_T_UINT && h.u > (uint64_t)INT64_MAX)
		return -ERANGE;
	if (h.type != MP_T_UINT && h.type != MP_T_INT)
		return -EINVAL;
	r->p += h.hlen;
	*v = (int64_t)h.u;
	return 0;
}

int mp_rd_float(struct mp_rd *r, double *v)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_FLOAT, MP_T_FLOAT);
	if (ret < 0)
		return ret;
	if (h.hlen == 5) {
		uint32_t bits = (uint32_t)h.u;
		float f;
		memcpy(&f, &bits, sizeof(f));
		*v = f;
	} else {
		memcpy(v, &h.u, sizeof(*v));
	}
	return 0;
}

int mp_rd_str(struct mp_rd *r, const char **s, uint32_t *len)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_STR, MP_T_STR);
	if (ret < 0)
		return ret;
	*s = (const char *)r->p;
	*len = (uint32_t)h.plen;
	r->p += h.plen;
	return 0;
}

int mp_rd_bin(struct mp_rd *r, const uint8_t **b, uint32_t *len)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_BIN, MP_T_BIN);
	if (ret < 0)
		return ret;
	*b = r->p;
	*len = (uint32_t)h.plen;
	r->p += h.plen;
	return 0;
}

int mp_rd_array(struct mp_rd *r, uint32_t *n)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_ARRAY, MP_T_ARRAY);
	if (ret == 0)
		*n = (uint32_t)h.count;
	return ret;
}

int mp_rd_map(struct mp_rd *r, uint32_t *n)
{
	struct mp_head h;
	int ret = rd_expect(r, &h, MP_T_MAP, MP_T_MAP);
	if (ret == 0)
		*n = (uint32_t)h.count;
	return ret;
}

int mp_skip(struct mp_rd *r)
{
	/* Objects still to skip: containers add their elements to the count,
	 * so no stack is needed. */
	uint64_t left = 1;
	const uint8_t *p = r->p;
	while (left) {
		struct mp_rd tmp = {p, r->end};
		struct mp_head h;
		int ret = rd_head(&tmp, &h);
		if (ret < 0)
			return ret;
		left--;
		if (h.type == MP_T_ARRAY)
			left += h.count;
		else if (h.type == MP_T_MAP)
			left += 2 * h.count;
		p += h.hlen + h.plen;
		if ((uint64_t)(r->end - p) < left)
			return -EBADMSG; /* each object takes a byte */
	}
	r->p = p;
	return 0;
}

bool mp_str_eq(const char *s, uint32_t len, const char *lit)
{
	size_t n = strlen(lit);
	return n == len && memcmp(s, lit, n) == 0;
}

/* ------------------------------------------------------------ msgpack glue */

int mp_wbuf_write(void *data, const char *buf, size_t len)
{
	return pc_wbuf_append(data, buf, len) < 0 ? -1 : 0;
}
