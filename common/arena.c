/*
 * common/arena.c — one allocation for all of a call's state (see arena.h).
 *
 * Owns: nothing global. Threading: none. Invariant: a real pass never takes
 * more than its plan measured.
 */
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/util.h"

static size_t align_up(size_t n)
{
	return (n + PC_ARENA_ALIGN - 1) & ~(size_t)(PC_ARENA_ALIGN - 1);
}

void pc_arena_plan(struct pc_arena *a)
{
	memset(a, 0, sizeof(*a));
}

void *pc_arena_alloc(struct pc_arena *a)
{
	PC_ASSERT(a->base == NULL);
	a->cap = a->used ? a->used : PC_ARENA_ALIGN;
	a->used = 0;
	a->base = calloc(1, a->cap);
	return a->base;
}

void *pc_arena_take(struct pc_arena *a, size_t n)
{
	size_t at = a->used;
	a->used = align_up(at + n);
	if (!a->base)
		return NULL;
	PC_ASSERT(a->used <= a->cap);
	return a->base + at;
}
