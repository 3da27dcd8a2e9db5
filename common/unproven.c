/*
 * common/unproven.c — see unproven.h.
 */
#include "common/unproven.h"

void pc_unproven_set(struct pc_unproven *u, uint64_t n, uint64_t oldest_ns)
{
	__atomic_store_n(&u->n, n, __ATOMIC_RELAXED);
	__atomic_store_n(&u->oldest_ns, oldest_ns, __ATOMIC_RELAXED);
}

int pc_unproven_pick(const struct pc_unproven *per, unsigned nreactors,
		     unsigned here, uint64_t cut_ns)
{
	int best = -1;
	uint64_t best_n = 0;
	for (unsigned i = 0; i < nreactors; i++) {
		uint64_t n = __atomic_load_n(&per[i].n, __ATOMIC_RELAXED);
		uint64_t t = __atomic_load_n(&per[i].oldest_ns,
					     __ATOMIC_RELAXED);
		if (i != here && t && t <= cut_ns && n > best_n) {
			best = (int)i;
			best_n = n;
		}
	}
	return best;
}
