/*
 * bench/p2p_wire.h — pc-p2p-bench's wire (p2p_wire.c): failure messages,
 * loopback connections and the one receive path, and the MessagePack-RPC
 * writer and reader. Knows nothing of the run, the keys or the targets.
 *
 * Owns: wire_err, one per thread. A struct wire_conn, wire_buf or wire_rd
 * belongs to whoever holds it (one thread).
 *
 * Invariants: only loopback IPv4 addresses are contacted; every wait is
 * bounded by the connection's timeout of silence; an RPC reply over
 * WIRE_REPLY_MAX fails as soon as its header says so.
 */
#ifndef PC_BENCH_P2P_WIRE_H
#define PC_BENCH_P2P_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "lg_msgpack.h"
#include "common/util.h"

#define WIRE_REPLY_MAX (2u << 20) /* largest reply we take (dir.get: 4096
				   * records of ~70 bytes at setup) */

/* ------------------------------------------------------------- errors ---- */

/* The last failure of this thread, shown by whoever reports it. */
extern _Thread_local char wire_err[512];

/* Records a failure message in wire_err; returns -err (err a positive
 * errno). */
PC_PRINTF(2, 3) int wire_fail(int err, const char *fmt, ...);
/* Printable excerpt of n bytes at p in out (cap bytes); returns out. */
const char *wire_show(const uint8_t *p, size_t n, char *out, size_t cap);

/* -------------------------------------------------------- connections ---- */

struct wire_conn {
	int fd;
	unsigned timeout_ms;
	char name[80];      /* "what host:port", for messages */
	uint8_t *rbuf;      /* RPC replies received but not consumed */
	size_t rbeg, rend;
};

/* Is host a loopback IPv4 address (127.0.0.0/8)? */
bool wire_host_ok(const char *host);
/* Connects to host:port, a loopback IPv4 address only, with TCP_NODELAY and
 * send and receive timeouts of timeout_ms; what names c in messages. */
int wire_conn_open(struct wire_conn *c, const char *what, const char *host,
		   uint16_t port, unsigned timeout_ms);
/* Closes c and frees its reply buffer; does nothing more for fd -1. */
void wire_conn_close(struct wire_conn *c);
/* Sends all len bytes (a blocked send past the timeout fails). */
int wire_send(struct wire_conn *c, const void *buf, size_t len);
/* Fills iov[0..n) from c (the iovecs are consumed); *got counts the bytes
 * that arrived, also on failure. A silence of the timeout fails. */
int wire_recv_iov(struct wire_conn *c, struct iovec *iov, unsigned n,
		  size_t *got);
/* Reads one whole MessagePack object into c->rbuf; *obj stays valid until
 * the next read on c. */
int wire_read_obj(struct wire_conn *c, const uint8_t **obj, size_t *len);

/* ------------------------------------------------------- MessagePack ---- */

/* A growable request buffer; grows at setup and on a worker's first batch. */
struct wire_buf {
	uint8_t *p;
	size_t len, cap;
};

/* Makes room for more bytes after b->len (asserts on allocation failure). */
void wire_buf_reserve(struct wire_buf *b, size_t more);
void wire_buf_put(struct wire_buf *b, const void *p, size_t n);
/* A marker then v as an n-byte big-endian field (n <= 8) at out; returns
 * 1 + n. */
size_t wire_put_field(uint8_t *out, uint8_t marker, uint64_t v, unsigned n);
void wire_mp_array(struct wire_buf *b, uint32_t n);
void wire_mp_str(struct wire_buf *b, const char *s, size_t n);
void wire_mp_bin_head(struct wire_buf *b, uint64_t n);
void wire_mp_uint(struct wire_buf *b, uint64_t v); /* v <= UINT32_MAX */
/* Starts [0, msgid, method, ...] in b (emptied): the caller appends the
 * params array. */
void wire_rpc_begin(struct wire_buf *b, uint32_t msgid, const char *method);

/* A reader over one decoded object; each call fails with -EPROTO on a
 * different type or a truncated object. */
struct wire_rd {
	const uint8_t *p, *end;
};

int wire_rd_head(struct wire_rd *r, struct lg_mp_head *h);
int wire_rd_array(struct wire_rd *r, uint64_t *n);
int wire_rd_uint(struct wire_rd *r, uint64_t *v);
int wire_rd_str(struct wire_rd *r, const char **s, size_t *n);
int wire_rd_bool(struct wire_rd *r, bool *v);
bool wire_rd_nil(struct wire_rd *r); /* consumes a nil when there is one */
int wire_rd_skip(struct wire_rd *r);
/* Reads the reply to msgid on c: [1, msgid, error, result]. On success *res
 * reads the result. A reply for another msgid, or carrying an error, fails.
 */
int wire_rpc_reply(struct wire_conn *c, const char *method, uint32_t msgid,
		   struct wire_rd *res);
/* Calls method with no params on c (the request built in b) and reads
 * its reply as wire_rpc_reply does. */
int wire_rpc_call0(struct wire_conn *c, struct wire_buf *b, uint32_t msgid,
		   const char *method, struct wire_rd *res);

#endif /* PC_BENCH_P2P_WIRE_H */
