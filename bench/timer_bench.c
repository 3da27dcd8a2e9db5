/*
 * bench/timer_bench.c — pc-timer-bench: what arming and stopping a reactor
 * timer costs (reactor/timer.c) with many timers armed, as the node's calls
 * do (each arms its deadline, its directory job, its RPCs, its transfers).
 * For each count of armed timers: re-arming a random one with a random
 * delay (1 ms to 1 s), and stopping one then arming it again; ns per
 * operation, best of --runs (default 5). Only the calling thread's reactor
 * is created; nothing runs on it.
 *
 *   pc-timer-bench [--runs N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "reactor/reactor.h"

enum { OPS = 1000000 };

static void nop(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
}

static uint64_t delay(void)
{
	return (uint64_t)(1000 + rand() % 1000000) * 1000;
}

/* ns per re-arm (stop_too: per stop + arm) with live timers armed. */
static double per_op(struct rx_reactor *r, struct rx_timer *t, unsigned live,
		     int stop_too)
{
	uint64_t t0 = pc_now_ns();
	for (unsigned k = 0; k < OPS; k++) {
		struct rx_timer *x = &t[(unsigned)rand() % live];
		if (stop_too)
			rx_timer_stop(r, x);
		rx_timer_start(r, x, delay(), 0);
	}
	return (double)(pc_now_ns() - t0) / OPS;
}

int main(int argc, char **argv)
{
	int runs = 5;
	if (argc == 3 && strcmp(argv[1], "--runs") == 0 && atoi(argv[2]) > 0) {
		runs = atoi(argv[2]);
	} else if (argc != 1) {
		fprintf(stderr, "usage: pc-timer-bench [--runs N]\n");
		return 2;
	}
	pc_log_set_level(PC_LOG_WARN);
	struct rx_params p;
	rx_params_default(&p);
	struct rx_reactor *r = NULL;
	int ret = rx_reactor_create(&r, 0, &p);
	if (ret < 0) {
		fprintf(stderr, "pc-timer-bench: no reactor: %s\n",
			strerror(-ret));
		return 1;
	}
	static const unsigned counts[] = {1000, 10000, 100000, 1000000};
	printf("| timers armed | re-arm, ns | stop + arm, ns |\n|---:|---:|---:|\n");
	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		unsigned live = counts[c];
		struct rx_timer *t = calloc(live, sizeof(*t));
		if (!t)
			return 1;
		srand(1);
		for (unsigned i = 0; i < live; i++) {
			rx_timer_init(&t[i], nop, NULL);
			rx_timer_start(r, &t[i], delay(), 0);
		}
		double best[2] = {1e18, 1e18};
		for (int k = 0; k < runs; k++)
			for (int s = 0; s < 2; s++) {
				double v = per_op(r, t, live, s);
				best[s] = v < best[s] ? v : best[s];
			}
		printf("| %u | %.0f | %.0f |\n", live, best[0], best[1]);
		for (unsigned i = 0; i < live; i++)
			rx_timer_stop(r, &t[i]);
		free(t);
	}
	rx_reactor_destroy(r);
	return 0;
}
