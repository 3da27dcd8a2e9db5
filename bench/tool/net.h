/*
 * bench/tool/net.h — peercache-bench: the plain TCP plumbing the baseline
 * targets (be_redis.c, be_memcached.c) share.
 *
 * A baseline connection is one blocking TCP socket (TCP_NODELAY) per
 * driver thread; every send and receive is done with MSG_DONTWAIT and waits
 * in poll() for at most what is left of the call's deadline, so no call
 * outlasts the target's timeout_ms. Requests are laid out as iovecs: the
 * protocol text goes to a per-connection staging area, page bytes are
 * referenced where they are (c->buf), never copied. Replies are read
 * through a buffered reader: lines from its buffer, values straight into
 * their final place.
 *
 * Owns: nothing global. A pcb_net_proc is one process's settings (read
 * only once opened); a pcb_net_conn is one thread's.
 */
#ifndef PC_BENCH_TOOL_NET_H
#define PC_BENCH_TOOL_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "pcb.h"

/* Most addresses a name resolves to that a connection tries, in order. */
#define PCB_NET_ADDRS_MAX 4
/* The reader's buffer: the longest line a reply may have. */
#define PCB_NET_RD_BYTES (64u * 1024)
/* Value lengths a server may declare and we read past (skipping values of
 * the wrong size): larger ones are a protocol violation. */
#define PCB_NET_VALUE_MAX (1ull << 30)
/* Staging bytes per key of a request: the protocol text around a key. */
#define PCB_NET_KEY_TEXT 64

/* One process's view of a target (proc_open): where and how. */
struct pcb_net_proc {
	const struct pcb_backend *be; /* the connections' */
	const char *target;  /* be->target, for messages */
	char where[300];     /* "host:port" as given, for messages */
	unsigned naddrs;     /* resolved addresses, tried in order */
	struct sockaddr_storage addrs[PCB_NET_ADDRS_MAX];
	socklen_t addrlens[PCB_NET_ADDRS_MAX];
	unsigned timeout_ms; /* connect, and each call as a whole */
	uint64_t page_bytes;
	unsigned batch;      /* most keys per call */
};

/* Buffered reader: unread bytes are buf[head..tail). */
struct pcb_net_rd {
	uint8_t *buf;
	size_t head, tail;
};

/* A request being laid out: text in stage, iovecs over stage and pages. */
struct pcb_net_out {
	char *stage;
	size_t len, cap;  /* stage bytes used, allocated */
	size_t seg;       /* start of the stage bytes no iovec covers yet */
	struct iovec *iov;
	unsigned niov, iov_cap;
};

/* One thread's connection (conn_open); the driver sees base. */
struct pcb_net_conn {
	struct pcb_conn base;             /* first */
	const struct pcb_net_proc *proc;
	int fd;
	bool broken;          /* out of step with the server: every call fails */
	uint64_t deadline_ms; /* of the call in progress (CLOCK_MONOTONIC) */
	struct pcb_net_rd rd;
	struct pcb_net_out out;
};

/*
 * proc_open for a TCP target: parse t->addr ("host:port", "host",
 * "[v6]:port", a bare IPv6 address; default_port when none; NULL or empty:
 * 127.0.0.1) and resolve it
 * once. Returns 0 or a negative errno with err saying why.
 */
int pcb_net_proc_open(const struct pcb_target *t,
		      const struct pcb_backend *be, const char *default_port,
		      void **proc, char *err, size_t errlen);
void pcb_net_proc_close(void *proc);
/* conn_open: connect within timeout_ms (each address in turn), allocate the
 * page buffer (batch * page_bytes, zeroed), the reader and the staging. */
int pcb_net_conn_open(void *proc, unsigned idx, struct pcb_conn **out,
		      char *err, size_t errlen);
void pcb_net_conn_close(struct pcb_conn *c);

/*
 * The start of every op: *hits = 0; check the connection and the keys (n <= batch,
 * each key shorter than PCB_KEY_MAX), start the call's deadline, empty the
 * staging and c->err (a call that succeeds may leave a note there for the
 * log: a page memcached would not store). Returns 1 to go on, 0 when there is nothing to do (n == 0), or a
 * negative errno with c->err set.
 */
int pcb_net_begin(struct pcb_net_conn *c, const size_t *keylens, size_t n,
		  size_t *hits);
/*
 * Record a failure of the call: c->err = "<target> <where>: <what>: <why>"
 * (why from rc: timeout, closed, ...). Errors that leave the connection out
 * of step with the server (all but -EINVAL and -EREMOTEIO) mark it broken.
 * Returns rc.
 */
int pcb_net_fail(struct pcb_net_conn *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* c->err = "<target> <where>: <message>", nothing else (a note for the
 * log, or the text of an error reply). */
void pcb_net_note(struct pcb_net_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Append protocol text to the staging (asserts room: begin checked it). */
void pcb_net_out_fmt(struct pcb_net_out *o, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void pcb_net_out_bytes(struct pcb_net_out *o, const void *p, size_t n);
/* A value: n bytes sent from where they are (a page: no copy), then CRLF
 * (both protocols end a value so; it joins the next command's text). */
void pcb_net_out_value(struct pcb_net_out *o, const void *p, size_t n);
/* The protocol text before key's value (or the whole command without
 * one: value_bytes is then 0 and values false). */
typedef void pcb_net_head_fn(struct pcb_net_out *o, const char *cmd,
			     const char *key, size_t keylen, bool values,
			     uint64_t value_bytes);
/* A pipeline of one command per key: head() for each, then (values) the
 * key's page from c->buf; sent by the deadline (as pcb_net_send). */
int pcb_net_send_each(struct pcb_net_conn *c, const char *cmd,
		      char *const *keys, const size_t *keylens, size_t n,
		      bool values, pcb_net_head_fn *head);
/* Send everything laid out, by the deadline; then empty the staging. 0, or
 * -ETIMEDOUT, -ECONNRESET or another negative errno with c->err saying
 * "sending <what>: why". */
int pcb_net_send(struct pcb_net_conn *c, const char *what);

/* A line ending in CRLF: *line (not NUL-terminated, valid until the next
 * read) and *len without the CRLF. -EPROTO when longer than the reader's
 * buffer, -ETIMEDOUT, -ECONNRESET. */
int pcb_net_read_line(struct pcb_net_conn *c, const char **line,
		      size_t *len);
/* Exactly n bytes into dst (NULL: read and drop them); large remainders
 * go straight from the socket into dst. */
int pcb_net_read_exact(struct pcb_net_conn *c, void *dst, uint64_t n);
/* A value's trailing CRLF: 0 or -EPROTO. */
int pcb_net_read_crlf(struct pcb_net_conn *c);

/* s[0..len) as a decimal integer (optional '-', at most 18 digits, nothing
 * else): 0 or -EPROTO. */
int pcb_net_parse_int(const char *s, size_t len, int64_t *out);
/* s[0..len) for a message: printable bytes as they are, others as '?',
 * cut to fit out. Returns out. */
const char *pcb_net_show(const void *s, size_t len, char *out, size_t cap);

#endif /* PC_BENCH_TOOL_NET_H */
