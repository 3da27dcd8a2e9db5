/*
 * common/checksum_avx2.c — XXH3-64 compiled for AVX2 (see checksum.h).
 * Called only when the CPU has AVX2 (checksum.c checks at run time).
 */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t pc_page_sum_avx2(const void *p, size_t n);

uint64_t pc_page_sum_avx2(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

void pc_sum_update_avx2(void *st, const void *p, size_t n);

void pc_sum_update_avx2(void *st, const void *p, size_t n)
{
	XXH3_64bits_update((XXH3_state_t *)st, p, n);
}
