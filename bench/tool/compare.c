/*
 * bench/tool/compare.c — `peercache-bench compare A.json B.json`: the rows
 * of two reports matched by series and concurrency, side by side, with the
 * B/A ratios of pages/s, GB/s and p99 per batch, and a summary of the
 * pages/s ratios (min/median/max).
 *
 * Owns: nothing global; reads two reports, writes text. Each row of either
 * report is matched at most once (the first unmatched one of B for each row
 * of A, in order), so a report compared with itself matches row for row.
 */
#include "report_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool same_point(const struct pcb_row *a, const struct pcb_row *b)
{
	return pcb_same_series(a, b) && a->concurrency == b->concurrency;
}

/* B/A, or NaN when A is 0 (or either is not a number). */
static double ratio(double a, double b)
{
	if (!isfinite(a) || !isfinite(b) || a == 0)
		return NAN;
	return b / a;
}

static void fmt_ratio(char *buf, size_t len, double r)
{
	if (isnan(r))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.3f", r);
}

static int cmp_dbl(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return (a > b) - (a < b);
}

static void describe(FILE *out, const char *tag, const char *name,
		     const struct pcb_report *r)
{
	char version[64], host[128], started[32];

	pcb_printable(version, sizeof(version), r->version);
	pcb_printable(host, sizeof(host), r->host);
	pcb_printable(started, sizeof(started), r->started);
	fprintf(out, "%s: %s (%s, %s, %s, %u rows)\n", tag, name, version,
		host, started, r->nrows);
}

static void only_in(FILE *out, const char *name, const struct pcb_row *w)
{
	char label[160];

	pcb_series_label(w, label, sizeof(label));
	fprintf(out, "only in %s: %s conc %u (%.0f pages/s)\n", name, label,
		w->concurrency, isfinite(w->pages_s) ? w->pages_s : 0);
}

int pcb_compare(const struct pcb_report *a, const struct pcb_report *b,
		const char *name_a, const char *name_b, FILE *out)
{
	unsigned *match = calloc(a->nrows ? a->nrows : 1, sizeof(*match));
	bool *used = calloc(b->nrows ? b->nrows : 1, sizeof(*used));
	double *ratios = calloc(a->nrows ? a->nrows : 1, sizeof(*ratios));
	unsigned nmatched = 0, nratios = 0;
	size_t lw = strlen("series");
	char label[160];

	if (!match || !used || !ratios) {
		free(match);
		free(used);
		free(ratios);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < a->nrows; i++) {
		match[i] = UINT32_MAX;
		for (unsigned j = 0; j < b->nrows; j++) {
			if (!used[j] && same_point(&a->rows[i], &b->rows[j])) {
				used[j] = true;
				match[i] = j;
				nmatched++;
				pcb_series_label(&a->rows[i], label, sizeof(label));
				if (strlen(label) > lw)
					lw = strlen(label);
				break;
			}
		}
	}
	describe(out, "A", name_a, a);
	describe(out, "B", name_b, b);
	if (nmatched) {
		fprintf(out, "%-*s %5s %11s %11s %7s %8s %8s %7s %10s %10s %7s\n",
			(int)lw, "series", "conc", "A pages/s", "B pages/s", "B/A",
			"A GB/s", "B GB/s", "B/A", "A p99 us", "B p99 us", "B/A");
	}
	for (unsigned i = 0; i < a->nrows; i++) {
		const struct pcb_row *x = &a->rows[i], *y;
		char r1[16], r2[16], r3[16];
		double rp;

		if (match[i] == UINT32_MAX)
			continue;
		y = &b->rows[match[i]];
		rp = ratio(x->pages_s, y->pages_s);
		if (!isnan(rp))
			ratios[nratios++] = rp;
		fmt_ratio(r1, sizeof(r1), rp);
		fmt_ratio(r2, sizeof(r2), ratio(x->gbps, y->gbps));
		fmt_ratio(r3, sizeof(r3),
			  ratio(x->batch_lat.p99_us, y->batch_lat.p99_us));
		pcb_series_label(x, label, sizeof(label));
		fprintf(out,
			"%-*s %5u %11.0f %11.0f %7s %8.3f %8.3f %7s %10.1f %10.1f %7s\n",
			(int)lw, label, x->concurrency,
			isfinite(x->pages_s) ? x->pages_s : 0,
			isfinite(y->pages_s) ? y->pages_s : 0, r1,
			isfinite(x->gbps) ? x->gbps : 0,
			isfinite(y->gbps) ? y->gbps : 0, r2,
			isfinite(x->batch_lat.p99_us) ? x->batch_lat.p99_us : 0,
			isfinite(y->batch_lat.p99_us) ? y->batch_lat.p99_us : 0,
			r3);
	}
	for (unsigned i = 0; i < a->nrows; i++)
		if (match[i] == UINT32_MAX)
			only_in(out, name_a, &a->rows[i]);
	for (unsigned j = 0; j < b->nrows; j++)
		if (!used[j])
			only_in(out, name_b, &b->rows[j]);
	if (nratios) {
		qsort(ratios, nratios, sizeof(*ratios), cmp_dbl);
		double med = nratios % 2 ? ratios[nratios / 2] :
			(ratios[nratios / 2 - 1] + ratios[nratios / 2]) / 2;
		fprintf(out, "pages/s B/A over %u matched rows: min %.3f, "
			     "median %.3f, max %.3f\n",
			nratios, ratios[0], med, ratios[nratios - 1]);
	} else if (nmatched) {
		fprintf(out, "pages/s B/A: no matched row of A has pages/s "
			     "above 0\n");
	} else {
		fprintf(out, "no row of %s matches a row of %s (same target, "
			     "via, op, mode, batch and concurrency)\n",
			name_b, name_a);
	}
	free(match);
	free(used);
	free(ratios);
	if (fflush(out) != 0 || ferror(out))
		return -EIO;
	return nmatched ? 0 : -ENOENT;
}
