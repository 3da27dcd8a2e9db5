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
 *
 * Pairing: a TCP client that looks pages up on the RPC port and then reads
 * them on the data port is served best when one reactor serves both of its
 * connections: otherwise every batch wakes both reactors, and each lookup
 * may wait behind another client's reads on the reactor it met. Placed
 * independently, a reader's two connections met different reactors in
 * every one of 12 runs of p2p_bench's 2-reader case, where lookups and
 * reads on one reactor doubled its throughput (bench/README.md, "p2p read
 * path"). So the RPC port's spread leads: it notes where it placed each
 * TCP client. The data port's follows: a new data connection goes to the
 * reactor of the oldest unpaired RPC client of the same address (the
 * host, not the port) that is still connected and at most
 * PC_SPREAD_PAIR_NS old; with none, to the least-loaded reactor as above.
 * Only the oldest candidate is checked for liveness (a dead one is closed
 * and the next tried), so a data connection costs one check however many
 * RPC connections its host holds open.
 * A wrong pair costs what independent placement costs, nothing more. So
 * does the rare client the RPC server hands on to another reactor after
 * its placement (rpc_server_set_post, only while a connection cap is
 * full): its note still names the reactor placed first.
 */
#ifndef PC_MODULES_SPREAD_H
#define PC_MODULES_SPREAD_H

#include <stdint.h>

#include "modules/module.h"

/* How a spread takes part in pairing (above). */
enum pc_spread_pair {
	PC_SPREAD_ALONE,  /* neither notes nor follows (the Unix socket) */
	PC_SPREAD_LEAD,   /* notes where each client went (RPC over TCP) */
	PC_SPREAD_FOLLOW, /* places a client by the lead's notes (data port) */
};

/* How long a lead's note may wait for its follower. */
#define PC_SPREAD_PAIR_NS (10ull * 1000000000ull)

struct pc_spread {
	enum pc_spread_pair pair;
	/* Connections of this kind that reactor i serves now (a gauge). */
	uint64_t (*load)(unsigned i);
	/* Serve fd on r (r's thread); r is stopping: close fd instead. */
	void (*serve)(struct rx_reactor *r, int fd);
	uint64_t *handing; /* per reactor, atomic: handed, not yet served */
	unsigned next;     /* atomic: where ties start */
	uint64_t paired;   /* atomic: followers placed by a lead's note */
	uint64_t checks;   /* atomic: notes checked for liveness (2 syscalls) */
};

/* Set up sp for ctx->threads reactors: 0 or -ENOMEM. */
int pc_spread_init(struct pc_spread *sp, struct pc_ctx *ctx,
		   enum pc_spread_pair pair, uint64_t (*load)(unsigned i),
		   void (*serve)(struct rx_reactor *r, int fd));
/* Free what init took (also after a failed or no init: sp zeroed). */
void pc_spread_fini(struct pc_spread *sp);
/* fd was accepted on here: serve it on the least-loaded reactor (here,
 * before the reactors all run, or when a hand-off cannot be sent). */
void pc_spread_accept(struct pc_spread *sp, struct pc_ctx *ctx,
		      struct rx_reactor *here, int fd);

#endif /* PC_MODULES_SPREAD_H */
