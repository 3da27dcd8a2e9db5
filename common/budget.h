/*
 * common/budget.h — a byte budget many threads take from: bytes are held
 * up to a cap and given back, with no lock (one atomic counter).
 *
 * Owns: the counter. Any thread. Used for kv_staging_max, the bytes every
 * kv.* and get call of a node holds at once (modules/kv.c in p2p mode,
 * modules/slotmap_kv.c in slotmap mode).
 */
#ifndef PC_COMMON_BUDGET_H
#define PC_COMMON_BUDGET_H

#include <stdint.h>

struct pc_budget {
	uint64_t max;  /* the cap */
	uint64_t used; /* atomic: bytes held now */
};

static inline void pc_budget_init(struct pc_budget *b, uint64_t max)
{
	b->max = max;
	b->used = 0;
}

/* Hold bytes: 0, or -EBUSY (nothing held) when they would pass the cap. */
int pc_budget_hold(struct pc_budget *b, uint64_t bytes);
/* Give back bytes held (never more than were). */
void pc_budget_release(struct pc_budget *b, uint64_t bytes);
uint64_t pc_budget_used(const struct pc_budget *b);
/* Export the bytes held as the gauge name (common/metrics.h). */
void pc_budget_metric(const struct pc_budget *b, const char *name,
		      const char *help);

#endif /* PC_COMMON_BUDGET_H */
