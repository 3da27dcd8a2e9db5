/*
 * tests/unit/test_rpc_guard.c — the reply memory budget handlers reserve
 * from (rpc_call_budget_take / rpc_call_budget_give): node-wide and
 * per-connection shares, reservations held by asynchronous calls, and
 * bytes given back when a reply ends. And a newcomer whose reactor holds
 * no unproven connection to drop for it, while another holds the whole
 * cap, handed over there (rpc_server_set_post).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/buf.h"
#include "reactor/group.h"
#include "rpc/client.h"
#include "rpc/msg.h"
#include "rpc/rpc.h"
#include "testutil.h"

/* ["t.take", bytes, hold_ms]: reserve bytes, answer after hold_ms (0: at
 * once, after giving half back by hand) with 0, or "busy". */
struct held {
	struct rx_timer t;
	struct rpc_call *call;
};

static void held_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct held *h = t->arg;
	(void)r;
	rpc_reply_uint(h->call, 0); /* the reservation ends with the reply */
	free(h);
}

static void m_take(struct rpc_call *call, struct mp_rd *p)
{
	uint64_t bytes, ms;
	if (mp_rd_uint(p, &bytes) < 0 || mp_rd_uint(p, &ms) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "[bytes, ms]");
		return;
	}
	if (rpc_call_budget_take(call, bytes) < 0) {
		rpc_reply_error(call, RPC_E_BUSY, "over the reply budget");
		return;
	}
	if (ms == 0) {
		rpc_call_budget_give(call, bytes / 2);
		rpc_reply_uint(call, 0);
		return;
	}
	struct held *h = calloc(1, sizeof(*h));
	h->call = call;
	rx_timer_init(&h->t, held_fire, h);
	rx_timer_start(rpc_call_reactor(call), &h->t, RX_MS(ms), 0);
}

static const struct rpc_method methods[] = {
	{"t.take", m_take, 0, "reserve reply bytes"},
	{NULL, NULL, 0, NULL},
};

static struct {
	struct rpc_server *srv;
	struct rx_group *g;
	uint16_t port[2]; /* each reactor's own listener */
} G;

static void on_tcp(struct rx_listener *l, int fd, void *arg)
{
	(void)arg;
	rpc_server_accept(G.srv, rx_listener_reactor(l), fd, false);
}

static int on_start(struct rx_reactor *r, void *arg)
{
	(void)arg;
	int err;
	struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false, 16,
					      on_tcp, NULL, &err);
	if (!l)
		return err;
	G.port[rx_reactor_id(r)] = rx_listener_port(l);
	return 0;
}

static int post_group(void *arg, unsigned reactor,
		      void (*fn)(struct rx_reactor *r, void *fn_arg),
		      void *fn_arg)
{
	(void)arg;
	return rx_group_post(G.g, reactor, fn, fn_arg);
}

/* A server on nreactors reactors (1 or 2), each listening on a port of
 * its own; with a secret, TCP clients are unproven until they prove it;
 * move: newcomers may be handed to another reactor (rpc_server_set_post). */
static void guard_up_on(const struct rpc_guard *gd, unsigned nreactors,
			const char *secret, bool move)
{
	struct rpc_limits lim = {
		.max_message_bytes = 1 << 20,
		.max_elements = 1024,
		.max_depth = 8,
		.max_inflight = 16,
		.max_connections = 16,
		.max_fds = 1,
	};
	const struct rpc_method *tables[] = {methods};
	cr_assert_eq(rpc_server_new(&G.srv, &lim, tables, 1, secret, -1,
				    nreactors), 0);
	cr_assert_eq(rpc_server_set_guard(G.srv, gd), 0);
	if (move)
		rpc_server_set_post(G.srv, post_group, NULL);
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h = {.thread_start = on_start};
	cr_assert_eq(rx_group_start(&G.g, nreactors, &p, &h), 0);
}

static void guard_up(const struct rpc_guard *gd)
{
	guard_up_on(gd, 1, NULL, false);
}

static struct rpc_stats guard_down(void)
{
	struct rpc_stats st;
	rpc_server_stats(G.srv, &st);
	rx_group_stop(G.g);
	rx_group_join(G.g);
	rpc_server_free(G.srv);
	return st;
}

static void send_take(int fd, uint32_t msgid, uint64_t bytes, uint64_t ms)
{
	uint64_t v[] = {bytes, ms};
	cr_assert_eq(tu_rpc_send_uints(fd, msgid, "t.take", v, 2), 0);
}

/* The answer to the one request in flight on fd: true for 0, false for
 * an error "busy". */
static bool answer(int fd, uint32_t msgid)
{
	uint8_t buf[512];
	uint32_t id;
	struct rpc_result res;
	const char *why = "";
	cr_assert_eq(tu_rpc_read_reply(fd, buf, sizeof(buf), &id, &res, &why),
		     0, "%s", why);
	cr_assert_eq(id, msgid);
	if (res.err)
		cr_assert_str_eq(res.code, RPC_E_BUSY);
	return res.err == 0;
}

Test(rpc_guard, node_budget_counts_reservations_of_every_connection)
{
	struct rpc_guard gd = {.max_reply_bytes = 1 << 20};
	guard_up(&gd);
	int a = tu_connect(G.port[0]), b = tu_connect(G.port[0]);
	send_take(a, 1, 800 << 10, 400); /* held for 400 ms */
	usleep(100 * 1000);
	send_take(b, 2, 400 << 10, 0);
	cr_assert(!answer(b, 2), "800 + 400 KiB fit in a 1 MiB budget");
	send_take(b, 3, 100 << 10, 0);
	cr_assert(answer(b, 3));
	cr_assert(answer(a, 1));
	/* A's reservation ended with its reply: the room is back. */
	send_take(b, 4, 900 << 10, 0);
	cr_assert(answer(b, 4));
	close(a);
	close(b);
	struct rpc_stats st = guard_down();
	cr_assert_eq(st.budget_refusals, 1);
}

Test(rpc_guard, connection_share_counts_its_own_reservations)
{
	struct rpc_guard gd = {.conn_reply_bytes = 256 << 10};
	guard_up(&gd);
	int a = tu_connect(G.port[0]), b = tu_connect(G.port[0]);
	send_take(a, 1, 200 << 10, 300);
	usleep(100 * 1000);
	send_take(a, 2, 100 << 10, 0); /* 200 + 100 KiB on one connection */
	cr_assert(!answer(a, 2)); /* answered at once, before 1 */
	cr_assert(answer(a, 1));
	send_take(b, 3, 200 << 10, 0); /* another connection has its own */
	cr_assert(answer(b, 3));
	send_take(a, 4, 300 << 10, 0); /* alone over the share */
	cr_assert(!answer(a, 4));
	close(a);
	close(b);
	struct rpc_stats st = guard_down();
	cr_assert_eq(st.budget_refusals, 2);
}

/* ------------------------------------------ unproven connections elsewhere */

#define SILENT 4

/* SILENT connections to reactor 0 that never send a byte, all admitted and
 * past the 100 ms grace before a newcomer may drop one. */
static void silent_on_reactor_0(int *fds)
{
	for (unsigned i = 0; i < SILENT; i++)
		fds[i] = tu_connect(G.port[0]);
	struct rpc_stats st = {0};
	for (unsigned t = 0; t < 500 && st.conns_accepted < SILENT; t++) {
		usleep(10 * 1000);
		rpc_server_stats(G.srv, &st);
	}
	cr_assert_eq(st.conns_accepted, SILENT, "%llu of %d admitted",
		     (unsigned long long)st.conns_accepted, SILENT);
	usleep(200 * 1000);
}

/* A new client of reactor 1 asks for its challenge: true when answered,
 * false when the server closed the connection instead. */
static bool newcomer_answered(void)
{
	int fd = tu_connect(G.port[1]);
	struct timeval tv = {.tv_sec = 5};
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)),
		     0);
	cr_assert_eq(tu_rpc_send_uints(fd, 1, "auth.challenge", NULL, 0), 0);
	uint8_t buf[512];
	uint32_t id;
	struct rpc_result res;
	const char *why = "";
	bool ok = tu_rpc_read_reply(fd, buf, sizeof(buf), &id, &res, &why) == 0;
	if (ok)
		cr_assert(!res.err && id == 1, "the challenge was refused");
	close(fd);
	return ok;
}

/* A newcomer of reactor 1 while reactor 0 holds the whole of gd's cap,
 * every one of them past the grace: with move, it is handed to reactor 0,
 * which drops one of its own for it; without, it is refused. */
static void newcomer_case(const struct rpc_guard *gd, bool move)
{
	guard_up_on(gd, 2, "guard test secret", move);
	int fds[SILENT];
	silent_on_reactor_0(fds);
	bool answered = newcomer_answered();
	struct rpc_stats st = guard_down();
	for (unsigned i = 0; i < SILENT; i++)
		close(fds[i]);
	if (move)
		cr_assert(answered, "a newcomer of reactor 1 was refused while "
			  "reactor 0 held the cap");
	else
		cr_assert(!answered, "admitted without a hand-over");
	cr_assert_eq(st.conns_moved, move);
	cr_assert_eq(st.conns_evicted, move);
	cr_assert_eq(st.conns_refused, !move);
}

Test(rpc_guard, a_full_class_held_by_another_reactor_admits_a_newcomer)
{
	struct rpc_guard gd = {.max_preauth = SILENT};
	newcomer_case(&gd, true);
}

Test(rpc_guard, a_full_host_held_by_another_reactor_admits_a_newcomer)
{
	struct rpc_guard gd = {.max_per_host = SILENT};
	newcomer_case(&gd, true);
}

/* The control: a server that cannot hand connections over refuses it. */
Test(rpc_guard, without_a_way_to_hand_it_over_the_newcomer_is_refused)
{
	struct rpc_guard gd = {.max_preauth = SILENT};
	newcomer_case(&gd, false);
}
