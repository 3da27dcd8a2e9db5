/*
 * tests/unit/test_transport_mixed.c — the transport module's choice of
 * transport (protocol = auto | tcp | rdma; RDMA needs a device and a
 * cluster secret) and RDMA with TCP beside it
 * (modules/transport_mixed.h), on the verbs simulation.
 *
 * Owns: its fixtures. The module runs on one test reactor with the
 * simulation behind its verbs (tp_tcp_set_verbs); its RDMA listener and its
 * TCP data listener share one port number (the simulation's registry and
 * the kernel's sockets are apart). A peer "without RDMA" is the same node
 * after its RDMA listener was killed: its TCP data port still answers.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "common/settings.h"
#include "modules/modules.h"
#include "modules/membership.h"
#include "modules/transport.h"
#include "modules/transport_mixed.h"
#include "modules/transport_tcp.h"
#include "testutil.h"
#include "tests/fake/rdma_sim.h"

#define REG_BYTES (1u << 20)
#define N 16

static struct {
	struct rx_reactor *r;
	struct pc_settings s;
	struct pc_ctx ctx;
	const struct svc_transport *st;
	char ep[160];
	uint8_t *mem;
	uint32_t key;
	int pins, unpins, released;
	struct tp_read rd[N];
	struct tp_write wr[N];
	uint8_t *dst;
	int step;
	uint64_t posted_before;
} m;

static int m_pin(void *ctx, uintptr_t a, uint64_t l, struct tp_pin *p)
{
	(void)ctx;
	(void)a;
	(void)l;
	memset(p, 0, sizeof(*p));
	m.pins++;
	return 0;
}

static void m_unpin(void *ctx, const struct tp_pin *p)
{
	(void)ctx;
	(void)p;
	m.unpins++;
}

static void m_released(void *ctx)
{
	(void)ctx;
	m.released++;
}

static void on_stop(struct rx_reactor *r, void *arg)
{
	(void)arg;
	pc_mod_transport.stop(r, &m.ctx);
}

/* Load settings with protocol proto and run the module's init: its
 * result. */
static int module_init_with(const char *proto, bool secret,
			    const char *devices)
{
	char err[256];
	char *argv[] = {"test", "--bind", "127.0.0.1", "--data-port", "0",
			"--protocol", (char *)proto, "--device-names",
			(char *)devices, "--cluster-secret", "mixed-secret",
			NULL};
	char *envp[] = {NULL};
	cr_assert_eq(pc_settings_load(&m.s, secret ? 11 : 9, argv, envp, err,
				      sizeof(err)), 0, "%s", err);
	cr_assert_eq(pc_ctx_init(&m.ctx, &m.s, 1, NULL, 0), 0);
	tp_tcp_set_verbs(rsim_api());
	return pc_mod_transport.init(&m.ctx);
}

static int module_init_as(const char *proto, bool secret)
{
	return module_init_with(proto, secret, "");
}

/* RDMA runs only with a cluster secret: the tests give one. */
static int module_init(const char *proto)
{
	return module_init_as(proto, true);
}

static void module_fini(void)
{
	pc_mod_transport.fini(&m.ctx);
	pc_ctx_fini(&m.ctx);
	pc_settings_free(&m.s);
	tp_tcp_set_verbs(NULL);
}

static void start(void)
{
	m.r = tu_reactor(NULL);
	int ret = pc_mod_transport.start(m.r, &m.ctx);
	cr_assert_eq(ret, 0, "start: %s", strerror(-ret));
	cr_assert_eq(rx_reactor_on_stop(m.r, on_stop, NULL), 0);
	m.st = svc_find_transport(&m.ctx);
	cr_assert_not_null(m.st);
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(&m.ctx, eps, PC_ENDPOINTS_MAX);
	for (unsigned i = 0; i < n; i++)
		if (strcmp(eps[i].name, "data") == 0)
			snprintf(m.ep, sizeof(m.ep), "%s", eps[i].addr);
	m.mem = malloc(REG_BYTES);
	m.dst = calloc(N, 65536);
	cr_assert(m.mem && m.dst);
	tu_fill_pattern(m.mem, REG_BYTES, 7, 0);
	struct tp_region reg = {.base = (uintptr_t)m.mem, .len = REG_BYTES,
				.access = TP_ACCESS_READ | TP_ACCESS_WRITE,
				.pin = m_pin, .unpin = m_unpin,
				.released = m_released};
	cr_assert_eq(m.st->ops->reg_region(m.st->node, &reg, &m.key), 0);
}

static void finish(void)
{
	cr_assert_eq(m.st->ops->dereg_region(m.st->node, m.key), 0);
	pc_mod_transport.exit(m.r, &m.ctx);
	module_fini();
	rx_reactor_destroy(m.r);
	/* Released once, by the TCP half, with no pin left. */
	cr_assert_eq(m.released, 1);
	cr_assert_eq(m.pins, m.unpins);
	char left[256];
	cr_assert_eq(rsim_leftovers(left, sizeof(left)), 0, "left: %s", left);
	free(m.mem);
	free(m.dst);
	rsim_reset();
}

static uint64_t sim_posted(void)
{
	struct rsim_stats st;
	rsim_stats(&st);
	return st.wrs_posted;
}

static void reads_go(unsigned off, void (*done)(void *, struct tp_read *,
						unsigned))
{
	memset(m.dst, 0, (size_t)N * 65536);
	for (unsigned i = 0; i < N; i++) {
		struct tp_read *rd = &m.rd[i];
		memset(rd, 0, sizeof(*rd));
		snprintf(rd->peer, sizeof(rd->peer), "%s", m.ep);
		rd->rkey = m.key;
		rd->addr = (uintptr_t)m.mem + off + i * 4096u;
		rd->len = 4096;
		rd->dst = m.dst + (size_t)i * 65536;
	}
	cr_assert_eq(m.st->ops->read_batch(m.st->clients[0], m.rd, N, 10000,
					   done, NULL), 0);
}

static void reads_check(unsigned off)
{
	for (unsigned i = 0; i < N; i++) {
		cr_assert_eq(m.rd[i].res, 0, "read %u: %s", i,
			     strerror(-m.rd[i].res));
		cr_assert_eq(tu_check_pattern(m.dst + (size_t)i * 65536, 4096,
					      7, off + i * 4096u), -1);
	}
}

/* Run go on the module's reactor (started) until a step stops it; m.step
 * counts the steps' callbacks from 0. */
static void run_steps(void (*go)(struct rx_reactor *, struct rx_timer *))
{
	m.step = 0;
	struct rx_timer t;
	rx_timer_init(&t, go, NULL);
	rx_timer_start(m.r, &t, 0, 0);
	tu_run(m.r, 20000);
}

/* ------------------------------------------------------- the choice */

Test(transport_mixed, protocol_rdma_without_a_device_refuses_to_start)
{
	rsim_reset();
	cr_assert_eq(module_init("rdma"), -ENODEV);
	module_fini();
}

Test(transport_mixed, protocol_auto_without_a_device_runs_tcp)
{
	rsim_reset();
	cr_assert_eq(module_init("auto"), 0);
	const struct svc_transport *st = svc_find_transport(&m.ctx);
	cr_assert_str_eq(st->ops->name, "tcp");
	module_fini();
}

Test(transport_mixed, protocol_auto_with_a_down_port_runs_tcp)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_DOWN), 0);
	cr_assert_eq(module_init("auto"), 0);
	cr_assert_str_eq(svc_find_transport(&m.ctx)->ops->name, "tcp");
	module_fini();
	rsim_reset();
}

Test(transport_mixed, protocol_tcp_ignores_a_device)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(module_init("tcp"), 0);
	cr_assert_str_eq(svc_find_transport(&m.ctx)->ops->name, "tcp");
	module_fini();
	rsim_reset();
}

Test(transport_mixed, without_a_secret_auto_runs_tcp_and_rdma_refuses)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(module_init_as("auto", false), 0);
	cr_assert_str_eq(svc_find_transport(&m.ctx)->ops->name, "tcp");
	module_fini();
	cr_assert_eq(module_init_as("rdma", false), -EACCES);
	module_fini();
	rsim_reset();
}

/* ------------------------------------- RDMA, then TCP for a peer without */

static void fb_done(void *arg, struct tp_read *reads, unsigned n)
{
	(void)arg;
	(void)reads;
	cr_assert_eq(n, N);
	switch (m.step++) {
	case 0:
		/* RDMA refused (no listener): sent again over TCP. */
		reads_check(0);
		cr_assert_eq(tp_mixed_client_fallbacks(m.st->clients[0]), N);
		m.posted_before = sim_posted();
		reads_go(65536, fb_done);
		break;
	case 1:
		/* Straight to TCP now: no RDMA work was posted. */
		reads_check(65536);
		cr_assert_eq(sim_posted(), m.posted_before);
		cr_assert_eq(tp_mixed_client_fallbacks(m.st->clients[0]), N);
		rx_reactor_stop(m.r);
		break;
	}
}

static void fb_go(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	/* The peer has TCP and no RDMA listener. */
	cr_assert_eq(rsim_kill(m.ep), 0);
	reads_go(0, fb_done);
}

Test(transport_mixed, a_peer_without_rdma_is_read_over_tcp)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(module_init("auto"), 0);
	start();
	cr_assert_str_eq(m.st->ops->name, "rdma+tcp");
	run_steps(fb_go);
	cr_assert_eq(m.step, 2);
	finish();
}

/* ---------------------------------------------------- writes and cancel */

static void w_done(void *arg, struct tp_write *w, unsigned n)
{
	(void)arg;
	(void)w;
	for (unsigned i = 0; i < n; i++) {
		cr_assert_eq(m.wr[i].res, 0, "write %u: %s", i,
			     strerror(-m.wr[i].res));
		cr_assert_eq(tu_check_pattern(m.mem + 262144 + i * 4096u, 4096,
					      9, 262144 + i * 4096u), -1);
	}
	/* Around them, the region is as it was. */
	cr_assert_eq(tu_check_pattern(m.mem, 262144, 7, 0), -1);
	rx_reactor_stop(m.r);
}

static void w_go(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	for (unsigned i = 0; i < N; i++) {
		struct tp_write *w = &m.wr[i];
		memset(w, 0, sizeof(*w));
		snprintf(w->peer, sizeof(w->peer), "%s", m.ep);
		w->rkey = m.key;
		w->addr = (uintptr_t)m.mem + 262144 + i * 4096u;
		w->len = 4096;
		uint8_t *src = m.dst + (size_t)i * 65536;
		tu_fill_pattern(src, 4096, 9, 262144 + i * 4096u);
		w->src = src;
	}
	cr_assert_eq(m.st->ops->write_batch(m.st->clients[0], m.wr, N, 10000,
					    w_done, NULL), 0);
}

Test(transport_mixed, writes_land_over_rdma)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(module_init("rdma"), 0);
	start();
	/* Local registrations reach the RDMA half. */
	const struct tp_ops *o = m.st->ops;
	cr_assert_eq(o->reg_local(m.st->node, m.dst, 4096), 0);
	cr_assert_eq(o->unreg_local(m.st->node, m.dst), 0);
	cr_assert_eq(o->unreg_local(m.st->node, m.dst), -ENOENT);
	run_steps(w_go);
	cr_assert_geq(sim_posted(), N);
	finish();
}

/* ----------------------------------------- a departure revokes RDMA access */

static mb_event_fn leave_fn;
static void *leave_arg;

static int fake_subscribe(unsigned mask, mb_event_fn fn, void *arg)
{
	cr_assert_eq(mask, MB_ON(MB_LEAVE));
	leave_fn = fn;
	leave_arg = arg;
	return 0;
}

static const struct mb_api fake_mb = {.subscribe = fake_subscribe};

static uint64_t sim_mrs(void)
{
	struct rsim_stats st;
	rsim_stats(&st);
	return st.mrs_live;
}

static struct rx_timer rv_poll;
static uint64_t rv_mrs0;

static void rv_done(void *arg, struct tp_read *reads, unsigned n);

/* The revoke registered the region again (its old MR lives on through
 * the grace): read once more, over RDMA, with the new rkey. */
static void rv_poll_fire(struct rx_reactor *r, struct rx_timer *t)
{
	if (sim_mrs() != rv_mrs0 + 1)
		return;
	rx_timer_stop(r, t);
	m.posted_before = sim_posted();
	reads_go(65536, rv_done);
}

static void rv_done(void *arg, struct tp_read *reads, unsigned n)
{
	(void)arg;
	(void)reads;
	cr_assert_eq(n, N);
	switch (m.step++) {
	case 0:
		reads_check(0);
		rv_mrs0 = sim_mrs();
		leave_fn(m.r, MB_LEAVE, "gone:1", 2, leave_arg);
		rx_timer_init(&rv_poll, rv_poll_fire, NULL);
		rx_timer_start(m.r, &rv_poll, RX_MS(1), RX_MS(1));
		break;
	case 1:
		reads_check(65536);
		cr_assert_geq(sim_posted(), m.posted_before + N);
		cr_assert_eq(tp_mixed_client_fallbacks(m.st->clients[0]), 0);
		rx_reactor_stop(m.r);
		break;
	}
}

static void rv_go(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	reads_go(0, rv_done);
}

Test(transport_mixed, a_departure_revokes_rdma_access)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(module_init("rdma"), 0);
	cr_assert_eq(svc_publish_membership(&m.ctx, "cluster", &fake_mb), 0);
	leave_fn = NULL;
	cr_assert_eq(pc_mod_transport_revoke.init(&m.ctx), 0);
	cr_assert_not_null(leave_fn, "the module did not subscribe");
	start();
	run_steps(rv_go);
	cr_assert_eq(m.step, 2);
	svc_withdraw_membership(&m.ctx);
	finish();
}

/* TCP alone has nothing to revoke: the module stays idle. */
Test(transport_mixed, tcp_needs_no_revoke)
{
	rsim_reset();
	cr_assert_eq(module_init("tcp"), 0);
	cr_assert_eq(svc_publish_membership(&m.ctx, "cluster", &fake_mb), 0);
	leave_fn = NULL;
	cr_assert_eq(pc_mod_transport_revoke.init(&m.ctx), 0);
	cr_assert_null(leave_fn);
	svc_withdraw_membership(&m.ctx);
	module_fini();
}

/* ------------------------------------------------------------- rails */

static uint64_t rail_metric(const char *text, unsigned k, const char *dev)
{
	char want[160];
	snprintf(want, sizeof(want),
		 "rail=\"%u\",device=\"%s\"} ", k,
		 dev);
	const char *at = strstr(text, want);
	cr_assert(at, "no %s in:\n%s", want, text);
	return strtoull(at + strlen(want), NULL, 10);
}

static void rails_done(void *arg, struct tp_read *reads, unsigned n)
{
	(void)arg;
	(void)reads;
	(void)n;
	reads_check(m.step * 65536u);
	if (m.step++ == 0) {
		/* The first accept listed the node's second rail. */
		reads_go(65536, rails_done);
		return;
	}
	rx_reactor_stop(m.r);
}

static void rails_go(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	(void)t;
	reads_go(0, rails_done);
}

/* device_names: the module drives a rail per device, and counts each
 * rail's bytes. */
Test(transport_mixed, device_names_drive_rails)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_add_device("sim1", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_device_addr("sim1", "127.0.0.2"), 0);
	met_reset();
	cr_assert_eq(module_init_with("rdma", true, "sim0,sim1"), 0);
	cr_assert_eq(met_start(1), 0);
	start();
	run_steps(rails_go);
	cr_assert_eq(m.step, 2);
	size_t len;
	char *text = met_render("n", &len);
	cr_assert(text);
	/* 16 pages on rail 0, then 8 on each. */
	cr_assert_eq(rail_metric(text, 0, "sim0"), 24u * 4096u, "%s", text);
	cr_assert_eq(rail_metric(text, 1, "sim1"), 8u * 4096u, "%s", text);
	free(text);
	finish();
	met_reset();
}
