/*
 * modules/cluster.c — static membership, the ring (until discovery) and the
 * peer-health table.
 *
 * Owns: this node's ring id ("advertise_host:rpc_port") and data endpoint,
 * the member list (this node plus `peers`), and the ring built from it,
 * published as the "cluster" service (modules/services.h). Every node builds
 * the same ring from the same list (storage/ring.h), so writers and readers
 * agree on owners without talking. Thread: the ring is built on reactor 0
 * once the RPC and data listeners have their ports (this module starts after
 * them), before the other reactors start; it is read-only afterwards.
 *
 * Peer health (modules/peer_health.h, the "health" service): one per ring
 * member, indexed like the ring, whose state is a single atomic word — any
 * reactor reads it (skip a suspect peer) or flips it healthy -> suspect with
 * a compare-and-swap (the winner logs and counts); no lock anywhere. Only
 * reactor 0 flips it back: its timer sends node.health to each suspect peer
 * every peer_probe_interval (one probe in flight per peer, on the module's
 * own RPC client, so probe timeouts never retire the directory's
 * connections), and an answer makes the peer healthy again. A transition
 * to suspect is posted to every reactor, where the on_suspect watchers
 * (directory, kv) fail what still waits for the peer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "reactor/group.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "storage/ring.h"

#define LOG_MOD "cluster"
#define PEERS_MAX 1024
#define WATCHERS_MAX 4

enum { PH_HEALTHY = 0, PH_SUSPECT = 1 };

/* A member's health. state and since_ns: atomics, any reactor; probing:
 * reactor 0 only. */
struct health {
	uint32_t state;          /* PH_HEALTHY / PH_SUSPECT */
	uint64_t since_ns;       /* when it became suspect */
	bool probing;            /* a probe is in flight */
};

static struct {
	struct pc_ctx *ctx;
	struct svc_cluster cl;        /* published: self, data, the ring */
	char *peers[PEERS_MAX];
	unsigned npeers;
	struct health *health;   /* one per ring member, ring order */
	unsigned nhealth;
	int self_idx;
	unsigned probe_ms;
	struct rx_timer probe_timer;  /* reactor 0 */
	struct rpc_client *probe_cl;  /* reactor 0 */
	void (*watchers[WATCHERS_MAX])(struct rx_reactor *r, const char *peer);
	unsigned nwatchers;           /* set in init, read-only after */
	met_id transitions, probes;
} g;

/* The port of an endpoint the node published ("host:port"). */
static int published_port(struct pc_ctx *ctx, const char *name)
{
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(ctx, eps, PC_ENDPOINTS_MAX);
	for (unsigned i = 0; i < n; i++)
		if (strcmp(eps[i].name, name) == 0) {
			const char *c = strrchr(eps[i].addr, ':');
			return c ? atoi(c + 1) : -1;
		}
	return -1;
}

static int parse_peers(const char *list)
{
	char *copy = strdup(list), *save = NULL;
	if (!copy)
		return -ENOMEM;
	int ret = 0;
	for (char *tok = strtok_r(copy, ", \t", &save); tok && !ret;
	     tok = strtok_r(NULL, ", \t", &save)) {
		const char *c = strrchr(tok, ':');
		char *end;
		long port = c ? strtol(c + 1, &end, 10) : -1;
		if (!c || c == tok || port <= 0 || port > 65535 || *end) {
			PC_LOGE(LOG_MOD, "peers: '%s' is not host:port (each "
				"entry is a peer's rpc_port address)", tok);
			ret = -EINVAL;
		} else if (strlen(tok) > RING_ID_BYTES_MAX) {
			PC_LOGE(LOG_MOD, "peers: '%.40s...' is too long", tok);
			ret = -EINVAL;
		} else if (g.npeers >= PEERS_MAX) {
			PC_LOGE(LOG_MOD, "peers: more than %d entries", PEERS_MAX);
			ret = -E2BIG;
		} else if (!(g.peers[g.npeers++] = strdup(tok))) {
			ret = -ENOMEM;
		}
	}
	free(copy);
	return ret;
}

static double members_fn(void *arg)
{
	(void)arg;
	struct ring *r = __atomic_load_n(&g.cl.ring, __ATOMIC_ACQUIRE);
	return r ? ring_size(r) : 0;
}

/* --------------------------------------------------------------- health */

/* The entry of a member other than this node; NULL for anything else. */
static struct health *health_of(const char *peer)
{
	struct ring *r = __atomic_load_n(&g.cl.ring, __ATOMIC_ACQUIRE);
	int i = r && peer ? ring_find(r, peer) : -1;
	if (i < 0 || (unsigned)i >= g.nhealth || i == g.self_idx)
		return NULL;
	return &g.health[i];
}

static bool ph_suspect(const char *peer)
{
	struct health *h = health_of(peer);
	return h && __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) == PH_SUSPECT;
}

/* On each reactor after member i became suspect: the watchers fail what
 * still waits for it there. */
static void notify_suspect(struct rx_reactor *r, void *arg)
{
	if (rx_reactor_stopping(r)) /* also: the node is being torn down */
		return;
	unsigned i = (unsigned)(uintptr_t)arg;
	struct ring *ring = __atomic_load_n(&g.cl.ring, __ATOMIC_ACQUIRE);
	if (!ring ||
	    __atomic_load_n(&g.health[i].state, __ATOMIC_ACQUIRE) != PH_SUSPECT)
		return; /* healthy again meanwhile */
	for (unsigned w = 0; w < g.nwatchers; w++)
		g.watchers[w](r, ring_member(ring, i));
}

static void broadcast_suspect(unsigned i)
{
	struct rx_group *grp = __atomic_load_n(&g.ctx->group, __ATOMIC_ACQUIRE);
	for (unsigned t = 0; grp && g.nwatchers && t < rx_group_size(grp); t++) {
		/* A reactor that has ended (the node is stopping) is past
		 * needing it. */
		int ret = rx_group_post(grp, t, notify_suspect,
					(void *)(uintptr_t)i);
		if (ret < 0 && ret != -ESHUTDOWN)
			PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "cannot tell reactor %u "
				  "about a suspect peer: its calls wait for "
				  "their deadline", t);
	}
}

static void ph_failed(const char *peer, int err, const char *what)
{
	struct health *h = health_of(peer);
	uint32_t healthy = PH_HEALTHY;
	if (!h || !ph_no_answer(err) ||
	    !__atomic_compare_exchange_n(&h->state, &healthy, PH_SUSPECT, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&h->since_ns, pc_now_ns(), __ATOMIC_RELAXED);
	met_inc(g.transitions);
	PC_LOGW(LOG_MOD, "peer %s is suspect (%s: %s): skipped until it answers "
		"a probe", peer, what, strerror(-err));
	broadcast_suspect((unsigned)(h - g.health));
}

static int ph_on_suspect(void (*fn)(struct rx_reactor *r, const char *peer))
{
	if (g.nwatchers == WATCHERS_MAX)
		return -ENOSPC;
	g.watchers[g.nwatchers++] = fn;
	return 0;
}

static const struct ph_api health_api = {
	.suspect = ph_suspect,
	.failed = ph_failed,
	.on_suspect = ph_on_suspect,
};

static double suspect_fn(void *arg)
{
	(void)arg;
	unsigned n = 0;
	for (unsigned i = 0; i < g.nhealth; i++)
		n += __atomic_load_n(&g.health[i].state, __ATOMIC_RELAXED) ==
		     PH_SUSPECT;
	return n;
}

static void probe_done(void *arg, const struct rpc_result *res)
{
	struct health *h = arg;
	h->probing = false;
	if (res->err != 0 || !g.cl.ring)
		return; /* still suspect: the next tick probes again */
	uint32_t suspect = PH_SUSPECT;
	if (!__atomic_compare_exchange_n(&h->state, &suspect, PH_HEALTHY, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	uint64_t since = __atomic_load_n(&h->since_ns, __ATOMIC_RELAXED);
	PC_LOGI(LOG_MOD, "peer %s answers again after %.1f s suspect: healthy",
		ring_member(g.cl.ring, (unsigned)(h - g.health)),
		(double)(pc_now_ns() - since) / 1e9);
}

/* Reactor 0, every peer_probe_interval: probe each suspect peer. */
static void probe_tick(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	struct ring *ring = g.cl.ring;
	for (unsigned i = 0; i < g.nhealth; i++) {
		struct health *h = &g.health[i];
		if (h->probing || __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) !=
					  PH_SUSPECT)
			continue;
		/* Twice the interval: a node just thawed gets a moment to work
		 * through its backlog, and one probe at a time keeps the rate. */
		struct rpc_req *q = rpc_req_new(g.probe_cl, ring_member(ring, i),
						"node.health", 0,
						2 * g.probe_ms, probe_done, h);
		if (!q)
			continue;
		h->probing = true;
		met_inc(g.probes);
		rpc_req_send(q);
	}
}

/* ------------------------------------------------------------- lifecycle */

static int c_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !*host) {
		PC_LOGE(LOG_MOD, "bind is a wildcard address: set advertise_host "
			"to the address other nodes use to reach this one");
		return -EINVAL;
	}
	int ret = parse_peers(s->peers);
	if (ret < 0)
		return ret;
	met_register_fn("peercache_members", "members of the ring", NULL,
			members_fn, NULL);
	g.probe_ms = (unsigned)s->peer_probe_interval_ms;
	g.self_idx = -1;
	rx_timer_init(&g.probe_timer, probe_tick, NULL); /* stop may run */
	g.health = calloc(g.npeers + 1, sizeof(*g.health));
	if (!g.health)
		return -ENOMEM;
	if ((ret = svc_publish_health(ctx, "cluster", &health_api)) < 0 ||
	    (ret = svc_publish_cluster(ctx, "cluster", &g.cl)) < 0)
		return ret;
	met_register_fn("peercache_peers_suspect",
			"peers that did not answer and are skipped until a probe "
			"succeeds", NULL, suspect_fn, NULL);
	g.transitions = met_register(MET_COUNTER,
				     "peercache_peer_suspect_transitions_total",
				     "times a peer became suspect (it did not "
				     "answer a call)", NULL);
	g.probes = met_register(MET_COUNTER, "peercache_peer_probes_total",
				"node.health probes sent to suspect peers",
				NULL);
	return 0;
}

static int c_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	if (rx_reactor_id(r) != 0)
		return 0;
	const struct pc_settings *s = ctx->cfg;
	const char *host = *s->advertise_host ? s->advertise_host : s->bind;
	int rpc = published_port(ctx, "rpc"), data = published_port(ctx, "data");
	if (rpc <= 0 || data <= 0) {
		PC_LOGE(LOG_MOD, "the rpc and data listeners must start before "
			"the cluster module");
		return -EINVAL;
	}
	snprintf(g.cl.self_id, sizeof(g.cl.self_id), "%s:%d", host, rpc);
	snprintf(g.cl.self_data, sizeof(g.cl.self_data), "%s:%d", host,
		 data);
	const char *members[PEERS_MAX + 1];
	unsigned n = 0;
	members[n++] = g.cl.self_id;
	for (unsigned i = 0; i < g.npeers; i++) {
		bool dup = false;
		for (unsigned j = 0; j < n; j++)
			dup |= strcmp(members[j], g.peers[i]) == 0;
		if (!dup) /* the list may name this node too */
			members[n++] = g.peers[i];
	}
	struct ring *ring;
	int ret = ring_build(&ring, members, n, (unsigned)s->vnodes);
	if (ret < 0) {
		PC_LOGE(LOG_MOD, "cannot build the ring: %s", strerror(-ret));
		return ret;
	}
	g.nhealth = n;
	g.self_idx = ring_find(ring, g.cl.self_id);
	__atomic_store_n(&g.cl.ring, ring, __ATOMIC_RELEASE);
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = s->cluster_secret;
	o.conns_per_endpoint = 1;
	o.connect_timeout_ms = 2 * g.probe_ms;
	o.backoff_max_ms = g.probe_ms; /* a refused probe retries next tick */
	if (!(g.probe_cl = rpc_client_new(r, &o)))
		return -ENOMEM;
	rx_timer_start(r, &g.probe_timer, RX_MS(g.probe_ms), RX_MS(g.probe_ms));
	PC_LOGI(LOG_MOD, "ring of %u member%s (%lld vnodes each): this node is "
		"%s, data on %s", n, n == 1 ? "" : "s", (long long)s->vnodes,
		g.cl.self_id, g.cl.self_data);
	return 0;
}

static void c_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0)
		rx_timer_stop(r, &g.probe_timer);
}

static void c_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	if (rx_reactor_id(r) == 0 && g.probe_cl) {
		rpc_client_free(g.probe_cl); /* fails a probe in flight */
		g.probe_cl = NULL;
	}
}

static void c_fini(struct pc_ctx *ctx)
{
	svc_withdraw_health(ctx);
	svc_withdraw_cluster(ctx);
	ring_free(g.cl.ring);
	g.cl.ring = NULL;
	free(g.health);
	for (unsigned i = 0; i < g.npeers; i++)
		free(g.peers[i]);
	memset(&g, 0, sizeof(g));
}

static void m_members(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	struct ring *r = __atomic_load_n(&g.cl.ring, __ATOMIC_ACQUIRE);
	unsigned n = r ? ring_size(r) : 0;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		const char *id = ring_member(r, i);
		msgpack_pack_map(pk, 3);
		mp_pack_cstr(pk, "id");
		mp_pack_cstr(pk, id);
		mp_pack_cstr(pk, "self");
		if (strcmp(id, g.cl.self_id) == 0)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		mp_pack_cstr(pk, "state");
		mp_pack_cstr(pk, ph_suspect(id) ? "suspect" : "static");
	}
	rpc_reply_end(call);
}

static const struct rpc_method cluster_methods[] = {
	{"cluster.members", m_members, 0,
	 "members of the ring: [{id, self, state}]"},
	{NULL, NULL, 0, NULL},
};

const struct pc_module pc_mod_cluster = {
	.name = "cluster",
	.init = c_init,
	.start = c_start,
	.stop = c_stop,
	.exit = c_exit,
	.fini = c_fini,
	.rpc_methods = cluster_methods,
};
