/*
 * common/metrics.h — the metric registry: counters, gauges and latency
 * histograms, kept per thread and summed when scraped.
 *
 * Owns: the metric table and one shard of values per thread (shard 0 for
 * threads that are not reactors, one per reactor after it). Threading:
 * registration happens on the main thread before met_start(); after that the
 * table is read-only. Hot-path updates touch only the calling thread's shard
 * with plain relaxed stores — no lock, no atomic read-modify-write — except
 * on shard 0, which several non-reactor threads may share (atomic adds).
 * A scrape (any thread) sums the shards with relaxed loads.
 *
 * Histograms are log-linear over nanoseconds: 32 buckets per power of two
 * from 1.024 µs to 17 s, so quantiles from 1 µs to 10 s are within ~3%.
 * They are exported twice: as a Prometheus histogram (<base>_hist_seconds,
 * fixed 1-2-5 `le` buckets) and as a summary with quantiles 0.5/0.9/0.99/
 * 0.999 (<base>_seconds), which keeps the original PeerCache's
 * peercache_op_latency_seconds{quantile=...} dashboards working.
 */
#ifndef PC_COMMON_METRICS_H
#define PC_COMMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint32_t met_id;
#define MET_NONE UINT32_MAX

enum met_type { MET_COUNTER, MET_GAUGE, MET_HISTOGRAM };

/* -------------------------------------------------------- registration */

/*
 * Register one time series. name is the full Prometheus name (counters end
 * in _total; histograms are given as "<base>_seconds" and recorded in ns);
 * labels is a fixed label set like `method="node.info"` or NULL. Series with
 * the same name form one family (same help and type). Returns MET_NONE after
 * met_start() or when the table is full (a bug the tests catch).
 */
met_id met_register(enum met_type type, const char *name, const char *help,
		    const char *labels);

/* A gauge computed when scraped (pool bytes used, members, ...). */
int met_register_fn(const char *name, const char *help, const char *labels,
		    double (*fn)(void *arg), void *arg);
/* The same for a counter another subsystem keeps (name ends in _total). */
int met_register_counter_fn(const char *name, const char *help,
			    const char *labels, double (*fn)(void *arg),
			    void *arg);

/* Output helpers for collectors (below). */
struct met_writer;
void met_w_family(struct met_writer *w, const char *name, const char *help,
		  enum met_type type);
void met_w_sample(struct met_writer *w, const char *name, const char *labels,
		  double value);

/* A label value escaped for the text format (\\, \" and \n), cut to fit
 * len bytes with its NUL. */
void met_escape_label(const char *in, char *out, size_t len);

/* A collector appends whole families at scrape time, for subsystems that
 * already keep their own counters (the reactor, the RPC server). */
int met_register_collector(void (*fn)(struct met_writer *w, void *arg),
			   void *arg);

/* Remove a collector (its subsystem is going away). */
void met_unregister_collector(void (*fn)(struct met_writer *w, void *arg),
			      void *arg);

/* Freeze the table and allocate shards for nthreads reactor threads. */
int met_start(unsigned nthreads);
/* Free everything (tests, shutdown). Registration may start over after. */
void met_reset(void);

/* Recording on or off (metrics_enabled). Off: updates are skipped. */
void met_set_enabled(bool on);

/* Bind the calling thread to its shard (reactor id + 1; 0 = shared). */
void met_bind_thread(unsigned shard);

/* -------------------------------------------------------------- hot path */

extern uint32_t *met_offsets;      /* slot of each id in a shard */
extern bool met_enabled;
extern _Thread_local uint64_t *met_shard;  /* this thread's values */
extern _Thread_local bool met_shared;      /* shard 0: use atomics */

static inline void met_add(met_id id, uint64_t n)
{
	if (!met_enabled || id == MET_NONE || !met_shard)
		return;
	uint64_t *v = met_shard + met_offsets[id];
	if (met_shared)
		__atomic_add_fetch(v, n, __ATOMIC_RELAXED);
	else
		__atomic_store_n(v, __atomic_load_n(v, __ATOMIC_RELAXED) + n,
				 __ATOMIC_RELAXED);
}

static inline void met_inc(met_id id)
{
	met_add(id, 1);
}

/* Gauges kept per thread (connections open, ...): +n / -n, summed. */
static inline void met_gauge_add(met_id id, int64_t n)
{
	met_add(id, (uint64_t)n);
}

/* Record one latency, in nanoseconds, into a histogram. */
void met_observe_ns(met_id id, uint64_t ns);

/* ------------------------------------------------------------- scraping */

/* Render the Prometheus text exposition (format 0.0.4) with a node label on
 * every sample. Returns a malloc'd NUL-terminated buffer, or NULL. */
char *met_render(const char *node_id, size_t *len);

/* The same in slices, for a caller that must not run long (a reactor):
 * met_render_begin (NULL: out of memory), then met_render_step until it
 * returns 0 (done) or -ENOMEM — each call writes whole families, at least
 * one, until budget_ns has passed, and returns 1 while some are left — then
 * met_render_finish: the text as met_render gives it (NULL if the render
 * failed or was not done: a way to abandon it), and the job is freed. Values
 * are read as each family is written, so one scrape's families may be a few
 * slices apart. One job per caller; any thread once met_start ran. */
struct met_render_job;
struct met_render_job *met_render_begin(const char *node_id);
int met_render_step(struct met_render_job *j, uint64_t budget_ns);
char *met_render_finish(struct met_render_job *j, size_t *len);

/* Read one series summed over shards (tests, dashboards in C). Counters and
 * gauges: the value; histograms: the count. */
uint64_t met_read(met_id id);
/* Quantile q (0..1) of a histogram, in nanoseconds (0 when empty). */
uint64_t met_quantile_ns(met_id id, double q);

#endif /* PC_COMMON_METRICS_H */
