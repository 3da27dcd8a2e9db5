/*
 * modules/module.h — the module lifecycle: how features plug into the node.
 *
 * Owns: struct pc_module (a static table per feature), struct pc_ctx (what
 * every module may read about the node, including the service registry,
 * modules/services.h), and the lifecycle calls that walk the module list.
 * The list itself lives in one place (server/module_list.c); the core never
 * names a module. This sits above the reactor and the RPC layer (a module
 * table carries RPC methods and HTTP routes); the reactor only sees the
 * group hooks (pc_modules_group_hooks) that run start/stop/exit.
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
 *   reload — optional, main thread, between start and stop: the settings
 *           were read again (SIGHUP); see pc_modules_reload().
 * A module whose start failed on a reactor still gets stop and exit there, so
 * stop and exit must tolerate a partial start.
 *
 * Threading: ctx fields are written by main before reactors start and are
 * read-only afterwards, except the endpoint list (its own lock).
 */
#ifndef PC_MODULES_MODULE_H
#define PC_MODULES_MODULE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/services.h"
#include "reactor/reactor.h"

struct pc_settings;  /* common/settings.h */
struct rpc_method;   /* rpc/: MessagePack-RPC methods a module serves */
struct http_route;   /* metrics module: HTTP routes a module serves */
struct rx_group;
struct pc_ctx;

struct pc_module {
	const char *name;
	int (*init)(struct pc_ctx *ctx);
	int (*start)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*stop)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*exit)(struct rx_reactor *r, struct pc_ctx *ctx);
	void (*fini)(struct pc_ctx *ctx);
	/* Optional: the configuration was read again (SIGHUP). Main thread,
	 * while the reactors run; fresh is valid only during the call (ctx->cfg
	 * keeps the settings the node started with). Apply what the module can
	 * change at run time, log what it changed; 0 or -errno (logged). */
	int (*reload)(struct pc_ctx *ctx, const struct pc_settings *fresh);
	/* Optional: a part this module runs that can fail on its own while
	 * the node keeps serving (the disk tier). Any thread, never blocks:
	 * 1 with why (a short cause, NUL-terminated within cap) when the part
	 * is degraded, else 0. /healthz and node.health list such parts. */
	int (*degraded)(char *why, size_t cap);
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

/* Where the node is in its life (pc_ctx.state, written by main with atomic
 * stores, read anywhere): /healthz and node.health report it, and the pool
 * prefault waits for READY. */
enum pc_node_state {
	PC_NODE_STARTING = 0, /* modules starting on the reactors */
	PC_NODE_READY = 1,    /* every module started on every reactor */
	PC_NODE_STOPPING = 2, /* graceful shutdown under way */
};

struct pc_ctx {
	const struct pc_settings *cfg;   /* effective settings, read-only */
	unsigned threads;                /* reactor threads */
	struct rx_group *group;          /* set once every reactor runs */
	int state;                       /* enum pc_node_state; atomic */
	int draining;                    /* 1: writes refused (node.drain);
					  * atomic, any thread */
	uint64_t start_ns;               /* monotonic start time */
	char node_id[128];
	const struct pc_module *const *modules;
	size_t n_modules;
	unsigned *started;               /* per reactor: modules started */
	struct svc_table services;       /* modules/services.h */
	size_t inited;                   /* modules whose init succeeded */
	pthread_mutex_t ep_lock;
	struct pc_endpoint endpoints[PC_ENDPOINTS_MAX];
	unsigned n_endpoints;
};

static inline enum pc_node_state pc_ctx_state(const struct pc_ctx *ctx)
{
	return (enum pc_node_state)__atomic_load_n(&ctx->state,
						   __ATOMIC_ACQUIRE);
}

/* Draining (node.drain, for a planned shutdown): set calls (kv.set,
 * session.set) store nothing and answer false; reads are served. */
static inline bool pc_ctx_draining(const struct pc_ctx *ctx)
{
	return __atomic_load_n(&ctx->draining, __ATOMIC_ACQUIRE) != 0;
}

/* Help of peercache_writes_refused_draining_total{method}, registered by
 * each module that refuses sets while draining. */
#define DRAIN_REFUSED_HELP                                                     \
	"pages a set did not store because the node is draining (node.drain)"

/* "starting", "ok" or "stopping". */
const char *pc_ctx_state_name(enum pc_node_state st);

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
/* A degraded part of the node: its module's name and the cause. */
struct pc_degraded {
	const char *part;
	char why[200];
};

/* The degraded parts (at most max into out; how many there are). Any
 * thread, after init. */
unsigned pc_modules_degraded(const struct pc_ctx *ctx, struct pc_degraded *out,
			     unsigned max);

/* Offer fresh settings to every started module with a reload hook (main
 * thread, while the reactors run). Returns how many hooks failed. */
unsigned pc_modules_reload(struct pc_ctx *ctx, const struct pc_settings *fresh);

/* Group hooks that run the module lifecycle on each reactor thread. */
struct rx_group_hooks;
void pc_modules_group_hooks(struct pc_ctx *ctx, struct rx_group_hooks *h);

#endif /* PC_MODULES_MODULE_H */
