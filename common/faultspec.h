/*
 * common/faultspec.h — the settings and random streams of the test-only
 * fault injectors (reactor/fault.h, server/fault_alloc.h).
 *
 * Owns: parsing "rate=R,seed=S" from an environment variable, and a
 * seeded splitmix64 stream per thread and injector (the caller keeps the
 * thread's state in a _Thread_local of its own). Built only with
 * PEERCACHE_FAULT_INJECTION (test builds).
 */
#ifndef PC_COMMON_FAULTSPEC_H
#define PC_COMMON_FAULTSPEC_H

#include <stdbool.h>
#include <stdint.h>

struct pc_fault_spec {
	uint32_t threshold; /* a draw below it is a hit; 0: off */
	uint64_t seed;
	unsigned threads;   /* streams handed out (atomic) */
	double rate;
};

/* Read var ("rate=0.01,seed=7"; seed 1 when left out). True when it asks
 * for a rate above 0 (then sp is filled; a rate over 1 counts as 1). */
bool pc_fault_spec_read(const char *var, struct pc_fault_spec *sp);
/* The next number of this thread's stream (*state 0: a fresh stream). */
uint64_t pc_fault_draw(struct pc_fault_spec *sp, uint64_t *state);
/* True with probability rate. */
bool pc_fault_hit(struct pc_fault_spec *sp, uint64_t *state);

#endif /* PC_COMMON_FAULTSPEC_H */
