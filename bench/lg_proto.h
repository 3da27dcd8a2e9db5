/*
 * bench/lg_proto.h — pc-loadgen's wire protocols ("modes"), behind one table.
 *
 * Owns: nothing global; the modes are read-only tables. A struct
 * lg_proto_cfg is filled by main (from the options) and by the mode's setup(),
 * then shared read-only by every worker thread, which call request_build()
 * and reply_frame() concurrently on their own buffers.
 *
 * Invariants: a request never exceeds cfg->request_bytes_max, a mode never
 * asks for more bytes once it holds cfg->reply_bytes_max of them (it frames a
 * reply or fails), and both maxima are fixed by setup() before any
 * connection exists, so the loop can size its buffers once.
 */
#ifndef PC_BENCH_LG_PROTO_H
#define PC_BENCH_LG_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Wire limits; each one is also an option bound checked at parse time. */
#define LG_REQUEST_BYTES_MAX 65536
#define LG_REPLY_BYTES_MAX (1u << 20)
/* msgpack-rpc: largest reply accepted unless --reply-bytes says otherwise:
 * ample for a health map, small enough that 10k connections' rx buffers stay
 * cheap. */
#define LG_RPC_REPLY_BYTES_DEFAULT 16384

/* What the options say about the wire, shared read-only by every thread. */
struct lg_proto_cfg {
	const uint8_t *request;	    /* raw: bytes of one request */
	size_t request_bytes;	    /* raw: their length */
	bool request_given;	    /* --request was on the command line */
	size_t reply_bytes;	    /* raw: fixed reply length; rpc: largest
				       reply accepted; 0 = mode default */
	const char *method;	    /* rpc: method name, NULL if not given */
	const uint8_t *params;	    /* rpc: encoded params, NULL = [] */
	size_t params_bytes;
	/* Set by setup(): */
	uint8_t *tmpl;		    /* rpc: one request with msgid 0 (owned) */
	size_t tmpl_bytes;
	size_t msgid_off;	    /* rpc: where the uint32 msgid sits in tmpl */
	size_t request_bytes_max;   /* sizes the tx buffer */
	size_t reply_bytes_max;	    /* sizes the rx buffer */
};

/* What one framed reply says, beyond its length. */
struct lg_reply {
	uint32_t msgid;		/* the request it answers */
	uint32_t err_off;	/* the error object inside the reply, */
	uint32_t err_len;	/* err_len 0 when the error is nil */
};

/*
 * A protocol mode. The loop never looks at bytes itself; it asks the mode to
 * build requests and to frame replies. The loop picks every msgid (unique
 * among the connection's requests in flight, and carrying the slot that
 * holds the request's send time); a mode whose requests carry no msgid just
 * ignores it.
 */
struct lg_proto {
	const char *name;
	/* Replies come back in request order and carry no msgid: the loop
	 * passes the oldest in-flight msgid to reply_frame, which echoes it. */
	bool ordered;
	/* Validates cfg and fills the fields setup owns. 0, or a negative
	 * errno with *why saying which option is wrong. */
	int (*setup)(struct lg_proto_cfg *cfg, const char **why);
	/* Writes one request carrying msgid into buf[0..cap). Returns the bytes
	 * written, or -ENOSPC (cap is request_bytes_max, so only on a bug). */
	ssize_t (*request_build)(const struct lg_proto_cfg *cfg, uint32_t msgid,
				 uint8_t *buf, size_t cap);
	/* Looks at received bytes buf[0..len) starting at a reply boundary.
	 * Returns the length of the first reply and fills *out when it is
	 * complete; 0 when more bytes are needed (never once len reaches
	 * reply_bytes_max); or a negative errno: -EPROTO not the protocol's
	 * encoding, -EBADMSG well-formed but not a reply, -EMSGSIZE longer
	 * than reply_bytes_max. expect_msgid is the oldest in-flight request,
	 * meaningful for ordered modes only. */
	ssize_t (*reply_frame)(const struct lg_proto_cfg *cfg,
			       uint32_t expect_msgid, const uint8_t *buf,
			       size_t len, struct lg_reply *out);
};

/* raw, the default mode. */
extern const struct lg_proto lg_proto_raw;

/* The mode --mode NAME names, or NULL. */
const struct lg_proto *lg_proto_find(const char *name);

#endif /* PC_BENCH_LG_PROTO_H */
