/*
 * common/guard.h — copies that survive a client shrinking shared memory.
 *
 * Owns: the process's SIGBUS handler (installed once, chaining to the
 * previous disposition for faults it does not own). Threading: any thread;
 * the state of a guarded copy is thread-local.
 *
 * Why: local clients share memory with the node through memfds. A client
 * (or a bug in one) can truncate its memfd while the node copies to or from
 * the mapping, and touching pages past the new end raises SIGBUS. A node
 * serving many clients must not die for one: every copy that touches client
 * memory goes through pc_guarded_copy, which turns that SIGBUS into -EFAULT
 * for the one request. A SIGBUS outside a guarded copy is not ours and keeps
 * its default meaning (the process dies with a core dump).
 */
#ifndef PC_COMMON_GUARD_H
#define PC_COMMON_GUARD_H

#include <stddef.h>

/* Install the handler (idempotent, thread-safe). 0 or -errno. */
int pc_guard_init(void);

/* memcpy that returns -EFAULT instead of dying when the source or the
 * destination mapping is cut short under it; 0 on success. */
int pc_guarded_copy(void *dst, const void *src, size_t n);

/* Run fn(arg) the same way (for anything else that reads client memory,
 * e.g. a checksum); 0, or -EFAULT when it was cut short. fn must not take
 * locks or allocate: it may be abandoned mid-way. */
int pc_guarded_run(void (*fn)(void *arg), void *arg);

#endif /* PC_COMMON_GUARD_H */
