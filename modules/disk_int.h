/*
 * modules/disk_int.h — what the parts of the disk module (modules/disk.c:
 * the store, write-through, local promotion; modules/disk_remote.c: the
 * disk.promote RPC and the remote promotions a reader asks for) say to
 * each other. Nothing outside the module includes it.
 *
 * Threading: as modules/disk.c — every call on a reactor thread, its
 * callbacks on the reactor that asked.
 */
#ifndef PC_MODULES_DISK_INT_H
#define PC_MODULES_DISK_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "modules/module.h"
#include "modules/placement.h"
#include "reactor/reactor.h"
#include "rpc/rpc.h"

/* A promotion's outcome for a waiter: res 0 and rec the page's resident
 * record (this node's), or -errno. rec is valid during the call only. */
typedef void (*disk_promoted_fn)(void *arg, int res,
				 const struct dir_rec *rec);

/*
 * Bring this node's page of key into the pool for a waiter on r that
 * needs its resident record (a peer's disk.promote). 1: the pool holds it
 * already, *rec filled, done does not run. 0: a promotion started or one
 * under way (on any reactor) is shared; done runs once, later, on r.
 * -errno: not started (-ENOENT: not on disk, -EBUSY: promotions hold
 * their share of the pool, -ENOTSUP: no disk tier), done does not run.
 */
int disk_promote_wait(struct rx_reactor *r, const char *key, size_t klen,
		      struct dir_rec *rec, disk_promoted_fn done, void *arg);

/* disk_remote.c: lifecycle, called by the disk module's own hooks.
 * disk_remote_init registers the metrics (the producer's only with
 * disk_on) and fills ops->promote_remote; start, stop and exit run on
 * every reactor, disk tier on or off. */
struct tier_ops;
int disk_remote_init(struct pc_ctx *ctx, struct tier_ops *ops,
		     bool disk_on);
int disk_remote_start(struct rx_reactor *r);
void disk_remote_stop(struct rx_reactor *r);
void disk_remote_exit(struct rx_reactor *r);
void disk_remote_fini(void);

/* The disk.promote method (disk_remote.c). */
extern const struct rpc_method disk_rpc_methods[];

#endif /* PC_MODULES_DISK_INT_H */
