/*
 * tests/unit/test_nomem.c — what must work when no memory is left: the
 * reactors' stop and the messages whose poster owns them.
 *
 * This binary is linked with --wrap for the allocation functions
 * (tests/CMakeLists.txt): on a thread that set t_fail every allocation fails
 * and is counted, as peercached's PEERCACHE_TEST_ALLOC_FAULTS does at a rate.
 * A stop that needed memory once left a node unable to stop (a reactor never
 * told), and its process test could then hang.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "reactor/group.h"
#include "reactor/reactor.h"
#include "testutil.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);

/* volatile: the compiler knows malloc as a builtin that reads no user
 * variable, and would drop a store made just before the call. */
static _Thread_local volatile bool t_fail;
static unsigned g_refused; /* atomic */

static bool refuse(void)
{
	if (!t_fail)
		return false;
	__atomic_add_fetch(&g_refused, 1, __ATOMIC_RELAXED);
	errno = ENOMEM;
	return true;
}

void *__wrap_malloc(size_t n)
{
	return refuse() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return refuse() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	return n && refuse() ? NULL : __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
	return refuse() ? ENOMEM : __real_posix_memalign(p, align, n);
}

Test(nomem, the_wrap_refuses_on_the_failing_thread_only)
{
	t_fail = true;
	void *p = malloc(64);
	t_fail = false;
	cr_assert_null(p);
	cr_assert_eq(__atomic_load_n(&g_refused, __ATOMIC_RELAXED), 1);
	p = malloc(64);
	cr_assert_not_null(p);
	free(p);
}

static unsigned g_starts, g_stops; /* atomic */

static int count_start(struct rx_reactor *r, void *arg)
{
	(void)r;
	(void)arg;
	__atomic_add_fetch(&g_starts, 1, __ATOMIC_RELAXED);
	return 0;
}

static void count_stop(struct rx_reactor *r, void *arg)
{
	(void)r;
	(void)arg;
	__atomic_add_fetch(&g_stops, 1, __ATOMIC_RELAXED);
}

/* Every reactor stops, and the stop asks for no memory at all. */
Test(nomem, a_group_stops_when_the_stopping_thread_cannot_allocate,
     .timeout = 30)
{
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h = {.thread_start = count_start,
				   .thread_stop = count_stop};
	struct rx_group *g = NULL;
	cr_assert_eq(rx_group_start(&g, 2, &p, &h), 0);
	cr_assert_eq(__atomic_load_n(&g_starts, __ATOMIC_RELAXED), 2);

	t_fail = true;
	rx_group_stop(g);
	rx_group_stop(g); /* twice: the second is a no-op, not a second post */
	t_fail = false;
	cr_assert_eq(__atomic_load_n(&g_refused, __ATOMIC_RELAXED), 0,
		     "the stop asked for memory");
	cr_assert_eq(rx_group_join(g), 0);
	cr_assert_eq(__atomic_load_n(&g_stops, __ATOMIC_RELAXED), 2,
		     "each reactor ran its stop hook once");
}

static unsigned g_runs;

static void owned_run(struct rx_reactor *r, void *arg)
{
	struct rx_msg *m = arg;
	g_runs++;
	memset(m, 0xA5, sizeof(*m)); /* the reactor must not read m after */
	rx_reactor_stop(r);
}

/* A poster's own message: posted with no memory, runs once, not freed
 * (ASan reports a free of this stack object). */
Test(nomem, a_message_its_poster_owns_runs_once_without_memory)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_msg m;
	t_fail = true;
	rx_post_msg(r, &m, owned_run, &m);
	t_fail = false;
	cr_assert_eq(__atomic_load_n(&g_refused, __ATOMIC_RELAXED), 0);
	tu_run(r, 5000);
	cr_assert_eq(g_runs, 1);
	rx_reactor_destroy(r);
}

static void owned_destroy(struct rx_reactor *r, void *arg)
{
	cr_assert(rx_reactor_stopping(r));
	*(unsigned *)arg += 1;
}

/* Still queued when the reactor is destroyed: it runs then, once. */
Test(nomem, a_queued_owned_message_runs_at_destroy)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct rx_msg m;
	unsigned runs = 0;
	rx_post_msg(r, &m, owned_destroy, &runs);
	rx_reactor_destroy(r);
	cr_assert_eq(runs, 1);
}
