/*
 * modules/module.c — walks the module list through the lifecycle.
 *
 * Owns: the per-reactor count of started modules (ctx->started[]), so stop
 * and exit run for exactly the modules that were started there, in reverse.
 * Thread: init/fini/reload on main; start/stop/exit on each reactor thread,
 * which only touches its own ctx->started[] entry.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "modules/module.h"
#include "reactor/group.h"

#define LOG_MOD "module"

int pc_ctx_init(struct pc_ctx *ctx, const struct pc_settings *cfg,
		unsigned threads, const struct pc_module *const *modules,
		size_t n_modules)
{
	memset(ctx, 0, sizeof(*ctx));
	ctx->cfg = cfg;
	ctx->threads = threads;
	ctx->modules = modules;
	ctx->n_modules = n_modules;
	ctx->start_ns = pc_now_ns();
	ctx->started = calloc(threads ? threads : 1, sizeof(*ctx->started));
	if (!ctx->started)
		return -ENOMEM;
	pthread_mutex_init(&ctx->ep_lock, NULL);
	return 0;
}

const char *pc_ctx_state_name(enum pc_node_state st)
{
	return st == PC_NODE_READY ? "ok"
	       : st == PC_NODE_STOPPING ? "stopping" : "starting";
}

void pc_ctx_fini(struct pc_ctx *ctx)
{
	free(ctx->started);
	ctx->started = NULL;
	pthread_mutex_destroy(&ctx->ep_lock);
}

void pc_ctx_publish(struct pc_ctx *ctx, const char *name, const char *addr)
{
	pthread_mutex_lock(&ctx->ep_lock);
	unsigned i;
	for (i = 0; i < ctx->n_endpoints; i++)
		if (strcmp(ctx->endpoints[i].name, name) == 0)
			break;
	if (i < PC_ENDPOINTS_MAX) {
		snprintf(ctx->endpoints[i].name, sizeof(ctx->endpoints[i].name),
			 "%s", name);
		snprintf(ctx->endpoints[i].addr, sizeof(ctx->endpoints[i].addr),
			 "%s", addr);
		if (i == ctx->n_endpoints)
			ctx->n_endpoints++;
	}
	pthread_mutex_unlock(&ctx->ep_lock);
}

unsigned pc_ctx_endpoints(struct pc_ctx *ctx, struct pc_endpoint *out,
			  unsigned max)
{
	pthread_mutex_lock(&ctx->ep_lock);
	unsigned n = PC_MIN(max, ctx->n_endpoints);
	memcpy(out, ctx->endpoints, n * sizeof(*out));
	pthread_mutex_unlock(&ctx->ep_lock);
	return n;
}

int pc_modules_init(struct pc_ctx *ctx)
{
	for (size_t i = 0; i < ctx->n_modules; i++) {
		const struct pc_module *m = ctx->modules[i];
		int ret = m->init ? m->init(ctx) : 0;
		if (ret < 0) {
			PC_LOGE(LOG_MOD, "module %s failed to initialise: %s",
				m->name, strerror(-ret));
			pc_modules_fini(ctx);
			return ret;
		}
		ctx->inited = i + 1;
	}
	return 0;
}

int pc_modules_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	met_bind_thread(id + 1); /* this thread's metric shard */
	for (size_t i = 0; i < ctx->n_modules; i++) {
		const struct pc_module *m = ctx->modules[i];
		/* Counted before start so a failing module still gets stop/exit
		 * to undo its partial work. */
		ctx->started[id] = (unsigned)i + 1;
		int ret = m->start ? m->start(r, ctx) : 0;
		if (ret < 0) {
			PC_LOGE(LOG_MOD, "module %s failed to start: %s",
				m->name, strerror(-ret));
			return ret;
		}
	}
	return 0;
}

void pc_modules_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	for (size_t i = ctx->started[id]; i-- > 0;) {
		const struct pc_module *m = ctx->modules[i];
		if (m->stop)
			m->stop(r, ctx);
	}
}

void pc_modules_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	unsigned id = rx_reactor_id(r);
	for (size_t i = ctx->started[id]; i-- > 0;) {
		const struct pc_module *m = ctx->modules[i];
		if (m->exit)
			m->exit(r, ctx);
	}
	ctx->started[id] = 0;
}

void pc_modules_fini(struct pc_ctx *ctx)
{
	for (size_t i = ctx->inited; i-- > 0;) {
		const struct pc_module *m = ctx->modules[i];
		if (m->fini)
			m->fini(ctx);
	}
	ctx->inited = 0;
}

unsigned pc_modules_reload(struct pc_ctx *ctx, const struct pc_settings *fresh)
{
	unsigned failed = 0;
	for (size_t i = 0; i < ctx->inited; i++) {
		const struct pc_module *m = ctx->modules[i];
		int ret = m->reload ? m->reload(ctx, fresh) : 0;
		if (ret < 0) {
			PC_LOGW(LOG_MOD, "module %s could not apply the reloaded "
				"settings: %s", m->name, strerror(-ret));
			failed++;
		}
	}
	return failed;
}

unsigned pc_modules_degraded(const struct pc_ctx *ctx, struct pc_degraded *out,
			     unsigned max)
{
	unsigned n = 0;
	for (size_t i = 0; i < ctx->inited; i++) {
		const struct pc_module *m = ctx->modules[i];
		char why[sizeof(out->why)] = "";
		if (!m->degraded || m->degraded(why, sizeof(why)) != 1)
			continue;
		if (n < max) {
			out[n].part = m->name;
			memcpy(out[n].why, why, sizeof(why));
			out[n].why[sizeof(out[n].why) - 1] = '\0';
		}
		n++;
	}
	return n;
}

static int hook_start(struct rx_reactor *r, void *arg)
{
	return pc_modules_start(r, arg);
}

static void hook_stop(struct rx_reactor *r, void *arg)
{
	pc_modules_stop(r, arg);
}

static void hook_exit(struct rx_reactor *r, void *arg)
{
	pc_modules_exit(r, arg);
}

void pc_modules_group_hooks(struct pc_ctx *ctx, struct rx_group_hooks *h)
{
	h->thread_start = hook_start;
	h->thread_stop = hook_stop;
	h->thread_exit = hook_exit;
	h->arg = ctx;
}
