/*
 * reactor/module.h — the module registry: how features plug into the node.
 *
 * Owns: struct pc_module (a static table per feature), struct pc_ctx (what
 * every module may read about the node), and the lifecycle calls that walk the
 * module list. The list itself lives in one place (server/module_list.c); the
 * core never names a module.
 *
 * Lifecycle, in order:
 *   init  — once, main thread, before any reactor: validate settings, allocate
 *           shared state (sized for ctx->threads reactors).
 *   start — on each reactor thread: listeners, timers, fd watches.
 *   stop  — on each reactor thread when shutdown begins (reverse order):
 *           stop accepting and stop timers; in-flight work may finish.
 *   exit  — on each reactor thread after its loop drained (reverse order):
 *           free per-thread state.
 *   fini  — once, main thread, after all reactor threads ended (reverse).
 * A module whose start failed on a reactor still gets stop and exit there, so
 * stop and exit must tolerate a partial start.
 *
 * Threading: ctx fields are written by main before reactors start and are
 * read-only afterwards, except the endpoint list (its own lock).
 */
#ifndef PC_REACTOR_MODULE_H
#define PC_REACTOR_MODULE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "reactor.h"

struct pc_settings;  /* common/settings.h */
struct rpc_method;   /* rpc/: MessagePack-RPC methods a module serves */
struct http_route;   /* metrics module: HTTP routes a module serves */
struct rx_group;
struct pc_ctx;
struct ring;        /* storage/ring.h */
struct pool;        /* storage/pool.h */
struct tp_ops;      /* modules/transport.h */
struct tp_client;
struct tp_node;
struct dir_api;     /* modules/directory.h */
struct kv_api;      /* modules/kv.h */
struct ph_api;      /* modules/peer_health.h */

/*
 * Services modules offer each other through the context, so that no module
 * includes another: the provider fills its fields in init (main thread);
 * users read them from start on. The ring pointer is swapped atomically on
 * a membership change (read it with __atomic_load_n, ACQUIRE).
 */
struct pc_services {
	/* transport module */
	const struct tp_ops *tp;
	struct tp_client **tp_clients;   /* one per reactor */
	struct tp_node *tp_node;         /* this node's regions (reg_region) */
	/* cluster module */
	struct ring *ring;
	char self_id[160];               /* ring id: "host:rpc_port" */
	char self_data[160];             /* data endpoint: "host:data_port" */
	const struct ph_api *health;     /* peer health (suspect peers) */
	/* directory module */
	const struct dir_api *dir;
	/* kv module */
	struct pool *pool;
	const struct kv_api *kv;
};

struct pc_module {
	const char *name;
	int (*init)(struct pc_ctx *ctx);
	int (*start)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*stop)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*exit)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*fini)(struct pc_ctx *ctx);
	/* Handlers collected by the RPC server / HTTP server modules; NULL-
	 * terminated tables (name == NULL ends them), or NULL for none. */
	const struct rpc_method *rpc_methods;
	const struct http_route *http_routes;
};

#define PC_ENDPOINTS_MAX 16

struct pc_endpoint {
	char name[24];  /* "rpc", "data", "metrics", "socket", ... */
	char addr[128]; /* "127.0.0.1:31999", "/run/peercache/peercached.sock" */
};

struct pc_ctx {
	const struct pc_settings *cfg;   /* effective settings, read-only */
	unsigned threads;                /* reactor threads */
	struct rx_group *group;          /* set once every reactor runs */
	uint64_t start_ns;               /* monotonic start time */
	char node_id[128];
	const struct pc_module *const *modules;
	size_t n_modules;
	unsigned *started;               /* per reactor: modules started */
	struct pc_services svc;
	size_t inited;                   /* modules whose init succeeded */
	pthread_mutex_t ep_lock;
	struct pc_endpoint endpoints[PC_ENDPOINTS_MAX];
	unsigned n_endpoints;
};

/* Prepare ctx for the given module list (call once, main thread). */
int pc_ctx_init(struct pc_ctx *ctx, const struct pc_settings *cfg,
		unsigned threads, const struct pc_module *const *modules,
		size_t n_modules);
void pc_ctx_fini(struct pc_ctx *ctx);

/* Record where the node can be reached ("rpc" -> "127.0.0.1:31999"). Replaces
 * an entry of the same name. Any thread. */
void pc_ctx_publish(struct pc_ctx *ctx, const char *name, const char *addr);
/* Copy of the endpoint list; returns how many were copied. Any thread. */
unsigned pc_ctx_endpoints(struct pc_ctx *ctx, struct pc_endpoint *out,
			  unsigned max);

/* Walk the module list. init/fini: main thread. start/stop/exit: on each
 * reactor thread (the group hooks call them). */
int pc_modules_init(struct pc_ctx *ctx);
int pc_modules_start(struct rx_reactor *r, struct pc_ctx *ctx);
void pc_modules_stop(struct rx_reactor *r, struct pc_ctx *ctx);
void pc_modules_exit(struct rx_reactor *r, struct pc_ctx *ctx);
void pc_modules_fini(struct pc_ctx *ctx);

/* Group hooks that run the module lifecycle on each reactor thread. */
struct rx_group_hooks;
void pc_modules_group_hooks(struct pc_ctx *ctx, struct rx_group_hooks *h);

#endif /* PC_REACTOR_MODULE_H */
