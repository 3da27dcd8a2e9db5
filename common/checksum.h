/*
 * common/checksum.h — the page checksum: XXH3-64 (seed 0) of a page's bytes.
 *
 * Owns: picking, once per process, the fastest implementation this CPU runs
 * (AVX2 where the CPU has it, else SSE2). Every implementation returns
 * exactly XXH3_64bits(p, n) of libxxhash, so nodes on different CPUs agree.
 * Threading: any thread.
 *
 * Why not libxxhash: Debian builds it for baseline x86-64 (SSE2), about half
 * the speed of AVX2 on large inputs, and the checksum is on the hot path of
 * every publish and every remote read.
 */
#ifndef PC_COMMON_CHECKSUM_H
#define PC_COMMON_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t pc_page_sum(const void *p, size_t n);

/*
 * The same sum over a page given in pieces (for work cut into slices):
 * reset, update with the bytes in order, digest == pc_page_sum of them all.
 * The state is opaque; it holds an XXH3 state (checked at build time).
 */
struct pc_sum_state {
	_Alignas(64) unsigned char opaque[640];
};
void pc_sum_reset(struct pc_sum_state *st);
void pc_sum_update(struct pc_sum_state *st, const void *p, size_t n);
uint64_t pc_sum_digest(const struct pc_sum_state *st);

/* The implementation in use: "avx2" or "sse2" (or "scalar" off x86-64). */
const char *pc_page_sum_impl(void);

#endif /* PC_COMMON_CHECKSUM_H */
