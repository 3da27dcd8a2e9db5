/*
 * reactor/offload.c — blocking system calls off the reactor threads
 * (rx_offload, reactor/reactor.h).
 *
 * Owns: one worker thread for the process, started on first use and kept
 * for the process's life (idle, it sleeps on a condition variable), and its
 * FIFO of offloads. Some calls a reactor needs may take milliseconds and
 * cannot be made asynchronous with io_uring: mmap and munmap of large
 * shared regions (they wait for the process's mmap lock and tear down page
 * tables), memory registration with a NIC. A reactor hands such a call to
 * the worker and gets its done callback back as a cross-thread message.
 *
 * Threading: rx_offload and done run on the reactor's thread; work runs on
 * the worker, one at a time in submission order (the calls it is for
 * serialise on the mmap lock anyway, so more workers would only queue
 * there). The reactor counts its offloads in flight: its loop does not end
 * (shutdown drains them like ops) and rx_reactor_destroy waits for the
 * stragglers of a forced stop, so a done is never posted to a freed
 * reactor.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "reactor/rx_internal.h"

#define LOG_MOD "reactor"

static struct {
	pthread_once_t once;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rx_offload *head, *tail;
	bool started;
} w = {.once = PTHREAD_ONCE_INIT,
       .lock = PTHREAD_MUTEX_INITIALIZER,
       .cond = PTHREAD_COND_INITIALIZER};

static void offload_back(struct rx_reactor *r, void *arg)
{
	struct rx_offload *o = arg;
	PC_ASSERT(r->offloads > 0);
	r->offloads--;
	o->done(r, o);
}

static void *offload_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&w.lock);
	for (;;) {
		while (!w.head)
			pthread_cond_wait(&w.cond, &w.lock);
		struct rx_offload *o = w.head;
		w.head = o->next_;
		if (!w.head)
			w.tail = NULL;
		pthread_mutex_unlock(&w.lock);
		o->work(o);
		/* The reactor waits for this done (its offload count): a post
		 * that cannot allocate is retried, never dropped. */
		while (rx_post(o->r_, offload_back, o) < 0) {
			struct timespec ms = {0, 1000000};
			nanosleep(&ms, NULL);
		}
		pthread_mutex_lock(&w.lock);
	}
	return NULL;
}

static void offload_start(void)
{
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int e = pthread_create(&t, &a, offload_main, NULL);
	pthread_attr_destroy(&a);
	if (e) {
		PC_LOGW(LOG_MOD, "cannot start the offload thread (%s); "
			"blocking calls stay on the reactors", strerror(e));
		return;
	}
	pthread_setname_np(t, "pc-offload");
	w.started = true;
}

int rx_offload(struct rx_reactor *r, struct rx_offload *o)
{
	if (r->state == RX_DONE)
		return -ESHUTDOWN; /* destroy may be past its wait */
	pthread_once(&w.once, offload_start);
	if (!w.started)
		return -EAGAIN;
	o->r_ = r;
	o->next_ = NULL;
	r->offloads++;
	pthread_mutex_lock(&w.lock);
	if (w.tail)
		w.tail->next_ = o;
	else
		w.head = o;
	w.tail = o;
	pthread_cond_signal(&w.cond);
	pthread_mutex_unlock(&w.lock);
	return 0;
}
