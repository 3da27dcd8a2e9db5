/*
 * common/metrics.c — the metric registry (see metrics.h).
 *
 * Owns: the series table (fixed capacity, filled on the main thread before
 * met_start), the shards (one block of uint64 slots per thread kind), the
 * gauge functions and collectors. Threading: after met_start the table is
 * read-only; each reactor writes its own shard; a scrape sums shards with
 * relaxed loads, so a sum may lag a concurrent update by that update — fine
 * for monitoring, and no lock is ever taken on a hot path.
 */
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "util.h"

#define MET_MAX 2048      /* series */
#define MET_FN_MAX 128    /* gauge functions */
#define MET_COLL_MAX 32   /* collectors */

/* Histogram layout: bucket 0 is [0, 2^HB_MIN_EXP) ns; then HB_SUB buckets
 * per power of two up to 2^HB_MAX_EXP; the last bucket is the overflow. */
#define HB_SUB_BITS 5
#define HB_SUB (1u << HB_SUB_BITS)
#define HB_MIN_EXP 9  /* 512 ns: 1 µs lands in a fine bucket */
#define HB_MAX_EXP 34 /* ~17.2 s */
#define HB_N ((HB_MAX_EXP - HB_MIN_EXP) * HB_SUB + 2)
#define HB_SLOTS (HB_N + 2) /* buckets, then sum (ns), then count */

struct met_series {
	enum met_type type;
	const char *name;
	const char *help;
	const char *labels; /* NULL or `k="v",...` */
};

struct met_fn {
	enum met_type type; /* MET_GAUGE or MET_COUNTER */
	const char *name, *help, *labels;
	double (*fn)(void *arg);
	void *arg;
};

struct met_coll {
	void (*fn)(struct met_writer *w, void *arg);
	void *arg;
};

struct met_writer {
	struct pc_wbuf b;
	const char *node_label; /* `node="..."`, escaped */
};

static struct met_series g_series[MET_MAX];
static unsigned g_n;
static struct met_fn g_fns[MET_FN_MAX];
static unsigned g_nfns;
static struct met_coll g_colls[MET_COLL_MAX];
static unsigned g_ncolls;
static uint64_t *g_shards; /* nshards x g_slots */
static unsigned g_nshards;
static uint32_t g_slots;
static bool g_started;

uint32_t *met_offsets;
bool met_enabled = true;
_Thread_local uint64_t *met_shard;
_Thread_local bool met_shared;

/* ---------------------------------------------------------- registration */

met_id met_register(enum met_type type, const char *name, const char *help,
		    const char *labels)
{
	if (g_started || g_n >= MET_MAX)
		return MET_NONE;
	g_series[g_n] = (struct met_series){type, name, help, labels};
	return g_n++;
}

static int register_fn(enum met_type type, const char *name,
		       const char *help, const char *labels,
		       double (*fn)(void *arg), void *arg)
{
	if (g_started || g_nfns >= MET_FN_MAX)
		return -ENOSPC;
	g_fns[g_nfns++] = (struct met_fn){type, name, help, labels, fn, arg};
	return 0;
}

int met_register_fn(const char *name, const char *help, const char *labels,
		    double (*fn)(void *arg), void *arg)
{
	return register_fn(MET_GAUGE, name, help, labels, fn, arg);
}

int met_register_counter_fn(const char *name, const char *help,
			    const char *labels, double (*fn)(void *arg),
			    void *arg)
{
	return register_fn(MET_COUNTER, name, help, labels, fn, arg);
}

int met_register_collector(void (*fn)(struct met_writer *w, void *arg),
			   void *arg)
{
	if (g_started || g_ncolls >= MET_COLL_MAX)
		return -ENOSPC;
	g_colls[g_ncolls++] = (struct met_coll){fn, arg};
	return 0;
}

void met_unregister_collector(void (*fn)(struct met_writer *w, void *arg),
			      void *arg)
{
	for (unsigned i = 0; i < g_ncolls; i++) {
		if (g_colls[i].fn == fn && g_colls[i].arg == arg) {
			memmove(&g_colls[i], &g_colls[i + 1],
				(g_ncolls - i - 1) * sizeof(g_colls[0]));
			g_ncolls--;
			return;
		}
	}
}

int met_start(unsigned nthreads)
{
	if (g_started)
		return -EALREADY;
	met_offsets = calloc(g_n ? g_n : 1, sizeof(*met_offsets));
	if (!met_offsets)
		return -ENOMEM;
	uint32_t slot = 0;
	for (unsigned i = 0; i < g_n; i++) {
		met_offsets[i] = slot;
		slot += g_series[i].type == MET_HISTOGRAM ? HB_SLOTS : 1;
	}
	g_slots = slot ? slot : 1;
	g_nshards = nthreads + 1;
	/* Each shard starts on its own cache lines: no false sharing. */
	size_t per = ((size_t)g_slots * 8 + 63) & ~(size_t)63;
	g_slots = (uint32_t)(per / 8);
	g_shards = aligned_alloc(64, per * g_nshards);
	if (!g_shards) {
		free(met_offsets);
		met_offsets = NULL;
		return -ENOMEM;
	}
	memset(g_shards, 0, per * g_nshards);
	g_started = true;
	met_bind_thread(0);
	return 0;
}

void met_reset(void)
{
	free(g_shards);
	free(met_offsets);
	g_shards = NULL;
	met_offsets = NULL;
	met_shard = NULL;
	g_n = g_nfns = g_ncolls = 0;
	g_nshards = 0;
	g_started = false;
	met_enabled = true;
}

void met_set_enabled(bool on)
{
	__atomic_store_n(&met_enabled, on, __ATOMIC_RELAXED);
}

void met_bind_thread(unsigned shard)
{
	if (!g_started || shard >= g_nshards) {
		met_shard = NULL;
		return;
	}
	met_shard = g_shards + (size_t)shard * g_slots;
	met_shared = shard == 0;
}

/* ------------------------------------------------------------ histograms */

static unsigned hb_index(uint64_t ns)
{
	if (ns < (1ull << HB_MIN_EXP))
		return 0;
	if (ns >= (1ull << HB_MAX_EXP))
		return HB_N - 1;
	unsigned msb = 63u - (unsigned)__builtin_clzll(ns);
	unsigned sub = (unsigned)(ns >> (msb - HB_SUB_BITS)) & (HB_SUB - 1);
	return 1 + (msb - HB_MIN_EXP) * HB_SUB + sub;
}

/* Bounds of bucket i in ns: [lo, hi). */
static void hb_bounds(unsigned i, uint64_t *lo, uint64_t *hi)
{
	if (i == 0) {
		*lo = 0;
		*hi = 1ull << HB_MIN_EXP;
		return;
	}
	if (i >= HB_N - 1) {
		*lo = *hi = 1ull << HB_MAX_EXP;
		return;
	}
	unsigned msb = HB_MIN_EXP + (i - 1) / HB_SUB;
	uint64_t sub = (i - 1) % HB_SUB;
	uint64_t width = 1ull << (msb - HB_SUB_BITS);
	*lo = (HB_SUB + sub) * width;
	*hi = *lo + width;
}

static inline void slot_add(uint64_t *v, uint64_t n)
{
	if (met_shared)
		__atomic_add_fetch(v, n, __ATOMIC_RELAXED);
	else
		__atomic_store_n(v, __atomic_load_n(v, __ATOMIC_RELAXED) + n,
				 __ATOMIC_RELAXED);
}

void met_observe_ns(met_id id, uint64_t ns)
{
	if (!met_enabled || id == MET_NONE || !met_shard)
		return;
	uint64_t *h = met_shard + met_offsets[id];
	slot_add(&h[hb_index(ns)], 1);
	slot_add(&h[HB_N], ns);
	slot_add(&h[HB_N + 1], 1);
}

/* Sum slot k of series id over every shard. */
static uint64_t sum_slot(met_id id, unsigned k)
{
	uint64_t s = 0;
	for (unsigned sh = 0; sh < g_nshards; sh++)
		s += __atomic_load_n(&g_shards[(size_t)sh * g_slots +
					       met_offsets[id] + k],
				     __ATOMIC_RELAXED);
	return s;
}

uint64_t met_read(met_id id)
{
	if (!g_started || id >= g_n)
		return 0;
	return sum_slot(id, g_series[id].type == MET_HISTOGRAM ? HB_N + 1 : 0);
}

/* Quantile from a summed bucket array. */
static uint64_t quantile(const uint64_t *b, uint64_t count, double q)
{
	if (count == 0)
		return 0;
	double target = q * (double)count;
	uint64_t cum = 0;
	for (unsigned i = 0; i < HB_N; i++) {
		if (!b[i])
			continue;
		if ((double)(cum + b[i]) >= target) {
			uint64_t lo, hi;
			hb_bounds(i, &lo, &hi);
			double frac = (target - (double)cum) / (double)b[i];
			return lo + (uint64_t)((double)(hi - lo) * frac);
		}
		cum += b[i];
	}
	uint64_t lo, hi;
	hb_bounds(HB_N - 1, &lo, &hi);
	return lo;
}

/* Shard by shard, so each shard's slots are read in address order. */
static void sum_hist(met_id id, uint64_t *b)
{
	memset(b, 0, sizeof(uint64_t) * (HB_N + 2));
	for (unsigned sh = 0; sh < g_nshards; sh++) {
		const uint64_t *v = &g_shards[(size_t)sh * g_slots +
					      met_offsets[id]];
		for (unsigned k = 0; k < HB_N + 2; k++)
			b[k] += __atomic_load_n(&v[k], __ATOMIC_RELAXED);
	}
}

uint64_t met_quantile_ns(met_id id, double q)
{
	if (!g_started || id >= g_n || g_series[id].type != MET_HISTOGRAM)
		return 0;
	uint64_t b[HB_N + 2];
	sum_hist(id, b);
	return quantile(b, b[HB_N + 1], q);
}

/* ------------------------------------------------------------- rendering */

static void put_labels(struct met_writer *w, const char *labels,
		       const char *extra)
{
	pc_wbuf_printf(&w->b, "{%s", w->node_label);
	if (labels && *labels)
		pc_wbuf_printf(&w->b, ",%s", labels);
	if (extra)
		pc_wbuf_printf(&w->b, ",%s", extra);
	pc_wbuf_append(&w->b, "}", 1);
}

static void put_value(struct met_writer *w, double v)
{
	if (isnan(v))
		pc_wbuf_printf(&w->b, " NaN\n");
	else if (isinf(v))
		pc_wbuf_printf(&w->b, " %s\n", v > 0 ? "+Inf" : "-Inf");
	else if (v == (double)(int64_t)v && fabs(v) < 9e15)
		pc_wbuf_printf(&w->b, " %lld\n", (long long)v);
	else
		pc_wbuf_printf(&w->b, " %.9g\n", v);
}

void met_w_family(struct met_writer *w, const char *name, const char *help,
		  enum met_type type)
{
	static const char *const types[] = {"counter", "gauge", "histogram"};
	pc_wbuf_printf(&w->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
		       types[type]);
}

void met_w_sample(struct met_writer *w, const char *name, const char *labels,
		  double value)
{
	pc_wbuf_printf(&w->b, "%s", name);
	put_labels(w, labels, NULL);
	put_value(w, value);
}

/* The exported 'le' bounds of histograms: 1-2-5 steps, 1 µs .. 10 s. */
static const double le_bounds[] = {
	1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3,
	5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10,
};

/* "<base>" of a histogram name "<base>_seconds". */
static void hist_base(const char *name, char *out, size_t len)
{
	size_t n = strlen(name);
	if (n > 8 && strcmp(name + n - 8, "_seconds") == 0)
		n -= 8;
	snprintf(out, len, "%.*s", (int)n, name);
}

static void render_hist_summary(struct met_writer *w, met_id id,
				const uint64_t *b)
{
	static const double qs[] = {0.5, 0.9, 0.99, 0.999};
	const struct met_series *s = &g_series[id];
	for (size_t i = 0; i < PC_ARRAY_LEN(qs); i++) {
		char q[32];
		snprintf(q, sizeof(q), "quantile=\"%g\"", qs[i]);
		pc_wbuf_printf(&w->b, "%s", s->name);
		put_labels(w, s->labels, q);
		put_value(w, b[HB_N + 1] ? (double)quantile(b, b[HB_N + 1],
							    qs[i]) / 1e9
					 : NAN);
	}
	pc_wbuf_printf(&w->b, "%s_sum", s->name);
	put_labels(w, s->labels, NULL);
	put_value(w, (double)b[HB_N] / 1e9);
	pc_wbuf_printf(&w->b, "%s_count", s->name);
	put_labels(w, s->labels, NULL);
	put_value(w, (double)b[HB_N + 1]);
}

static void render_hist_buckets(struct met_writer *w, met_id id,
				const uint64_t *b, const char *hname)
{
	const struct met_series *s = &g_series[id];
	uint64_t cum = 0;
	unsigned i = 0;
	for (size_t k = 0; k < PC_ARRAY_LEN(le_bounds); k++) {
		uint64_t edge = (uint64_t)(le_bounds[k] * 1e9 + 0.5);
		/* A fine bucket counts under the first bound at or above its
		 * upper edge: never early, at most one fine bucket late. */
		for (; i < HB_N - 1; i++) {
			uint64_t lo, hi;
			hb_bounds(i, &lo, &hi);
			if (hi > edge)
				break;
			cum += b[i];
		}
		char le[32];
		snprintf(le, sizeof(le), "le=\"%g\"", le_bounds[k]);
		pc_wbuf_printf(&w->b, "%s_bucket", hname);
		put_labels(w, s->labels, le);
		put_value(w, (double)cum);
	}
	pc_wbuf_printf(&w->b, "%s_bucket", hname);
	put_labels(w, s->labels, "le=\"+Inf\"");
	put_value(w, (double)b[HB_N + 1]);
	pc_wbuf_printf(&w->b, "%s_sum", hname);
	put_labels(w, s->labels, NULL);
	put_value(w, (double)b[HB_N] / 1e9);
	pc_wbuf_printf(&w->b, "%s_count", hname);
	put_labels(w, s->labels, NULL);
	put_value(w, (double)b[HB_N + 1]);
}

/* A histogram family being written: every series is summed once when the
 * family starts, then written a few series at a time in three parts (the
 * summary under the original name, the mean, the buckets), so a family of
 * many series (one per RPC method) spreads over several render steps. */
#define HIST_SERIES_PER_STEP 4

struct hist_job {
	unsigned n, i, part;   /* series, next one, part 0..2 */
	unsigned *ids;
	uint64_t *b;           /* n x (HB_N + 2) sums */
	char hname[160], avg[160];
};

static void hist_job_free(struct hist_job *h)
{
	free(h->ids);
	free(h->b);
	memset(h, 0, sizeof(*h));
}

static int hist_job_start(struct hist_job *h, struct met_writer *w,
			  unsigned first)
{
	const struct met_series *f = &g_series[first];
	char base[128];
	memset(h, 0, sizeof(*h));
	hist_base(f->name, base, sizeof(base));
	snprintf(h->hname, sizeof(h->hname), "%s_hist_seconds", base);
	snprintf(h->avg, sizeof(h->avg), "%s_avg", f->name);
	unsigned n = 0;
	for (unsigned j = first; j < g_n; j++)
		n += strcmp(g_series[j].name, f->name) == 0;
	h->b = malloc(sizeof(uint64_t) * (HB_N + 2) * n);
	h->ids = malloc(sizeof(unsigned) * n);
	if (!h->b || !h->ids) {
		hist_job_free(h);
		return -ENOMEM;
	}
	for (unsigned j = first; j < g_n; j++) {
		if (strcmp(g_series[j].name, f->name) == 0) {
			h->ids[h->n] = j;
			sum_hist(j, &h->b[(size_t)h->n * (HB_N + 2)]);
			h->n++;
		}
	}
	/* Summary family under the original name: quantiles, _sum, _count. */
	pc_wbuf_printf(&w->b, "# HELP %s %s (quantiles)\n# TYPE %s summary\n",
		       f->name, f->help, f->name);
	return 0;
}

/* Up to HIST_SERIES_PER_STEP series of the current part; true when the
 * family is complete (h is freed then). */
static bool hist_job_step(struct hist_job *h, struct met_writer *w)
{
	for (unsigned k = 0; k < HIST_SERIES_PER_STEP && h->i < h->n;
	     k++, h->i++) {
		unsigned id = h->ids[h->i];
		const uint64_t *b = &h->b[(size_t)h->i * (HB_N + 2)];
		if (h->part == 0)
			render_hist_summary(w, id, b);
		else if (h->part == 1)
			met_w_sample(w, h->avg, g_series[id].labels,
				     b[HB_N + 1] ? (double)b[HB_N] / 1e9 /
							   (double)b[HB_N + 1]
						 : NAN);
		else
			render_hist_buckets(w, id, b, h->hname);
	}
	if (h->i < h->n)
		return false;
	h->i = 0;
	if (++h->part == 1) {
		met_w_family(w, h->avg, "mean of the same latencies, seconds",
			     MET_GAUGE);
	} else if (h->part == 2) {
		met_w_family(w, h->hname, g_series[h->ids[0]].help,
			     MET_HISTOGRAM);
	} else {
		hist_job_free(h);
		return true;
	}
	return false;
}

void met_escape_label(const char *in, char *out, size_t len)
{
	size_t o = 0;
	for (; *in && o + 3 < len; in++) {
		if (*in == '\\' || *in == '"') {
			out[o++] = '\\';
			out[o++] = *in;
		} else if (*in == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else {
			out[o++] = *in;
		}
	}
	out[o] = '\0';
}

/* A render in progress: the families are written one at a time, in
 * phases (series of the registry, then gauge functions, then collectors),
 * so a caller can spread a scrape over several slices of its loop. */
struct met_render_job {
	struct met_writer w;
	bool *done;         /* series already written with their family */
	unsigned phase;     /* 0 series, 1 functions, 2 collectors, 3 done */
	unsigned i;         /* next index in the phase */
	bool in_hist;       /* a histogram family is being written */
	struct hist_job hist;
	char node_label[320];
};

struct met_render_job *met_render_begin(const char *node_id)
{
	struct met_render_job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	char esc[300];
	met_escape_label(node_id ? node_id : "", esc, sizeof(esc));
	snprintf(j->node_label, sizeof(j->node_label), "node=\"%s\"", esc);
	pc_wbuf_init(&j->w.b, 0);
	j->w.node_label = j->node_label;
	j->done = calloc(g_n ? g_n : 1, sizeof(bool));
	if (!j->done) {
		free(j);
		return NULL;
	}
	j->phase = g_started ? 0 : 3;
	return j;
}

/* The registry's series family at or after j->i; false when none is left. */
static bool render_next_series(struct met_render_job *j)
{
	if (j->in_hist) {
		j->in_hist = !hist_job_step(&j->hist, &j->w);
		return true;
	}
	while (j->i < g_n && j->done[j->i])
		j->i++;
	if (j->i >= g_n)
		return false;
	unsigned i = j->i++;
	const struct met_series *f = &g_series[i];
	for (unsigned k = i; k < g_n; k++)
		if (strcmp(g_series[k].name, f->name) == 0)
			j->done[k] = true;
	if (f->type == MET_HISTOGRAM) {
		if (hist_job_start(&j->hist, &j->w, i) < 0)
			j->w.b.failed = true;
		else
			j->in_hist = true;
		return true;
	}
	met_w_family(&j->w, f->name, f->help, f->type);
	for (unsigned k = i; k < g_n; k++) {
		if (strcmp(g_series[k].name, f->name) != 0)
			continue;
		uint64_t v = sum_slot(k, 0);
		/* Per-thread gauges may be negative in one shard. */
		double d = f->type == MET_GAUGE ? (double)(int64_t)v : (double)v;
		met_w_sample(&j->w, f->name, g_series[k].labels, d);
	}
	return true;
}

/* The family of the gauge function at or after j->i (first of its name). */
static bool render_next_fn(struct met_render_job *j)
{
	for (; j->i < g_nfns; j->i++) {
		unsigned i = j->i;
		bool first = true;
		for (unsigned k = 0; k < i && first; k++)
			if (strcmp(g_fns[k].name, g_fns[i].name) == 0)
				first = false;
		if (!first)
			continue;
		j->i++;
		met_w_family(&j->w, g_fns[i].name, g_fns[i].help, g_fns[i].type);
		for (unsigned k = i; k < g_nfns; k++)
			if (strcmp(g_fns[k].name, g_fns[i].name) == 0)
				met_w_sample(&j->w, g_fns[k].name, g_fns[k].labels,
					     g_fns[k].fn(g_fns[k].arg));
		return true;
	}
	return false;
}

int met_render_step(struct met_render_job *j, uint64_t budget_ns)
{
	uint64_t t0 = pc_now_ns();
	do {
		bool wrote;
		switch (j->phase) {
		case 0:
			wrote = render_next_series(j);
			break;
		case 1:
			wrote = render_next_fn(j);
			break;
		case 2:
			wrote = j->i < g_ncolls;
			if (wrote) {
				g_colls[j->i].fn(&j->w, g_colls[j->i].arg);
				j->i++;
			}
			break;
		default:
			return j->w.b.failed ? -ENOMEM : 0;
		}
		if (!wrote) {
			j->phase++;
			j->i = 0;
		}
	} while (pc_now_ns() - t0 < budget_ns);
	if (j->w.b.failed)
		return -ENOMEM;
	return j->phase < 3 ? 1 : 0;
}

char *met_render_finish(struct met_render_job *j, size_t *len)
{
	char *text = NULL;
	if (j->phase == 3 && pc_wbuf_append(&j->w.b, "", 1) == 0) {
		*len = j->w.b.len - 1; /* NUL-terminated above */
		text = (char *)j->w.b.data;
	} else {
		pc_wbuf_free(&j->w.b);
	}
	hist_job_free(&j->hist);
	free(j->done);
	free(j);
	return text;
}

char *met_render(const char *node_id, size_t *len)
{
	struct met_render_job *j = met_render_begin(node_id);
	if (!j)
		return NULL;
	while (met_render_step(j, UINT64_MAX) > 0)
		;
	return met_render_finish(j, len);
}
