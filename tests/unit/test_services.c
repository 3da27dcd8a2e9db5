/*
 * tests/unit/test_services.c — the service registry (modules/services.h):
 * publish, find, need, withdraw; one provider per service; and a module
 * list whose user comes before its provider failing init with -ENOENT (the
 * modules it initialised undone), while the right order starts.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "modules/kv.h"
#include "modules/module.h"
#include "modules/services.h"

static const struct kv_api fake_kv; /* only its address is used */

Test(services, publish_find_need_withdraw)
{
	struct pc_ctx ctx;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, NULL, 0), 0);
	cr_assert_null(svc_find_kv(&ctx));
	cr_assert_null(svc_need_kv(&ctx, "session"));
	cr_assert_eq(svc_publish_kv(&ctx, "kv", &fake_kv), 0);
	cr_assert_eq(svc_find_kv(&ctx), &fake_kv);
	cr_assert_eq(svc_need_kv(&ctx, "session"), &fake_kv);
	cr_assert_null(svc_find_placement(&ctx), "services are kept apart");
	svc_withdraw_kv(&ctx);
	cr_assert_null(svc_find_kv(&ctx));
	pc_ctx_fini(&ctx);
}

Test(services, one_provider_per_service)
{
	struct pc_ctx ctx;
	static const struct kv_api other;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, NULL, 0), 0);
	cr_assert_eq(svc_publish_kv(&ctx, "kv", &fake_kv), 0);
	cr_assert_eq(svc_publish_kv(&ctx, "kv2", &other), -EEXIST);
	cr_assert_eq(svc_find_kv(&ctx), &fake_kv, "the first stays");
	pc_ctx_fini(&ctx);
}

Test(services, names_and_providers)
{
	cr_assert_str_eq(svc_name(SVC_PLACEMENT), "placement");
	cr_assert_str_eq(svc_provider(SVC_PLACEMENT), "directory");
	cr_assert_str_eq(svc_name(SVC_TRANSPORT), "transport");
	cr_assert_str_eq(svc_provider(SVC_HEALTH), "cluster");
	cr_assert_str_eq(svc_provider(SVC_POOL), "kv");
}

/* A provider and a user of the "kv" service, as modules. */
static char g_log[256];
static const struct kv_api *g_seen;

static int prov_init(struct pc_ctx *c)
{
	strcat(g_log, "P ");
	return svc_publish_kv(c, "prov", &fake_kv);
}

static void prov_fini(struct pc_ctx *c)
{
	strcat(g_log, "p ");
	svc_withdraw_kv(c);
}

static int user_init(struct pc_ctx *c)
{
	strcat(g_log, "U ");
	return (g_seen = svc_need_kv(c, "user")) ? 0 : -ENOENT;
}

static void user_fini(struct pc_ctx *c)
{
	(void)c;
	strcat(g_log, "u ");
}

static const struct pc_module prov = {
	.name = "prov", .init = prov_init, .fini = prov_fini};
static const struct pc_module user = {
	.name = "user", .init = user_init, .fini = user_fini};

Test(services, a_user_before_its_provider_fails_init)
{
	static const struct pc_module *const good[] = {&prov, &user};
	static const struct pc_module *const wrong[] = {&user, &prov};
	struct pc_ctx ctx;

	g_log[0] = '\0';
	g_seen = NULL;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, good, 2), 0);
	cr_assert_eq(pc_modules_init(&ctx), 0);
	cr_assert_eq(g_seen, &fake_kv);
	pc_modules_fini(&ctx);
	cr_assert_null(svc_find_kv(&ctx), "withdrawn in fini");
	cr_assert_str_eq(g_log, "P U u p ");
	pc_ctx_fini(&ctx);

	g_log[0] = '\0';
	g_seen = NULL;
	cr_assert_eq(pc_ctx_init(&ctx, NULL, 1, wrong, 2), 0);
	cr_assert_eq(pc_modules_init(&ctx), -ENOENT);
	cr_assert_null(g_seen);
	cr_assert_str_eq(g_log, "U ", "nothing after the failing module");
	pc_ctx_fini(&ctx);
}
