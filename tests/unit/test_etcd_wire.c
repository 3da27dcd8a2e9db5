/*
 * tests/unit/test_etcd_wire.c — the etcd backend's wire readers
 * (modules/etcd_wire.h): the JSON reader on real gateway replies and on
 * malformed input (every truncation, wrong types, huge numbers, depth,
 * bad escapes), base64 both ways, the HTTP response head (every prefix,
 * malformed heads and lengths) and the chunked decoder (every split, a
 * small output buffer, malformed streams), plus a deterministic mutation
 * smoke run over all of them (under ASan in the sanitized tree).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/etcd_wire.h"

#define PC_TEST_MIN(a, b) ((a) < (b) ? (a) : (b))

static const char range_reply[] =
	"{\"header\":{\"cluster_id\":\"324952591200643719\",\"revision\":"
	"\"12\",\"raft_term\":\"2\"},\"kvs\":[{\"key\":\"L3AvbWVtYmVycy9h\","
	"\"create_revision\":\"5\",\"mod_revision\":\"5\",\"version\":\"1\","
	"\"value\":\"eyJpZCI6IjEyNy4wLjAuMTo1In0=\",\"lease\":"
	"\"2324035791163410181\"},{\"key\":\"eA==\",\"value\":\"\"}],"
	"\"count\":\"2\"}";

static struct etcd_json parse_ok(const char *s)
{
	struct etcd_json root;
	cr_assert_eq(etcd_json_parse(s, strlen(s), &root), 0, "%s", s);
	return root;
}

static void parse_bad(const char *s)
{
	struct etcd_json root;
	cr_assert_eq(etcd_json_parse(s, strlen(s), &root), -EPROTO,
		     "accepted: %s", s);
}

Test(etcd_json, range_reply)
{
	struct etcd_json root = parse_ok(range_reply), v, kvs, kv;
	int64_t x;
	char buf[128];
	cr_assert_eq(etcd_json_path(&root, "header.revision", &v), 0);
	cr_assert_eq(etcd_json_int(&v, &x), 0);
	cr_assert_eq(x, 12);
	cr_assert_eq(etcd_json_get(&root, "kvs", &kvs), 0);
	size_t pos = 0;
	cr_assert_eq(etcd_json_next(&kvs, &pos, &kv), 1);
	cr_assert_eq(etcd_json_get(&kv, "lease", &v), 0);
	cr_assert_eq(etcd_json_int(&v, &x), 0);
	cr_assert_eq(x, 2324035791163410181ll);
	cr_assert_eq(etcd_json_get(&kv, "value", &v), 0);
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), 28);
	char raw[64];
	int n = etcd_b64_dec(buf, 28, raw, sizeof(raw));
	cr_assert_eq(n, 20);
	cr_assert(memcmp(raw, "{\"id\":\"127.0.0.1:5\"}", 20) == 0);
	cr_assert_eq(etcd_json_next(&kvs, &pos, &kv), 1);
	cr_assert_eq(etcd_json_get(&kv, "value", &v), 0);
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), 0);
	cr_assert_eq(etcd_json_next(&kvs, &pos, &kv), 0);
	cr_assert_eq(etcd_json_next(&kvs, &pos, &kv), 0);
	cr_assert_eq(etcd_json_get(&root, "nope", &v), -ENOENT);
	cr_assert_eq(etcd_json_path(&root, "header.nope", &v), -ENOENT);
	cr_assert_eq(etcd_json_path(&root, "count.x", &v), -EPROTO);
	struct etcd_json e = parse_ok(" [ ] "), o = parse_ok("{}");
	pos = 0;
	cr_assert_eq(etcd_json_next(&e, &pos, &v), 0);
	cr_assert_eq(etcd_json_get(&o, "a", &v), -ENOENT);
}

Test(etcd_json, every_truncation_is_refused)
{
	size_t n = strlen(range_reply);
	struct etcd_json root;
	for (size_t cut = 0; cut < n; cut++)
		cr_assert_eq(etcd_json_parse(range_reply, cut, &root), -EPROTO,
			     "prefix %zu accepted", cut);
}

Test(etcd_json, malformed)
{
	static const char *bad[] = {
		"", " ", "{", "}", "[1,]", "[,1]", "{,}", "{\"a\" 1}",
		"{\"a\":}", "{a:1}", "{\"a\":1,}", "[1 2]", "01", "-", "1.",
		".5", "1e", "1e+", "+1", "tru", "nul", "falsey", "[1]x",
		"\"abc", "\"a\\x\"", "\"a\\u12\"", "\"a\\u12g4\"",
		"\"tab\there\"", "\"\\", "{\"a\":1}}", "[\"a\":1]", "nan",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		parse_bad(bad[i]);
	/* a NUL inside is not whitespace nor a value */
	struct etcd_json r;
	cr_assert_eq(etcd_json_parse("[1]\0", 4, &r), -EPROTO);
	cr_assert_eq(etcd_json_parse("\"a\0b\"", 5, &r), -EPROTO);
}

Test(etcd_json, depth_is_bounded)
{
	char s[2 * (ETCD_JSON_DEPTH + 2) + 1];
	for (int d = ETCD_JSON_DEPTH; d <= ETCD_JSON_DEPTH + 1; d++) {
		int n = 0;
		for (int i = 0; i <= d; i++)
			s[n++] = '[';
		for (int i = 0; i <= d; i++)
			s[n++] = ']';
		struct etcd_json r;
		cr_assert_eq(etcd_json_parse(s, (size_t)n, &r),
			     d == ETCD_JSON_DEPTH ? 0 : -EPROTO, "depth %d", d);
	}
}

Test(etcd_json, wrong_types)
{
	struct etcd_json root = parse_ok("{\"o\":{},\"a\":[1],\"s\":\"x\","
					 "\"t\":true,\"n\":null,\"f\":1.5,"
					 "\"e\":1e3,\"q\":\"1x\"}"), v;
	int64_t x;
	bool b;
	char buf[8];
	static const char *not_int[] = {"o", "a", "t", "n", "f", "e", "q", "s"};
	for (size_t i = 0; i < sizeof(not_int) / sizeof(*not_int); i++) {
		cr_assert_eq(etcd_json_get(&root, not_int[i], &v), 0);
		cr_assert_eq(etcd_json_int(&v, &x), -EPROTO, "%s", not_int[i]);
	}
	cr_assert_eq(etcd_json_get(&root, "a", &v), 0);
	cr_assert_eq(etcd_json_get(&v, "x", &v), -EPROTO);
	size_t pos = 0;
	cr_assert_eq(etcd_json_get(&root, "o", &v), 0);
	cr_assert_eq(etcd_json_next(&v, &pos, &v), -EPROTO);
	cr_assert_eq(etcd_json_get(&root, "t", &v), 0);
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), -EPROTO);
	cr_assert_eq(etcd_json_bool(&v, &b), 0);
	cr_assert(b);
	cr_assert_eq(etcd_json_get(&root, "n", &v), 0);
	cr_assert_eq(etcd_json_bool(&v, &b), -EPROTO);
}

Test(etcd_json, huge_numbers)
{
	static const struct {
		const char *s;
		int ret;
		int64_t want;
	} c[] = {
		{"9223372036854775807", 0, INT64_MAX},
		{"\"9223372036854775807\"", 0, INT64_MAX},
		{"9223372036854775808", -ERANGE, 0},
		{"-9223372036854775808", 0, INT64_MIN},
		{"-9223372036854775809", -ERANGE, 0},
		{"\"99999999999999999999999999999999999999\"", -ERANGE, 0},
		{"123456789012345678901234567890123456789012345678901234567890",
		 -ERANGE, 0},
		{"\"\"", -EPROTO, 0},
		{"\"-\"", -EPROTO, 0},
		{"-0", 0, 0},
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(*c); i++) {
		struct etcd_json v = parse_ok(c[i].s);
		int64_t x = 0;
		cr_assert_eq(etcd_json_int(&v, &x), c[i].ret, "%s", c[i].s);
		if (c[i].ret == 0)
			cr_assert_eq(x, c[i].want, "%s", c[i].s);
	}
}

Test(etcd_json, strings)
{
	char buf[16];
	struct etcd_json v = parse_ok("\"a\\\"b\\n\\u0041\\/\"");
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), 6);
	cr_assert_str_eq(buf, "a\"b\nA/");
	v = parse_ok("\"\\u00e9\"");
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), -EPROTO);
	v = parse_ok("\"\\u0000\"");
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), -EPROTO);
	v = parse_ok("\"0123456789abcdef\"");
	cr_assert_eq(etcd_json_str(&v, buf, sizeof(buf)), -ENOSPC);
	cr_assert_eq(etcd_json_str(&v, buf, 0), -EPROTO);
}

Test(etcd_b64, round_trip_and_malformed)
{
	const char *in = "peercache/members/10.0.0.1:31999";
	for (size_t n = 0; n <= strlen(in); n++) {
		char enc[ETCD_B64_LEN(64) + 1], dec[64];
		size_t el = etcd_b64_enc(in, n, enc);
		cr_assert_eq(el, ETCD_B64_LEN(n));
		cr_assert_eq(strlen(enc), el);
		cr_assert_eq(etcd_b64_dec(enc, el, dec, sizeof(dec)), (int)n);
		cr_assert(memcmp(dec, in, n) == 0);
		if (n)
			cr_assert_eq(etcd_b64_dec(enc, el, dec, n - 1),
				     -ENOSPC);
	}
	char out[16];
	static const char *bad[] = {"A", "AB", "ABC", "A===", "AB=C", "=AAA",
				    "AA==AAAA", "AB!D", "AB\nD", "AAA-"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		cr_assert_eq(etcd_b64_dec(bad[i], strlen(bad[i]), out,
					  sizeof(out)), -EPROTO, "%s", bad[i]);
	cr_assert_eq(etcd_b64_dec("AB\0D", 4, out, sizeof(out)), -EPROTO);
	cr_assert_eq(etcd_b64_dec("TWE=", 4, out, sizeof(out)), 2);
	cr_assert(memcmp(out, "Ma", 2) == 0);
}

static const char head_cl[] =
	"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	"content-length:  111\r\nConnection: keep-alive, Close\r\n\r\n{";
static const char head_chunked[] =
	"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n";

Test(etcd_http, heads_and_their_prefixes)
{
	struct etcd_http_head h;
	size_t n = strlen(head_cl) - 1; /* the body's first byte */
	for (size_t cut = 0; cut < n; cut++)
		cr_assert_eq(etcd_http_head(head_cl, cut, &h), 0, "%zu", cut);
	cr_assert_eq(etcd_http_head(head_cl, n + 1, &h), 1);
	cr_assert_eq(h.status, 200);
	cr_assert_eq(h.content_length, 111);
	cr_assert_eq(h.head_len, n);
	cr_assert(h.close && !h.chunked);
	cr_assert_eq(etcd_http_head(head_chunked, strlen(head_chunked), &h), 1);
	cr_assert_eq(h.status, 404);
	cr_assert(h.chunked && !h.close);
	cr_assert_eq(h.content_length, -1);
	const char *v10 = "HTTP/1.0 200\r\n\r\n";
	cr_assert_eq(etcd_http_head(v10, strlen(v10), &h), 1);
	cr_assert(h.close);
}

Test(etcd_http, malformed_heads)
{
	static const char *bad[] = {
		"HTTP/2 200 OK\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 200OK\r\n\r\n",
		"hello\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\nY: b\r\n\r\n",
	};
	struct etcd_http_head h;
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		cr_assert_eq(etcd_http_head(bad[i], strlen(bad[i]), &h),
			     -EPROTO, "accepted: %s", bad[i]);
	/* a head that never ends */
	size_t n = ETCD_HTTP_HEAD_MAX + 10;
	char *big = malloc(n);
	memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
	memset(big + 20, 'a', n - 20);
	cr_assert_eq(etcd_http_head(big, ETCD_HTTP_HEAD_MAX - 1, &h), 0);
	cr_assert_eq(etcd_http_head(big, n, &h), -EPROTO);
	free(big);
}

static const char chunked[] =
	"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n";

/* Decode s fed in pieces of `step` bytes into an output of `cap` bytes
 * per call; the decoded text (NUL-terminated) and the last answer. */
static int dechunk(const char *s, size_t n, size_t step, size_t cap,
		   char *out, size_t outcap)
{
	struct etcd_chunks c = {0};
	size_t i = 0, o = 0;
	int ret = 0;
	while (i < n && ret == 0) {
		size_t piece = PC_TEST_MIN(step, n - i), used, made;
		ret = etcd_chunks_decode(&c, s + i, piece, &used, out + o,
					 PC_TEST_MIN(cap, outcap - 1 - o),
					 &made);
		cr_assert(used <= piece && made <= cap);
		i += used;
		o += made;
		cr_assert(used || made || ret != 0 || o == outcap - 1);
	}
	out[o] = '\0';
	return ret;
}

Test(etcd_http, chunks_every_split)
{
	char out[64];
	for (size_t step = 1; step <= sizeof(chunked); step++)
		for (size_t cap = 1; cap <= 12; cap += 5) {
			cr_assert_eq(dechunk(chunked, strlen(chunked), step,
					     cap, out, sizeof(out)), 1);
			cr_assert_str_eq(out, "hello world");
		}
	/* a stream cut short is not done */
	cr_assert_eq(dechunk(chunked, strlen(chunked) - 1, 7, 64, out,
			     sizeof(out)), 0);
}

Test(etcd_http, malformed_chunks)
{
	static const char *bad[] = {
		"g\r\n", "\r\n", "5\r\nhelloX", "5\nhello", "5\r\nhello\r\r",
		"ffffffffffffffffff\r\n", "5\r\nhello\r\n0\r\nbad\n",
		"0\r\n\n",
	};
	char out[64];
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		cr_assert_eq(dechunk(bad[i], strlen(bad[i]), 64, 64, out,
				     sizeof(out)), -EPROTO, "accepted: %s",
			     bad[i]);
}

/* Mutations of valid inputs: nothing may crash or read out of bounds
 * (ASan), and every answer stays in its documented set. */
Test(etcd_wire, mutation_smoke)
{
	const char *seeds[] = {range_reply, head_cl, chunked,
			       "{\"result\":{\"events\":[{\"kv\":{}}]}}"};
	uint64_t x = 88172645463325252ull;
	for (int it = 0; it < 20000; it++) {
		const char *s = seeds[it % 4];
		size_t n = strlen(s);
		char *m = malloc(n);
		memcpy(m, s, n);
		for (int k = 0; k < 1 + it % 4; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			m[x % n] = (char)(x >> 32);
		}
		size_t len = (x >> 40) % (n + 1);
		struct etcd_json r, v, kv;
		if (etcd_json_parse(m, len, &r) == 0) {
			size_t pos = 0;
			int64_t i64;
			char buf[32];
			if (etcd_json_get(&r, "kvs", &v) == 0)
				while (etcd_json_next(&v, &pos, &kv) == 1)
					etcd_json_get(&kv, "value", &kv);
			if (etcd_json_path(&r, "header.revision", &v) == 0) {
				int ret = etcd_json_int(&v, &i64);
				cr_assert(ret == 0 || ret == -ERANGE ||
					  ret == -EPROTO);
				etcd_json_str(&v, buf, sizeof(buf));
			}
		}
		struct etcd_http_head h;
		int hr = etcd_http_head(m, len, &h);
		cr_assert(hr == -EPROTO || hr == 0 || hr == 1);
		if (hr == 1)
			cr_assert(h.head_len <= len);
		char out[16];
		struct etcd_chunks c = {0};
		size_t used, made;
		int cr = etcd_chunks_decode(&c, m, len, &used, out, sizeof(out),
					    &made);
		cr_assert((cr == -EPROTO || cr == 0 || cr == 1) && used <= len &&
			  made <= sizeof(out));
		char b64[64];
		int br = etcd_b64_dec(m, PC_TEST_MIN(len, 40), b64, sizeof(b64));
		cr_assert(br == -EPROTO || br == -ENOSPC || br >= 0);
		free(m);
	}
}
