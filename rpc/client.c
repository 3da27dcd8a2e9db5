/*
 * rpc/client.c — the asynchronous MessagePack-RPC client (see client.h).
 *
 * Owns: struct rpc_client (one per reactor), its endpoints, their
 * connections (struct rpc_cconn) and calls (struct rpc_req). Thread: the
 * reactor's only.
 *
 * A call's msgid is (16-bit sequence << 16) | slot: the slot indexes the
 * connection's in-flight table, the sequence tells a late reply for a
 * recycled slot from the live one. Every call has a timer: its timeout, or a
 * zero-delay completion when it fails before reaching the network — so the
 * callback never runs inside rpc_req_send.
 *
 * Shutdown: when the reactor stops, it closes the client's connections at
 * once (outgoing connections are not flushed), so every call on them fails
 * with -ESHUTDOWN, and so do the calls waiting for a connection and every
 * call sent afterwards; the reactor runs those zero-delay completions
 * before its loop ends. Every done() thus runs within shutdown_grace.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <netdb.h>

#include "common/log.h"
#include "rpc/auth.h"
#include "rpc/client.h"
#include "rpc/msg.h"

#define LOG_MOD "rpc-client"
#define DEFAULT_TIMEOUT_MS 5000

enum cc_state { CC_CONNECTING, CC_AUTH, CC_READY, CC_RETIRED };

struct rpc_ep;

struct rpc_cconn {
	struct rpc_ep *ep;
	struct rx_conn *c;            /* NULL once closed */
	enum cc_state state;
	struct rpc_req **slots;       /* in-flight calls by slot */
	uint32_t inflight;
	uint32_t next_slot;
	uint16_t seq;
	size_t need;
	struct mp_scan_state *scan;   /* a partial message's scan so far */
	uint8_t snonce[RPC_NONCE_BYTES];
	uint8_t cnonce[RPC_NONCE_BYTES];
	struct rpc_cconn *next;
};

struct rpc_ep {
	struct rpc_client *cl;
	char name[128];
	struct sockaddr_storage addr;
	socklen_t addrlen;
	int resolve_err;
	struct rpc_cconn *conns;
	unsigned nconns;
	struct rpc_req *wait_head, *wait_tail; /* waiting for a connection */
	uint64_t backoff_until_ns;
	unsigned backoff_ms;
	int last_err;
	struct rpc_ep *next;
};

struct rpc_req {
	struct rpc_client *cl;
	struct rpc_ep *ep;
	struct rpc_cconn *cc;
	uint32_t msgid;
	char *method;
	uint32_t nparams;
	struct pc_wbuf params;
	msgpack_packer pk;
	struct rx_timer timer;
	unsigned timeout_ms;
	int fail_err;                 /* set: complete with this error */
	bool internal;                /* auth exchange of a connection */
	rpc_done_fn done;
	void *arg;
	struct rpc_req *next;         /* wait queue, or the failing list */
	struct rpc_req *prev;         /* the failing list */
};

struct rpc_client {
	struct rx_reactor *r;
	struct rpc_client_opts o;
	struct mp_limits mpl;
	char *secret;
	struct rpc_ep *eps;
	struct rpc_req *failing;      /* failed, done() not yet run */
	bool freeing;                 /* rpc_client_free runs */
	struct rpc_client_stats st;
};

void rpc_client_opts_default(struct rpc_client_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->conns_per_endpoint = 2;
	o->inflight_per_conn = 1024;
	o->connect_timeout_ms = 1000;
	o->backoff_min_ms = 50;
	o->backoff_max_ms = 5000;
	o->max_message_bytes = 64u << 20;
	o->max_elements = 1u << 20;
	o->max_depth = 32;
}

/* ------------------------------------------------------------- results */

/* ----------------------------------------------------------------- calls */

static void req_free(struct rpc_req *q)
{
	rx_timer_stop(q->cl->r, &q->timer);
	pc_wbuf_free(&q->params);
	free(q->method);
	free(q);
}

static void req_complete(struct rpc_req *q, const struct rpc_result *res)
{
	rx_timer_stop(q->cl->r, &q->timer);
	q->done(q->arg, res);
	req_free(q);
}

static void req_fail_now(struct rpc_req *q, int err)
{
	struct rpc_result res;
	memset(&res, 0, sizeof(res));
	res.err = err;
	req_complete(q, &res);
}

static void cc_retire(struct rpc_cconn *cc);
static void ep_pump(struct rpc_ep *ep);

static void failing_unlink(struct rpc_req *q)
{
	if (q->prev)
		q->prev->next = q->next;
	else
		q->cl->failing = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->next = q->prev = NULL;
}

static void req_timer_fired(struct rx_reactor *r, struct rx_timer *t)
{
	struct rpc_req *q = t->arg;
	(void)r;
	if (q->fail_err) { /* failed: done() runs now */
		failing_unlink(q);
		req_fail_now(q, q->fail_err);
		return;
	}
	struct rpc_cconn *cc = q->cc;
	if (q->internal) {
		cc->slots[q->msgid & 0xffffu] = NULL;
		cc->inflight--;
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: no answer to "
			  "authentication", cc->ep->name);
		rx_conn_close(cc->c, RX_CLOSE_NOW, -ETIMEDOUT);
		req_free(q);
		return;
	}
	q->cl->st.timeouts++;
	if (cc) {
		cc->slots[q->msgid & 0xffffu] = NULL;
		cc->inflight--;
		/* No reply in time: this connection is suspect. */
		cc_retire(cc);
	} else {
		/* Still waiting for a connection: unlink from the queue. */
		struct rpc_ep *ep = q->ep;
		struct rpc_req **pp = &ep->wait_head, *prev = NULL;
		while (*pp && *pp != q) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		if (*pp) {
			*pp = q->next;
			if (ep->wait_tail == q)
				ep->wait_tail = prev;
		}
	}
	req_fail_now(q, -ETIMEDOUT);
}

/* Fail asynchronously: the callback must not run inside rpc_req_send.
 * Until it runs, q is on the client's failing list (rpc_client_free
 * completes what is left there once the loop has ended). */
static void req_fail_later(struct rpc_req *q, int err)
{
	q->fail_err = err;
	q->cc = NULL;
	rx_timer_start(q->cl->r, &q->timer, 0, 0); /* zero delay: never fails */
	q->prev = NULL;
	q->next = q->cl->failing;
	if (q->next)
		q->next->prev = q;
	q->cl->failing = q;
}

struct rpc_req *rpc_req_new(struct rpc_client *cl, const char *endpoint,
			    const char *method, uint32_t nparams,
			    unsigned timeout_ms, rpc_done_fn done, void *arg)
{
	struct rpc_req *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->cl = cl;
	q->method = strdup(method);
	q->nparams = nparams;
	q->timeout_ms = timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS;
	q->done = done;
	q->arg = arg;
	pc_wbuf_init(&q->params, cl->o.max_message_bytes);
	pc_wbuf_packer(&q->params, &q->pk);
	rx_timer_init(&q->timer, req_timer_fired, q);
	/* Endpoint: found or created (resolved once). */
	struct rpc_ep *ep;
	for (ep = cl->eps; ep; ep = ep->next)
		if (strcmp(ep->name, endpoint) == 0)
			break;
	if (!ep && (ep = calloc(1, sizeof(*ep)))) {
		ep->cl = cl;
		snprintf(ep->name, sizeof(ep->name), "%s", endpoint);
		ep->resolve_err = pc_endpoint_parse(endpoint, &ep->addr,
						     &ep->addrlen);
		ep->next = cl->eps;
		cl->eps = ep;
	}
	q->ep = ep;
	if (!q->method || !ep) {
		pc_wbuf_free(&q->params);
		free(q->method);
		free(q);
		return NULL;
	}
	return q;
}

msgpack_packer *rpc_req_packer(struct rpc_req *q)
{
	return &q->pk;
}

/* Put q on cc: envelope + params into the connection's output. */
static void cc_send(struct rpc_cconn *cc, struct rpc_req *q)
{
	uint32_t cap = cc->ep->cl->o.inflight_per_conn;
	uint32_t slot = cc->next_slot;
	while (cc->slots[slot])
		slot = (slot + 1) % cap;
	cc->next_slot = (slot + 1) % cap;
	q->msgid = ((uint32_t)cc->seq++ << 16) | slot;
	q->cc = cc;
	cc->slots[slot] = q;
	cc->inflight++;
	struct pc_wbuf head;
	msgpack_packer pk;
	pc_wbuf_init(&head, 0);
	pc_wbuf_packer(&head, &pk);
	rpc_pack_request(&pk, q->msgid, q->method, q->nparams);
	if (head.failed || rx_conn_write(cc->c, head.data, head.len) < 0 ||
	    rx_conn_write(cc->c, q->params.data, q->params.len) < 0) {
		pc_wbuf_free(&head);
		rx_conn_close(cc->c, RX_CLOSE_NOW, -ENOMEM);
		return; /* on_close fails q with the others */
	}
	pc_wbuf_free(&head);
	/* The auth exchange is bounded by the connect timeout. */
	unsigned ms = q->internal ? cc->ep->cl->o.connect_timeout_ms
				  : q->timeout_ms;
	rx_timer_start(cc->ep->cl->r, &q->timer, RX_MS(ms), 0);
}

/* ----------------------------------------------------------- connections */

/* A retired connection closes once its last call has ended. */
static void cc_close_if_idle(struct rpc_cconn *cc)
{
	if (cc->state == CC_RETIRED && cc->inflight == 0 && cc->c)
		rx_conn_close(cc->c, RX_CLOSE_NOW, 0);
}

static void cc_remove(struct rpc_cconn *cc)
{
	struct rpc_ep *ep = cc->ep;
	struct rpc_cconn **pp = &ep->conns;
	while (*pp && *pp != cc)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = cc->next;
		ep->nconns--;
	}
}

static void cc_retire(struct rpc_cconn *cc)
{
	cc->state = CC_RETIRED;
	cc_close_if_idle(cc);
}

static void ep_fail_waiting(struct rpc_ep *ep, int err)
{
	while (ep->wait_head) {
		struct rpc_req *q = ep->wait_head;
		ep->wait_head = q->next;
		req_fail_later(q, err);
	}
	ep->wait_tail = NULL;
}

static void auth_send_challenge(struct rpc_cconn *cc);

static void cc_on_connect(struct rx_conn *c)
{
	struct rpc_cconn *cc = rx_conn_udata(c);
	if (cc->ep->cl->secret) {
		cc->state = CC_AUTH;
		auth_send_challenge(cc);
		return;
	}
	cc->state = CC_READY;
	cc->ep->backoff_ms = 0;
	ep_pump(cc->ep);
}

static void cc_on_close(struct rx_conn *c, int err)
{
	struct rpc_cconn *cc = rx_conn_udata(c);
	if (!cc)
		return; /* detached by rpc_client_free */
	struct rpc_ep *ep = cc->ep;
	struct rpc_client *cl = ep->cl;
	bool never_ready = cc->state == CC_CONNECTING || cc->state == CC_AUTH;
	int fail = err ? err : -ECONNRESET;
	cc->c = NULL;
	cc_remove(cc);
	cl->st.conns_open--;
	for (uint32_t i = 0; i < cl->o.inflight_per_conn; i++) {
		struct rpc_req *q = cc->slots[i];
		if (!q)
			continue;
		cc->slots[i] = NULL;
		cc->inflight--;
		if (q->internal)
			req_free(q);
		else
			req_fail_later(q, fail);
	}
	if (fail == -ESHUTDOWN) {
		/* This node stops: not the endpoint's fault, no backoff. */
		ep_fail_waiting(ep, fail);
	} else if (never_ready) {
		cl->st.conn_failures++;
		ep->last_err = cc->state == CC_AUTH && err == 0 ? -EACCES : fail;
		unsigned b = ep->backoff_ms ? ep->backoff_ms * 2
					    : cl->o.backoff_min_ms;
		ep->backoff_ms = PC_MIN(b, cl->o.backoff_max_ms);
		ep->backoff_until_ns = rx_now_ns(cl->r) + RX_MS(ep->backoff_ms);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot reach %s (%s); retrying "
			  "after %u ms", ep->name, strerror(-ep->last_err),
			  ep->backoff_ms);
		ep_fail_waiting(ep, ep->last_err);
	} else if (err && err != -ESHUTDOWN) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "connection to %s lost: %s",
			  ep->name, strerror(-err));
	}
	free(cc->slots);
	free(cc->scan);
	free(cc);
	ep_pump(ep);
}

static void cc_on_response(struct rpc_cconn *cc, const struct rpc_msg *m)
{
	struct rpc_client *cl = cc->ep->cl;
	uint32_t slot = m->msgid & 0xffffu;
	struct rpc_req *q = slot < cl->o.inflight_per_conn ? cc->slots[slot]
							   : NULL;
	if (!q || q->msgid != m->msgid) {
		cl->st.late_replies++;
		return;
	}
	cc->slots[slot] = NULL;
	cc->inflight--;
	struct rpc_result res;
	rpc_result_from_response(m, &res);
	req_complete(q, &res);
	cc_close_if_idle(cc);
}

static ssize_t cc_on_data(struct rx_conn *c, const uint8_t *data, size_t len)
{
	struct rpc_cconn *cc = rx_conn_udata(c);
	struct rpc_client *cl = cc->ep->cl;
	if (len < cc->need)
		return 0;
	size_t used = 0;
	while (used < len) {
		size_t size;
		int ret = mp_scan_held(&cc->scan, data + used, len - used,
				       &cl->mpl, &size);
		if (ret == MP_NEED_MORE) {
			cc->need = size;
			break;
		}
		cc->need = 0;
		if (ret < 0)
			return -EPROTO;
		struct rpc_msg m;
		const char *why;
		ret = rpc_msg_parse(data + used, size, &m, &why);
		used += size;
		if (ret < 0 && ret != -EINVAL)
			return -EPROTO;
		if (ret == 0 && m.type == RPC_RESPONSE)
			cc_on_response(cc, &m);
		/* Notifications from the server are not used yet: ignored. */
		if (!cc->c || rx_conn_closing(c))
			break;
	}
	return (ssize_t)used;
}

static const struct rx_conn_ops cc_ops = {
	.on_data = cc_on_data,
	.on_connect = cc_on_connect,
	.on_close = cc_on_close,
};

static struct rpc_cconn *cc_open(struct rpc_ep *ep)
{
	struct rpc_client *cl = ep->cl;
	struct rpc_cconn *cc = calloc(1, sizeof(*cc));
	if (!cc)
		return NULL;
	cc->slots = calloc(cl->o.inflight_per_conn, sizeof(*cc->slots));
	if (!cc->slots) {
		free(cc);
		return NULL;
	}
	cc->ep = ep;
	cc->state = CC_CONNECTING;
	int err;
	cc->c = rx_conn_connect(cl->r, (struct sockaddr *)&ep->addr,
				ep->addrlen, cl->o.connect_timeout_ms, &cc_ops,
				cc, &err);
	if (!cc->c) {
		free(cc->slots);
		free(cc);
		ep->last_err = err;
		return NULL;
	}
	rx_conn_set_limits(cc->c, cl->o.max_message_bytes + 65536, 0, 0, 0);
	cc->next = ep->conns;
	ep->conns = cc;
	ep->nconns++;
	cl->st.conns_open++;
	return cc;
}

/* Move waiting calls onto ready connections; open one if allowed. */
static void ep_pump(struct rpc_ep *ep)
{
	struct rpc_client *cl = ep->cl;
	while (ep->wait_head) {
		struct rpc_cconn *best = NULL;
		bool opening = false;
		for (struct rpc_cconn *cc = ep->conns; cc; cc = cc->next) {
			if (cc->state == CC_CONNECTING || cc->state == CC_AUTH)
				opening = true;
			if (cc->state == CC_READY &&
			    cc->inflight < cl->o.inflight_per_conn &&
			    (!best || cc->inflight < best->inflight))
				best = cc;
		}
		bool can_open = ep->nconns < cl->o.conns_per_endpoint &&
				rx_now_ns(cl->r) >= ep->backoff_until_ns;
		if (!best) {
			if (opening)
				return; /* calls go once it is ready */
			if (can_open) {
				if (cc_open(ep))
					return;
				ep_fail_waiting(ep, ep->last_err ? ep->last_err
								 : -ENOMEM);
			} else if (ep->nconns == 0) {
				ep_fail_waiting(ep, ep->last_err
							    ? ep->last_err
							    : -ECONNREFUSED);
			}
			/* Otherwise every connection is full or retiring:
			 * calls wait for a slot (their timeouts bound it). */
			return;
		}
		/* Busy already: grow toward conns_per_endpoint meanwhile. */
		if (best->inflight > 0 && can_open && !opening)
			cc_open(ep);
		struct rpc_req *q = ep->wait_head;
		ep->wait_head = q->next;
		if (!ep->wait_head)
			ep->wait_tail = NULL;
		q->next = NULL;
		rx_timer_stop(cl->r, &q->timer);
		cc_send(best, q);
	}
}

void rpc_req_send(struct rpc_req *q)
{
	struct rpc_client *cl = q->cl;
	struct rpc_ep *ep = q->ep;
	cl->st.calls++;
	/* No answer could be read now. */
	if (cl->freeing || rx_reactor_stopping(cl->r)) {
		req_fail_later(q, -ESHUTDOWN);
		return;
	}
	if (ep->resolve_err) {
		req_fail_later(q, ep->resolve_err);
		return;
	}
	if (q->params.failed) {
		req_fail_later(q, -EMSGSIZE);
		return;
	}
	if (ep->nconns == 0 && rx_now_ns(cl->r) < ep->backoff_until_ns) {
		req_fail_later(q, ep->last_err ? ep->last_err : -ECONNREFUSED);
		return;
	}
	/* The timeout covers waiting for a connection too. */
	rx_timer_start(cl->r, &q->timer, RX_MS(q->timeout_ms), 0);
	if (ep->wait_tail)
		ep->wait_tail->next = q;
	else
		ep->wait_head = q;
	ep->wait_tail = q;
	ep_pump(ep);
}

void rpc_client_fail_endpoint(struct rpc_client *cl, const char *endpoint,
			      int err)
{
	for (struct rpc_ep *ep = cl->eps; ep; ep = ep->next) {
		if (strcmp(ep->name, endpoint) != 0)
			continue;
		ep_fail_waiting(ep, err);
		/* The close is deferred: on_close fails the calls in flight. */
		for (struct rpc_cconn *cc = ep->conns; cc; cc = cc->next)
			if (cc->c)
				rx_conn_close(cc->c, RX_CLOSE_NOW, err);
		return;
	}
}

/* ------------------------------------------------------------ auth exchange */

static void auth_on_response(void *arg, const struct rpc_result *res);

static void auth_on_challenge(void *arg, const struct rpc_result *res)
{
	struct rpc_cconn *cc = arg;
	if (res->err || rpc_auth_read_challenge(res->result, cc->snonce) < 0 ||
	    pc_random_bytes(cc->cnonce, sizeof(cc->cnonce)) < 0) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: authentication refused "
			  "(%s)", cc->ep->name, res->err ? res->message
							  : "bad challenge");
		rx_conn_close(cc->c, RX_CLOSE_NOW, -EACCES);
		return;
	}
	struct rpc_req *q = rpc_req_new(cc->ep->cl, cc->ep->name,
					"auth.response", 2, 0,
					auth_on_response, cc);
	if (!q) {
		rx_conn_close(cc->c, RX_CLOSE_NOW, -ENOMEM);
		return;
	}
	q->internal = true;
	rpc_auth_pack_response(&q->pk, cc->ep->cl->secret, cc->snonce,
			       cc->cnonce);
	cc_send(cc, q);
}

static void auth_on_response(void *arg, const struct rpc_result *res)
{
	struct rpc_cconn *cc = arg;
	if (res->err || !rpc_auth_check_server(res->result, cc->ep->cl->secret,
					       cc->snonce, cc->cnonce)) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: authentication failed "
			  "(%s)", cc->ep->name, res->err ? res->message
			  : "the node could not prove the cluster secret");
		rx_conn_close(cc->c, RX_CLOSE_NOW, -EACCES);
		return;
	}
	cc->state = CC_READY;
	cc->ep->backoff_ms = 0;
	ep_pump(cc->ep);
}

static void auth_send_challenge(struct rpc_cconn *cc)
{
	struct rpc_req *q = rpc_req_new(cc->ep->cl, cc->ep->name,
					"auth.challenge", 0, 0,
					auth_on_challenge, cc);
	if (!q) {
		rx_conn_close(cc->c, RX_CLOSE_NOW, -ENOMEM);
		return;
	}
	q->internal = true;
	cc_send(cc, q);
}

/* --------------------------------------------------------------- lifecycle */

struct rpc_client *rpc_client_new(struct rx_reactor *r,
				  const struct rpc_client_opts *o)
{
	struct rpc_client *cl = calloc(1, sizeof(*cl));
	if (!cl)
		return NULL;
	cl->r = r;
	cl->o = *o;
	if (cl->o.inflight_per_conn == 0 || cl->o.inflight_per_conn > 65536)
		cl->o.inflight_per_conn = 1024;
	if (cl->o.conns_per_endpoint == 0)
		cl->o.conns_per_endpoint = 1;
	cl->mpl.max_bytes = o->max_message_bytes;
	cl->mpl.max_elements = o->max_elements;
	cl->mpl.max_depth = o->max_depth;
	cl->mpl.max_objects = (uint32_t)PC_MIN(o->max_message_bytes,
					       (size_t)UINT32_MAX);
	if (o->secret && *o->secret && !(cl->secret = strdup(o->secret))) {
		free(cl);
		return NULL;
	}
	return cl;
}

/* rpc_client_free: fail ep's calls with -ESHUTDOWN, detach and free its
 * connections. */
static void ep_free_calls(struct rpc_ep *ep)
{
	struct rpc_client *cl = ep->cl;
	while (ep->wait_head) {
		struct rpc_req *q = ep->wait_head;
		ep->wait_head = q->next;
		req_fail_now(q, -ESHUTDOWN);
	}
	while (ep->conns) {
		struct rpc_cconn *cc = ep->conns;
		ep->conns = cc->next;
		for (uint32_t i = 0; i < cl->o.inflight_per_conn; i++) {
			struct rpc_req *q = cc->slots[i];
			if (!q)
				continue;
			if (q->internal)
				req_free(q);
			else
				req_fail_now(q, -ESHUTDOWN);
		}
		/* Detach: the connection closes without us. */
		if (cc->c) {
			rx_conn_set_udata(cc->c, NULL);
			rx_conn_close(cc->c, RX_CLOSE_NOW, -ESHUTDOWN);
		}
		free(cc->slots);
		free(cc);
	}
}

void rpc_client_free(struct rpc_client *cl)
{
	if (!cl)
		return;
	/* A done() run here may send more calls (they fail at once), even to
	 * a new endpoint: repeat until none is left. */
	cl->freeing = true;
	while (cl->eps || cl->failing) {
		while (cl->eps) {
			struct rpc_ep *ep = cl->eps;
			ep_free_calls(ep);
			struct rpc_ep **pp = &cl->eps; /* may have moved */
			while (*pp != ep)
				pp = &(*pp)->next;
			*pp = ep->next;
			free(ep);
		}
		/* Failed calls whose completion had not run yet. */
		while (cl->failing) {
			struct rpc_req *q = cl->failing;
			failing_unlink(q);
			req_fail_now(q, q->fail_err);
		}
	}
	if (cl->secret) {
		explicit_bzero(cl->secret, strlen(cl->secret));
		free(cl->secret);
	}
	free(cl);
}

void rpc_client_stats(const struct rpc_client *cl, struct rpc_client_stats *s)
{
	*s = cl->st;
}
