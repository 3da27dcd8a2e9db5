/*
 * modules/discovery.c — embedded discovery: who is in the cluster, found at
 * run time instead of a static `peers` list (docs/discovery.md).
 *
 * Owns: the meta-port listener and its MessagePack-RPC server (the rpc/
 * layer, a second server with only the discovery.* methods and the same
 * cluster-secret authentication as the RPC port), this node's member table
 * (the nodes that heartbeat to it: authoritative when it is a master), the
 * view it adopted (the member list of the first reachable master, which
 * drives the ring through svc_cluster.set_members), the heartbeat client,
 * and the discovery thread that runs all of it.
 *
 * Threading: everything runs on one dedicated thread with a reactor of its
 * own (never one of the node's reactors), so heartbeats are sent, answered
 * and timed out on time however busy the data reactors are; the thread does
 * no other work. The only state another thread reads is the table and the
 * adopted view, under g.lock (held for a copy or a short walk, never across
 * I/O): discovery.view on the RPC port, /discovery/view.json on the
 * metrics port (the dashboard) and the metrics; two byte counters are
 * atomics the thread refreshes every sweep. The ring is built on
 * this thread (cluster's set_members never waits: a change in progress
 * answers -EBUSY and the next sweep retries).
 *
 * Protocol (every node runs it; docs/protocol.md "Meta port"): each node
 * sends discovery.heartbeat every heartbeat_interval to its targets — the
 * seeds of discovery_addr plus the masters of its view. A master that does
 * not know it answers known=false and the node registers (this restores a
 * restarted master within one interval). A reply carrying a table epoch the
 * node has not seen makes it pull discovery.members. The view is the table
 * of the first target that answers in master order (the head, pinned first,
 * then the others by meta address), this node's own table when it comes
 * first; with no master reachable the last view is kept, so a master outage
 * never disturbs established reads and writes.
 *
 * Failure detection (on every master, a sweep every SWEEP_MS): a member not
 * heard for member_ttl / 2 is suspect (still in the ring; the "states"
 * counter of heartbeat replies moves, so followers pull it within one
 * interval and hand it to the cluster's peer health, which skips the peer
 * until it answers a probe), for member_ttl it is removed (table epoch + 1).
 * If the sweep itself ran late (this thread was not scheduled), the lag is
 * credited to every member first, so a stall of the master is never blamed
 * on them. Voluntary leave: module
 * stop sends discovery.deregister to every target, which removes the node at
 * once.
 *
 * Invariants: a table has at most MEMBERS_MAX entries, one per id, its own
 * entry always present and fresh; table epochs only grow.
 *
 * Decoding: what the meta port's messages carry is read by the pure
 * functions of modules/discovery_wire.c (fuzzed by tests/fuzz/fuzz_discovery.c).
 *
 * Backends: with discovery_backend = etcd none of the above runs (no meta
 * port, no table): the etcd backend (discovery_etcd.c, through
 * discovery_int.h) adopts its member lists with disc_view_adopt, and the
 * view, its metrics, discovery.view and the path to the ring are this
 * file's, shared by both.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/discovery_int.h"
#include "modules/http.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "reactor/reactor.h"
#include "rpc/client.h"
#include "rpc/peercred.h"
#include "rpc/rpc.h"

#define LOG_MOD "discovery"
#define MEMBERS_MAX DISC_MEMBERS_MAX
#define SEEDS_MAX 16
#define MASTERS_CAP DISC_MASTERS_MAX
#define TARGETS_MAX (SEEDS_MAX + MASTERS_CAP)
#define ADDR_MAX DISC_ADDR_MAX
#define SWEEP_MS 100
#define LEAVE_MS 500 /* deregister calls get this long at shutdown */
/* The followed master's list is pulled when its epoch or states move, and
 * otherwise only this often (only the members' ages change then): every
 * node pulls the whole table from the master it follows, so this period
 * sets most of the head's traffic (docs/scale.md). */
#define VIEW_REFRESH_MS 10000

/* A master or seed this node heartbeats (discovery thread only). */
struct target {
	char meta[ADDR_MAX];
	bool busy;           /* a call in flight */
	bool have;           /* list holds its table */
	bool warm;           /* it has been up for member_ttl */
	uint64_t ok_ns;      /* last answer */
	uint64_t up_ns;      /* answering again since (after a silence) */
	uint64_t pulled_ns;  /* last member list */
	uint64_t hb_epoch;   /* table epoch and states of its latest answer */
	uint64_t hb_states;  /* (a heartbeat reply or a list) */
	struct disc_list list;
};

static struct {
	struct pc_ctx *ctx;
	const struct svc_cluster *cl;
	bool on;                         /* discovery_addr set, or etcd */
	bool etcd;                       /* discovery_backend = etcd */
	char seeds[SEEDS_MAX][ADDR_MAX];
	unsigned nseeds;
	char self_meta[ADDR_MAX];        /* "" if the meta port is not served */
	bool head;
	unsigned max_masters;
	uint64_t hb_ns, ttl_ns, start_ns;
	/* the thread */
	pthread_t thread;
	bool thread_on;
	struct rx_reactor *r;
	struct rx_listener *listener;
	struct rpc_server *srv;
	struct rpc_client *cl_rpc;
	struct rx_timer hb_timer, sweep_timer, leave_timer;
	uint64_t last_sweep_ns;
	bool leaving;
	bool stop_posted;                /* main / reactor 0 */
	struct rx_msg stop_msg;          /* leave_start's: needs no memory */
	unsigned leave_calls;
	pthread_mutex_t start_lock;
	pthread_cond_t start_cond;
	int start_ret;                   /* 1 until the thread reports */
	struct target targets[TARGETS_MAX];
	unsigned ntargets;
	/* g.lock: the table and the view */
	pthread_mutex_t lock;
	struct disc_list table;          /* this node's, as a master */
	struct disc_list view;           /* adopted */
	char view_from[ADDR_MAX];        /* whose table ("" = own) */
	uint64_t view_ns;                /* when it was adopted */
	char **applied;                  /* ids last given to the cluster */
	unsigned napplied;
	char **suspected;                /* ids last reported suspect */
	unsigned nsuspected;
	const struct ph_api *health;
	met_id changes, heartbeats, hb_failures, removals, late;
	uint64_t bytes_in, bytes_out;    /* the thread's reactor, per sweep */
} g;

/* ------------------------------------------------------------ lists */

static int cmp_entry_meta(const void *a, const void *b)
{
	const struct disc_entry *x = a, *y = b;
	if (x->head != y->head)
		return x->head ? -1 : 1;
	return strcmp(x->meta, y->meta);
}

static struct disc_entry *list_find(struct disc_list *l, const char *id)
{
	for (unsigned i = 0; i < l->n; i++)
		if (strcmp(l->e[i].id, id) == 0)
			return &l->e[i];
	return NULL;
}

static void list_remove(struct disc_list *l, struct disc_entry *e)
{
	*e = l->e[--l->n];
}

/* The masters of a table: the head(s) first, then by meta address, among
 * members that serve a meta port, at most max_masters (g.lock held). */
static void table_masters(struct disc_list *t)
{
	struct disc_entry *s = malloc(t->n * sizeof(*s) + 1);
	t->nmasters = 0;
	if (!s)
		return;
	unsigned n = 0;
	for (unsigned i = 0; i < t->n; i++)
		if (t->e[i].meta[0])
			s[n++] = t->e[i];
	qsort(s, n, sizeof(*s), cmp_entry_meta);
	for (unsigned i = 0; i < n && t->nmasters < g.max_masters; i++)
		snprintf(t->masters[t->nmasters++], ADDR_MAX, "%s", s[i].meta);
	free(s);
}

static bool is_master(const struct disc_list *l, const char *meta)
{
	for (unsigned i = 0; meta[0] && i < l->nmasters; i++)
		if (strcmp(l->masters[i], meta) == 0)
			return true;
	return false;
}

static const char *role_of(const struct disc_list *l,
			   const struct disc_entry *e)
{
	return e->head ? "head" : is_master(l, e->meta) ? "master" : "member";
}

/* ------------------------------------------------------------ the view */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_ids(char **ids, unsigned n)
{
	for (unsigned i = 0; ids && i < n; i++)
		free(ids[i]);
	free(ids);
}

static bool ids_have(char *const *ids, unsigned n, const char *id)
{
	for (unsigned i = 0; i < n; i++)
		if (strcmp(ids[i], id) == 0)
			return true;
	return false;
}

/* Members the view newly shows suspect become suspect in the cluster's
 * peer health too (peer_health.h): reads skip them from now on rather
 * than wait for their removal; a node.health probe that gets an answer
 * makes one healthy again. Takes sus (n ids). */
static void report_suspects(char **sus, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (!ids_have(g.suspected, g.nsuspected, sus[i]))
			g.health->failed(sus[i], -ETIMEDOUT,
					 "discovery: no heartbeat");
	free_ids(g.suspected, g.nsuspected);
	g.suspected = sus;
	g.nsuspected = n;
}

/* Give the view's ids to the cluster if they differ from the last ones
 * given, and its suspects to peer health (discovery thread, without
 * g.lock: a ring build may take a few ms and discovery.view readers on the
 * node's reactors must not wait). */
static void view_apply(void)
{
	pthread_mutex_lock(&g.lock);
	unsigned n = g.view.n, ns = 0;
	char **ids = calloc(n + 1, sizeof(*ids));
	char **sus = calloc(n + 1, sizeof(*sus));
	bool own = !g.view_from[0];
	for (unsigned i = 0; ids && sus && i < n; i++) {
		if (!(ids[i] = strdup(g.view.e[i].id)))
			n = i; /* keep what fits */
		else if (g.view.e[i].suspect && (sus[ns] = strdup(ids[i])))
			ns++;
	}
	pthread_mutex_unlock(&g.lock);
	if (!ids || !sus) {
		free_ids(ids, n);
		free_ids(sus, ns);
		return;
	}
	qsort(ids, n, sizeof(*ids), cmp_str);
	bool same = n == g.napplied;
	for (unsigned i = 0; same && i < n; i++)
		same = strcmp(ids[i], g.applied[i]) == 0;
	int ret = same ? 0
		       : g.cl->set_members((const char *const *)ids, n,
					   own ? "discovery, own table"
					       : "discovery");
	if (same || ret < 0) { /* busy or refused: the next sweep retries */
		free_ids(ids, n);
	} else {
		free_ids(g.applied, g.napplied);
		g.applied = ids;
		g.napplied = n;
		met_inc(g.changes);
	}
	report_suspects(sus, ns);
}

static int list_copy(struct disc_list *to, const struct disc_list *from)
{
	struct disc_entry *e = malloc((from->n + 1) * sizeof(*e));
	if (!e)
		return -ENOMEM;
	memcpy(e, from->e, from->n * sizeof(*e));
	free(to->e);
	*to = *from;
	to->e = e;
	return 0;
}

static struct target *target_find(const char *meta)
{
	for (unsigned i = 0; i < g.ntargets; i++)
		if (strcmp(g.targets[i].meta, meta) == 0)
			return &g.targets[i];
	return NULL;
}

/* A target that answers again after a silence of member_ttl (a partition
 * healed, a link came back) is not followed until it has answered for
 * member_ttl, unless this node has followed it since: its table still
 * misses the members that have not re-registered there yet, and following
 * it (or, meanwhile, a candidate ranked after it) would drop live members
 * from the ring for a moment (a flap: MB_LEAVE, handles closed, records
 * moved for nothing). Until then the view stays. */
static bool target_settled(const struct target *t, uint64_t now)
{
	return now - t->up_ns >= g.ttl_ns ||
	       (strcmp(t->meta, g.view_from) == 0 && g.view_ns >= t->up_ns);
}

/* A target this node does not follow yet is a source to move to only
 * while it answers: heard within member_ttl / 2 (when a master calls a
 * member suspect); the one followed counts until member_ttl, as before.
 * A node cut off from every master at once (a partition with no master on
 * its side) used to move, when the silence of the master it followed
 * reached member_ttl, to the master whose last answer had come in a few
 * milliseconds later: just as unreachable, and with its list as last
 * pulled, which may lack members (a pull lost to the cut, a master still
 * filling its table), so live members left the ring. An answer to the same
 * heartbeat round comes at most a call timeout (2 intervals) after the
 * followed master's last one, so by then it is at least member_ttl - 2
 * intervals old: member_ttl / 2 with the defaults. */
static bool target_answering(const struct target *t, uint64_t now)
{
	return strcmp(t->meta, g.view_from) == 0 ||
	       now - t->ok_ns < g.ttl_ns / 2;
}

/* The latest heartbeat reply of a target showed a table (epoch or states)
 * newer than the list pulled from it: a pull is on its way, and the list
 * is not one to move to meanwhile. Seen at start-up: a master (not the
 * head) follows the cold head, then its own table once it is warm itself,
 * until the heartbeat reply that shows the head warm; that reply also
 * showed a member that had registered in the last interval, and the next
 * view_choose (another target's list, a sweep), before the head's list
 * came, moved the node to the head's list as pulled an interval earlier,
 * without that member: it left the ring and came back with the pull. */
static bool target_stale(const struct target *t)
{
	return t->hb_epoch != t->list.epoch || t->hb_states != t->list.states;
}

/* A target's table lists this node, and not as a master: this node's own
 * table is then no view to follow (unless it is the head). Nobody
 * heartbeats a node that is not a master, so its table holds only the few
 * nodes that name it a seed, often only itself. Once such a node was cut
 * off past member_ttl, that table was all its view knew of, so it ranked
 * first among the masters and the node followed it for good (found by the
 * nemesis). Now, cut off, it keeps its last view, as any member without a
 * master does, and afterwards follows the table that lists it (once
 * settled), meeting the real masters through it. The target's list counts
 * while it is merely silent, not once its port refused (ok_ns 0: gone, so
 * that with every master dead the node may still serve its own table). */
static bool own_table_outranked(void)
{
	for (unsigned i = 0; i < g.ntargets; i++) {
		struct target *t = &g.targets[i];
		if (t->have && t->ok_ns &&
		    list_find(&t->list, g.cl->self_id) &&
		    !is_master(&t->list, g.self_meta))
			return true;
	}
	return false;
}

/* Adopt the table of the first reachable candidate, in master order then
 * seed order: a warm one if any, else any (this node's own table only once
 * warm, unless it is the head, and never while a target's table names it
 * no master; another target only while it answers); none, or the first
 * one not settled or with a pull on its way: the last view stays
 * (g.lock held; view_apply gives it to the ring after). */
static void view_choose(uint64_t now)
{
	const char *cand[TARGETS_MAX];
	unsigned nc = 0;
	for (unsigned i = 0; i < g.view.nmasters && nc < TARGETS_MAX; i++)
		cand[nc++] = g.view.masters[i];
	for (unsigned i = 0; i < g.nseeds && nc < TARGETS_MAX; i++)
		cand[nc++] = g.seeds[i];
	for (int pass = 0; pass < 2; pass++)
		for (unsigned i = 0; i < nc; i++) {
			const struct disc_list *src = NULL;
			if (g.self_meta[0] && strcmp(cand[i], g.self_meta) == 0) {
				/* cold, only the head's own: another node's
				 * holds just the members that found it so far */
				if ((now - g.start_ns >= g.ttl_ns ||
				     (pass == 1 && g.head)) &&
				    (g.head || !own_table_outranked()))
					src = &g.table;
			} else {
				struct target *t = target_find(cand[i]);
				if (t && t->have && now - t->ok_ns < g.ttl_ns &&
				    target_answering(t, now) &&
				    (t->warm || pass == 1)) {
					bool other = strcmp(t->meta, g.view_from) != 0;
					if (!target_settled(t, now) ||
					    (other && target_stale(t)))
						return;
					src = &t->list;
				}
			}
			if (!src)
				continue;
			/* cand[i] may point into the view being replaced */
			char from[ADDR_MAX];
			snprintf(from, sizeof(from), "%s",
				 src == &g.table ? "" : cand[i]);
			if (list_copy(&g.view, src) < 0)
				return;
			if (strcmp(from, g.view_from) != 0)
				PC_LOGI(LOG_MOD, "following the table of %s (table "
					"epoch %llu, %u members)",
					from[0] ? from : "this node",
					(unsigned long long)g.view.epoch,
					g.view.n);
			memcpy(g.view_from, from, sizeof(from));
			g.view_ns = now;
			return;
		}
}

/* The targets: seeds and the view's masters, without this node; a target
 * kept keeps its state (discovery thread, g.lock held). */
static void targets_rebuild(void)
{
	struct target old[TARGETS_MAX];
	unsigned nold = g.ntargets;
	memcpy(old, g.targets, nold * sizeof(*old));
	g.ntargets = 0;
	for (unsigned k = 0; k < g.nseeds + g.view.nmasters; k++) {
		const char *m = k < g.nseeds ? g.seeds[k]
					     : g.view.masters[k - g.nseeds];
		if ((g.self_meta[0] && strcmp(m, g.self_meta) == 0) ||
		    target_find(m) || g.ntargets == TARGETS_MAX)
			continue;
		struct target *t = &g.targets[g.ntargets++];
		unsigned j;
		for (j = 0; j < nold && strcmp(old[j].meta, m); j++)
			;
		if (j < nold) {
			*t = old[j];
			old[j].list.e = NULL; /* moved */
		} else {
			memset(t, 0, sizeof(*t));
			snprintf(t->meta, sizeof(t->meta), "%s", m);
		}
	}
	for (unsigned j = 0; j < nold; j++)
		free(old[j].list.e);
}

/* ------------------------------------------------------------ client side */

struct call {
	char meta[ADDR_MAX];
	int kind; /* 0 heartbeat, 1 register, 2 members, 3 deregister */
};

static void send_call(const char *meta, int kind);

static void pack_bool(msgpack_packer *pk, bool v)
{
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

static void pack_self(msgpack_packer *pk)
{
	mp_pack_cstr(pk, g.cl->self_id);
	mp_pack_cstr(pk, g.self_meta);
	pack_bool(pk, g.head);
}

static void leave_done(void);

static void call_done(void *arg, const struct rpc_result *res)
{
	struct call *c = arg;
	uint64_t now = pc_now_ns();
	struct target *t = target_find(c->meta);
	if (c->kind == 3) {
		free(c);
		leave_done();
		return;
	}
	if (t)
		t->busy = false;
	if (res->err) {
		char buf[256];
		met_inc(g.hb_failures);
		/* Nobody listens there: follow the next master now rather
		 * than its last list until member_ttl. */
		if (t && (res->err == -ECONNREFUSED || res->err == -ECONNRESET))
			t->ok_ns = 0;
		if (res->err == -EACCES)
			PC_LOG_RL(PC_LOG_ERROR, LOG_MOD, "master %s refused "
				  "this node: %s (check cluster_secret)",
				  c->meta, rpc_result_str(res, buf, sizeof(buf)));
		else if (res->err != -ESHUTDOWN)
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "master %s: %s %s",
				  c->meta, c->kind == 0 ? "heartbeat" :
				  c->kind == 1 ? "register" : "members",
				  rpc_result_str(res, buf, sizeof(buf)));
		free(c);
		return;
	}
	if (!t || g.leaving) {
		free(c);
		return;
	}
	if (t->ok_ns && now - t->ok_ns >= g.ttl_ns)
		t->up_ns = now; /* back from a silence */
	t->ok_ns = now;
	if (c->kind == 0) {
		struct disc_hb_reply h;
		if (disc_hb_reply_read(res->result, &h) < 0) {
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "master %s: bad "
				  "heartbeat reply", c->meta);
			free(c);
			return;
		}
		t->warm = h.warm;
		t->hb_epoch = h.epoch;
		t->hb_states = h.states;
		if (!h.known)
			send_call(c->meta, 1);
		else if (!t->have || h.epoch != t->list.epoch ||
			 h.states != t->list.states ||
			 (strcmp(g.view_from, c->meta) == 0 &&
			  now - t->pulled_ns >= PC_MAX(g.ttl_ns / 2,
					       RX_MS(VIEW_REFRESH_MS))))
			send_call(c->meta, 2); /* news, or fresh ages */
	} else {
		struct disc_list l;
		int ret = disc_list_read(res->result, &l, now);
		if (ret < 0) {
			free(l.e);
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "master %s: bad member "
				  "list: %s", c->meta, strerror(-ret));
		} else {
			pthread_mutex_lock(&g.lock);
			free(t->list.e);
			t->list = l;
			t->have = true;
			t->pulled_ns = now;
			t->hb_epoch = l.epoch; /* the newest it showed */
			t->hb_states = l.states;
			view_choose(now);
			targets_rebuild();
			pthread_mutex_unlock(&g.lock);
			view_apply();
		}
	}
	free(c);
}

static void send_call(const char *meta, int kind)
{
	static const char *const methods[] = {
		"discovery.heartbeat", "discovery.register",
		"discovery.members", "discovery.deregister"};
	static const uint32_t nparams[] = {3, 3, 0, 1};
	struct call *c = malloc(sizeof(*c));
	if (!c)
		return;
	snprintf(c->meta, sizeof(c->meta), "%s", meta);
	c->kind = kind;
	unsigned timeout = kind == 3 ? LEAVE_MS
				     : (unsigned)(g.hb_ns / 1000000) * 2;
	struct rpc_req *q = rpc_req_new(g.cl_rpc, meta, methods[kind],
					nparams[kind], timeout, call_done, c);
	if (!q) {
		free(c);
		return;
	}
	msgpack_packer *pk = rpc_req_packer(q);
	if (kind == 0 || kind == 1)
		pack_self(pk);
	else if (kind == 3)
		mp_pack_cstr(pk, g.cl->self_id);
	struct target *t = target_find(meta);
	if (t && kind != 3)
		t->busy = true;
	if (kind == 3)
		g.leave_calls++;
	else
		met_inc(g.heartbeats);
	rpc_req_send(q);
}

static void hb_tick(struct rx_reactor *r, struct rx_timer *tm)
{
	(void)r;
	(void)tm;
	for (unsigned i = 0; i < g.ntargets; i++)
		if (!g.targets[i].busy)
			send_call(g.targets[i].meta, 0);
}

/* ------------------------------------------------------------ master side */

static void sweep_tick(struct rx_reactor *r, struct rx_timer *tm)
{
	(void)tm;
	/* Membership traffic for the metrics: this reactor carries nothing
	 * else (meta-port server and heartbeat client, handshakes included). */
	const struct rx_stats *st = rx_reactor_stats(r);
	__atomic_store_n(&g.bytes_in, RX_STAT_READ(st->bytes_in),
			 __ATOMIC_RELAXED);
	__atomic_store_n(&g.bytes_out, RX_STAT_READ(st->bytes_out),
			 __ATOMIC_RELAXED);
	uint64_t now = pc_now_ns();
	uint64_t lag = now - g.last_sweep_ns;
	lag = lag > 2 * SWEEP_MS * 1000000ull ? lag - SWEEP_MS * 1000000ull : 0;
	g.last_sweep_ns = now;
	pthread_mutex_lock(&g.lock);
	if (lag)
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "the discovery thread ran %.0f "
			  "ms late: members are credited that time",
			  (double)lag / 1e6);
	bool changed = false;
	for (unsigned i = 0; i < g.table.n;) {
		struct disc_entry *e = &g.table.e[i];
		if (strcmp(e->id, g.cl->self_id) == 0) {
			e->seen_ns = now;
			i++;
			continue;
		}
		e->seen_ns += lag;
		uint64_t age = now > e->seen_ns ? now - e->seen_ns : 0;
		if (age >= g.ttl_ns) {
			PC_LOGW(LOG_MOD, "member %s silent for %.1f s: removed "
				"(table epoch %llu)", e->id, (double)age / 1e9,
				(unsigned long long)g.table.epoch + 1);
			met_inc(g.removals);
			list_remove(&g.table, e);
			changed = true;
			continue;
		}
		if (!e->suspect && age >= g.ttl_ns / 2) {
			e->suspect = true;
			g.table.states++;
			PC_LOGI(LOG_MOD, "member %s silent for %.1f s: suspect",
				e->id, (double)age / 1e9);
		}
		i++;
	}
	if (changed) {
		g.table.epoch++;
		table_masters(&g.table);
	}
	view_choose(now);
	targets_rebuild();
	pthread_mutex_unlock(&g.lock);
	view_apply();
}

/* A member list; ages are taken at age_ns (now for a table; for the view,
 * when it was adopted: the ages it was pulled with). */
static void pack_list(msgpack_packer *pk, const struct disc_list *l,
		      uint64_t now, uint64_t age_ns, bool with_view)
{
	msgpack_pack_map(pk, with_view ? 9 : 5);
	mp_pack_cstr(pk, "epoch");
	msgpack_pack_uint64(pk, l->epoch);
	mp_pack_cstr(pk, "states");
	msgpack_pack_uint64(pk, l->states);
	mp_pack_cstr(pk, "warm");
	pack_bool(pk, now - g.start_ns >= g.ttl_ns);
	if (with_view) {
		mp_pack_cstr(pk, "from");
		mp_pack_cstr(pk, g.view_from[0] ? g.view_from : g.self_meta);
		mp_pack_cstr(pk, "self");
		mp_pack_cstr(pk, g.cl->self_id);
		mp_pack_cstr(pk, "backend");
		mp_pack_cstr(pk, g.etcd ? "etcd" : "embedded");
		mp_pack_cstr(pk, "pulled_ms");
		msgpack_pack_uint64(pk, now > g.view_ns
					       ? (now - g.view_ns) / 1000000 : 0);
	}
	mp_pack_cstr(pk, "masters");
	msgpack_pack_array(pk, l->nmasters);
	for (unsigned i = 0; i < l->nmasters; i++)
		mp_pack_cstr(pk, l->masters[i]);
	mp_pack_cstr(pk, "members");
	msgpack_pack_array(pk, l->n);
	for (unsigned i = 0; i < l->n; i++) {
		const struct disc_entry *e = &l->e[i];
		msgpack_pack_map(pk, 6);
		mp_pack_cstr(pk, "id");
		mp_pack_cstr(pk, e->id);
		mp_pack_cstr(pk, "meta");
		mp_pack_cstr(pk, e->meta);
		mp_pack_cstr(pk, "head");
		pack_bool(pk, e->head);
		mp_pack_cstr(pk, "role");
		mp_pack_cstr(pk, role_of(l, e));
		mp_pack_cstr(pk, "state");
		mp_pack_cstr(pk, e->suspect ? "suspect" : "alive");
		mp_pack_cstr(pk, "age_ms");
		msgpack_pack_uint64(pk, age_ns > e->seen_ns
					       ? (age_ns - e->seen_ns) / 1000000
					       : 0);
	}
}

static void m_register(struct rpc_call *call, struct mp_rd *params)
{
	struct disc_entry in;
	if (disc_node_read(params, &in) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [id "
				"\"host:rpc_port\", meta \"host:meta_port\" or "
				"\"\", head bool]");
		return;
	}
	uint64_t now = pc_now_ns();
	pthread_mutex_lock(&g.lock);
	struct disc_entry *e = list_find(&g.table, in.id);
	if (!e && g.table.n >= MEMBERS_MAX) {
		pthread_mutex_unlock(&g.lock);
		rpc_reply_error(call, RPC_E_TOO_LARGE, "%d members already",
				MEMBERS_MAX);
		return;
	}
	if (!e || strcmp(e->meta, in.meta) || e->head != in.head) {
		if (!e) {
			e = &g.table.e[g.table.n++];
			PC_LOGI(LOG_MOD, "member %s registered from %s (table "
				"epoch %llu)", in.id, rpc_call_peer(call),
				(unsigned long long)g.table.epoch + 1);
		}
		*e = in;
		g.table.epoch++;
		table_masters(&g.table);
	}
	g.table.states += e->suspect;
	e->seen_ns = now;
	e->suspect = false;
	pack_list(rpc_reply_begin(call), &g.table, now, now, false);
	rpc_reply_end(call);
	view_choose(now);
	targets_rebuild();
	pthread_mutex_unlock(&g.lock);
	view_apply();
}

static void m_heartbeat(struct rpc_call *call, struct mp_rd *params)
{
	struct disc_entry in;
	if (disc_node_read(params, &in) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [id, meta, "
				"head] as for discovery.register");
		return;
	}
	uint64_t now = pc_now_ns();
	pthread_mutex_lock(&g.lock);
	struct disc_entry *e = list_find(&g.table, in.id);
	if (e && (strcmp(e->meta, in.meta) || e->head != in.head))
		e = NULL; /* restarted with other settings: register again */
	if (e) {
		if (now - e->seen_ns > 2 * g.hb_ns)
			met_inc(g.late);
		if (e->suspect) {
			PC_LOGI(LOG_MOD, "member %s heard again after %.1f s",
				e->id, (double)(now - e->seen_ns) / 1e9);
			g.table.states++;
		}
		e->seen_ns = now;
		e->suspect = false;
	}
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 4);
	mp_pack_cstr(pk, "known");
	pack_bool(pk, e != NULL);
	mp_pack_cstr(pk, "epoch");
	msgpack_pack_uint64(pk, g.table.epoch);
	mp_pack_cstr(pk, "states");
	msgpack_pack_uint64(pk, g.table.states);
	mp_pack_cstr(pk, "warm");
	pack_bool(pk, now - g.start_ns >= g.ttl_ns);
	rpc_reply_end(call);
	pthread_mutex_unlock(&g.lock);
}

static void m_members(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	pthread_mutex_lock(&g.lock);
	pack_list(rpc_reply_begin(call), &g.table, pc_now_ns(), pc_now_ns(),
		  false);
	rpc_reply_end(call);
	pthread_mutex_unlock(&g.lock);
}

static void m_deregister(struct rpc_call *call, struct mp_rd *params)
{
	const char *s;
	uint32_t len;
	char id[ADDR_MAX];
	if (mp_rd_str(params, &s, &len) < 0 || !disc_addr_ok(s, len, id)) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [id]");
		return;
	}
	pthread_mutex_lock(&g.lock);
	struct disc_entry *e = list_find(&g.table, id);
	bool found = e && strcmp(id, g.cl->self_id) != 0;
	if (found) {
		list_remove(&g.table, e);
		g.table.epoch++;
		table_masters(&g.table);
		PC_LOGI(LOG_MOD, "member %s left (table epoch %llu)", id,
			(unsigned long long)g.table.epoch);
	}
	rpc_reply_bool(call, found);
	view_choose(pc_now_ns());
	targets_rebuild();
	pthread_mutex_unlock(&g.lock);
	view_apply();
}

/* RPC port (any reactor): the view this node adopted. */
static void m_view(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	if (!g.on) {
		rpc_reply_error(call, RPC_E_UNSUPPORTED, "discovery is off on "
				"this node (discovery_addr is empty and "
				"discovery_backend is embedded): the "
				"membership is the static peers list");
		return;
	}
	pthread_mutex_lock(&g.lock);
	uint64_t now = pc_now_ns();
	pack_list(rpc_reply_begin(call), &g.view, now, g.view_ns, true);
	rpc_reply_end(call);
	pthread_mutex_unlock(&g.lock);
}

static const struct rpc_method meta_methods[] = {
	{"discovery.register", m_register, 0,
	 "[id, meta, head] -> {epoch, warm, masters, members}: join"},
	{"discovery.heartbeat", m_heartbeat, 0,
	 "[id, meta, head] -> {known, epoch, warm}"},
	{"discovery.members", m_members, 0,
	 "-> {epoch, warm, masters, members: [{id, meta, head, role, state, "
	 "age_ms}]}: this master's table"},
	{"discovery.deregister", m_deregister, 0, "[id] -> bool: leave now"},
	{NULL, NULL, 0, NULL},
};

static const struct rpc_method rpc_methods[] = {
	{"discovery.view", m_view, 0,
	 "-> {epoch, from, self, backend, masters, members}: the membership "
	 "this node follows"},
	{NULL, NULL, 0, NULL},
};

/* Metrics port (any reactor): the same view as JSON for the dashboard,
 * read-only; at most MEMBERS_MAX members of bounded addresses. */
static void r_view_json(const struct http_request *req,
			struct http_response *r)
{
	(void)req;
	if (!g.on) {
		r->status = 404;
		pc_wbuf_printf(&r->body, "discovery is off on this node "
			       "(no discovery_addr, and discovery_backend is "
			       "not etcd)\n");
		return;
	}
	r->content_type = "application/json";
	struct pc_wbuf *b = &r->body;
	pthread_mutex_lock(&g.lock);
	uint64_t now = pc_now_ns();
	pc_wbuf_printf(b, "{\"epoch\":%llu,\"pulled_ms\":%llu,\"from\":",
		       (unsigned long long)g.view.epoch,
		       (unsigned long long)(now > g.view_ns
				? (now - g.view_ns) / 1000000 : 0));
	const char *from = g.view_from[0] ? g.view_from : g.self_meta;
	pc_json_str(b, from, strlen(from));
	pc_wbuf_printf(b, ",\"self\":");
	pc_json_str(b, g.cl->self_id, strlen(g.cl->self_id));
	pc_wbuf_printf(b, ",\"members\":[");
	for (unsigned i = 0; i < g.view.n; i++) {
		const struct disc_entry *e = &g.view.e[i];
		pc_wbuf_printf(b, "%s{\"id\":", i ? "," : "");
		pc_json_str(b, e->id, strlen(e->id));
		pc_wbuf_printf(b, ",\"role\":\"%s\",\"state\":\"%s\","
			       "\"age_ms\":%llu}", role_of(&g.view, e),
			       e->suspect ? "suspect" : "alive",
			       (unsigned long long)(g.view_ns > e->seen_ns
				       ? (g.view_ns - e->seen_ns) / 1000000
				       : 0));
	}
	pc_wbuf_printf(b, "]}\n");
	pthread_mutex_unlock(&g.lock);
}

static const struct http_route http_routes[] = {
	{"/discovery/view.json", r_view_json},
	{NULL, NULL},
};

/* ------------------------------------------------------------ the thread */

static void on_meta(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	rpc_server_accept(g.srv, rx_listener_reactor(l), fd, false);
}

static void leave_stop(struct rx_reactor *r, struct rx_timer *tm)
{
	(void)tm;
	rx_reactor_stop(r);
}

static void leave_done(void)
{
	if (g.leave_calls && --g.leave_calls == 0 && g.leaving)
		rx_reactor_stop(g.r);
}

/* Posted at shutdown: deregister everywhere, then stop this reactor. */
static void leave_start(struct rx_reactor *r, void *arg)
{
	(void)arg;
	if (rx_reactor_stopping(r) || g.leaving)
		return;
	g.leaving = true;
	rx_timer_stop(r, &g.hb_timer);
	rx_timer_stop(r, &g.sweep_timer);
	if (g.listener) {
		rx_listener_close(g.listener);
		g.listener = NULL;
	}
	for (unsigned i = 0; i < g.ntargets; i++)
		send_call(g.targets[i].meta, 3);
	if (!g.leave_calls) {
		rx_reactor_stop(r);
		return;
	}
	PC_LOGI(LOG_MOD, "leaving: deregistering from %u master%s",
		g.leave_calls, g.leave_calls == 1 ? "" : "s");
	rx_timer_start(r, &g.leave_timer, RX_MS(LEAVE_MS + 100), 0);
}

static void started(int ret)
{
	pthread_mutex_lock(&g.start_lock);
	g.start_ret = ret;
	pthread_cond_signal(&g.start_cond);
	pthread_mutex_unlock(&g.start_lock);
}

static void *disc_thread(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "pc-discovery");
	const struct pc_settings *s = g.ctx->cfg;
	struct rx_params p;
	rx_params_default(&p);
	/* Small: one connection per member (a master) plus a few calls each. */
	p.sq_entries = 256;
	p.ops_max = 4 * MEMBERS_MAX;
	p.timers_max = 8 * MEMBERS_MAX;
	p.buf_count = 256;
	p.conn_out_max = 8u << 20;
	p.conn_out_high = 2u << 20;
	p.conn_out_low = 512u << 10;
	p.shutdown_grace_ms = LEAVE_MS;
	int ret = rx_reactor_create(&g.r, g.ctx->threads, &p);
	if (ret < 0) {
		started(ret);
		return NULL;
	}
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	int err = 0;
	g.listener = rx_listen_tcp(g.r, s->bind, (uint16_t)s->meta_port, false,
				   256, on_meta, NULL, &err);
	if (g.listener) {
		snprintf(g.self_meta, sizeof(g.self_meta), "%s:%u", host,
			 rx_listener_port(g.listener));
		pc_ctx_publish(g.ctx, "meta", g.self_meta);
		g.head |= strcmp(g.seeds[0], g.self_meta) == 0;
	} else if (g.head) {
		PC_LOGE(LOG_MOD, "cannot listen on the meta port %s:%lld: %s "
			"(this node is the discovery head)", s->bind,
			(long long)s->meta_port, strerror(-err));
	} else {
		PC_LOGW(LOG_MOD, "cannot listen on the meta port %s:%lld: %s; "
			"this node joins as a member only (never a master)",
			s->bind, (long long)s->meta_port, strerror(-err));
	}
	if (!g.listener && g.head) {
		started(err);
		rx_reactor_destroy(g.r);
		g.r = NULL;
		return NULL;
	}
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = s->cluster_secret;
	o.conns_per_endpoint = 1;
	o.connect_timeout_ms = (unsigned)s->heartbeat_interval_ms;
	o.backoff_max_ms = (unsigned)s->heartbeat_interval_ms;
	g.cl_rpc = rpc_client_new(g.r, &o);
	uint64_t now = pc_now_ns();
	pthread_mutex_lock(&g.lock);
	struct disc_entry *me = &g.table.e[g.table.n++];
	snprintf(me->id, sizeof(me->id), "%s", g.cl->self_id);
	snprintf(me->meta, sizeof(me->meta), "%s", g.self_meta);
	me->head = g.head;
	me->seen_ns = now;
	g.table.epoch = 1;
	table_masters(&g.table);
	view_choose(now); /* the head follows itself from the start */
	targets_rebuild();
	pthread_mutex_unlock(&g.lock);
	g.last_sweep_ns = now;
	rx_timer_init(&g.hb_timer, hb_tick, NULL);
	rx_timer_init(&g.sweep_timer, sweep_tick, NULL);
	rx_timer_init(&g.leave_timer, leave_stop, NULL);
	if (!g.cl_rpc ||
	    rx_timer_start(g.r, &g.hb_timer, 1, g.hb_ns) < 0 ||
	    rx_timer_start(g.r, &g.sweep_timer, RX_MS(SWEEP_MS),
			   RX_MS(SWEEP_MS)) < 0) {
		started(-ENOMEM);
	} else {
		PC_LOGI(LOG_MOD, "discovery on: %s, meta port %s, heartbeat "
			"every %llu ms, members dropped after %llu ms silent",
			g.head ? "this node is the head" : "joining through the "
			"seeds", g.self_meta[0] ? g.self_meta : "(none)",
			(unsigned long long)(g.hb_ns / 1000000),
			(unsigned long long)(g.ttl_ns / 1000000));
		started(0);
		rx_reactor_run(g.r);
	}
	if (g.listener)
		rx_listener_close(g.listener);
	g.listener = NULL;
	rpc_client_free(g.cl_rpc);
	g.cl_rpc = NULL;
	rx_reactor_destroy(g.r);
	g.r = NULL;
	return NULL;
}

/* ------------------------------------------------------------ backends */

int disc_view_adopt(const char (*ids)[DISC_ADDR_MAX], unsigned n,
		    uint64_t epoch, const char *from)
{
	if (n > MEMBERS_MAX)
		return -E2BIG;
	struct disc_entry *e = calloc(n + 1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	uint64_t now = pc_now_ns();
	for (unsigned i = 0; i < n; i++) {
		memcpy(e[i].id, ids[i], ADDR_MAX);
		e[i].seen_ns = now; /* when the backend last listed it */
	}
	pthread_mutex_lock(&g.lock);
	free(g.view.e);
	memset(&g.view, 0, sizeof(g.view));
	g.view.e = e;
	g.view.n = n;
	g.view.epoch = epoch;
	snprintf(g.view_from, sizeof(g.view_from), "%s", from);
	g.view_ns = now;
	pthread_mutex_unlock(&g.lock);
	view_apply();
	return 0;
}

void disc_view_reapply(void)
{
	view_apply();
}

/* ------------------------------------------------------------ lifecycle */

static double view_size_fn(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.lock);
	double v = g.view.n;
	pthread_mutex_unlock(&g.lock);
	return v;
}

static double view_epoch_fn(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.lock);
	double v = (double)g.view.epoch;
	pthread_mutex_unlock(&g.lock);
	return v;
}

static double suspects_fn(void *arg)
{
	(void)arg;
	unsigned n = 0;
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.view.n; i++)
		n += g.view.e[i].suspect;
	pthread_mutex_unlock(&g.lock);
	return n;
}

static double table_size_fn(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.lock);
	double v = g.table.n;
	pthread_mutex_unlock(&g.lock);
	return v;
}

static double bytes_fn(void *arg)
{
	return (double)__atomic_load_n((const uint64_t *)arg, __ATOMIC_RELAXED);
}

/* The metrics of the view: both backends. */
static void view_metrics(void)
{
	met_register_fn("peercache_discovery_members", "members of the "
			"discovery view this node follows", NULL, view_size_fn,
			NULL);
	met_register_fn("peercache_discovery_epoch", "table epoch of the "
			"view this node follows (the same on every node that "
			"follows the same master; the etcd revision with "
			"discovery_backend = etcd)", NULL, view_epoch_fn, NULL);
	met_register_fn("peercache_discovery_suspects", "members of the view "
			"not heard for member_ttl / 2", NULL, suspects_fn, NULL);
	g.changes = met_register(MET_COUNTER,
				 "peercache_discovery_changes_total",
				 "membership changes discovery gave the ring",
				 NULL);
}

int disc_parse_addrs(const char *list, const char *setting,
		     const char *what, char (*out)[DISC_ADDR_MAX],
		     unsigned max, unsigned *n)
{
	const char *sep = ", \t";
	for (const char *p = list; *p;) {
		p += strspn(p, sep);
		size_t len = strcspn(p, sep);
		if (len == 0)
			break;
		if (*n == max) {
			PC_LOGE(LOG_MOD, "%s: more than %u addresses", setting,
				max);
			return -E2BIG;
		}
		if (!disc_addr_ok(p, (uint32_t)len, out[*n])) {
			PC_LOGE(LOG_MOD, "%s: '%.*s' is not %s", setting,
				(int)PC_MIN(len, 64), p, what);
			return -EINVAL;
		}
		(*n)++;
		p += len;
	}
	return 0;
}

static int d_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	pthread_mutex_init(&g.lock, NULL);
	pthread_mutex_init(&g.start_lock, NULL);
	pthread_cond_init(&g.start_cond, NULL);
	g.on = pc_settings_discovery_on(s);
	if (!g.on)
		return 0;
	g.etcd = s->discovery_backend == PC_DISC_ETCD;
	int ret = g.etcd ? 0
			 : disc_parse_addrs(s->discovery_addr, "discovery_addr",
					    "host:meta_port", g.seeds,
					    SEEDS_MAX, &g.nseeds);
	if (ret < 0)
		return ret;
	if (!(g.cl = svc_need_cluster(ctx, "discovery")) ||
	    !(g.health = svc_need_health(ctx, "discovery")))
		return -ENOENT;
	g.max_masters = (unsigned)PC_MIN(s->max_masters, MASTERS_CAP);
	g.hb_ns = RX_MS(s->heartbeat_interval_ms);
	g.ttl_ns = RX_MS(s->member_ttl_ms);
	view_metrics();
	if (g.etcd) {
		snprintf(g.view_from, sizeof(g.view_from), "etcd (not "
			 "reached yet)");
		return disc_etcd_init(ctx);
	}
	if (!(g.table.e = calloc(MEMBERS_MAX + 1, sizeof(*g.table.e))))
		return -ENOMEM;
	struct rpc_limits lim = {
		.max_message_bytes = 1u << 20,
		.max_elements = 64 * 1024,
		.max_depth = 8,
		.max_inflight = 64,
		.max_connections = 4096,
		.max_fds = 0,
	};
	/* The RPC port's guards, scaled to a port that carries heartbeats. */
	struct rpc_guard gd = {
		.max_preauth = (uint32_t)s->rpc_max_preauth_connections,
		.max_per_host = (uint32_t)s->rpc_max_connections_per_host,
		.preauth_max_bytes = s->rpc_preauth_max_bytes,
		.handshake_timeout_ms = (uint32_t)s->rpc_handshake_timeout_ms,
		.message_timeout_ms = (uint32_t)s->rpc_message_timeout_ms,
		.idle_timeout_ms = (uint32_t)s->rpc_idle_timeout_ms,
		.write_stall_ms = (uint32_t)s->rpc_write_stall_timeout_ms,
		.max_buffered_bytes = 16u << 20,
		.max_reply_bytes = 16u << 20,
		.conn_reply_bytes = 2u << 20,
	};
	const struct rpc_method *tables[] = {meta_methods};
	if ((ret = rpc_server_new(&g.srv, &lim, tables, 1, s->cluster_secret,
				  rpc_group_id(s->socket_group),
				  ctx->threads + 1)) < 0)
		return ret;
	rpc_server_no_metrics(g.srv);
	if ((ret = rpc_server_set_guard(g.srv, &gd)) < 0)
		return ret;
	met_register_fn("peercache_discovery_table_members", "members that "
			"heartbeat to this node (a master)", NULL,
			table_size_fn, NULL);
	met_register_counter_fn("peercache_discovery_received_bytes_total",
				"bytes the discovery thread received (meta "
				"port and heartbeat replies; TCP payload, "
				"updated every 100 ms)", NULL, bytes_fn,
				&g.bytes_in);
	met_register_counter_fn("peercache_discovery_sent_bytes_total",
				"bytes the discovery thread sent (heartbeats, "
				"pulls and meta-port replies; TCP payload, "
				"updated every 100 ms)", NULL, bytes_fn,
				&g.bytes_out);
	g.heartbeats = met_register(MET_COUNTER,
				    "peercache_discovery_calls_total",
				    "heartbeat, register and members calls "
				    "sent to masters", NULL);
	g.hb_failures = met_register(MET_COUNTER,
				     "peercache_discovery_call_failures_total",
				     "of those, calls that got no answer",
				     NULL);
	g.late = met_register(MET_COUNTER,
			      "peercache_discovery_late_heartbeats_total",
			      "heartbeats this master received more than two "
			      "intervals after the member's previous one", NULL);
	g.removals = met_register(MET_COUNTER,
				  "peercache_discovery_expired_total",
				  "members this master removed for silence",
				  NULL);
	return 0;
}

static int d_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (!g.on || rx_reactor_id(r) != 0)
		return 0;
	if (g.etcd) {
		g.start_ns = pc_now_ns();
		return disc_etcd_start(g.cl->self_id, g.cl->self_data);
	}
	/* The head names itself first: compare with its own meta address
	 * (the configured port here; the thread checks the bound one). */
	const struct pc_settings *s = ctx->cfg;
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	char me[ADDR_MAX];
	snprintf(me, sizeof(me), "%s:%lld", host, (long long)s->meta_port);
	g.head = strcmp(g.seeds[0], me) == 0;
	g.start_ns = pc_now_ns();
	g.start_ret = 1;
	int ret = pthread_create(&g.thread, NULL, disc_thread, NULL);
	if (ret != 0)
		return -ret;
	g.thread_on = true;
	/* Start-up only: wait for the thread's listener (bounded: it binds
	 * a socket and arms two timers). */
	pthread_mutex_lock(&g.start_lock);
	while (g.start_ret == 1)
		pthread_cond_wait(&g.start_cond, &g.start_lock);
	ret = g.start_ret;
	pthread_mutex_unlock(&g.start_lock);
	if (ret < 0) { /* the thread has ended */
		pthread_join(g.thread, NULL);
		g.thread_on = false;
	}
	return ret;
}

/* Once: the thread's stop must arrive even when allocations fail, or fini
 * would wait for the thread forever. */
static void post_leave(void)
{
	if (!g.thread_on || g.stop_posted)
		return;
	g.stop_posted = true;
	rx_post_msg(g.r, &g.stop_msg, leave_start, NULL);
}

static void d_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (g.etcd && rx_reactor_id(r) == 0)
		disc_etcd_stop();
	if (rx_reactor_id(r) == 0)
		post_leave();
}

static void d_fini(struct pc_ctx *ctx)
{
	(void)ctx;
	if (g.etcd)
		disc_etcd_fini();
	post_leave();
	if (g.thread_on)
		pthread_join(g.thread, NULL);
	rpc_server_free(g.srv);
	for (unsigned i = 0; i < g.ntargets; i++)
		free(g.targets[i].list.e);
	free_ids(g.applied, g.napplied);
	free_ids(g.suspected, g.nsuspected);
	free(g.table.e);
	free(g.view.e);
	pthread_mutex_destroy(&g.lock);
	pthread_mutex_destroy(&g.start_lock);
	pthread_cond_destroy(&g.start_cond);
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_discovery = {
	.name = "discovery",
	.init = d_init,
	.start = d_start,
	.stop = d_stop,
	.fini = d_fini,
	.rpc_methods = rpc_methods,
	.http_routes = http_routes,
};
