/*
 * modules/services.c — the service registry's table (see services.h).
 *
 * Owns: nothing but ctx->services' entries; the objects are the providers'.
 * Thread: publish/withdraw on the main thread (init/fini); lookups in init or
 * start, after every module's init, so no lock.
 */
#include <errno.h>
#include <stdint.h>

#include "common/log.h"
#include "modules/module.h"
#include "modules/services.h"

#define LOG_MOD "services"

static const struct {
	const char *name;
	const char *provider;
} svc_info[SVC__COUNT] = {
#define SVC_INFO_(name, ID, type, provider) [SVC_##ID] = {#name, provider},
	SVC_LIST(SVC_INFO_)
#undef SVC_INFO_
};

const char *svc_name(enum svc_id id)
{
	return (unsigned)id < SVC__COUNT ? svc_info[id].name : "?";
}

const char *svc_provider(enum svc_id id)
{
	return (unsigned)id < SVC__COUNT ? svc_info[id].provider : "?";
}

int svc_publish(struct pc_ctx *ctx, enum svc_id id, const char *provider,
		const void *obj)
{
	PC_ASSERT((unsigned)id < SVC__COUNT && obj && provider);
	if (ctx->services.e[id].obj) {
		PC_LOGE(LOG_MOD, "service '%s' published by module '%s' and again "
			"by module '%s'", svc_name(id),
			ctx->services.e[id].provider, provider);
		return -EEXIST;
	}
	ctx->services.e[id].obj = (void *)(uintptr_t)obj;
	ctx->services.e[id].provider = provider;
	return 0;
}

void svc_withdraw(struct pc_ctx *ctx, enum svc_id id)
{
	PC_ASSERT((unsigned)id < SVC__COUNT);
	ctx->services.e[id].obj = NULL;
	ctx->services.e[id].provider = NULL;
}

void *svc_find(const struct pc_ctx *ctx, enum svc_id id)
{
	PC_ASSERT((unsigned)id < SVC__COUNT);
	return ctx->services.e[id].obj;
}

void *svc_need(const struct pc_ctx *ctx, enum svc_id id, const char *user)
{
	void *obj = svc_find(ctx, id);
	if (!obj)
		PC_LOGE(LOG_MOD, "module '%s' needs service '%s', which module "
			"'%s' provides, but it is not published: is '%s' in the "
			"module list (before '%s' when looked up in init)?",
			user, svc_name(id), svc_provider(id), svc_provider(id),
			user);
	return obj;
}
