/*
 * modules/discovery_int.h — what the discovery module's two backends share
 * (internal to modules/discovery*.c; docs/discovery.md).
 *
 * discovery.c owns the module (settings, metrics of the view, the view
 * itself, discovery.view on the RPC port, and giving the view to the ring
 * through svc_cluster.set_members) and the embedded backend. With
 * discovery_backend = etcd, discovery.c's hooks call the etcd backend
 * (discovery_etcd.c), which runs on a thread of its own and hands each
 * member list it reads from etcd to disc_view_adopt.
 *
 * Threading: disc_view_adopt and disc_view_reapply run on the backend's
 * thread only (the one thread that gives views to the ring); the disc_etcd_*
 * hooks run where the module's hooks run (init / fini on the main thread,
 * start / stop on reactor 0).
 */
#ifndef PC_MODULES_DISCOVERY_INT_H
#define PC_MODULES_DISCOVERY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "modules/discovery_wire.h" /* DISC_ADDR_MAX, disc_addr_ok */
#include "modules/module.h"

/* Parse a list of "host:port" separated by commas or blanks into
 * out[*n..max), logging what is wrong as "<setting>: '...' is not <what>":
 * 0, -EINVAL, -E2BIG. */
int disc_parse_addrs(const char *list, const char *setting,
		     const char *what, char (*out)[DISC_ADDR_MAX],
		     unsigned max, unsigned *n);

/* Make ids[0..n) (ring ids, n <= DISC_MEMBERS_MAX) the view, with this
 * epoch and source (shown by discovery.view and `peercache members`), and
 * give it to the ring if the set changed. 0 or -ENOMEM / -E2BIG. */
int disc_view_adopt(const char (*ids)[DISC_ADDR_MAX], unsigned n,
		    uint64_t epoch, const char *from);
/* Give the current view to the ring again if the last try found the
 * cluster busy (cheap when nothing changed). */
void disc_view_reapply(void);

/* The etcd backend (discovery_etcd.c): parse its settings and register its
 * metrics; start its thread for this node (ids known from the cluster's
 * start on); ask it to leave (revoke the lease) and stop; join it and free
 * everything. */
int disc_etcd_init(struct pc_ctx *ctx);
int disc_etcd_start(const char *self_id, const char *self_data);
void disc_etcd_stop(void);
void disc_etcd_fini(void);

#endif
