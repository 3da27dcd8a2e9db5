/*
 * tests/fuzz/fuzz_http.c — libFuzzer target for the HTTP request-head parser
 * (modules/http_parse.c), the only code that reads the metrics endpoint's
 * bytes from the network.
 *
 * Per input, under three limit sets (default, small, zero — so the limit
 * paths are reached without the fuzzer having to grow 8 KiB inputs):
 *   - stream: parse heads back to back as a connection would, checking that
 *     every accepted head is in bounds and its fields are sane;
 *   - prefixes: every prefix of the first 256 bytes, each in an exactly sized
 *     heap copy (so ASan sees a read past its end), must answer 0 or exactly
 *     the full input's answer — a prefix may never accept a head, or reject
 *     one, differently from the whole input; an accepted head must match
 *     field for field;
 *   - exactness: an accepted head of n bytes is accepted from buf[0..n) and
 *     is incomplete from buf[0..n-1).
 * Any violation traps.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_http -max_total_time=60 WORKDIR tests/fuzz/corpus/http
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "modules/http_parse.h"

#define PREFIX_MAX 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct http_limits fuzz_limits[] = {
	HTTP_LIMITS_DEFAULT,
	{ 40, 64, 4 },
	{ 0, 0, 0 },
};

static void check(bool cond)
{
	if (!cond)
		__builtin_trap();
}

/* An accepted head: every pointer inside buf[0..ret), every field sane. */
static void check_request(const char *buf, size_t len, int ret,
			  const struct http_request *rq,
			  const struct http_limits *lim)
{
	size_t n = (size_t)ret;
	check(n <= len && n <= HTTP_HEAD_BYTES_MAX(lim));
	check(rq->path >= buf && rq->path_len >= 1 &&
	      rq->path_len <= n - (size_t)(rq->path - buf));
	check(rq->path[0] == '/' && !memchr(rq->path, '?', rq->path_len));
	check(rq->query >= buf && rq->query_len <= n - (size_t)(rq->query - buf));
	check(rq->version_minor == 0 || rq->version_minor == 1);
	size_t mlen = strnlen(rq->method_name, sizeof(rq->method_name));
	check(mlen >= 1 && mlen < sizeof(rq->method_name));
	check((rq->method == HTTP_GET) == (strcmp(rq->method_name, "GET") == 0));
	check((rq->method == HTTP_HEAD) == (strcmp(rq->method_name, "HEAD") == 0));
	check(rq->header_count <= lim->max_headers);
}

/* The same head parsed from two buffers (base a and base b). */
static bool same_request(const char *a, const struct http_request *x,
			 const char *b, const struct http_request *y)
{
	return x->method == y->method &&
	       strcmp(x->method_name, y->method_name) == 0 &&
	       x->path - a == y->path - b && x->path_len == y->path_len &&
	       x->query - a == y->query - b && x->query_len == y->query_len &&
	       x->version_minor == y->version_minor &&
	       x->keep_alive == y->keep_alive && x->has_body == y->has_body &&
	       x->header_count == y->header_count;
}

static void fuzz_one(const char *buf, size_t size, const struct http_limits *lim,
		     char *copy)
{
	struct http_request rq, full_rq;

	/* The stream, as a connection consumes it. */
	size_t off = 0;
	while (off < size) {
		int r = http_parse_request(buf + off, size - off, lim, &rq);
		check(r >= 0 || r == -400 || r == -414 || r == -431 ||
		      r == -501 || r == -505);
		check(r >= 0 || strcmp(http_status_text(-r), "Unknown") != 0);
		if (r <= 0)
			break;
		check_request(buf + off, size - off, r, &rq, lim);
		off += (size_t)r;
	}

	int full = http_parse_request(buf, size, lim, &full_rq);
	if (full > 0) {
		check(http_parse_request(buf, (size_t)full, lim, &rq) == full);
		check(http_parse_request(buf, (size_t)full - 1, lim, &rq) == 0);
	}
	size_t last = size < PREFIX_MAX ? size : PREFIX_MAX;
	for (size_t n = 0; n <= last; n++) {
		memcpy(copy + PREFIX_MAX - n, buf, n);
		const char *p = copy + PREFIX_MAX - n; /* ends at the copy's end */
		int r = http_parse_request(p, n, lim, &rq);
		check(r == 0 || r == full);
		if (r > 0)
			check(same_request(p, &rq, buf, &full_rq));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* One exactly sized block; each prefix is copied to its end, so a
	 * read past a prefix runs off the allocation and ASan reports it. */
	char *copy = malloc(PREFIX_MAX);
	if (!copy)
		return 0;
	for (size_t i = 0; i < sizeof(fuzz_limits) / sizeof(fuzz_limits[0]); i++)
		fuzz_one((const char *)data, size, &fuzz_limits[i], copy);
	free(copy);
	return 0;
}
