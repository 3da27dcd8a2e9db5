/*
 * bench/lg_msgpack.h — the little MessagePack pc-loadgen needs to frame and
 * show replies: decode one header, skip one whole object, render a small one.
 *
 * Owns: nothing (pure functions over caller buffers). Any thread.
 *
 * Deliberately independent of the server's decoder in rpc/mp.c: the client
 * that measures the server must not share its parser, or a bug in it would
 * be on both sides of the wire and go unseen.
 *
 * Invariants: every size here comes from the peer, so nothing allocates or
 * recurses on it. The skipper keeps one count of objects still to skip (a
 * container adds its children to it), and as every object is at least one
 * byte, that count is also a lower bound on the bytes still to come, which
 * lets a declared array32 of 4 billion elements fail at once against the
 * size limit instead of being waited for. The renderer recurses, but at most
 * LG_RENDER_DEPTH_MAX deep, whatever the data says.
 */
#ifndef PC_BENCH_LG_MSGPACK_H
#define PC_BENCH_LG_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/util.h"

/* What kind of object a header starts. */
enum lg_mp_kind {
	LG_MP_INVALID,	/* 0xc1, the one marker msgpack never uses */
	LG_MP_NIL,
	LG_MP_BOOL,
	LG_MP_UINT,
	LG_MP_INT,	/* the signed encodings, negative fixint included */
	LG_MP_FLOAT,
	LG_MP_STR,
	LG_MP_BIN,
	LG_MP_EXT,
	LG_MP_ARRAY,
	LG_MP_MAP,
};

/* One decoded header: enough to skip the object or read a scalar. */
struct lg_mp_head {
	enum lg_mp_kind kind;
	/* UINT: the value; INT: the value in two's complement; BOOL: 0 or 1;
	 * ARRAY: elements; MAP: pairs. */
	uint64_t val;
	uint64_t payload;   /* bytes after the header: str/bin/ext data, float */
	uint64_t children;  /* objects after the payload: array n, map 2n */
	int8_t ext_type;
};

/* Decodes the header of the object at p[0..len). Returns the header's length,
 * 0 when len does not cover it yet, or -EPROTO for the unused marker. */
ssize_t lg_mp_head(const uint8_t *p, size_t len, struct lg_mp_head *h);

/* True, with the value, when h is an integer >= 0 in any encoding. */
bool lg_mp_head_u64(const struct lg_mp_head *h, uint64_t *out);

/*
 * Skips one complete object at p[0..len), nested ones included. Returns its
 * length; 0 when len does not cover it yet; -EPROTO when the bytes are not
 * msgpack (the unused marker 0xc1); -EMSGSIZE as soon as the object is known
 * to need more than limit bytes. Runs at most one iteration per byte.
 */
ssize_t lg_mp_skip(const uint8_t *p, size_t len, size_t limit);

/* Bounded text for messages; a full buffer silently truncates. */
struct lg_text {
	char *buf;
	size_t cap;
	size_t len;
};

/* Appends printf-style to t; never writes past cap, keeps buf terminated. */
PC_PRINTF(2, 3) void lg_text_add(struct lg_text *t, const char *fmt, ...);

/* Rendering limits: an error object is shown, not archived. */
#define LG_RENDER_DEPTH_MAX 4
#define LG_RENDER_ITEMS_MAX 8
#define LG_RENDER_STR_MAX 80

/*
 * Renders the object at p[0..len) into t, JSON-like, nested at most
 * LG_RENDER_DEPTH_MAX deep (recursion bounded by that, not by the data).
 * Error path only; pass depth 0. Returns the object's length or a negative
 * errno.
 */
ssize_t lg_mp_render(const uint8_t *p, size_t len, unsigned depth,
		     struct lg_text *t);

#endif /* PC_BENCH_LG_MSGPACK_H */
