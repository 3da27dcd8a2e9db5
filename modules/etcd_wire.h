/*
 * modules/etcd_wire.h — what the etcd discovery backend reads and writes on
 * the wire, as pure functions (no sockets, no globals): a minimal JSON
 * reader for the replies of etcd's v3 HTTP/JSON gateway, base64 for its
 * keys and values, and an HTTP/1.1 response reader (status line, headers,
 * Content-Length or chunked bodies). Unit-tested on malformed input
 * (tests/unit/test_etcd_wire.c).
 *
 * Threading: none of its own; every function works on the caller's buffers.
 *
 * JSON: etcd_json_parse validates a whole document (RFC 8259 grammar, depth
 * at most ETCD_JSON_DEPTH) and hands back its root; the accessors then walk
 * that already-validated text by position, never past its end. Values are
 * views into the caller's text (nothing is copied until etcd_json_str).
 */
#ifndef PC_MODULES_ETCD_WIRE_H
#define PC_MODULES_ETCD_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ETCD_JSON_DEPTH 32

enum etcd_jtype {
	ETCD_J_NULL, ETCD_J_BOOL, ETCD_J_NUM, ETCD_J_STR, ETCD_J_ARR, ETCD_J_OBJ
};

/* One JSON value: its text p[0..n) (for a string, with the quotes). */
struct etcd_json {
	const char *p;
	size_t n;
	int type; /* enum etcd_jtype */
};

/* Validate s[0..len) as one JSON value (whitespace around allowed): 0 and
 * *root, or -EPROTO (malformed, truncated, too deep). */
int etcd_json_parse(const char *s, size_t len, struct etcd_json *root);
/* The member named key of object obj: 0, -ENOENT (absent), -EPROTO (obj is
 * not an object). */
int etcd_json_get(const struct etcd_json *obj, const char *key,
		  struct etcd_json *out);
/* Follow a dotted path of member names ("result.header.revision"). */
int etcd_json_path(const struct etcd_json *obj, const char *path,
		   struct etcd_json *out);
/* The elements of array arr in order: *pos starts at 0; 1 and *out per
 * element, 0 at the end, -EPROTO if arr is not an array. */
int etcd_json_next(const struct etcd_json *arr, size_t *pos,
		   struct etcd_json *out);
/* An int64 written as a number or, as the gateway writes 64-bit fields, a
 * decimal string: 0, -ERANGE (does not fit), -EPROTO (not an integer). */
int etcd_json_int(const struct etcd_json *v, int64_t *out);
/* A string's bytes, unescaped, NUL-terminated in buf[cap]: its length, or
 * -EPROTO (not a string, or \u escapes other than ASCII), -ENOSPC. */
int etcd_json_str(const struct etcd_json *v, char *buf, size_t cap);
/* true / false: 0, else -EPROTO. */
int etcd_json_bool(const struct etcd_json *v, bool *out);

/* Base64 (RFC 4648, with padding). enc writes 4 * ceil(n / 3) bytes and a
 * NUL (out needs ETCD_B64_LEN(n) + 1): the length written. dec: the length
 * decoded, -EPROTO (bad alphabet or padding), -ENOSPC. */
#define ETCD_B64_LEN(n) (((n) + 2) / 3 * 4)
size_t etcd_b64_enc(const void *in, size_t n, char *out);
int etcd_b64_dec(const char *in, size_t n, void *out, size_t cap);

/* An HTTP/1.1 response head. */
struct etcd_http_head {
	int status;
	int64_t content_length; /* -1: none */
	bool chunked;
	bool close;             /* Connection: close */
	size_t head_len;        /* bytes up to and with the blank line */
};

#define ETCD_HTTP_HEAD_MAX 8192

/* Read a response head from buf[0..len): 1 and *h when complete, 0 when
 * more bytes are needed, -EPROTO when malformed (or longer than
 * ETCD_HTTP_HEAD_MAX, or a body length that does not parse). */
int etcd_http_head(const char *buf, size_t len, struct etcd_http_head *h);

/* Chunked transfer coding, decoded incrementally. */
struct etcd_chunks {
	int state;      /* internal */
	uint64_t left;  /* bytes of the current chunk still to come */
	unsigned line;  /* bytes of the current size / trailer line */
};

/* Decode in[0..n) into out (cap bytes free): sets *used (bytes of in
 * consumed) and *made (bytes written). Returns 1 when the last chunk and
 * trailer are done, 0 for more, -EPROTO on a malformed stream (bad size,
 * missing CRLF, chunk larger than 2^40; *used and *made are set then too).
 * Stops early when out is full. */
int etcd_chunks_decode(struct etcd_chunks *c, const char *in, size_t n,
		       size_t *used, char *out, size_t cap, size_t *made);

#endif
