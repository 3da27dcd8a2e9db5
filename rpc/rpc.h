/*
 * rpc/rpc.h — the MessagePack-RPC server side: methods, calls, replies.
 *
 * Owns: the wire protocol (the public MessagePack-RPC spec: request
 * [0, msgid, method, params], response [1, msgid, error, result],
 * notification [2, method, params]) as served on reactor connections, the
 * method table, per-connection limits and authentication state.
 * Threading: a connection and its calls live on one reactor; a handler runs
 * there and must reply there (rpc_call_reactor()) — work finished on another
 * thread posts back with rx_post() first.
 *
 * A handler replies exactly once: at once (inside the handler) or later, for
 * asynchronous work. If the client is gone by then the reply is dropped
 * quietly; the call object is freed by the reply either way.
 *
 * Error objects on the wire are maps {"code": str, "message": str}; the codes
 * are the RPC_E_* strings below (docs/protocol.md lists them).
 */
#ifndef PC_RPC_RPC_H
#define PC_RPC_RPC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util.h"
#include "reactor/reactor.h"
#include "rpc/mp.h"

/* Error codes (the "code" of an error object). */
#define RPC_E_BAD_REQUEST "bad_request"       /* not a valid RPC message */
#define RPC_E_UNKNOWN_METHOD "unknown_method" /* no such method */
#define RPC_E_BAD_PARAMS "bad_params"         /* wrong count or types */
#define RPC_E_UNAUTHORIZED "unauthorized"     /* authenticate first */
#define RPC_E_FORBIDDEN "forbidden"           /* not on this transport */
#define RPC_E_TOO_LARGE "too_large"           /* over a documented limit */
#define RPC_E_BUSY "busy"                     /* out of a resource; retry */
#define RPC_E_UNAVAILABLE "unavailable"       /* a peer or tier is down */
#define RPC_E_NOT_FOUND "not_found"
#define RPC_E_UNSUPPORTED "unsupported"       /* not in this version */
#define RPC_E_INTERNAL "internal"

struct rpc_call;
struct rpc_server;

/* Method flags. */
#define RPC_PUBLIC 0x1u     /* served before authentication (auth.*) */
#define RPC_LOCAL_ONLY 0x2u /* only on the Unix socket */

struct rpc_method {
	const char *name; /* "node.info"; NULL ends a table */
	void (*fn)(struct rpc_call *call, struct mp_rd *params);
	unsigned flags;
	const char *summary; /* one line for docs and "rpc.methods" */
};

/* Limits, each with a documented default (common/settings.c). */
struct rpc_limits {
	size_t max_message_bytes;
	uint32_t max_elements;
	uint32_t max_depth;
	uint32_t max_inflight;    /* calls per connection awaiting a reply */
	uint32_t max_connections; /* authenticated TCP, per server */
	uint32_t max_fds;         /* descriptors per message (Unix socket) */
};

/*
 * Guards against one client starving the others (rpc_server_set_guard):
 * connection classes, deadlines, memory. 0 means "no limit of its own" for
 * every field.
 */
struct rpc_guard {
	/* Connection classes: a flood of one never refuses the others. */
	uint32_t max_preauth;     /* TCP still authenticating (oldest evicted) */
	uint32_t max_local;       /* Unix-socket connections */
	uint32_t max_per_host;    /* TCP from one source address */
	size_t preauth_max_bytes; /* largest message before authentication */
	/* Deadlines (0 = off). */
	uint32_t handshake_timeout_ms; /* TCP: auth, or first request, within */
	uint32_t message_timeout_ms;   /* a message whole within, from 1st byte */
	uint32_t idle_timeout_ms;      /* TCP: no traffic and no call */
	uint32_t write_stall_ms;       /* queued output took no byte (all) */
	/* Memory, all connections together (0 = unbounded). */
	size_t max_buffered_bytes;     /* input held for incomplete messages */
	size_t max_reply_bytes;        /* reply bytes queued or reserved */
	size_t conn_reply_bytes;       /* per connection: queued + reserved */
};

/* ------------------------------------------------------------ the server */

/*
 * Build a server from NULL-terminated method tables (tables[i] may be NULL);
 * the built-in auth.challenge / auth.response (rpc/auth.h) are added.
 * secret (may be NULL/empty) turns on challenge-response for TCP clients.
 * allowed_gid (or -1) admits Unix-socket clients of that group besides the
 * node's own uid and root. Duplicate method names are an error (-EEXIST).
 */
int rpc_server_new(struct rpc_server **out, const struct rpc_limits *lim,
		   const struct rpc_method *const *tables, unsigned ntables,
		   const char *secret, long allowed_gid, unsigned nreactors);
void rpc_server_free(struct rpc_server *s);
/* Leave this server out of /metrics (a second server, such as discovery's
 * meta-port one, whose peercache_rpc_* series would repeat the first's).
 * Main thread, before the server serves. */
void rpc_server_no_metrics(struct rpc_server *s);
/* Set the guards; before the first accept (main thread). 0 or -ENOMEM. */
int rpc_server_set_guard(struct rpc_server *s, const struct rpc_guard *g);

/* Serve an accepted socket on reactor r; is_unix selects peer-credential
 * checks and descriptor passing. Closes fd on failure. */
void rpc_server_accept(struct rpc_server *s, struct rx_reactor *r, int fd,
		       bool is_unix);

/*
 * Run fn(reactor, fn_arg) on the reactor numbered reactor (its thread):
 * 0, or -errno when it cannot (then fn never runs). The server's owner
 * provides it (the node: its reactor group).
 */
typedef int (*rpc_post_fn)(void *arg, unsigned reactor,
			   void (*fn)(struct rx_reactor *r, void *fn_arg),
			   void *fn_arg);
/* A reactor drops only its own unproven connections to admit a newcomer
 * into a full class (or host). With post set, a newcomer its reactor
 * cannot admit that way is handed once to the reactor holding the most
 * unproven connections, which admits it by dropping one of its own or
 * refuses it; without (the default) it is refused where it is. Main
 * thread, before the first accept. */
void rpc_server_set_post(struct rpc_server *s, rpc_post_fn post, void *arg);

/* Unix-socket connections reactor serves now (any thread; a gauge). */
uint64_t rpc_server_local_conns(const struct rpc_server *s, unsigned reactor);
/* TCP connections reactor serves now (any thread; a gauge). */
uint64_t rpc_server_tcp_conns(const struct rpc_server *s, unsigned reactor);

const struct rpc_method *rpc_server_find(const struct rpc_server *s,
					 const char *name, size_t len);
/* All methods, for listings. */
unsigned rpc_server_methods(const struct rpc_server *s,
			    const struct rpc_method **out, unsigned max);

/* Why an input was refused (rpc_stats.rejected_by[]). */
enum rpc_reject {
	RPC_REJ_NOT_RPC,     /* MessagePack, but not an RPC message */
	RPC_REJ_NOT_MSGPACK, /* bytes that are not MessagePack */
	RPC_REJ_TOO_LARGE,   /* over rpc_max_message_bytes */
	RPC_REJ_TOO_MANY,    /* over rpc_max_elements (or objects) */
	RPC_REJ_TOO_DEEP,    /* over rpc_max_depth */
	RPC_REJ_HTTP,        /* an HTTP request */
	RPC_REJ_TLS,         /* a TLS handshake */
	RPC_REJ_UNAUTH,      /* calls without authentication */
	RPC_REJ_BAD_SHAPE,   /* wrong envelope, msgid known: error reply */
	RPC_REJ__COUNT,
};
extern const char *const rpc_reject_names[RPC_REJ__COUNT];

/* Counters, summed over reactors (any thread). */
struct rpc_stats {
	uint64_t requests;        /* requests and notifications dispatched */
	uint64_t errors;          /* error replies sent */
	uint64_t rejected;        /* inputs refused: malformed, oversized, ... */
	uint64_t rejected_by[RPC_REJ__COUNT];
	uint64_t conns_accepted;
	uint64_t conns_refused;   /* over max_connections or bad credentials */
	uint64_t conns_live;
	uint64_t auth_failures;
	uint64_t late_replies;    /* replies for a client already gone */
	uint64_t conns_evicted;   /* unproven connections dropped for new ones */
	uint64_t conns_moved;     /* newcomers handed to another reactor */
	uint64_t conns_timed_out; /* closed by a handshake/message/idle deadline */
	uint64_t conns_stalled;   /* closed: queued output made no progress */
	uint64_t conns_refused_host; /* over rpc_max_connections_per_host */
	uint64_t budget_refusals; /* rpc_call_budget_take answered -ENOBUFS */
	uint64_t conns_by_class[3]; /* gauges: pre-auth, TCP, Unix socket */
};
void rpc_server_stats(struct rpc_server *s, struct rpc_stats *out);

/* ---------------------------------------------------------------- calls */

struct rx_reactor *rpc_call_reactor(const struct rpc_call *call);
struct rpc_server *rpc_call_server(const struct rpc_call *call);
/* True when the call came over the Unix socket. */
bool rpc_call_is_local(const struct rpc_call *call);
/* Peer description for logs ("127.0.0.1:5123", "unix uid=1000"). */
const char *rpc_call_peer(const struct rpc_call *call);
/* Take the oldest descriptor received on this connection and not yet taken
 * (-1 if none). The caller owns it. Unclaimed descriptors are closed when
 * the connection closes. */
int rpc_call_take_fd(struct rpc_call *call);
/* Per-connection state for modules (freed by the module's cleanup fn once
 * the connection has closed and its last call has ended). One slot per
 * connection. */
void *rpc_call_conn_data(const struct rpc_call *call);
void rpc_call_set_conn_data(struct rpc_call *call, void *data,
			    void (*cleanup)(void *data));
/* Optional: closed(data) runs once when the connection closes, while calls
 * on it may still be in flight (their replies will be dropped); cleanup
 * still runs after the last of them. */
void rpc_call_set_conn_closed(struct rpc_call *call,
			      void (*closed)(void *data));

/*
 * Reply/staging memory budget. Before allocating a big buffer for a reply
 * (or staging data for one), a handler takes its size from the budget:
 * 0, or -ENOBUFS when it would put this connection over its share
 * (conn_out_max, counting output already queued) or the node over
 * rpc_max_reply_bytes — answer RPC_E_BUSY (retry later) then, or
 * RPC_E_TOO_LARGE when bytes alone exceed the per-connection share. Every
 * byte taken must be given back with rpc_call_budget_give (on the same call,
 * before its reply ends, e.g. once the buffer was written to the connection,
 * whose queue is accounted by itself); bytes still taken when the call's
 * reply ends are given back then. Reactor thread of the call only.
 */
int rpc_call_budget_take(struct rpc_call *call, size_t bytes);
void rpc_call_budget_give(struct rpc_call *call, size_t bytes);

/*
 * Take no further request from this call's connection until the call's
 * reply ends (call it from the handler, so that none after it has been
 * taken yet): for a call that holds much memory for a while, so that one
 * client pipelining such calls has one at a time, not all at once.
 */
void rpc_call_hold_input(struct rpc_call *call);

/*
 * Keep this request's bytes — every pointer into the params the handler
 * got — valid until the call's reply ends, and take no further request
 * from its connection until then: for a handler that works through a
 * large request over several loop passes (kv.set's copies into the pool)
 * instead of holding its reactor for all of it at once (it holds the input
 * too, rpc_call_hold_input). The bytes stay counted in the node's input
 * budget (rpc_max_buffered_bytes) meanwhile, until the reply or
 * rpc_call_release_input.
 * true when kept; false (nothing changes) when called after the handler
 * returned, or when the request arrived whole in one receive (a small
 * one): its bytes are valid during the handler only, as always.
 */
bool rpc_call_keep_request(struct rpc_call *call);

/*
 * Keep the params a handler reads with p (the rest of its request) valid
 * until the call's reply ends, whatever way the request came: kept
 * (rpc_call_keep_request; *copy = NULL), or, when it arrived whole in one
 * receive, the bytes from p on copied into *copy (malloc'd; the caller
 * frees it, after its last read) with p re-pointed at the copy, and the
 * connection's input held (rpc_call_hold_input) all the same: one such
 * call at a time per connection. For a handler that reads a large request
 * over several loop passes. From the handler only. 0, or -ENOMEM with
 * nothing changed (p still reads the request, valid during the handler).
 */
int rpc_call_keep_params(struct rpc_call *call, struct mp_rd *p, void **copy);

/*
 * The call reads its request no more, though it has not replied yet: its
 * kept bytes go back to the node's input budget (the params' pointers are
 * invalid from now on) and its connection takes requests again (the hold
 * ends). Harmless when nothing was kept or held, and twice.
 */
void rpc_call_release_input(struct rpc_call *call);

/* ---------------------------------------------------------------- replies */

/* Start the reply: returns a packer for exactly one result object. */
msgpack_packer *rpc_reply_begin(struct rpc_call *call);
/*
 * Inside a reply (after rpc_reply_begin, before rpc_reply_end): its next
 * len bytes are p's, sent from there without a copy — pack their
 * MessagePack header first (msgpack_pack_bin). p must stay valid and
 * unchanged until release(arg) (may be NULL) has run: on this reactor,
 * once the kernel has sent the bytes or the connection is gone, or before
 * this returns when they were copied instead. The bytes come out of the
 * call's reservation (rpc_call_budget_take) and count in the node's reply
 * budget until they have left; without len bytes reserved, with nobody to
 * answer, or out of memory, they are copied like any other reply bytes
 * (false; true: by reference). For large runs: each costs an allocation
 * and a send vector of its own.
 */
bool rpc_reply_ref(struct rpc_call *call, const void *p, size_t len,
		   void (*release)(void *arg), void *arg);
/* Finish the reply and free the call. */
void rpc_reply_end(struct rpc_call *call);
/* Reply with an error object {"code", "message"} and free the call. */
void rpc_reply_error(struct rpc_call *call, const char *code,
		     const char *fmt, ...) PC_PRINTF(3, 4);
/* Reply with an error and close the connection once it is sent. */
void rpc_reply_error_close(struct rpc_call *call, const char *code,
			   const char *fmt, ...) PC_PRINTF(3, 4);
/* Shorthands. */
void rpc_reply_nil(struct rpc_call *call);
void rpc_reply_bool(struct rpc_call *call, bool v);
/* [v[0], ..., v[n-1]] as MessagePack booleans. */
void rpc_reply_bools(struct rpc_call *call, const bool *v, size_t n);
void rpc_reply_uint(struct rpc_call *call, uint64_t v);

#endif /* PC_RPC_RPC_H */
