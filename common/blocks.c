/*
 * common/blocks.c — large buffers kept warm per thread (blocks.h).
 *
 * Owns: the blocks a cache keeps; the caller's struct. The thread that
 * owns the cache only.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "common/blocks.h"
#include "common/util.h"

#define PAGE 4096u

static uint64_t page_round(uint64_t bytes)
{
	return (bytes + PAGE - 1) & ~(uint64_t)(PAGE - 1);
}

/* A new block of at least bytes: mapped at PC_BLOCK_MAP_MIN and more (so
 * that it can grow in place, pc_block_grow), else from malloc. */
static void block_new(uint64_t bytes, uint64_t reserve, struct pc_block *out)
{
	*out = (struct pc_block){0};
	if (bytes < PC_BLOCK_MAP_MIN) {
		out->p = malloc(bytes);
		out->cap = out->p ? bytes : 0;
		return;
	}
	uint64_t cap = page_round(bytes);
	uint64_t res = PC_MAX(cap, page_round(reserve));
	void *p = mmap(NULL, res, res > cap ? PROT_NONE : PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	if (res > cap && mprotect(p, cap, PROT_READ | PROT_WRITE) < 0) {
		munmap(p, res);
		return;
	}
	out->p = p;
	out->cap = cap;
	out->res = res;
	out->fresh = true;
}

void pc_block_free(struct pc_block *b)
{
	if (!b->p)
		return;
	if (b->cap >= PC_BLOCK_MAP_MIN)
		munmap(b->p, b->res);
	else
		free(b->p);
	*b = (struct pc_block){0};
}

void pc_block_drop_pages(struct pc_block *b, uint64_t slice)
{
	PC_ASSERT(slice > 0);
	if (!b->p || b->cap < PC_BLOCK_MAP_MIN)
		return;
	/* Slices end on multiples of slice from the block's start (a mapped
	 * block starts on a huge-page boundary when the kernel aligns it). */
	for (uint64_t at = 0; at < b->cap; at += slice)
		madvise(b->p + at, PC_MIN(slice, b->cap - at), MADV_DONTNEED);
}

void pc_block_free_sliced(struct pc_block *b)
{
	pc_block_drop_pages(b, PC_BLOCK_FREE_SLICE);
	pc_block_free(b);
}

bool pc_block_grow(struct pc_block *b, uint64_t bytes)
{
	if (bytes <= b->cap)
		return true;
	if (!b->p || b->cap < PC_BLOCK_MAP_MIN)
		return false;
	uint64_t cap = page_round(bytes);
	PC_ASSERT(b->res >= b->cap);
	if (cap <= b->res) { /* in place: nothing moves */
		if (mprotect(b->p + b->cap, cap - b->cap,
			     PROT_READ | PROT_WRITE) < 0)
			return false;
		b->cap = cap;
		return true;
	}
	/* Past the reservation: the written part moves to a mapping of its
	 * own size (its pages are then new to a hypervisor that shadows page
	 * tables: blocks.h), and the old reservation's rest is unmapped. A
	 * failed move leaves the block as it was. */
	uint8_t *old = b->p;
	void *p = mremap(b->p, b->cap, cap, MREMAP_MAYMOVE);
	if (p == MAP_FAILED)
		return false;
	if (b->res > b->cap && (uint8_t *)p != old)
		munmap(old + b->cap, b->res - b->cap);
	b->p = p;
	b->cap = b->res = cap;
	return true;
}

bool pc_blocks_take_kept(struct pc_blocks *c, uint64_t bytes,
			 struct pc_block *out)
{
	PC_ASSERT(bytes > 0 && !out->p);
	int best = -1;
	for (int i = 0; c && i < PC_BLOCKS_KEEP; i++)
		if (c->keep[i].p && c->keep[i].cap >= bytes &&
		    (best < 0 || c->keep[i].cap < c->keep[best].cap))
			best = i;
	if (best < 0)
		return false;
	*out = c->keep[best];
	c->kept -= out->cap;
	c->keep[best] = (struct pc_block){0};
	return true;
}

uint8_t *pc_blocks_take(struct pc_blocks *c, uint64_t bytes,
			struct pc_block *out)
{
	if (!pc_blocks_take_kept(c, bytes, out))
		block_new(bytes, c ? c->reserve : 0, out);
	return out->p;
}

/* A block c lets go of: to its drop hook when mapped, else freed. */
static void let_go(struct pc_blocks *c, struct pc_block *b)
{
	if (c && c->drop && b->p && b->cap >= PC_BLOCK_MAP_MIN) {
		struct pc_block give = *b;
		*b = (struct pc_block){0};
		c->drop(&give, c->drop_arg);
		return;
	}
	pc_block_free(b);
}

void pc_blocks_put(struct pc_blocks *c, struct pc_block *b)
{
	struct pc_block give = *b;
	*b = (struct pc_block){0};
	if (!give.p)
		return;
	int slot = -1, small = -1;
	for (int i = 0; c && i < PC_BLOCKS_KEEP; i++) {
		if (!c->keep[i].p)
			slot = slot < 0 ? i : slot;
		else if (small < 0 || c->keep[i].cap < c->keep[small].cap)
			small = i;
	}
	/* Full: the smallest kept block makes room for a larger one, if the
	 * larger one then fits the byte cap. */
	if (c && slot < 0 && c->keep[small].cap < give.cap &&
	    c->kept - c->keep[small].cap + give.cap <= PC_BLOCKS_KEEP_BYTES) {
		c->kept -= c->keep[small].cap;
		let_go(c, &c->keep[small]);
		slot = small;
	}
	if (slot < 0 || c->kept + give.cap > PC_BLOCKS_KEEP_BYTES) {
		let_go(c, &give);
		return;
	}
	give.fresh = false; /* it was used (mostly written, then) */
	c->keep[slot] = give;
	c->kept += give.cap;
}

void pc_blocks_drop(struct pc_blocks *c)
{
	for (int i = 0; i < PC_BLOCKS_KEEP; i++)
		pc_block_free(&c->keep[i]);
	*c = (struct pc_blocks){.reserve = c->reserve, .drop = c->drop,
				.drop_arg = c->drop_arg};
}

void pc_block_fault_in(uint8_t *p, uint64_t len)
{
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
	uint64_t n = page_round((uintptr_t)p + len - a);
	if (len == 0)
		return;
	if (madvise((void *)a, n, MADV_POPULATE_WRITE) == 0) {
		pc_pages_touch(p, len);
		return;
	}
	for (uint64_t off = 0; off < len; off += PAGE)
		((volatile uint8_t *)p)[off] = 0;
}

void pc_pages_touch(const void *p, uint64_t len)
{
	if (len == 0)
		return;
	const volatile uint8_t *b = p;
	(void)b[0]; /* then the first byte of every page after p's */
	for (uint64_t off = PAGE - ((uintptr_t)p & (PAGE - 1)); off < len;
	     off += PAGE)
		(void)b[off];
}

uint8_t *pc_block_set_take(struct pc_block_set *s, unsigned i,
			   uint64_t bytes)
{
	PC_ASSERT(i < PC_BLOCK_SET_MAX);
	return pc_blocks_take(s->home, bytes, &s->b[i]);
}

void pc_block_set_put(struct pc_block_set *s)
{
	for (unsigned i = 0; i < PC_BLOCK_SET_MAX; i++)
		pc_blocks_put(s->home, &s->b[i]);
}
