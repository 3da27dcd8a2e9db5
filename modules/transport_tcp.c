/*
 * modules/transport_tcp.c — the TCP data transport (module "transport").
 *
 * Owns: the data-port listeners (one per reactor, SO_REUSEPORT), the table
 * of regions peers may read, and one transport client per reactor with its
 * peers and channels. Threading: regions are registered in init (main);
 * each server connection and each client channel lives on one reactor.
 *
 * Wire (little-endian; docs/protocol.md "Data port"):
 *   request  32 B: magic "PCD1", op u16, flags u16, rkey u32, len u32,
 *                  addr u64, id u64 [+ len payload bytes for AUTH_RESPONSE]
 *   response 24 B: magic "PCR1", status i32 (0 or -errno), id u64, len u64
 *                  [+ len payload bytes]
 * Requests on a connection are answered in order, so many can be in flight.
 * A READ is served only when [addr, addr+len) lies inside a region registered
 * under rkey and the region's pin hook accepts it; the payload is sent
 * straight from the region (a reference in the send queue, no copy in user
 * space) and unpinned when the kernel is done with it. With cluster_secret
 * set, a connection must pass the same challenge-response as the RPC port
 * (rpc/auth.h) before any READ; without one, a connection is accepted only
 * from a loopback socket of the node's user, root or socket_group
 * (rpc/peercred.h), and closed at once otherwise. Server connections are
 * guarded like the RPC port's (see "Connection guards" below): one challenge
 * and one response before authentication, small pre-auth buffers, a
 * handshake deadline, caps on unproven and on all connections with eviction
 * of the oldest unproven one, an idle timeout and a node-wide byte budget.
 *
 * Client: a read batch is spread over up to max_channels_per_peer channels
 * per peer; a channel pipelines requests and receives each response header
 * and then the payload straight into the reader's destination
 * (rx_conn_read: no copy). A batch completes only when none of its reads can
 * still write into a destination (a timed-out channel is closed first).
 * fail_node closes every channel to a node that stopped answering (kv calls
 * it when the peer-health table marks the node suspect), so reads waiting
 * on them fail now rather than at their batches' timeouts. When the reactor
 * stops, it closes the channels at once: their reads fail with -ESHUTDOWN,
 * and so does every read of a batch started afterwards.
 */
#include <endian.h>
#include <errno.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "modules/transport.h"
#include "rpc/auth.h"
#include "rpc/client.h"
#include "rpc/peercred.h"

#define LOG_MOD "transport"
#define TP_MAGIC_REQ 0x31444350u  /* "PCD1" */
#define TP_MAGIC_RESP 0x31524350u /* "PCR1" */
#define TP_REGIONS_MAX 16
#define TP_READ_MAX (1u << 30)    /* one read at most 1 GiB */

enum tp_op { TP_OP_READ = 1, TP_OP_AUTH_CHALLENGE = 2, TP_OP_AUTH_RESPONSE = 3 };

struct tp_req_wire {
	uint32_t magic;
	uint16_t op;
	uint16_t flags;
	uint32_t rkey;
	uint32_t len;
	uint64_t addr;
	uint64_t id;
};
_Static_assert(sizeof(struct tp_req_wire) == 32, "data request is 32 bytes");

struct tp_resp_wire {
	uint32_t magic;
	int32_t status;
	uint64_t id;
	uint64_t len;
};
_Static_assert(sizeof(struct tp_resp_wire) == 24, "data response is 24 bytes");

static struct {
	struct pc_ctx *ctx;
	struct svc_transport svc;  /* published: ops, clients, register */
	struct tp_region regions[TP_REGIONS_MAX];
	unsigned nregions;
	struct rx_listener **l;  /* per reactor */
	uint16_t port;
	char *secret;
	struct rpc_local_rule local; /* who may read without a secret */
	unsigned max_chans;
	unsigned connect_timeout_ms;
	met_id reads, read_bytes, read_errors, served, served_bytes, refused;
	met_id chans_open;
	/* data-port connection guards (server side) */
	struct d_rstate *rs;      /* per reactor */
	uint32_t n_all, n_preauth; /* atomic: live connections */
	uint32_t max_all, max_preauth;
	uint64_t handshake_ns, idle_ns;
	struct rx_budget budget;
	met_id conns_open, conns_refused, conns_evicted, conns_timed_out;
	met_id preauth_violations;
} g;

/* ------------------------------------------------------------------ regions */

static int tcp_register(const struct tp_region *region)
{
	if (g.nregions >= TP_REGIONS_MAX)
		return -ENOSPC;
	for (unsigned i = 0; i < g.nregions; i++)
		if (g.regions[i].rkey == region->rkey)
			return -EEXIST;
	g.regions[g.nregions++] = *region;
	return 0;
}

static const struct tp_region *find_region(uint32_t rkey, uint64_t addr,
					   uint64_t len)
{
	for (unsigned i = 0; i < g.nregions; i++) {
		const struct tp_region *r = &g.regions[i];
		if (r->rkey != rkey)
			continue;
		/* Overflow-safe: addr >= base and len <= what is left. */
		if (addr < r->base || addr - r->base > r->len ||
		    len > r->len - (addr - r->base))
			return NULL;
		return r;
	}
	return NULL;
}

/* ------------------------------------------------------------------- server */

/*
 * Connection guards (the data port's share of issue 10). Every connection
 * starts unproven: it must authenticate (secret set) or, without a secret,
 * send a first well-formed request within rpc_handshake_timeout. Unproven
 * connections count against data_max_preauth_connections, all of them
 * against data_max_connections (both node-wide, atomics); when a cap is
 * full, the oldest unproven connection of the accepting reactor older than
 * D_EVICT_GRACE_MS is dropped for the newcomer, else the newcomer is
 * refused. Before authentication a connection may send one AUTH_CHALLENGE
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
	uint8_t nonce[RPC_NONCE_BYTES];
};

/* One per reactor, touched only on its thread. */
struct d_rstate {
	struct rx_timer sweep;
	struct dlist list[DL__COUNT];
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

/* Leave the unproven class (authenticated, first request, or closing). */
static void d_prove(struct dconn *d)
{
	dl_del(&d->rs->list[DL_YOUNG], d, DL_YOUNG);
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

static bool d_admit(struct dconn *d)
{
	const char *cap = NULL;
	if (!d_take(d->rs, &g.n_all, g.max_all))
		cap = "data_max_connections";
	else if (!d_take(d->rs, &g.n_preauth, g.max_preauth)) {
		__atomic_sub_fetch(&g.n_all, 1, __ATOMIC_RELAXED);
		cap = "data_max_preauth_connections";
	}
	if (cap) {
		met_inc(g.conns_refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refusing a data connection "
			  "from %s: %s is reached and no unproven connection "
			  "is old enough to drop", d->peer, cap);
		return false;
	}
	d->counted = d->preauth = true;
	met_gauge_add(g.conns_open, 1);
	dl_add(&d->rs->list[DL_ALL], d, DL_ALL);
	dl_add(&d->rs->list[DL_YOUNG], d, DL_YOUNG);
	return true;
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
			   (size_t)TP_READ_MAX + (16u << 20));
}

struct served {
	const struct tp_region *region;
	struct tp_pin pin;
};

static void respond(struct dconn *d, uint64_t id, int status, const void *p,
		    uint64_t len)
{
	struct tp_resp_wire w = {htole32(TP_MAGIC_RESP), (int32_t)htole32((uint32_t)status),
				 htole64(id), htole64(len)};
	rx_conn_write(d->c, &w, sizeof(w));
	if (len && p)
		rx_conn_write(d->c, p, len);
}

static void release_served(void *arg)
{
	struct served *s = arg;
	s->region->unpin(s->region->ctx, &s->pin);
	free(s);
}

static void serve_read(struct dconn *d, const struct tp_req_wire *q)
{
	uint64_t addr = le64toh(q->addr), id = le64toh(q->id);
	uint32_t len = le32toh(q->len);
	const struct tp_region *reg = find_region(le32toh(q->rkey), addr, len);
	struct tp_pin pin;
	int ret = !reg ? -EFAULT
		  : len == 0 || len > TP_READ_MAX ? -EINVAL
		  : reg->pin(reg->ctx, (uintptr_t)addr, len, &pin);
	if (ret < 0) {
		met_inc(g.refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "refused a read of %u bytes at "
			  "0x%llx (rkey %u): %s", len, (unsigned long long)addr,
			  le32toh(q->rkey), strerror(-ret));
		respond(d, id, ret, NULL, 0);
		return;
	}
	struct served *s = malloc(sizeof(*s));
	if (!s) {
		reg->unpin(reg->ctx, &pin);
		respond(d, id, -ENOMEM, NULL, 0);
		return;
	}
	s->region = reg;
	s->pin = pin;
	respond(d, id, 0, NULL, len);
	rx_conn_write_ref(d->c, (const void *)(uintptr_t)addr, len,
			  release_served, s);
	met_inc(g.served);
	met_add(g.served_bytes, len);
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
		return sizeof(struct tp_req_wire);
	}
	if (d->authed)
		return -EPROTO;
	if (d->challenged)
		return preauth_violation(d, "a second AUTH_CHALLENGE");
	d->challenged = true;
	if (pc_random_bytes(d->nonce, sizeof(d->nonce))) {
		respond(d, id, -EOPNOTSUPP, NULL, 0);
		return sizeof(struct tp_req_wire);
	}
	d->nonce_issued = true;
	respond(d, id, 0, d->nonce, sizeof(d->nonce));
	return sizeof(struct tp_req_wire);
}

static ssize_t serve_response(struct dconn *d, const uint8_t *p, size_t avail,
			      uint64_t id, uint32_t len)
{
	if (d->authed)
		return -EPROTO;
	if (!d->nonce_issued)
		return preauth_violation(d, "AUTH_RESPONSE without a challenge");
	if (len != PC_SHA256_BYTES + RPC_NONCE_BYTES)
		return preauth_violation(d, "a malformed AUTH_RESPONSE");
	if (avail < sizeof(struct tp_req_wire) + len)
		return 0;
	const uint8_t *proof = p + sizeof(struct tp_req_wire);
	const uint8_t *cnonce = proof + PC_SHA256_BYTES;
	uint8_t want[PC_SHA256_BYTES];
	rpc_auth_proof(g.secret, d->nonce, cnonce, false, want);
	d->nonce_issued = false;
	if (!pc_ct_equal(want, proof, sizeof(want))) {
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
	rpc_auth_proof(g.secret, d->nonce, cnonce, true, want);
	respond(d, id, 0, want, sizeof(want));
	return (ssize_t)(sizeof(struct tp_req_wire) + len);
}

/* Returns bytes used by this request, 0 when more bytes are needed, or a
 * negative errno to close. */
static ssize_t serve_one(struct dconn *d, const uint8_t *p, size_t avail)
{
	struct tp_req_wire q;
	memcpy(&q, p, sizeof(q));
	if (le32toh(q.magic) != TP_MAGIC_REQ) {
		met_inc(g.refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a data-port client sent "
			  "something that is not a data request; closing");
		return -EPROTO;
	}
	uint16_t op = le16toh(q.op);
	uint64_t id = le64toh(q.id);
	/* Without a secret the first well-formed request proves the
	 * connection (its owner was checked at accept). */
	if (d->authed)
		d_prove(d);
	if (op == TP_OP_READ) {
		if (!d->authed) {
			met_inc(g.refused);
			respond(d, id, -EACCES, NULL, 0);
			rx_conn_close(d->c, RX_CLOSE_FLUSH, -EACCES);
			return (ssize_t)avail;
		}
		serve_read(d, &q);
		return sizeof(q);
	}
	if (op == TP_OP_AUTH_CHALLENGE)
		return serve_challenge(d, id);
	if (op == TP_OP_AUTH_RESPONSE)
		return serve_response(d, p, avail, id, le32toh(q.len));
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
	while (len - used >= sizeof(struct tp_req_wire) && !rx_conn_closing(c)) {
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

static void on_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	struct rx_reactor *r = rx_listener_reactor(l);
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
	if (!d_admit(d)) {
		free(d);
		close(fd);
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

/* ------------------------------------------------------------------- client */

struct tp_batch;

struct tp_pending {
	struct tp_read *rd;
	struct tp_batch *b;
	uint64_t id;
	struct tp_pending *next;
};

struct tp_batch {
	struct tp_client *tc;
	struct tp_read *reads;
	unsigned n;
	unsigned left;
	bool timed_out;
	tp_done_fn done;
	void *arg;
	struct rx_timer timer;
	struct tp_pending pend[];
};

enum chan_state { CH_CONNECTING, CH_AUTH, CH_READY, CH_DEAD };

struct tp_chan {
	struct tp_peer *peer;
	struct rx_conn *c;
	enum chan_state state;
	struct tp_pending *head, *tail;   /* in flight, in order */
	struct tp_pending *unsent;        /* first not yet sent */
	unsigned inflight;
	bool receiving;
	struct tp_resp_wire resp;
	uint8_t auth_buf[PC_SHA256_BYTES];
	uint8_t cnonce[RPC_NONCE_BYTES];
	uint8_t server_proof[PC_SHA256_BYTES];
	int auth_step;
	struct tp_chan *next;
};

struct tp_peer {
	char name[160];
	char node[160];              /* ring id, when a read named it */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	int resolve_err;
	struct tp_chan *chans;
	unsigned nchans;
	struct tp_peer *next;
};

struct tp_client {
	struct rx_reactor *r;
	struct tp_peer *peers;
	uint64_t next_id;
};

static void batch_finish(struct tp_batch *b)
{
	rx_timer_stop(b->tc->r, &b->timer);
	b->done(b->arg, b->reads, b->n);
	free(b);
}

static void pending_done(struct tp_pending *p, int res)
{
	struct tp_batch *b = p->b;
	p->rd->res = b->timed_out && res < 0 ? -ETIMEDOUT : res;
	if (res == 0) {
		met_inc(g.reads);
		met_add(g.read_bytes, p->rd->len);
	} else {
		met_inc(g.read_errors);
	}
	if (--b->left == 0)
		batch_finish(b);
}

static void chan_send(struct tp_chan *ch)
{
	for (struct tp_pending *p = ch->unsent; p; p = p->next) {
		struct tp_req_wire q = {
			htole32(TP_MAGIC_REQ), htole16(TP_OP_READ), 0,
			htole32(p->rd->rkey), htole32(p->rd->len),
			htole64(p->rd->addr), htole64(p->id)};
		rx_conn_write(ch->c, &q, sizeof(q));
	}
	ch->unsent = NULL;
}

static void chan_recv_next(struct tp_chan *ch);

static void chan_fail_all(struct tp_chan *ch, int err)
{
	while (ch->head) {
		struct tp_pending *p = ch->head;
		ch->head = p->next;
		ch->inflight--;
		pending_done(p, err);
	}
	ch->tail = ch->unsent = NULL;
}

static void got_payload(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	(void)c;
	ch->receiving = false;
	if (res < 0)
		return; /* the close fails everything in on_close */
	struct tp_pending *p = ch->head;
	ch->head = p->next;
	if (!ch->head)
		ch->tail = NULL;
	ch->inflight--;
	pending_done(p, 0);
	chan_recv_next(ch);
}

static void got_header(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	ch->receiving = false;
	if (res < 0)
		return;
	struct tp_pending *p = ch->head;
	int32_t status = (int32_t)le32toh((uint32_t)ch->resp.status);
	uint64_t len = le64toh(ch->resp.len);
	if (le32toh(ch->resp.magic) != TP_MAGIC_RESP || !p ||
	    le64toh(ch->resp.id) != p->id ||
	    (status == 0 && len != p->rd->len) || (status < 0 && len != 0)) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: bad data response; "
			  "closing the channel", ch->peer->name);
		rx_conn_close(c, RX_CLOSE_NOW, -EPROTO);
		return;
	}
	if (status < 0) {
		ch->head = p->next;
		if (!ch->head)
			ch->tail = NULL;
		ch->inflight--;
		pending_done(p, status);
		chan_recv_next(ch);
		return;
	}
	ch->receiving = true;
	/* Split reads: the leading hdr_len bytes to hdr, the rest to dst, in
	 * one receive. */
	int ret = p->rd->hdr_len
			  ? rx_conn_read2(c, p->rd->hdr, p->rd->hdr_len,
					  p->rd->dst, p->rd->len - p->rd->hdr_len,
					  got_payload, ch)
			  : rx_conn_read(c, p->rd->dst, p->rd->len, got_payload,
					 ch);
	if (ret < 0) {
		ch->receiving = false;
		rx_conn_close(c, RX_CLOSE_NOW, -EIO);
	}
}

static void chan_recv_next(struct tp_chan *ch)
{
	if (ch->receiving || !ch->head || ch->state != CH_READY || !ch->c)
		return;
	ch->receiving = true;
	if (rx_conn_read(ch->c, &ch->resp, sizeof(ch->resp), got_header,
			 ch) < 0) {
		ch->receiving = false;
		rx_conn_close(ch->c, RX_CLOSE_NOW, -EIO);
	}
}

static void chan_ready(struct tp_chan *ch)
{
	ch->state = CH_READY;
	chan_send(ch);
	chan_recv_next(ch);
}

/* Authentication on a channel: challenge, then response. */
static void auth_step(struct rx_conn *c, ssize_t res, void *arg);

static void auth_send(struct tp_chan *ch, uint16_t op, const void *payload,
		      uint32_t len)
{
	struct tp_req_wire q = {htole32(TP_MAGIC_REQ), htole16(op), 0, 0,
				htole32(len), 0, 0};
	rx_conn_write(ch->c, &q, sizeof(q));
	if (len)
		rx_conn_write(ch->c, payload, len);
	ch->receiving = true;
	if (rx_conn_read(ch->c, &ch->resp, sizeof(ch->resp), auth_step, ch) < 0)
		rx_conn_close(ch->c, RX_CLOSE_NOW, -EIO);
}

static void auth_step(struct rx_conn *c, ssize_t res, void *arg)
{
	struct tp_chan *ch = arg;
	ch->receiving = false;
	if (res < 0)
		return;
	bool header = res == (ssize_t)sizeof(ch->resp);
	if (header) {
		int32_t status = (int32_t)le32toh((uint32_t)ch->resp.status);
		if (le32toh(ch->resp.magic) != TP_MAGIC_RESP || status < 0 ||
		    le64toh(ch->resp.len) != PC_SHA256_BYTES) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: data-port "
				  "authentication refused", ch->peer->name);
			rx_conn_close(c, RX_CLOSE_NOW, -EACCES);
			return;
		}
		ch->receiving = true;
		if (rx_conn_read(c, ch->auth_buf, PC_SHA256_BYTES, auth_step,
				 ch) < 0)
			rx_conn_close(c, RX_CLOSE_NOW, -EIO);
		return;
	}
	if (ch->auth_step++ == 0) {
		/* auth_buf holds the node's nonce: answer it. */
		uint8_t msg[PC_SHA256_BYTES + RPC_NONCE_BYTES];
		uint8_t snonce[RPC_NONCE_BYTES];
		memcpy(snonce, ch->auth_buf, sizeof(snonce));
		if (pc_random_bytes(ch->cnonce, sizeof(ch->cnonce)) < 0) {
			rx_conn_close(c, RX_CLOSE_NOW, -EIO);
			return;
		}
		rpc_auth_proof(g.secret, snonce, ch->cnonce, false, msg);
		rpc_auth_proof(g.secret, snonce, ch->cnonce, true,
			       ch->server_proof); /* what the node must send */
		memcpy(msg + PC_SHA256_BYTES, ch->cnonce, sizeof(ch->cnonce));
		auth_send(ch, TP_OP_AUTH_RESPONSE, msg, sizeof(msg));
		return;
	}
	/* auth_buf holds the node's proof over (its nonce, ours). */
	if (!pc_ct_equal(ch->auth_buf, ch->server_proof, PC_SHA256_BYTES)) {
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: the node could not prove "
			  "the cluster secret", ch->peer->name);
		rx_conn_close(c, RX_CLOSE_NOW, -EACCES);
		return;
	}
	chan_ready(ch);
}

static void ch_on_connect(struct rx_conn *c)
{
	struct tp_chan *ch = rx_conn_udata(c);
	if (g.secret) {
		ch->state = CH_AUTH;
		auth_send(ch, TP_OP_AUTH_CHALLENGE, NULL, 0);
		return;
	}
	chan_ready(ch);
}

static void ch_on_close(struct rx_conn *c, int err)
{
	struct tp_chan *ch = rx_conn_udata(c);
	struct tp_peer *peer = ch->peer;
	if (err && err != -ESHUTDOWN)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "data channel to %s closed: %s",
			  peer->name, strerror(-err));
	ch->c = NULL;
	ch->state = CH_DEAD;
	met_gauge_add(g.chans_open, -1);
	struct tp_chan **pp = &peer->chans;
	while (*pp && *pp != ch)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = ch->next;
		peer->nchans--;
	}
	chan_fail_all(ch, err ? err : -ECONNRESET);
	free(ch);
}

static const struct rx_conn_ops ch_ops = {.on_connect = ch_on_connect,
					  .on_close = ch_on_close};

static struct tp_peer *peer_get(struct tp_client *tc, const char *name)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			return p;
	struct tp_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->resolve_err = rpc_endpoint_parse(name, &p->addr, &p->addrlen);
	p->next = tc->peers;
	tc->peers = p;
	return p;
}

static struct tp_chan *chan_open(struct tp_client *tc, struct tp_peer *peer)
{
	struct tp_chan *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->peer = peer;
	int err;
	ch->c = rx_conn_connect(tc->r, (struct sockaddr *)&peer->addr,
				peer->addrlen, g.connect_timeout_ms, &ch_ops, ch,
				&err);
	if (!ch->c) {
		free(ch);
		return NULL;
	}
	rx_conn_set_manual(ch->c);
	ch->next = peer->chans;
	peer->chans = ch;
	peer->nchans++;
	met_gauge_add(g.chans_open, 1);
	return ch;
}

/* The channel for the next read to peer: the least loaded, or a new one
 * while under the cap. */
static struct tp_chan *chan_pick(struct tp_client *tc, struct tp_peer *peer)
{
	struct tp_chan *best = NULL;
	for (struct tp_chan *ch = peer->chans; ch; ch = ch->next)
		if (ch->state != CH_DEAD &&
		    (!best || ch->inflight < best->inflight))
			best = ch;
	if ((!best || best->inflight > 0) && peer->nchans < g.max_chans) {
		struct tp_chan *ch = chan_open(tc, peer);
		if (ch)
			return ch;
	}
	return best;
}

static void batch_timeout(struct rx_reactor *r, struct rx_timer *t)
{
	struct tp_batch *b = t->arg;
	(void)r;
	if (b->left == 0) { /* finished before it started: deliver */
		batch_finish(b);
		return;
	}
	b->timed_out = true;
	/* Close every channel still holding a read of this batch; their
	 * reads end (cancelled) before the batch is reported. */
	for (struct tp_peer *p = b->tc->peers; p; p = p->next)
		for (struct tp_chan *ch = p->chans; ch; ch = ch->next)
			for (struct tp_pending *q = ch->head; q; q = q->next)
				if (q->b == b && ch->c) {
					rx_conn_close(ch->c, RX_CLOSE_NOW,
						      -ETIMEDOUT);
					break;
				}
}

static int tcp_read_batch(struct tp_client *tc, struct tp_read *reads,
			  unsigned n, unsigned timeout_ms, tp_done_fn done,
			  void *arg)
{
	if (n == 0)
		return -EINVAL;
	struct tp_batch *b = calloc(1, sizeof(*b) + n * sizeof(b->pend[0]));
	if (!b)
		return -ENOMEM;
	b->tc = tc;
	b->reads = reads;
	b->n = n;
	b->left = n;
	b->done = done;
	b->arg = arg;
	rx_timer_init(&b->timer, batch_timeout, b);
	unsigned failed = 0;
	for (unsigned i = 0; i < n; i++) {
		struct tp_pending *p = &b->pend[i];
		p->rd = &reads[i];
		p->b = b;
		p->id = ++tc->next_id;
		struct tp_peer *peer = peer_get(tc, reads[i].peer);
		struct tp_chan *ch = NULL;
		if (peer && reads[i].node && !peer->node[0])
			snprintf(peer->node, sizeof(peer->node), "%s",
				 reads[i].node);
		if (reads[i].len == 0 || reads[i].len > TP_READ_MAX ||
		    reads[i].hdr_len > reads[i].len ||
		    (reads[i].hdr_len && !reads[i].hdr))
			reads[i].res = -EINVAL;
		else if (!peer)
			reads[i].res = -ENOMEM;
		else if (peer->resolve_err)
			reads[i].res = peer->resolve_err;
		else if (rx_reactor_stopping(tc->r)) /* no new channel now */
			reads[i].res = -ESHUTDOWN;
		else if (!(ch = chan_pick(tc, peer)))
			reads[i].res = -ECONNREFUSED;
		if (!ch) {
			failed++;
			continue;
		}
		if (ch->tail)
			ch->tail->next = p;
		else
			ch->head = p;
		ch->tail = p;
		if (!ch->unsent)
			ch->unsent = p;
		ch->inflight++;
		if (ch->state == CH_READY) {
			chan_send(ch);
			chan_recv_next(ch);
		}
	}
	b->left -= failed;
	/* Deliver at once-failed batches from a timer, not from here. */
	rx_timer_start(tc->r, &b->timer, b->left ? RX_MS(timeout_ms) : 0, 0);
	return 0;
}

/* Close the channels to node's data endpoint; their reads fail with err
 * when the closes complete. */
static void tcp_fail_node(struct tp_client *tc, const char *node, int err)
{
	for (struct tp_peer *p = tc->peers; p; p = p->next)
		if (strcmp(p->node, node) == 0)
			for (struct tp_chan *ch = p->chans; ch; ch = ch->next)
				if (ch->c)
					rx_conn_close(ch->c, RX_CLOSE_NOW, err);
}

static const struct tp_ops tcp_ops = {
	.name = "tcp",
	.read_batch = tcp_read_batch,
	.fail_node = tcp_fail_node,
};

/* After the reactor drained: every channel has closed (and removed itself
 * from its peer) by now, so only the peers are left to free. */
static void client_free(struct tp_client *tc)
{
	while (tc->peers) {
		struct tp_peer *p = tc->peers;
		tc->peers = p->next;
		PC_ASSERT(p->chans == NULL);
		free(p);
	}
	free(tc);
}

/* ---------------------------------------------------------------- lifecycle */

/* protocol=auto: use RDMA when a device is up. This build has no RDMA data
 * path yet, so report what was found and use TCP. */
static void probe_rdma(const struct pc_settings *s)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	int n = 0;
	if (h) {
		void **(*get)(int *) = (void **(*)(int *))dlsym(
			h, "ibv_get_device_list");
		void (*put)(void **) = (void (*)(void **))dlsym(
			h, "ibv_free_device_list");
		void **list = get ? get(&n) : NULL;
		if (list && put)
			put(list);
		dlclose(h);
	}
	if (s->protocol == PC_PROTO_AUTO)
		PC_LOGI(LOG_MOD, "protocol=auto: %d RDMA device%s found; using "
			"TCP (the RDMA data path is not in this version)", n,
			n == 1 ? "" : "s");
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

static int server_guards_init(const struct pc_settings *s, unsigned threads)
{
	g.rs = calloc(threads, sizeof(*g.rs));
	if (!g.rs)
		return -ENOMEM;
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

static int t_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	g.max_chans = (unsigned)s->max_channels_per_peer;
	g.connect_timeout_ms = (unsigned)PC_MIN(s->rpc_timeout_ms, 5000);
	if (*s->cluster_secret && !(g.secret = strdup(s->cluster_secret)))
		return -ENOMEM;
	/* An unknown socket_group (-2) is refused by the rpc_server module. */
	rpc_local_rule_init(&g.local, rpc_group_id(s->socket_group));
	g.l = calloc(ctx->threads, sizeof(*g.l));
	g.svc.clients = calloc(ctx->threads, sizeof(*g.svc.clients));
	if (!g.l || !g.svc.clients)
		return -ENOMEM;
	g.svc.ops = &tcp_ops;
	g.svc.reg = tcp_register;
	int ret = svc_publish_transport(ctx, "transport", &g.svc);
	if (ret < 0)
		return ret;
	probe_rdma(s);
	g.reads = met_register(MET_COUNTER, "peercache_transport_reads_total",
			       "one-sided reads completed by this node", NULL);
	g.read_bytes = met_register(MET_COUNTER,
				    "peercache_transport_read_bytes_total",
				    "bytes read from peers", NULL);
	g.read_errors = met_register(MET_COUNTER,
				     "peercache_transport_read_errors_total",
				     "reads that failed", NULL);
	g.served = met_register(MET_COUNTER, "peercache_transport_served_total",
				"reads served to peers", NULL);
	g.served_bytes = met_register(MET_COUNTER,
				      "peercache_transport_served_bytes_total",
				      "bytes served to peers", NULL);
	g.refused = met_register(MET_COUNTER,
				 "peercache_transport_refused_total",
				 "data requests refused (range, rkey, auth)",
				 NULL);
	g.chans_open = met_register(MET_GAUGE, "peercache_transport_channels",
				    "data channels open to peers", NULL);
	return server_guards_init(s, ctx->threads);
}

static int t_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	unsigned id = rx_reactor_id(r);
	struct tp_client *tc = calloc(1, sizeof(*tc));
	if (!tc)
		return -ENOMEM;
	tc->r = r;
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
	if (id == 0) {
		g.port = rx_listener_port(g.l[0]);
		char addr[300];
		snprintf(addr, sizeof(addr), "%s:%u", s->bind, g.port);
		pc_ctx_publish(ctx, "data", addr);
	}
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
}

static void t_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	if (g.svc.clients && g.svc.clients[id]) {
		client_free(g.svc.clients[id]);
		g.svc.clients[id] = NULL;
	}
}

static void t_fini(struct pc_ctx *ctx)
{
	free(g.l);
	free(g.rs);
	svc_withdraw_transport(ctx);
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
