/*
 * tests/unit/test_blocks.c — common/blocks.h: a block given back is the
 * next one taken (warm memory, not a fresh mapping), the smallest that
 * fits is taken, and the cache never keeps more than its cap of blocks
 * and bytes; a set goes back home whole; a large block grows in place.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/blocks.h"
#include "common/util.h"

#define MB (1ull << 20)

static unsigned kept_blocks(const struct pc_blocks *c)
{
	unsigned n = 0;
	for (int i = 0; i < PC_BLOCKS_KEEP; i++)
		n += c->keep[i].p != NULL;
	return n;
}

Test(blocks, a_block_given_back_is_taken_again)
{
	struct pc_blocks c = {0};
	struct pc_block b = {0};
	uint8_t *p = pc_blocks_take(&c, 40 * MB, &b);
	cr_assert(p && b.p == p && b.cap == 40 * MB);
	memset(p, 0xa5, 40 * MB); /* faulted in: what the cache keeps */
	pc_blocks_put(&c, &b);
	cr_assert_null(b.p, "the caller's handle is emptied");
	cr_assert_eq(c.kept, 40 * MB);
	/* A smaller need takes it too, and gets its whole size. */
	uint8_t *q = pc_blocks_take(&c, 8 * MB, &b);
	cr_assert_eq(q, p, "the kept block, not a new one");
	cr_assert_eq(b.cap, 40 * MB);
	cr_assert_eq(c.kept, 0);
	cr_assert_eq(q[40 * MB - 1], 0xa5);
	pc_blocks_put(&c, &b);
	pc_blocks_drop(&c);
	cr_assert_eq(c.kept, 0);
	cr_assert_eq(kept_blocks(&c), 0);
}

Test(blocks, the_smallest_that_fits_is_taken)
{
	struct pc_blocks c = {0};
	struct pc_block b[3] = {{0}};
	uint64_t sizes[3] = {4 * MB, 16 * MB, 8 * MB};
	uint8_t *p[3];
	for (int i = 0; i < 3; i++)
		p[i] = pc_blocks_take(&c, sizes[i], &b[i]);
	for (int i = 0; i < 3; i++)
		pc_blocks_put(&c, &b[i]);
	cr_assert_eq(c.kept, 28 * MB);
	struct pc_block t = {0};
	cr_assert_eq(pc_blocks_take(&c, 5 * MB, &t), p[2], "8 MiB, not 16");
	struct pc_block u = {0};
	cr_assert_eq(pc_blocks_take(&c, 1 * MB, &u), p[0], "4 MiB");
	struct pc_block v = {0};
	uint8_t *fresh = pc_blocks_take(&c, 20 * MB, &v);
	cr_assert(fresh && fresh != p[1], "none fits: a new one");
	cr_assert_eq(c.kept, 16 * MB);
	pc_blocks_put(&c, &t);
	pc_blocks_put(&c, &u);
	pc_blocks_put(&c, &v);
	pc_blocks_drop(&c);
}

/* take_kept takes only what the cache keeps: the smallest that fits, or
 * nothing at all (no new block). */
Test(blocks, take_kept_makes_nothing_new)
{
	struct pc_blocks c = {0};
	struct pc_block b = {0}, s = {0}, t = {0};
	cr_assert_not(pc_blocks_take_kept(&c, 2 * MB, &b));
	cr_assert_null(b.p, "nothing made");
	cr_assert_not(pc_blocks_take_kept(NULL, 2 * MB, &b));
	pc_blocks_take(&c, 16 * MB, &b);
	pc_blocks_take(&c, 4 * MB, &s);
	uint8_t *big = b.p, *small = s.p;
	pc_blocks_put(&c, &b);
	pc_blocks_put(&c, &s);
	cr_assert_not(pc_blocks_take_kept(&c, 17 * MB, &t), "none fits");
	cr_assert_null(t.p);
	cr_assert(pc_blocks_take_kept(&c, 3 * MB, &t));
	cr_assert_eq(t.p, small, "the smallest that fits");
	cr_assert_eq(c.kept, 16 * MB);
	cr_assert(pc_blocks_take_kept(&c, 5 * MB, &b));
	cr_assert_eq(b.p, big);
	cr_assert_eq(c.kept, 0);
	pc_block_free(&b);
	pc_block_free(&t);
}

Test(blocks, keeps_at_most_its_blocks_and_bytes)
{
	struct pc_blocks c = {0};
	struct pc_block b[PC_BLOCKS_KEEP + 1] = {{0}};
	/* One more block than it keeps: the smallest goes for a larger one. */
	for (int i = 0; i <= PC_BLOCKS_KEEP; i++)
		pc_blocks_take(&c, (uint64_t)(i + 1) * MB, &b[i]);
	for (int i = 0; i <= PC_BLOCKS_KEEP; i++)
		pc_blocks_put(&c, &b[i]);
	cr_assert_eq(kept_blocks(&c), PC_BLOCKS_KEEP);
	uint64_t want = 0;
	for (int i = 1; i <= PC_BLOCKS_KEEP; i++)
		want += (uint64_t)(i + 1) * MB;
	cr_assert_eq(c.kept, want, "the 1 MiB block was freed");
	/* A smaller one than every kept block is freed, not kept. */
	struct pc_block s = {0};
	pc_blocks_take(NULL, 512 << 10, &s);
	pc_blocks_put(&c, &s);
	cr_assert_eq(c.kept, want);
	/* One that would not fit the byte cap even so: freed, and no kept
	 * block made room for it in vain. */
	struct pc_block big = {0};
	pc_blocks_take(NULL, PC_BLOCKS_KEEP_BYTES, &big);
	pc_blocks_put(&c, &big);
	cr_assert_eq(c.kept, want);
	cr_assert_eq(kept_blocks(&c), PC_BLOCKS_KEEP);
	pc_blocks_drop(&c);
	cr_assert_eq(c.kept, 0);
}

/* Two messages of 32 MiB of pages each, framing included (32 MiB + 4 KiB
 * once rounded to pages), are both kept: the cap has 64 KiB of slack for
 * each block it keeps over its 64 MiB of payload. A third is let go of:
 * the slack is not a second cap. */
Test(blocks, two_half_cap_messages_with_their_framing_are_both_kept)
{
	struct pc_blocks c = {0};
	struct pc_block a = {0}, b = {0};
	cr_assert_not_null(pc_blocks_take(&c, 32 * MB + 300, &a));
	cr_assert_not_null(pc_blocks_take(&c, 32 * MB + 300, &b));
	cr_assert_eq(a.cap, 32 * MB + 4096, "rounded up to a page");
	pc_blocks_put(&c, &a);
	pc_blocks_put(&c, &b);
	cr_assert_eq(kept_blocks(&c), 2, "one of the two was let go of");
	struct pc_block third = {0};
	cr_assert_not_null(pc_blocks_take(NULL, 32 * MB + 300, &third));
	pc_blocks_put(&c, &third);
	cr_assert_eq(kept_blocks(&c), 2, "a third one was kept");
	cr_assert_eq(c.kept, 2 * (32 * MB + 4096));
	pc_blocks_drop(&c);
}

/* A mapped block a cache lets go of goes to its drop hook (a reactor's
 * unmaps it off the loop), whole and once; heap blocks are freed. */
static struct {
	unsigned n;
	struct pc_block got[8];
} dropped;

static void drop_keep(struct pc_block *b, void *arg)
{
	cr_assert_eq(arg, &dropped);
	cr_assert_not_null(b->p);
	dropped.got[dropped.n++] = *b;
}

Test(blocks, a_block_let_go_goes_to_the_drop_hook)
{
	memset(&dropped, 0, sizeof(dropped));
	struct pc_blocks c = {.drop = drop_keep, .drop_arg = &dropped};
	struct pc_block b[6] = {{0}};
	uint8_t *p[6];
	for (int i = 0; i < 6; i++) { /* 4 x 16 MiB fit; the 5th and 6th not */
		p[i] = pc_blocks_take(&c, 16 * MB, &b[i]);
		p[i][0] = (uint8_t)i;
	}
	for (int i = 0; i < 6; i++)
		pc_blocks_put(&c, &b[i]);
	cr_assert_eq(c.kept, 64 * MB);
	cr_assert_eq(dropped.n, 2, "%u blocks dropped", dropped.n);
	for (unsigned i = 0; i < dropped.n; i++) {
		cr_assert_eq(dropped.got[i].p, p[4 + i], "not freed by the cache");
		cr_assert_eq(dropped.got[i].p[0], 4 + i);
		cr_assert_eq(dropped.got[i].cap, 16 * MB);
		pc_block_free(&dropped.got[i]);
	}
	/* A larger block displaces the smallest kept one: that one is let go. */
	struct pc_block small = {0}, big = {0};
	pc_blocks_drop(&c);
	cr_assert(c.drop == drop_keep, "drop keeps the hook");
	pc_blocks_take(&c, 1 * MB, &small);
	for (int i = 0; i < 3; i++)
		pc_blocks_take(&c, 8 * MB, &b[i]);
	pc_blocks_put(&c, &small);
	for (int i = 0; i < 3; i++)
		pc_blocks_put(&c, &b[i]);
	pc_blocks_take(&c, 30 * MB, &big);
	dropped.n = 0;
	pc_blocks_put(&c, &big);
	cr_assert_eq(dropped.n, 1);
	cr_assert_eq(dropped.got[0].cap, 1 * MB, "the smallest was let go");
	pc_block_free(&dropped.got[0]);
	/* Heap blocks never reach the hook. */
	struct pc_block h[5] = {{0}};
	struct pc_blocks hc = {.drop = drop_keep, .drop_arg = &dropped};
	dropped.n = 0;
	for (int i = 0; i < 5; i++)
		pc_blocks_take(&hc, 4096, &h[i]);
	for (int i = 0; i < 5; i++)
		pc_blocks_put(&hc, &h[i]);
	cr_assert_eq(dropped.n, 0);
	pc_blocks_drop(&hc);
	pc_blocks_drop(&c);
}

Test(blocks, no_cache_allocates_and_frees)
{
	struct pc_block b = {0};
	cr_assert_not_null(pc_blocks_take(NULL, 4096, &b));
	cr_assert_eq(b.cap, 4096);
	pc_blocks_put(NULL, &b);
	cr_assert_null(b.p);
}

Test(blocks, a_set_goes_back_home_whole)
{
	struct pc_blocks c = {0};
	struct pc_block_set s = {.home = &c};
	uint8_t *a = pc_block_set_take(&s, 0, 2 * MB);
	uint8_t *b = pc_block_set_take(&s, 2, 3 * MB);
	cr_assert(a && b && !s.b[1].p);
	/* Moved out (kv.get's reply keeps it): the old set gives nothing. */
	struct pc_block_set moved = s;
	memset(&s, 0, sizeof(s));
	pc_block_set_put(&s);
	cr_assert_eq(c.kept, 0);
	pc_block_set_put(&moved);
	cr_assert_eq(c.kept, 5 * MB);
	cr_assert(!moved.b[0].p && !moved.b[2].p);
	pc_blocks_drop(&c);
}

static long minor_faults(void)
{
	struct rusage ru;
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return ru.ru_minflt;
}

/* A mapped block grows without its bytes being copied: the pages already
 * written are not faulted in again (a copy into fresh memory faults every
 * one of them: 4,096 for 16 MiB). A small block cannot grow. */
Test(blocks, a_large_block_grows_in_place)
{
	struct pc_block b = {0};
	uint8_t *p = pc_blocks_take(NULL, 16 * MB, &b);
	cr_assert(p && b.cap >= 16 * MB);
	for (uint64_t i = 0; i < 16 * MB; i += 4096)
		p[i] = (uint8_t)(i >> 12);
	long f0 = minor_faults();
	cr_assert(pc_block_grow(&b, 48 * MB));
	long faults = minor_faults() - f0;
	cr_assert_geq(b.cap, 48 * MB);
	cr_assert_lt(faults, 256, "%ld page faults growing 16 MiB: copied",
		     faults);
	for (uint64_t i = 0; i < 16 * MB; i += 4096)
		cr_assert_eq(b.p[i], (uint8_t)(i >> 12), "byte %lu lost",
			     (unsigned long)i);
	b.p[48 * MB - 1] = 1; /* the new part is there */
	pc_block_free(&b);
	cr_assert_null(b.p);

	struct pc_block s = {0};
	pc_blocks_take(NULL, 4096, &s);
	uint8_t *was = s.p;
	cr_assert_not(pc_block_grow(&s, 8192), "a small block grew");
	cr_assert(s.p == was && s.cap == 4096);
	pc_block_free(&s);
}

/* The permissions of the mapping addr lies in ("rw-p", "---p"), or ""
 * when nothing is mapped there. */
static const char *prot_at(const void *addr, char out[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert_not_null(f);
	unsigned long lo, hi, a = (unsigned long)addr;
	char perms[5], line[512];
	out[0] = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 &&
		    a >= lo && a < hi) {
			memcpy(out, perms, 5);
			break;
		}
	fclose(f);
	return out;
}

/* A mapped block made by a cache with a reserve holds that much address
 * space, inaccessible past cap, and grows into it without moving (a move
 * makes each page new again to a hypervisor that shadows page tables);
 * past it, it moves and leaves nothing of the reservation behind; freed,
 * all of it is unmapped. A cache without a reserve (kv's staging, which
 * never grows) makes blocks of their size alone. */
Test(blocks, a_block_grows_in_its_reservation_without_moving)
{
	char pr[5];
	struct pc_blocks c = {.reserve = PC_BLOCK_RESERVE};
	struct pc_block b = {0};
	uint8_t *p = pc_blocks_take(&c, 2 * MB, &b);
	cr_assert(p && b.cap == 2 * MB && b.res == PC_BLOCK_RESERVE);
	cr_assert_str_eq(prot_at(p + 2 * MB, pr), "---p",
			 "past cap: reserved, not accessible");
	cr_assert_str_eq(prot_at(p + PC_BLOCK_RESERVE - 1, pr), "---p");
	cr_assert_str_eq(prot_at(p + 2 * MB - 1, pr), "rw-p");
	memset(p, 0x3c, 2 * MB);
	cr_assert(pc_block_grow(&b, 40 * MB));
	cr_assert_eq(b.p, p, "grown within the reservation: not moved");
	cr_assert_eq(b.cap, 40 * MB);
	cr_assert_str_eq(prot_at(p + 40 * MB - 1, pr), "rw-p");
	cr_assert_str_eq(prot_at(p + 40 * MB, pr), "---p");
	b.p[40 * MB - 1] = 1;
	/* Past the reservation from inside it: the reserved rest above the
	 * block makes it move, and none of the old range may stay mapped. */
	cr_assert(pc_block_grow(&b, PC_BLOCK_RESERVE + 8 * MB));
	cr_assert_eq(b.cap, PC_BLOCK_RESERVE + 8 * MB);
	cr_assert_eq(b.res, b.cap);
	cr_assert_neq(b.p, p, "grew over its own reservation in place");
	cr_assert_str_eq(prot_at(p + 40 * MB, pr), "",
			 "the old reservation's rest is still mapped");
	cr_assert_str_eq(prot_at(p + PC_BLOCK_RESERVE - 1, pr), "");
	cr_assert_eq(b.p[2 * MB - 1], 0x3c, "contents kept");
	cr_assert_eq(b.p[40 * MB - 1], 1);
	uint8_t *q = b.p;
	uint64_t cap = b.cap;
	pc_block_free(&b);
	cr_assert_str_eq(prot_at(q, pr), "");
	cr_assert_str_eq(prot_at(q + cap - 1, pr), "");

	uint8_t *r = pc_blocks_take(&c, 3 * MB, &b);
	pc_block_free(&b);
	cr_assert_str_eq(prot_at(r + PC_BLOCK_RESERVE - 1, pr), "",
			 "a freed block leaves its reservation mapped");

	struct pc_blocks plain = {0};
	uint8_t *s = pc_blocks_take(&plain, 3 * MB, &b);
	cr_assert_eq(b.res, 3 * MB, "no reserve: its size alone");
	pc_block_free(&b);
	cr_assert_str_eq(prot_at(s, pr), "");
	pc_blocks_drop(&c);
	cr_assert_eq(c.reserve, PC_BLOCK_RESERVE, "drop keeps the reserve");
}

/* Pages of [p, p + len) resident in memory (mincore). */
static uint64_t resident_pages(const uint8_t *p, uint64_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t n = len / (uint64_t)pg, in = 0;
	unsigned char *v = malloc(n);
	cr_assert_not_null(v);
	cr_assert_eq(mincore((void *)p, len, v), 0);
	for (uint64_t i = 0; i < n; i++)
		in += v[i] & 1;
	free(v);
	return in;
}

/* A block's pages given back a slice at a time are all gone from memory,
 * whatever the slice, and the block stays mapped, reading zeros; a page
 * mapped right past its end keeps its bytes. (That no call holds
 * the mmap lock long is a matter of time: bench/unmap_bench.c.) */
Test(blocks, dropped_pages_are_given_back_and_nothing_else)
{
	char pr[5];
	const uint64_t slices[] = {4096, 256 << 10, PC_BLOCK_FREE_SLICE,
				   3 * MB};
	for (unsigned k = 0; k < PC_ARRAY_LEN(slices); k++) {
		struct pc_blocks c = {.reserve = PC_BLOCK_RESERVE};
		struct pc_block b = {0};
		uint8_t *p = pc_blocks_take(&c, 2 * MB, &b);
		cr_assert(p && pc_block_grow(&b, 5 * MB + 4096));
		/* The neighbour: a written page right past cap, in place of
		 * the reservation's (the block's own address space, so it is
		 * ours to put there). */
		uint8_t *next = mmap(p + b.cap, 4096, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
				     -1, 0);
		cr_assert(next == p + b.cap, "the neighbour could not be placed");
		next[0] = 0x11;
		memset(p, 0x7e, b.cap);
		cr_assert_eq(resident_pages(p, b.cap), b.cap / 4096);
		pc_block_drop_pages(&b, slices[k]);
		cr_assert_eq(b.p, p, "the block was freed, not emptied");
		cr_assert_eq(resident_pages(p, b.cap), 0,
			     "pages left in memory (slice %llu)",
			     (unsigned long long)slices[k]);
		cr_assert_str_eq(prot_at(p + b.cap - 1, pr), "rw-p");
		cr_assert_eq(p[0], 0);
		cr_assert_eq(p[b.cap - 1], 0);
		cr_assert_eq(next[0], 0x11, "the neighbour lost its bytes");
		pc_block_free(&b); /* the neighbour with the reservation */
		cr_assert_str_eq(prot_at(next, pr), "");
	}
	struct pc_block h = {0};
	cr_assert_not_null(pc_blocks_take(NULL, 4096, &h));
	memset(h.p, 0x22, 4096);
	pc_block_drop_pages(&h, PC_BLOCK_FREE_SLICE);
	cr_assert_eq(h.p[4095], 0x22, "a heap block's bytes were dropped");
	pc_block_free(&h);
}

/* Freed a slice at a time (an offload thread's way), a mapped block leaves
 * nothing of its reservation mapped and is emptied, as pc_block_free
 * leaves it; a heap block is freed. */
Test(blocks, a_block_freed_in_slices_leaves_nothing_mapped)
{
	char pr[5];
	struct pc_blocks c = {.reserve = PC_BLOCK_RESERVE};
	struct pc_block b = {0};
	uint8_t *p = pc_blocks_take(&c, 2 * MB, &b);
	cr_assert(p && pc_block_grow(&b, 5 * MB + 4096));
	memset(p, 0x7e, b.cap);
	uint64_t cap = b.cap;
	pc_block_free_sliced(&b);
	cr_assert_null(b.p);
	cr_assert_eq(b.cap, 0);
	cr_assert_eq(b.res, 0);
	cr_assert_str_eq(prot_at(p, pr), "", "the block is still mapped");
	cr_assert_str_eq(prot_at(p + cap - 1, pr), "");
	cr_assert_str_eq(prot_at(p + PC_BLOCK_RESERVE - 1, pr), "",
			 "its reservation is still mapped");

	struct pc_blocks heap = {0};
	cr_assert_not_null(pc_blocks_take(&heap, 4096, &b));
	cr_assert_eq(b.res, 0, "a small block comes from the heap");
	pc_block_free_sliced(&b);
	cr_assert_null(b.p);
	pc_block_free_sliced(&b); /* an empty one: nothing */
}

/* A new mapped block is fresh until it comes back from a cache; faulted in
 * (off the reactor, by its user), writing it then faults no page of its
 * own, where writing a fresh one faults each (measured side by side: the
 * sanitizers' shadow faults count in both). */
Test(blocks, a_fresh_block_faulted_in_takes_no_fault_when_written)
{
	struct pc_blocks c = {0};
	struct pc_block b = {0}, cold = {0};
	cr_assert_not_null(pc_blocks_take(NULL, 8 * MB, &cold));
	long f0 = minor_faults();
	memset(cold.p, 0x5a, 8 * MB);
	long cold_faults = minor_faults() - f0;
	pc_block_free(&cold);
	cr_assert_not_null(pc_blocks_take(&c, 8 * MB, &b));
	cr_assert(b.fresh, "a new mapping is fresh");
	pc_block_fault_in(b.p, 8 * MB);
	f0 = minor_faults();
	memset(b.p, 0x5a, 8 * MB);
	long faults = minor_faults() - f0;
	cr_assert_lt(faults * 4, cold_faults, "%ld faults writing 8 MiB "
		     "faulted in, %ld not", faults, cold_faults);
	pc_blocks_put(&c, &b);
	cr_assert_not_null(pc_blocks_take(&c, 8 * MB, &b));
	cr_assert_not(b.fresh, "a kept block is not fresh");
	cr_assert_eq(b.p[8 * MB - 1], 0x5a);
	pc_blocks_put(&c, &b);
	struct pc_block s = {0};
	pc_blocks_take(NULL, 4096, &s);
	cr_assert_not(s.fresh, "small blocks are never fresh");
	pc_block_free(&s);
	pc_blocks_drop(&c);
}
