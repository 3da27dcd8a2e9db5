/*
 * modules/etcd_wire.c — JSON reader, base64 and HTTP/1.1 response reader for
 * the etcd discovery backend (etcd_wire.h). Pure functions over the
 * caller's buffers; written for the few replies of etcd's v3 gateway, not
 * as a general library.
 *
 * Threading: none (reentrant).
 *
 * Invariants: nothing reads outside [p, p + n) of the value or buffer it
 * was given; the accessors assume a text etcd_json_parse accepted (they
 * re-scan with the same bounded scanner, so a text it did not accept still
 * yields -EPROTO, never a read past the end).
 */
#include "modules/etcd_wire.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------ JSON */

static const char *ws(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

static bool hexval(char c, unsigned *v)
{
	if (c >= '0' && c <= '9')
		*v = (unsigned)(c - '0');
	else if (c >= 'a' && c <= 'f')
		*v = (unsigned)(c - 'a' + 10);
	else if (c >= 'A' && c <= 'F')
		*v = (unsigned)(c - 'A' + 10);
	else
		return false;
	return true;
}

/* A string starting at its opening quote: the byte after its closing one. */
static const char *scan_str(const char *p, const char *end)
{
	for (p++; p < end; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '"')
			return p + 1;
		if (c < 0x20)
			return NULL;
		if (c != '\\')
			continue;
		if (++p == end)
			return NULL;
		if (*p == 'u') {
			unsigned v;
			for (int i = 0; i < 4; i++)
				if (++p == end || !hexval(*p, &v))
					return NULL;
		} else if (!*p || !strchr("\"\\/bfnrt", *p)) {
			return NULL;
		}
	}
	return NULL;
}

static const char *scan_digits(const char *p, const char *end)
{
	const char *s = p;
	while (p < end && *p >= '0' && *p <= '9')
		p++;
	return p == s ? NULL : p;
}

static const char *scan_num(const char *p, const char *end)
{
	if (p < end && *p == '-')
		p++;
	if (p < end && *p == '0')
		p++;
	else if (!(p = scan_digits(p, end)))
		return NULL;
	if (p < end && *p == '.' && !(p = scan_digits(p + 1, end)))
		return NULL;
	if (p < end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < end && (*p == '+' || *p == '-'))
			p++;
		if (!(p = scan_digits(p, end)))
			return NULL;
	}
	return p;
}

static const char *scan_word(const char *p, const char *end, const char *w)
{
	size_t n = strlen(w);
	return (size_t)(end - p) >= n && memcmp(p, w, n) == 0 ? p + n : NULL;
}

/* One value at p (no leading whitespace): the byte after it, its type in
 * *type; NULL if malformed or deeper than ETCD_JSON_DEPTH. */
static const char *scan_value(const char *p, const char *end, int depth,
			      int *type)
{
	if (p >= end || depth > ETCD_JSON_DEPTH)
		return NULL;
	int t;
	switch (*p) {
	case '"':
		*type = ETCD_J_STR;
		return scan_str(p, end);
	case 't':
		*type = ETCD_J_BOOL;
		return scan_word(p, end, "true");
	case 'f':
		*type = ETCD_J_BOOL;
		return scan_word(p, end, "false");
	case 'n':
		*type = ETCD_J_NULL;
		return scan_word(p, end, "null");
	case '[':
	case '{': {
		bool obj = *p == '{';
		char close = obj ? '}' : ']';
		*type = obj ? ETCD_J_OBJ : ETCD_J_ARR;
		p = ws(p + 1, end);
		if (p < end && *p == close)
			return p + 1;
		for (;;) {
			if (obj) {
				if (p >= end || *p != '"' ||
				    !(p = scan_str(p, end)))
					return NULL;
				p = ws(p, end);
				if (p >= end || *p != ':')
					return NULL;
				p = ws(p + 1, end);
			}
			if (!(p = scan_value(p, end, depth + 1, &t)))
				return NULL;
			p = ws(p, end);
			if (p >= end)
				return NULL;
			if (*p == close)
				return p + 1;
			if (*p != ',')
				return NULL;
			p = ws(p + 1, end);
		}
	}
	default:
		*type = ETCD_J_NUM;
		return scan_num(p, end);
	}
}

int etcd_json_parse(const char *s, size_t len, struct etcd_json *root)
{
	const char *end = s + len;
	const char *p = ws(s, end);
	const char *e = scan_value(p, end, 0, &root->type);
	if (!e || ws(e, end) != end)
		return -EPROTO;
	root->p = p;
	root->n = (size_t)(e - p);
	return 0;
}

/* The element or member at *pos inside container v (after its opening
 * bracket): 1 with *out (and the member name in *name if an object), 0 at
 * the close, -EPROTO. */
static int walk(const struct etcd_json *v, size_t *pos, struct etcd_json *name,
		struct etcd_json *out)
{
	const char *end = v->p + v->n;
	const char *p = v->p + (*pos ? *pos : 1);
	p = ws(p, end);
	if (p < end && *p == ',')
		p = ws(p + 1, end);
	if (p >= end)
		return -EPROTO;
	if (*p == (v->type == ETCD_J_OBJ ? '}' : ']'))
		return 0;
	if (v->type == ETCD_J_OBJ) {
		const char *ne = *p == '"' ? scan_str(p, end) : NULL;
		if (!ne)
			return -EPROTO;
		name->p = p;
		name->n = (size_t)(ne - p);
		name->type = ETCD_J_STR;
		p = ws(ne, end);
		if (p >= end || *p != ':')
			return -EPROTO;
		p = ws(p + 1, end);
	}
	const char *e = scan_value(p, end, 1, &out->type);
	if (!e)
		return -EPROTO;
	out->p = p;
	out->n = (size_t)(e - p);
	*pos = (size_t)(e - v->p);
	return 1;
}

int etcd_json_get(const struct etcd_json *obj, const char *key,
		  struct etcd_json *out)
{
	if (obj->type != ETCD_J_OBJ)
		return -EPROTO;
	size_t pos = 0, kl = strlen(key);
	struct etcd_json name, val;
	int ret;
	while ((ret = walk(obj, &pos, &name, &val)) == 1)
		/* member names etcd sends need no unescaping */
		if (name.n == kl + 2 && memcmp(name.p + 1, key, kl) == 0) {
			*out = val;
			return 0;
		}
	return ret < 0 ? ret : -ENOENT;
}

int etcd_json_path(const struct etcd_json *obj, const char *path,
		   struct etcd_json *out)
{
	struct etcd_json cur = *obj;
	char part[64];
	while (*path) {
		size_t n = strcspn(path, ".");
		if (n == 0 || n >= sizeof(part))
			return -EINVAL;
		memcpy(part, path, n);
		part[n] = '\0';
		int ret = etcd_json_get(&cur, part, &cur);
		if (ret < 0)
			return ret;
		path += n + (path[n] == '.');
	}
	*out = cur;
	return 0;
}

int etcd_json_next(const struct etcd_json *arr, size_t *pos,
		   struct etcd_json *out)
{
	if (arr->type != ETCD_J_ARR)
		return -EPROTO;
	return walk(arr, pos, NULL, out);
}

int etcd_json_int(const struct etcd_json *v, int64_t *out)
{
	const char *p = v->p, *end = v->p + v->n;
	if (v->type == ETCD_J_STR) {
		p++;
		end--;
	} else if (v->type != ETCD_J_NUM) {
		return -EPROTO;
	}
	bool neg = p < end && *p == '-';
	p += neg;
	if (p == end)
		return -EPROTO;
	uint64_t x = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : INT64_MAX;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9')
			return -EPROTO; /* fractions, exponents, junk */
		unsigned d = (unsigned)(*p - '0');
		if (x > (lim - d) / 10)
			return -ERANGE;
		x = x * 10 + d;
	}
	*out = neg ? (int64_t)(0 - x) : (int64_t)x;
	return 0;
}

int etcd_json_str(const struct etcd_json *v, char *buf, size_t cap)
{
	if (v->type != ETCD_J_STR || v->n < 2 || cap == 0)
		return -EPROTO;
	const char *p = v->p + 1, *end = v->p + v->n - 1;
	size_t o = 0;
	while (p < end) {
		char c = *p++;
		if (c == '\\') {
			if (p >= end)
				return -EPROTO;
			c = *p++;
			static const char from[] = "\"\\/bfnrt",
					  to[] = "\"\\/\b\f\n\r\t";
			const char *k = strchr(from, c);
			if (c == 'u') {
				unsigned x = 0, h;
				for (int i = 0; i < 4; i++) {
					if (p >= end || !hexval(*p++, &h))
						return -EPROTO;
					x = x * 16 + h;
				}
				if (x == 0 || x > 0x7f)
					return -EPROTO;
				c = (char)x;
			} else if (k && c) {
				c = to[k - from];
			} else {
				return -EPROTO;
			}
		}
		if (o + 1 >= cap)
			return -ENOSPC;
		buf[o++] = c;
	}
	buf[o] = '\0';
	return (int)o;
}

int etcd_json_bool(const struct etcd_json *v, bool *out)
{
	if (v->type != ETCD_J_BOOL)
		return -EPROTO;
	*out = v->p[0] == 't';
	return 0;
}

/* ------------------------------------------------------------ base64 */

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t etcd_b64_enc(const void *in, size_t n, char *out)
{
	const unsigned char *s = in;
	size_t o = 0;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)s[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)s[i + 1] << 8;
		if (i + 2 < n)
			v |= s[i + 2];
		out[o++] = b64[v >> 18];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? b64[v & 63] : '=';
	}
	out[o] = '\0';
	return o;
}

int etcd_b64_dec(const char *in, size_t n, void *out, size_t cap)
{
	unsigned char *d = out;
	size_t o = 0;
	if (n % 4)
		return -EPROTO;
	for (size_t i = 0; i < n; i += 4) {
		uint32_t v = 0;
		unsigned pad = 0;
		for (int j = 0; j < 4; j++) {
			char c = in[i + j];
			const char *k = c ? strchr(b64, c) : NULL;
			if (c == '=' && i + 4 == n && j >= 2) {
				pad++;
				v <<= 6;
				continue;
			}
			if (!k || pad)
				return -EPROTO;
			v = v << 6 | (uint32_t)(k - b64);
		}
		unsigned bytes = 3 - pad;
		if (o + bytes > cap)
			return -ENOSPC;
		d[o++] = (unsigned char)(v >> 16);
		if (bytes > 1)
			d[o++] = (unsigned char)(v >> 8);
		if (bytes > 2)
			d[o++] = (unsigned char)v;
	}
	return (int)o;
}

/* ------------------------------------------------------------ HTTP */

/* Does header line [p, e) name `name` (case-insensitive)? Its value then
 * starts at *val (leading blanks skipped). */
static bool header_is(const char *p, const char *e, const char *name,
		      const char **val)
{
	size_t n = strlen(name);
	if ((size_t)(e - p) <= n || strncasecmp(p, name, n) != 0 || p[n] != ':')
		return false;
	p += n + 1;
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	*val = p;
	return true;
}

/* Does [v, e) hold `word` as one of its comma-separated tokens? */
static bool has_token(const char *v, const char *e, const char *word)
{
	size_t n = strlen(word);
	while (v < e) {
		while (v < e && (*v == ' ' || *v == '\t' || *v == ','))
			v++;
		const char *t = v;
		while (v < e && *v != ',' && *v != ' ' && *v != '\t')
			v++;
		if ((size_t)(v - t) == n && strncasecmp(t, word, n) == 0)
			return true;
	}
	return false;
}

int etcd_http_head(const char *buf, size_t len, struct etcd_http_head *h)
{
	const char *end = NULL;
	for (size_t i = 3; i < len && i < ETCD_HTTP_HEAD_MAX; i++)
		if (memcmp(buf + i - 3, "\r\n\r\n", 4) == 0) {
			end = buf + i + 1;
			break;
		}
	if (!end)
		return len >= ETCD_HTTP_HEAD_MAX ? -EPROTO : 0;
	memset(h, 0, sizeof(*h));
	h->content_length = -1;
	h->head_len = (size_t)(end - buf);
	/* "HTTP/1.x NNN reason" */
	if (h->head_len < 14 || memcmp(buf, "HTTP/1.", 7) != 0 ||
	    (buf[7] != '0' && buf[7] != '1') || buf[8] != ' ')
		return -EPROTO;
	for (int i = 9; i < 12; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			return -EPROTO;
		h->status = h->status * 10 + (buf[i] - '0');
	}
	if (buf[12] != ' ' && buf[12] != '\r')
		return -EPROTO;
	h->close = buf[7] == '0';
	const char *p = (const char *)memchr(buf, '\n', h->head_len) + 1;
	while (p < end - 2) {
		const char *e = memchr(p, '\n', (size_t)(end - p));
		if (!e || e == p || e[-1] != '\r')
			return -EPROTO;
		const char *le = e - 1, *v;
		if (header_is(p, le, "content-length", &v)) {
			int64_t n = 0;
			if (v == le)
				return -EPROTO;
			for (; v < le && *v != ' '; v++) {
				if (*v < '0' || *v > '9' ||
				    n > (INT64_MAX - 9) / 10)
					return -EPROTO;
				n = n * 10 + (*v - '0');
			}
			if (h->content_length >= 0 && h->content_length != n)
				return -EPROTO;
			h->content_length = n;
		} else if (header_is(p, le, "transfer-encoding", &v)) {
			if (!has_token(v, le, "chunked"))
				return -EPROTO; /* no other coding is read */
			h->chunked = true;
		} else if (header_is(p, le, "connection", &v)) {
			h->close = has_token(v, le, "close");
		}
		p = e + 1;
	}
	if (h->chunked)
		h->content_length = -1;
	return 1;
}

enum { CK_SIZE, CK_EXT, CK_SIZE_LF, CK_DATA, CK_DATA_CR, CK_DATA_LF,
       CK_TRAILER, CK_TRAILER_LF, CK_DONE };

#define CK_MAX (1ull << 40)
#define CK_LINE_MAX 4096

int etcd_chunks_decode(struct etcd_chunks *c, const char *in, size_t n,
		       size_t *used, char *out, size_t cap, size_t *made)
{
	size_t i = 0, o = 0;
	while (i < n && c->state != CK_DONE) {
		char ch = in[i];
		unsigned v;
		switch (c->state) {
		case CK_SIZE:
			if (hexval(ch, &v)) {
				if (c->left >= CK_MAX / 16)
					goto bad;
				c->left = c->left * 16 + v;
				c->line++;
			} else if (c->line && (ch == ';' || ch == ' ' ||
					       ch == '\t')) {
				c->state = CK_EXT;
			} else if (c->line && ch == '\r') {
				c->state = CK_SIZE_LF;
			} else {
				goto bad;
			}
			i++;
			break;
		case CK_EXT: /* chunk extensions: ignored */
			if (ch == '\r')
				c->state = CK_SIZE_LF;
			else if (++c->line > CK_LINE_MAX || ch == '\n')
				goto bad;
			i++;
			break;
		case CK_SIZE_LF:
			if (ch != '\n')
				goto bad;
			i++;
			c->line = 0;
			c->state = c->left ? CK_DATA : CK_TRAILER;
			break;
		case CK_DATA: {
			size_t k = n - i;
			if (k > c->left)
				k = (size_t)c->left;
			if (k > cap - o)
				k = cap - o;
			if (k == 0) /* out is full */
				goto out;
			memcpy(out + o, in + i, k);
			o += k;
			i += k;
			if ((c->left -= k) == 0)
				c->state = CK_DATA_CR;
			break;
		}
		case CK_DATA_CR:
		case CK_DATA_LF:
			if (ch != (c->state == CK_DATA_CR ? '\r' : '\n'))
				goto bad;
			c->state = c->state == CK_DATA_CR ? CK_DATA_LF : CK_SIZE;
			i++;
			break;
		case CK_TRAILER: /* lines until an empty one */
			if (ch == '\r') {
				c->state = CK_TRAILER_LF;
			} else if (ch == '\n' || ++c->line > CK_LINE_MAX) {
				goto bad;
			}
			i++;
			break;
		case CK_TRAILER_LF:
			if (ch != '\n')
				goto bad;
			i++;
			c->state = c->line ? CK_TRAILER : CK_DONE;
			c->line = 0;
			break;
		}
	}
out:
	*used = i;
	*made = o;
	return c->state == CK_DONE ? 1 : 0;
bad: /* what was consumed and made before the error, for the record */
	*used = i;
	*made = o;
	return -EPROTO;
}
