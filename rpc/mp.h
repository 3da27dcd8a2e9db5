/*
 * rpc/mp.h — MessagePack decoding for untrusted input, and encoding helpers.
 *
 * Owns: nothing (functions over caller buffers; mp_scan_held allocates the
 * caller's scan state). Any thread.
 *
 * Decoding is ours, not msgpack-c's: msgpack-c's unpacker allocates an array
 * as soon as it reads the declared count, so 5 bytes ("dd ff ff ff ff": an
 * array of 4 billion elements) make it try to allocate ~100 GB. Here a message
 * is first *scanned* — one pass, no allocation, every count checked against
 * limits and against the bytes a message may have — and only a complete,
 * valid message is then read with a cursor that points into the receive
 * buffer (strings and binaries are never copied).
 *
 * Encoding uses msgpack-c's packer (msgpack_packer) writing through a
 * callback: into a connection's output queue or a pc_wbuf.
 */
#ifndef PC_RPC_MP_H
#define PC_RPC_MP_H

#include <msgpack.h>

#include "common/buf.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MP_DEPTH_MAX 64 /* hard ceiling for mp_limits.max_depth */

struct mp_limits {
	size_t max_bytes;      /* one whole message */
	uint32_t max_elements; /* entries of one array, or pairs of one map */
	uint32_t max_depth;    /* nesting of arrays/maps, <= MP_DEPTH_MAX */
	uint32_t max_objects;  /* objects in one message (bounds scan work) */
};

#define MP_NEED_MORE 0
#define MP_COMPLETE 1

/*
 * Scan one object at p[0..len). Returns:
 *   MP_COMPLETE   *size = the object's length in bytes;
 *   MP_NEED_MORE  *size = a lower bound of the bytes needed (> len), so the
 *                 caller need not rescan before that many have arrived;
 *   -EMSGSIZE     the object is, or declares it will be, over max_bytes;
 *   -E2BIG        a count over max_elements, or over max_objects in total;
 *   -ELOOP        nesting deeper than max_depth;
 *   -EBADMSG      a byte that is not MessagePack (0xc1).
 */
int mp_scan(const uint8_t *p, size_t len, const struct mp_limits *lim,
	    size_t *size);

/*
 * A scan that goes on where the last one stopped, for a message that arrives
 * in pieces: each call is given the message's bytes from its first one
 * (p may move between calls, as a buffer grows; the bytes already scanned
 * must not change) and scans only those it has not seen. Without it, a
 * message of many small objects is rescanned from its start each time a
 * piece arrives: quadratic work, which one client sending a large message
 * a few bytes at a time could make unbounded. Same results as mp_scan of
 * p[0..len); after any result but MP_NEED_MORE the state must be begun
 * again before the next message.
 */
struct mp_scan_state {
	size_t pos;       /* bytes of the message scanned */
	uint64_t objects; /* objects declared so far */
	unsigned depth;   /* current nesting */
	uint64_t left[MP_DEPTH_MAX + 1]; /* objects still due per level */
};

void mp_scan_begin(struct mp_scan_state *st);
int mp_scan_resume(struct mp_scan_state *st, const uint8_t *p, size_t len,
		   const struct mp_limits *lim, size_t *size);

/*
 * A connection's scan of its next message: resumes the state *held, which
 * is allocated at the message's first MP_NEED_MORE and freed at any other
 * result (messages that arrive whole never allocate). Out of memory, the
 * next call scans from the message's start again: slower, still correct.
 * The owner frees *held when the connection goes.
 */
int mp_scan_held(struct mp_scan_state **held, const uint8_t *p, size_t len,
		 const struct mp_limits *lim, size_t *size);

enum mp_type {
	MP_T_NIL,
	MP_T_BOOL,
	MP_T_UINT,  /* non-negative integer, any encoding */
	MP_T_INT,   /* negative integer */
	MP_T_FLOAT,
	MP_T_STR,
	MP_T_BIN,
	MP_T_ARRAY,
	MP_T_MAP,
	MP_T_EXT,
	MP_T_END,   /* cursor at its end */
	MP_T_BAD,   /* invalid byte */
};

/* Cursor over a scanned message. Reads return 0, -EINVAL when the next
 * object has another type (the cursor does not move), or -EBADMSG when the
 * buffer ends inside the object. */
struct mp_rd {
	const uint8_t *p;
	const uint8_t *end;
};

static inline void mp_rd_init(struct mp_rd *r, const void *p, size_t len)
{
	r->p = p;
	r->end = (const uint8_t *)p + len;
}

enum mp_type mp_peek(const struct mp_rd *r);
const char *mp_type_name(enum mp_type t);
int mp_rd_nil(struct mp_rd *r);
int mp_rd_bool(struct mp_rd *r, bool *v);
int mp_rd_uint(struct mp_rd *r, uint64_t *v);
int mp_rd_int(struct mp_rd *r, int64_t *v);
int mp_rd_float(struct mp_rd *r, double *v);
int mp_rd_str(struct mp_rd *r, const char **s, uint32_t *len);
int mp_rd_bin(struct mp_rd *r, const uint8_t **b, uint32_t *len);
int mp_rd_array(struct mp_rd *r, uint32_t *n);
int mp_rd_map(struct mp_rd *r, uint32_t *n);
/* Skip one object (whatever its type) without recursion. */
int mp_skip(struct mp_rd *r);
/* True when the next object is nil (and consume it). */
bool mp_rd_try_nil(struct mp_rd *r);
/* Compare a str just read with a C string. */
bool mp_str_eq(const char *s, uint32_t len, const char *lit);

/* ------------------------------------------------------------- encoding */

/* msgpack_packer_write callback into a pc_wbuf (common/buf.h); a failed
 * write (over the buffer's max) fails the packer. */
int mp_wbuf_write(void *data, const char *buf, size_t len);
static inline void pc_wbuf_packer(struct pc_wbuf *b, msgpack_packer *pk)
{
	msgpack_packer_init(pk, b, mp_wbuf_write);
}

/* Append len bytes that already are MessagePack (one whole object or more)
 * through the packer's sink, as one write. */
static inline void mp_pack_raw(msgpack_packer *pk, const void *p, size_t len)
{
	pk->callback(pk->data, (const char *)p, len);
}

/* Pack a C string as a MessagePack str. */
static inline void mp_pack_cstr(msgpack_packer *pk, const char *s)
{
	size_t n = __builtin_strlen(s);
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

#endif /* PC_RPC_MP_H */
