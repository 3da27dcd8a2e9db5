/*
 * reactor/fault.h — test-only fault injection in the reactor's socket I/O.
 *
 * Owns: the injection settings, read once from PEERCACHE_TEST_REACTOR_FAULTS
 * ("rate=0.01,seed=7": each decision below fails with probability rate),
 * and a random stream per thread. Compiled in only with
 * PEERCACHE_FAULT_INJECTION (test builds, CMakeLists.txt); otherwise every
 * function is an inline no-op and the variable is never read.
 *
 * Every fault is one the kernel could produce, injected where it keeps the
 * byte stream intact: a submission refused as if the SQ stayed full (the
 * connection op fails with -EBUSY), a socket send or read submitted for
 * fewer bytes than asked (a true short write or read: the completion
 * handler continues where it stopped), and a send or read completion turned
 * into -ECONNRESET after the kernel moved its bytes (the connection closes,
 * as when a peer resets right after). Listeners, fd watches, file I/O and
 * the loop's own eventfd are never touched: their failure modes are tested
 * elsewhere (the disk tier's hook) or would only wedge the test.
 */
#ifndef PC_REACTOR_FAULT_H
#define PC_REACTOR_FAULT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef PEERCACHE_FAULT_INJECTION
/* Read the settings (idempotent; logs a warning when injection is on). */
void rx_fault_init(void);
/* True: refuse this connection op's submission. */
bool rx_fault_sqe(void);
/* len, or fewer bytes (at least 1) for a short send or read. */
size_t rx_fault_len(size_t len);
/* res, or -ECONNRESET in place of a send's or read's result. */
int rx_fault_res(int res);
#else
static inline void rx_fault_init(void) {}
static inline bool rx_fault_sqe(void) { return false; }
static inline size_t rx_fault_len(size_t len) { return len; }
static inline int rx_fault_res(int res) { return res; }
#endif

#endif /* PC_REACTOR_FAULT_H */
