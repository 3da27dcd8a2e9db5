/*
 * server/module_list.c — the one place that lists the modules a node runs.
 *
 * Order matters: modules start in this order and stop in reverse, so a module
 * that serves others (the RPC server) comes before the modules using it.
 */
#include "modules/modules.h"
#include "server/server.h"

const struct pc_module *const pc_node_modules[] = {
	&pc_mod_metrics,
	&pc_mod_stats_log,
	&pc_mod_rpc_server,
	&pc_mod_node,
	&pc_mod_transport, /* data port; before cluster (needs its port) */
	&pc_mod_cluster,   /* membership and the ring */
	&pc_mod_transport_revoke, /* a departure revokes peers' RDMA
				   * access (needs the transport and cluster) */
	&pc_mod_directory, /* records; before kv, which publishes them */
	&pc_mod_kv,        /* p2p: the pool, moving pages (the "kv" service) */
	&pc_mod_slotmap,   /* slotmap mode: the slot region; the "kv" service
			    * in that mode (inactive in p2p) */
	/* kv_rpc binds to whichever module published "kv" (kv in p2p,
	 * slotmap in slotmap), so every mode's "kv" provider comes before it */
	&pc_mod_kv_rpc,    /* the kv.* methods over the "kv" service */
	&pc_mod_disk,      /* the disk tier (needs kv's pool; kv finds it
			    * as the "tier" service when it starts) */
	&pc_mod_republish, /* records to new owners after a change (needs kv) */
	&pc_mod_session,   /* local clients' shared memory (needs kv) */
	&pc_mod_discovery, /* members found at run time (drives cluster);
			    * last, so it stops first: deregisters at once */
};

const size_t pc_node_modules_count =
	sizeof(pc_node_modules) / sizeof(pc_node_modules[0]);
