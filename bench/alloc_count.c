/*
 * bench/alloc_count.c — an LD_PRELOAD library that counts a process's heap
 * allocations, for bench/alloc_bench.py.
 *
 * Owns: one counter page. When PC_ALLOC_COUNT_FILE names a file, the
 * library maps its first 4 KiB shared at start and counts there (u64 at
 * offset 0: malloc + calloc + realloc + aligned allocations, all threads),
 * so another process reads the count before and after a request without
 * talking to the counted one. Without the variable nothing is counted.
 * Threading: the counter is bumped atomically; allocation itself goes to
 * glibc's own entry points (__libc_*), so nothing here allocates.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
void *memalign(size_t align, size_t n); /* glibc's malloc.h */

static uint64_t *counter;

__attribute__((constructor)) static void ac_init(void)
{
	const char *path = getenv("PC_ALLOC_COUNT_FILE");
	if (!path || !*path)
		return;
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return;
	if (ftruncate(fd, 4096) == 0) {
		void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED,
			       fd, 0);
		if (p != MAP_FAILED)
			counter = p;
	}
	close(fd);
}

static void ac_count(void)
{
	if (counter)
		__atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
}

void *malloc(size_t n)
{
	ac_count();
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	ac_count();
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	ac_count();
	return __libc_realloc(p, n);
}

void *memalign(size_t align, size_t n)
{
	ac_count();
	return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	ac_count();
	return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	ac_count();
	void *p = __libc_memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}
