/*
 * bench/unmap_bench.c — pc-unmap-bench: what giving a large block back on
 * one thread costs a reactor on another (common/blocks.h).
 *
 * A "freer" thread does what a reactor's offload thread does with a block
 * its caches let go of: takes a mapped block with the input buffers'
 * reservation (PC_BLOCK_RESERVE), writes --block-mb of it, and frees it,
 * in a loop. A "reactor" thread meanwhile grows a block of its own by 1
 * MiB in place (mprotect, as a receive does) and gives the range back
 * (mprotect to PROT_NONE), timing each call: both calls take the
 * process's mmap lock for writing, so they wait while the freer holds it.
 * Rounds rotate the freer's ways: `whole` (one munmap, pc_block_free),
 * `sliced` by each --slices size (pc_block_drop_pages: MADV_DONTNEED a
 * slice at a time, then munmap of the empty range, as pc_block_free_sliced
 * does with PC_BLOCK_FREE_SLICE) and, for the floor, `kept` (it writes one
 * block over and over and frees nothing: what is left is the machine, a
 * preempted thread). Per mode, medians over the rounds: the reactor's
 * calls' p50/p99/p99.9/max in µs, calls over 0.5 ms, and the blocks
 * written (and freed) per second.
 *
 *   pc-unmap-bench [--rounds N] [--seconds S] [--block-mb M]
 *                  [--slices KIB,...]
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/blocks.h"
#include "common/util.h"

enum { MODES_MAX = 8 };
#define KEEP UINT64_MAX /* a mode's slice: free nothing */
#define WHOLE 0         /* ... one munmap */

struct run {
	uint64_t slice; /* KEEP, WHOLE, or MADV_DONTNEED slices of this */
	uint64_t block;
	bool stop;      /* __atomic */
	uint64_t freed;
};

static void *freer_main(void *arg)
{
	struct run *r = arg;
	struct pc_blocks c = {.reserve = PC_BLOCK_RESERVE};
	struct pc_block b = {0};
	while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
		if (!b.p && (!pc_blocks_take(&c, PC_BLOCK_MAP_MIN, &b) ||
			     !pc_block_grow(&b, r->block))) {
			fprintf(stderr, "pc-unmap-bench: out of memory\n");
			exit(1);
		}
		memset(b.p, 0x5a, r->block);
		if (r->slice != KEEP) {
			if (r->slice != WHOLE)
				pc_block_drop_pages(&b, r->slice);
			pc_block_free(&b);
		}
		r->freed++;
	}
	pc_block_free(&b);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

enum { STATS = 6 }; /* p50, p99, p99.9, max (µs), over 0.5 ms, freed/s */

static void one_round(uint64_t slice, double seconds, uint64_t block,
		      double out[STATS])
{
	size_t cap = 1u << 22, n = 0;
	uint64_t *lat = malloc(cap * sizeof(*lat));
	uint8_t *res = mmap(NULL, 2 * PC_BLOCK_MAP_MIN, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!lat || res == MAP_FAILED) {
		fprintf(stderr, "pc-unmap-bench: out of memory\n");
		exit(1);
	}
	struct run r = {.slice = slice, .block = block};
	pthread_t t;
	if (pthread_create(&t, NULL, freer_main, &r)) {
		fprintf(stderr, "pc-unmap-bench: cannot start the freer\n");
		exit(1);
	}
	uint64_t t0 = pc_now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
	for (uint64_t now = t0; now < end && n < cap; n++) {
		int prot = n % 2 ? PROT_NONE : PROT_READ | PROT_WRITE;
		if (mprotect(res + PC_BLOCK_MAP_MIN, PC_BLOCK_MAP_MIN, prot)) {
			fprintf(stderr, "pc-unmap-bench: mprotect: %s\n",
				strerror(errno));
			exit(1);
		}
		uint64_t after = pc_now_ns();
		lat[n] = after - now;
		now = after;
	}
	__atomic_store_n(&r.stop, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	if (n == 0) {
		fprintf(stderr, "pc-unmap-bench: no call was timed\n");
		exit(1);
	}
	if (n == cap)
		fprintf(stderr, "pc-unmap-bench: the round ended early, after "
			"%zu calls\n", cap);
	double took = (double)(pc_now_ns() - t0) / 1e9;
	munmap(res, 2 * PC_BLOCK_MAP_MIN);
	qsort(lat, n, sizeof(*lat), cmp_u64);
	uint64_t over = 0;
	for (size_t i = 0; i < n; i++)
		over += lat[i] > 500000;
	out[0] = (double)lat[n / 2] / 1e3;
	out[1] = (double)lat[n * 99 / 100] / 1e3;
	out[2] = (double)lat[n * 999 / 1000] / 1e3;
	out[3] = (double)lat[n - 1] / 1e3;
	out[4] = (double)over;
	out[5] = (double)r.freed / took;
	free(lat);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	int rounds = 5;
	double seconds = 2;
	long block_mb = 32;
	uint64_t slice[MODES_MAX] = {KEEP, WHOLE};
	int modes = 2;
	const char *slices = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--block-mb") && i + 1 < argc)
			block_mb = atol(argv[++i]);
		else if (!strcmp(argv[i], "--slices") && i + 1 < argc)
			slices = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--rounds N (5)] [--seconds S "
				"(2)] [--block-mb M (32)] [--slices KIB,... "
				"(PC_BLOCK_FREE_SLICE)]\n", argv[0]);
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (!slices)
		slice[modes++] = PC_BLOCK_FREE_SLICE;
	for (const char *p = slices; p && *p;) {
		char *end;
		long kib = strtol(p, &end, 10);
		if (end == p || kib < 4 || kib % 4 || kib > (64l << 10) ||
		    modes == MODES_MAX || (*end && *end != ',')) {
			fprintf(stderr, "pc-unmap-bench: --slices: up to %d sizes "
				"in KiB, multiples of 4 up to 65536, by commas\n",
				MODES_MAX - 2);
			return 2;
		}
		slice[modes++] = (uint64_t)kib << 10;
		p = *end ? end + 1 : end;
	}
	if (rounds < 1 || rounds > 100 || !(seconds >= 0.01 && seconds <= 3600) ||
	    block_mb < 2 || block_mb > (long)(PC_BLOCK_RESERVE >> 20)) {
		fprintf(stderr, "pc-unmap-bench: --rounds 1-100, --seconds "
			"0.01-3600, --block-mb 2-%llu\n",
			(unsigned long long)(PC_BLOCK_RESERVE >> 20));
		return 2;
	}
	static double v[MODES_MAX][STATS][100];
	for (int k = 0; k < rounds; k++)
		for (int i = 0; i < modes; i++) {
			int m = (k + i) % modes; /* rotate who goes first */
			double out[STATS];
			one_round(slice[m], seconds, (uint64_t)block_mb << 20,
				  out);
			for (int s = 0; s < STATS; s++)
				v[m][s][k] = out[s];
		}
	printf("a reactor's mprotect of 1 MiB while another thread frees %ld MiB "
	       "blocks; medians of %d rounds of %g s\n", block_mb, rounds,
	       seconds);
	printf("| freeing | p50 us | p99 us | p99.9 us | max us | over 0.5 ms "
	       "| blocks written (and freed)/s |\n"
	       "|---|---|---|---|---|---|---|\n");
	for (int m = 0; m < modes; m++) {
		char name[48];
		if (slice[m] == KEEP)
			snprintf(name, sizeof(name), "kept (the floor)");
		else if (slice[m] == WHOLE)
			snprintf(name, sizeof(name), "whole");
		else
			snprintf(name, sizeof(name), "sliced, %llu KiB",
				 (unsigned long long)(slice[m] >> 10));
		printf("| %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f |\n",
		       name, median(v[m][0], rounds),
		       median(v[m][1], rounds), median(v[m][2], rounds),
		       median(v[m][3], rounds), median(v[m][4], rounds),
		       median(v[m][5], rounds));
	}
	return 0;
}
