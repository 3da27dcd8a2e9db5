/*
 * tests/unit/test_reactor.c — reactor services beyond echo: stale-completion
 * detection, cross-thread messages, outbound connect, fd watches, file I/O,
 * zero-copy writes, and shutdown with operations in flight.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/blocks.h"
#include "common/util.h"
#include "reactor/group.h"
#include "reactor/reactor.h"
#include "reactor/rx_internal.h" /* the reactor's warm input blocks */
#include "testutil.h"

/* ------------------------------------------------------- stale completions */

static int g_nop_calls;

static void nop_done(void *arg)
{
	struct rx_reactor *r = arg;
	g_nop_calls++;
	rx_reactor_stop(r);
}

Test(reactor, stale_completion_for_recycled_slot_is_dropped)
{
	struct rx_reactor *r = tu_reactor(NULL);
	uint64_t stale = rx_test_stale_user_data(r);
	uint64_t fresh = 0;
	g_nop_calls = 0;
	/* The stale NOP is submitted first, so it completes first: the slot it
	 * names is live again, but under a newer generation. */
	cr_assert_eq(rx_test_submit_nop(r, stale), 0);
	cr_assert_eq(rx_test_nop(r, nop_done, r, &fresh), 0);
	cr_assert_eq((uint32_t)stale, (uint32_t)fresh, "same slot reused");
	cr_assert_neq(stale, fresh, "different generation");
	tu_run(r, 5000);
	cr_assert_eq(g_nop_calls, 1, "the live op completed exactly once");
	cr_assert_eq(rx_reactor_stats(r)->stale_cqes, 1);
	rx_reactor_destroy(r);
}

Test(reactor, garbage_user_data_is_dropped)
{
	struct rx_reactor *r = tu_reactor(NULL);
	uint64_t fresh;
	g_nop_calls = 0;
	rx_test_submit_nop(r, 0xFF00000000000001ull);   /* bad type */
	rx_test_submit_nop(r, 0x01000000FFFFFFF0ull);   /* bad slot index */
	rx_test_nop(r, nop_done, r, &fresh);
	tu_run(r, 5000);
	cr_assert_eq(g_nop_calls, 1);
	cr_assert_eq(rx_reactor_stats(r)->stale_cqes, 2);
	rx_reactor_destroy(r);
}

/* --------------------------------------------------- cross-thread messages */

enum { SENDERS = 4, PER_SENDER = 5000 };

static struct {
	uint64_t count[2];               /* per reactor, touched by its thread */
	int last_seq[2][SENDERS];        /* per reactor, per sender */
	int out_of_order;
	struct rx_group *g;
	int pongs;                       /* atomic */
} mq;

static void count_msg(struct rx_reactor *r, void *arg)
{
	uintptr_t v = (uintptr_t)arg;
	unsigned id = rx_reactor_id(r);
	int sender = (int)(v >> 32), seq = (int)(uint32_t)v;
	if (seq != mq.last_seq[id][sender] + 1)
		mq.out_of_order++;
	mq.last_seq[id][sender] = seq;
	mq.count[id]++;
}

static void *sender_main(void *arg)
{
	uintptr_t sender = (uintptr_t)arg;
	for (int i = 0; i < PER_SENDER; i++)
		for (unsigned t = 0; t < 2; t++) {
			uintptr_t v = (sender << 32) | (uint32_t)i;
			cr_assert_eq(rx_post(rx_group_reactor(mq.g, t),
					     count_msg, (void *)v), 0);
		}
	return NULL;
}

static void pong(struct rx_reactor *r, void *arg)
{
	(void)r;
	(void)arg;
	__atomic_add_fetch(&mq.pongs, 1, __ATOMIC_SEQ_CST);
}

static void ping(struct rx_reactor *r, void *arg)
{
	(void)arg;
	/* From a reactor thread to another reactor, and an answer back. */
	unsigned other = rx_reactor_id(r) ^ 1u;
	rx_post(rx_group_reactor(mq.g, other), pong, NULL);
}

Test(reactor, cross_thread_messages_arrive_once_in_order)
{
	memset(&mq, 0, sizeof(mq));
	for (int t = 0; t < 2; t++)
		for (int s = 0; s < SENDERS; s++)
			mq.last_seq[t][s] = -1;
	struct rx_params p;
	rx_params_default(&p);
	cr_assert_eq(rx_group_start(&mq.g, 2, &p, NULL), 0);
	pthread_t th[SENDERS];
	for (uintptr_t s = 0; s < SENDERS; s++)
		pthread_create(&th[s], NULL, sender_main, (void *)s);
	for (int s = 0; s < SENDERS; s++)
		pthread_join(th[s], NULL);
	for (int i = 0; i < 100; i++)
		rx_post(rx_group_reactor(mq.g, (unsigned)i & 1u), ping, NULL);
	for (int i = 0; i < 500 && __atomic_load_n(&mq.pongs,
						     __ATOMIC_SEQ_CST) < 100;
	     i++)
		usleep(10000);
	rx_group_stop(mq.g);
	cr_assert_eq(rx_group_join(mq.g), 0);
	/* After join every message has run (leftovers run at destroy). */
	cr_assert_eq(mq.count[0], SENDERS * PER_SENDER);
	cr_assert_eq(mq.count[1], SENDERS * PER_SENDER);
	cr_assert_eq(mq.out_of_order, 0);
	cr_assert_eq(mq.pongs, 100);
}

/* ------------------------------------------------------------- connecting */

static struct {
	int connected;
	int closed;
	int close_err;
	size_t echoed;
	struct rx_listener *l;
} cn;

static ssize_t cn_echo(struct rx_conn *c, const uint8_t *d, size_t n)
{
	rx_conn_write(c, d, n);
	return (ssize_t)n;
}

static void cn_server_close(struct rx_conn *c, int err)
{
	(void)c;
	(void)err;
}

static const struct rx_conn_ops cn_server = {.on_data = cn_echo,
					     .on_close = cn_server_close};

static void cn_accept(struct rx_listener *l, int fd, void *arg)
{
	int err;
	(void)arg;
	rx_conn_attach(rx_listener_reactor(l), fd, &cn_server, NULL, &err);
}

static void cn_on_connect(struct rx_conn *c)
{
	cn.connected++;
	(void)c;
}

static ssize_t cn_client_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	cn.echoed += n;
	if (cn.echoed >= 5 && memcmp(d + n - 1, "o", 1) == 0)
		rx_conn_close(c, RX_CLOSE_NOW, 0);
	return (ssize_t)n;
}

static void cn_client_close(struct rx_conn *c, int err)
{
	cn.closed++;
	cn.close_err = err;
	rx_reactor_stop(rx_conn_reactor(c));
}

static const struct rx_conn_ops cn_client = {.on_data = cn_client_data,
					     .on_connect = cn_on_connect,
					     .on_close = cn_client_close};

Test(reactor, outbound_connect_exchanges_data)
{
	struct rx_reactor *r = tu_reactor(NULL);
	memset(&cn, 0, sizeof(cn));
	int err;
	cn.l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16, cn_accept, NULL,
			     &err);
	cr_assert(cn.l);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_port = htons(rx_listener_port(cn.l)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct rx_conn *c = rx_conn_connect(r, (struct sockaddr *)&sin,
					    sizeof(sin), 1000, &cn_client, NULL,
					    &err);
	cr_assert(c, "connect: %s", strerror(-err));
	/* Queued before the connection is up: sent once it is. */
	cr_assert_eq(rx_conn_write(c, "hello", 5), 0);
	tu_run(r, 5000);
	cr_assert_eq(cn.connected, 1);
	cr_assert_eq(cn.echoed, 5);
	cr_assert_eq(cn.closed, 1);
	cr_assert_eq(cn.close_err, 0);
	rx_reactor_destroy(r);
}

Test(reactor, connect_to_closed_port_reports_refused)
{
	struct rx_reactor *r = tu_reactor(NULL);
	memset(&cn, 0, sizeof(cn));
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_port = htons(tu_dead_port()),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int err;
	struct rx_conn *c = rx_conn_connect(r, (struct sockaddr *)&sin,
					    sizeof(sin), 1000, &cn_client, NULL,
					    &err);
	cr_assert(c);
	tu_run(r, 5000);
	cr_assert_eq(cn.connected, 0);
	cr_assert_eq(cn.closed, 1);
	cr_assert_eq(cn.close_err, -ECONNREFUSED);
	rx_reactor_destroy(r);
}

Test(reactor, connect_timeout_fires)
{
	struct rx_reactor *r = tu_reactor(NULL);
	memset(&cn, 0, sizeof(cn));
	/* A listener that never accepts, with its queue filled: further
	 * handshakes are not answered, so connect hangs until the timeout. */
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bind(ls, (struct sockaddr *)&sin, sizeof(sin));
	listen(ls, 0);
	socklen_t sl = sizeof(sin);
	getsockname(ls, (struct sockaddr *)&sin, &sl);
	int fill[8];
	int nfill = 0;
	for (; nfill < 8; nfill++) {
		fill[nfill] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		connect(fill[nfill], (struct sockaddr *)&sin, sizeof(sin));
	}
	usleep(100000);
	int err;
	struct rx_conn *c = rx_conn_connect(r, (struct sockaddr *)&sin,
					    sizeof(sin), 200, &cn_client, NULL,
					    &err);
	cr_assert(c);
	uint64_t ms = tu_run(r, 10000);
	cr_assert_eq(cn.closed, 1);
	if (cn.connected)
		cr_skip("the kernel completed the handshake; no timeout here");
	cr_assert_eq(cn.close_err, -ETIMEDOUT, "got %d", cn.close_err);
	cr_assert_geq(ms, 200);
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	close(ls);
	rx_reactor_destroy(r);
}

/* -------------------------------------------------------------- fd watches */

static struct {
	int efd;
	int calls;
	struct rx_watch *w;
} wt;

static void wt_ready(struct rx_watch *w, uint32_t revents, void *arg)
{
	struct rx_reactor *r = arg;
	uint64_t v;
	cr_assert(revents & POLLIN);
	while (read(wt.efd, &v, sizeof(v)) == sizeof(v))
		; /* drain until EAGAIN */
	if (++wt.calls == 3) {
		rx_watch_cancel(w); /* from inside its own callback */
		rx_reactor_stop(r);
		return;
	}
	uint64_t one = 1;
	write(wt.efd, &one, sizeof(one)); /* fire again */
}

Test(reactor, fd_watch_reports_readiness_until_cancelled)
{
	struct rx_reactor *r = tu_reactor(NULL);
	memset(&wt, 0, sizeof(wt));
	wt.efd = eventfd(0, EFD_NONBLOCK);
	int err;
	wt.w = rx_watch_fd(r, wt.efd, POLLIN, wt_ready, r, &err);
	cr_assert(wt.w);
	uint64_t one = 1;
	write(wt.efd, &one, sizeof(one));
	tu_run(r, 5000);
	cr_assert_eq(wt.calls, 3);
	close(wt.efd);
	rx_reactor_destroy(r);
}

/* A watch cancelled while its fd fires: the removal can meet the poll as it
 * fires and find nothing to remove; the watch must still end, so that the
 * loop stops without waiting out the shutdown grace. */
static struct {
	int efd;
	struct rx_watch *w;
	struct rx_timer t;
	unsigned rounds;
} wr;

static void wr_noop(struct rx_watch *w, uint32_t revents, void *arg)
{
	(void)w;
	(void)revents;
	(void)arg;
}

static void wr_tick(struct rx_reactor *r, struct rx_timer *t)
{
	uint64_t one = 1;
	(void)t;
	/* Readable now, and readable again as the removal goes out. */
	write(wr.efd, &one, sizeof(one));
	rx_watch_cancel(wr.w);
	write(wr.efd, &one, sizeof(one));
	rx_reactor_stop(r);
}

/* 50 rounds of: a watch on an eventfd (readable first when ready_first),
 * then tick 1 ms later; the loop must stop long before its grace. */
static void wr_rounds(bool ready_first,
		      void (*tick)(struct rx_reactor *r, struct rx_timer *t))
{
	for (wr.rounds = 0; wr.rounds < 50; wr.rounds++) {
		struct rx_params p;
		rx_params_default(&p);
		p.shutdown_grace_ms = 100000; /* the test's timeout fires first */
		struct rx_reactor *r = tu_reactor(&p);
		wr.efd = eventfd(0, EFD_NONBLOCK);
		int err;
		wr.w = rx_watch_fd(r, wr.efd, POLLIN, wr_noop, NULL, &err);
		cr_assert(wr.w);
		uint64_t one = 1;
		if (ready_first)
			write(wr.efd, &one, sizeof(one));
		rx_timer_init(&wr.t, tick, NULL);
		rx_timer_start(r, &wr.t, RX_MS(1), 0);
		tu_run(r, 50000);
		close(wr.efd);
		rx_reactor_destroy(r);
	}
}

Test(reactor, watch_cancelled_while_its_fd_fires_ends, .timeout = 60)
{
	/* Level: the fd stays readable, every wake-up fires it. */
	wr_rounds(true, wr_tick);
}

/* The same, with the fd drained between its wake-up and the removal: the
 * poll then re-arms without a completion, and only asking again ends it. */
static void wr_tick_drained(struct rx_reactor *r, struct rx_timer *t)
{
	uint64_t one = 1, v;
	(void)t;
	write(wr.efd, &one, sizeof(one));
	while (read(wr.efd, &v, sizeof(v)) == sizeof(v))
		;
	rx_watch_cancel(wr.w);
	rx_reactor_stop(r);
}

Test(reactor, watch_cancelled_after_a_drained_wakeup_ends, .timeout = 60)
{
	wr_rounds(false, wr_tick_drained);
}

/* ---------------------------------------------------------------- file I/O */

struct file_test {
	struct rx_reactor *r;
	int fd;
	uint8_t *wbuf, *rbuf; /* rbuf holds 2 x len: full read, then EOF read */
	size_t len;
	int stage;
	int64_t res[4];
};

static void ft_step(void *arg, int64_t res)
{
	struct file_test *ft = arg;
	ft->res[ft->stage] = res;
	int ret = 0;
	switch (ft->stage++) {
	case 0:
		ret = rx_file_fsync(ft->r, ft->fd, true, ft_step, ft);
		break;
	case 1:
		ret = rx_file_read(ft->r, ft->fd, ft->rbuf, ft->len, 4096,
				   ft_step, ft);
		break;
	case 2: /* a read across EOF stops there */
		ret = rx_file_read(ft->r, ft->fd, ft->rbuf + ft->len, 8192,
				   4096 + ft->len - 4096, ft_step, ft);
		break;
	default:
		rx_reactor_stop(ft->r);
	}
	cr_assert_eq(ret, 0);
}

static void file_roundtrip(int extra_flags, size_t len)
{
	char path[] = "/var/tmp/pc-fileio-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	fd = open(path, O_RDWR | extra_flags);
	if (fd < 0) {
		unlink(path);
		cr_skip("O_DIRECT is not supported by the file system of "
			"/var/tmp here");
	}
	struct rx_reactor *r = tu_reactor(NULL);
	struct file_test ft = {.r = r, .fd = fd, .len = len};
	cr_assert_eq(posix_memalign((void **)&ft.wbuf, 4096, len), 0);
	cr_assert_eq(posix_memalign((void **)&ft.rbuf, 4096, 2 * len), 0);
	tu_fill_pattern(ft.wbuf, len, 5, 0);
	cr_assert_eq(rx_file_write(r, fd, ft.wbuf, len, 4096, ft_step, &ft),
		     0);
	tu_run(r, 10000);
	cr_assert_eq(ft.stage, 4);
	cr_assert_eq(ft.res[0], (int64_t)len, "write: %lld",
		     (long long)ft.res[0]);
	cr_assert_eq(ft.res[1], 0, "fsync: %lld", (long long)ft.res[1]);
	cr_assert_eq(ft.res[2], (int64_t)len, "read: %lld",
		     (long long)ft.res[2]);
	cr_assert_eq(ft.res[3], 4096, "read across EOF: %lld",
		     (long long)ft.res[3]);
	cr_assert_eq(memcmp(ft.wbuf, ft.rbuf, len), 0);
	cr_assert_eq(memcmp(ft.wbuf + len - 4096, ft.rbuf + len, 4096), 0);
	close(fd);
	unlink(path);
	free(ft.wbuf);
	free(ft.rbuf);
	rx_reactor_destroy(r);
}

Test(reactor, file_write_fsync_read_roundtrip)
{
	file_roundtrip(0, 3u << 20);
}

Test(reactor, file_io_with_o_direct)
{
	file_roundtrip(O_DIRECT, 1u << 20);
}

/* ------------------------------------------------------- zero-copy writes */

static int g_released;

static void on_release(void *arg)
{
	(void)arg;
	g_released++;
}

static ssize_t zc_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	static const char reply[] = "zero-copy reply";
	(void)d;
	rx_conn_write_ref(c, reply, sizeof(reply) - 1, on_release, NULL);
	return (ssize_t)n;
}

/* The test ends when its one connection has closed. */
static void stop_on_close(struct rx_conn *c, int err)
{
	(void)err;
	rx_reactor_stop(rx_conn_reactor(c));
}

static const struct rx_conn_ops zc_ops = {.on_data = zc_data,
					  .on_close = stop_on_close};

static void zc_accept(struct rx_listener *l, int fd, void *arg)
{
	int err;
	(void)arg;
	rx_conn_attach(rx_listener_reactor(l), fd, &zc_ops, NULL, &err);
}

struct zc_client {
	uint16_t port;
	char got[64];
};

static void *zc_client_main(void *arg)
{
	struct zc_client *z = arg;
	int fd = tu_connect(z->port);
	send(fd, "x", 1, 0);
	size_t got = 0;
	while (got < 15) {
		ssize_t n = recv(fd, z->got + got, sizeof(z->got) - got, 0);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	return NULL;
}

Test(reactor, zero_copy_write_releases_after_send)
{
	struct rx_reactor *r = tu_reactor(NULL);
	g_released = 0;
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      zc_accept, NULL, &err);
	struct zc_client z = {.port = rx_listener_port(l)};
	pthread_t th;
	pthread_create(&th, NULL, zc_client_main, &z);
	tu_run(r, 5000);
	pthread_join(th, NULL);
	cr_assert_str_eq(z.got, "zero-copy reply");
	cr_assert_eq(g_released, 1);
	rx_reactor_destroy(r);
}

/* ------------------------------------------------ warm input buffers */

/* Connect to port, send len bytes of buf, close the sending side and
 * wait until the server has closed (it has had everything then). */
static void send_whole_and_wait(uint16_t port, const uint8_t *buf, size_t len)
{
	int fd = tu_connect(port);
	for (size_t off = 0; off < len;) {
		ssize_t k = send(fd, buf + off, len - off, 0);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	shutdown(fd, SHUT_WR);
	char b;
	while (recv(fd, &b, 1, 0) > 0)
		;
	close(fd);
}

/* Reactor r serving accept (with arg) on a loopback port while
 * client(&port) runs on a thread of its own, until r stops; then r is
 * destroyed. serve_client: the same on a fresh reactor. */
static void serve_client_on(struct rx_reactor *r, rx_accept_fn accept,
			    void *arg, void *(*client)(void *))
{
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      accept, arg, &err);
	cr_assert_not_null(l);
	uint16_t port = rx_listener_port(l);
	pthread_t th;
	pthread_create(&th, NULL, client, &port);
	tu_run(r, 20000);
	pthread_join(th, NULL);
	rx_reactor_destroy(r);
}

static void serve_client(rx_accept_fn accept, void *(*client)(void *))
{
	serve_client_on(tu_reactor(NULL), accept, NULL, client);
}

/* Accept a connection for the large-message cases: ops, the budget
 * (NULL: none), and room for a partial message of in_max bytes. */
static void attach_large(struct rx_listener *l, int fd,
			 const struct rx_conn_ops *ops, struct rx_budget *budget,
			 size_t in_max)
{
	int err;
	struct rx_conn *c = rx_conn_attach(rx_listener_reactor(l), fd, ops,
					   NULL, &err);
	if (!c)
		return;
	if (budget)
		rx_conn_set_budget(c, budget);
	rx_conn_set_limits(c, in_max, 1 << 20, 1 << 19, 1 << 20);
}

/* attach_large's arguments, for a listener's accept argument. */
struct large_spec {
	const struct rx_conn_ops *ops;
	struct rx_budget *budget;
	size_t in_max;
};

static void accept_large(struct rx_listener *l, int fd, void *arg)
{
	const struct large_spec *s = arg;
	attach_large(l, fd, s->ops, s->budget, s->in_max);
}

/* Send one message of len pattern bytes (sequence seq) behind its 8-byte
 * length on a connection of its own, and wait until it was all taken. */
static void send_pattern_message(uint16_t port, uint64_t len, unsigned seq)
{
	uint8_t *buf = malloc(sizeof(len) + len);
	cr_assert_not_null(buf);
	memcpy(buf, &len, sizeof(len));
	tu_fill_pattern(buf + sizeof(len), len, seq, 0);
	send_whole_and_wait(port, buf, sizeof(len) + len);
	free(buf);
}

/* The end of an on_data for a length-prefixed message of len pattern bytes
 * (sequence seq): 0 while it is not whole; then its pattern checked (a
 * mismatch counted in *bad), *whole counted, and its size consumed. */
static ssize_t take_pattern_message(const uint8_t *d, size_t n, uint64_t len,
				    unsigned seq, unsigned *bad,
				    unsigned *whole)
{
	if (n < sizeof(len) + len)
		return 0;
	*bad += tu_check_pattern(d + sizeof(len), len, seq, 0) != -1;
	(*whole)++;
	return (ssize_t)(sizeof(len) + len);
}

/* Length-prefixed messages of pattern bytes, each on a connection of its
 * own: the kept input of a large one grows into the reactor's warm blocks,
 * which the next large message on any connection of the reactor reuses. */
#define WI_MSGS 3
#define WI_LEN (6u << 20)

static struct {
	const uint8_t *at[WI_MSGS]; /* where each whole message was handed */
	unsigned whole, bad;
} wi;

static ssize_t wi_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	(void)c;
	uint64_t len;
	if (n < sizeof(len))
		return 0;
	memcpy(&len, d, sizeof(len));
	if (n < sizeof(len) + len)
		return 0; /* kept until it is whole */
	if (wi.whole < WI_MSGS)
		wi.at[wi.whole] = d;
	wi.bad += tu_check_pattern(d + sizeof(len), len, wi.whole, 0) != -1;
	wi.whole++;
	return (ssize_t)(sizeof(len) + len);
}

static void wi_close(struct rx_conn *c, int err)
{
	(void)err;
	if (wi.whole == WI_MSGS)
		rx_reactor_stop(rx_conn_reactor(c));
}

static const struct rx_conn_ops wi_ops = {.on_data = wi_data,
					  .on_close = wi_close};

static void wi_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	attach_large(l, fd, &wi_ops, NULL, 2 * WI_LEN);
}

static void *wi_client_main(void *arg)
{
	for (unsigned m = 0; m < WI_MSGS; m++)
		send_pattern_message(*(uint16_t *)arg, WI_LEN, m);
	return NULL;
}

Test(reactor, large_messages_land_in_warm_input_buffers)
{
	memset(&wi, 0, sizeof(wi));
	serve_client(wi_accept, wi_client_main);
	cr_assert_eq(wi.whole, WI_MSGS);
	cr_assert_eq(wi.bad, 0, "a message's bytes changed");
	/* Each message was kept whole in the input buffer the one before it
	 * gave back (the same block), not in fresh memory. */
	for (unsigned m = 1; m < WI_MSGS; m++)
		cr_assert_eq(wi.at[m], wi.at[0], "message %u in another buffer",
			     m);
}

/* A large block the reactor's caches cannot keep is unmapped on the
 * offload thread (its done runs on the reactor), not in the loop. */
static void ub_check(struct rx_reactor *r, struct rx_timer *t)
{
	unsigned char vec;
	if (RX_STAT_READ(rx_reactor_stats(r)->blocks_unmapped_off) == 1 &&
	    mincore(t->arg, 4096, &vec) < 0 && errno == ENOMEM)
		rx_reactor_stop(r);
}

Test(reactor, a_block_its_caches_let_go_is_unmapped_off_the_loop)
{
	struct rx_reactor *r = tu_reactor(NULL);
	struct pc_blocks *c = rx_reactor_blocks(r);
	struct pc_block b[5] = {{0}};
	for (int i = 0; i < 5; i++) { /* the cache keeps 4 of 16 MiB */
		cr_assert_not_null(pc_blocks_take(c, 16u << 20, &b[i]));
		memset(b[i].p, i, 16u << 20);
	}
	uint8_t *last = b[4].p;
	for (int i = 0; i < 5; i++)
		pc_blocks_put(c, &b[i]);
	for (int i = 0; i < PC_BLOCKS_KEEP; i++)
		cr_assert_neq(c->keep[i].p, last);
	struct rx_timer t;
	rx_timer_init(&t, ub_check, last);
	rx_timer_start(r, &t, RX_MS(1), RX_MS(1));
	tu_run(r, 5000);
	rx_timer_stop(r, &t);
	cr_assert_eq(RX_STAT_READ(rx_reactor_stats(r)->blocks_unmapped_off), 1,
		     "the block was not unmapped by an offload");
	rx_reactor_destroy(r);
}

/* A message announced large (rx_conn_expect) moves into one of the
 * reactor's warm blocks only once 64 KiB of it is charged (at most twice
 * what arrived): its header and 8 KiB after it hold no warm block (a
 * client holds one only for bytes it sent), 264 KiB of it do. The two
 * parts bracket the step; they do not pin it to the byte. The client sends each part only when the
 * reactor has looked at the warm blocks after the one before. */
#define EA_LEN (6u << 20)
#define EA_FIRST (8u << 10)
#define EA_SECOND (256u << 10)

static struct {
	int ack;                  /* eventfd: the client may send more */
	bool hinted;
	int step;                 /* parts looked at */
	uint64_t kept[2];         /* the warm blocks' bytes after each part */
	unsigned whole, bad;
	struct rx_timer t;
} ea;

static void ea_look(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	ea.kept[ea.step++] = r->in_warm.kept;
	cr_assert_eq(eventfd_write(ea.ack, 1), 0);
}

static ssize_t ea_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	uint64_t len;
	if (n < sizeof(len))
		return 0;
	memcpy(&len, d, sizeof(len));
	if (!ea.hinted) /* once: it lasts while nothing is consumed */
		rx_conn_expect(c, sizeof(len) + len);
	ea.hinted = true;
	/* Look once each part is all here and kept: a pass later, after
	 * on_data has returned and the connection kept what it left. */
	size_t part = ea.step == 0 ? EA_FIRST : EA_FIRST + EA_SECOND;
	if (ea.step < 2 && n == sizeof(len) + part &&
	    !rx_timer_armed(&ea.t))
		rx_timer_start(rx_conn_reactor(c), &ea.t, RX_MS(5), 0);
	return take_pattern_message(d, n, len, 9, &ea.bad, &ea.whole);
}

static const struct rx_conn_ops ea_ops = {.on_data = ea_data,
					  .on_close = stop_on_close};

static void *ea_client_main(void *arg)
{
	uint64_t len = EA_LEN;
	uint8_t *buf = malloc(sizeof(len) + len);
	cr_assert_not_null(buf);
	memcpy(buf, &len, sizeof(len));
	tu_fill_pattern(buf + sizeof(len), len, 9, 0);
	int fd = tu_connect(*(uint16_t *)arg);
	size_t parts[3] = {sizeof(len) + EA_FIRST, EA_SECOND,
			   len - EA_FIRST - EA_SECOND}, off = 0;
	for (int i = 0; i < 3; i++) {
		if (i) { /* the reactor looked at what came before */
			struct pollfd pf = {.fd = ea.ack, .events = POLLIN};
			eventfd_t v;
			cr_assert_eq(poll(&pf, 1, 20000), 1, "no word from the "
				     "reactor after part %d", i);
			cr_assert_eq(eventfd_read(ea.ack, &v), 0);
		}
		for (size_t end = off + parts[i]; off < end;) {
			ssize_t k = send(fd, buf + off, end - off, 0);
			cr_assert_gt(k, 0);
			off += (size_t)k;
		}
	}
	shutdown(fd, SHUT_WR);
	char x;
	while (recv(fd, &x, 1, 0) > 0) /* until the reactor closes */
		;
	close(fd);
	free(buf);
	return NULL;
}

Test(reactor, a_large_message_takes_a_warm_block_only_once_64_kib_is_charged)
{
	memset(&ea, 0, sizeof(ea));
	ea.ack = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cr_assert_geq(ea.ack, 0);
	rx_timer_init(&ea.t, ea_look, NULL);
	struct rx_reactor *r = tu_reactor(NULL);
	struct pc_block b = {0}; /* one warm block the message fits */
	cr_assert_not_null(pc_blocks_take(&r->in_warm, 8u << 20, &b));
	pc_blocks_put(&r->in_warm, &b);
	uint64_t warm = r->in_warm.kept;
	cr_assert_geq(warm, 8u << 20);
	struct large_spec spec = {&ea_ops, NULL, 2 * EA_LEN};
	serve_client_on(r, accept_large, &spec, ea_client_main);
	close(ea.ack);
	cr_assert_eq(ea.step, 2);
	cr_assert_eq(ea.kept[0], warm, "the header and %u KiB took a warm "
		     "block", EA_FIRST >> 10);
	cr_assert_eq(ea.kept[1], 0, "%u KiB more did not take the warm block",
		     EA_SECOND >> 10);
	cr_assert_eq(ea.whole, 1);
	cr_assert_eq(ea.bad, 0, "the message's bytes changed");
}

/* A length-prefixed message whose size on_data announces as soon as it
 * knows it (rx_conn_expect) is kept in one buffer from its first kept byte
 * to its last: never moved, never copied into a larger one; the budget is
 * charged as its bytes arrive (at most twice what is kept) and never past
 * the message's size. The same message without the hint moves as its
 * buffer doubles, and is charged the next power of two (the control). */
#define EX_LEN (6u << 20)

static struct {
	bool hint;                 /* this round announces the size */
	bool hinted;
	const uint8_t *seen[64];   /* distinct buffers kept input was in */
	unsigned nseen, whole, bad;
	size_t charged_over;       /* budget charged past 2x what was kept */
	size_t max_used;           /* the most the budget was charged */
	struct rx_budget budget;
} ex;

static ssize_t ex_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	uint64_t len;
	if (n < sizeof(len))
		return 0;
	memcpy(&len, d, sizeof(len));
	if (ex.hint && !ex.hinted) /* once: it lasts while nothing is consumed */
		rx_conn_expect(c, sizeof(len) + len);
	ex.hinted = true;
	size_t used = __atomic_load_n(&ex.budget.in_used, __ATOMIC_RELAXED);
	ex.max_used = PC_MAX(ex.max_used, used);
	if (used > 2 * n + (64u << 10))
		ex.charged_over = PC_MAX(ex.charged_over, used - 2 * n);
	bool known = false;
	for (unsigned i = 0; i < ex.nseen; i++)
		known |= ex.seen[i] == d;
	if (!known && ex.nseen < 64 && n > (64u << 10)) /* kept, not a recv buffer */
		ex.seen[ex.nseen++] = d;
	return take_pattern_message(d, n, len, 7, &ex.bad, &ex.whole);
}

static const struct rx_conn_ops ex_ops = {.on_data = ex_data,
					  .on_close = stop_on_close};

static void ex_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	attach_large(l, fd, &ex_ops, &ex.budget, 2 * EX_LEN);
}

static void *ex_client_main(void *arg)
{
	send_pattern_message(*(uint16_t *)arg, EX_LEN, 7);
	return NULL;
}

static void ex_round(bool hint)
{
	memset(&ex, 0, sizeof(ex));
	ex.hint = hint;
	serve_client(ex_accept, ex_client_main);
	cr_assert_eq(ex.whole, 1);
	cr_assert_eq(ex.bad, 0, "the message's bytes changed");
	cr_assert_eq(ex.charged_over, 0, "the budget was charged %zu bytes "
		     "past twice the input kept", ex.charged_over);
}

Test(reactor, a_message_of_announced_size_is_kept_in_one_buffer)
{
	ex_round(false);
	cr_assert_gt(ex.nseen, 1, "without the hint the buffer moves as it "
		     "grows (the control): %u buffer(s)", ex.nseen);
	cr_assert_gt(ex.max_used, sizeof(uint64_t) + EX_LEN, "without the "
		     "hint the budget is charged by doubling (the control)");
	ex_round(true);
	cr_assert_eq(ex.nseen, 1, "kept input moved %u times",
		     ex.nseen - 1);
	cr_assert_eq(ex.max_used, sizeof(uint64_t) + EX_LEN, "a message of "
		     "known size is charged %zu bytes, not its size",
		     ex.max_used);
}

/* Three length-prefixed messages in one stream: the first (large) is taken
 * out of the connection with rx_conn_take_input and worked on later, from
 * a timer, while the connection is paused; the two after it, already in
 * the same buffer, move to a new one and come once it resumes. */
#define TI_BIG (6u << 20)
#define TI_SMALL (100u << 10)

static struct {
	struct rx_budget budget;
	struct rx_conn *c;
	struct rx_input in;
	const uint8_t *big;   /* the taken message's bytes */
	struct rx_timer later;
	size_t used_while_taken;
	unsigned whole, bad, taken;
} ti;

static const size_t ti_len[3] = {TI_BIG, TI_SMALL, TI_BIG};

static void ti_later(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	/* Other input has come and gone meanwhile (the rest of the stream
	 * moved to a new buffer): the taken bytes are still the message's. */
	ti.bad += tu_check_pattern(ti.big, TI_BIG, 0, 0) != -1;
	ti.used_while_taken =
		__atomic_load_n(&ti.budget.in_used, __ATOMIC_RELAXED);
	rx_input_put(&ti.in);
	rx_input_put(&ti.in); /* harmless twice */
	rx_conn_resume(ti.c);
}

static ssize_t ti_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	uint64_t len;
	if (n < sizeof(len))
		return 0;
	memcpy(&len, d, sizeof(len));
	if (n < sizeof(len) + len)
		return 0;
	unsigned m = ti.whole++;
	ti.bad += len != ti_len[m % 3] ||
		  tu_check_pattern(d + sizeof(len), len, m, 0) != -1;
	if (m == 0 && rx_conn_take_input(c, d + sizeof(len), len, &ti.in)) {
		ti.taken++;
		ti.big = d + sizeof(len);
		ti.c = c;
		rx_conn_pause(c);
		rx_timer_init(&ti.later, ti_later, NULL);
		rx_timer_start(rx_conn_reactor(c), &ti.later, RX_MS(20), 0);
	}
	return (ssize_t)(sizeof(len) + len);
}

static const struct rx_conn_ops ti_ops = {.on_data = ti_data,
					  .on_close = stop_on_close};

static void ti_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	attach_large(l, fd, &ti_ops, &ti.budget, 2 * TI_BIG);
}

static void *ti_client_main(void *arg)
{
	uint16_t port = *(uint16_t *)arg;
	size_t total = 0;
	for (unsigned m = 0; m < 3; m++)
		total += sizeof(uint64_t) + ti_len[m];
	uint8_t *buf = malloc(total), *at = buf;
	for (unsigned m = 0; m < 3; m++) {
		uint64_t len = ti_len[m];
		memcpy(at, &len, sizeof(len));
		tu_fill_pattern(at + sizeof(len), len, m, 0);
		at += sizeof(len) + len;
	}
	send_whole_and_wait(port, buf, total);
	free(buf);
	return NULL;
}

Test(reactor, a_taken_message_stays_put_while_the_input_after_it_moves_on)
{
	memset(&ti, 0, sizeof(ti));
	serve_client(ti_accept, ti_client_main);
	cr_assert_eq(ti.taken, 1, "the large message was not taken");
	cr_assert_eq(ti.whole, 3);
	cr_assert_eq(ti.bad, 0, "a message's bytes changed");
	/* Taken input stays counted until it is given back. */
	cr_assert_geq(ti.used_while_taken, TI_BIG);
	cr_assert_eq(__atomic_load_n(&ti.budget.in_used, __ATOMIC_RELAXED), 0);
	cr_assert_eq(ti.in.r, NULL);
}

/* ------------------------------------------------- shutdown with work left */

static struct {
	int file_res_seen;
	int64_t file_res;
	int conn_closes;
	int conn_close_err;
	int watch_calls;
} sd;

static void sd_file(void *arg, int64_t res)
{
	(void)arg;
	sd.file_res_seen++;
	sd.file_res = res;
}

static ssize_t sd_flood(struct rx_conn *c, const uint8_t *d, size_t n)
{
	static uint8_t big[1 << 20];
	(void)d;
	rx_conn_write(c, big, sizeof(big)); /* the client never reads */
	return (ssize_t)n;
}

static void sd_close(struct rx_conn *c, int err)
{
	(void)c;
	sd.conn_closes++;
	sd.conn_close_err = err;
}

static const struct rx_conn_ops sd_ops = {.on_data = sd_flood,
					  .on_close = sd_close};

static void sd_accept(struct rx_listener *l, int fd, void *arg)
{
	int err;
	(void)arg;
	rx_conn_attach(rx_listener_reactor(l), fd, &sd_ops, NULL, &err);
}

static void sd_watch(struct rx_watch *w, uint32_t ev, void *arg)
{
	(void)w;
	(void)ev;
	(void)arg;
	sd.watch_calls++;
}

static void sd_stop(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	rx_reactor_stop(r);
}

Test(reactor, shutdown_cancels_in_flight_ops_and_frees_everything)
{
	struct rx_params p;
	rx_params_default(&p);
	p.shutdown_grace_ms = 200;
	struct rx_reactor *r = tu_reactor(&p);
	memset(&sd, 0, sizeof(sd));
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      sd_accept, NULL, &err);
	cr_assert(l);
	/* Clients that ask for a megabyte each and never read it. */
	int cfd[5];
	for (int i = 0; i < 5; i++) {
		cfd[i] = tu_connect(rx_listener_port(l));
		send(cfd[i], "go", 2, 0);
	}
	/* A read that never completes on its own: an empty pipe. */
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	static uint8_t buf[64];
	cr_assert_eq(rx_file_read(r, pfd[0], buf, sizeof(buf), (uint64_t)-1,
				  sd_file, NULL), 0);
	/* A watch that never fires, and a timer that would fire much later. */
	int efd = eventfd(0, EFD_NONBLOCK);
	cr_assert(rx_watch_fd(r, efd, POLLIN, sd_watch, NULL, &err));
	struct rx_timer later, stop;
	rx_timer_init(&later, sd_stop, NULL);
	rx_timer_start(r, &later, RX_MS(60000), 0);
	rx_timer_init(&stop, sd_stop, NULL);
	rx_timer_start(r, &stop, RX_MS(300), 0);
	uint64_t ms = tu_run(r, 10000);
	/* Flushing clients that never read cannot finish: the grace period
	 * ends it; the pipe read is cancelled then too. */
	cr_assert_lt(ms, 3000, "shutdown took %llu ms",
		     (unsigned long long)ms);
	cr_assert_eq(sd.conn_closes, 5);
	cr_assert_eq(sd.file_res_seen, 1, "file callback ran once");
	cr_assert(sd.file_res == -ECANCELED || sd.file_res == -EINTR,
		  "file op ended with %lld", (long long)sd.file_res);
	cr_assert_eq(sd.watch_calls, 0);
	cr_assert_eq(rx_reactor_stats(r)->ops_in_use, 0);
	rx_timer_stop(r, &later);
	rx_reactor_destroy(r);
	for (int i = 0; i < 5; i++)
		close(cfd[i]);
	close(pfd[0]);
	close(pfd[1]);
	close(efd);
}

struct drain {
	int fd;
	size_t got;
};

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	static uint8_t buf[65536];
	usleep(300000); /* start reading only after shutdown began */
	for (;;) {
		ssize_t n = recv(d->fd, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
		d->got += (size_t)n;
	}
	return NULL;
}

Test(reactor, shutdown_flushes_queued_output_to_a_reading_client)
{
	struct rx_params p;
	rx_params_default(&p);
	p.shutdown_grace_ms = 5000;
	struct rx_reactor *r = tu_reactor(&p);
	memset(&sd, 0, sizeof(sd));
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      sd_accept, NULL, &err);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int small = 4096;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_port = htons(rx_listener_port(l)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	send(fd, "go", 2, 0);
	struct rx_timer stop;
	rx_timer_init(&stop, sd_stop, NULL);
	rx_timer_start(r, &stop, RX_MS(100), 0);
	struct drain d = {fd, 0};
	pthread_t th;
	pthread_create(&th, NULL, drain_main, &d);
	tu_run(r, 10000);
	pthread_join(th, NULL);
	cr_assert_eq(d.got, 1u << 20, "client got %zu bytes", d.got);
	cr_assert_eq(sd.conn_closes, 1);
	cr_assert_eq(sd.conn_close_err, -ESHUTDOWN);
	rx_reactor_destroy(r);
	close(fd);
}

/* ------------------------------------------------------------ manual reads */

static struct {
	uint8_t *big;
	size_t got;
	int reads;
	ssize_t last;
	struct rx_conn *client;
} mr;

static ssize_t mr_srv_data(struct rx_conn *c, const uint8_t *d, size_t n)
{
	(void)d;
	/* Any byte asks for: a 16-byte header, then 1 MiB of pattern. */
	static uint8_t head[16] = "HEADER-16-BYTES";
	rx_conn_write(c, head, sizeof(head));
	rx_conn_write(c, mr.big, 1u << 20);
	return (ssize_t)n;
}

static const struct rx_conn_ops mr_srv_ops = {.on_data = mr_srv_data};

static void mr_accept(struct rx_listener *l, int fd, void *arg)
{
	int err;
	(void)arg;
	rx_conn_attach(rx_listener_reactor(l), fd, &mr_srv_ops, NULL, &err);
}

static uint8_t mr_head[16];
static uint8_t *mr_dst;

static void mr_got_payload(struct rx_conn *c, ssize_t res, void *arg)
{
	(void)arg;
	mr.reads++;
	mr.last = res;
	mr.got += res > 0 ? (size_t)res : 0;
	rx_conn_close(c, RX_CLOSE_NOW, 0);
	rx_reactor_stop(rx_conn_reactor(c));
}

static void mr_got_head(struct rx_conn *c, ssize_t res, void *arg)
{
	(void)arg;
	mr.reads++;
	cr_assert_eq(res, 16);
	cr_assert_eq(memcmp(mr_head, "HEADER-16-BYTES", 16), 0);
	cr_assert_eq(rx_conn_read(c, mr_dst, 1u << 20, mr_got_payload, NULL),
		     0);
}

static void mr_connected(struct rx_conn *c)
{
	rx_conn_write(c, "x", 1);
	cr_assert_eq(rx_conn_read(c, mr_head, sizeof(mr_head), mr_got_head,
				  NULL), 0);
	cr_assert_eq(rx_conn_read(c, mr_head, 1, mr_got_head, NULL), -EBUSY,
		     "one read at a time");
}

static const struct rx_conn_ops mr_cli_ops = {.on_connect = mr_connected};

/* A server sending a 16-byte header and 1 MiB of pattern `seed`, and a
 * manual-read client with ops; runs until a callback stops the reactor. */
static void mr_run(const struct rx_conn_ops *ops, uint64_t seed)
{
	struct rx_reactor *r = tu_reactor(NULL);
	memset(&mr, 0, sizeof(mr));
	memset(mr_head, 0, sizeof(mr_head));
	mr.big = malloc(1u << 20);
	mr_dst = malloc(1u << 20);
	tu_fill_pattern(mr.big, 1u << 20, seed, 0);
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      mr_accept, NULL, &err);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_port = htons(rx_listener_port(l)),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct rx_conn *c = rx_conn_connect(r, (struct sockaddr *)&sin,
					    sizeof(sin), 1000, ops, NULL, &err);
	cr_assert(c);
	rx_conn_set_manual(c);
	tu_run(r, 5000);
	free(mr.big);
	rx_reactor_destroy(r);
}

Test(reactor, manual_reads_land_in_the_callers_buffer)
{
	mr_run(&mr_cli_ops, 11);
	cr_assert_eq(mr.reads, 2);
	cr_assert_eq(mr.last, 1 << 20);
	cr_assert_eq(tu_check_pattern(mr_dst, 1u << 20, 11, 0), -1);
	free(mr_dst);
}

/* rx_conn_read2: the header and the payload behind it in one receive, each
 * into its own buffer. */
static void mr2_got_both(struct rx_conn *c, ssize_t res, void *arg)
{
	(void)arg;
	mr.reads++;
	mr.last = res;
	rx_conn_close(c, RX_CLOSE_NOW, 0);
	rx_reactor_stop(rx_conn_reactor(c));
}

static void mr2_connected(struct rx_conn *c)
{
	rx_conn_write(c, "x", 1);
	cr_assert_eq(rx_conn_read2(c, mr_head, sizeof(mr_head), NULL, 5,
				   mr2_got_both, NULL), -EINVAL,
		     "a second part needs a buffer");
	cr_assert_eq(rx_conn_read2(c, mr_head, sizeof(mr_head), mr_dst,
				   1u << 20, mr2_got_both, NULL), 0);
	cr_assert_eq(rx_conn_read(c, mr_head, 1, mr2_got_both, NULL), -EBUSY);
}

static const struct rx_conn_ops mr2_cli_ops = {.on_connect = mr2_connected};

Test(reactor, two_part_reads_split_header_and_payload)
{
	mr_run(&mr2_cli_ops, 12);
	cr_assert_eq(mr.reads, 1);
	cr_assert_eq(mr.last, 16 + (1 << 20));
	cr_assert_eq(memcmp(mr_head, "HEADER-16-BYTES", 16), 0);
	cr_assert_eq(tu_check_pattern(mr_dst, 1u << 20, 12, 0), -1);
	free(mr_dst);
}

/* ----------------------------------------------------------------- offload */

struct off {
	struct rx_offload o;
	pthread_t worker, done_on;
	unsigned order, delay_ms;
	bool done;
};

static unsigned off_seq;

static void off_work(struct rx_offload *o)
{
	struct off *f = (struct off *)o;
	f->worker = pthread_self();
	usleep(f->delay_ms * 1000);
}

static void off_done(struct rx_reactor *r, struct rx_offload *o)
{
	(void)r;
	struct off *f = (struct off *)o;
	f->done_on = pthread_self();
	f->order = off_seq++;
	f->done = true;
}

static void off_stop(struct rx_reactor *r, struct rx_timer *t)
{
	(void)t;
	rx_reactor_stop(r);
}

/*
 * Work runs on another thread, done on the reactor's, in submission order;
 * a stop right after the submissions waits for every done (the reactor
 * counts them like ops), even one whose work takes 300 ms.
 */
Test(reactor, offloads_run_off_the_loop_and_shutdown_waits_for_them)
{
	struct rx_params p;
	rx_params_default(&p);
	struct rx_reactor *r = tu_reactor(&p);
	struct off f[3];
	off_seq = 0;
	for (unsigned i = 0; i < 3; i++) {
		f[i] = (struct off){.o = {.work = off_work, .done = off_done},
				    .delay_ms = i == 2 ? 300 : 10};
		cr_assert_eq(rx_offload(r, &f[i].o), 0);
	}
	struct rx_timer stop;
	rx_timer_init(&stop, off_stop, NULL);
	rx_timer_start(r, &stop, 0, 0);
	uint64_t ms = tu_run(r, 10000);
	for (unsigned i = 0; i < 3; i++) {
		cr_assert(f[i].done, "offload %u never came back", i);
		cr_assert_eq(f[i].order, i);
		cr_assert(!pthread_equal(f[i].worker, pthread_self()));
		cr_assert(pthread_equal(f[i].done_on, pthread_self()));
	}
	cr_assert_geq(ms, 300, "the loop ended after %llu ms, before the "
		      "last offload", (unsigned long long)ms);
	cr_assert_eq(rx_reactor_stats(r)->ops_in_use, 0);
	rx_reactor_destroy(r);
}

/* A bulk-lane job that will not finish until a system-call-lane job has
 * come back: with one FIFO for both it would wait forever (the test's
 * bound, 10 s, then fails it); with a lane each, the syscall job passes. */
struct gate_off {
	struct rx_offload o;
	bool *open;     /* set by the syscall job's done (atomic) */
	bool waited;    /* the bulk job saw it open */
	bool done;
};

static void gate_work(struct rx_offload *o)
{
	struct gate_off *g = (struct gate_off *)o;
	for (unsigned i = 0; i < 10000; i++) {
		if (__atomic_load_n(g->open, __ATOMIC_ACQUIRE)) {
			g->waited = true;
			return;
		}
		usleep(1000);
	}
}

static void gate_done(struct rx_reactor *r, struct rx_offload *o)
{
	struct gate_off *g = (struct gate_off *)o;
	g->done = true;
	rx_reactor_stop(r);
}

static void opener_done(struct rx_reactor *r, struct rx_offload *o)
{
	(void)r;
	struct gate_off *g = (struct gate_off *)o;
	g->done = true;
	__atomic_store_n(g->open, true, __ATOMIC_RELEASE);
}

static void nothing_work(struct rx_offload *o)
{
	(void)o;
}

Test(reactor, offload_lanes_do_not_wait_for_each_other)
{
	struct rx_params p;
	rx_params_default(&p);
	struct rx_reactor *r = tu_reactor(&p);
	bool open = false;
	struct gate_off bulk = {.o = {.work = gate_work, .done = gate_done,
				      .lane = RX_LANE_BULK},
				.open = &open};
	struct gate_off sys = {.o = {.work = nothing_work,
				     .done = opener_done},
			       .open = &open};
	cr_assert_eq(rx_offload(r, &bulk.o), 0);
	cr_assert_eq(rx_offload(r, &sys.o), 0);
	tu_run(r, 20000);
	cr_assert(sys.done, "the system-call lane's job never came back");
	cr_assert(bulk.done && bulk.waited,
		  "the bulk job did not see the other lane's job done: the "
		  "lanes waited for each other");
	rx_reactor_destroy(r);
}

/* ------------------------------------------------------------ idle polling */

static struct {
	struct rx_reactor *r;
	unsigned gap_ms;       /* the poster's sleep before each message */
	unsigned msgs;         /* messages to post; the last stops the loop */
	unsigned ran;          /* messages run (reactor thread) */
	uint64_t waits_seen[8]; /* the loop's waits when each one ran */
	uint64_t timer_ms;     /* when the test's timer fired, from the start */
	uint64_t t0;
} ip;

static void ip_msg(struct rx_reactor *r, void *arg)
{
	(void)arg;
	ip.waits_seen[ip.ran] = rx_reactor_stats(r)->waits;
	if (++ip.ran == ip.msgs)
		rx_reactor_stop(r);
}

static void *ip_poster(void *arg)
{
	(void)arg;
	for (unsigned i = 0; i < ip.msgs; i++) {
		usleep(ip.gap_ms * 1000);
		cr_assert_eq(rx_post(ip.r, ip_msg, NULL), 0);
	}
	return NULL;
}

static void ip_timer(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	ip.timer_ms = (pc_now_ns() - ip.t0) / 1000000ull;
}

static uint64_t ip_yield_max_ns; /* the next ip_run's; 0: a minute */

static void ip_nop(void *arg)
{
	(void)arg;
}

/* Run a reactor whose loop idle-polls for poll_ms after work: one NOP
 * completes first (the work that starts the polling), then a thread posts
 * ip.msgs messages ip.gap_ms apart, and a timer is due at timer_ms. With
 * timer_ms 0 no timer at all is armed, not even tu_run's watchdog (an
 * alarm stands in for it): the loop then has no deadline to wait for. */
static struct rx_reactor *ip_run(unsigned poll_ms, unsigned gap_ms,
				 unsigned msgs, unsigned timer_ms)
{
	struct rx_params p;
	rx_params_default(&p);
	cr_assert_eq(p.idle_poll_ns, 0, "off unless asked for");
	p.idle_poll_ns = RX_MS(poll_ms);
	/* On a loaded machine another process may take a yield's CPU for a
	 * slice, which ends a poll (see the last case): not these cases'
	 * subject, so only a yield of a minute would. */
	if (!ip_yield_max_ns)
		ip_yield_max_ns = RX_MS(60000);
	p.idle_poll_yield_max_ns = ip_yield_max_ns;
	ip_yield_max_ns = 0;
	struct rx_reactor *r = tu_reactor(&p);
	memset(&ip, 0, sizeof(ip));
	ip.r = r;
	ip.gap_ms = gap_ms;
	ip.msgs = msgs;
	uint64_t ud;
	cr_assert_eq(rx_test_nop(r, ip_nop, NULL, &ud), 0);
	struct rx_timer t;
	rx_timer_init(&t, ip_timer, NULL);
	ip.t0 = pc_now_ns();
	if (timer_ms)
		cr_assert_eq(rx_timer_start(r, &t, RX_MS(timer_ms), 0), 0);
	pthread_t th;
	pthread_create(&th, NULL, ip_poster, NULL);
	if (timer_ms) {
		tu_run(r, 20000);
	} else {
		alarm(20);
		cr_assert_eq(rx_reactor_run(r), 0);
		alarm(0);
	}
	pthread_join(th, NULL);
	cr_assert_eq(ip.ran, msgs);
	return r;
}

/* The loop never slept after its first completion: each of the msgs
 * messages found at most the one wait before it, and was a poll's hit. */
static void ip_assert_polled_through(const struct rx_stats *st, unsigned msgs)
{
	for (unsigned i = 0; i < msgs; i++)
		cr_assert_leq(ip.waits_seen[i], 1,
			      "message %u found %llu waits: the loop slept", i,
			      (unsigned long long)ip.waits_seen[i]);
	cr_assert_geq(st->idle_poll_hits, msgs, "each message a hit: %llu",
		      (unsigned long long)st->idle_poll_hits);
}

Test(reactor, idle_polling_takes_work_that_follows_work_without_sleeping,
     .timeout = 60)
{
	/* A 5 s window: the messages 100 ms apart all come while the loop
	 * polls, so it never sleeps in the kernel after the NOP's completion
	 * (the only sleep is the one before it, when nothing had happened). */
	struct rx_reactor *r = ip_run(5000, 100, 4, 110);
	const struct rx_stats *st = rx_reactor_stats(r);
	ip_assert_polled_through(st, 4);
	cr_assert_geq(st->idle_poll_ns, RX_MS(300), "the time polled counts");
	/* The timer due while the loop polled fired on time, not at the end
	 * of the window (nor at the next message, 90 ms after it). */
	cr_assert_geq(ip.timer_ms, 110);
	cr_assert_lt(ip.timer_ms, 190, "timer late: %llu ms",
		     (unsigned long long)ip.timer_ms);
	rx_reactor_destroy(r);
}

Test(reactor, idle_polling_ends_with_its_window_and_the_loop_sleeps,
     .timeout = 60)
{
	/* A 5 ms window and messages 150 ms apart: each poll ends unanswered
	 * and the loop sleeps until the next message. (The timer due at 1 ms
	 * only cuts the first window short: it is not work that starts one.) */
	struct rx_reactor *r = ip_run(5, 150, 3, 1);
	const struct rx_stats *st = rx_reactor_stats(r);
	cr_assert_geq(st->idle_poll_misses, 3, "misses: %llu",
		      (unsigned long long)st->idle_poll_misses);
	cr_assert_eq(st->idle_poll_hits, 0, "nothing came while it polled");
	cr_assert_geq(ip.waits_seen[2], 3, "the loop never slept: %llu",
		      (unsigned long long)ip.waits_seen[2]);
	/* About 5 ms per piece of work (NOP, timer, two messages), far from
	 * the 450 ms the test lasts. */
	cr_assert_lt(st->idle_poll_ns, RX_MS(150), "polled %llu ms",
		     (unsigned long long)(st->idle_poll_ns / 1000000ull));
	rx_reactor_destroy(r);
}

Test(reactor, idle_polling_works_when_no_timer_is_armed, .timeout = 60)
{
	/* No deadline at all: the poll must still last its window (a due
	 * time computed as "now + forever" must not wrap around). */
	struct rx_reactor *r = ip_run(5000, 100, 4, 0);
	const struct rx_stats *st = rx_reactor_stats(r);
	ip_assert_polled_through(st, 4);
	rx_reactor_destroy(r);
}

static volatile bool ip_spin_stop;

static void *ip_spinner(void *arg)
{
	(void)arg;
	while (!ip_spin_stop)
		;
	return NULL;
}

static void ip_pin(pthread_t th, int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	cr_assert_eq(pthread_setaffinity_np(th, sizeof(set), &set), 0);
}

Test(reactor, idle_polling_gives_way_to_a_thread_that_wants_the_cpu,
     .timeout = 60)
{
	/* A busy thread on the reactor's own CPU: a yield hands it the CPU
	 * for its time slice (milliseconds), far over the default 20 us, so
	 * each poll ends at its first yield and the loop sleeps, to be woken
	 * by its next completion, instead of polling on in the busy thread's
	 * gaps for the whole 5 s window. */
	cpu_set_t old;
	cr_assert_eq(pthread_getaffinity_np(pthread_self(), sizeof(old), &old),
		     0);
	int cpu = sched_getcpu();
	cr_assert_geq(cpu, 0);
	ip_pin(pthread_self(), cpu);
	ip_spin_stop = false;
	pthread_t spin;
	pthread_create(&spin, NULL, ip_spinner, NULL);
	ip_pin(spin, cpu);
	struct rx_params p;
	rx_params_default(&p);
	ip_yield_max_ns = p.idle_poll_yield_max_ns;
	struct rx_reactor *r = ip_run(5000, 100, 4, 110);
	ip_spin_stop = true;
	pthread_join(spin, NULL);
	pthread_setaffinity_np(pthread_self(), sizeof(old), &old);
	const struct rx_stats *st = rx_reactor_stats(r);
	cr_assert_geq(st->idle_poll_yielded, 4, "polls ended by a yield: %llu",
		      (unsigned long long)st->idle_poll_yielded);
	cr_assert_geq(ip.waits_seen[3], 4, "the loop kept polling: %llu waits",
		      (unsigned long long)ip.waits_seen[3]);
	rx_reactor_destroy(r);
}
