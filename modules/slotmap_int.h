/*
 * modules/slotmap_int.h — the slotmap module's insides, shared by its two
 * files: modules/slotmap.c (the owner: this node's slot region, its
 * registration with the transport, the claims of remote writers, the
 * slot.* RPC methods, the lifecycle and the metrics) and
 * modules/slotmap_kv.c (the kv API of slotmap mode: sets, gets, exists and
 * deletes of a client, local or through the owners' slot.* methods and
 * one-sided reads of their regions). Nothing outside the module includes
 * it. docs/slotmap.md describes the protocol.
 */
#ifndef PC_MODULES_SLOTMAP_INT_H
#define PC_MODULES_SLOTMAP_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/budget.h"
#include "common/metrics.h"
#include "modules/kv.h"
#include "modules/module.h"
#include "modules/placement.h"
#include "modules/slotmap_wire.h"
#include "reactor/reactor.h"
#include "storage/slot_region.h"

#define SM_BATCH_MAX 1024 /* keys in one slot.* call */
#define SM_LAYOUTS 256    /* peers' layouts a reactor keeps (direct-mapped) */

struct rpc_client;
struct svc_transport;
struct svc_cluster;
struct ph_api;
struct mb_api;

/* Per reactor: the RPC client to owners and the layouts seen. (The blocks
 * the last calls gave back are the reactor's, rx_reactor_blocks: fresh
 * memory costs a page fault per 4 KiB on first touch — in a VM, more than
 * the copy itself.) */
struct sm_rx {
	struct rx_reactor *r;
	struct rpc_client *cl;
	struct sm_layout lay[SM_LAYOUTS];
};

/* The module's state (slotmap.c). */
struct sm_state {
	struct pc_ctx *ctx;
	bool on;                       /* mode = slotmap */
	struct slot_region *reg;
	uint8_t *base;
	uint64_t bytes;
	struct slot_layout lay;
	uint32_t rkey, wkey;
	const struct svc_transport *tp;
	const struct svc_cluster *cl;
	const struct ph_api *health;   /* or NULL */
	const struct mb_api *mb;
	struct sm_rx *rx;              /* per reactor */
	bool check_sum;                /* false: the tests' negative control */
	bool whole_reads;              /* tests: never ask for a selection */
	unsigned timeout_ms;           /* rpc_timeout */
	uint64_t deadline_ns;          /* request_deadline */
	struct pc_budget staging;      /* kv_staging_max */
	const char *secret;
	uint64_t msg_max;
	/* metrics */
	met_id rd_req, rd_hit, rd_miss, rd_local, rd_remote, rd_bytes;
	met_id src_local, src_remote, src_miss, src_rejected;
	met_id wr_req, wr_pages, wr_bytes, wr_local, wr_remote;
	met_id wr_fail_busy, wr_fail_big, wr_fail_remote;
	met_id ex_req, ex_found, del_req, lat_read, lat_write, deadline_hit;
	met_id claims, claims_expired, commits_refused, layouts_fetched;
	met_id copy_set, copy_get_local, copy_get_remote;
};

extern struct sm_state sm_st;
extern const struct kv_api sm_kv_api; /* slotmap_kv.c */

/* The layout entry of node on this reactor (valid or not). */
struct sm_layout *sm_layout_slot(struct sm_rx *x, const char *node);

/* Per-reactor parts of slotmap_kv.c. */
int sm_kv_start(struct rx_reactor *r);
void sm_kv_exit(struct rx_reactor *r);

#endif /* PC_MODULES_SLOTMAP_INT_H */
