/*
 * tests/fake/transport_fake.h — an in-process transport for tests: the same
 * struct tp_ops as TCP, with no sockets, and faults on demand.
 *
 * Owns: fake nodes (a region table each, reachable under an endpoint name
 * in a process-wide list) and fake clients (one per reactor). Threading: a
 * client lives on its reactor and completes operations from timers there;
 * nodes may be created, killed and freed from any thread (the list locks).
 *
 * Faults (struct tp_fake_opts, per client, changeable at any time): a base
 * latency plus random jitter per operation; drops (never answered: the
 * batch's timeout, a cancel or a peer close ends them); errors (answered
 * with error_errno); partial reads (half the bytes land, then -EIO, as when
 * a connection dies mid-payload); reordering (operations of one channel
 * complete in random order instead of one after another). Each peer has up
 * to max_chans channels, each serving its operations in order.
 */
#ifndef PC_TESTS_FAKE_TRANSPORT_FAKE_H
#define PC_TESTS_FAKE_TRANSPORT_FAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modules/transport.h"

struct tp_fake_opts {
	unsigned latency_us;   /* per operation on its channel */
	unsigned jitter_us;    /* + uniform 0..jitter_us */
	unsigned drop_pct;     /* 0..100: never answered */
	unsigned error_pct;    /* 0..100: answered with error_errno */
	int error_errno;       /* negative; 0 means -EIO */
	unsigned partial_pct;  /* 0..100 of reads: half the bytes, -EIO */
	bool reorder;          /* a channel completes in random order */
	unsigned max_chans;    /* per-peer channel cap; 0 means 16 */
	uint64_t seed;         /* of the fault dice; 0 means 1 */
};

extern const struct tp_ops tp_fake_ops;

/* A node reachable as endpoint (unique); 0, -EEXIST, -ENOMEM. */
int tp_fake_node_new(const char *endpoint, struct tp_node **out);
/* The node stops answering: operations reaching it wait (a black hole). */
void tp_fake_node_silence(struct tp_node *tn);
/* The node departs: operations reaching it from now on fail with
 * -ECONNRESET (those waiting on drops too, within ~10 ms). */
void tp_fake_node_kill(struct tp_node *tn);
/* Kill, unlist and free (its regions are deregistered). */
void tp_fake_node_free(struct tp_node *tn);

/* The length registered with reg_local at base (0: none), and how many
 * ranges are registered (the fake only records them). Any thread. */
size_t tp_fake_node_local(struct tp_node *tn, const void *base);
unsigned tp_fake_node_locals(struct tp_node *tn);

/* A client on reactor r (its thread). */
struct tp_client *tp_fake_client_new(struct rx_reactor *r,
				     const struct tp_fake_opts *o);
void tp_fake_client_set(struct tp_client *tc, const struct tp_fake_opts *o);
/* Operations (reads and writes) placed on a channel and not finished yet:
 * waiting out their latency, dropped or held by a silent node. Any thread
 * may read it (a test waits for its calls to be on their way, or over). */
unsigned tp_fake_client_inflight(const struct tp_client *tc);
/* The reactor stops (from a module's stop hook, as TCP closes its
 * channels then): every operation in flight ends with -ESHUTDOWN, from
 * 0-delay timers, which the draining loop still runs. */
void tp_fake_client_stop(struct tp_client *tc);
/* After every batch finished. */
void tp_fake_client_free(struct tp_client *tc);

#endif /* PC_TESTS_FAKE_TRANSPORT_FAKE_H */
