/*
 * modules/membership.h — who is in the cluster, for the modules that care:
 * the current ring (with its epoch) and membership events.
 *
 * Owns: the interface only; the cluster module (modules/cluster.c) owns
 * membership and implements it, offered as the "membership" service
 * (modules/services.h).
 * Peer health queries (suspect, failed) stay in modules/peer_health.h; the
 * events of this header are the only way a module hears about a change.
 *
 * Ring epochs and lifetime (an RCU-like per-reactor grace scheme plus a
 * reference count, storage/ring.h):
 *  - The ring is immutable. A change (cluster.set_peers, a SIGHUP reload)
 *    builds a new ring with epoch + 1 and publishes it as a whole; epochs
 *    are local to the node, start at 1 and only grow.
 *  - ring() returns the current ring; on a reactor thread the pointer stays
 *    valid until the reactor callback that called ring() returns: the
 *    cluster drops its reference on a replaced ring only after every
 *    reactor has run a message posted after the swap (a quiescent point).
 *  - Anything that keeps the ring past that callback (across an RPC round
 *    trip, a timer, another reactor) takes a reference with ring_ref() and
 *    drops it with ring_unref(). Never a bare pointer across a round trip.
 *  - Member indexes are only meaningful within one ring: keep the ring (or
 *    the member ids) with them.
 *
 * Events: subscribe() registers fn (main thread, a module's init, after the
 * cluster's init). Each event runs fn on every reactor, on its own thread,
 * soon after it happened, in the order the reactor received them:
 *   MB_JOIN     peer is a member from epoch `epoch` on
 *   MB_LEAVE    peer is no longer a member from epoch `epoch` on: fail what
 *               still waits for it (in-flight reads, RPCs) at once
 *   MB_SUSPECT  peer did not answer a call (peer_health.h); skipped by the
 *               time fn runs unless it answered a probe meanwhile (then
 *               the event is not delivered)
 *   MB_RECOVER  a suspect peer answered a probe and is healthy again
 * peer is valid only during the call. fn must be quick (a reactor
 * callback: no blocking, no long walks) and must not subscribe. While a
 * reactor shuts down, events are no longer delivered to it.
 */
#ifndef PC_MODULES_MEMBERSHIP_H
#define PC_MODULES_MEMBERSHIP_H

#include <stdint.h>

#include "reactor/reactor.h"

struct ring; /* storage/ring.h */

enum mb_event {
	MB_JOIN = 0,
	MB_LEAVE = 1,
	MB_SUSPECT = 2,
	MB_RECOVER = 3,
	MB_EVENTS = 4, /* count */
};

/* Subscription masks. */
#define MB_ON(ev) (1u << (ev))
#define MB_ON_ALL ((1u << MB_EVENTS) - 1u)

typedef void (*mb_event_fn)(struct rx_reactor *r, enum mb_event ev,
			    const char *peer, uint64_t epoch, void *arg);

struct mb_api {
	/* The current ring (see the lifetime rules above), or NULL before
	 * the cluster module started. Reactor threads. */
	struct ring *(*ring)(void);
	/* The current epoch (0 before the first ring). Any thread. */
	uint64_t (*epoch)(void);
	/* Run fn for the events in mask (MB_ON(MB_LEAVE) | ...). Main
	 * thread, in init. Returns 0 or -ENOSPC (at most 8 subscribers). */
	int (*subscribe)(unsigned mask, mb_event_fn fn, void *arg);
};

/* "join", "leave", "suspect", "recover" (logs and metric labels). */
static inline const char *mb_event_name(enum mb_event ev)
{
	static const char *const names[MB_EVENTS] = {"join", "leave",
						     "suspect", "recover"};
	return (unsigned)ev < MB_EVENTS ? names[ev] : "?";
}

#endif /* PC_MODULES_MEMBERSHIP_H */
