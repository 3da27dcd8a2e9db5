/*
 * modules/transport_revoke.c — peers' access to this node's memory follows
 * membership (module "transport_revoke").
 *
 * Owns: one membership subscription. When a member leaves, the transport
 * takes back what it granted to peers so far (tp_ops.revoke: RDMA gives
 * every region new rkeys and closes every accepted queue pair; the
 * remaining members connect and authenticate again, and their reads in
 * flight are sent again once). A node that left, or was removed with a
 * cluster_secret changed, keeps nothing it could still read with. Region
 * keys stay, so no record is republished. A transport without revoke (TCP,
 * whose peers hold nothing past their connections) leaves the module
 * idle.
 *
 * Threading: the event runs on every reactor; the transport acts on the
 * reactor that accepts peers, once per membership epoch.
 */
#include <errno.h>

#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/transport.h"

static const struct svc_transport *tp;

static void on_leave(struct rx_reactor *r, enum mb_event ev, const char *peer,
		     uint64_t epoch, void *arg)
{
	(void)ev;
	(void)peer;
	(void)arg;
	tp->ops->revoke(tp->node, r, epoch);
}

static int tr_init(struct pc_ctx *ctx)
{
	tp = svc_need_transport(ctx, "transport_revoke");
	if (!tp)
		return -ENOENT;
	const struct mb_api *mb = svc_find_membership(ctx);
	if (!tp->ops->revoke || !mb)
		return 0;
	return mb->subscribe(MB_ON(MB_LEAVE), on_leave, NULL);
}

const struct pc_module pc_mod_transport_revoke = {
	.name = "transport_revoke",
	.init = tr_init,
};
