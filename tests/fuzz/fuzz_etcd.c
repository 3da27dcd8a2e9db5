/*
 * tests/fuzz/fuzz_etcd.c — libFuzzer target for what the etcd discovery
 * backend reads from etcd's v3 HTTP/JSON gateway (modules/etcd_wire.c).
 * The first byte picks what the rest is:
 *   0  a JSON reply: parsed, then walked with the names and paths the
 *      backend reads (result, header.revision, kvs[].value, events[].kv,
 *      ID, TTL, error.message, ...), every value read as an integer, a
 *      string, a bool and (strings) base64 — a member's record is base64
 *      of JSON, parsed and walked in turn;
 *   1  an HTTP response: the head, then the body decoded as chunks once
 *      whole and once in pieces whose sizes the input picks;
 *   2  base64 text, decoded and encoded again.
 *
 * Invariants (else the target traps): every value lies inside the text
 * parsed; a string read is NUL-terminated at its length and holds no NUL;
 * decoding base64 then encoding and decoding again gives the same bytes; a
 * head is found complete only at its own end (never in a shorter prefix),
 * within ETCD_HTTP_HEAD_MAX; the chunk decoder never consumes or makes more
 * than it was given room for, and gives the same body and verdict whatever
 * the pieces.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_etcd -max_total_time=60 WORKDIR
 * tests/fuzz/corpus/etcd (scripts/test.sh does this as a smoke test;
 * tests/fuzz/make_seeds.c writes the corpus).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/etcd_wire.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *txt_lo, *txt_hi; /* the text being walked */

static void b64_round(const char *s, size_t n)
{
	static char raw[8192], enc[ETCD_B64_LEN(sizeof(raw)) + 1];
	static char again[sizeof(raw)];
	int rl = etcd_b64_dec(s, n, raw, sizeof(raw));
	if (rl < 0)
		return;
	check((size_t)rl <= sizeof(raw) && (size_t)rl <= n / 4 * 3);
	size_t el = etcd_b64_enc(raw, (size_t)rl, enc);
	check(el == ETCD_B64_LEN((size_t)rl) && enc[el] == '\0');
	int al = etcd_b64_dec(enc, el, again, sizeof(again));
	check(al == rl && memcmp(raw, again, (size_t)rl) == 0);
}

static void walk(const struct etcd_json *v, int depth);

/* A value: inside the text, and read every way the backend reads one. */
static void value(const struct etcd_json *v, int depth)
{
	check(v->p >= txt_lo && v->n >= 1 && v->p + v->n <= txt_hi);
	int64_t i;
	bool b;
	(void)etcd_json_int(v, &i);
	(void)etcd_json_bool(v, &b);
	char buf[4096];
	int sl = etcd_json_str(v, buf, sizeof(buf));
	if (sl >= 0) {
		check((size_t)sl < sizeof(buf) && buf[sl] == '\0' &&
		      strlen(buf) == (size_t)sl);
		b64_round(buf, (size_t)sl);
		/* a member's record: base64 of a JSON document */
		static char raw[4096];
		int rl = etcd_b64_dec(buf, (size_t)sl, raw, sizeof(raw));
		struct etcd_json doc;
		if (depth < 2 && rl > 0 &&
		    etcd_json_parse(raw, (size_t)rl, &doc) == 0) {
			const char *lo = txt_lo, *hi = txt_hi;
			txt_lo = raw;
			txt_hi = raw + rl;
			walk(&doc, depth + 1);
			txt_lo = lo;
			txt_hi = hi;
		}
	}
	if (depth < 8)
		walk(v, depth + 1);
}

static void walk(const struct etcd_json *v, int depth)
{
	static const char *const names[] = {
		"result", "header", "revision", "kvs", "key", "value", "ID",
		"TTL", "error", "message", "events", "kv", "canceled",
		"compact_revision", "id", "type", "count", "data"};
	static const char *const paths[] = {
		"header.revision", "error.message", "result.header.revision",
		"result.events", "kv.value", "a..b", ""};
	struct etcd_json out;
	if (v->type == ETCD_J_ARR) {
		size_t pos = 0, last = 0;
		unsigned k = 0;
		int ret;
		while (k++ < 64 && (ret = etcd_json_next(v, &pos, &out)) == 1) {
			check(pos > last && pos <= v->n);
			last = pos;
			value(&out, depth);
		}
	} else if (v->type == ETCD_J_OBJ) {
		for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
			if (etcd_json_get(v, names[i], &out) == 0)
				value(&out, depth);
		for (size_t i = 0; i < sizeof(paths) / sizeof(*paths); i++)
			if (etcd_json_path(v, paths[i], &out) == 0)
				check(out.p >= txt_lo &&
				      out.p + out.n <= txt_hi);
	} else {
		size_t pos = 0;
		check(etcd_json_next(v, &pos, &out) == -EPROTO);
		check(etcd_json_get(v, "result", &out) == -EPROTO);
	}
}

static void json(const char *s, size_t n)
{
	struct etcd_json root;
	if (etcd_json_parse(s, n, &root) < 0)
		return;
	txt_lo = s;
	txt_hi = s + n;
	value(&root, 0);
}

/* Decode body[0..n) as chunks, in pieces of at most step bytes of input
 * and room bytes of output at a time: the verdict, the body in out. */
static int chunks(const char *body, size_t n, size_t step, size_t room,
		  char *out, size_t cap, size_t *made)
{
	struct etcd_chunks c = {0};
	size_t at = 0;
	int ret = 0;
	*made = 0;
	while (ret == 0 && at < n) {
		size_t give = n - at < step ? n - at : step;
		size_t space = cap - *made < room ? cap - *made : room;
		size_t used, m;
		ret = etcd_chunks_decode(&c, body + at, give, &used,
					 out + *made, space, &m);
		check(used <= give && m <= space);
		at += used;
		*made += m;
		if (ret == 0 && used == 0 && m == 0 &&
		    (space == 0 || give == 0))
			break; /* out of room */
	}
	return ret;
}

static void http(const char *s, size_t n, unsigned step)
{
	struct etcd_http_head h;
	int ret = etcd_http_head(s, n, &h);
	if (ret == 0)
		check(n < ETCD_HTTP_HEAD_MAX);
	if (ret != 1)
		return;
	check(h.head_len >= 4 && h.head_len <= n &&
	      h.head_len <= ETCD_HTTP_HEAD_MAX);
	check(memcmp(s + h.head_len - 4, "\r\n\r\n", 4) == 0);
	check(h.content_length >= -1 && (!h.chunked || h.content_length < 0));
	struct etcd_http_head h2;
	check(etcd_http_head(s, h.head_len - 1, &h2) == 0);
	if (!h.chunked)
		return;
	const char *body = s + h.head_len;
	size_t bn = n - h.head_len;
	char *a = malloc(bn + 1), *b = malloc(bn + 1);
	size_t am, bm;
	int ra = chunks(body, bn, bn, bn, a, bn, &am);
	int rb = chunks(body, bn, step % 7 + 1, step / 7 % 5 + 1, b, bn, &bm);
	check(am <= bn && bm <= bn);
	if (ra >= 0 && rb >= 0)
		check(ra == rb && am == bm && memcmp(a, b, am) == 0);
	check((ra < 0) == (rb < 0) || ra == 0 || rb == 0);
	free(a);
	free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	const char *s = (const char *)data + 2;
	size_t n = size - 2;
	switch (data[0] % 3) {
	case 0: json(s, n); break;
	case 1: http(s, n, data[1]); break;
	default: b64_round(s, n); break;
	}
	return 0;
}
