/*
 * tests/unit/test_copier.c — page copies in slices (modules/copier.c) and
 * the stall detector (reactor/stall.c) on a single reactor.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/util.h"
#include "modules/copier.h"
#include "reactor/stall.h"
#include "testutil.h"

#define MIB (1u << 20)

struct ctx {
	struct rx_reactor *r;
	struct copier_job job, job2;
	uint8_t *src, *dst;
	size_t len;
	int started;         /* copier_copy's return */
	int done;            /* done callbacks seen */
	uint64_t iters0, iters;
	struct rx_timer t, t2;
	bool sum_only;       /* start_one: a checksum of src, no copy */
};

static struct ctx c;

static void job_done(struct copier_job *j)
{
	c.done++;
	if (j == &c.job)
		c.iters = rx_reactor_stats(c.r)->loop_iterations - c.iters0;
	if (!c.job.done || c.done == (c.job2.len ? 2 : 1))
		rx_reactor_stop(c.r);
}

static void setup_bufs(size_t len)
{
	c.len = len;
	c.src = malloc(len);
	c.dst = malloc(len);
	cr_assert(c.src && c.dst);
	tu_fill_pattern(c.src, len, 7, 0);
	memset(c.dst, 0xEE, len);
}

static void start_one(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	c.iters0 = rx_reactor_stats(r)->loop_iterations;
	c.job = (struct copier_job){.dst = c.sum_only ? NULL : c.dst,
				    .src = c.src, .len = c.len, .sum = true,
				    .done = job_done};
	c.started = copier_copy(r, &c.job);
	if (c.started == 1)
		rx_reactor_stop(r);
}

/* A fresh case: the copier's slice, buffers of len bytes (sum_only: no
 * destination), a reactor running start until the case stops it; then
 * (NULL: none) is c.t2's callback, for start to arm. */
static void run_case_then(size_t slice, size_t len, bool sum_only,
			  void (*start)(struct rx_reactor *, struct rx_timer *),
			  void (*then)(struct rx_reactor *, struct rx_timer *))
{
	c = (struct ctx){0};
	copier_set_slice(slice);
	setup_bufs(len);
	c.r = tu_reactor(NULL);
	c.sum_only = sum_only;
	rx_timer_init(&c.t, start, NULL);
	if (then)
		rx_timer_init(&c.t2, then, NULL);
	rx_timer_start(c.r, &c.t, 0, 0);
	tu_run(c.r, 20000);
}

static void run_case(size_t slice, size_t len, bool sum_only,
		     void (*start)(struct rx_reactor *, struct rx_timer *))
{
	run_case_then(slice, len, sum_only, start, NULL);
}

Test(copier, big_page_takes_several_passes)
{
	run_case(512 << 10, 4 * MIB, false, start_one);
	cr_assert_eq(c.started, 0, "a 4 MiB copy must not finish in one pass");
	cr_assert_eq(c.done, 1);
	cr_assert_eq(c.job.res, 0);
	cr_assert_geq(c.iters, 7, "4 MiB in 512 KiB slices: 8 passes, got %llu",
		      (unsigned long long)c.iters);
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
	cr_assert_eq(c.job.sumv, pc_page_sum(c.src, c.len),
		     "the sliced checksum equals the one-shot one");
	rx_reactor_destroy(c.r);
}

Test(copier, small_page_finishes_inline)
{
	run_case(512 << 10, 4096, false, start_one);
	cr_assert_eq(c.started, 1);
	cr_assert_eq(c.done, 0, "done is not called for an inline finish");
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
	cr_assert_eq(c.job.sumv, pc_page_sum(c.src, c.len));
	rx_reactor_destroy(c.r);
}

Test(copier, a_checksum_without_a_copy_is_sliced_too)
{
	run_case(512 << 10, 4 * MIB, true, start_one);
	cr_assert_eq(c.started, 0, "a 4 MiB checksum must not finish in one "
		     "pass");
	cr_assert_eq(c.done, 1);
	cr_assert_eq(c.job.res, 0);
	cr_assert_geq(c.iters, 7, "4 MiB in 512 KiB slices: 8 passes, got %llu",
		      (unsigned long long)c.iters);
	cr_assert_eq(c.job.sumv, pc_page_sum(c.src, c.len));
	for (size_t i = 0; i < c.len; i++)
		if (c.dst[i] != 0xEE)
			cr_assert_fail("a checksum-only job wrote at %zu", i);
	rx_reactor_destroy(c.r);
}

/* Every timer slot with a delay taken: the copier's zero-delay timer
 * needs none, so the copy still goes in slices, and done runs once. */
static void start_without_timer(struct rx_reactor *r, struct rx_timer *t)
{
	/* tu_run's time limit holds the only slot. */
	rx_timer_init(&c.t2, NULL, NULL);
	cr_assert_eq(rx_timer_start(r, &c.t2, RX_MS(60000), 0), -ENOSPC,
		     "the heap is full");
	start_one(r, t);
}

Test(copier, with_every_timer_slot_taken_a_copy_still_goes_in_slices)
{
	c = (struct ctx){0};
	copier_set_slice(512 << 10);
	setup_bufs(4 * MIB);
	struct rx_params p;
	rx_params_default(&p);
	p.timers_max = 1;
	c.r = tu_reactor(&p);
	rx_timer_init(&c.t, start_without_timer, NULL);
	cr_assert_eq(rx_timer_start(c.r, &c.t, 0, 0), 0);
	tu_run(c.r, 20000);
	cr_assert_eq(c.started, 0, "copier_copy finished it inline");
	cr_assert_eq(c.done, 1);
	cr_assert_geq(c.iters, 7, "4 MiB in 512 KiB slices: 8 passes, got %llu",
		      (unsigned long long)c.iters);
	cr_assert_eq(c.job.res, 0);
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
	cr_assert_eq(c.job.sumv, pc_page_sum(c.src, c.len));
	rx_reactor_destroy(c.r);
	free(c.src);
	free(c.dst);
}

static void cancel_it(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	copier_cancel_range(r, c.src + c.len - 1, 1);
}

Test(copier, cancel_stops_before_the_next_byte)
{
	c = (struct ctx){0};
	copier_set_slice(256 << 10);
	setup_bufs(8 * MIB);
	c.r = tu_reactor(NULL);
	rx_timer_init(&c.t, start_one, NULL);
	rx_timer_init(&c.t2, cancel_it, NULL);
	rx_timer_start(c.r, &c.t, 0, 0);
	rx_timer_start(c.r, &c.t2, 0, 0); /* the same pass, after the start */
	tu_run(c.r, 20000);
	cr_assert_eq(c.done, 1);
	cr_assert_eq(c.job.res, -ECANCELED);
	cr_assert_lt(c.job.off, c.len);
	for (size_t i = c.job.off; i < c.len; i += 4096)
		cr_assert_eq(c.dst[i], 0xEE, "byte %zu copied after cancel", i);
	rx_reactor_destroy(c.r);
}

static void start_two(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	size_t half = c.len / 2;
	c.job = (struct copier_job){.dst = c.dst, .src = c.src, .len = half,
				    .done = job_done};
	c.job2 = (struct copier_job){.dst = c.dst + half, .src = c.src + half,
				     .len = half, .sum = true, .done = job_done};
	cr_assert_eq(copier_copy(r, &c.job), 0);
	cr_assert_eq(copier_copy(r, &c.job2), 0, "queued behind the first");
}

/* Many tiny pages in one pass: each job counts its caller's work per page
 * against the pass's budget, not only its bytes, so 4,096 copies of 64
 * bytes (256 KiB, half a 512 KiB slice) do not all run in one pass. */
enum { TINY_N = 4096, TINY_LEN = 64 };
static struct copier_job tiny[TINY_N];
static uint8_t tiny_src[TINY_N * TINY_LEN], tiny_dst[TINY_N * TINY_LEN];
static unsigned tiny_inline, tiny_later;

static void tiny_done(struct copier_job *j)
{
	cr_assert_eq(j->res, 0);
	if (++tiny_later + tiny_inline == TINY_N)
		rx_reactor_stop(c.r);
}

static void start_tiny(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	tu_fill_pattern(tiny_src, sizeof(tiny_src), 9, 0);
	memset(tiny_dst, 0, sizeof(tiny_dst));
	for (unsigned i = 0; i < TINY_N; i++) {
		tiny[i] = (struct copier_job){.dst = tiny_dst + i * TINY_LEN,
					      .src = tiny_src + i * TINY_LEN,
					      .len = TINY_LEN, .sum = true,
					      .done = tiny_done};
		tiny_inline += copier_copy(r, &tiny[i]) == 1;
	}
	if (tiny_inline == TINY_N)
		rx_reactor_stop(r);
}

Test(copier, tiny_pages_count_their_callers_work_against_the_pass)
{
	tiny_inline = tiny_later = 0;
	run_case(512 << 10, 4096, false, start_tiny);
	cr_assert_lt(tiny_inline, 600, "%u of %u 64-byte copies ran in the "
		     "first pass (512 KiB / (64 + 1024) is 481)", tiny_inline,
		     (unsigned)TINY_N);
	cr_assert_gt(tiny_inline, 400, "only %u ran inline", tiny_inline);
	cr_assert_eq(tiny_inline + tiny_later, TINY_N);
	cr_assert_eq(tu_check_pattern(tiny_dst, sizeof(tiny_dst), 9, 0), -1);
	rx_reactor_destroy(c.r);
}

/* Pages whose callers do much more per page than the 1 KiB a job counts
 * for (a session set of 64-byte pages: a checksum, a pool commit and a
 * record each): with a time cap the pass ends by time, long before its
 * bytes run out. One chain, as kv's publish runs: each page's copy starts
 * when the one before it ended, and each end costs 100 us of work. */
enum { SLOW_N = 200, SLOW_LEN = 64 };
static struct copier_job slow[SLOW_N];
static uint8_t slow_src[SLOW_N * SLOW_LEN], slow_dst[SLOW_N * SLOW_LEN];
static unsigned slow_next, slow_in_pass, slow_pass_max;
static uint64_t slow_iter;

/* A page ended: count it in its loop pass, then the caller's work. */
static void slow_count(void)
{
	uint64_t it = rx_reactor_stats(c.r)->loop_iterations;
	if (it != slow_iter) {
		slow_iter = it;
		slow_in_pass = 0;
	}
	if (++slow_in_pass > slow_pass_max)
		slow_pass_max = slow_in_pass;
	uint64_t t0 = pc_now_ns();
	while (pc_now_ns() - t0 < 100 * 1000)
		;
}

static void slow_chain(void);

static void slow_done(struct copier_job *j)
{
	cr_assert_eq(j->res, 0);
	slow_count();
	slow_chain();
}

static void slow_chain(void)
{
	while (slow_next < SLOW_N) {
		unsigned i = slow_next++;
		slow[i] = (struct copier_job){.dst = slow_dst + i * SLOW_LEN,
					      .src = slow_src + i * SLOW_LEN,
					      .len = SLOW_LEN, .done = slow_done};
		if (copier_copy(c.r, &slow[i]) == 0)
			return; /* goes on in slow_done */
		slow_count();
	}
	rx_reactor_stop(c.r);
}

static void start_slow(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	slow_chain();
}

/* The most pages that ended in one loop pass, with a time cap of pass_ns
 * (0: none). */
static unsigned slow_run(uint64_t pass_ns)
{
	slow_next = slow_in_pass = slow_pass_max = 0;
	slow_iter = UINT64_MAX;
	tu_fill_pattern(slow_src, sizeof(slow_src), 5, 0);
	memset(slow_dst, 0, sizeof(slow_dst));
	copier_set_pass_max(pass_ns);
	run_case(512 << 10, 4096, false, start_slow);
	copier_set_pass_max(0);
	cr_assert_eq(slow_next, SLOW_N);
	cr_assert_eq(memcmp(slow_dst, slow_src, sizeof(slow_dst)), 0);
	rx_reactor_destroy(c.r);
	free(c.src); /* run_case's buffers: unused here, and run twice */
	free(c.dst);
	return slow_pass_max;
}

Test(copier, a_pass_of_slow_callers_ends_by_time)
{
	unsigned bytes_only = slow_run(0);
	cr_assert_gt(bytes_only, 100, "without a time cap 200 x (64 + 1024) "
		     "bytes fit one pass: %u pages ended in one", bytes_only);
	unsigned capped = slow_run(1000 * 1000);
	cr_assert_geq(capped, 1);
	cr_assert_leq(capped, 15, "a 1 ms cap with 100 us a page: %u pages "
		      "ended in one pass", capped);
}

Test(copier, jobs_share_the_pass_budget_in_order)
{
	run_case(512 << 10, 4 * MIB, false, start_two);
	cr_assert_eq(c.done, 2);
	cr_assert_eq(c.job.res, 0);
	cr_assert_eq(c.job2.res, 0);
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
	cr_assert_eq(c.job2.sumv, pc_page_sum(c.src + c.len / 2, c.len / 2));
	rx_reactor_destroy(c.r);
}

/* Two 4 MiB copies under way, then a 4 KiB one queued behind them: the
 * jobs take the passes in turn, so the small one is done a few passes
 * later, while both large ones are still copying (in the order they came,
 * it would wait for both: all 16 of their slices). */
static struct copier_job rr_small;
static uint8_t rr_src[4096], rr_dst[4096];
static uint64_t rr_left[2]; /* bytes the large jobs had left then */

static void rr_small_done(struct copier_job *j)
{
	(void)j;
	rr_left[0] = c.job.len - c.job.off;
	rr_left[1] = c.job2.len - c.job2.off;
}

static void rr_queue_small(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	memset(rr_src, 0x6B, sizeof(rr_src));
	rr_small = (struct copier_job){.dst = rr_dst, .src = rr_src,
				       .len = sizeof(rr_src),
				       .done = rr_small_done};
	cr_assert_eq(copier_copy(r, &rr_small), 0, "queued behind the two");
}

static void start_two_then_small(struct rx_reactor *r, struct rx_timer *t)
{
	start_two(r, t);
	rx_timer_start(r, &c.t2, 0, 0); /* the next pass */
}

/* After rr_queue_small's case (512 KiB passes): the two large jobs and the
 * small one all whole and right, and the small one done while both large
 * ones were still copying, after at most 4 slices of theirs (16 in
 * arrival order). 4 is the exact worst case, when the copier's timer runs
 * before t2 in the pass after the start; 3 when t2 runs first. */
static void assert_small_waited_a_slice_of_each(void)
{
	cr_assert_eq(c.done, 2);
	cr_assert_eq(rr_small.res, 0);
	cr_assert_eq(memcmp(rr_dst, rr_src, sizeof(rr_src)), 0);
	uint64_t before = c.len - rr_left[0] - rr_left[1];
	cr_assert_leq(before, 4 * (512 << 10), "%llu bytes of the large jobs "
		      "were copied before the 4 KiB one",
		      (unsigned long long)before);
	cr_assert_gt(rr_left[0], 0, "it waited for the whole first job");
	cr_assert_gt(rr_left[1], 0, "it waited for the whole second job");
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
}

Test(copier, a_small_copy_waits_a_slice_of_each_large_one)
{
	/* two jobs of 4 MiB: 8 slices each */
	run_case_then(512 << 10, 8 * MIB, false, start_two_then_small,
		      rr_queue_small);
	assert_small_waited_a_slice_of_each();
	rx_reactor_destroy(c.r);
}

/* A job with a slice of its own (the disk tier's write-through) queued
 * ahead of two large ones, then a small one: the capped job keeps its
 * slice of every pass while the others take theirs in turn behind it. */
#define CAP_LEN (1u * MIB)
#define CAP_SLICE (64u << 10)
static struct copier_job cap_job;
static uint8_t *cap_src, *cap_dst;
static uint64_t cap_iters;
static bool cap_finished;

static void cap_done(struct copier_job *j)
{
	(void)j;
	cap_iters = rx_reactor_stats(c.r)->loop_iterations - c.iters0;
	cap_finished = true;
}

static void start_capped_two_then_small(struct rx_reactor *r,
					struct rx_timer *t)
{
	c.iters0 = rx_reactor_stats(r)->loop_iterations;
	cap_job = (struct copier_job){.dst = cap_dst, .src = cap_src,
				      .len = CAP_LEN, .sum = true,
				      .slice = CAP_SLICE, .done = cap_done};
	cr_assert_eq(copier_copy(r, &cap_job), 0);
	start_two_then_small(r, t);
}

Test(copier, a_capped_job_keeps_its_slice_while_the_others_take_turns)
{
	cap_src = malloc(CAP_LEN);
	cap_dst = malloc(CAP_LEN);
	cr_assert(cap_src && cap_dst);
	tu_fill_pattern(cap_src, CAP_LEN, 11, 0);
	cap_finished = false;
	run_case_then(512 << 10, 8 * MIB, false, start_capped_two_then_small,
		      rr_queue_small);
	assert_small_waited_a_slice_of_each();
	cr_assert(cap_finished, "the capped job was not done before the "
		  "large ones");
	cr_assert_eq(cap_job.res, 0);
	cr_assert_eq(tu_check_pattern(cap_dst, CAP_LEN, 11, 0), -1);
	cr_assert_eq(cap_job.sumv, pc_page_sum(cap_src, CAP_LEN));
	/* 16 slices of 64 KiB, the first inline: one a pass, none lost to
	 * the turns of the jobs behind it. */
	cr_assert_leq(cap_iters, 17, "1 MiB in 64 KiB slices took %llu passes",
		      (unsigned long long)cap_iters);
	cr_assert_eq(c.job2.sumv, pc_page_sum(c.src + c.len / 2, c.len / 2));
	free(cap_src);
	free(cap_dst);
	rx_reactor_destroy(c.r);
}

static int small_started;
static uint8_t small_src[4096], small_dst[4096];

static void bg_done(struct copier_job *j)
{
	c.done++;
	if (j == &c.job) {
		c.iters = rx_reactor_stats(c.r)->loop_iterations - c.iters0;
		rx_reactor_stop(c.r);
	}
}

/* A 1 MiB job with a 64 KiB slice of its own, then a 4 KiB job. */
static void start_bg(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	c.iters0 = rx_reactor_stats(r)->loop_iterations;
	c.job = (struct copier_job){.dst = c.dst, .src = c.src, .len = c.len,
				    .sum = true, .slice = 64 << 10,
				    .done = bg_done};
	c.started = copier_copy(r, &c.job);
	memset(small_src, 0x5A, sizeof(small_src));
	c.job2 = (struct copier_job){.dst = small_dst, .src = small_src,
				     .len = sizeof(small_src), .sum = true,
				     .done = bg_done};
	small_started = copier_copy(r, &c.job2);
}

/* The write-through's copies (docs/disk.md): at most their slice a pass,
 * and a request's copy behind one is not held up by it. */
Test(copier, a_job_with_its_own_slice_lets_others_pass)
{
	run_case(512 << 10, 1 * MIB, false, start_bg);
	cr_assert_eq(c.started, 0, "1 MiB in 64 KiB slices is not inline");
	cr_assert_eq(small_started, 1, "the 4 KiB copy passes the sliced one");
	cr_assert_eq(memcmp(small_dst, small_src, sizeof(small_src)), 0);
	cr_assert_eq(c.done, 1);
	cr_assert_geq(c.iters, 15, "1 MiB in 64 KiB slices: 16 passes, got "
		      "%llu", (unsigned long long)c.iters);
	cr_assert_eq(c.job.res, 0);
	cr_assert_eq(tu_check_pattern(c.dst, c.len, 7, 0), -1);
	cr_assert_eq(c.job.sumv, pc_page_sum(c.src, c.len));
	rx_reactor_destroy(c.r);
}

static uint64_t stalls_seen[2];

static void slow_cb(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	stalls_seen[0] = rx_stall_count();
	uint64_t end = pc_now_ns() + RX_MS(5);
	while (pc_now_ns() < end)
		;
}

static void after_cb(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	stalls_seen[1] = rx_stall_count();
	rx_reactor_stop(r);
}

Test(stall, a_long_callback_is_counted)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer a, b;
	rx_timer_init(&a, slow_cb, NULL);
	rx_timer_init(&b, after_cb, NULL);
	rx_timer_start(r, &a, 0, 0);
	rx_timer_start(r, &b, RX_MS(20), 0);
	tu_run(r, 20000);
	cr_assert_geq(stalls_seen[1], stalls_seen[0] + 1,
		     "one 5 ms callback is one stall (default 1 ms)");
	rx_reactor_destroy(r);
}

/* A done callback that starts the next copy inline spends this pass's
 * budget: the pass copies no more than one slice in all. */
#define SLICE (512u << 10)

static void check_pass(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	c.iters = c.job2.off; /* what the pass of the first done copied */
}

static void first_done(struct copier_job *j)
{
	(void)j;
	c.done++;
	rx_timer_start(c.r, &c.t2, 0, 0); /* before the copier's next slice */
	c.job2 = (struct copier_job){.dst = c.dst + SLICE + SLICE / 2,
				     .src = c.src + SLICE + SLICE / 2,
				     .len = 4 * SLICE, .done = job_done};
	copier_copy(c.r, &c.job2);
}

static void start_chain(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	c.job = (struct copier_job){.dst = c.dst, .src = c.src,
				    .len = SLICE + SLICE / 2,
				    .done = first_done};
	cr_assert_eq(copier_copy(r, &c.job), 0);
}

Test(copier, done_starting_a_copy_inline_stays_in_the_slice)
{
	run_case_then(SLICE, 6 * SLICE, false, start_chain, check_pass);
	cr_assert_eq(c.done, 2);
	cr_assert_eq(c.job2.res, 0);
	/* The first job's last half slice and the second's first half. */
	cr_assert_eq(c.iters, SLICE / 2, "the pass copied %llu bytes of the "
		     "second job after half a slice of the first (slice %u)",
		     (unsigned long long)c.iters, SLICE);
	cr_assert_eq(tu_check_pattern(c.dst, 11 * SLICE / 2, 7, 0), -1);
	rx_reactor_destroy(c.r);
}

/* With the CPU clock on, a stall tells work from a wait in the kernel: a
 * callback that computes for 3 ms of CPU time is work, one that sleeps 3 ms
 * slept (neither bound depends on the machine's speed or load). */
static uint64_t kinds[3][2];
static uint64_t spin_until;

static void record_kinds(int k)
{
	rx_stall_counts(&kinds[k][0], &kinds[k][1]);
}

static void spin_cb(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	record_kinds(0);
	struct timespec ts;
	uint64_t ns;
	do {
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
		ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		if (!spin_until)
			spin_until = ns + RX_MS(3);
	} while (ns < spin_until);
}

static void sleep_cb(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	record_kinds(1);
	usleep(3000);
}

static void kinds_done(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	record_kinds(2);
	rx_reactor_stop(r);
}

/* One run of the three callbacks on a fresh reactor (destroyed before any
 * assertion): false when another of its callbacks stalled between them too
 * (a loaded machine; CI runs two test processes on two cores), so that
 * the counts cannot tell. */
static bool kinds_run(void)
{
	memset(kinds, 0, sizeof(kinds));
	spin_until = 0;
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer a, b, d;
	rx_timer_init(&a, spin_cb, NULL);
	rx_timer_init(&b, sleep_cb, NULL);
	rx_timer_init(&d, kinds_done, NULL);
	rx_timer_start(r, &a, 0, 0);
	rx_timer_start(r, &b, RX_MS(10), 0);
	rx_timer_start(r, &d, RX_MS(20), 0);
	tu_run(r, 20000);
	rx_reactor_destroy(r);
	uint64_t n0 = kinds[0][0] + kinds[0][1], n1 = kinds[1][0] + kinds[1][1],
		 n2 = kinds[2][0] + kinds[2][1];
	return n1 - n0 <= 1 && n2 - n1 <= 1;
}

Test(stall, cpu_clock_tells_work_from_sleep)
{
	cr_assert_eq(rx_stall_setup(1, RX_MS(1), true), 0);
	bool clean = false;
	for (unsigned i = 0; i < 5 && !clean; i++)
		clean = kinds_run();
	cr_assert(clean, "other stalls in each of 5 runs");
	cr_assert_eq(kinds[1][0], kinds[0][0] + 1, "3 ms of CPU: one work stall "
		     "(work %llu -> %llu)", (unsigned long long)kinds[0][0],
		     (unsigned long long)kinds[1][0]);
	cr_assert_eq(kinds[2][1], kinds[1][1] + 1, "a 3 ms sleep: one stall "
		     "that slept (slept %llu -> %llu, work %llu -> %llu)",
		     (unsigned long long)kinds[1][1],
		     (unsigned long long)kinds[2][1],
		     (unsigned long long)kinds[1][0],
		     (unsigned long long)kinds[2][0]);
	cr_assert_eq(kinds[2][0], kinds[1][0], "the sleep is not work");
}

/* At log level debug every stall is logged, none suppressed, and a line
 * with the CPU clock counts the page faults the callback took: three
 * callbacks of 2 ms of CPU that each touch 16 fresh pages are three lines,
 * each with at least 16 faults (the rate-limited warning would give one). */
#define TOUCH_PAGES 16

static void faulting_spin_cb(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, (size_t)pg * TOUCH_PAGES,
			  PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	cr_assert(m != MAP_FAILED);
	for (int i = 0; i < TOUCH_PAGES; i++)
		m[(long)i * pg] = 1;
	munmap(m, (size_t)pg * TOUCH_PAGES);
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	uint64_t end = (uint64_t)ts.tv_sec * 1000000000ull +
		       (uint64_t)ts.tv_nsec + RX_MS(2);
	uint64_t ns;
	do {
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
		ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	} while (ns < end);
}

Test(stall, debug_level_logs_every_stall_with_its_page_faults)
{
	cr_assert_eq(rx_stall_setup(1, RX_MS(1), true), 0);
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	pc_log_set_fd(pfd[1]);
	pc_log_set_level(PC_LOG_DEBUG);
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_timer a[3], d;
	for (int i = 0; i < 3; i++) {
		rx_timer_init(&a[i], faulting_spin_cb, NULL);
		rx_timer_start(r, &a[i], RX_MS(5) * (uint64_t)i, 0);
	}
	rx_timer_init(&d, kinds_done, NULL);
	rx_timer_start(r, &d, RX_MS(30), 0);
	tu_run(r, 20000);
	rx_reactor_destroy(r);
	pc_log_set_fd(2);
	close(pfd[1]);
	static char logs[16384];
	ssize_t n = read(pfd[0], logs, sizeof(logs) - 1);
	close(pfd[0]);
	logs[n > 0 ? n : 0] = '\0';
	/* Only the spinning callbacks ran 2 ms on the CPU; on a loaded
	 * machine another callback (kinds_done) may pass the threshold by
	 * being preempted, and its line is not the one under test. */
	int lines = 0;
	for (const char *p = logs; (p = strstr(p, " page faults")) != NULL;
	     p++) {
		const char *eol = p;
		while (eol > logs && eol[-1] != '\n')
			eol--;
		const char *cpu = strstr(eol, " ran ");
		cpu = cpu ? strstr(cpu, " ms, ") : NULL;
		if (!cpu || cpu > p || strtod(cpu + 5, NULL) < 1.9)
			continue;
		const char *q = p;
		while (q > logs && q[-1] >= '0' && q[-1] <= '9')
			q--;
		cr_assert_geq(atol(q), TOUCH_PAGES, "faults counted: %s", logs);
		lines++;
	}
	cr_assert_eq(lines, 3, "one line per stall, none suppressed: %s", logs);
}
