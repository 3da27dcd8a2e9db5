/*
 * modules/transport_tcp.c — the TCP data transport (module "transport"):
 * the serving side and the module's lifecycle.
 *
 * Owns: the data-port listeners (one per reactor, SO_REUSEPORT), this
 * node's region table (struct tp_regs, transport.c) and one transport
 * client per reactor (transport_tcp_client.c). Threading: regions are
 * registered from any thread (the table locks); each server connection and
 * each client channel lives on one reactor.
 *
 * Wire: transport_wire.h and docs/protocol.md "Data port". Requests on a
 * connection are answered in order, so many can be in flight. A READ is
 * served only when [addr, addr+len) lies inside a region registered under
 * rkey and the region's pin hook accepts it; the payload is sent straight
 * from the region (a reference in the send queue, no copy in user space)
 * and unpinned when the kernel is done with it. A WRITE is checked the same
 * way, and needs a region registered writable; its payload is copied from
 * the receive buffers into the region as it arrives (refused writes are
 * read and dropped, so the stream stays in step) and answered once all of
 * it landed. With cluster_secret set, a connection must pass the same
 * challenge-response as the RPC port (common/auth.h) before any READ or
 * WRITE; without one, a connection is accepted only from a loopback socket
 * of the node's user, root or socket_group (rpc/peercred.h), and closed at
 * once otherwise. Server connections are guarded like the RPC port's (see
 * "Connection guards" below): one challenge and one response before
 * authentication, small pre-auth buffers, a handshake deadline, caps on
 * unproven and on all connections with eviction of the oldest unproven one,
 * an idle timeout and a node-wide byte budget.
 */
#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/copy.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/auth.h"
#include "common/unproven.h"
#include "modules/modules.h"
#include "modules/transport.h"
#include "modules/transport_mixed.h"
#include "modules/transport_rdma.h"
#include "modules/transport_tcp.h"
#include "modules/transport_wire.h"
#include "modules/spread.h"
#include "reactor/group.h"
#include "rpc/peercred.h"

#define LOG_MOD "transport"
/* This node's instance of the transport: its regions. */
struct tp_node {
	struct tp_regs regs;
};

static struct {
	struct pc_ctx *ctx;
	struct tp_node node;
	struct svc_transport svc;  /* published: ops, clients, node */
	struct rx_listener **l;  /* per reactor */
	struct pc_spread spread; /* which reactor serves a new connection */
	char (*labels)[24];      /* per reactor: reactor="i" (kept by metrics) */
	uint16_t port;
	char *secret;
	struct rpc_local_rule local; /* who may read without a secret */
	struct tp_tcpc_cfg ccfg;     /* what the clients need */
	met_id served, served_bytes, refused, written, written_bytes;
	met_id narrowed;
	/* data-port connection guards (server side) */
	struct d_rstate *rs;      /* per reactor */
	struct pc_unproven *unproven; /* per reactor: rs[]'s unproven list */
	uint32_t n_all, n_preauth; /* atomic: live connections */
	uint32_t max_all, max_preauth;
	uint64_t handshake_ns, idle_ns;
	struct rx_budget budget;
	met_id conns_open, conns_refused, conns_evicted, conns_timed_out;
	met_id conns_moved;
	met_id preauth_violations;
	/* with an RDMA device: RDMA beside TCP (transport_mixed.h) */
	struct tp_node *rdma, *mixed;
	struct tp_client **tcpc, **rdmac; /* per reactor */
	char rail_labels[TP_RDMA_RAILS_MAX][96]; /* metrics keep pointers */
	unsigned threads;
} g;

/* ------------------------------------------------------------------ regions */

static int tcp_reg_region(struct tp_node *tn, const struct tp_region *region,
			  uint32_t *key)
{
	return tp_regs_add(&tn->regs, region, key);
}

static int tcp_dereg_region(struct tp_node *tn, uint32_t key)
{
	return tp_regs_remove(&tn->regs, key);
}

/* ------------------------------------------------------------------- server */

/*
 * Connection guards (the data port's share of issue 10). Every connection
 * starts unproven: it must authenticate (secret set) or, without a secret,
 * send a first well-formed request within rpc_handshake_timeout. Unproven
 * connections count against data_max_preauth_connections, all of them
 * against data_max_connections (both node-wide, atomics); when a cap is
 * full, the oldest unproven connection of the serving reactor older than
 * D_EVICT_GRACE_MS is dropped for the newcomer; when that reactor has none,
 * the newcomer is handed once to the reactor holding the most unproven
 * connections, one of them past the grace (common/unproven.h), which drops
 * one or refuses it. Before authentication a connection may send one
 * AUTH_CHALLENGE
 * and one AUTH_RESPONSE, nothing else, with a few hundred bytes of input and
 * 4 KiB of output. A proven connection without traffic or queued output for
 * rpc_idle_timeout is closed. Input and copied output of all connections
 * share one rx_budget (data_max_buffered_bytes); page payloads are
 * references into the pool and are not counted. Each reactor keeps its
 * connections on two lists (all, unproven; oldest first) walked by one
 * sweep timer.
 */
#define D_EVICT_GRACE_MS 100
#define D_PREAUTH_IN_MAX 256
#define D_PREAUTH_OUT_MAX 4096

enum { DL_ALL, DL_YOUNG, DL__COUNT };

struct dconn;
struct dlink {
	struct dconn *prev, *next;
	bool on;
};
struct dlist {
	struct dconn *head, *tail;
};

struct dconn {
	struct rx_conn *c;
	struct d_rstate *rs;
	bool authed;       /* may READ */
	bool challenged;   /* sent its one AUTH_CHALLENGE */
	bool nonce_issued;
	bool counted;      /* holds a data_max_connections slot */
	bool preauth;      /* holds a data_max_preauth_connections slot */
	uint64_t accepted_ns, last_act_ns;
	struct dlink link[DL__COUNT];
	char peer[64];
	/* The WRITE whose payload is arriving (wleft > 0). */
	uint64_t wid;
	uint8_t *wdst;      /* NULL: refused, the payload is dropped */
	uint64_t wleft;
	int wstatus;
	struct tp_hold whold;
	uint8_t nonce[PC_AUTH_NONCE_BYTES];
};

/* One per reactor, touched only on its thread (but conns, which accepts on
 * other reactors read to balance). */
struct d_rstate {
	struct rx_timer sweep;
	struct dlist list[DL__COUNT];
	uint32_t conns;   /* atomic: connections admitted here, not closed */
	uint32_t nyoung;  /* on list[DL_YOUNG] */
};

static void dl_add(struct dlist *l, struct dconn *d, int k)
{
	struct dlink *n = &d->link[k];
	n->prev = l->tail;
	n->next = NULL;
	if (l->tail)
		l->tail->link[k].next = d;
	else
		l->head = d;
	l->tail = d;
	n->on = true;
}

static void dl_del(struct dlist *l, struct dconn *d, int k)
{
	struct dlink *n = &d->link[k];
	if (!n->on)
		return;
	if (n->prev)
		n->prev->link[k].next = n->next;
	else
		l->head = n->next;
	if (n->next)
		n->next->link[k].prev = n->prev;
	else
		l->tail = n->prev;
	n->prev = n->next = NULL;
	n->on = false;
}

/* Publish rs's unproven connections for the other reactors. */
static void d_young_publish(struct d_rstate *rs)
{
	const struct dconn *h = rs->list[DL_YOUNG].head;
	pc_unproven_set(&g.unproven[rs - g.rs], rs->nyoung,
			h ? h->accepted_ns + RX_MS(D_EVICT_GRACE_MS) : 0);
}

/* Leave the unproven class (authenticated, first request, or closing). */
static void d_prove(struct dconn *d)
{
	if (d->link[DL_YOUNG].on) {
		dl_del(&d->rs->list[DL_YOUNG], d, DL_YOUNG);
		d->rs->nyoung--;
		d_young_publish(d->rs);
	}
	if (d->preauth) {
		d->preauth = false;
		__atomic_sub_fetch(&g.n_preauth, 1, __ATOMIC_RELAXED);
	}
}

/* Give back every slot (at close, or at once when dropped, so the slot is
 * free before the connection's teardown completes). */
static void d_uncount(struct dconn *d)
{
	d_prove(d);
	dl_del(&d->rs->list[DL_ALL], d, DL_ALL);
	if (d->counted) {
		d->counted = false;
		__atomic_sub_fetch(&d->rs->conns, 1, __ATOMIC_RELAXED);
		__atomic_sub_fetch(&g.n_all, 1, __ATOMIC_RELAXED);
		met_gauge_add(g.conns_open, -1);
	}
}

enum d_why { D_EVICTED, D_HANDSHAKE, D_IDLE, D__WHY };
static const char *const d_why_text[D__WHY] = {
	[D_EVICTED] = "dropped while unproven to admit a new connection",
	[D_HANDSHAKE] = "not authenticated (or no request) within "
			"rpc_handshake_timeout",
	[D_IDLE] = "idle for rpc_idle_timeout",
};
/* One log limiter per reason, so a flood of one kind never hides another. */
static struct pc_ratelimit d_why_rl[D__WHY];

static void d_drop(struct dconn *d, enum d_why why)
{
	met_inc(why == D_EVICTED ? g.conns_evicted : g.conns_timed_out);
	uint64_t n = pc_ratelimit_pass(&d_why_rl[why], 10000);
	if (n > 1)
		PC_LOGI(LOG_MOD, "data connection from %s: %s; closing (+%llu "
			"similar suppressed)", d->peer, d_why_text[why],
			(unsigned long long)(n - 1));
	else if (n == 1)
		PC_LOGI(LOG_MOD, "data connection from %s: %s; closing",
			d->peer, d_why_text[why]);
	d_uncount(d);
	rx_conn_close(d->c, RX_CLOSE_NOW,
		      why == D_EVICTED ? -ECONNABORTED : -ETIMEDOUT);
}

/* Drop the oldest unproven connection of rs older than the grace period.
 * false: none to drop. */
static bool d_evict(struct d_rstate *rs)
{
	struct dconn *v = rs->list[DL_YOUNG].head;
	if (!v || v->accepted_ns + RX_MS(D_EVICT_GRACE_MS) > pc_now_ns())
		return false;
	d_drop(v, D_EVICTED);
	return true;
}

/* Take a slot of counter *n (cap max), dropping an unproven connection of
 * this reactor when full. */
static bool d_take(struct d_rstate *rs, uint32_t *n, uint32_t max)
{
	if (__atomic_add_fetch(n, 1, __ATOMIC_RELAXED) <= max || d_evict(rs))
		return true;
	__atomic_sub_fetch(n, 1, __ATOMIC_RELAXED);
	return false;
}

/* Admit d, dropping an unproven connection of this reactor for it when a
 * cap is full: NULL, or the setting of the cap that refused it (nothing
 * logged or counted). */
static const char *d_admit(struct dconn *d)
{
	if (!d_take(d->rs, &g.n_all, g.max_all))
		return "data_max_connections";
	if (!d_take(d->rs, &g.n_preauth, g.max_preauth)) {
		__atomic_sub_fetch(&g.n_all, 1, __ATOMIC_RELAXED);
		return "data_max_preauth_connections";
	}
	d->counted = d->preauth = true;
	__atomic_add_fetch(&d->rs->conns, 1, __ATOMIC_RELAXED);
	met_gauge_add(g.conns_open, 1);
	dl_add(&d->rs->list[DL_ALL], d, DL_ALL);
	dl_add(&d->rs->list[DL_YOUNG], d, DL_YOUNG);
	d->rs->nyoung++;
	d_young_publish(d->rs);
	return NULL;
}

/* Handshake deadlines (unproven list, oldest first) and idle proven
 * connections. */
static void d_sweep(struct rx_reactor *r, struct rx_timer *t)
{
	struct d_rstate *rs = t->arg;
	uint64_t now = pc_now_ns();
	(void)r;
	struct dconn *d;
	while ((d = rs->list[DL_YOUNG].head) &&
	       d->accepted_ns + g.handshake_ns <= now)
		d_drop(d, D_HANDSHAKE);
	if (!g.idle_ns)
		return;
	for (struct dconn *next, *v = rs->list[DL_ALL].head; v; v = next) {
		next = v->link[DL_ALL].next;
		if (!v->link[DL_YOUNG].on && v->last_act_ns + g.idle_ns <= now &&
		    rx_conn_out_bytes(v->c) == 0)
			d_drop(v, D_IDLE);
	}
}

static void d_set_full_limits(struct rx_conn *c)
{
	/* Payloads are references into the region, not copies: a queue of
	 * several large pages costs no memory, so allow a deep one. */
	rx_conn_set_limits(c, 64 * 1024, 16u << 20, 4u << 20,
			   (size_t)TP_IO_MAX + (16u << 20));
}

static void respond(struct dconn *d, uint64_t id, int status, const void *p,
		    uint64_t len)
{
	struct tp_resp r = {status, id, len};
	uint8_t w[TP_RESP_BYTES];
	tp_wire_resp_encode(&r, w);
	rx_conn_write(d->c, w, sizeof(w));
	if (len && p)
		rx_conn_write(d->c, p, len);
}

/* The holds of reads being sent, given back to their reactor thread's
 * free list when the last byte has left: one allocation per page served
 * only until a reactor has served that many at once. */
#define HOLDS_KEEP 1024u

struct served {
	struct tp_hold h; /* first: release_served's arg */
	struct served *next;
};

static _Thread_local struct {
	struct served *free;
	unsigned n;
	bool closed; /* the reactor's transport exited: free, keep nothing */
} t_holds;

static struct tp_hold *hold_new(void)
{
	struct served *s = t_holds.free;
	if (s) {
		t_holds.free = s->next;
		t_holds.n--;
		return &s->h;
	}
	s = malloc(sizeof(*s));
	return s ? &s->h : NULL;
}

static void hold_free(struct tp_hold *h)
{
	struct served *s = (struct served *)h;
	if (t_holds.closed || t_holds.n >= HOLDS_KEEP) {
		free(s);
		return;
	}
	s->next = t_holds.free;
	t_holds.free = s;
	t_holds.n++;
}

static void holds_drop(void)
{
	while (t_holds.free) {
		struct served *s = t_holds.free;
		t_holds.free = s->next;
		free(s);
	}
	t_holds.n = 0;
	t_holds.closed = true;
}

static void release_served(void *arg)
{
	struct tp_hold *h = arg;
	tp_regs_release(h);
	hold_free(h);
}

static void refused(const char *what, const struct tp_req *q, int err)
{
	met_inc(g.refused);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refused a %s of %u bytes at 0x%llx "
		  "(rkey %u): %s", what, q->len, (unsigned long long)q->addr,
		  q->rkey, strerror(-err));
}

/* A READ, or a READ_SEL (sel: its selector): the range, or the region's
 * selection of it, sent from the region's memory (the hold ends when the
 * last byte has left). */
static void serve_read(struct dconn *d, const struct tp_req *q,
		       const uint8_t *sel)
{
	struct tp_hold *h = hold_new();
	int ret = !h ? -ENOMEM
		  : q->len > TP_IO_MAX ? -EINVAL
		  : tp_regs_hold(&g.node.regs, q->rkey, q->addr, q->len,
				 TP_ACCESS_READ, h);
	struct tp_piece pc[TP_SEL_PIECES] = {
		{(uintptr_t)q->addr, q->len}};
	unsigned n = 1;
	int selected = 0;
	if (ret == 0 && sel) {
		selected = tp_regs_select(h, q->addr, q->len, sel, pc, &n);
		if (selected == 0) {
			pc[0] = (struct tp_piece){(uintptr_t)q->addr, q->len};
			n = 1;
		} else if (selected < 0) {
			tp_regs_release(h);
			ret = selected;
		}
	}
	if (ret < 0) {
		if (h)
			hold_free(h);
		refused("read", q, ret);
		respond(d, q->id, ret, NULL, 0);
		return;
	}
	uint64_t total = 0;
	unsigned kept = 0;
	for (unsigned i = 0; i < n; i++)
		if (pc[i].len) { /* the hold ends with the last piece sent */
			pc[kept++] = pc[i];
			total += pc[i].len;
		}
	n = kept;
	respond(d, q->id, selected > 0 ? TP_STATUS_SELECTED : 0, NULL, total);
	/* The pieces go by reference; the hold ends with the last one. A
	 * piece that could not be queued would leave the stream short of
	 * what the header promised: close. */
	int wr = 0;
	for (unsigned i = 0; i < n; i++) {
		bool last = i + 1 == n;
		int r = rx_conn_write_ref(d->c, (const void *)pc[i].addr,
					  pc[i].len, last ? release_served : NULL,
					  last ? h : NULL);
		if (r < 0 && !wr)
			wr = r;
	}
	if (n == 0)
		release_served(h);
	if (wr < 0)
		rx_conn_close(d->c, RX_CLOSE_NOW, wr);
	met_inc(g.served);
	met_add(g.served_bytes, total);
	if (selected > 0)
		met_inc(g.narrowed);
}

/* A WRITE's header: pin its target, then take the payload as it comes. */
static void serve_write(struct dconn *d, const struct tp_req *q)
{
	int ret = tp_regs_hold(&g.node.regs, q->rkey, q->addr, q->len,
			       TP_ACCESS_WRITE, &d->whold);
	if (ret < 0)
		refused("write", q, ret);
	d->wid = q->id;
	d->wleft = q->len;
	d->wstatus = ret;
	d->wdst = ret < 0 ? NULL : (uint8_t *)(uintptr_t)q->addr;
}

/* Payload bytes of the current WRITE: used bytes; answered when complete. */
static size_t write_payload(struct dconn *d, const uint8_t *p, size_t avail)
{
	size_t n = (size_t)PC_MIN((uint64_t)avail, d->wleft);
	if (d->wdst) {
		pc_copy(d->wdst, p, n);
		d->wdst += n;
	}
	d->wleft -= n;
	if (d->wleft == 0) {
		if (d->wstatus == 0) {
			tp_regs_release(&d->whold);
			met_inc(g.written);
		}
		d->wdst = NULL;
		respond(d, d->wid, d->wstatus, NULL, 0);
	}
	if (d->wstatus == 0)
		met_add(g.written_bytes, n);
	return n;
}

/* Before authentication: anything but one AUTH_CHALLENGE followed by one
 * AUTH_RESPONSE closes the connection, counted and logged. */
static ssize_t preauth_violation(struct dconn *d, const char *what)
{
	met_inc(g.preauth_violations);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "data connection from %s sent %s "
		  "before authenticating; closing", d->peer, what);
	return -EPROTO;
}

static ssize_t serve_challenge(struct dconn *d, uint64_t id)
{
	if (!g.secret) {
		respond(d, id, -EOPNOTSUPP, NULL, 0);
		return TP_REQ_BYTES;
	}
	if (d->authed)
		return -EPROTO;
	if (d->challenged)
		return preauth_violation(d, "a second AUTH_CHALLENGE");
	d->challenged = true;
	if (pc_random_bytes(d->nonce, sizeof(d->nonce))) {
		respond(d, id, -EOPNOTSUPP, NULL, 0);
		return TP_REQ_BYTES;
	}
	d->nonce_issued = true;
	respond(d, id, 0, d->nonce, sizeof(d->nonce));
	return TP_REQ_BYTES;
}

static ssize_t serve_response(struct dconn *d, const uint8_t *p, size_t avail,
			      uint64_t id, uint32_t len)
{
	if (d->authed)
		return -EPROTO;
	if (!d->nonce_issued)
		return preauth_violation(d, "AUTH_RESPONSE without a challenge");
	if (len != PC_AUTH_PROOF_BYTES + PC_AUTH_NONCE_BYTES)
		return preauth_violation(d, "a malformed AUTH_RESPONSE");
	if (avail < TP_REQ_BYTES + len)
		return 0;
	const uint8_t *proof = p + TP_REQ_BYTES;
	const uint8_t *cnonce = proof + PC_AUTH_PROOF_BYTES;
	d->nonce_issued = false;
	if (!pc_auth_check(g.secret, d->nonce, cnonce, false, proof)) {
		met_inc(g.refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "data connection from %s "
			  "failed authentication; closing", d->peer);
		respond(d, id, -EACCES, NULL, 0);
		rx_conn_close(d->c, RX_CLOSE_FLUSH, -EACCES);
		return (ssize_t)avail;
	}
	d->authed = true;
	d_prove(d);
	d_set_full_limits(d->c);
	uint8_t mine[PC_AUTH_PROOF_BYTES];
	pc_auth_proof(g.secret, d->nonce, cnonce, true, mine);
	respond(d, id, 0, mine, sizeof(mine));
	return (ssize_t)(TP_REQ_BYTES + len);
}

/* Returns bytes used by this request, 0 when more bytes are needed, or a
 * negative errno to close. */
static ssize_t serve_one(struct dconn *d, const uint8_t *p, size_t avail)
{
	struct tp_req q;
	ssize_t n = tp_wire_req_decode(p, avail, &q);
	if (n <= 0) {
		if (n < 0) {
			met_inc(g.refused);
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a data-port client "
				  "sent something that is not a data "
				  "request; closing");
		}
		return n;
	}
	/* Without a secret the first well-formed request proves the
	 * connection (its owner was checked at accept). */
	if (d->authed)
		d_prove(d);
	if (q.op == TP_OP_READ || q.op == TP_OP_WRITE ||
	    q.op == TP_OP_READ_SEL) {
		if (q.op == TP_OP_READ_SEL && avail < TP_REQ_BYTES + TP_SEL_BYTES)
			return 0;
		if (!d->authed) {
			met_inc(g.refused);
			respond(d, q.id, -EACCES, NULL, 0);
			rx_conn_close(d->c, RX_CLOSE_FLUSH, -EACCES);
			return (ssize_t)avail;
		}
		if (q.op == TP_OP_WRITE) {
			serve_write(d, &q);
			return TP_REQ_BYTES;
		}
		bool sel = q.op == TP_OP_READ_SEL;
		serve_read(d, &q, sel ? p + TP_REQ_BYTES : NULL);
		return TP_REQ_BYTES + (sel ? TP_SEL_BYTES : 0);
	}
	if (q.op == TP_OP_AUTH_CHALLENGE)
		return serve_challenge(d, q.id);
	if (q.op == TP_OP_AUTH_RESPONSE)
		return serve_response(d, p, avail, q.id, q.len);
	if (!d->authed)
		return preauth_violation(d, "an unknown op");
	met_inc(g.refused);
	return -EPROTO;
}

static ssize_t d_data(struct rx_conn *c, const uint8_t *data, size_t len)
{
	struct dconn *d = rx_conn_udata(c);
	size_t used = 0;
	d->last_act_ns = pc_now_ns();
	while (used < len && !rx_conn_closing(c)) {
		if (d->wleft) { /* a WRITE's payload comes first */
			used += write_payload(d, data + used, len - used);
			continue;
		}
		ssize_t n = serve_one(d, data + used, len - used);
		if (n < 0)
			return n;
		if (n == 0)
			break;
		used += (size_t)n;
	}
	return (ssize_t)used;
}

static void d_close(struct rx_conn *c, int err)
{
	struct dconn *d = rx_conn_udata(c);
	(void)err;
	if (d->wleft && d->wstatus == 0) /* a write cut short */
		tp_regs_release(&d->whold);
	d_uncount(d);
	free(d);
}

static const struct rx_conn_ops d_ops = {.on_data = d_data,
					 .on_close = d_close};

/* Without a secret, only the node's user, root and socket_group may read
 * (rpc/peercred.h); everyone else is closed at once, counted and logged. */
static bool tcp_peer_allowed(int fd)
{
	char who[32];
	int ret = rpc_tcp_peer_check(&g.local, fd, who, sizeof(who));
	if (ret == 0)
		return true;
	met_inc(g.refused);
	PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing a data connection from %s: "
		  "%s", who, ret == -EACCES ? "not the node's user, root, or "
		  "the group in socket_group" : strerror(-ret));
	return false;
}

static void d_accept_on(struct rx_reactor *r, int fd, bool may_move);

/* On the reactor a newcomer was handed to (d_move); counted here, before
 * the client can have an answer. */
static void d_move_run(struct rx_reactor *r, void *arg)
{
	int fd = (int)(intptr_t)arg;
	met_inc(g.conns_moved);
	if (rx_reactor_stopping(r)) {
		met_inc(g.conns_refused);
		close(fd);
		return;
	}
	d_accept_on(r, fd, false);
}

/* Hand fd, which reactor here cannot admit, to the reactor that can drop
 * an unproven connection for it: true when on its way. */
static bool d_move(unsigned here, int fd, const char *peer)
{
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	int to = grp ? pc_unproven_pick(g.unproven, g.threads, here,
					pc_now_ns())
		     : -1;
	if (to < 0 || rx_group_post(grp, (unsigned)to, d_move_run,
				    (void *)(intptr_t)fd) < 0)
		return false;
	PC_LOGD(LOG_MOD, "data connection from %s: handed to r%d, which holds "
		"unproven connections to drop for it", peer, to);
	return true;
}

/* Serve the accepted fd on reactor r. */
static void d_accept(struct rx_reactor *r, int fd)
{
	d_accept_on(r, fd, true);
}

/* may_move: a newcomer this reactor cannot admit may go to another one
 * (once: the one it goes to admits it or refuses it). */
static void d_accept_on(struct rx_reactor *r, int fd, bool may_move)
{
	if (!g.secret && !tcp_peer_allowed(fd)) {
		close(fd);
		return;
	}
	struct dconn *d = calloc(1, sizeof(*d));
	if (!d) {
		close(fd);
		return;
	}
	d->authed = !g.secret;
	d->rs = &g.rs[rx_reactor_id(r)];
	d->accepted_ns = d->last_act_ns = pc_now_ns();
	rpc_tcp_peer_name(fd, d->peer, sizeof(d->peer), NULL);
	const char *cap = d_admit(d);
	if (cap) {
		if (!may_move || !d_move(rx_reactor_id(r), fd, d->peer)) {
			met_inc(g.conns_refused);
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing a data "
				  "connection from %s: %s is reached and no "
				  "unproven connection is old enough to drop",
				  d->peer, cap);
			close(fd);
		}
		free(d);
		return;
	}
	int err;
	d->c = rx_conn_attach(r, fd, &d_ops, d, &err);
	if (!d->c) {
		d_uncount(d);
		free(d);
		return;
	}
	rx_conn_set_budget(d->c, &g.budget);
	if (d->authed)
		d_set_full_limits(d->c);
	else /* one challenge and one response in, their replies out */
		rx_conn_set_limits(d->c, D_PREAUTH_IN_MAX, D_PREAUTH_OUT_MAX,
				   D_PREAUTH_OUT_MAX / 2, D_PREAUTH_OUT_MAX);
}

/* Connections reactor i serves (modules/spread.h: the kernel's
 * SO_REUSEPORT hash often leaves a peer's few readers on one reactor). */
static uint64_t d_load(unsigned i)
{
	return __atomic_load_n(&g.rs[i].conns, __ATOMIC_RELAXED);
}

static void on_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	pc_spread_accept(&g.spread, g.ctx, rx_listener_reactor(l), fd);
}

/* ---------------------------------------------------------------- lifecycle */

static double paired_count(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.spread.paired, __ATOMIC_RELAXED);
}

static double budget_in_used(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.budget.in_used, __ATOMIC_RELAXED);
}

static double budget_out_used(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.budget.out_used, __ATOMIC_RELAXED);
}

static double reactor_conns(void *arg)
{
	return (double)d_load((unsigned)(uintptr_t)arg);
}

static int server_guards_init(const struct pc_settings *s, unsigned threads)
{
	g.rs = calloc(threads, sizeof(*g.rs));
	g.unproven = pc_unproven_new(threads);
	g.labels = calloc(threads, sizeof(*g.labels));
	if (!g.rs || !g.unproven || !g.labels)
		return -ENOMEM;
	for (unsigned i = 0; i < threads; i++) {
		snprintf(g.labels[i], sizeof(*g.labels), "reactor=\"%u\"", i);
		if (met_register_fn("peercache_transport_reactor_connections",
				    "data-port connections each reactor "
				    "serves", g.labels[i], reactor_conns,
				    (void *)(uintptr_t)i) < 0)
			return -ENOMEM;
	}
	g.max_all = (uint32_t)s->data_max_connections;
	g.max_preauth = (uint32_t)s->data_max_preauth_connections;
	g.handshake_ns = RX_MS(s->rpc_handshake_timeout_ms);
	g.idle_ns = RX_MS(s->rpc_idle_timeout_ms);
	g.budget.in_max = s->data_max_buffered_bytes;
	g.budget.out_max = s->data_max_buffered_bytes;
	g.conns_open = met_register(MET_GAUGE,
				    "peercache_transport_connections",
				    "data-port connections open (served)", NULL);
	g.conns_refused = met_register(MET_COUNTER,
		"peercache_transport_connections_refused_total",
		"data connections refused at accept over data_max_connections "
		"or data_max_preauth_connections", NULL);
	g.conns_evicted = met_register(MET_COUNTER,
		"peercache_transport_connections_evicted_total",
		"unproven data connections dropped to admit a new one", NULL);
	g.conns_moved = met_register(MET_COUNTER,
		"peercache_transport_connections_moved_total",
		"new data connections handed to the reactor that could drop "
		"an unproven connection for them", NULL);
	g.conns_timed_out = met_register(MET_COUNTER,
		"peercache_transport_connections_timed_out_total",
		"data connections closed by the handshake or idle deadline",
		NULL);
	g.preauth_violations = met_register(MET_COUNTER,
		"peercache_transport_preauth_violations_total",
		"data connections closed for sending more than one challenge "
		"and one response before authenticating", NULL);
	if (met_register_fn("peercache_transport_buffered_in_bytes",
			    "input held by data connections "
			    "(data_max_buffered_bytes)", NULL, budget_in_used,
			    NULL) < 0 ||
	    met_register_fn("peercache_transport_buffered_out_bytes",
			    "copied reply bytes queued on data connections "
			    "(data_max_buffered_bytes)", NULL, budget_out_used,
			    NULL) < 0)
		return -ENOMEM;
	return 0;
}

static const struct tp_ops tcp_ops = {
	.name = "tcp",
	.reg_region = tcp_reg_region,
	.dereg_region = tcp_dereg_region,
	.read_batch = tp_tcpc_read_batch,
	.write_batch = tp_tcpc_write_batch,
	.cancel = tp_tcpc_cancel,
	.peer_open = tp_tcpc_peer_open,
	.peer_health = tp_tcpc_peer_health,
	.peer_close = tp_tcpc_peer_close,
	.fail_node = tp_tcpc_fail_node,
};

/* The verbs behind protocol = auto | rdma: the real libraries, or what a
 * test put there (tp_tcp_set_verbs). */
static const struct rv_api *verbs = &rv_real;

void tp_tcp_set_verbs(const struct rv_api *api)
{
	verbs = api ? api : &rv_real;
}

/* The RDMA counters (struct tp_rdma_stats) as metrics, read when scraped. */
#define RM(f, name, help) {offsetof(struct tp_rdma_stats, f), name, help}
static const struct {
	size_t off;
	const char *name, *help;
} rdma_metrics[] = {
	RM(chans_opened, "peercache_rdma_channels_opened_total",
	   "RDMA channels (RC queue pairs) opened to peers"),
	RM(chans_failed, "peercache_rdma_channels_failed_total",
	   "RDMA channels that did not connect (refused, no route, timeout)"),
	RM(chans_torn_down, "peercache_rdma_channels_closed_total",
	   "RDMA channels closed (errors, timeouts, cancels, peers gone)"),
	RM(reads, "peercache_rdma_reads_total", "RDMA READs completed"),
	RM(read_bytes, "peercache_rdma_read_bytes_total", "bytes read by RDMA"),
	RM(writes, "peercache_rdma_writes_total", "RDMA WRITEs completed"),
	RM(write_bytes, "peercache_rdma_write_bytes_total",
	   "bytes written by RDMA"),
	RM(wc_errors, "peercache_rdma_wc_errors_total",
	   "RDMA completions with an error status"),
	RM(retried, "peercache_rdma_retried_total",
	   "RDMA operations posted again after their channel failed"),
	RM(post_failures, "peercache_rdma_post_failures_total",
	   "ibv_post_send calls that failed"),
	RM(timeouts, "peercache_rdma_batch_timeouts_total",
	   "RDMA batches that ran out of time"),
	RM(lazy_mrs, "peercache_rdma_lazy_mrs_total",
	   "memory registered for one batch (outside registered regions)"),
	RM(accepted, "peercache_rdma_accepted_total",
	   "peers' RDMA connect requests accepted"),
	RM(refused, "peercache_rdma_refused_total",
	   "peers' RDMA connect requests refused (secret, protocol)"),
	RM(revokes, "peercache_rdma_revokes_total",
	   "times peers' RDMA access was taken back (new rkeys, queue pairs "
	   "closed) because a member left"),
	RM(async_events, "peercache_rdma_async_events_total",
	   "the RDMA device's asynchronous events (port changes, fatal "
	   "errors)"),
	RM(op_timeouts, "peercache_rdma_op_timeouts_total",
	   "RDMA operations not completed within rdma_op_timeout_ms (each "
	   "closed its channel)"),
};

static double rdma_metric(void *arg)
{
	struct tp_rdma_stats st;
	if (!g.rdma)
		return 0;
	tp_rdma_node_stats(g.rdma, &st);
	return (double)*(const uint64_t *)((const char *)&st +
					   (size_t)(uintptr_t)arg);
}

static double rdma_fallbacks(void *arg)
{
	(void)arg;
	uint64_t n = 0;
	for (unsigned i = 0; g.rdma && g.svc.clients && i < g.threads; i++)
		if (g.svc.clients[i] && g.rdmac[i])
			n += tp_mixed_client_fallbacks(g.svc.clients[i]);
	return (double)n;
}

/* RDMA beside TCP: the RDMA node and the mixed layer published instead of
 * plain TCP (the TCP server and clients run as without RDMA). */
static int rdma_init(const struct pc_settings *s, unsigned threads)
{
	struct tp_rdma_cfg cfg;
	tp_rdma_cfg_of(s, verbs, &cfg);
	int ret = tp_rdma_node_new(&cfg, &g.rdma);
	if (ret < 0)
		return ret;
	g.mixed = tp_mixed_node_new(&tp_rdma_ops, g.rdma, &g.node.regs);
	g.tcpc = calloc(threads, sizeof(*g.tcpc));
	g.rdmac = calloc(threads, sizeof(*g.rdmac));
	if (!g.mixed || !g.tcpc || !g.rdmac)
		return -ENOMEM;
	g.svc.ops = &tp_mixed_ops;
	g.svc.node = g.mixed;
	for (size_t i = 0; i < sizeof(rdma_metrics) / sizeof(rdma_metrics[0]);
	     i++)
		met_register_counter_fn(rdma_metrics[i].name,
					rdma_metrics[i].help, NULL, rdma_metric,
					(void *)(uintptr_t)rdma_metrics[i].off);
	met_register_counter_fn("peercache_rdma_tcp_fallbacks_total",
				"operations sent over TCP because their peer "
				"has no RDMA", NULL, rdma_fallbacks, NULL);
	for (unsigned k = 0; k < tp_rdma_node_rails(g.rdma); k++) {
		char dev[64];
		met_escape_label(tp_rdma_node_rail_name(g.rdma, k), dev,
				 sizeof(dev));
		snprintf(g.rail_labels[k], sizeof(g.rail_labels[k]),
			 "rail=\"%u\",device=\"%s\"", k, dev);
		met_register_counter_fn(
			"peercache_rdma_rail_bytes_total",
			"bytes this node's RDMA reads and writes moved through "
			"each rail (device_names; a batch is striped over the "
			"rails both nodes have)", g.rail_labels[k], rdma_metric,
			(void *)(uintptr_t)(offsetof(struct tp_rdma_stats,
						     rail_bytes) +
					    k * sizeof(uint64_t)));
	}
	return 0;
}

static void rdma_undo(void)
{
	tp_mixed_node_free(g.mixed);
	tp_rdma_node_free(g.rdma);
	free(g.tcpc);
	free(g.rdmac);
	g.mixed = g.rdma = NULL;
	g.tcpc = g.rdmac = NULL;
	g.svc.ops = &tcp_ops;
	g.svc.node = &g.node;
}

/* This reactor's RDMA and mixed clients over its TCP client tc; reactor 0
 * also accepts RDMA peers on the data port's number. */
static int rdma_start(struct rx_reactor *r, unsigned id, struct tp_client *tc,
		      const char *host, const char *advertised)
{
	int err = 0;
	g.tcpc[id] = tc;
	g.rdmac[id] = tp_rdma_client_new(g.rdma, r, &err);
	if (!g.rdmac[id])
		return err;
	g.svc.clients[id] = tp_mixed_client_new(r, &tp_rdma_ops, g.rdmac[id],
						&tcp_ops, tc);
	if (!g.svc.clients[id])
		return -ENOMEM;
	if (id != 0)
		return 0;
	uint16_t bound;
	err = tp_rdma_node_listen(g.rdma, r, host, g.port, advertised, &bound);
	if (err < 0 && g.ctx->cfg->protocol == PC_PROTO_AUTO) {
		/* e.g. bind is not an address of the RDMA device: this node
		 * still reads over RDMA; peers read it over TCP (they fall
		 * back when their RDMA connect finds no listener). */
		PC_LOGW(LOG_MOD, "protocol=auto: no RDMA listener on %s:%u "
			"(%s); peers read this node over TCP", host, g.port,
			strerror(-err));
		return 0;
	}
	if (err < 0)
		PC_LOGE(LOG_MOD, "RDMA listener on %s:%u: %s", host, g.port,
			strerror(-err));
	return err;
}

static int t_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	tp_regs_init(&g.node.regs);
	g.ccfg.max_chans = (unsigned)s->max_channels_per_peer;
	g.ccfg.connect_timeout_ms = (unsigned)PC_MIN(s->rpc_timeout_ms, 5000);
	if (*s->cluster_secret && !(g.secret = strdup(s->cluster_secret)))
		return -ENOMEM;
	g.ccfg.secret = g.secret;
	/* An unknown socket_group (-2) is refused by the rpc_server module. */
	rpc_local_rule_init(&g.local, rpc_group_id(s->socket_group));
	g.threads = ctx->threads; /* the per-reactor arrays below, and the
				   * hand-over's choice (d_move) */
	g.l = calloc(ctx->threads, sizeof(*g.l));
	g.svc.clients = calloc(ctx->threads, sizeof(*g.svc.clients));
	if (!g.l || !g.svc.clients)
		return -ENOMEM;
	int proto = tp_select(s, verbs);
	if (proto < 0)
		return proto;
	g.svc.ops = &tcp_ops;
	g.svc.node = &g.node;
	if (proto == PC_PROTO_RDMA) {
		int ret = rdma_init(s, ctx->threads);
		if (ret < 0 && s->protocol == PC_PROTO_RDMA)
			return ret;
		if (ret < 0) {
			PC_LOGW(LOG_MOD, "protocol=auto: the RDMA device could "
				"not be used (%s); data moves over TCP",
				strerror(-ret));
			rdma_undo();
		}
	}
	int ret = svc_publish_transport(ctx, "transport", &g.svc);
	if (ret < 0)
		return ret;
	tp_tcpc_metrics(&g.ccfg);
	g.served = met_register(MET_COUNTER, "peercache_transport_served_total",
				"reads served to peers", NULL);
	g.served_bytes = met_register(MET_COUNTER,
				      "peercache_transport_served_bytes_total",
				      "bytes served to peers", NULL);
	g.narrowed = met_register(MET_COUNTER,
				  "peercache_transport_reads_narrowed_total",
				  "selected reads served as the region's "
				  "selection (a slot, not its bucket)", NULL);
	g.written = met_register(MET_COUNTER,
				 "peercache_transport_writes_served_total",
				 "writes of peers into this node's regions",
				 NULL);
	g.written_bytes = met_register(MET_COUNTER,
		"peercache_transport_written_bytes_total",
		"bytes peers wrote into this node's regions", NULL);
	g.refused = met_register(MET_COUNTER,
				 "peercache_transport_refused_total",
				 "data requests refused (range, rkey, access, "
				 "auth)", NULL);
	/* A client's data connection joins its RPC connection's reactor
	 * (modules/spread.h, "Pairing"). */
	if (pc_spread_init(&g.spread, ctx, PC_SPREAD_FOLLOW, d_load,
			   d_accept) < 0)
		return -ENOMEM;
	met_register_counter_fn("peercache_transport_paired_connections_total",
				"data-port connections served on the reactor "
				"of their client's RPC connection", NULL,
				paired_count, NULL);
	return server_guards_init(s, ctx->threads);
}

static int t_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	unsigned id = rx_reactor_id(r);
	t_holds.closed = false; /* this thread serves reads now */
	struct tp_client *tc = tp_tcpc_new(r, &g.ccfg);
	if (!tc)
		return -ENOMEM;
	g.svc.clients[id] = tc;
	struct d_rstate *rs = &g.rs[id];
	rx_timer_init(&rs->sweep, d_sweep, rs);
	/* Often enough that a deadline is met within a quarter of it. */
	uint64_t every = PC_MAX(RX_MS(10), PC_MIN(RX_MS(1000),
						  g.handshake_ns / 4));
	int ret = rx_timer_start(r, &rs->sweep, every, every);
	if (ret < 0)
		return ret;
	uint16_t port = id == 0 ? (uint16_t)s->data_port : g.port;
	int err;
	g.l[id] = rx_listen_tcp(r, s->bind, port, true, 1024, on_accept, NULL,
				&err);
	if (!g.l[id])
		return err;
	char addr[300];
	if (id == 0) {
		g.port = rx_listener_port(g.l[0]);
		snprintf(addr, sizeof(addr), "%s:%u", s->bind, g.port);
		pc_ctx_publish(ctx, "data", addr);
	}
	if (g.rdma)
		return rdma_start(r, id, tc, s->bind, id == 0 ? addr : NULL);
	return 0;
}

static void t_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	unsigned id = rx_reactor_id(r);
	if (g.rs)
		rx_timer_stop(r, &g.rs[id].sweep);
	if (g.l && g.l[id]) {
		rx_listener_close(g.l[id]);
		g.l[id] = NULL;
	}
	if (g.rdmac && g.rdmac[id])
		tp_rdma_client_stop(g.rdmac[id]);
	if (g.rdma && id == 0)
		tp_rdma_node_unlisten(g.rdma);
}

static void t_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	holds_drop();
	if (g.rdma && g.svc.clients && g.svc.clients[id]) {
		tp_mixed_client_free(g.svc.clients[id]);
		g.svc.clients[id] = g.tcpc[id];
	}
	if (g.rdmac && g.rdmac[id]) {
		tp_rdma_client_free(g.rdmac[id]);
		g.rdmac[id] = NULL;
	}
	if (g.svc.clients && g.svc.clients[id]) {
		tp_tcpc_free(g.svc.clients[id]);
		g.svc.clients[id] = NULL;
	}
}

static void t_fini(struct pc_ctx *ctx)
{
	if (g.svc.node && (g.svc.node == &g.node || g.svc.node == g.mixed)) {
		svc_withdraw_transport(ctx);
		/* RDMA's MRs go first; the TCP table then runs the regions'
		 * released hooks. */
		rdma_undo();
		tp_regs_fini(&g.node.regs);
		g.svc.node = NULL;
		g.svc.ops = NULL;
	}
	free(g.l);
	pc_spread_fini(&g.spread);
	free(g.rs);
	free(g.unproven);
	free(g.labels);
	free(g.svc.clients);
	g.svc.clients = NULL;
	if (g.secret) {
		explicit_bzero(g.secret, strlen(g.secret));
		free(g.secret);
	}
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_transport = {
	.name = "transport",
	.init = t_init,
	.start = t_start,
	.stop = t_stop,
	.exit = t_exit,
	.fini = t_fini,
};
