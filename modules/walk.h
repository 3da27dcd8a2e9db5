/*
 * modules/walk.h — walks over a call's keys cut into slices of loop passes,
 * so that a batch of 65,536 keys never holds its reactor for long.
 *
 * Owns: per reactor thread, how many keys the current loop pass walked
 * (over every call of every module that walks here: kv's pool walks, the
 * directory's rounds), and a count of the walks that stopped for the next
 * pass. Threads: a reactor thread; walk_yields_total from any.
 *
 * Invariants:
 *  - a pass walks at most WALK_PASS_KEYS keys over all calls (~0.1-0.3 ms
 *    at the 0.15-0.5 us a key costs when its entries are not in cache) —
 *    with a time cap (walk_set_pass_max) fewer when its keys cost more (a
 *    set whose every page evicts one from a full pool: ~10 us a key) —
 *    besides up to WALK_MIN_KEYS for each walk resumed in it: a walk that
 *    goes on in the next pass always makes progress there, whatever the
 *    others took (walks resumed in one pass fire in the order they
 *    stopped, so they also take the budget in turn);
 *  - a walk that stops (walk_take false) goes on from its own zero-delay
 *    timer (walk_later: arming one never fails), in the next pass; its
 *    call's state must hold everything the walk needs meanwhile (keys
 *    copied into the call's arena, never a caller's buffer that is only
 *    valid during the call).
 */
#ifndef PC_MODULES_WALK_H
#define PC_MODULES_WALK_H

#include <stdbool.h>
#include <stdint.h>

#include "reactor/reactor.h"

#define WALK_PASS_KEYS 512
#define WALK_MIN_KEYS 64

/* The *here a walk starts a pass with: resumed (from its walk_later
 * timer) it may take WALK_MIN_KEYS whatever the pass's budget says; a walk
 * that starts in a call or a completion gets only what the budget has. */
static inline unsigned walk_here(bool resumed)
{
	return resumed ? 0 : WALK_MIN_KEYS;
}

/* May a walk that already took *here keys in this pass take one more?
 * Counts it (in *here and the pass's total) when so. */
bool walk_take(struct rx_reactor *r, unsigned *here);

/* Also end a pass's walks once it ran ns since its first walked key
 * (checked every 16 keys); 0, the default: WALK_PASS_KEYS alone. Main
 * thread, before the reactors start. */
void walk_set_pass_max(uint64_t ns);

/* Go on with a walk in the next pass: t (the call's own) fires fn there. */
void walk_later(struct rx_reactor *r, struct rx_timer *t,
		void (*fn)(struct rx_reactor *r, struct rx_timer *t));

/* Walks that stopped for the next pass, all threads, since start. */
uint64_t walk_yields_total(void);

#endif /* PC_MODULES_WALK_H */
