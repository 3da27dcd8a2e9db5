/*
 * modules/services.h — the typed service registry: how modules find the
 * services other modules offer, without including each other and without
 * the reactor knowing any of them.
 *
 * Owns: the service list (SVC_LIST: name, type, providing module) and the
 * table in struct pc_ctx (ctx->services) that maps each service to the
 * object its provider published. The objects belong to their providers.
 *
 * Use:
 *   provider, in init:  svc_publish_placement(ctx, "directory", &api);
 *                       in fini: svc_withdraw_placement(ctx);
 *   user, once, in init (when the provider comes earlier in the module
 *   list) or in start, keeping the pointer for the module's lifetime:
 *                       g.pl = svc_need_placement(ctx, "kv"); (required)
 *                       g.health = svc_find_health(ctx);    (optional)
 *   svc_need_X logs which module needs which service from which provider
 *   and returns NULL; the user fails its init/start with -ENOENT, so the
 *   node refuses to start instead of failing on the first request.
 *
 * Threading: publish and withdraw run on the main thread (init, fini),
 * before any reactor starts and after all ended; lookups run in init or
 * start, after every init, so the table needs no lock. What a published
 * object contains is its provider's business (the membership's ring is
 * replaced under epochs, struct svc_transport's clients are filled in start).
 *
 * Invariants: a service has at most one provider (a second publish fails
 * with -EEXIST naming both); a lookup never returns a withdrawn object.
 */
#ifndef PC_MODULES_SERVICES_H
#define PC_MODULES_SERVICES_H

#include <stdint.h>

struct pc_ctx;      /* modules/module.h */
struct ring;        /* storage/ring.h */
struct pool;        /* storage/pool.h */
struct tp_ops;      /* modules/transport.h */
struct tp_client;
struct tp_node;
struct pl_ops;      /* modules/placement.h */
struct kv_api;      /* modules/kv.h */
struct ph_api;      /* modules/peer_health.h */
struct mb_api;      /* modules/membership.h */
struct tier_ops;    /* modules/tier.h */

/* transport module: the data-port transport. */
struct svc_transport {
	const struct tp_ops *ops;
	struct tp_client **clients;   /* one per reactor, set in its start */
	struct tp_node *node;         /* this node's regions: ops->reg_region */
};

/* cluster module: who this node is. Filled on reactor 0 in the cluster's
 * start, before the other reactors start. The ring, its epochs and the
 * membership events are the "membership" service (modules/membership.h). */
struct svc_cluster {
	char self_id[160];      /* ring id: "host:rpc_port" */
	char self_data[160];    /* data endpoint: "host:data_port" */
	/* Make this node plus ids[0..n) the membership (a new ring epoch and
	 * MB_JOIN / MB_LEAVE events, as cluster.set_peers), for the discovery
	 * module. Any thread that may not wait: a change in progress answers
	 * -EBUSY (retry later). 1 changed, 0 already so, or -errno (logged). */
	int (*set_members)(const char *const *ids, unsigned n, const char *why);
};

/* kv module: the publish pool and the key the transport gave it (what a
 * record of one of its pages carries as rkey). */
struct svc_pool {
	struct pool *pool;
	uint32_t rkey;
};

/* X(name, ID, pointer type, providing module) */
#define SVC_LIST(X)                                                            \
	X(transport, TRANSPORT, const struct svc_transport *, "transport")     \
	X(cluster, CLUSTER, const struct svc_cluster *, "cluster")             \
	X(health, HEALTH, const struct ph_api *, "cluster")                    \
	X(membership, MEMBERSHIP, const struct mb_api *, "cluster")            \
	X(placement, PLACEMENT, const struct pl_ops *, "directory")            \
	X(kv, KV, const struct kv_api *, "kv")                                 \
	X(pool, POOL, const struct svc_pool *, "kv")                           \
	X(tier, TIER, const struct tier_ops *, "disk")

enum svc_id {
#define SVC_ENUM_(name, ID, type, provider) SVC_##ID,
	SVC_LIST(SVC_ENUM_)
#undef SVC_ENUM_
	SVC__COUNT
};

/* The registry itself, embedded in struct pc_ctx as ctx->services. */
struct svc_table {
	struct {
		void *obj;             /* NULL: not published */
		const char *provider;  /* module that published it */
	} e[SVC__COUNT];
};

/* The untyped calls; modules use the typed wrappers below. */
int svc_publish(struct pc_ctx *ctx, enum svc_id id, const char *provider,
		const void *obj);
void svc_withdraw(struct pc_ctx *ctx, enum svc_id id);
void *svc_find(const struct pc_ctx *ctx, enum svc_id id);
void *svc_need(const struct pc_ctx *ctx, enum svc_id id, const char *user);
/* "dir", "kv", ...; the module expected to provide it. */
const char *svc_name(enum svc_id id);
const char *svc_provider(enum svc_id id);

#define SVC_TYPED_(name, ID, type, provider)                                   \
	static inline int svc_publish_##name(struct pc_ctx *ctx,               \
					     const char *by, type obj)         \
	{                                                                      \
		return svc_publish(ctx, SVC_##ID, by, obj);                    \
	}                                                                      \
	static inline void svc_withdraw_##name(struct pc_ctx *ctx)             \
	{                                                                      \
		svc_withdraw(ctx, SVC_##ID);                                   \
	}                                                                      \
	static inline type svc_find_##name(const struct pc_ctx *ctx)           \
	{                                                                      \
		return svc_find(ctx, SVC_##ID);                                \
	}                                                                      \
	static inline type svc_need_##name(const struct pc_ctx *ctx,           \
					   const char *user)                   \
	{                                                                      \
		return svc_need(ctx, SVC_##ID, user);                          \
	}
SVC_LIST(SVC_TYPED_)
#undef SVC_TYPED_

#endif /* PC_MODULES_SERVICES_H */
