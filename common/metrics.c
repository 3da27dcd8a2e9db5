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

static void sum_hist(met_id id, uint64_t *b)
{
	for (unsigned k = 0; k < HB_N + 2; k++)
		b[k] = sum_slot(id, k);
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

static void render_histograms(struct met_writer *w, unsigned first)
{
	const struct met_series *f = &g_series[first];
	char base[128], hname[160], avg[160];
	hist_base(f->name, base, sizeof(base));
	snprintf(hname, sizeof(hname), "%s_hist_seconds", base);
	snprintf(avg, sizeof(avg), "%s_avg", f->name);
	uint64_t *b = malloc(sizeof(uint64_t) * (HB_N + 2));
	if (!b)
		return;
	/* Summary family under the original name: quantiles, _sum, _count. */
	pc_wbuf_printf(&w->b, "# HELP %s %s (quantiles)\n# TYPE %s summary\n",
		       f->name, f->help, f->name);
	for (unsigned j = first; j < g_n; j++) {
		if (strcmp(g_series[j].name, f->name) == 0) {
			sum_hist(j, b);
			render_hist_summary(w, j, b);
		}
	}
	met_w_family(w, avg, "mean of the same latencies, seconds", MET_GAUGE);
	for (unsigned j = first; j < g_n; j++) {
		if (strcmp(g_series[j].name, f->name) == 0) {
			sum_hist(j, b);
			met_w_sample(w, avg, g_series[j].labels,
				     b[HB_N + 1] ? (double)b[HB_N] / 1e9 /
							   (double)b[HB_N + 1]
						 : NAN);
		}
	}
	met_w_family(w, hname, f->help, MET_HISTOGRAM);
	for (unsigned j = first; j < g_n; j++) {
		if (strcmp(g_series[j].name, f->name) == 0) {
			sum_hist(j, b);
			render_hist_buckets(w, j, b, hname);
		}
	}
	free(b);
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

char *met_render(const char *node_id, size_t *len)
{
	struct met_writer w;
	char esc[300], node_label[320];
	met_escape_label(node_id ? node_id : "", esc, sizeof(esc));
	snprintf(node_label, sizeof(node_label), "node=\"%s\"", esc);
	pc_wbuf_init(&w.b, 0);
	w.node_label = node_label;
	bool *done = calloc(g_n ? g_n : 1, sizeof(bool));
	if (!done)
		return NULL;
	for (unsigned i = 0; g_started && i < g_n; i++) {
		if (done[i])
			continue;
		const struct met_series *f = &g_series[i];
		for (unsigned j = i; j < g_n; j++)
			if (strcmp(g_series[j].name, f->name) == 0)
				done[j] = true;
		if (f->type == MET_HISTOGRAM) {
			render_histograms(&w, i);
			continue;
		}
		met_w_family(&w, f->name, f->help, f->type);
		for (unsigned j = i; j < g_n; j++) {
			if (strcmp(g_series[j].name, f->name) != 0)
				continue;
			uint64_t v = sum_slot(j, 0);
			/* Per-thread gauges may be negative in one shard. */
			double d = f->type == MET_GAUGE ? (double)(int64_t)v
							: (double)v;
			met_w_sample(&w, f->name, g_series[j].labels, d);
		}
	}
	free(done);
	for (unsigned i = 0; i < g_nfns; i++) {
		/* Families of gauge functions: first of each name. */
		bool first = true;
		for (unsigned j = 0; j < i; j++)
			if (strcmp(g_fns[j].name, g_fns[i].name) == 0)
				first = false;
		if (!first)
			continue;
		met_w_family(&w, g_fns[i].name, g_fns[i].help, g_fns[i].type);
		for (unsigned j = i; j < g_nfns; j++)
			if (strcmp(g_fns[j].name, g_fns[i].name) == 0)
				met_w_sample(&w, g_fns[j].name, g_fns[j].labels,
					     g_fns[j].fn(g_fns[j].arg));
	}
	for (unsigned i = 0; i < g_ncolls; i++)
		g_colls[i].fn(&w, g_colls[i].arg);
	if (pc_wbuf_append(&w.b, "", 1) < 0) { /* NUL-terminate */
		pc_wbuf_free(&w.b);
		return NULL;
	}
	*len = w.b.len - 1;
	return (char *)w.b.data;
}
