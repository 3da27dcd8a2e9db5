/*
 * rpc/client.h — MessagePack-RPC clients: asynchronous on a reactor, and
 * blocking for ordinary threads.
 *
 * Owns: connections to other endpoints ("host:port" over TCP, or
 * "unix:/path"), per-call timeouts, reconnect backoff and the cluster
 * challenge-response on connect.
 *
 * Asynchronous client (struct rpc_client): one per reactor, used only on that
 * reactor's thread. Per endpoint it keeps up to conns_per_endpoint
 * connections, each carrying up to inflight_per_conn calls at once (matched
 * by msgid, replies in any order). A connection that fails is closed and all
 * its calls fail; a connection on which a call timed out is retired — no new
 * calls — and closed once its last call ends: a broken connection is never
 * reused. After a failed connect the endpoint backs off (doubling from
 * backoff_min_ms to backoff_max_ms), and calls fail fast meanwhile. When
 * the reactor stops, every call in flight or waiting, and every call sent
 * afterwards, fails with -ESHUTDOWN at once (its done() runs before the
 * reactor's loop ends), so nothing waits on a peer that will not answer.
 *
 * Blocking client (struct rpc_sync): thread-safe; a call leases an idle
 * connection (or opens one), returns it to the pool only after a successful
 * exchange, and closes it on any error. The pool lock is held only to take
 * or give back a connection, never across a call.
 */
#ifndef PC_RPC_CLIENT_H
#define PC_RPC_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/endpoint.h"
#include "reactor/reactor.h"
#include "rpc/mp.h"

/* The outcome of a call. */
struct rpc_result {
	/* 0: result holds the answer. -EREMOTEIO: the server answered with an
	 * error (code/message). -ETIMEDOUT, -ECONNREFUSED, -ECONNRESET,
	 * -EACCES (authentication), -EPROTO (bad reply), -ESHUTDOWN, ...: no
	 * answer. */
	int err;
	char code[32];
	char message[192];
	struct mp_rd result; /* err == 0: the result object */
};

/* Describe a result for logs: "ok", "timeout", "unknown_method: ...". */
const char *rpc_result_str(const struct rpc_result *res, char *buf,
			   size_t len);

struct rpc_client_opts {
	unsigned conns_per_endpoint;  /* default 2 */
	unsigned inflight_per_conn;   /* default 1024, at most 65536 */
	unsigned connect_timeout_ms;  /* default 1000 */
	unsigned backoff_min_ms;      /* default 50 */
	unsigned backoff_max_ms;      /* default 5000 */
	const char *secret;           /* cluster secret; NULL/"" for none */
	size_t max_message_bytes;     /* default 64 MiB */
	uint32_t max_elements;        /* default 1 Mi */
	uint32_t max_depth;           /* default 32 */
};

void rpc_client_opts_default(struct rpc_client_opts *o);

/* ------------------------------------------------------ asynchronous client */

struct rpc_client;
struct rpc_req;
typedef void (*rpc_done_fn)(void *arg, const struct rpc_result *res);

struct rpc_client *rpc_client_new(struct rx_reactor *r,
				  const struct rpc_client_opts *o);
/* Fail every outstanding call with -ESHUTDOWN (one that had already failed
 * keeps its error) and free the client. A call a done() sends meanwhile
 * fails too. Normally after the reactor's loop has ended (a module's exit
 * hook): by then the stop has completed every call already. */
void rpc_client_free(struct rpc_client *cl);

/*
 * A call: create it, pack exactly nparams objects with the packer, send.
 * done(arg, res) runs exactly once, later, on the reactor (never inside
 * rpc_req_send). res->result is valid only during done. timeout_ms 0 means
 * the default of 5 s.
 */
struct rpc_req *rpc_req_new(struct rpc_client *cl, const char *endpoint,
			    const char *method, uint32_t nparams,
			    unsigned timeout_ms, rpc_done_fn done, void *arg);
msgpack_packer *rpc_req_packer(struct rpc_req *q);
void rpc_req_send(struct rpc_req *q);

/*
 * Fail every call to endpoint with err now — those waiting for a connection
 * and those in flight — and close its connections: for a peer known not to
 * answer, whose calls would otherwise each wait for their own timeout.
 * Completions run later (as for any failure), never inside this call.
 */
void rpc_client_fail_endpoint(struct rpc_client *cl, const char *endpoint,
			      int err);

struct rpc_client_stats {
	uint64_t calls;
	uint64_t timeouts;
	uint64_t conn_failures;
	uint64_t late_replies; /* replies for calls that had timed out */
	uint64_t conns_open;
};
void rpc_client_stats(const struct rpc_client *cl, struct rpc_client_stats *s);

/* ---------------------------------------------------------- blocking client */

struct rpc_sync;

struct rpc_sync_opts {
	unsigned timeout_ms; /* per call, default 5000 */
	unsigned max_idle;   /* pooled idle connections, default 8 */
	const char *secret;  /* as above */
	size_t max_message_bytes;
};

void rpc_sync_opts_default(struct rpc_sync_opts *o);
struct rpc_sync *rpc_sync_new(const char *endpoint,
			      const struct rpc_sync_opts *o, int *err);
void rpc_sync_free(struct rpc_sync *s);

/* A reply owns the received bytes; res.result points into them. */
struct rpc_sync_reply {
	uint8_t *buf;
	size_t len;
	struct rpc_result res;
};
void rpc_sync_reply_free(struct rpc_sync_reply *rep);

/*
 * Call method with params, an encoded MessagePack array (e.g. 0x90 for []),
 * optionally passing descriptors (Unix endpoints only). Returns 0 when the
 * server answered (check rep->res.err for -EREMOTEIO) or a negative errno
 * (rep->res.err holds it too). rep must be freed in both cases.
 */
int rpc_sync_call(struct rpc_sync *s, const char *method, const void *params,
		  size_t params_len, const int *fds, unsigned nfds,
		  unsigned timeout_ms, struct rpc_sync_reply *rep);

/* Fill res from a parsed response message (both clients use it). */
struct rpc_msg;
void rpc_result_from_response(const struct rpc_msg *m, struct rpc_result *res);

/*
 * The same, in steps, for callers that keep state per connection (e.g. the
 * memory regions a local client registered on it): lease a connection, call
 * on it any number of times, release it. A connection on which a call
 * failed is closed at release, never pooled. udata is freed with its
 * connection.
 */
struct rpc_sync_conn;
int rpc_sync_lease(struct rpc_sync *s, unsigned timeout_ms,
		   struct rpc_sync_conn **out);
int rpc_sync_conn_call(struct rpc_sync *s, struct rpc_sync_conn *c,
		       const char *method, const void *params,
		       size_t params_len, const int *fds, unsigned nfds,
		       unsigned timeout_ms, struct rpc_sync_reply *rep);
void rpc_sync_release(struct rpc_sync *s, struct rpc_sync_conn *c);
void *rpc_sync_conn_udata(const struct rpc_sync_conn *c);
void rpc_sync_conn_set_udata(struct rpc_sync_conn *c, void *udata,
			     void (*udata_free)(void *udata));

/*
 * Blocking-socket helpers, for code that talks to a node without a reactor
 * (this client, the peercache tool). Deadlines are pc_now_ns() values.
 * rpc_wait_fd: wait until fd is ready for events: 0, -ETIMEDOUT or -errno.
 * rpc_connect_by: a non-blocking, close-on-exec stream socket connected to
 * ss within the deadline: the descriptor, or -errno.
 */
int rpc_wait_fd(int fd, short events, uint64_t deadline);
int rpc_connect_by(const struct sockaddr_storage *ss, socklen_t len,
		   uint64_t deadline);


#endif /* PC_RPC_CLIENT_H */
