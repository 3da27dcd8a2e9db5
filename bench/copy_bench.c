/*
 * bench/copy_bench.c — pc-copy-bench: memcpy against pc_copy (common/copy.h)
 * at the source/destination distances where glibc's memcpy is slow on some
 * CPUs ((dst - src) mod 4096 in 1..63) and at ordinary ones, for page sizes
 * from 4 KiB to 4 MiB, warm (one buffer pair, in cache) and cold (a new
 * pair each copy, over 256 MiB). Prints GB/s, best of --runs (default 5).
 *
 *   pc-copy-bench [--runs N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/copy.h"

enum { SPAN = 256 << 20 };

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* GB/s of copying n bytes at distance dist, `slots` pairs apart. */
static double rate(uint8_t *src, uint8_t *dst, size_t n, size_t dist,
		   size_t slots, int use_pc)
{
	size_t stride = (n + 8192) & ~(size_t)4095;
	size_t reps = (size_t)(2ull << 30) / n;
	double t0 = now();
	for (size_t i = 0; i < reps; i++) {
		size_t o = (i % slots) * stride;
		uint8_t *d = dst + o + 64 + dist;
		const uint8_t *s = src + o + 64;
		if (use_pc)
			pc_copy(d, s, n);
		else
			memcpy(d, s, n);
	}
	return (double)n * (double)reps / (now() - t0) / 1e9;
}

int main(int argc, char **argv)
{
	int runs = 5;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
			runs = atoi(argv[++i]);
		} else {
			fprintf(stderr, "usage: pc-copy-bench [--runs N]\n"
					"memcpy against pc_copy (common/copy.h), "
					"GB/s, best of N runs (5)\n");
			return strcmp(argv[i], "--help") ? 2 : 0;
		}
	}
	if (runs < 1)
		runs = 1;
	uint8_t *src, *dst;
	if (posix_memalign((void **)&src, 4096, SPAN) ||
	    posix_memalign((void **)&dst, 4096, SPAN)) {
		fprintf(stderr, "pc-copy-bench: no memory for 2 x %d MiB\n",
			SPAN >> 20);
		return 1;
	}
	memset(src, 1, SPAN);
	memset(dst, 2, SPAN);
	printf("pc_copy's loop: %s\n", pc_copy_impl());
	printf("| size | memory | distance | memcpy GB/s | pc_copy GB/s |\n");
	printf("|---|---|---|---|---|\n");
	static const size_t sizes[] = {4096, 65536, 262144, 1 << 20, 4 << 20};
	static const size_t dists[] = {0, 6, 15, 40, 64, 4096 - 58};
	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++)
		for (int cold = 0; cold < 2; cold++)
			for (size_t k = 0; k < sizeof(dists) / sizeof(dists[0]);
			     k++) {
				size_t n = sizes[z];
				size_t stride = (n + 8192) & ~(size_t)4095;
				size_t slots = cold ? SPAN / stride : 1;
				double best[2] = {0, 0};
				for (int r = 0; r < runs; r++)
					for (int pc = 0; pc < 2; pc++) {
						double g = rate(src, dst, n,
								dists[k], slots,
								pc);
						if (g > best[pc])
							best[pc] = g;
					}
				printf("| %zu | %s | %zu | %.1f | %.1f |\n", n,
				       cold ? "cold" : "warm", dists[k],
				       best[0], best[1]);
			}
	free(src);
	free(dst);
	return 0;
}
