/*
 * common/unproven.c — see unproven.h.
 */
#include <stdlib.h>
#include <string.h>

#include "common/unproven.h"

struct pc_unproven *pc_unproven_new(unsigned nreactors)
{
	size_t n = nreactors ? nreactors : 1;
	struct pc_unproven *u = aligned_alloc(_Alignof(struct pc_unproven),
					      n * sizeof(*u));
	if (u)
		memset(u, 0, n * sizeof(*u));
	return u;
}

void pc_unproven_set(struct pc_unproven *u, uint64_t n, uint64_t drop_ns)
{
	__atomic_store_n(&u->n, n, __ATOMIC_RELAXED);
	__atomic_store_n(&u->drop_ns, drop_ns, __ATOMIC_RELAXED);
}

int pc_unproven_pick(const struct pc_unproven *per, unsigned nreactors,
		     unsigned here, uint64_t now_ns)
{
	int best = -1;
	uint64_t best_n = 0;
	for (unsigned i = 0; i < nreactors; i++) {
		uint64_t n = __atomic_load_n(&per[i].n, __ATOMIC_RELAXED);
		uint64_t t = __atomic_load_n(&per[i].drop_ns,
					     __ATOMIC_RELAXED);
		if (i != here && t && t <= now_ns && n > best_n) {
			best = (int)i;
			best_n = n;
		}
	}
	return best;
}
