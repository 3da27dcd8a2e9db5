/*
 * reactor/group.h — a set of reactor threads, one reactor each.
 *
 * Owns: the threads and their reactors' lifetimes. Threading: start, stop and
 * wait are called from one controlling thread (main); the hooks run on each
 * reactor thread. Reactors start one after another, so the first reactor can
 * bind port 0 and the next ones reuse the port it got (SO_REUSEPORT).
 */
#ifndef PC_REACTOR_GROUP_H
#define PC_REACTOR_GROUP_H

#include "reactor.h"

struct rx_group;

struct rx_group_hooks {
	/* On each reactor thread once its ring exists, before its loop runs.
	 * A negative return fails the whole start. */
	int (*thread_start)(struct rx_reactor *r, void *arg);
	/* On each reactor thread when shutdown begins (before the reactor
	 * closes what is left). */
	void (*thread_stop)(struct rx_reactor *r, void *arg);
	/* On each reactor thread after its loop drained, before it is freed. */
	void (*thread_exit)(struct rx_reactor *r, void *arg);
	void *arg;
};

/*
 * Start n reactor threads (named "r0".."r<n-1>" in logs). Returns 0 once all
 * of them run their loops, or the first error after stopping those that had
 * started.
 */
int rx_group_start(struct rx_group **out, unsigned n, const struct rx_params *p,
		   const struct rx_group_hooks *hooks);
/* Ask every reactor to stop (any thread; repeated calls are harmless). */
void rx_group_stop(struct rx_group *g);
/* True once every reactor thread has finished. */
bool rx_group_done(struct rx_group *g);
/* Join all threads and free the group; returns the first loop error. */
int rx_group_join(struct rx_group *g);

unsigned rx_group_size(const struct rx_group *g);
/* Sum of the counters of every live reactor (any thread). */
void rx_group_stats(struct rx_group *g, struct rx_stats *sum);
/* The reactor of thread i; valid from start until join. Only for rx_post()
 * (and for reading its stats) from other threads. */
struct rx_reactor *rx_group_reactor(const struct rx_group *g, unsigned i);
/* rx_post() to thread i's reactor while that thread runs it: 0, or
 * -ESHUTDOWN once it has finished (its reactor may be freed), -EINVAL for no
 * such thread, -ENOMEM. Safe from any thread, also during shutdown, when
 * reactors end one by one and rx_group_reactor() may already be NULL. */
int rx_group_post(struct rx_group *g, unsigned i,
		  void (*fn)(struct rx_reactor *r, void *arg), void *arg);

#endif /* PC_REACTOR_GROUP_H */
