/*
 * modules/node.c — node.info and node.health: who this node is, and whether
 * it serves; node.config: the settings it runs with; node.drain: stop
 * taking writes before a planned shutdown.
 *
 * Owns: a pointer to the node context, and the context's draining flag
 * (written here only, atomically; kv_rpc and session read it at every set
 * and answer false while it is on). Thread: the handlers run on whichever
 * reactor received the call; they only read the context (its endpoint
 * list has its own lock) and flip the flag.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "rpc/rpc.h"

static struct pc_ctx *g_ctx;

static void pack_bool(msgpack_packer *pk, bool v)
{
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

static double uptime_s(void)
{
	return (double)(pc_now_ns() - g_ctx->start_ns) / 1e9;
}

static void m_info(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	const struct pc_settings *s = g_ctx->cfg;
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(g_ctx, eps, PC_ENDPOINTS_MAX);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 10);
	mp_pack_cstr(pk, "node_id");
	mp_pack_cstr(pk, g_ctx->node_id);
	mp_pack_cstr(pk, "version");
	mp_pack_cstr(pk, PEERCACHE_VERSION);
	mp_pack_cstr(pk, "revision");
	mp_pack_cstr(pk, PEERCACHE_GIT_REV);
	mp_pack_cstr(pk, "mode");
	mp_pack_cstr(pk, s->mode == PC_MODE_P2P ? "p2p" : "slotmap");
	mp_pack_cstr(pk, "transport");
	mp_pack_cstr(pk, "tcp");
	mp_pack_cstr(pk, "uptime_s");
	msgpack_pack_double(pk, uptime_s());
	mp_pack_cstr(pk, "threads");
	msgpack_pack_uint32(pk, g_ctx->threads);
	mp_pack_cstr(pk, "pid");
	msgpack_pack_int32(pk, (int32_t)getpid());
	mp_pack_cstr(pk, "draining");
	pack_bool(pk, pc_ctx_draining(g_ctx));
	mp_pack_cstr(pk, "addresses");
	msgpack_pack_map(pk, n);
	for (unsigned i = 0; i < n; i++) {
		mp_pack_cstr(pk, eps[i].name);
		mp_pack_cstr(pk, eps[i].addr);
	}
	rpc_reply_end(call);
}

#define DEGRADED_MAX 8

/* status is the node's (ready: "ok"); a part that failed on its own while
 * the node serves (a module's degraded hook: the disk tier) is listed in
 * "degraded" with its cause, and does not change status. */
static void m_health(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	struct pc_degraded dg[DEGRADED_MAX];
	unsigned n = pc_modules_degraded(g_ctx, dg, DEGRADED_MAX);
	n = n < DEGRADED_MAX ? n : DEGRADED_MAX;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 4);
	mp_pack_cstr(pk, "status"); /* "ok" once ready (main.c) */
	mp_pack_cstr(pk, pc_ctx_state_name(pc_ctx_state(g_ctx)));
	mp_pack_cstr(pk, "draining"); /* reads served, sets answer false */
	pack_bool(pk, pc_ctx_draining(g_ctx));
	mp_pack_cstr(pk, "uptime_s");
	msgpack_pack_double(pk, uptime_s());
	mp_pack_cstr(pk, "degraded");
	msgpack_pack_map(pk, n);
	for (unsigned i = 0; i < n; i++) {
		mp_pack_cstr(pk, dg[i].part);
		mp_pack_cstr(pk, dg[i].why);
	}
	rpc_reply_end(call);
}

static void config_one(void *arg, const struct pc_cfg_key *k,
		       const char *value)
{
	msgpack_packer *pk = arg;
	mp_pack_cstr(pk, k->name);
	mp_pack_cstr(pk, value);
}

/* Every key of the settings table with the value the node started with,
 * as --print-config prints it (secrets "***": pc_cfg_format). */
static void m_config(struct rpc_call *call, struct mp_rd *params)
{
	(void)params;
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, pc_settings_table.n);
	pc_cfg_each(&pc_settings_table, g_ctx->cfg, config_one, pk);
	rpc_reply_end(call);
}

/* [on: bool] (none: on) -> {"draining": bool, "changed": bool} */
static void m_drain(struct rpc_call *call, struct mp_rd *params)
{
	bool on = true; /* params: after their array header (rpc.h) */
	if (params->p < params->end && mp_rd_bool(params, &on) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS,
				"expected [] or [on: bool]");
		return;
	}
	int was = __atomic_exchange_n(&g_ctx->draining, on ? 1 : 0,
				      __ATOMIC_ACQ_REL);
	if (was != (int)on)
		PC_LOGI("node", "%s (asked by %s)", on ? "draining: sets store "
			"nothing and answer false until drain is turned off; "
			"reads are served" : "drain off: sets are stored again",
			rpc_call_peer(call));
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_map(pk, 2);
	mp_pack_cstr(pk, "draining");
	pack_bool(pk, on);
	mp_pack_cstr(pk, "changed");
	pack_bool(pk, was != (int)on);
	rpc_reply_end(call);
}

static double draining_gauge(void *arg)
{
	(void)arg;
	return pc_ctx_draining(g_ctx) ? 1 : 0;
}

static const struct rpc_method node_methods[] = {
	{"node.info", m_info, 0,
	 "node id, version, mode, transport, uptime, threads, addresses"},
	{"node.health", m_health, 0,
	 "\"ok\" once every module started; \"starting\" / \"stopping\"; "
	 "degraded parts (the disk tier) with their cause"},
	{"node.config", m_config, 0,
	 "the settings the node started with: {key: value text}, secrets "
	 "\"***\""},
	{"node.drain", m_drain, 0,
	 "[on: bool] (none: on) -> {draining, changed}: while on, sets "
	 "store nothing and answer false; reads are served"},
	{NULL, NULL, 0, NULL},
};

static int node_init(struct pc_ctx *ctx)
{
	g_ctx = ctx;
	return met_register_fn("peercache_node_draining",
			       "1 while the node is draining (node.drain: sets "
			       "answer false, reads are served), else 0",
			       NULL, draining_gauge, NULL);
}

const struct pc_module pc_mod_node = {
	.name = "node",
	.init = node_init,
	.rpc_methods = node_methods,
};
