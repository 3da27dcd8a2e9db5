/*
 * modules/http_parse.h — a strict, allocation-free HTTP/1.1 request-head
 * parser for the node's metrics endpoint (GET /metrics, /healthz, /).
 *
 * Owns: nothing (pure functions over caller buffers). Any thread.
 *
 * The parser is stateless: the caller keeps the bytes received so far and
 * calls http_parse_request() again on the whole buffer when more arrive. The
 * head is re-scanned each time; that is cheap because a head is bounded by
 * HTTP_HEAD_BYTES_MAX(lim) and the endpoint serves small GETs, and it means
 * there is no per-connection parser state that could go stale. The cost is
 * quadratic for a peer dripping one byte per segment (about 50 M byte-steps
 * for a 10 KiB head); a caller that wants to cap it may re-parse only when
 * new bytes hold a '\n' or the buffer crosses a limit: by the prefix rule
 * below, a later call gives the same answer the skipped ones would have.
 *
 * Prefix consistency (checked by tests/fuzz/fuzz_http.c): every decision is
 * taken at a byte position from the bytes before it, so for any prefix of an
 * input the answer is either 0 (need more) or exactly the answer for the
 * whole input. A caller can therefore never see a head accepted early that
 * later bytes would have rejected, nor an error that more bytes would undo.
 */
#ifndef PC_MODULES_HTTP_PARSE_H
#define PC_MODULES_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Limits on one request head. Each is enforced the moment the first byte
 * beyond it arrives, not when the line or head completes, so a peer dripping
 * an endless line is answered as soon as it crosses the limit.
 */
struct http_limits {
	size_t max_request_line; /* request line bytes, without its CRLF/LF */
	size_t max_header_bytes; /* header field lines, each with its
				    terminator (not the blank line ending
				    the head): 0 allows no fields */
	unsigned max_headers;    /* header lines (fields) in one head */
};

#define HTTP_LIMITS_DEFAULT { 2048, 8192, 32 }

/* Larger limits are clamped to this, so a head length always fits the int
 * that http_parse_request() returns. */
#define HTTP_LIMIT_CEIL ((size_t)1 << 20)

/* The most bytes a head can take under lim: size a receive buffer with it
 * (+ 2 + 2: the request line's CRLF and the blank line). */
#define HTTP_HEAD_BYTES_MAX(lim) \
	((lim)->max_request_line + 2 + (lim)->max_header_bytes + 2)

enum http_method {
	HTTP_GET,
	HTTP_HEAD,
	HTTP_OTHER, /* any other valid token; method_name has it */
};

struct http_request {
	enum http_method method;
	char method_name[16];   /* NUL-terminated copy, case kept (methods are
				   case-sensitive: "get" is HTTP_OTHER) */
	const char *path;       /* points into the input; the path only */
	size_t path_len;        /* >= 1; path[0] == '/' */
	const char *query;      /* after '?', may be empty; never NULL (points
				   just past the path when there is no '?') */
	size_t query_len;
	int version_minor;      /* 0 or 1 (HTTP/1.0 or HTTP/1.1) */
	bool keep_alive;        /* version default, then Connection: close /
				   keep-alive (close wins when both appear) */
	bool has_body;          /* Content-Length > 0 (a Transfer-Encoding is
				   refused before this is reported) */
	size_t header_count;    /* header fields in the head */
};

/*
 * Parse one request head from buf[0..len). lim may be NULL for
 * HTTP_LIMITS_DEFAULT. Returns:
 *   > 0  bytes consumed by the head (through the blank line); *req filled;
 *   0    incomplete: need more bytes (and within limits so far);
 *   < 0  -status: the HTTP status code to answer with before closing:
 *        -400 malformed, -414 request line too long, -431 headers too large /
 *        too many, -505 version not supported (HTTP/2 preface included),
 *        -501 Transfer-Encoding (not supported).
 * *req is written only when the return is > 0; its pointers point into buf.
 * Bytes after the head (a body, a pipelined request) are not looked at.
 */
int http_parse_request(const char *buf, size_t len,
		       const struct http_limits *lim, struct http_request *req);

/* Reason phrase for a status code ("Bad Request"); "Unknown" for codes not
 * in the table. Never NULL. */
const char *http_status_text(int status);

#endif /* PC_MODULES_HTTP_PARSE_H */
