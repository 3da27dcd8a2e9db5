/*
 * reactor/group.c — reactor threads: start in order, stop by message, join.
 *
 * Owns: struct rx_group and the thread per reactor. Threading: the group lock
 * guards the start handshake and each thread's "alive" flag; a stop request
 * posts to a reactor only while its thread is alive, so a post never reaches
 * a freed reactor, and posts each thread's own stop message (no allocation,
 * so a stop cannot fail). All signals a process cares about are blocked in reactor
 * threads (they inherit the mask from the starter), so only main sees them.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "group.h"

#define LOG_MOD "group"

struct rx_thread {
	struct rx_group *g;
	unsigned id;
	pthread_t tid;
	bool created;
	bool alive;             /* reactor exists and may receive posts */
	bool reported;          /* start result reported */
	bool stop_posted;       /* stop_msg queued (posted once, never freed) */
	struct rx_msg stop;
	int start_err;
	int run_err;
	struct rx_reactor *r;
};

struct rx_group {
	unsigned n;
	struct rx_params p;
	struct rx_group_hooks h;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned finished;
	struct rx_thread *th;
};

static void stop_msg(struct rx_reactor *r, void *arg)
{
	struct rx_group *g = arg;
	if (rx_reactor_stopping(r))
		return;
	if (g->h.thread_stop)
		g->h.thread_stop(r, g->h.arg);
	rx_reactor_stop(r);
}

static void report_start(struct rx_thread *t, int err)
{
	pthread_mutex_lock(&t->g->lock);
	t->start_err = err;
	t->reported = true;
	pthread_cond_broadcast(&t->g->cond);
	pthread_mutex_unlock(&t->g->lock);
}

/* This thread's nice value (Linux: per thread). A refusal is logged and
 * the thread runs on as it is: the priority is a tuning, not a need. */
static void set_nice(unsigned id, int nice)
{
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice) < 0)
		PC_LOGW(LOG_MOD, "reactor %u: cannot set nice %d: %s (needs root "
			"or CAP_SYS_NICE); running at the process's priority", id,
			nice, strerror(errno));
	else if (id == 0)
		PC_LOGI(LOG_MOD, "reactor threads run at nice %d", nice);
}

static void *thread_main(void *arg)
{
	struct rx_thread *t = arg;
	struct rx_group *g = t->g;
	char name[16];
	snprintf(name, sizeof(name), "r%u", t->id);
	pc_log_set_thread(name);
	snprintf(name, sizeof(name), "pc-r%u", t->id);
	pthread_setname_np(pthread_self(), name);

	if (g->p.nice)
		set_nice(t->id, g->p.nice);
	struct rx_reactor *r = NULL;
	int err = rx_reactor_create(&r, t->id, &g->p);
	if (err < 0) {
		report_start(t, err);
		goto out;
	}
	pthread_mutex_lock(&g->lock);
	t->r = r;
	t->alive = true;
	pthread_mutex_unlock(&g->lock);
	if (g->h.thread_start)
		err = g->h.thread_start(r, g->h.arg);
	if (err < 0) {
		/* Undo a partial start: stop hooks close what was opened. */
		if (g->h.thread_stop)
			g->h.thread_stop(r, g->h.arg);
		rx_reactor_stop(r);
	}
	report_start(t, err);
	t->run_err = rx_reactor_run(r);
	if (g->h.thread_exit)
		g->h.thread_exit(r, g->h.arg);
	pthread_mutex_lock(&g->lock);
	t->alive = false;
	t->r = NULL;
	pthread_mutex_unlock(&g->lock);
	rx_reactor_destroy(r);
out:
	pthread_mutex_lock(&g->lock);
	g->finished++;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

int rx_group_start(struct rx_group **out, unsigned n, const struct rx_params *p,
		   const struct rx_group_hooks *hooks)
{
	*out = NULL;
	if (n == 0)
		return -EINVAL;
	struct rx_group *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->th = calloc(n, sizeof(*g->th));
	if (!g->th) {
		free(g);
		return -ENOMEM;
	}
	g->n = n;
	g->p = *p;
	if (hooks)
		g->h = *hooks;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);

	/* Reactor threads must never take process signals. Faults stay
	 * unblocked: a blocked SIGBUS/SIGSEGV kills the process without running
	 * its handler, and common/guard.c handles SIGBUS on these threads. */
	sigset_t all, old;
	sigfillset(&all);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int err = 0;
	for (unsigned i = 0; i < n && !err; i++) {
		struct rx_thread *t = &g->th[i];
		t->g = g;
		t->id = i;
		int e = pthread_create(&t->tid, NULL, thread_main, t);
		if (e) {
			PC_LOGE(LOG_MOD, "cannot start reactor thread %u: %s", i,
				strerror(e));
			err = -e;
			break;
		}
		t->created = true;
		pthread_mutex_lock(&g->lock);
		while (!t->reported && g->finished <= i)
			pthread_cond_wait(&g->cond, &g->lock);
		err = t->reported ? t->start_err : -EIO;
		pthread_mutex_unlock(&g->lock);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	*out = g;
	if (err) {
		rx_group_stop(g);
		rx_group_join(g);
		*out = NULL;
	}
	return err;
}

void rx_group_stop(struct rx_group *g)
{
	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < g->n; i++) {
		struct rx_thread *t = &g->th[i];
		/* The thread's own message: a stop needs no memory, so it
		 * reaches every reactor even when allocations fail. */
		if (t->alive && !t->stop_posted) {
			t->stop_posted = true;
			rx_post_msg(t->r, &t->stop, stop_msg, g);
		}
	}
	pthread_mutex_unlock(&g->lock);
}

bool rx_group_done(struct rx_group *g)
{
	pthread_mutex_lock(&g->lock);
	unsigned created = 0;
	for (unsigned i = 0; i < g->n; i++)
		created += g->th[i].created;
	bool done = g->finished >= created;
	pthread_mutex_unlock(&g->lock);
	return done;
}

int rx_group_join(struct rx_group *g)
{
	int err = 0;
	for (unsigned i = 0; i < g->n; i++) {
		struct rx_thread *t = &g->th[i];
		if (!t->created)
			continue;
		pthread_join(t->tid, NULL);
		if (!err && t->run_err)
			err = t->run_err;
	}
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g->th);
	free(g);
	return err;
}

int rx_group_post(struct rx_group *g, unsigned i,
		  void (*fn)(struct rx_reactor *r, void *arg), void *arg)
{
	if (i >= g->n)
		return -EINVAL;
	pthread_mutex_lock(&g->lock);
	struct rx_thread *t = &g->th[i];
	int ret = t->alive ? rx_post(t->r, fn, arg) : -ESHUTDOWN;
	pthread_mutex_unlock(&g->lock);
	return ret;
}

unsigned rx_group_size(const struct rx_group *g)
{
	return g->n;
}

struct rx_reactor *rx_group_reactor(const struct rx_group *g, unsigned i)
{
	return i < g->n ? g->th[i].r : NULL;
}

void rx_group_stats(struct rx_group *g, struct rx_stats *sum)
{
	memset(sum, 0, sizeof(*sum));
	uint64_t *dst = (uint64_t *)sum;
	size_t n = sizeof(*sum) / sizeof(uint64_t);
	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < g->n; i++) {
		if (!g->th[i].alive)
			continue;
		const uint64_t *src =
			(const uint64_t *)rx_reactor_stats(g->th[i].r);
		for (size_t k = 0; k < n; k++)
			dst[k] += __atomic_load_n(&src[k], __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&g->lock);
}
