/*
 * reactor/offload.c — blocking system calls off the reactor threads
 * (rx_offload, reactor/reactor.h).
 *
 * Owns: one worker thread per lane for the process, both started on first
 * use and kept for the process's life (idle, they sleep on a condition
 * variable), and each lane's FIFO of offloads. Some calls a reactor needs
 * may take milliseconds and cannot be made asynchronous with io_uring:
 * mmap and munmap of large shared regions (they wait for the process's
 * mmap lock and tear down page tables), memory registration with a NIC. A
 * reactor hands such a call to a worker and gets its done callback back as
 * a cross-thread message.
 *
 * Lanes: RX_LANE_SYSCALL (the default) for those calls, RX_LANE_BULK for
 * work that may pile up in quantity (faulting in a client's pages before a
 * copy touches them): a client that queues a great deal of bulk work never
 * delays another client's region mapping or unmapping behind it.
 *
 * Threading: rx_offload and done run on the reactor's thread; work runs on
 * its lane's worker, one at a time in submission order (the system calls
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

#include "common/log.h"
#include "reactor/rx_internal.h"

#define LOG_MOD "reactor"

struct lane {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct rx_offload *head, *tail;
	bool started;
};

static struct {
	pthread_once_t once;
	struct lane lane[RX_LANES];
} w = {.once = PTHREAD_ONCE_INIT,
       .lane = {[0 ... RX_LANES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER,
					.cond = PTHREAD_COND_INITIALIZER}}};

static void offload_back(struct rx_reactor *r, void *arg)
{
	struct rx_offload *o = arg;
	PC_ASSERT(r->offloads > 0);
	r->offloads--;
	o->done(r, o);
}

static void *offload_main(void *arg)
{
	struct lane *l = arg;
	pthread_mutex_lock(&l->lock);
	for (;;) {
		while (!l->head)
			pthread_cond_wait(&l->cond, &l->lock);
		struct rx_offload *o = l->head;
		l->head = o->next_;
		if (!l->head)
			l->tail = NULL;
		pthread_mutex_unlock(&l->lock);
		o->work(o);
		/* The reactor waits for this done (its offload count): the
		 * way back is o's own message, so it cannot fail. */
		rx_post_msg(o->r_, &o->back_, offload_back, o);
		pthread_mutex_lock(&l->lock);
	}
	return NULL;
}

static void offload_start(void)
{
	static const char *const names[RX_LANES] = {"pc-offload",
						    "pc-offload-bulk"};
	for (unsigned i = 0; i < RX_LANES; i++) {
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		int e = pthread_create(&t, &a, offload_main, &w.lane[i]);
		pthread_attr_destroy(&a);
		if (e) {
			PC_LOGW(LOG_MOD, "cannot start the offload thread %s "
				"(%s); its calls stay on the reactors",
				names[i], strerror(e));
			continue;
		}
		pthread_setname_np(t, names[i]);
		w.lane[i].started = true;
	}
}

int rx_offload(struct rx_reactor *r, struct rx_offload *o)
{
	if (r->state == RX_DONE)
		return -ESHUTDOWN; /* destroy may be past its wait */
	pthread_once(&w.once, offload_start);
	PC_ASSERT(o->lane < RX_LANES);
	struct lane *l = &w.lane[o->lane];
	if (!l->started)
		return -EAGAIN;
	o->r_ = r;
	o->next_ = NULL;
	r->offloads++;
	pthread_mutex_lock(&l->lock);
	if (l->tail)
		l->tail->next_ = o;
	else
		l->head = o;
	l->tail = o;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
	return 0;
}
