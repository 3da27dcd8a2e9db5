/*
 * reactor/stall.c — see stall.h. Each reactor times its callbacks with the
 * monotonic clock (two vDSO reads per callback, ~40 ns) and its loop passes;
 * a callback over the threshold is a stall: counted per reactor, logged
 * rate-limited with what it was. The metrics are per reactor (label
 * reactor="i"), so the share of work each core does can be read from
 * peercache_reactor_busy_seconds_total.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "stall.h"

#define LOG_MOD "stall"

static struct {
	unsigned n;
	uint64_t threshold_ns;  /* 0: off */
	bool cpu_clock;         /* also time callbacks in thread CPU time */
	met_id *iter_hist;      /* per reactor */
	met_id *stalls;         /* per reactor */
	met_id *stalls_cpu;     /* per reactor: the CPU time was over too */
	met_id *stalls_blocked; /* per reactor: not work, and it slept */
	uint64_t *busy_ns;      /* per reactor, atomic */
	uint64_t *max_ns;       /* per reactor, longest callback, atomic */
	char (*labels)[24];     /* per reactor: reactor="i" (the registry
				 * keeps the pointer) */
} g = {.threshold_ns = RX_STALL_DEFAULT_NS};

static _Thread_local const char *t_tag;
static _Thread_local uint64_t t_cpu0;   /* thread CPU time at begin */
static _Thread_local long t_sleeps0;    /* voluntary switches at begin */
static _Thread_local long t_flt0;       /* minor + major page faults at begin */
static _Thread_local uint64_t t_stalls, t_stalls_cpu, t_stalls_blocked;

static double busy_fn(void *arg)
{
	uint64_t *v = arg;
	return (double)__atomic_load_n(v, __ATOMIC_RELAXED) / 1e9;
}

static double max_fn(void *arg)
{
	uint64_t *v = arg;
	return (double)__atomic_load_n(v, __ATOMIC_RELAXED) / 1e9;
}

/* The thread's CPU time, how often it slept (voluntary context
 * switches: a wait in the kernel — a lock, a page being migrated — that a
 * callback never asks for) and its page faults (minor and major: a first
 * touch the guest kernel sees; a hypervisor's own faults show as CPU time
 * with none). Two system calls: getrusage's times lag by up
 * to a scheduler tick (the running slice is not added), which would make
 * short callbacks look like 4 ms of CPU; the CPU clock is exact. */
static uint64_t cpu_now_ns(long *sleeps, long *faults)
{
	struct rusage ru;
	if (getrusage(RUSAGE_THREAD, &ru) == 0) {
		*sleeps = ru.ru_nvcsw;
		*faults = ru.ru_minflt + ru.ru_majflt;
	} else {
		*sleeps = *faults = 0;
	}
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int rx_stall_setup(unsigned nreactors, uint64_t threshold_ns, bool cpu_clock)
{
	free(g.iter_hist);
	free(g.stalls);
	free(g.stalls_cpu);
	free(g.stalls_blocked);
	free(g.busy_ns);
	free(g.max_ns);
	free(g.labels);
	g.n = 0;
	g.threshold_ns = threshold_ns;
	g.cpu_clock = cpu_clock;
	g.stalls_cpu = calloc(nreactors, sizeof(*g.stalls_cpu));
	g.stalls_blocked = calloc(nreactors, sizeof(*g.stalls_blocked));
	g.iter_hist = calloc(nreactors, sizeof(*g.iter_hist));
	g.stalls = calloc(nreactors, sizeof(*g.stalls));
	g.busy_ns = calloc(nreactors, sizeof(*g.busy_ns));
	g.max_ns = calloc(nreactors, sizeof(*g.max_ns));
	g.labels = calloc(nreactors, sizeof(*g.labels));
	if (!g.iter_hist || !g.stalls || !g.stalls_cpu || !g.stalls_blocked ||
	    !g.busy_ns ||
	    !g.max_ns || !g.labels)
		return -ENOMEM;
	for (unsigned i = 0; i < nreactors; i++) {
		char *lab = g.labels[i];
		snprintf(lab, sizeof(*g.labels), "reactor=\"%u\"", i);
		g.iter_hist[i] = met_register(
			MET_HISTOGRAM, "peercache_reactor_iteration_seconds",
			"busy time of one event-loop pass (the wait in the "
			"kernel excluded)", lab);
		g.stalls[i] = met_register(
			MET_COUNTER, "peercache_reactor_stalls_total",
			"reactor callbacks that ran longer than "
			"reactor_stall_threshold", lab);
		g.stalls_cpu[i] = met_register(
			MET_COUNTER, "peercache_reactor_stalls_cpu_total",
			"stalls whose thread CPU time was over the threshold "
			"too (not a preemption; reactor_stall_cpu_clock)", lab);
		g.stalls_blocked[i] = met_register(
			MET_COUNTER, "peercache_reactor_stalls_blocked_total",
			"stalls under the threshold in CPU time in which the "
			"thread slept in the kernel (a lock, a page fault "
			"waiting; reactor_stall_cpu_clock)", lab);
		met_register_counter_fn(
			"peercache_reactor_busy_seconds_total",
			"time a reactor spent working (callbacks and loop "
			"bookkeeping, not waiting)", lab, busy_fn,
			&g.busy_ns[i]);
		met_register_fn("peercache_reactor_callback_max_seconds",
				"the longest reactor callback since start",
				lab, max_fn, &g.max_ns[i]);
	}
	g.n = nreactors;
	return 0;
}

void rx_stall_tag(const char *what)
{
	t_tag = what;
}

uint64_t rx_stall_begin(void)
{
	t_tag = NULL;
	if (g.cpu_clock)
		t_cpu0 = cpu_now_ns(&t_sleeps0, &t_flt0);
	return pc_now_ns();
}

void rx_stall_end(struct rx_reactor *r, uint64_t t0, const char *kind,
		  const char *what, uint64_t conn_id)
{
	uint64_t ns = pc_now_ns() - t0;
	unsigned id = rx_reactor_id(r);
	if (id < g.n && ns > __atomic_load_n(&g.max_ns[id], __ATOMIC_RELAXED))
		__atomic_store_n(&g.max_ns[id], ns, __ATOMIC_RELAXED);
	if (!g.threshold_ns || ns <= g.threshold_ns)
		return;
	t_stalls++;
	if (id < g.n)
		met_inc(g.stalls[id]);
	const char *tag = t_tag;
	char conn[32] = "", cpu[112] = "";
	if (conn_id)
		snprintf(conn, sizeof(conn), " on conn %llu",
			 (unsigned long long)conn_id);
	if (g.cpu_clock) {
		long sleeps, faults;
		uint64_t c = cpu_now_ns(&sleeps, &faults) - t_cpu0;
		sleeps -= t_sleeps0;
		faults -= t_flt0;
		bool work = c > g.threshold_ns;
		t_stalls_cpu += work;
		t_stalls_blocked += !work && sleeps > 0;
		if (work && id < g.n)
			met_inc(g.stalls_cpu[id]);
		else if (sleeps > 0 && id < g.n)
			met_inc(g.stalls_blocked[id]);
		char why[40] = " (preempted)";
		if (sleeps > 0)
			snprintf(why, sizeof(why), " (slept %ld times)", sleeps);
		snprintf(cpu, sizeof(cpu), ", %.2f ms of it on the CPU%s, "
			 "%ld page faults", (double)c / 1e6,
			 work && !sleeps ? "" : why, faults);
	}
	char line[384];
	snprintf(line, sizeof(line), "r%u: %s %s%s%s%s ran %.2f ms%s", id,
		 kind, what, tag ? " " : "", tag ? tag : "", conn,
		 (double)ns / 1e6, cpu);
	if (PC_LOG_ENABLED(PC_LOG_DEBUG)) /* every stall, for diagnosis */
		pc_log(PC_LOG_DEBUG, LOG_MOD, "%s", line);
	else
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD,
			  "%s (reactor_stall_threshold %.2f ms)", line,
			  (double)g.threshold_ns / 1e6);
}

void rx_stall_pass(struct rx_reactor *r, uint64_t top, uint64_t pre,
		   uint64_t post)
{
	unsigned id = rx_reactor_id(r);
	if (id >= g.n)
		return;
	uint64_t now = pc_now_ns();
	uint64_t busy = (pre - top) + (now - post);
	__atomic_store_n(&g.busy_ns[id],
			 __atomic_load_n(&g.busy_ns[id], __ATOMIC_RELAXED) + busy,
			 __ATOMIC_RELAXED);
	met_observe_ns(g.iter_hist[id], busy);
}

uint64_t rx_stall_count(void)
{
	return t_stalls;
}

void rx_stall_counts(uint64_t *cpu, uint64_t *blocked)
{
	*cpu = t_stalls_cpu;
	*blocked = t_stalls_blocked;
}
