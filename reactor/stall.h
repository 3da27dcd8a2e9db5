/*
 * reactor/stall.h — the stall detector: how long each reactor callback and
 * each loop pass took, in the spirit of Seastar's reactor stall reports.
 *
 * Owns: the stall threshold, the per-reactor iteration-time histogram, the
 * stall and busy-time counters (common/metrics.h, registered once by
 * rx_stall_setup), and the tag the layers above name their work with.
 * Threading: rx_stall_setup on the main thread before met_start(); the rest
 * on each reactor's own thread (its state is thread-local: one reactor per
 * thread).
 *
 * Invariants:
 *  - a callback (completion dispatch, timer, cross-thread message) that ran
 *    longer than the threshold is counted once and logged rate-limited, with
 *    its kind, the op type or timer, the connection id when it has one, and
 *    the tag (e.g. the RPC method) set while it ran; at log level debug
 *    every stall is logged, none suppressed (to classify them);
 *  - the busy time of a loop pass (everything except the wait in the
 *    kernel) is observed once per pass; without rx_stall_setup (unit tests)
 *    stalls are still logged with the default threshold, and nothing is
 *    recorded into metrics.
 */
#ifndef PC_REACTOR_STALL_H
#define PC_REACTOR_STALL_H

#include <stdbool.h>
#include <stdint.h>

#include "reactor.h"

#define RX_STALL_DEFAULT_NS 1000000ull /* 1 ms */

/* Register the metrics for nreactors reactors and set the threshold (0 =
 * detection off; the iteration histogram is still kept). cpu_clock: also
 * read the thread's CPU clock and sleep count around each callback (two
 * system calls, ~1-3 µs per callback), so a stall says whether the
 * reactor worked that long (peercache_reactor_stalls_cpu_total) and took
 * page faults meanwhile (its log line counts them), slept in
 * the kernel — waited for a lock such as the mmap lock
 * (peercache_reactor_stalls_blocked_total) — or was preempted (neither).
 * Main thread, before met_start(); 0 or -ENOMEM. */
int rx_stall_setup(unsigned nreactors, uint64_t threshold_ns, bool cpu_clock);

/* Name the work the current callback does ("rpc session.set"), for the
 * report if it stalls: a string that lives forever (a literal, a method
 * table entry). Cleared when the next callback starts. */
void rx_stall_tag(const char *what);

/* Hooks of the loop (loop.c, timer.c). kind: "completion", "timer". */
uint64_t rx_stall_begin(void);
void rx_stall_end(struct rx_reactor *r, uint64_t t0, const char *kind,
		  const char *what, uint64_t conn_id);
/* One loop pass: busy from top to pre (before entering the kernel) and from
 * post (back from it) to now. */
void rx_stall_pass(struct rx_reactor *r, uint64_t top, uint64_t pre,
		   uint64_t post);

/* Stalls counted on the calling thread's reactor (tests). */
uint64_t rx_stall_count(void);
/* Of them, with cpu_clock: those that were work, and those that slept. */
void rx_stall_counts(uint64_t *cpu, uint64_t *blocked);

#endif /* PC_REACTOR_STALL_H */
