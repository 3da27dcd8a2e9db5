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
 * handler continues where it stopped), a send, read or receive completion
 * turned into an error after the kernel moved its bytes (-ECONNRESET,
 * -ETIMEDOUT or -EIO: the connection closes, as when a peer resets right
 * after; a receive's provided buffer goes back to the ring), and the
 * receive buffers of a loop pass held back until a later pass (with a
 * small ring, reactor_buf_count = 16, receives then find it really empty:
 * the -ENOBUFS path). Listeners, fd watches, file I/O and the loop's own
 * eventfd are never touched: their failure modes are tested elsewhere (the
 * disk tier's hook) or would only wedge the test. Allocation failures are
 * server/fault_alloc.h's.
 */
#ifndef PC_REACTOR_FAULT_H
#define PC_REACTOR_FAULT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef PEERCACHE_FAULT_INJECTION
/* Read the settings (idempotent; logs a warning when injection is on). */
void rx_fault_init(void);
/* True: refuse this connection op's submission. */
bool rx_fault_sqe(void);
/* len, or fewer bytes (at least 1) for a short send or read. */
size_t rx_fault_len(size_t len);
/* res, or an error (rx_fault_err) in place of a completion's result. */
int rx_fault_res(int res);
/* One of the errors a socket completion can report. */
int rx_fault_err(void);
/* True: keep this pass's returned receive buffers for a later pass. */
bool rx_fault_hold(void);
#else
static inline void rx_fault_init(void) {}
static inline bool rx_fault_sqe(void) { return false; }
static inline size_t rx_fault_len(size_t len) { return len; }
static inline int rx_fault_res(int res) { return res; }
static inline int rx_fault_err(void) { return -ECONNRESET; }
static inline bool rx_fault_hold(void) { return false; }
#endif

#endif /* PC_REACTOR_FAULT_H */
