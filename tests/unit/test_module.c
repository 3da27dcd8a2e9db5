/*
 * tests/unit/test_module.c — the module registry: lifecycle order, partial
 * start/init failures undone in reverse, endpoints; and a module list run
 * on real reactor threads through the group hooks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/settings.h"
#include "reactor/group.h"
#include "modules/module.h"
#include "testutil.h"

static char g_log[2048];
static int g_fail_init = -1, g_fail_start = -1;

static void note(const char *what, int id)
{
	size_t len = strlen(g_log);
	snprintf(g_log + len, sizeof(g_log) - len, "%s%d ", what, id);
}

#define MOD(N)                                                                 \
	static int init##N(struct pc_ctx *c)                                   \
	{                                                                      \
		(void)c;                                                       \
		note("i", N);                                                  \
		return g_fail_init == N ? -EINVAL : 0;                         \
	}                                                                      \
	static int start##N(struct rx_reactor *r, struct pc_ctx *c)            \
	{                                                                      \
		(void)r;                                                       \
		(void)c;                                                       \
		note("s", N);                                                  \
		return g_fail_start == N ? -EADDRINUSE : 0;                    \
	}                                                                      \
	static void stop##N(struct rx_reactor *r, struct pc_ctx *c)            \
	{                                                                      \
		(void)r;                                                       \
		(void)c;                                                       \
		note("p", N);                                                  \
	}                                                                      \
	static void exit##N(struct rx_reactor *r, struct pc_ctx *c)            \
	{                                                                      \
		(void)r;                                                       \
		(void)c;                                                       \
		note("x", N);                                                  \
	}                                                                      \
	static void fini##N(struct pc_ctx *c)                                  \
	{                                                                      \
		(void)c;                                                       \
		note("f", N);                                                  \
	}                                                                      \
	static const struct pc_module mod##N = {                               \
		.name = "m" #N, .init = init##N, .start = start##N,            \
		.stop = stop##N, .exit = exit##N, .fini = fini##N}

MOD(1);
MOD(2);
MOD(3);

static const struct pc_module *const list[] = {&mod1, &mod2, &mod3};

static void reset(int fail_init, int fail_start)
{
	g_log[0] = '\0';
	g_fail_init = fail_init;
	g_fail_start = fail_start;
}

static int run_node(struct pc_ctx *ctx)
{
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h;
	pc_modules_group_hooks(ctx, &h);
	int ret = pc_modules_init(ctx);
	if (ret < 0)
		return ret;
	struct rx_group *g;
	ret = rx_group_start(&g, 1, &p, &h);
	if (ret == 0) {
		rx_group_stop(g);
		rx_group_join(g);
	}
	pc_modules_fini(ctx);
	return ret;
}

Test(module, lifecycle_runs_in_order_and_reverse)
{
	struct pc_ctx ctx;
	reset(-1, -1);
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, list, 3), 0);
	cr_assert_eq(run_node(&ctx), 0);
	cr_assert_str_eq(g_log, "i1 i2 i3 s1 s2 s3 p3 p2 p1 x3 x2 x1 f3 f2 f1 ");
	pc_ctx_fini(&ctx);
}

Test(module, failed_init_undoes_earlier_modules)
{
	struct pc_ctx ctx;
	reset(2, -1);
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, list, 3), 0);
	cr_assert_eq(run_node(&ctx), -EINVAL);
	cr_assert_str_eq(g_log, "i1 i2 f1 ");
	pc_ctx_fini(&ctx);
}

Test(module, failed_start_stops_what_started_including_the_failing_one)
{
	struct pc_ctx ctx;
	reset(-1, 2);
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, list, 3), 0);
	cr_assert_eq(run_node(&ctx), -EADDRINUSE);
	cr_assert_str_eq(g_log, "i1 i2 i3 s1 s2 p2 p1 x2 x1 f3 f2 f1 ");
	pc_ctx_fini(&ctx);
}

Test(module, endpoints_are_published_and_replaced)
{
	struct pc_ctx ctx;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 2, list, 3), 0);
	pc_ctx_publish(&ctx, "rpc", "127.0.0.1:1");
	pc_ctx_publish(&ctx, "socket", "/tmp/x.sock");
	pc_ctx_publish(&ctx, "rpc", "127.0.0.1:2");
	struct pc_endpoint ep[PC_ENDPOINTS_MAX];
	cr_assert_eq(pc_ctx_endpoints(&ctx, ep, PC_ENDPOINTS_MAX), 2);
	cr_assert_str_eq(ep[0].name, "rpc");
	cr_assert_str_eq(ep[0].addr, "127.0.0.1:2");
	cr_assert_str_eq(ep[1].addr, "/tmp/x.sock");
	pc_ctx_fini(&ctx);
}

static int g_sick;

static int degraded_hook(char *why, size_t cap)
{
	if (!g_sick)
		return 0;
	snprintf(why, cap, "a write at offset %d failed", g_sick);
	return 1;
}

static const struct pc_module mod_sick = {.name = "disk",
					  .degraded = degraded_hook};

Test(module, degraded_parts_are_listed_only_while_degraded_and_inited)
{
	const struct pc_module *const mods[] = {&mod1, &mod_sick, &mod2};
	struct pc_ctx ctx;
	struct pc_degraded dg[2];
	reset(-1, -1);
	g_sick = 0;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, mods, 3), 0);
	g_sick = 7;
	cr_assert_eq(pc_modules_degraded(&ctx, dg, 2), 0, "not inited yet");
	cr_assert_eq(pc_modules_init(&ctx), 0);
	g_sick = 0;
	cr_assert_eq(pc_modules_degraded(&ctx, dg, 2), 0);
	g_sick = 4096;
	cr_assert_eq(pc_modules_degraded(&ctx, dg, 2), 1);
	cr_assert_str_eq(dg[0].part, "disk");
	cr_assert_str_eq(dg[0].why, "a write at offset 4096 failed");
	cr_assert_eq(pc_modules_degraded(&ctx, dg, 0), 1, "counted, not copied");
	pc_modules_fini(&ctx);
	cr_assert_eq(pc_modules_degraded(&ctx, dg, 2), 0, "after fini");
	pc_ctx_fini(&ctx);
}
