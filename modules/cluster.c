/*
 * modules/cluster.c — static membership and the ring (until discovery).
 *
 * Owns: this node's ring id ("advertise_host:rpc_port") and data endpoint,
 * the member list (this node plus `peers`), and the ring built from it,
 * published in ctx->svc.ring. Every node builds the same ring from the same
 * list (storage/ring.h), so writers and readers agree on owners without
 * talking. Thread: the ring is built on reactor 0 once the RPC and data
 * listeners have their ports (this module starts after them), before the
 * other reactors start; it is read-only afterwards.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "rpc/rpc.h"
#include "storage/ring.h"

#define LOG_MOD "cluster"
#define PEERS_MAX 1024

static struct {
	struct pc_ctx *ctx;
	char *peers[PEERS_MAX];
	unsigned npeers;
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
	struct ring *r = __atomic_load_n(&g.ctx->svc.ring, __ATOMIC_ACQUIRE);
	return r ? ring_size(r) : 0;
}

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
	snprintf(ctx->svc.self_id, sizeof(ctx->svc.self_id), "%s:%d", host, rpc);
	snprintf(ctx->svc.self_data, sizeof(ctx->svc.self_data), "%s:%d", host,
		 data);
	const char *members[PEERS_MAX + 1];
	unsigned n = 0;
	members[n++] = ctx->svc.self_id;
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
	__atomic_store_n(&ctx->svc.ring, ring, __ATOMIC_RELEASE);
	PC_LOGI(LOG_MOD, "ring of %u member%s (%lld vnodes each): this node is "
		"%s, data on %s", n, n == 1 ? "" : "s", (long long)s->vnodes,
		ctx->svc.self_id, ctx->svc.self_data);
	return 0;
}

static void c_fini(struct pc_ctx *ctx)
{
	ring_free(ctx->svc.ring);
	ctx->svc.ring = NULL;
	for (unsigned i = 0; i < g.npeers; i++)
		free(g.peers[i]);
	memset(&g, 0, sizeof(g));
}

static void m_members(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	struct ring *r = __atomic_load_n(&g.ctx->svc.ring, __ATOMIC_ACQUIRE);
	unsigned n = r ? ring_size(r) : 0;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		const char *id = ring_member(r, i);
		msgpack_pack_map(pk, 3);
		mp_pack_cstr(pk, "id");
		mp_pack_cstr(pk, id);
		mp_pack_cstr(pk, "self");
		if (strcmp(id, g.ctx->svc.self_id) == 0)
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
		mp_pack_cstr(pk, "state");
		mp_pack_cstr(pk, "static");
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
	.fini = c_fini,
	.rpc_methods = cluster_methods,
};
