/*
 * bench/lg_hist.c — the cold half of pc-loadgen's latency histogram: merging
 * and quantiles (recording is inline in lg_hist.h).
 *
 * Owns: nothing global. Called from main only, after the workers that filled
 * the histograms have been joined. Invariant: a reported quantile is never
 * above the exact maximum, so a coarse top bucket cannot invent latency.
 */
#include "lg_hist.h"

#include <math.h>

#include "common/util.h"

/* Midpoint of a bucket: halves the worst-case error against either edge. */
static uint64_t lg_hist_bucket_mid_ns(unsigned idx)
{
	if (idx < 2 * LG_HIST_SUB)
		return idx;
	unsigned shift = (idx >> LG_HIST_SUB_BITS) - 1;
	uint64_t sub = idx - ((uint64_t)shift << LG_HIST_SUB_BITS);
	uint64_t lower = sub << shift;
	return lower + ((1ull << shift) - 1) / 2;
}

void lg_hist_merge(struct lg_hist *dst, const struct lg_hist *src)
{
	for (unsigned i = 0; i < LG_HIST_BUCKETS; i++)
		dst->counts[i] += src->counts[i];
	dst->total += src->total;
	dst->sum_ns += src->sum_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
}

uint64_t lg_hist_quantile_ns(const struct lg_hist *h, double q)
{
	if (h->total == 0)
		return 0;
	uint64_t rank = (uint64_t)ceil(q * (double)h->total);
	if (rank < 1)
		rank = 1;
	if (rank > h->total)
		rank = h->total;
	uint64_t seen = 0;
	for (unsigned i = 0; i < LG_HIST_BUCKETS; i++) {
		seen += h->counts[i];
		if (seen >= rank)
			return PC_MIN(lg_hist_bucket_mid_ns(i), h->max_ns);
	}
	return h->max_ns;
}
