/*
 * common/blocks.h — large buffers kept warm for the next call on a thread.
 *
 * A buffer of tens of MiB that is malloc'd and freed on every call costs a
 * page fault per 4 KiB on every call (glibc maps blocks of 32 MiB and more
 * afresh, and trims freed heap tops): in a VM about 13 us a page, so 16 MiB
 * faulted in is ~50 ms of the thread's time, more than the copy into it.
 * A cache keeps the last few blocks given back instead, up to a byte cap,
 * so that the next call of a similar size reuses memory already faulted in.
 *
 * Owns: the blocks kept (struct pc_blocks). Threads: a cache belongs to
 * one thread (a reactor's); a block may be taken and given back on that
 * thread only. A NULL cache keeps nothing: take allocates, put frees.
 *
 * Invariants: a cache keeps at most PC_BLOCKS_KEEP blocks of at most
 * PC_BLOCKS_KEEP_BYTES in all (kept); a block is either kept or the
 * caller's, never both; take returns the smallest kept block that fits.
 * Blocks of PC_BLOCK_MAP_MIN and more are anonymous mappings of their own
 * (cap rounded up to a page), so that one can grow in place: one made by a
 * cache with a reserve (the reactor's input buffers) holds that much
 * address space (PROT_NONE past cap, no memory, not committed) and grows
 * into it without moving. A move (mremap) would
 * cost nothing on bare metal, but in a guest whose hypervisor shadows page
 * tables every page moved is new to the hypervisor: the next access of
 * each pays its fault again (~7 us a page here; growing a 32 MiB kv.set's
 * input by doubling left the first copy slices 0.9 ms of such faults).
 *
 * Users: each reactor keeps two caches (reactor/rx_internal.h): one for
 * the input of large messages, and one for its modules
 * (rx_reactor_blocks): kv's and slotmap's staging for kv.get replies and
 * bucket reads (modules/kv.c, modules/slotmap_kv.c), handed over to the
 * reply with struct pc_block_set (modules/kv.h, kv_got.stage).
 */
#ifndef PC_COMMON_BLOCKS_H
#define PC_COMMON_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#define PC_BLOCKS_KEEP 4                  /* blocks a cache keeps */
/* ... of at most 64 MiB of payload, and room for a message's framing on
 * each: a kv.set of 8 x 4 MiB is 32 MiB and a few hundred bytes, 32 MiB +
 * 4 KiB once rounded to pages, and a cap of 64 MiB flat kept only one of
 * two such buffers (the other was unmapped, the next one faulted in
 * again). */
#define PC_BLOCK_FRAMING (64ull << 10)
#define PC_BLOCKS_KEEP_BYTES ((64ull << 20) + PC_BLOCKS_KEEP * PC_BLOCK_FRAMING)
#define PC_BLOCK_SET_MAX 3                /* blocks in one set */
#define PC_BLOCK_MAP_MIN (1ull << 20)     /* blocks this large are mapped:
					   * they can grow in place */
#define PC_BLOCK_RESERVE (64ull << 20)    /* ... up to this much without
					   * moving */
/* pc_block_free_sliced's step: short enough that no madvise holds the mmap
 * lock long, long enough that a 32 MiB block costs the reactors' CPUs few
 * TLB shootdowns (one per call), and a whole transparent huge page, so
 * that where THP is always on no slice splits one (bench/unmap_bench.c). */
#define PC_BLOCK_FREE_SLICE (2ull << 20)

struct pc_block {
	uint8_t *p;   /* NULL: none */
	uint64_t cap; /* its size */
	uint64_t res; /* a mapped block's address space at p: cap, or more
		       * (PROT_NONE past cap) that it grows into; 0 for one
		       * from the heap */
	bool fresh;   /* a new mapping nobody wrote yet: its first writes
		       * fault every page in (a kept block is not fresh) */
};

struct pc_blocks {
	struct pc_block keep[PC_BLOCKS_KEEP];
	uint64_t kept;    /* bytes of keep[] */
	uint64_t reserve; /* address space the mapped blocks this cache
			   * makes hold (PC_BLOCK_RESERVE for blocks that
			   * grow, e.g. input buffers); 0: their size */
	/* Where a mapped block the cache lets go goes (NULL: freed here):
	 * unmapping tens of MiB of written pages takes milliseconds, so a
	 * reactor hands it to its offload thread. drop owns *b (a copy). */
	void (*drop)(struct pc_block *b, void *arg);
	void *drop_arg;
};

/* The blocks one call took from one cache, given back together. */
struct pc_block_set {
	struct pc_blocks *home; /* where they go back (NULL: freed) */
	struct pc_block b[PC_BLOCK_SET_MAX];
};

/* A block of at least bytes (> 0) into *out: the smallest kept one that
 * fits, else a new one. Its address, or NULL (and *out empty) when out of
 * memory. */
uint8_t *pc_blocks_take(struct pc_blocks *c, uint64_t bytes,
			struct pc_block *out);
/* The smallest kept block of at least bytes into *out, taken out of c;
 * false (and *out empty) when c keeps none that fits: nothing new is
 * made. */
bool pc_blocks_take_kept(struct pc_blocks *c, uint64_t bytes,
			 struct pc_block *out);
/* Give *b back to c and empty it: kept while c keeps little (the smallest
 * kept block makes room for a larger one that then fits), else freed.
 * NULL p: nothing. */
void pc_blocks_put(struct pc_blocks *c, struct pc_block *b);
/* Free every block c keeps. */
void pc_blocks_drop(struct pc_blocks *c);

/* Free a block (taken, not kept) and empty it. NULL p: nothing. A block's
 * memory is freed only here (or through a cache): never with free(). */
void pc_block_free(struct pc_block *b);
/* pc_block_free for a thread that may take its time (an offload thread):
 * a mapped block's pages are given back PC_BLOCK_FREE_SLICE at a time
 * (pc_block_drop_pages) before the now empty range is unmapped, so that no
 * call holds the process's mmap lock for the whole teardown: one munmap of
 * 32 MiB of written pages held it 2-7 ms (perf trace, under load), and a
 * reactor growing a block (mprotect) waited for it. */
void pc_block_free_sliced(struct pc_block *b);
/* Give a mapped block's pages [p, p + cap) back to the kernel, slice bytes
 * (a multiple of the page size) at a time (MADV_DONTNEED): the block stays
 * mapped and reads zeros. A heap block or an empty one: nothing. */
void pc_block_drop_pages(struct pc_block *b, uint64_t slice);
/* Make b hold at least bytes, keeping its contents, without copying them:
 * in place up to PC_BLOCK_RESERVE (mprotect), moved past it (mremap); the
 * new pages are faulted in as they are first written. Only a mapped block
 * can (cap >= PC_BLOCK_MAP_MIN): false, b unchanged, otherwise or when out
 * of memory. */
bool pc_block_grow(struct pc_block *b, uint64_t bytes);

/* Fault [p, p + len) of a block in for writing (MADV_POPULATE_WRITE, then
 * pc_pages_touch; on a kernel without it, a zero written to every page, so
 * only on bytes that hold nothing yet). Slow — about 7 us a page in a VM —
 * so made off the reactor, on a block nobody else touches meanwhile. Any
 * thread. */
void pc_block_fault_in(uint8_t *p, uint64_t len);

/*
 * Read one byte of every page of [p, p + len). MADV_POPULATE_WRITE fills
 * the kernel's page tables, but a hypervisor that shadows them (the PVM
 * guest this project is tested in) still takes a fault of its own on the
 * first access to each page from user space, unseen by the kernel's fault
 * counters: ~6 us a page there, so a 512 KiB copy slice into populated
 * memory ran over 1 ms of a reactor's CPU. Touched once, later accesses
 * cost nothing extra; on a host without shadowing the touch is ~0.05 us a
 * page. A read, so safe while other threads write the same pages. Any
 * thread; the memory must stay mapped meanwhile.
 */
void pc_pages_touch(const void *p, uint64_t len);

/* Block i of set s (empty before), taken from s->home. */
uint8_t *pc_block_set_take(struct pc_block_set *s, unsigned i,
			   uint64_t bytes);
/* Give every block of s back home; s is empty after. */
void pc_block_set_put(struct pc_block_set *s);

#endif /* PC_COMMON_BLOCKS_H */
