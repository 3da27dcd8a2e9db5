/*
 * modules/spread.h — spreading accepted connections over the reactors.
 *
 * Owns: nothing global; a struct pc_spread belongs to the module whose
 * listener uses it (rpc_server for RPC clients, transport for the data
 * port). Threading: pc_spread_accept runs on the accepting reactor (any
 * reactor: TCP listeners are one per reactor); the chosen reactor serves the
 * connection from a cross-thread message (one per connection, never per
 * request). load() and the handing counters are read from any thread.
 *
 * Why: the kernel spreads connections over SO_REUSEPORT listeners by a hash
 * of their addresses, and the Unix socket has one listener, so a few clients
 * often share one reactor while another idles. The accepting reactor hands
 * each new connection to the reactor with the lowest load() plus the
 * connections already on their way there; ties go round-robin.
 */
#ifndef PC_MODULES_SPREAD_H
#define PC_MODULES_SPREAD_H

#include <stdint.h>

#include "modules/module.h"

struct pc_spread {
	/* Connections of this kind that reactor i serves now (a gauge). */
	uint64_t (*load)(unsigned i);
	/* Serve fd on r (r's thread); r is stopping: close fd instead. */
	void (*serve)(struct rx_reactor *r, int fd);
	uint64_t *handing; /* per reactor, atomic: handed, not yet served */
	unsigned next;     /* atomic: where ties start */
};

/* Set up sp for ctx->threads reactors: 0 or -ENOMEM. */
int pc_spread_init(struct pc_spread *sp, struct pc_ctx *ctx,
		   uint64_t (*load)(unsigned i),
		   void (*serve)(struct rx_reactor *r, int fd));
/* Free what init took (also after a failed or no init: sp zeroed). */
void pc_spread_fini(struct pc_spread *sp);
/* fd was accepted on here: serve it on the least-loaded reactor (here,
 * before the reactors all run, or when a hand-off cannot be sent). */
void pc_spread_accept(struct pc_spread *sp, struct pc_ctx *ctx,
		      struct rx_reactor *here, int fd);

#endif /* PC_MODULES_SPREAD_H */
