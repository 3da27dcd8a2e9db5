/*
 * common/arena.h — one allocation for all of a call's state.
 *
 * Owns: nothing global; an arena is the caller's. A call that needs many
 * arrays (a batch of n keys: records, flags, key copies, ...) lays them out
 * twice with the same code: once to measure (pc_arena_plan: nothing is
 * allocated, pc_arena_take returns NULL and only counts), then for real
 * (pc_arena_alloc: one zeroed allocation of what the plan counted, then
 * pc_arena_take carves it in the same order). The whole lot is freed with
 * one free() of pc_arena_base(). Threading: none (caller's memory).
 *
 * Invariants: pieces are PC_ARENA_ALIGN-aligned and never overlap; in the
 * real pass the takes never go past what the plan counted (asserted), so
 * both passes must take the same sizes in the same order.
 */
#ifndef PC_COMMON_ARENA_H
#define PC_COMMON_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define PC_ARENA_ALIGN 16u

struct pc_arena {
	uint8_t *base; /* NULL while planning */
	size_t used;
	size_t cap;    /* planned bytes (real pass) */
};

/* Start measuring. */
void pc_arena_plan(struct pc_arena *a);
/* One zeroed allocation of what was measured; the takes start over.
 * Returns the base (to free), or NULL (out of memory). */
void *pc_arena_alloc(struct pc_arena *a);
/* The next n bytes (aligned); NULL while planning. n may be 0. */
void *pc_arena_take(struct pc_arena *a, size_t n);

#endif /* PC_COMMON_ARENA_H */
