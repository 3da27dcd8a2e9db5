/*
 * modules/node.c — node.info and node.health: who this node is, and whether
 * it serves.
 *
 * Owns: nothing but a pointer to the node context. Thread: the handlers run
 * on whichever reactor received the call; they only read the context (its
 * endpoint list has its own lock).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/settings.h"
#include "modules/modules.h"
#include "rpc/rpc.h"

static struct pc_ctx *g_ctx;

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
	msgpack_pack_map(pk, 9);
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
	msgpack_pack_map(pk, 3);
	mp_pack_cstr(pk, "status"); /* "ok" once ready (main.c) */
	mp_pack_cstr(pk, pc_ctx_state_name(pc_ctx_state(g_ctx)));
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

static const struct rpc_method node_methods[] = {
	{"node.info", m_info, 0,
	 "node id, version, mode, transport, uptime, threads, addresses"},
	{"node.health", m_health, 0,
	 "\"ok\" once every module started; \"starting\" / \"stopping\"; "
	 "degraded parts (the disk tier) with their cause"},
	{NULL, NULL, 0, NULL},
};

static int node_init(struct pc_ctx *ctx)
{
	g_ctx = ctx;
	return 0;
}

const struct pc_module pc_mod_node = {
	.name = "node",
	.init = node_init,
	.rpc_methods = node_methods,
};
