/*
 * tests/unit/test_echo.c — connections end to end over loopback: an echo
 * service on reactor threads driven by plain sockets from the test thread.
 * Hundreds of connections with partial reads and writes; a client that stops
 * reading (backpressure, bounded memory); partial messages kept across
 * arrivals; input and output caps; pause/resume; zero-copy writes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "reactor/group.h"
#include "reactor/reactor.h"
#include "testutil.h"

/* ------------------------------------------------------------ the server */

enum srv_kind { SRV_ECHO, SRV_LINES, SRV_BLOAT, SRV_PAUSER };

static struct {
	enum srv_kind kind;
	uint16_t port;
	int rcvbuf;            /* SO_RCVBUF for accepted sockets (0 = default) */
	size_t in_max;         /* per-connection input cap override */
	int last_close_err;    /* atomic */
	int closes;            /* atomic */
} srv;

static ssize_t srv_echo(struct rx_conn *c, const uint8_t *d, size_t n)
{
	int ret = rx_conn_write(c, d, n);
	return ret < 0 ? ret : (ssize_t)n;
}

/* Echo complete lines only; a partial line waits for more bytes. */
static ssize_t srv_lines(struct rx_conn *c, const uint8_t *d, size_t n)
{
	const uint8_t *nl = NULL;
	for (size_t i = n; i-- > 0;)
		if (d[i] == '\n') {
			nl = d + i;
			break;
		}
	if (!nl)
		return 0;
	size_t take = (size_t)(nl - d) + 1;
	int ret = rx_conn_write(c, d, take);
	return ret < 0 ? ret : (ssize_t)take;
}

/* Answer every byte with 64 KiB: output outgrows any cap. */
static ssize_t srv_bloat(struct rx_conn *c, const uint8_t *d, size_t n)
{
	static uint8_t big[65536];
	(void)d;
	for (size_t i = 0; i < n; i++)
		if (rx_conn_write(c, big, sizeof(big)) < 0)
			break;
	return (ssize_t)n;
}

struct pauser {
	struct rx_timer t;
	struct rx_conn *c;
};

static void pauser_resume(struct rx_reactor *r, struct rx_timer *t)
{
	struct pauser *p = t->arg;
	(void)r;
	rx_conn_resume(p->c);
}

/* 'P' pauses the connection for 50 ms; everything is echoed. */
static ssize_t srv_pauser(struct rx_conn *c, const uint8_t *d, size_t n)
{
	struct pauser *p = rx_conn_udata(c);
	for (size_t i = 0; i < n; i++) {
		if (d[i] != 'P')
			continue;
		int ret = rx_conn_write(c, d, i + 1);
		if (ret < 0)
			return ret;
		rx_conn_pause(c);
		rx_timer_start(rx_conn_reactor(c), &p->t, RX_MS(50), 0);
		return (ssize_t)(i + 1);
	}
	return srv_echo(c, d, n);
}

static void srv_close(struct rx_conn *c, int err)
{
	struct pauser *p = rx_conn_udata(c);
	if (p) {
		rx_timer_stop(rx_conn_reactor(c), &p->t);
		free(p);
	}
	__atomic_store_n(&srv.last_close_err, err, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&srv.closes, 1, __ATOMIC_SEQ_CST);
}

static const struct rx_conn_ops srv_ops[] = {
	[SRV_ECHO] = {.on_data = srv_echo, .on_close = srv_close},
	[SRV_LINES] = {.on_data = srv_lines, .on_close = srv_close},
	[SRV_BLOAT] = {.on_data = srv_bloat, .on_close = srv_close},
	[SRV_PAUSER] = {.on_data = srv_pauser, .on_close = srv_close},
};

static void srv_accept(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	int err;
	if (srv.rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &srv.rcvbuf,
			   sizeof(srv.rcvbuf));
	struct pauser *p = NULL;
	if (srv.kind == SRV_PAUSER) {
		p = calloc(1, sizeof(*p));
		rx_timer_init(&p->t, pauser_resume, p);
	}
	struct rx_conn *c = rx_conn_attach(rx_listener_reactor(l), fd,
					   &srv_ops[srv.kind], p, &err);
	cr_assert(c, "attach: %s", strerror(-err));
	if (p)
		p->c = c;
	if (srv.in_max)
		rx_conn_set_limits(c, srv.in_max, 0, 0, 0);
}

static int srv_start(struct rx_reactor *r, void *arg)
{
	(void)arg;
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", srv.port, true,
					      1024, srv_accept, NULL, &err);
	if (!l)
		return err;
	srv.port = rx_listener_port(l);
	return 0;
}

static struct rx_group *srv_run(enum srv_kind kind, unsigned threads,
				const struct rx_params *p)
{
	struct rx_params def;
	if (!p) {
		rx_params_default(&def);
		p = &def;
	}
	srv.kind = kind;
	srv.port = 0;
	struct rx_group_hooks h = {.thread_start = srv_start};
	struct rx_group *g;
	int ret = rx_group_start(&g, threads, p, &h);
	cr_assert_eq(ret, 0, "group start: %s", strerror(-ret));
	return g;
}

static void srv_wait_closes(int n)
{
	for (int i = 0; i < 500; i++) {
		if (__atomic_load_n(&srv.closes, __ATOMIC_SEQ_CST) >= n)
			return;
		usleep(10000);
	}
	cr_assert_fail("server saw %d closes, expected %d", srv.closes, n);
}

static void srv_finish(struct rx_group *g, struct rx_stats *st)
{
	rx_group_stats(g, st);
	rx_group_stop(g);
	cr_assert_eq(rx_group_join(g), 0);
}

/* ------------------------------------------------------- many connections */

struct client {
	int fd;
	size_t sent, rcvd, total;
	uint8_t *tx, *rx;
};

Test(echo, hundreds_of_connections_with_partial_io, .timeout = 120)
{
	enum { NCONN = 300, TOTAL = 96 * 1024 };
	struct rx_group *g = srv_run(SRV_ECHO, 2, NULL);
	static struct client cl[NCONN];
	static struct pollfd pfd[NCONN];
	srand(7);
	for (int i = 0; i < NCONN; i++) {
		cl[i].fd = tu_connect(srv.port);
		tu_nonblock(cl[i].fd);
		cl[i].total = TOTAL - (size_t)(rand() % 4096);
		cl[i].tx = malloc(TOTAL);
		cl[i].rx = malloc(TOTAL);
		tu_fill_pattern(cl[i].tx, TOTAL, (uint64_t)i, 0);
		cl[i].sent = cl[i].rcvd = 0;
	}
	int done = 0;
	uint64_t deadline = pc_now_ns() + 90ull * 1000000000ull;
	while (done < NCONN) {
		cr_assert_lt(pc_now_ns(), deadline, "echo stalled: %d/%d done",
			     done, NCONN);
		for (int i = 0; i < NCONN; i++) {
			pfd[i].fd = cl[i].rcvd < cl[i].total ? cl[i].fd : -1;
			pfd[i].events = POLLIN;
			if (cl[i].sent < cl[i].total)
				pfd[i].events |= POLLOUT;
		}
		cr_assert_geq(poll(pfd, NCONN, 1000), 0);
		for (int i = 0; i < NCONN; i++) {
			struct client *c = &cl[i];
			if ((pfd[i].revents & POLLOUT) && c->sent < c->total) {
				size_t want = 1 + (size_t)(rand() % 9000);
				want = PC_MIN(want, c->total - c->sent);
				ssize_t w = send(c->fd, c->tx + c->sent, want,
						 MSG_NOSIGNAL);
				cr_assert(w > 0 || errno == EAGAIN,
					  "send: %s", strerror(errno));
				if (w > 0)
					c->sent += (size_t)w;
			}
			if (pfd[i].revents & POLLIN) {
				size_t want = 1 + (size_t)(rand() % 20000);
				want = PC_MIN(want, c->total - c->rcvd);
				ssize_t n = recv(c->fd, c->rx + c->rcvd, want, 0);
				cr_assert(n > 0 || (n < 0 && errno == EAGAIN),
					  "conn %d: recv returned %zd (%s)", i,
					  n, strerror(errno));
				if (n > 0) {
					c->rcvd += (size_t)n;
					if (c->rcvd == c->total)
						done++;
				}
			}
		}
	}
	for (int i = 0; i < NCONN; i++) {
		long bad = tu_check_pattern(cl[i].rx, cl[i].total, (uint64_t)i,
					    0);
		cr_assert_eq(bad, -1, "conn %d: wrong byte at %ld", i, bad);
		close(cl[i].fd);
		free(cl[i].tx);
		free(cl[i].rx);
	}
	srv_wait_closes(NCONN);
	struct rx_stats st;
	srv_finish(g, &st);
	cr_assert_eq(st.conns_accepted, NCONN);
	cr_assert_eq(st.conns_live, 0);
	cr_assert_eq(st.stale_cqes, 0);
	cr_assert_eq(srv.last_close_err, 0, "orderly close expected");
}

/* ---------------------------------------------------------- backpressure */

Test(echo, client_that_stops_reading_is_paused_with_bounded_memory,
     .timeout = 120)
{
	struct rx_params p;
	rx_params_default(&p);
	p.conn_out_high = 256 * 1024;
	p.conn_out_low = 64 * 1024;
	p.conn_out_max = 8u << 20;
	srv.rcvbuf = 64 * 1024;
	struct rx_group *g = srv_run(SRV_ECHO, 1, &p);
	enum { TOTAL = 32 << 20 };
	uint8_t *tx = malloc(TOTAL), *rx = malloc(TOTAL);
	tu_fill_pattern(tx, TOTAL, 99, 0);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int small = 64 * 1024;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	close(fd);
	fd = tu_connect(srv.port);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	tu_nonblock(fd);

	/* Send without reading until the server stops taking bytes. */
	size_t sent = 0;
	uint64_t blocked_since = 0;
	while (sent < TOTAL) {
		ssize_t w = send(fd, tx + sent, PC_MIN((size_t)65536,
						      TOTAL - sent),
				 MSG_NOSIGNAL);
		if (w > 0) {
			sent += (size_t)w;
			blocked_since = 0;
			continue;
		}
		cr_assert(errno == EAGAIN, "send: %s", strerror(errno));
		if (!blocked_since)
			blocked_since = pc_now_ns();
		else if (pc_now_ns() - blocked_since > 300ull * 1000000)
			break;
		usleep(5000);
	}
	cr_assert_lt(sent, (size_t)TOTAL,
		     "server kept reading a client that does not read");
	struct rx_stats st;
	rx_group_stats(g, &st);
	cr_assert_geq(st.out_pauses, 1);
	cr_assert_eq(st.out_cap_closes, 0);
	/* Bounded: the queue stops near the high watermark, plus what the
	 * kernel had already received when the pause took effect. */
	cr_assert_leq(st.conn_out_peak, p.conn_out_high + 512 * 1024,
		      "output queue grew to %llu bytes",
		      (unsigned long long)st.conn_out_peak);

	/* Now read: the echo resumes and every byte comes back in order. */
	size_t rcvd = 0;
	uint64_t deadline = pc_now_ns() + 60ull * 1000000000ull;
	while (rcvd < TOTAL) {
		cr_assert_lt(pc_now_ns(), deadline, "stalled at %zu", rcvd);
		struct pollfd pf = {.fd = fd,
				    .events = POLLIN |
					      (sent < TOTAL ? POLLOUT : 0)};
		poll(&pf, 1, 1000);
		if ((pf.revents & POLLOUT) && sent < TOTAL) {
			ssize_t w = send(fd, tx + sent,
					 PC_MIN((size_t)65536, TOTAL - sent),
					 MSG_NOSIGNAL);
			if (w > 0)
				sent += (size_t)w;
		}
		if (pf.revents & POLLIN) {
			ssize_t n = recv(fd, rx + rcvd, TOTAL - rcvd, 0);
			cr_assert(n > 0 || errno == EAGAIN);
			if (n > 0)
				rcvd += (size_t)n;
		}
	}
	cr_assert_eq(memcmp(tx, rx, TOTAL), 0, "echoed bytes differ");
	close(fd);
	srv_wait_closes(1);
	srv_finish(g, &st);
	cr_assert_eq(st.out_cap_closes, 0);
	srv.rcvbuf = 0;
	free(tx);
	free(rx);
}

/* ------------------------------------------------------ partial messages */

static void read_exact(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = recv(fd, buf + got, len - got, 0);
		cr_assert(n > 0, "recv: %zd %s", n, strerror(errno));
		got += (size_t)n;
	}
}

Test(echo, partial_messages_are_kept_until_complete)
{
	struct rx_group *g = srv_run(SRV_LINES, 1, NULL);
	int fd = tu_connect(srv.port);
	enum { LINES = 3000 };
	char *text = malloc(LINES * 40);
	size_t len = 0;
	for (int i = 0; i < LINES; i++)
		len += (size_t)sprintf(text + len, "line %d %x\n", i, i * 7919);
	uint8_t *back = malloc(len);
	/* Send split at random points, so lines straddle arrivals. */
	srand(3);
	size_t off = 0, got = 0;
	while (off < len) {
		size_t n = PC_MIN((size_t)(1 + rand() % 97), len - off);
		cr_assert_eq(send(fd, text + off, n, MSG_NOSIGNAL), (ssize_t)n);
		off += n;
		if (rand() % 8 == 0)
			usleep(200); /* let some arrive alone */
	}
	read_exact(fd, back, len);
	got = len;
	cr_assert_eq(memcmp(text, back, got), 0);
	close(fd);
	srv_wait_closes(1);
	struct rx_stats st;
	srv_finish(g, &st);
	free(text);
	free(back);
}

Test(echo, input_cap_closes_with_emsgsize)
{
	srv.in_max = 64 * 1024;
	struct rx_group *g = srv_run(SRV_LINES, 1, NULL);
	int fd = tu_connect(srv.port);
	static uint8_t junk[100 * 1024];
	memset(junk, 'x', sizeof(junk)); /* no newline: never complete */
	send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
	srv_wait_closes(1);
	cr_assert_eq(srv.last_close_err, -EMSGSIZE);
	uint8_t b;
	cr_assert_leq(recv(fd, &b, 1, 0), 0, "server should have closed");
	close(fd);
	struct rx_stats st;
	srv_finish(g, &st);
	cr_assert_eq(st.in_cap_closes, 1);
	srv.in_max = 0;
}

Test(echo, output_cap_closes_with_enobufs)
{
	struct rx_params p;
	rx_params_default(&p);
	p.conn_out_high = 128 * 1024;
	p.conn_out_low = 64 * 1024;
	p.conn_out_max = 512 * 1024;
	struct rx_group *g = srv_run(SRV_BLOAT, 1, &p);
	int fd = tu_connect(srv.port);
	int small = 4096;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	static uint8_t ask[64];
	send(fd, ask, sizeof(ask), MSG_NOSIGNAL); /* asks for 4 MiB */
	srv_wait_closes(1);
	cr_assert_eq(srv.last_close_err, -ENOBUFS);
	close(fd);
	struct rx_stats st;
	srv_finish(g, &st);
	cr_assert_eq(st.out_cap_closes, 1);
}

Test(echo, pause_and_resume_keep_order)
{
	struct rx_group *g = srv_run(SRV_PAUSER, 1, NULL);
	int fd = tu_connect(srv.port);
	const char *msg = "abcPdefPghi-the-end";
	uint64_t t0 = pc_now_ns();
	for (const char *p = msg; *p; p++) {
		send(fd, p, 1, MSG_NOSIGNAL);
		usleep(1000);
	}
	uint8_t back[64];
	read_exact(fd, back, strlen(msg));
	cr_assert_eq(memcmp(back, msg, strlen(msg)), 0);
	/* Two pauses of 50 ms each happened in between. */
	cr_assert_geq(pc_now_ns() - t0, RX_MS(100));
	close(fd);
	srv_wait_closes(1);
	struct rx_stats st;
	srv_finish(g, &st);
}
