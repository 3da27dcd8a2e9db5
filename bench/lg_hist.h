/*
 * bench/lg_hist.h — pc-loadgen's latency histogram.
 *
 * Owns: nothing global; a struct lg_hist is plain memory owned by whoever
 * declared it. Not thread-safe: each pc-loadgen worker records into its own
 * histogram, and main merges them after joining the workers.
 *
 * HDR-style log-linear histogram over nanoseconds. Values below 2^SUB_BITS are
 * counted exactly; above, each power-of-two octave [2^k, 2^(k+1)) is split into
 * 2^SUB_BITS equal buckets, so a bucket is at most 1/128 (0.78%) of its value
 * wide. Octaves run up to 2^34 ns (17 s), which covers the 1 us .. 10 s we
 * care about; larger values land in the last bucket (the exact max is kept on
 * the side). Fixed 3584 counters = 28 KiB per thread, no allocation on record.
 *
 * Invariants: total is the sum of counts[]; max_ns >= every recorded value.
 * lg_hist_record() is on the per-reply hot path, hence inline here.
 */
#ifndef PC_BENCH_LG_HIST_H
#define PC_BENCH_LG_HIST_H

#include <stdint.h>

#define LG_HIST_SUB_BITS 7
#define LG_HIST_SUB (1u << LG_HIST_SUB_BITS)
#define LG_HIST_VALUE_BITS 34
#define LG_HIST_BUCKETS \
	((LG_HIST_VALUE_BITS - LG_HIST_SUB_BITS + 1) * LG_HIST_SUB)

struct lg_hist {
	uint64_t counts[LG_HIST_BUCKETS];
	uint64_t total;	  /* number of recorded values */
	uint64_t sum_ns;  /* exact sum, for the mean */
	uint64_t max_ns;  /* exact maximum, also clamps the top percentiles */
};

static inline unsigned lg_hist_index(uint64_t v_ns)
{
	if (v_ns >= (1ull << LG_HIST_VALUE_BITS))
		v_ns = (1ull << LG_HIST_VALUE_BITS) - 1;
	if (v_ns < LG_HIST_SUB)
		return (unsigned)v_ns;
	unsigned k = 63u - (unsigned)__builtin_clzll(v_ns);
	unsigned shift = k - LG_HIST_SUB_BITS;
	/* (v >> shift) is in [SUB, 2*SUB): octave k starts at index (shift+1)*SUB. */
	return (shift << LG_HIST_SUB_BITS) + (unsigned)(v_ns >> shift);
}

/* Counts one value; O(1), no allocation. */
static inline void lg_hist_record(struct lg_hist *h, uint64_t v_ns)
{
	h->counts[lg_hist_index(v_ns)]++;
	h->total++;
	h->sum_ns += v_ns;
	if (v_ns > h->max_ns)
		h->max_ns = v_ns;
}

/* Adds every count of src to dst. */
void lg_hist_merge(struct lg_hist *dst, const struct lg_hist *src);

/* Value at quantile q in [0, 1]: the bucket holding the ceil(q*total)-th value,
 * as the bucket's midpoint, never above max_ns. 0 for an empty histogram. */
uint64_t lg_hist_quantile_ns(const struct lg_hist *h, double q);

#endif /* PC_BENCH_LG_HIST_H */
