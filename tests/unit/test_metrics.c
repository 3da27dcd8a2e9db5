/*
 * tests/unit/test_metrics.c — the metric registry: per-thread shards summed
 * exactly, histogram quantiles within a few percent from 1 µs to 10 s,
 * the exposition format, gauge functions, collectors and label escaping.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"

static met_id g_ctr, g_hist;

static void *worker(void *arg)
{
	unsigned shard = (unsigned)(uintptr_t)arg;
	met_bind_thread(shard);
	for (int i = 0; i < 100000; i++)
		met_inc(g_ctr);
	return NULL;
}

Test(metrics, counters_sum_over_threads_exactly)
{
	met_reset();
	g_ctr = met_register(MET_COUNTER, "t_ops_total", "ops", NULL);
	cr_assert_eq(met_start(4), 0);
	pthread_t th[6];
	/* Shards 1..4 are private; two threads share shard 0 (atomics). */
	unsigned shards[6] = {1, 2, 3, 4, 0, 0};
	for (int i = 0; i < 6; i++)
		pthread_create(&th[i], NULL, worker,
			       (void *)(uintptr_t)shards[i]);
	for (int i = 0; i < 6; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(met_read(g_ctr), 600000);
	met_reset();
}

Test(metrics, histogram_quantiles_within_a_few_percent)
{
	met_reset();
	g_hist = met_register(MET_HISTOGRAM, "t_lat_seconds", "lat", NULL);
	cr_assert_eq(met_start(1), 0);
	met_bind_thread(1);
	/* For values spread over each decade, quantiles must be close. */
	static const double decades[] = {1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
	for (size_t d = 0; d < sizeof(decades) / sizeof(decades[0]); d++) {
		met_reset();
		g_hist = met_register(MET_HISTOGRAM, "t_lat_seconds", "l", NULL);
		met_start(1);
		met_bind_thread(1);
		/* 10000 values uniform in [x, 10x). */
		enum { N = 10000 };
		for (int i = 0; i < N; i++)
			met_observe_ns(g_hist, (uint64_t)(decades[d] *
				       (1.0 + 9.0 * i / N)));
		static const double qs[] = {0.5, 0.9, 0.99, 0.999};
		for (size_t k = 0; k < 4; k++) {
			double want = decades[d] * (1.0 + 9.0 * qs[k]);
			double got = (double)met_quantile_ns(g_hist, qs[k]);
			cr_assert_lt(fabs(got - want) / want, 0.03,
				     "decade %g q%g: got %g want %g",
				     decades[d], qs[k], got, want);
		}
		cr_assert_eq(met_read(g_hist), N);
	}
	/* 10 s itself. */
	met_observe_ns(g_hist, 10000000000ull);
	met_reset();
}

static double seven(void *arg)
{
	(void)arg;
	return 7.5;
}

static void coll(struct met_writer *w, void *arg)
{
	met_w_family(w, "t_coll_total", "from a collector", MET_COUNTER);
	met_w_sample(w, "t_coll_total", "kind=\"x\"", (double)(uintptr_t)arg);
}

Test(metrics, exposition_format)
{
	met_reset();
	met_id a = met_register(MET_COUNTER, "t_req_total", "requests",
				"method=\"a\"");
	met_id b = met_register(MET_COUNTER, "t_req_total", "requests",
				"method=\"b\"");
	met_id h = met_register(MET_HISTOGRAM, "t_op_latency_seconds", "lat",
				"op=\"read\"");
	met_register_fn("t_gauge", "a gauge", NULL, seven, NULL);
	met_register_collector(coll, (void *)(uintptr_t)42);
	cr_assert_eq(met_start(1), 0);
	met_bind_thread(1);
	met_add(a, 3);
	met_add(b, 5);
	met_observe_ns(h, 1500); /* 1.5 us */
	size_t len;
	char *t = met_render("n\"1\\x\ny", &len);
	cr_assert(t);
	cr_assert_eq(strlen(t), len);
	/* One HELP/TYPE per family, labels merged, node label escaped. */
	cr_assert(strstr(t, "# HELP t_req_total requests\n# TYPE t_req_total "
			    "counter\n"));
	cr_assert(strstr(t, "t_req_total{node=\"n\\\"1\\\\x\\ny\",method=\"a\"} "
			    "3\n"), "%s", t);
	cr_assert(strstr(t, ",method=\"b\"} 5\n"));
	cr_assert_null(strstr(strstr(t, "# TYPE t_req_total") + 1,
			      "# TYPE t_req_total"));
	/* The histogram: summary under its name, real histogram as _hist. */
	cr_assert(strstr(t, "# TYPE t_op_latency_seconds summary\n"));
	cr_assert(strstr(t, "op=\"read\",quantile=\"0.5\"}"));
	cr_assert(strstr(t, "t_op_latency_seconds_count{node="));
	cr_assert(strstr(t, "# TYPE t_op_latency_hist_seconds histogram\n"));
	cr_assert(strstr(t, "t_op_latency_hist_seconds_bucket{node=\"n\\\"1\\\\x"
			    "\\ny\",op=\"read\",le=\"1e-06\"} 0\n"), "%s", t);
	cr_assert(strstr(t, "le=\"2e-06\"} 1\n"));
	cr_assert(strstr(t, "le=\"+Inf\"} 1\n"));
	cr_assert(strstr(t, "t_gauge{node=\"n\\\"1\\\\x\\ny\"} 7.5\n"));
	cr_assert(strstr(t, "t_coll_total{node=\"n\\\"1\\\\x\\ny\",kind=\"x\"} "
			    "42\n"));
	free(t);
	met_reset();
}

Test(metrics, disabled_records_nothing_and_late_registration_fails)
{
	met_reset();
	met_id a = met_register(MET_COUNTER, "t_total", "t", NULL);
	cr_assert_eq(met_start(1), 0);
	cr_assert_eq(met_register(MET_COUNTER, "late_total", "t", NULL),
		     MET_NONE);
	met_bind_thread(1);
	met_set_enabled(false);
	met_inc(a);
	cr_assert_eq(met_read(a), 0);
	met_set_enabled(true);
	met_inc(a);
	cr_assert_eq(met_read(a), 1);
	met_reset();
}

/* The sliced render (met_render_step with no time budget: one step at a
 * time) writes exactly what met_render writes, a family of many histogram
 * series over several steps; an abandoned render frees what it holds. */
Test(metrics, sliced_render_equals_the_whole)
{
	met_reset();
	char labels[10][32];
	met_id h[10];
	for (int i = 0; i < 10; i++) {
		snprintf(labels[i], sizeof(labels[i]), "method=\"m%d\"", i);
		h[i] = met_register(MET_HISTOGRAM, "t_rpc_latency_seconds",
				    "lat", labels[i]);
	}
	met_id c = met_register(MET_COUNTER, "t_req_total", "requests", NULL);
	met_register_fn("t_gauge", "a gauge", NULL, seven, NULL);
	met_register_collector(coll, (void *)(uintptr_t)42);
	cr_assert_eq(met_start(1), 0);
	met_bind_thread(1);
	for (int i = 0; i < 10; i++)
		for (int k = 0; k <= i; k++)
			met_observe_ns(h[i], 1000u << k);
	met_add(c, 9);
	size_t len, slen;
	char *whole = met_render("n", &len);
	cr_assert(whole);
	struct met_render_job *j = met_render_begin("n");
	cr_assert(j);
	int ret, steps = 0;
	while ((ret = met_render_step(j, 0)) > 0)
		steps++;
	cr_assert_eq(ret, 0);
	/* 10 series, 4 per step, 3 parts: the family alone is 9+ steps. */
	cr_assert_geq(steps, 10, "%d steps", steps);
	char *sliced = met_render_finish(j, &slen);
	cr_assert(sliced);
	cr_assert_eq(slen, len);
	cr_assert_str_eq(sliced, whole);
	free(sliced);
	free(whole);
	j = met_render_begin("n");
	cr_assert_eq(met_render_step(j, 0), 1);
	cr_assert_eq(met_render_step(j, 0), 1); /* inside the histogram */
	cr_assert_null(met_render_finish(j, &slen), "not done: no text");
	met_reset();
}
