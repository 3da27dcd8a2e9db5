/*
 * modules/rpc_server.c — the node's MessagePack-RPC listeners.
 *
 * Owns: the rpc_server (methods gathered from every module's rpc_methods
 * table), one TCP listener per reactor on bind:rpc_port (SO_REUSEPORT), and
 * the Unix socket listener on reactor 0. Each new client goes to the
 * reactor serving the fewest of its class (modules/spread.h; by
 * rpc_server_local_conns or rpc_server_tcp_conns): every SGLang rank of a
 * host gets a core of its own instead of all sharing reactor 0, and a
 * peer's few TCP connections are not left on one reactor by the kernel's
 * SO_REUSEPORT hash (2 connections share one of 2 reactors half the time).
 * Threads: init/fini on main; start/stop on each reactor.
 * Loopback-only by default; a non-loopback bind is refused at start unless
 * cluster_secret is set (common/settings.c), and with a secret every TCP
 * client must pass the challenge-response first (rpc/auth.h).
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "modules/spread.h"
#include "reactor/group.h"
#include "rpc/peercred.h"
#include "rpc/rpc.h"

#define LOG_MOD "rpc"

static struct {
	struct pc_ctx *ctx;
	struct rpc_server *srv;
	struct rx_listener **tcp;  /* per reactor */
	struct rx_listener *unix_l;
	uint16_t port;             /* bound by reactor 0 */
	struct pc_spread spread_tcp, spread_unix; /* new clients' reactors */
	char (*labels)[24];        /* per reactor: reactor="i" (kept by metrics) */
} g;

static double local_conns_fn(void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg;
	return g.srv ? (double)rpc_server_local_conns(g.srv, i) : 0;
}

static double tcp_conns_fn(void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg;
	return g.srv ? (double)rpc_server_tcp_conns(g.srv, i) : 0;
}

/* Create the socket's directory (like /run/peercache) if it is missing. */
static int make_socket_dir(const char *path)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s", path);
	char *dir = dirname(tmp);
	struct stat st;
	if (stat(dir, &st) == 0)
		return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		mkdir(dir, 0755);
		*p = '/';
	}
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static uint64_t tcp_load(unsigned i)
{
	return rpc_server_tcp_conns(g.srv, i);
}

static uint64_t unix_load(unsigned i)
{
	return rpc_server_local_conns(g.srv, i);
}

/* How the RPC server hands a newcomer to another reactor
 * (rpc_server_set_post): through the node's reactor group. */
static int post_to(void *arg, unsigned reactor,
		   void (*fn)(struct rx_reactor *r, void *fn_arg), void *fn_arg)
{
	struct pc_ctx *ctx = arg;
	struct rx_group *grp = __atomic_load_n(&ctx->group, __ATOMIC_ACQUIRE);
	return grp ? rx_group_post(grp, reactor, fn, fn_arg) : -ESHUTDOWN;
}

static void serve_tcp(struct rx_reactor *r, int fd)
{
	rpc_server_accept(g.srv, r, fd, false);
}

static void serve_unix(struct rx_reactor *r, int fd)
{
	rpc_server_accept(g.srv, r, fd, true);
}

static int rpc_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	long gid = rpc_group_id(s->socket_group);
	if (gid == -2) {
		PC_LOGE(LOG_MOD, "socket_group: no group named '%s'",
			s->socket_group);
		return -EINVAL;
	}
	if (*s->socket) {
		int ret = make_socket_dir(s->socket);
		if (ret < 0) {
			PC_LOGE(LOG_MOD, "cannot create the directory of socket "
				"%s: %s (set --socket to a writable path, or "
				"--socket \"\" for none)", s->socket,
				strerror(-ret));
			return ret;
		}
	}
	const struct rpc_method *tables[ctx->n_modules + 1];
	for (size_t i = 0; i < ctx->n_modules; i++)
		tables[i] = ctx->modules[i]->rpc_methods;
	struct rpc_limits lim = {
		.max_message_bytes = s->rpc_max_message_bytes,
		.max_elements = (uint32_t)s->rpc_max_elements,
		.max_depth = (uint32_t)s->rpc_max_depth,
		.max_inflight = (uint32_t)s->rpc_max_inflight,
		.max_connections = (uint32_t)s->rpc_max_connections,
		.max_fds = 8,
	};
	struct rpc_guard gd = {
		.max_preauth = (uint32_t)s->rpc_max_preauth_connections,
		.max_local = (uint32_t)s->rpc_max_local_connections,
		.max_per_host = (uint32_t)s->rpc_max_connections_per_host,
		.preauth_max_bytes = s->rpc_preauth_max_bytes,
		.handshake_timeout_ms = (uint32_t)s->rpc_handshake_timeout_ms,
		.message_timeout_ms = (uint32_t)s->rpc_message_timeout_ms,
		.idle_timeout_ms = (uint32_t)s->rpc_idle_timeout_ms,
		.write_stall_ms = (uint32_t)s->rpc_write_stall_timeout_ms,
		.max_buffered_bytes = s->rpc_max_buffered_bytes,
		.max_reply_bytes = s->rpc_max_reply_bytes,
		/* One connection's share: a quarter of the node's reply
		 * budget (conn_out_max if less), so a few clients that do
		 * not read cannot hold all of it. */
		.conn_reply_bytes = PC_MIN(s->conn_out_max,
					   s->rpc_max_reply_bytes / 4),
	};
	g.tcp = calloc(ctx->threads, sizeof(*g.tcp));
	g.labels = calloc(ctx->threads, sizeof(*g.labels));
	if (!g.tcp || !g.labels ||
	    pc_spread_init(&g.spread_tcp, ctx, PC_SPREAD_LEAD, tcp_load,
			   serve_tcp) < 0 ||
	    pc_spread_init(&g.spread_unix, ctx, PC_SPREAD_ALONE, unix_load,
			   serve_unix) < 0) {
		free(g.tcp);
		free(g.labels);
		pc_spread_fini(&g.spread_tcp);
		pc_spread_fini(&g.spread_unix);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < ctx->threads; i++) {
		char *lab = g.labels[i];
		snprintf(lab, sizeof(*g.labels), "reactor=\"%u\"", i);
		met_register_fn("peercache_rpc_local_connections",
				"Unix-socket clients each reactor serves", lab,
				local_conns_fn, (void *)(uintptr_t)i);
		met_register_fn("peercache_rpc_tcp_connections",
				"TCP clients each reactor serves", lab,
				tcp_conns_fn, (void *)(uintptr_t)i);
	}
	int ret = rpc_server_new(&g.srv, &lim, tables,
				 (unsigned)ctx->n_modules, s->cluster_secret,
				 gid, ctx->threads);
	if (ret == 0)
		ret = rpc_server_set_guard(g.srv, &gd);
	if (ret == 0)
		rpc_server_set_post(g.srv, post_to, ctx);
	if (ret < 0) {
		rpc_server_free(g.srv);
		g.srv = NULL;
		free(g.tcp);
		pc_spread_fini(&g.spread_tcp);
		pc_spread_fini(&g.spread_unix);
		free(g.labels);
		return ret;
	}
	if (*s->cluster_secret)
		PC_LOGI(LOG_MOD, "cluster authentication on: TCP clients must "
			"prove the cluster secret");
	return 0;
}

static void on_tcp(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	pc_spread_accept(&g.spread_tcp, g.ctx, rx_listener_reactor(l), fd);
}

static void on_unix(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	pc_spread_accept(&g.spread_unix, g.ctx, rx_listener_reactor(l), fd);
}

static int rpc_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	unsigned id = rx_reactor_id(r);
	uint16_t port = id == 0 ? (uint16_t)s->rpc_port : g.port;
	int err;
	g.tcp[id] = rx_listen_tcp(r, s->bind, port, true, 1024, on_tcp, NULL,
				  &err);
	if (!g.tcp[id])
		return err;
	if (id != 0)
		return 0;
	g.port = rx_listener_port(g.tcp[0]);
	char addr[300];
	snprintf(addr, sizeof(addr), "%s%s%s:%u", strchr(s->bind, ':') ? "[" : "",
		 s->bind, strchr(s->bind, ':') ? "]" : "", g.port);
	pc_ctx_publish(ctx, "rpc", addr);
	if (*s->socket) {
		/* Access is checked per client with SO_PEERCRED, so the file
		 * itself may be opened by anyone: a refused client gets a
		 * clear error instead of a bare EACCES. */
		g.unix_l = rx_listen_unix(r, s->socket, 0666, 1024, on_unix,
					  NULL, &err);
		if (!g.unix_l)
			return err;
		pc_ctx_publish(ctx, "socket", s->socket);
	}
	return 0;
}

static void rpc_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	unsigned id = rx_reactor_id(r);
	if (g.tcp && g.tcp[id]) {
		rx_listener_close(g.tcp[id]);
		g.tcp[id] = NULL;
	}
	if (id == 0 && g.unix_l) {
		rx_listener_close(g.unix_l);
		g.unix_l = NULL;
	}
}

static void rpc_fini(struct pc_ctx *ctx)
{
	(void)ctx;
	rpc_server_free(g.srv);
	free(g.tcp);
	pc_spread_fini(&g.spread_tcp);
	pc_spread_fini(&g.spread_unix);
	free(g.labels);
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_rpc_server = {
	.name = "rpc",
	.init = rpc_init,
	.start = rpc_start,
	.stop = rpc_stop,
	.fini = rpc_fini,
};
