/*
 * tests/unit/test_http_parse.c — the HTTP request-head parser: valid heads
 * and their fields, keep-alive rules, every split point, pipelining, each
 * error status, and limits hit while the input is still incomplete.
 *
 * Every case goes through expect(), which also checks the parser's prefix
 * invariant on that input: each prefix answers 0 or the full answer.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "modules/http_parse.h"

static const struct http_limits dflt = HTTP_LIMITS_DEFAULT;

/* Parse s[0..len) under lim; assert the answer is want and that no prefix
 * answers anything but 0 or want. Returns the request when want > 0. */
static struct http_request expect_n(const char *s, size_t len,
				    const struct http_limits *lim, int want)
{
	struct http_request rq;
	for (size_t cut = 0; cut < len; cut++) {
		int r = http_parse_request(s, cut, lim, &rq);
		cr_assert(r == 0 || r == want,
			  "prefix %zu of %zu answered %d, full input wants %d",
			  cut, len, r, want);
	}
	memset(&rq, 0, sizeof(rq));
	int r = http_parse_request(s, len, lim, &rq);
	cr_assert_eq(r, want, "answered %d, wanted %d for \"%.*s\"", r, want,
		     (int)(len > 80 ? 80 : len), s);
	return rq;
}

static struct http_request expect(const char *s, int want)
{
	return expect_n(s, strlen(s), &dflt, want);
}

/* For literals with a NUL inside. */
#define expect_lit(s, want) expect_n((s), sizeof(s) - 1, &dflt, (want))

static struct http_request ok(const char *s)
{
	return expect(s, (int)strlen(s));
}

static void assert_span(const char *p, size_t n, const char *want)
{
	cr_assert_eq(n, strlen(want), "length %zu, wanted \"%s\"", n, want);
	cr_assert(memcmp(p, want, n) == 0, "\"%.*s\" != \"%s\"", (int)n, p,
		  want);
}

Test(http, get_without_query)
{
	const char *s = "GET /metrics HTTP/1.1\r\nHost: node1:9100\r\n"
			"User-Agent: Prometheus/2.45\r\n\r\n";
	struct http_request rq = ok(s);
	cr_assert_eq(rq.method, HTTP_GET);
	cr_assert_str_eq(rq.method_name, "GET");
	assert_span(rq.path, rq.path_len, "/metrics");
	cr_assert_eq(rq.path, s + 4, "path points into the input");
	cr_assert_not_null(rq.query);
	cr_assert_eq(rq.query_len, 0);
	cr_assert_eq(rq.version_minor, 1);
	cr_assert(rq.keep_alive);
	cr_assert(!rq.has_body);
	cr_assert_eq(rq.header_count, 2);
}

Test(http, head_with_query)
{
	struct http_request rq = ok("HEAD /metrics?name[]=up&x=%20 HTTP/1.1\r\n\r\n");
	cr_assert_eq(rq.method, HTTP_HEAD);
	cr_assert_str_eq(rq.method_name, "HEAD");
	assert_span(rq.path, rq.path_len, "/metrics");
	assert_span(rq.query, rq.query_len, "name[]=up&x=%20");
	cr_assert_eq(rq.header_count, 0);

	rq = ok("GET /healthz? HTTP/1.1\r\n\r\n");
	assert_span(rq.path, rq.path_len, "/healthz");
	cr_assert_eq(rq.query_len, 0, "a bare '?' is an empty query");

	rq = ok("GET /?a?b HTTP/1.1\r\n\r\n");
	assert_span(rq.path, rq.path_len, "/");
	assert_span(rq.query, rq.query_len, "a?b");

	rq = ok("GET /%6detrics HTTP/1.1\r\n\r\n");
	assert_span(rq.path, rq.path_len, "/%6detrics"); /* not decoded */
}

Test(http, other_methods_are_reported_not_refused)
{
	struct http_request rq = ok("POST / HTTP/1.1\r\n\r\n");
	cr_assert_eq(rq.method, HTTP_OTHER);
	cr_assert_str_eq(rq.method_name, "POST");
	rq = ok("get / HTTP/1.1\r\n\r\n");
	cr_assert_eq(rq.method, HTTP_OTHER, "methods are case-sensitive");
	rq = ok("ABCDEFGHIJKLMNO / HTTP/1.1\r\n\r\n"); /* 15: the maximum */
	cr_assert_str_eq(rq.method_name, "ABCDEFGHIJKLMNO");
	rq = ok("._~!#$%&'*+^`|9 / HTTP/1.1\r\n\r\n"); /* token chars */
	cr_assert_eq(rq.method, HTTP_OTHER);
}

Test(http, keep_alive_defaults_and_connection)
{
	cr_assert(!ok("GET / HTTP/1.0\r\n\r\n").keep_alive);
	cr_assert_eq(ok("GET / HTTP/1.0\r\n\r\n").version_minor, 0);
	cr_assert(ok("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
	cr_assert(ok("GET / HTTP/1.0\r\nconnection:Keep-Alive \r\n\r\n").keep_alive);
	cr_assert(!ok("GET / HTTP/1.0\r\nConnection: close\r\n\r\n").keep_alive);
	cr_assert(!ok("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive);
	cr_assert(ok("GET / HTTP/1.1\r\n\r\n").keep_alive);
	cr_assert(!ok("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
	cr_assert(!ok("GET / HTTP/1.1\r\nCONNECTION: Upgrade,\t CLOSE ,\r\n\r\n").keep_alive);
	cr_assert(!ok("GET / HTTP/1.1\r\nConnection: x\r\nConnection: close\r\n\r\n").keep_alive,
		  "Connection fields combine");
	cr_assert(ok("GET / HTTP/1.1\r\nConnection: closed, xclose\r\n\r\n").keep_alive,
		  "whole list elements only");
	cr_assert(ok("GET / HTTP/1.1\r\nX-Connection: close\r\n\r\n").keep_alive);
}

Test(http, bare_lf_line_endings)
{
	struct http_request rq = ok("GET /metrics HTTP/1.1\nHost: a\n\n");
	assert_span(rq.path, rq.path_len, "/metrics");
	cr_assert_eq(rq.header_count, 1);
	ok("GET / HTTP/1.1\r\nHost: a\n\r\n"); /* mixed */
}

Test(http, field_values)
{
	cr_assert_eq(ok("GET / HTTP/1.1\r\nX: a\tb\r\n\r\n").header_count, 1);
	ok("GET / HTTP/1.1\r\nX:\r\n\r\n");            /* empty value */
	ok("GET / HTTP/1.1\r\nX: caf\xc3\xa9\r\n\r\n"); /* obs-text */
	ok("GET / HTTP/1.1\r\nX: a \t\r\n\r\n");       /* trailing OWS */
}

Test(http, every_split_point_needs_more)
{
	static const char *const heads[] = {
		"GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
		"HEAD /?q HTTP/1.0\nConnection: keep-alive\n\n",
		"GET / HTTP/1.1\r\n\r\n",
	};
	for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
		const char *s = heads[h];
		size_t len = strlen(s);
		struct http_request rq;
		for (size_t cut = 0; cut < len; cut++)
			cr_assert_eq(http_parse_request(s, cut, &dflt, &rq), 0,
				     "head %zu cut %zu", h, cut);
		cr_assert_eq(http_parse_request(s, len, &dflt, &rq), (int)len);
	}
}

Test(http, pipelined_heads)
{
	const char *a = "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
	const char *b = "HEAD /healthz?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n";
	char buf[256];
	size_t la = strlen(a), lb = strlen(b);
	memcpy(buf, a, la);
	memcpy(buf + la, b, lb);
	struct http_request rq;
	cr_assert_eq(http_parse_request(buf, la + lb, &dflt, &rq), (int)la);
	cr_assert_eq(rq.method, HTTP_GET);
	cr_assert(rq.keep_alive);
	cr_assert_eq(http_parse_request(buf + la, lb, &dflt, &rq), (int)lb);
	cr_assert_eq(rq.method, HTTP_HEAD);
	assert_span(rq.query, rq.query_len, "x=1");
	cr_assert(!rq.keep_alive);
	/* Body bytes after a head are not the parser's business. */
	const char *c = "GET / HTTP/1.1\r\nContent-Length: 4\r\n\r\n\x00\x01\r\r";
	cr_assert_eq(http_parse_request(c, strlen(c) + 5, &dflt, &rq),
		     (int)strlen(c));
	cr_assert(rq.has_body);
}

Test(http, request_untouched_unless_complete)
{
	struct http_request rq, before;
	memset(&rq, 0xa5, sizeof(rq));
	before = rq;
	cr_assert_eq(http_parse_request("GET / HT", 8, &dflt, &rq), 0);
	cr_assert(memcmp(&rq, &before, sizeof(rq)) == 0);
	cr_assert_eq(http_parse_request("GET x HTTP/1.1\r\n\r\n", 18, &dflt, &rq), -400);
	cr_assert(memcmp(&rq, &before, sizeof(rq)) == 0);
	cr_assert_eq(http_parse_request("", 0, &dflt, &rq), 0);
}

Test(http, null_limits_mean_default)
{
	struct http_request rq;
	char line[2100] = "GET /";
	memset(line + 5, 'a', sizeof(line) - 5);
	cr_assert_eq(http_parse_request("GET / HTTP/1.1\r\n\r\n", 18, NULL, &rq), 18);
	cr_assert_eq(http_parse_request(line, sizeof(line), NULL, &rq), -414);
}

Test(http, huge_limits_are_clamped)
{
	struct http_limits big = { SIZE_MAX, SIZE_MAX, UINT32_MAX };
	expect_n("GET / HTTP/1.1\r\nA: b\r\n\r\n", 24, &big, 24);
}

Test(http, method_errors)
{
	expect("GE(T / HTTP/1.1\r\n\r\n", -400);
	expect("G@T / HTTP/1.1\r\n\r\n", -400);
	expect("GET\t/ HTTP/1.1\r\n\r\n", -400);
	expect(" GET / HTTP/1.1\r\n\r\n", -400);
	expect("/ HTTP/1.1\r\n\r\n", -400);
	expect("ABCDEFGHIJKLMNOP / HTTP/1.1\r\n\r\n", -400); /* 16 chars */
	expect("GET\r\n\r\n", -400);
	expect("\r\nGET / HTTP/1.1\r\n\r\n", -400); /* no leading blank lines */
}

Test(http, version_errors)
{
	expect("GET /\r\n\r\n", -400);  /* HTTP/0.9 */
	expect("GET / \r\n\r\n", -400);
	expect("GET / HTTP/1.1 \r\n\r\n", -400);
	expect("GET /  HTTP/1.1\r\n\r\n", -400);
	expect("GET / http/1.1\r\n\r\n", -400);
	expect("GET / HTTP/1\r\n\r\n", -400);
	expect("GET / HTTP/1.10\r\n\r\n", -400);
	expect("GET / HTTP/1.x\r\n\r\n", -400);
	expect("GET / HTTP/2\r\n\r\n", -400);
	expect("GET / HTTP/2.0\r\n\r\n", -505);
	expect("GET / HTTP/3.0\r\n\r\n", -505);
	expect("GET / HTTP/1.2\r\n\r\n", -505);
	expect("GET / HTTP/0.9\r\n\r\n", -505);
	expect("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", -505);
	expect("PRI * HTTP/2.0\r\n", -505); /* answered at the line */
}

Test(http, target_errors)
{
	expect("GET http://a/ HTTP/1.1\r\n\r\n", -400);
	expect("OPTIONS * HTTP/1.1\r\n\r\n", -400);
	expect("GET metrics HTTP/1.1\r\n\r\n", -400);
	expect("GET  / HTTP/1.1\r\n\r\n", -400);
	expect("GET /a b HTTP/1.1\r\n\r\n", -400);
	expect("GET /a\tb HTTP/1.1\r\n\r\n", -400);
	expect("GET /a\x01 HTTP/1.1\r\n\r\n", -400);
	expect("GET /a\x7f HTTP/1.1\r\n\r\n", -400);
	expect("GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n", -400);
	expect_lit("GET /a\0b HTTP/1.1\r\n\r\n", -400);
}

Test(http, garbage_is_refused_at_the_first_byte)
{
	struct http_request rq;
	/* A TLS ClientHello starts 0x16 0x03: refused without waiting. */
	cr_assert_eq(http_parse_request("\x16\x03\x01", 3, &dflt, &rq), -400);
	cr_assert_eq(http_parse_request("\0", 1, &dflt, &rq), -400);
}

Test(http, bare_cr)
{
	expect("GET / HTTP/1.1\rHost: a\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nHost: a\r\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\n\rX", -400);
	expect("GET /\r HTTP/1.1\r\n\r\n", -400);
	struct http_request rq;
	cr_assert_eq(http_parse_request("GET / HTTP/1.1\r", 15, &dflt, &rq), 0,
		     "a CR at the end may be the start of a CRLF");
}

Test(http, field_errors)
{
	expect("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", -400);  /* obs-fold */
	expect("GET / HTTP/1.1\r\nX: a\r\n\tb\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\n Host: a\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nHost\r\n\r\n", -400);        /* no colon */
	expect("GET / HTTP/1.1\r\n: x\r\n\r\n", -400);         /* empty name */
	expect("GET / HTTP/1.1\r\nHost : a\r\n\r\n", -400);    /* SP before : */
	expect("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nHo st: a\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nX: a\x01\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nX: \x1b[31m\r\n\r\n", -400);
	expect_lit("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", -400);
}

Test(http, too_many_fields)
{
	char buf[2048];
	size_t n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\n");
	for (int i = 0; i < 32; i++)
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "X-%d: v\r\n", i);
	size_t fields_end = n;
	n += (size_t)snprintf(buf + n, sizeof(buf) - n, "\r\n");
	struct http_request rq = expect_n(buf, n, &dflt, (int)n);
	cr_assert_eq(rq.header_count, 32);
	/* One more: refused at its first byte, before it completes. */
	memcpy(buf + fields_end, "Y: v\r\n\r\n", 8);
	expect_n(buf, fields_end + 8, &dflt, -431);
	cr_assert_eq(http_parse_request(buf, fields_end + 1, &dflt, &rq), -431);
	cr_assert_eq(http_parse_request(buf, fields_end, &dflt, &rq), 0);

	const struct http_limits none = { 2048, 8192, 0 };
	expect_n("GET / HTTP/1.1\r\n\r\n", 18, &none, 18);
	expect_n("GET / HTTP/1.1\r\nA: b\r\n\r\n", 24, &none, -431);
}

Test(http, field_bytes_limit)
{
	/* "A: bcdefg\r\n" is 11 bytes: exactly the limit passes, with bare LF
	 * or CRLF counted as sent. */
	const struct http_limits lim = { 64, 11, 8 };
	expect_n("GET / HTTP/1.1\r\nA: bcdefg\r\n\r\n", 29, &lim, 29);
	expect_n("GET / HTTP/1.1\r\nA: bcdefgh\n\r\n", 29, &lim, 29);
	expect_n("GET / HTTP/1.1\r\nA: bcdefgh\r\n\r\n", 30, &lim, -431);
	expect_n("GET / HTTP/1.1\r\nA: b\r\nC: d\r\n\r\n", 30, &lim, -431);
	/* Still incomplete, already over: answered at once. */
	struct http_request rq;
	cr_assert_eq(http_parse_request("GET / HTTP/1.1\r\nA: bcdefghijk", 29, &lim, &rq), -431);
	cr_assert_eq(http_parse_request("GET / HTTP/1.1\r\nA: bcdefghij", 27, &lim, &rq), 0);

	/* Default limit: one 9000-byte field, never finished. */
	static char big[9100];
	memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
	memset(big + 19, 'v', sizeof(big) - 19);
	cr_assert_eq(http_parse_request(big, 16 + 8192, &dflt, &rq), 0);
	cr_assert_eq(http_parse_request(big, 16 + 8193, &dflt, &rq), -431);
	cr_assert_eq(http_parse_request(big, sizeof(big), &dflt, &rq), -431);
}

Test(http, request_line_limit)
{
	/* "GET /abcdefgh HTTP/1.1" is 22 bytes; the terminator is not counted. */
	const struct http_limits lim = { 22, 64, 8 };
	expect_n("GET /abcdefgh HTTP/1.1\r\n\r\n", 26, &lim, 26);
	expect_n("GET /abcdefgh HTTP/1.1\n\n", 24, &lim, 24);
	expect_n("GET /abcdefghi HTTP/1.1\r\n\r\n", 27, &lim, -414);
	struct http_request rq;
	cr_assert_eq(http_parse_request("GET /abcdefghi HTTP/1.1", 22, &lim, &rq), 0);
	cr_assert_eq(http_parse_request("GET /abcdefghi HTTP/1.1", 23, &lim, &rq), -414);

	/* A slowloris line at the default limit: 414 as soon as it passes. */
	static char line[4096];
	memcpy(line, "GET /", 5);
	memset(line + 5, 'a', sizeof(line) - 5);
	cr_assert_eq(http_parse_request(line, 2048, &dflt, &rq), 0);
	cr_assert_eq(http_parse_request(line, 2049, &dflt, &rq), -414);
	cr_assert_eq(http_parse_request(line, sizeof(line), &dflt, &rq), -414);
	cr_assert_eq(HTTP_HEAD_BYTES_MAX(&dflt), 2048 + 2 + 8192 + 2);
}

Test(http, content_length)
{
	cr_assert(ok("GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").has_body);
	cr_assert(!ok("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").has_body);
	cr_assert(!ok("GET / HTTP/1.1\r\ncontent-length:000\r\n\r\n").has_body);
	cr_assert(ok("GET / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n").has_body);
	cr_assert(ok("GET / HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 07\r\n\r\n").has_body,
		  "repeats of one value are accepted");
	expect("GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length:\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 5 5\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 5,5\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", -400);
}

Test(http, transfer_encoding)
{
	expect("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", -501);
	expect("GET / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n", -501);
	expect("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", -400);
	expect("GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", -400);
	expect("GET / HTTP/1.0\r\nContent-Length: 0\r\nTransfer-Encoding:\r\n\r\n", -400);
}

Test(http, status_text)
{
	cr_assert_str_eq(http_status_text(200), "OK");
	cr_assert_str_eq(http_status_text(400), "Bad Request");
	cr_assert_str_eq(http_status_text(414), "URI Too Long");
	cr_assert_str_eq(http_status_text(431), "Request Header Fields Too Large");
	cr_assert_str_eq(http_status_text(501), "Not Implemented");
	cr_assert_str_eq(http_status_text(505), "HTTP Version Not Supported");
	cr_assert_str_eq(http_status_text(-400), "Unknown");
	cr_assert_str_eq(http_status_text(299), "Unknown");
}
