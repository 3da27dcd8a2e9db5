/*
 * tests/unit/test_spread.c — spreading accepted connections over reactors
 * (modules/spread.h): least-loaded placement and the pairing of a client's
 * RPC and data connections on one reactor.
 *
 * Real loopback TCP connections (pairing reads the peer's address and
 * state) and a real group of two reactors (the hand-off is a message); the
 * serve callbacks only record where each connection went.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "modules/module.h"
#include "modules/spread.h"
#include "reactor/group.h"

#define FDS 256

static int g_where[FDS];             /* atomic: reactor id + 1, 0: not yet */
static uint64_t g_load[2][2];        /* [spread][reactor], atomic */

static void serve_as(unsigned which, struct rx_reactor *r, int fd)
{
	cr_assert(fd >= 0 && fd < FDS);
	__atomic_add_fetch(&g_load[which][rx_reactor_id(r)], 1,
			   __ATOMIC_RELAXED);
	__atomic_store_n(&g_where[fd], (int)rx_reactor_id(r) + 1,
			 __ATOMIC_RELEASE);
}

static void serve_rpc(struct rx_reactor *r, int fd) { serve_as(0, r, fd); }
static void serve_data(struct rx_reactor *r, int fd) { serve_as(1, r, fd); }
static uint64_t load_rpc(unsigned i) { return g_load[0][i]; }
static uint64_t load_data(unsigned i) { return g_load[1][i]; }

static struct {
	struct rx_group *g;
	struct pc_ctx ctx;
	int lfd;
	uint16_t port;
	struct pc_spread rpc, data;
} t;

static void setup(void)
{
	struct rx_params p;
	rx_params_default(&p);
	cr_assert_eq(rx_group_start(&t.g, 2, &p, NULL), 0);
	t.ctx.threads = 2;
	t.ctx.group = t.g;
	t.lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	cr_assert_eq(bind(t.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(t.lfd, 64), 0);
	getsockname(t.lfd, (struct sockaddr *)&a, &al);
	t.port = ntohs(a.sin_port);
	cr_assert_eq(pc_spread_init(&t.rpc, &t.ctx, PC_SPREAD_LEAD, load_rpc,
				    serve_rpc), 0);
	cr_assert_eq(pc_spread_init(&t.data, &t.ctx, PC_SPREAD_FOLLOW,
				    load_data, serve_data), 0);
}

static void teardown(void)
{
	rx_group_stop(t.g);
	rx_group_join(t.g);
	pc_spread_fini(&t.rpc);
	pc_spread_fini(&t.data);
	close(t.lfd);
}

/* A client connection from host (127.0.0.x); *srv: the node's end. */
static int client(const char *host, int *srv)
{
	int c = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	inet_pton(AF_INET, host, &a.sin_addr);
	cr_assert_eq(bind(c, (struct sockaddr *)&a, sizeof(a)), 0);
	a.sin_port = htons(t.port);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	cr_assert_eq(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
	*srv = accept(t.lfd, NULL, NULL);
	cr_assert(*srv >= 0 && *srv < FDS);
	return c;
}

/* Accept srv through sp as reactor 0's listener would; its reactor. */
static unsigned place(struct pc_spread *sp, int srv)
{
	pc_spread_accept(sp, &t.ctx, rx_group_reactor(t.g, 0), srv);
	for (int i = 0; i < 5000; i++) {
		int w = __atomic_load_n(&g_where[srv], __ATOMIC_ACQUIRE);
		if (w)
			return (unsigned)w - 1;
		poll(NULL, 0, 1);
	}
	cr_assert_fail("fd %d was never served", srv);
	return 0;
}

TestSuite(spread, .init = setup, .fini = teardown, .timeout = 30);

/* p2p_bench's reader, the case that measured 2x: a first connection made
 * and closed, then per reader thread an RPC and a data connection. Placed
 * independently, each data connection would meet the other reactor. */
Test(spread, a_clients_data_connection_follows_its_rpc_connection)
{
	int s0, s1, s2, d1, d2;
	int c0 = client("127.0.0.1", &s0);
	unsigned r0 = place(&t.rpc, s0);
	close(c0); /* the node has not closed its end yet */
	int c1 = client("127.0.0.1", &s1);
	unsigned r1 = place(&t.rpc, s1);
	cr_assert_neq(r1, r0, "least loaded");
	int e1 = client("127.0.0.1", &d1);
	cr_assert_eq(place(&t.data, d1), r1,
		     "data went elsewhere than its RPC connection (or paired "
		     "with the closed one)");
	/* the closed client's note, found dead, then the live one */
	cr_assert_eq(__atomic_load_n(&t.data.checks, __ATOMIC_RELAXED), 2);
	int c2 = client("127.0.0.1", &s2);
	unsigned r2 = place(&t.rpc, s2);
	int e2 = client("127.0.0.1", &d2);
	cr_assert_eq(place(&t.data, d2), r2);
	cr_assert_eq(__atomic_load_n(&t.data.paired, __ATOMIC_RELAXED), 2);
	/* Every note is taken: the next data connection is least-loaded. */
	int d3;
	int e3 = client("127.0.0.1", &d3);
	place(&t.data, d3);
	cr_assert_eq(__atomic_load_n(&t.data.paired, __ATOMIC_RELAXED), 2);
	cr_assert_eq(__atomic_load_n(&t.data.checks, __ATOMIC_RELAXED), 3,
		     "a dead note is checked once, taken notes never again");
	int fds[] = {c1, c2, e1, e2, e3, s0, s1, s2, d1, d2, d3};
	for (unsigned i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		close(fds[i]);
}

/* Pairs are made within one host: another host's data connection is placed
 * by load and leaves the note to its own client. */
Test(spread, a_data_connection_from_another_host_is_not_paired)
{
	int s0, s1, dx, d1;
	int c0 = client("127.0.0.1", &s0);
	unsigned r0 = place(&t.rpc, s0);
	int c1 = client("127.0.0.1", &s1);
	unsigned r1 = place(&t.rpc, s1);
	cr_assert_neq(r0, r1);
	int ex = client("127.0.0.2", &dx);
	place(&t.data, dx);
	cr_assert_eq(__atomic_load_n(&t.data.paired, __ATOMIC_RELAXED), 0);
	int e1 = client("127.0.0.1", &d1);
	cr_assert_eq(place(&t.data, d1), r0, "the oldest open note");
	cr_assert_eq(__atomic_load_n(&t.data.paired, __ATOMIC_RELAXED), 1);
	int fds[] = {c0, c1, ex, e1, s0, s1, dx, d1};
	for (unsigned i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		close(fds[i]);
}

/* A host that holds many RPC connections open (idle, or hostile) costs a
 * data connection one liveness check, of the oldest note, not one per note
 * (two system calls each, under the notes' lock, on the accepting reactor). */
Test(spread, a_data_connection_checks_one_note_however_many_are_open)
{
	enum { N = 60 };
	int c[N], s[N];
	unsigned r[N];
	for (unsigned i = 0; i < N; i++) {
		c[i] = client("127.0.0.1", &s[i]);
		r[i] = place(&t.rpc, s[i]);
	}
	int d0, d1;
	int e0 = client("127.0.0.1", &d0);
	cr_assert_eq(place(&t.data, d0), r[0], "the oldest open note");
	cr_assert_eq(__atomic_load_n(&t.data.checks, __ATOMIC_RELAXED), 1,
		     "checked %lu notes for one data connection",
		     (unsigned long)__atomic_load_n(&t.data.checks,
						    __ATOMIC_RELAXED));
	/* The next oldest's client has gone: one dead check, then the next. */
	close(c[1]);
	cr_assert_neq(r[1], r[2], "least loaded");
	int e1 = client("127.0.0.1", &d1);
	cr_assert_eq(place(&t.data, d1), r[2]);
	cr_assert_eq(__atomic_load_n(&t.data.checks, __ATOMIC_RELAXED), 3);
	cr_assert_eq(__atomic_load_n(&t.data.paired, __ATOMIC_RELAXED), 2);
	for (unsigned i = 0; i < N; i++) {
		if (i != 1)
			close(c[i]);
		close(s[i]);
	}
	int fds[] = {e0, e1, d0, d1};
	for (unsigned i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		close(fds[i]);
}
