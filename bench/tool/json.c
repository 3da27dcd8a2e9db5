/*
 * bench/tool/json.c — a small strict JSON reader, and the reading back of a
 * report that pcb_report_json wrote (for `peercache-bench compare`).
 *
 * The reader is a bounded recursive descent into a flat array of nodes: at
 * most PCB_JSON_BYTES_MAX bytes of input and PCB_JSON_DEPTH_MAX levels, so
 * no input can exhaust the stack, and every node is a value actually present
 * in the input, so no declared count is ever trusted. Any byte string either
 * parses or fails with the byte offset and the reason (fuzzed).
 *
 * Owns: nothing global. Called from one thread.
 */
#include "report_int.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ UTF-8 */

void pcb_copy_utf8(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src), cut;

	if (len == 0)
		return;
	if (n < len) {
		memcpy(dst, src, n + 1);
		return;
	}
	/* back off over continuation bytes to the start of a character */
	cut = len - 1;
	while (cut > 0 && ((unsigned char)src[cut] & 0xc0) == 0x80)
		cut--;
	memcpy(dst, src, cut);
	dst[cut] = '\0';
}

/* ----------------------------------------------------------------- parser */

struct parser {
	struct pcb_json_doc *doc;
	const unsigned char *s;
	size_t len, pos;
	char *err;
	size_t errlen;
	int rc; /* the first failure */
};

static int fail_at(struct parser *p, size_t off, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail_at(struct parser *p, size_t off, int rc, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (p->rc)
		return -1;
	p->rc = rc;
	n = snprintf(p->err, p->errlen, "at byte %zu: ", off);
	if (n >= 0 && (size_t)n < p->errlen) {
		va_start(ap, fmt);
		vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

#define FAIL(p, ...) fail_at(p, (p)->pos, -EINVAL, __VA_ARGS__)

static void skip_ws(struct parser *p)
{
	while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
				   p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
		p->pos++;
}

/* A new node; its index, or -1. */
static long new_node(struct parser *p, enum pcb_jtype type)
{
	struct pcb_json_doc *d = p->doc;

	if (d->nnodes == d->capnodes) {
		uint32_t cap = d->capnodes ? d->capnodes * 2 : 64;
		struct pcb_jnode *n = realloc(d->nodes, cap * sizeof(*n));
		if (!n)
			return fail_at(p, p->pos, -ENOMEM, "out of memory");
		d->nodes = n;
		d->capnodes = cap;
	}
	memset(&d->nodes[d->nnodes], 0, sizeof(d->nodes[0]));
	d->nodes[d->nnodes].type = (uint8_t)type;
	d->nodes[d->nnodes].off = (uint32_t)p->pos;
	return d->nnodes++;
}

static int put_bytes(struct parser *p, const void *b, size_t n)
{
	struct pcb_json_doc *d = p->doc;

	if (d->nstrs + n > d->capstrs) {
		size_t cap = d->capstrs ? d->capstrs : 256;
		char *s;
		while (cap < d->nstrs + n)
			cap *= 2;
		s = realloc(d->strs, cap);
		if (!s)
			return fail_at(p, p->pos, -ENOMEM, "out of memory");
		d->strs = s;
		d->capstrs = cap;
	}
	memcpy(d->strs + d->nstrs, b, n);
	d->nstrs += n;
	return 0;
}

static int hex4(struct parser *p, uint32_t *out)
{
	uint32_t v = 0;

	if (p->len - p->pos < 4)
		return FAIL(p, "\\u escape cut short");
	for (int i = 0; i < 4; i++) {
		unsigned char c = p->s[p->pos + i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return fail_at(p, p->pos + i, -EINVAL,
				       "bad hex digit in \\u escape");
	}
	p->pos += 4;
	*out = v;
	return 0;
}

/* After "\u" (p->pos at the hex digits): one code point, as UTF-8. */
static int unicode_escape(struct parser *p)
{
	size_t at = p->pos - 2;
	uint32_t cp, lo;
	unsigned char u[4];
	size_t n;

	if (hex4(p, &cp) < 0)
		return -1;
	if (cp >= 0xdc00 && cp <= 0xdfff)
		return fail_at(p, at, -EINVAL, "lone low surrogate \\u%04x", cp);
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (p->len - p->pos < 2 || p->s[p->pos] != '\\' ||
		    p->s[p->pos + 1] != 'u')
			return fail_at(p, at, -EINVAL,
				       "high surrogate \\u%04x without its pair",
				       cp);
		p->pos += 2;
		if (hex4(p, &lo) < 0)
			return -1;
		if (lo < 0xdc00 || lo > 0xdfff)
			return fail_at(p, at, -EINVAL,
				       "high surrogate \\u%04x without its pair",
				       cp);
		cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
	}
	if (cp == 0)
		return fail_at(p, at, -EINVAL, "\\u0000 in a string");
	if (cp < 0x80) {
		u[0] = (unsigned char)cp, n = 1;
	} else if (cp < 0x800) {
		u[0] = (unsigned char)(0xc0 | (cp >> 6));
		u[1] = (unsigned char)(0x80 | (cp & 0x3f));
		n = 2;
	} else if (cp < 0x10000) {
		u[0] = (unsigned char)(0xe0 | (cp >> 12));
		u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
		u[2] = (unsigned char)(0x80 | (cp & 0x3f));
		n = 3;
	} else {
		u[0] = (unsigned char)(0xf0 | (cp >> 18));
		u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
		u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
		u[3] = (unsigned char)(0x80 | (cp & 0x3f));
		n = 4;
	}
	return put_bytes(p, u, n);
}

/* p->pos at the opening quote. */
static long parse_string(struct parser *p)
{
	long idx = new_node(p, PCB_J_STR);
	size_t start = p->doc->nstrs;

	if (idx < 0)
		return -1;
	p->pos++;
	for (;;) {
		unsigned char c;
		size_t run = p->pos, k;

		/* copy plain bytes in runs */
		while (p->pos < p->len) {
			c = p->s[p->pos];
			if (c == '"' || c == '\\' || c < 0x20)
				break;
			if (c < 0x80) {
				p->pos++;
				continue;
			}
			k = pc_utf8_seq(p->s + p->pos, p->len - p->pos);
			if (!k)
				return FAIL(p, "invalid UTF-8 in a string");
			p->pos += k;
		}
		if (p->pos > run && put_bytes(p, p->s + run, p->pos - run) < 0)
			return -1;
		if (p->pos >= p->len)
			return FAIL(p, "string not closed");
		c = p->s[p->pos];
		if (c == '"') {
			p->pos++;
			break;
		}
		if (c < 0x20)
			return FAIL(p, "control character 0x%02x in a string", c);
		/* a backslash */
		if (p->len - p->pos < 2)
			return FAIL(p, "string not closed");
		c = p->s[p->pos + 1];
		p->pos += 2;
		{
			static const char from[] = "\"\\/bfnrt";
			static const char to[] = "\"\\/\b\f\n\r\t";
			const char *e = c ? strchr(from, c) : NULL;

			if (e) {
				if (put_bytes(p, &to[e - from], 1) < 0)
					return -1;
			} else if (c == 'u') {
				if (unicode_escape(p) < 0)
					return -1;
			} else {
				return fail_at(p, p->pos - 2, -EINVAL,
					       "unknown escape \\%c",
					       c >= 0x20 && c < 0x7f ? c : '?');
			}
		}
	}
	if (put_bytes(p, "", 1) < 0)
		return -1;
	if (p->doc->nstrs - 1 - start > UINT32_MAX)
		return FAIL(p, "string too long");
	p->doc->nodes[idx].start = (uint32_t)start;
	p->doc->nodes[idx].len = (uint32_t)(p->doc->nstrs - 1 - start);
	return idx;
}

static bool digit(struct parser *p)
{
	return p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9';
}

static long parse_number(struct parser *p)
{
	size_t start = p->pos;
	long idx = new_node(p, PCB_J_NUM);

	if (idx < 0)
		return -1;
	if (p->s[p->pos] == '-')
		p->pos++;
	if (!digit(p))
		return FAIL(p, "a digit expected");
	if (p->s[p->pos] == '0')
		p->pos++;
	else
		while (digit(p))
			p->pos++;
	if (p->pos < p->len && p->s[p->pos] == '.') {
		p->pos++;
		if (!digit(p))
			return FAIL(p, "a digit expected after '.'");
		while (digit(p))
			p->pos++;
	}
	if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
		p->pos++;
		if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
			p->pos++;
		if (!digit(p))
			return FAIL(p, "a digit expected in the exponent");
		while (digit(p))
			p->pos++;
	}
	p->doc->nodes[idx].start = (uint32_t)start;
	p->doc->nodes[idx].len = (uint32_t)(p->pos - start);
	return idx;
}

static long parse_value(struct parser *p, unsigned depth);

/* Link child into container idx after *last. */
static void link_child(struct parser *p, long idx, long *last, long child)
{
	struct pcb_jnode *n = p->doc->nodes;

	if (*last)
		n[*last].next = (uint32_t)child;
	else
		n[idx].first = (uint32_t)child;
	*last = child;
}

/* '[' or '{' at p->pos. */
static long parse_container(struct parser *p, unsigned depth, bool obj)
{
	long idx = new_node(p, obj ? PCB_J_OBJ : PCB_J_ARR), last = 0;
	char close = obj ? '}' : ']';

	if (idx < 0)
		return -1;
	if (depth >= PCB_JSON_DEPTH_MAX)
		return FAIL(p, "nested deeper than %d levels",
			    PCB_JSON_DEPTH_MAX);
	p->pos++;
	skip_ws(p);
	if (p->pos < p->len && p->s[p->pos] == close) {
		p->pos++;
		return idx;
	}
	for (;;) {
		long child;

		skip_ws(p);
		if (obj) {
			if (p->pos >= p->len || p->s[p->pos] != '"')
				return FAIL(p, p->pos >= p->len ?
						       "input ends inside an object" :
						       "a key (a string) expected");
			if ((child = parse_string(p)) < 0)
				return -1;
			link_child(p, idx, &last, child);
			skip_ws(p);
			if (p->pos >= p->len || p->s[p->pos] != ':')
				return FAIL(p, "':' expected after a key");
			p->pos++;
		}
		if ((child = parse_value(p, depth + 1)) < 0)
			return -1;
		link_child(p, idx, &last, child);
		p->doc->nodes[idx].len++;
		skip_ws(p);
		if (p->pos >= p->len)
			return FAIL(p, obj ? "input ends inside an object" :
					     "input ends inside an array");
		if (p->s[p->pos] == close) {
			p->pos++;
			return idx;
		}
		if (p->s[p->pos] != ',')
			return FAIL(p, obj ? "',' or '}' expected" :
					     "',' or ']' expected");
		p->pos++;
	}
}

static long parse_literal(struct parser *p, const char *word,
			  enum pcb_jtype type)
{
	size_t n = strlen(word);
	long idx;

	if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
		return FAIL(p, "unexpected character '%c'",
			    p->s[p->pos] >= 0x20 && p->s[p->pos] < 0x7f ?
				    p->s[p->pos] : '?');
	if ((idx = new_node(p, type)) < 0)
		return -1;
	p->pos += n;
	return idx;
}

static long parse_value(struct parser *p, unsigned depth)
{
	unsigned char c;

	skip_ws(p);
	if (p->pos >= p->len)
		return FAIL(p, "input ends where a value was expected");
	c = p->s[p->pos];
	switch (c) {
	case '{': return parse_container(p, depth, true);
	case '[': return parse_container(p, depth, false);
	case '"': return parse_string(p);
	case 't': return parse_literal(p, "true", PCB_J_TRUE);
	case 'f': return parse_literal(p, "false", PCB_J_FALSE);
	case 'n': return parse_literal(p, "null", PCB_J_NULL);
	default:
		if (c == '-' || (c >= '0' && c <= '9'))
			return parse_number(p);
		return FAIL(p, "unexpected character '%c'",
			    c >= 0x20 && c < 0x7f ? c : '?');
	}
}

void pcb_json_free(struct pcb_json_doc *doc)
{
	free(doc->nodes);
	free(doc->strs);
	memset(doc, 0, sizeof(*doc));
}

int pcb_json_parse(struct pcb_json_doc *doc, const char *in, size_t len,
		   char *err, size_t errlen)
{
	struct parser p = { .doc = doc, .s = (const unsigned char *)in,
			    .len = len, .err = err, .errlen = errlen };

	memset(doc, 0, sizeof(*doc));
	if (errlen)
		err[0] = '\0';
	if (len > PCB_JSON_BYTES_MAX) {
		snprintf(err, errlen, "%zu bytes, more than the %u a report may have",
			 len, PCB_JSON_BYTES_MAX);
		return -EINVAL;
	}
	doc->in = in;
	doc->inlen = len;
	if (parse_value(&p, 0) >= 0) {
		skip_ws(&p);
		if (p.pos < p.len)
			FAIL(&p, "trailing bytes after the value");
	}
	if (p.rc) {
		pcb_json_free(doc);
		return p.rc;
	}
	return 0;
}

const struct pcb_jnode *pcb_json_member(const struct pcb_json_doc *doc,
					const struct pcb_jnode *obj,
					const char *key)
{
	const struct pcb_jnode *found = NULL;

	if (!obj || obj->type != PCB_J_OBJ || !obj->len)
		return NULL;
	for (uint32_t k = obj->first; k; k = doc->nodes[doc->nodes[k].next].next) {
		const struct pcb_jnode *kn = &doc->nodes[k];
		if (strcmp(doc->strs + kn->start, key) == 0)
			found = &doc->nodes[kn->next];
		if (!doc->nodes[kn->next].next)
			break;
	}
	return found;
}

/* ------------------------------------------------------ a report, read back */

struct loader {
	const struct pcb_json_doc *doc;
	char *err;
	size_t errlen;
};

static int wrong_type(struct loader *l, const struct pcb_jnode *n,
		      const char *key, const char *want)
{
	snprintf(l->err, l->errlen, "at byte %u: \"%s\" is not %s", n->off, key,
		 want);
	return -EINVAL;
}

static int get_str(struct loader *l, const struct pcb_jnode *obj,
		   const char *key, char *dst, size_t len)
{
	const struct pcb_jnode *n = pcb_json_member(l->doc, obj, key);

	if (!n)
		return 0;
	if (n->type != PCB_J_STR)
		return wrong_type(l, n, key, "a string");
	pcb_copy_utf8(dst, len, l->doc->strs + n->start);
	return 0;
}

static int get_u64(struct loader *l, const struct pcb_jnode *obj,
		   const char *key, uint64_t max, uint64_t *out)
{
	const struct pcb_jnode *n = pcb_json_member(l->doc, obj, key);
	const char *s;
	uint64_t v = 0;

	if (!n)
		return 0;
	if (n->type != PCB_J_NUM)
		return wrong_type(l, n, key, "a number");
	s = l->doc->in + n->start;
	for (uint32_t i = 0; i < n->len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return wrong_type(l, n, key, "an unsigned integer");
		if (v > (max - (uint64_t)(s[i] - '0')) / 10)
			return wrong_type(l, n, key, "an integer in range");
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return 0;
}

static int get_uint(struct loader *l, const struct pcb_jnode *obj,
		    const char *key, unsigned *out)
{
	uint64_t v = *out;
	int rc = get_u64(l, obj, key, UINT_MAX, &v);

	*out = (unsigned)v;
	return rc;
}

static int get_dbl(struct loader *l, const struct pcb_jnode *obj,
		   const char *key, double *out)
{
	const struct pcb_jnode *n = pcb_json_member(l->doc, obj, key);
	char buf[64];
	double v;

	if (!n)
		return 0;
	if (n->type != PCB_J_NUM)
		return wrong_type(l, n, key, "a number");
	if (n->len >= sizeof(buf))
		return wrong_type(l, n, key, "a number of at most 63 characters");
	memcpy(buf, l->doc->in + n->start, n->len);
	buf[n->len] = '\0';
	v = strtod(buf, NULL);
	*out = isfinite(v) ? v : 0; /* 1e999 */
	return 0;
}

static int get_bool(struct loader *l, const struct pcb_jnode *obj,
		    const char *key, bool *out)
{
	const struct pcb_jnode *n = pcb_json_member(l->doc, obj, key);

	if (!n)
		return 0;
	if (n->type != PCB_J_TRUE && n->type != PCB_J_FALSE)
		return wrong_type(l, n, key, "true or false");
	*out = n->type == PCB_J_TRUE;
	return 0;
}

/* An object member that must be an object (absent: NULL, no error). */
static int get_obj(struct loader *l, const struct pcb_jnode *obj,
		   const char *key, const struct pcb_jnode **out)
{
	const struct pcb_jnode *n = pcb_json_member(l->doc, obj, key);

	*out = NULL;
	if (n && n->type != PCB_J_OBJ)
		return wrong_type(l, n, key, "an object");
	*out = n;
	return 0;
}

static int load_lat(struct loader *l, const struct pcb_jnode *row,
		    const char *key, struct pcb_lat *lat)
{
	const struct pcb_jnode *o;

	if (get_obj(l, row, key, &o) < 0)
		return -EINVAL;
#define X(f)                                     \
	if (get_dbl(l, o, #f, &lat->f) < 0) \
		return -EINVAL;
	PCB_LAT_DBLS(X)
#undef X
	return 0;
}

static int load_row(struct loader *l, const struct pcb_jnode *o,
		    struct pcb_row *w)
{
	memset(w, 0, sizeof(*w));
#define X(f)                                               \
	if (get_str(l, o, #f, w->f, sizeof(w->f)) < 0) \
		return -EINVAL;
	PCB_ROW_STRS(X)
#undef X
#define X(f)                               \
	if (get_uint(l, o, #f, &w->f) < 0) \
		return -EINVAL;
	PCB_ROW_UINTS(X)
#undef X
#define X(f)                                              \
	if (get_u64(l, o, #f, UINT64_MAX, &w->f) < 0) \
		return -EINVAL;
	PCB_ROW_U64S(X)
#undef X
#define X(f)                              \
	if (get_dbl(l, o, #f, &w->f) < 0) \
		return -EINVAL;
	PCB_ROW_DBLS(X)
#undef X
	if (load_lat(l, o, "batch_lat", &w->batch_lat) < 0 ||
	    load_lat(l, o, "page_lat", &w->page_lat) < 0 ||
	    get_bool(l, o, "peak", &w->peak) < 0)
		return -EINVAL;
	return 0;
}

static int load_report(struct loader *l, const struct pcb_jnode *root,
		       struct pcb_report *r)
{
	const struct pcb_json_doc *d = l->doc;
	const struct pcb_jnode *n, *host, *settings;
	char tool[32] = "";
	uint64_t format = 0;

	if (root->type != PCB_J_OBJ) {
		snprintf(l->err, l->errlen, "at byte %u: a report is an object",
			 root->off);
		return -EINVAL;
	}
	if (get_str(l, root, "tool", tool, sizeof(tool)) < 0 ||
	    get_u64(l, root, "format", UINT64_MAX, &format) < 0)
		return -EINVAL;
	if (tool[0] && strcmp(tool, "peercache-bench") != 0) {
		snprintf(l->err, l->errlen, "written by \"%s\", not peercache-bench",
			 tool);
		return -EINVAL;
	}
	if (format > 1) {
		snprintf(l->err, l->errlen,
			 "format %llu is newer than this tool reads (1)",
			 (unsigned long long)format);
		return -EINVAL;
	}
#define X(f)                                                 \
	if (get_str(l, root, #f, r->f, sizeof(r->f)) < 0) \
		return -EINVAL;
	PCB_REPORT_TOP_STRS(X)
#undef X
	if (get_obj(l, root, "host", &host) < 0 ||
	    get_str(l, host, "name", r->host, sizeof(r->host)) < 0 ||
	    get_str(l, host, "kernel", r->kernel, sizeof(r->kernel)) < 0 ||
	    get_str(l, host, "cpu", r->cpu, sizeof(r->cpu)) < 0 ||
	    get_uint(l, host, "cpus", &r->cpus) < 0 ||
	    get_u64(l, host, "mem_bytes", UINT64_MAX, &r->mem_bytes) < 0 ||
	    get_obj(l, root, "settings", &settings) < 0)
		return -EINVAL;
	if (settings && settings->len) {
		for (uint32_t k = settings->first; k;) {
			const struct pcb_jnode *kn = &d->nodes[k];
			const struct pcb_jnode *vn = &d->nodes[kn->next];
			const char *key = d->strs + kn->start;

			if (vn->type != PCB_J_STR)
				return wrong_type(l, vn, key, "a string");
			/* later values of a key replace earlier ones; keys
			 * are compared as kept (cut to the field), so that
			 * two keys this cuts alike are one, here as when
			 * the written report is read back */
			char kept[sizeof(r->settings[0].key)];
			pcb_copy_utf8(kept, sizeof(kept), key);
			unsigned i = 0;
			while (i < r->nsettings && strcmp(r->settings[i].key, kept))
				i++;
			if (i < PCB_SETTINGS_MAX) {
				if (i == r->nsettings) {
					r->nsettings++;
					memcpy(r->settings[i].key, kept,
					       sizeof(kept));
				}
				pcb_copy_utf8(r->settings[i].val,
					      sizeof(r->settings[i].val),
					      d->strs + vn->start);
			}
			k = vn->next;
		}
	}
	n = pcb_json_member(d, root, "rows");
	if (!n)
		return 0;
	if (n->type != PCB_J_ARR)
		return wrong_type(l, n, "rows", "an array");
	if (n->len > PCB_REPORT_ROWS_MAX) {
		snprintf(l->err, l->errlen, "at byte %u: more than %u rows",
			 n->off, PCB_REPORT_ROWS_MAX);
		return -EINVAL;
	}
	if (n->len) {
		r->rows = calloc(n->len, sizeof(*r->rows));
		if (!r->rows) {
			snprintf(l->err, l->errlen, "out of memory");
			return -ENOMEM;
		}
	}
	for (uint32_t k = n->len ? n->first : 0; k; k = d->nodes[k].next) {
		if (d->nodes[k].type != PCB_J_OBJ)
			return wrong_type(l, &d->nodes[k], "rows[]", "an object");
		if (load_row(l, &d->nodes[k], &r->rows[r->nrows]) < 0)
			return -EINVAL;
		r->nrows++;
	}
	return 0;
}

int pcb_report_parse_json(const char *in, size_t len, struct pcb_report *out,
			  char *err, size_t errlen)
{
	struct pcb_json_doc doc;
	struct loader l = { .doc = &doc, .err = err, .errlen = errlen };
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pcb_json_parse(&doc, in, len, err, errlen);
	if (rc < 0)
		return rc;
	rc = load_report(&l, &doc.nodes[0], out);
	pcb_json_free(&doc);
	if (rc < 0)
		pcb_report_free(out);
	return rc;
}

int pcb_report_load_json(const char *path, struct pcb_report *out, char *err,
			 size_t errlen)
{
	char *buf = NULL, msg[256];
	size_t len = 0, cap = 0;
	FILE *f = fopen(path, "rb");
	int rc;

	memset(out, 0, sizeof(*out));
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	for (;;) {
		size_t got;
		if (len == cap) {
			char *b;
			if (cap > PCB_JSON_BYTES_MAX) {
				snprintf(err, errlen, "%s: larger than %u bytes",
					 path, PCB_JSON_BYTES_MAX);
				rc = -EFBIG;
				goto out;
			}
			cap = cap ? cap * 2 : 65536;
			b = realloc(buf, cap);
			if (!b) {
				snprintf(err, errlen, "%s: out of memory", path);
				rc = -ENOMEM;
				goto out;
			}
			buf = b;
		}
		got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		rc = -EIO;
		snprintf(err, errlen, "%s: read failed", path);
		goto out;
	}
	rc = pcb_report_parse_json(buf, len, out, msg, sizeof(msg));
	if (rc < 0)
		snprintf(err, errlen, "%s: %s", path, msg);
out:
	free(buf);
	fclose(f);
	return rc;
}
