/*
 * common/copy.h — copies of page bytes (payloads of kilobytes to
 * gigabytes).
 *
 * Owns: pc_copy, memcpy for page payloads minus one pathology of the
 * C library's memcpy on some CPUs. Threading: any thread.
 *
 * Why: glibc's memcpy copies a few kilobytes to about a megabyte with
 * `rep movsb`, and on CPUs with fast string moves (ERMS/FSRM; AMD EPYC
 * here) that runs at a tenth of its speed when the destination lies a few
 * bytes past the source modulo 4 KiB: measured here, 256 KiB went at 3.4
 * GB/s with (dst - src) mod 4096 in 1..15, at 28-31 GB/s otherwise (cache
 * warm; 3.3 against 9.5-10 GB/s from cold memory; bench/copy_bench.c).
 * Newer glibc avoids `rep movsb` there on some Intel CPUs only; Debian 12's
 * (2.36) not at all. A node meets that distance whenever a record puts a
 * short key before the payload (the disk tier's records: payload at 64 +
 * key length, from a pool payload at 64) or a page arrives at an odd
 * offset of a receive buffer.
 *
 * pc_copy(dst, src, n) == memcpy(dst, src, n) (the ranges must not
 * overlap); when n >= PC_COPY_LOOP_MIN and (dst - src) mod 4096 is 1..63 it
 * copies with a vector loop (AVX2 where the CPU has it, else SSE2; memcpy
 * off x86-64), which runs at memcpy's usual speed at any distance.
 */
#ifndef PC_COMMON_COPY_H
#define PC_COMMON_COPY_H

#include <stddef.h>

#define PC_COPY_LOOP_MIN 2048u /* below it memcpy uses vector moves anyway */

void pc_copy(void *restrict dst, const void *restrict src, size_t n);

/* The loop in use for short distances: "avx2", "sse2" or "memcpy". */
const char *pc_copy_impl(void);

/* Tests: use the named loop from now on ("avx2", "sse2"); -ENOTSUP when
 * this CPU or build has no such loop. */
int pc_copy_use(const char *impl);

#endif /* PC_COMMON_COPY_H */
