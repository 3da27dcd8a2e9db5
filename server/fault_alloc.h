/*
 * server/fault_alloc.h — test-only allocation failures in peercached.
 *
 * Owns: the injection settings, read from PEERCACHE_TEST_ALLOC_FAULTS
 * ("rate=0.001,seed=7": each allocation fails with probability rate), and
 * the count of failures injected. Compiled in only with
 * PEERCACHE_FAULT_INJECTION (test builds): peercached is then linked with
 * -Wl,--wrap= for malloc, calloc, realloc, strdup, strndup and
 * posix_memalign, so only the
 * allocations the project's own code makes can fail (those inside libc,
 * liburing or msgpack-c's library are not wrapped), and they fail only
 * while armed: from the node's ready line to the start of its stop, so
 * that start-up and the clean stop a test checks are not the subject.
 * Otherwise every function is an inline no-op and the variable is never
 * read.
 */
#ifndef PC_SERVER_FAULT_ALLOC_H
#define PC_SERVER_FAULT_ALLOC_H

#include <stdint.h>

#ifdef PEERCACHE_FAULT_INJECTION
/* Read the settings and start failing (logs a warning when it is on). */
void pc_fault_alloc_arm(void);
/* Stop failing; the number of allocations failed. */
uint64_t pc_fault_alloc_disarm(void);
#else
static inline void pc_fault_alloc_arm(void) {}
static inline uint64_t pc_fault_alloc_disarm(void) { return 0; }
#endif

#endif /* PC_SERVER_FAULT_ALLOC_H */
