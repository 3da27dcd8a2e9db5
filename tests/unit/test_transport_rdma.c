/*
 * tests/unit/test_transport_rdma.c — what the RDMA transport
 * (modules/transport_rdma.h) does that the shared conformance suite
 * (test_transport.c) does not reach: selective signaling and send-queue
 * accounting, completion errors in the middle of a batch, a peer that stops
 * answering, connect timeouts, the per-operation timeout (a black-holed
 * queue pair), the connect-time authentication in both directions, that a
 * cancelled or timed-out batch never lands, per-batch memory registration,
 * and several rails (a batch striped over devices, a rail that cannot
 * connect or dies, what an accept can list). Device probing and
 * device_names: test_rdma_probe.c.
 *
 * Owns: the fixtures. Every case runs against the verbs simulation
 * (tests/fake/rdma_sim.h) through a copy of its table with two hooks
 * (poll_cq, get_cm_event) that let a case inject a fault at an exact point
 * or see what the node answered. A case is a chain of steps on one reactor
 * (tu_reactor): a step starts something; a batch's done callback or a
 * condition polled with a deadline (wait_for) moves to the next; the last
 * one stops the reactor. After each case the fabric must be empty
 * (fabric_clean).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "modules/transport.h"
#include "modules/transport_rdma.h"
#include "testutil.h"
#include "tests/fake/rdma_sim.h"

#define REG_BYTES (1u << 20)
#define OPS_MAX 256
#define SLOT 8192u
#define LIMIT_MS 8000
#define POISON 0xa5

/* The node's accept / reject private data (transport_rdma.c's wire
 * format): a reject carries the reason as a negative errno. */
#define WIRE_MAGIC 0x32524350u
struct wire_welcome {
	uint32_t magic;
	int32_t err;
	uint8_t proof[32];
};

struct ropts {
	unsigned max_chans, sq_depth, signal_every, connect_timeout_ms;
	const char *srv_secret;
	const char *cli_secret;
	bool separate; /* the client on a node of its own (cli_secret) */
	unsigned max_accepted; /* the serving node's cap on peers' QPs */
	unsigned revoke_grace_ms;
	unsigned op_timeout_ms;
	struct rsim_limits lim; /* the device's (0: the sim's default) */
	/* Devices sim0..: the serving node drives rails of them, the client
	 * node (separate) cli_rails (0: as many); device k is at 127.0.0.k+1.
	 * 0: one device, no address. */
	unsigned rails, cli_rails;
	const char *host; /* the node listens there (NULL: 127.0.0.1) */
};

struct rfx;
typedef void (*step_fn)(struct rfx *f);

struct rfx {
	struct ropts o;
	struct rx_reactor *r;
	struct tp_node *srv, *cli; /* cli == srv unless o.separate */
	struct tp_client *tc;
	char ep[64];
	uint8_t *mem;              /* srv's region: pattern seed 1 */
	uint32_t key;
	uint8_t *dst;              /* OPS_MAX x SLOT, plain malloc */
	struct tp_read rd[OPS_MAX];
	unsigned n;
	int done_calls;
	struct tp_peer *ph;
	const step_fn *steps;
	unsigned si;
	struct rx_timer tick, poll;
	bool (*cond)(struct rfx *f);
	const char *what;
	uint64_t until_ns;
	/* per case */
	struct tp_rdma_stats st0;
	struct rsim_stats sim0;
	bool dst_local;            /* dst given to tp_rdma_reg_local */
	uint8_t *loc;              /* memory given to tp_rdma_reg_local */
	uint8_t *reg2;             /* a second region of the node */
	uint32_t key2;
	int want;
};

/* ----------------------------------------------- the hooked verbs table */

static struct rv_api W;
static struct {
	/* poll_cq: after the first completion polled, the node's next WR
	 * fails with status */
	bool armed, fired;
	enum ibv_wc_status status;
	char addr[64];
	/* get_cm_event: the last REJECTED event a client saw */
	int rejects;
	uint8_t rej[148];
	unsigned rej_len;
} H;

static int w_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = rsim_api()->poll_cq(cq, n, wc);
	if (got > 0 && H.armed && !H.fired) {
		/* Every WR posted so far has completed (the caller's chain
		 * ends with its only signaled WR) and the next chain is not
		 * posted yet: the fault hits that chain's first WR. */
		H.fired = true;
		cr_assert_eq(rsim_fail_next(H.addr, 1, H.status), 0);
	}
	return got;
}

static int w_get_cm_event(struct rdma_event_channel *ch,
			  struct rdma_cm_event **ev)
{
	int ret = rsim_api()->get_cm_event(ch, ev);
	if (ret == 0 && (*ev)->event == RDMA_CM_EVENT_REJECTED) {
		unsigned len = (*ev)->param.conn.private_data_len;
		H.rejects++;
		H.rej_len = len < sizeof(H.rej) ? len : sizeof(H.rej);
		if (H.rej_len) /* none from a killed node */
			memcpy(H.rej, (*ev)->param.conn.private_data,
			       H.rej_len);
	}
	return ret;
}

/* ----------------------------------------------------------- the fabric */

/* Nothing of the fabric is left: every object the transport made is gone
 * and every event it got was acked. */
static void fabric_clean(void)
{
	char left[256];
	cr_assert_eq(rsim_leftovers(left, sizeof(left)), 0, "left: %s", left);
}

static struct tp_rdma_stats cli_stats(const struct rfx *f)
{
	struct tp_rdma_stats s;
	tp_rdma_node_stats(f->cli, &s);
	return s;
}

static struct tp_rdma_stats srv_stats(const struct rfx *f)
{
	struct tp_rdma_stats s;
	tp_rdma_node_stats(f->srv, &s);
	return s;
}

static struct rsim_stats sim_stats(void)
{
	struct rsim_stats s;
	rsim_stats(&s);
	return s;
}

/* ------------------------------------------------------------- fixture */

static int t_pin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	(void)ctx;
	(void)addr;
	(void)len;
	memset(pin, 0, sizeof(*pin));
	return 0;
}

static void t_unpin(void *ctx, const struct tp_pin *pin)
{
	(void)ctx;
	(void)pin;
}

static int reg(struct tp_node *tn, uint8_t *mem, uint32_t *key)
{
	struct tp_region g = {.base = (uintptr_t)mem, .len = REG_BYTES,
			      .access = TP_ACCESS_READ, .pin = t_pin,
			      .unpin = t_unpin};
	return tp_rdma_ops.reg_region(tn, &g, key);
}

static void on_stop(struct rx_reactor *r, void *arg)
{
	struct rfx *f = arg;
	(void)r;
	tp_rdma_client_stop(f->tc);
	tp_rdma_node_unlisten(f->srv);
}

/* "sim0,sim1,..." for n rails (NULL for one): valid until the next
 * call (a node copies it). */
static const char *rail_list(unsigned n)
{
	static char l[64];
	if (n <= 1)
		return NULL;
	l[0] = '\0';
	for (unsigned k = 0; k < n; k++)
		snprintf(l + strlen(l), sizeof(l) - strlen(l), "%ssim%u",
			 k ? "," : "", k);
	return l;
}

static struct tp_rdma_cfg cfg_of(const struct ropts *o, const char *secret)
{
	return (struct tp_rdma_cfg){.api = &W, .ib_port = 1, .gid_index = 0,
				    .max_chans = o->max_chans,
				    .connect_timeout_ms = o->connect_timeout_ms,
				    .sq_depth = o->sq_depth,
				    .signal_every = o->signal_every,
				    .revoke_grace_ms = o->revoke_grace_ms,
				    .op_timeout_ms = o->op_timeout_ms,
				    .secret = secret};
}

static void setup(struct rfx *f)
{
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_set_limits("sim0", &f->o.lim), 0);
	unsigned ndev = PC_MAX(f->o.rails, f->o.cli_rails);
	if (ndev > 1) {
		cr_assert_eq(rsim_device_addr("sim0", "127.0.0.1"), 0);
		cr_assert_eq(rsim_add_rails(1, ndev - 1), 0);
	}
	W = *rsim_api();
	W.poll_cq = w_poll_cq;
	W.get_cm_event = w_get_cm_event;
	memset(&H, 0, sizeof(H));
	/* A short shutdown grace: a watch whose poll_remove meets the poll
	 * as it fires (-EALREADY) can stay armed until the grace cancels it
	 * (a reactor issue, see reactor/io.c watch_remove); it costs time,
	 * not correctness. */
	struct rx_params p;
	rx_params_default(&p);
	p.shutdown_grace_ms = 500;
	f->r = tu_reactor(&p);
	struct tp_rdma_cfg cfg = cfg_of(&f->o, f->o.srv_secret);
	cfg.max_accepted = f->o.max_accepted;
	cfg.devices = rail_list(f->o.rails);
	int ret = tp_rdma_node_new(&cfg, &f->srv);
	cr_assert_eq(ret, 0, "node: %s", strerror(-ret));
	uint16_t port;
	ret = tp_rdma_node_listen(f->srv, f->r,
				  f->o.host ? f->o.host : "127.0.0.1", 0, NULL,
				  &port);
	cr_assert_eq(ret, 0, "listen: %s", strerror(-ret));
	snprintf(f->ep, sizeof(f->ep), "127.0.0.1:%u", port);
	f->cli = f->srv;
	if (f->o.separate) {
		cfg = cfg_of(&f->o, f->o.cli_secret);
		cfg.devices = rail_list(f->o.cli_rails ? f->o.cli_rails
						       : f->o.rails);
		ret = tp_rdma_node_new(&cfg, &f->cli);
		cr_assert_eq(ret, 0, "client node: %s", strerror(-ret));
	}
	int err = 0;
	f->tc = tp_rdma_client_new(f->cli, f->r, &err);
	cr_assert(f->tc, "client: %s", strerror(-err));
	cr_assert_eq(rx_reactor_on_stop(f->r, on_stop, f), 0);
	f->mem = malloc(REG_BYTES);
	f->dst = malloc((size_t)OPS_MAX * SLOT);
	cr_assert(f->mem && f->dst);
	tu_fill_pattern(f->mem, REG_BYTES, 1, 0);
	memset(f->dst, 0, (size_t)OPS_MAX * SLOT);
	cr_assert_eq(reg(f->srv, f->mem, &f->key), 0);
}

static void teardown(struct rfx *f)
{
	if (f->ph)
		tp_rdma_ops.peer_close(f->tc, f->ph, 0);
	tp_rdma_client_free(f->tc);
	cr_assert_eq(tp_rdma_ops.dereg_region(f->srv, f->key), 0);
	if (f->reg2)
		cr_assert_eq(tp_rdma_ops.dereg_region(f->cli, f->key2), 0);
	if (f->loc)
		cr_assert_eq(tp_rdma_unreg_local(f->cli, f->loc), 0);
	if (f->dst_local)
		cr_assert_eq(tp_rdma_unreg_local(f->cli, f->dst), 0);
	if (f->cli != f->srv)
		tp_rdma_node_free(f->cli);
	tp_rdma_node_free(f->srv);
	rx_reactor_destroy(f->r);
	fabric_clean();
	cr_assert_eq(rsim_reset(), 0);
	free(f->mem);
	free(f->dst);
	free(f->loc);
	free(f->reg2);
}

/* ------------------------------------------------------------ stepping */

static void tick(struct rx_reactor *r, struct rx_timer *t)
{
	struct rfx *f = t->arg;
	if (!f->steps[f->si]) {
		rx_reactor_stop(r);
		return;
	}
	f->steps[f->si++](f);
}

static void next(struct rfx *f)
{
	rx_timer_start(f->r, &f->tick, 0, 0);
}

static void next_after(struct rfx *f, unsigned ms)
{
	rx_timer_start(f->r, &f->tick, RX_MS(ms), 0);
}

static void poll_fire(struct rx_reactor *r, struct rx_timer *t)
{
	struct rfx *f = t->arg;
	if (f->cond(f)) {
		rx_timer_stop(r, t);
		next(f);
		return;
	}
	cr_assert(pc_now_ns() < f->until_ns, "waited %u ms in vain for %s",
		  LIMIT_MS / 2, f->what);
}

/* The next step once cond holds (checked every ms), or fail. */
static void wait_for(struct rfx *f, bool (*cond)(struct rfx *f),
		     const char *what)
{
	f->cond = cond;
	f->what = what;
	f->until_ns = pc_now_ns() + RX_MS(LIMIT_MS / 2);
	rx_timer_start(f->r, &f->poll, RX_MS(1), RX_MS(1));
}

static void run(const struct ropts *o, const step_fn *steps)
{
	struct rfx *f = calloc(1, sizeof(*f));
	cr_assert(f);
	f->o = *o;
	setup(f);
	f->steps = steps;
	rx_timer_init(&f->tick, tick, f);
	rx_timer_init(&f->poll, poll_fire, f);
	next(f);
	tu_run(f->r, LIMIT_MS);
	teardown(f);
	free(f);
}

/* ---------------------------------------------------------- operations */

/* Read i: len bytes of the region at off into to. */
static void rd_set(struct rfx *f, unsigned i, uint64_t off, uint32_t len,
		   void *to)
{
	struct tp_read *rd = &f->rd[i];
	memset(rd, 0, sizeof(*rd));
	snprintf(rd->peer, sizeof(rd->peer), "%s", f->ep);
	rd->rkey = f->key;
	rd->addr = (uintptr_t)f->mem + off;
	rd->len = len;
	rd->dst = to;
	rd->ph = f->ph;
}

static uint64_t off_of(unsigned i)
{
	return (uint64_t)((i * 37u + 5u) % 200u) * 4096u + i % 61u;
}

static uint32_t len_of(unsigned i)
{
	return 700u + (i * 131u) % 6000u;
}

/* n reads of the usual shape into base + i * SLOT. */
static void rd_many(struct rfx *f, unsigned n, uint8_t *base)
{
	for (unsigned i = 0; i < n; i++)
		rd_set(f, i, off_of(i), len_of(i), base + (size_t)i * SLOT);
}

static void rd_landed(struct rfx *f, unsigned i)
{
	struct tp_read *rd = &f->rd[i];
	cr_assert_eq(rd->res, 0, "read %u: %s", i, strerror(-rd->res));
	cr_assert_eq(tu_check_pattern(rd->dst, rd->len, 1, rd->addr -
				      (uintptr_t)f->mem), -1,
		     "read %u landed wrong bytes", i);
}

static void rdone(void *arg, struct tp_read *reads, unsigned n)
{
	struct rfx *f = arg;
	cr_assert_eq(reads, f->rd);
	cr_assert_eq(n, f->n);
	f->done_calls++;
	next(f);
}

static void go(struct rfx *f, unsigned n, unsigned timeout_ms)
{
	f->n = n;
	f->st0 = cli_stats(f);
	f->sim0 = sim_stats();
	int ret = tp_rdma_ops.read_batch(f->tc, f->rd, n, timeout_ms, rdone, f);
	cr_assert_eq(ret, 0, "read_batch: %s", strerror(-ret));
}

/* Every byte of dst poisoned; checked later by untouched(). */
static void poison(struct rfx *f)
{
	memset(f->dst, POISON, (size_t)OPS_MAX * SLOT);
}

static void untouched(struct rfx *f)
{
	for (size_t i = 0; i < (size_t)OPS_MAX * SLOT; i++)
		if (f->dst[i] != POISON)
			cr_assert_fail("byte %zu (slot %zu) changed after done",
				       i, i / SLOT);
}

/* Give the client's landing memory to tp_rdma_reg_local. */
static void local_dst(struct rfx *f)
{
	cr_assert_eq(tp_rdma_reg_local(f->cli, f->dst, (size_t)OPS_MAX * SLOT),
		     0);
	f->dst_local = true;
}

/* ---------------------------------------------- selective signaling */

static void sig_go(struct rfx *f)
{
	local_dst(f);
	rd_many(f, 200, f->dst);
	go(f, 200, 10000);
}

static void sig_check(struct rfx *f)
{
	for (unsigned i = 0; i < 200; i++)
		rd_landed(f, i);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.wrs_posted, 200, "%llu WRs posted",
		     (unsigned long long)s.wrs_posted);
	cr_assert_gt(s.wrs_signaled, 0);
	/* signal_every 8 and the end of each chain: about one in 8. */
	cr_assert_leq(s.wrs_signaled * 4, s.wrs_posted,
		      "%llu of %llu WRs signaled",
		      (unsigned long long)s.wrs_signaled,
		      (unsigned long long)s.wrs_posted);
	cr_assert_eq(s.post_failures, 0, "the send queue overflowed");
	cr_assert_eq(s.wc_errors, 0);
	cr_assert_eq(s.chans_opened, 1);
	cr_assert_eq(sim_stats().cq_overflows, 0);
	next(f);
}

Test(transport_rdma, selective_signaling)
{
	static const step_fn s[] = {sig_go, sig_check, NULL};
	struct ropts o = {.max_chans = 1, .sq_depth = 32, .signal_every = 8};
	run(&o, s);
}

/* ------------------------------------------- send-queue backpressure */

static void bp_go(struct rfx *f)
{
	rd_many(f, 64, f->dst);
	go(f, 64, 10000);
}

static void bp_check(struct rfx *f)
{
	for (unsigned i = 0; i < 64; i++)
		rd_landed(f, i);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.chans_opened, 1);
	cr_assert_eq(s.wrs_posted, 64);
	cr_assert_eq(s.post_failures, 0, "posted beyond the send queue");
	cr_assert_eq(s.lazy_mrs, 64);
	next(f);
}

/* The serving node holds at most max_accepted peers' QPs: the client's
 * channels beyond it are refused, and their reads (bp_go's 64) go on the
 * others. */
static void cap_check(struct rfx *f)
{
	for (unsigned i = 0; i < 64; i++)
		rd_landed(f, i);
	struct tp_rdma_stats c = cli_stats(f), sv = srv_stats(f);
	cr_assert_eq(sv.accepted, 2, "%llu accepted",
		     (unsigned long long)sv.accepted);
	cr_assert_geq(sv.refused, 1);
	cr_assert_eq(c.chans_failed, sv.refused);
	next(f);
}

Test(transport_rdma, accepted_queue_pairs_are_capped)
{
	static const step_fn s[] = {bp_go, cap_check, NULL};
	struct ropts o = {.max_chans = 4, .srv_secret = "s", .cli_secret = "s",
			  .separate = true, .max_accepted = 2};
	run(&o, s);
}

Test(transport_rdma, send_queue_backpressure)
{
	static const step_fn s[] = {bp_go, bp_check, NULL};
	struct ropts o = {.max_chans = 1, .sq_depth = 4};
	run(&o, s);
}

/* ------------------------------------- a completion error mid-batch */

static void wce_go(struct rfx *f)
{
	/* Chains of 8 (sq_depth 8, one signaled WR each): the fault hits
	 * the first WR of the second chain, 7 more are posted behind it. */
	H.armed = true;
	H.status = IBV_WC_REM_ACCESS_ERR;
	snprintf(H.addr, sizeof(H.addr), "%s", f->ep);
	rd_many(f, 32, f->dst);
	go(f, 32, 10000);
}

static void wce_check(struct rfx *f)
{
	cr_assert(H.fired);
	unsigned failed = 0;
	for (unsigned i = 0; i < 32; i++) {
		if (f->rd[i].res == 0) {
			rd_landed(f, i);
			continue;
		}
		cr_assert_eq(f->rd[i].res, -EFAULT, "read %u: %s", i,
			     strerror(-f->rd[i].res));
		cr_assert_eq(i, 8, "read %u failed, not the 2nd chain's first",
			     i);
		failed++;
	}
	cr_assert_eq(failed, 1);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_gt(s.retried, 0, "the flushed reads were not posted again");
	cr_assert_geq(s.chans_torn_down, 1);
	cr_assert_eq(s.chans_opened, 2);
	cr_assert_geq(s.wc_errors, 1);
	cr_assert_eq(s.timeouts, 0);
	next(f);
}

Test(transport_rdma, completion_error_mid_batch)
{
	static const step_fn s[] = {wce_go, wce_check, NULL};
	struct ropts o = {.max_chans = 1, .sq_depth = 8, .signal_every = 8};
	run(&o, s);
}

/* ------------------------------------------ a peer that stops answering */

static void rex_go(struct rfx *f)
{
	cr_assert_eq(tp_rdma_ops.peer_open(f->tc, f->ep, "n1", &f->ph), 0);
	cr_assert_eq(rsim_fail_next(f->ep, 1, IBV_WC_RETRY_EXC_ERR), 0);
	rd_many(f, 16, f->dst);
	/* Far beyond the case's watchdog: only the transport can end it. */
	go(f, 16, 60000);
}

static void rex_check(struct rfx *f)
{
	for (unsigned i = 0; i < 16; i++)
		cr_assert_eq(f->rd[i].res, -EHOSTDOWN, "read %u: %s", i,
			     strerror(-f->rd[i].res));
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.timeouts, 0);
	cr_assert_eq(s.retried, 0, "a dead peer's reads were posted again");
	struct tp_peer_info pi;
	int st = tp_rdma_ops.peer_health(f->tc, f->ph, &pi);
	cr_assert_eq(st, TP_PEER_FAILED, "peer state %d", st);
	cr_assert_eq(pi.err, -EHOSTDOWN);
	cr_assert_eq(pi.inflight, 0);
	cr_assert_eq(pi.channels, 0);
	/* It answers again: the next batch opens a new channel. */
	rd_many(f, 4, f->dst);
	go(f, 4, 10000);
}

static void rex_check2(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_landed(f, i);
	cr_assert_eq(tp_rdma_ops.peer_health(f->tc, f->ph, NULL), TP_PEER_UP);
	next(f);
}

Test(transport_rdma, retry_exceeded_fails_the_peer)
{
	static const step_fn s[] = {rex_go, rex_check, rex_check2, NULL};
	struct ropts o = {.max_chans = 1};
	run(&o, s);
}

/* ------------------------------------------------------ connect timeout */

static void cto_go(struct rfx *f)
{
	cr_assert_eq(rsim_silence_cm(f->ep, true), 0);
	cr_assert_eq(tp_rdma_ops.peer_open(f->tc, f->ep, "n1", &f->ph), 0);
	rd_many(f, 4, f->dst);
	go(f, 4, 60000);
}

static void cto_check(struct rfx *f)
{
	/* The channel's connect deadline (2 x connect_timeout_ms for the
	 * whole handshake) ended the reads, not the batch's timeout. */
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(f->rd[i].res, -ETIMEDOUT, "read %u: %s", i,
			     strerror(-f->rd[i].res));
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.timeouts, 0, "the batch timed out");
	cr_assert_geq(s.chans_failed, 1);
	cr_assert_eq(s.wrs_posted, 0);
	struct tp_peer_info pi;
	cr_assert_eq(tp_rdma_ops.peer_health(f->tc, f->ph, &pi),
		     TP_PEER_FAILED);
	cr_assert_eq(pi.err, -ETIMEDOUT);
	cr_assert_eq(pi.channels, 0);
	cr_assert_eq(srv_stats(f).accepted, 0);
	next(f);
}

Test(transport_rdma, connect_timeout)
{
	static const step_fn s[] = {cto_go, cto_check, NULL};
	struct ropts o = {.max_chans = 1, .connect_timeout_ms = 200};
	run(&o, s);
}

/* The same with channels opening in parallel (one per read). */
Test(transport_rdma, connect_timeout_many_channels)
{
	static const step_fn s[] = {cto_go, cto_check, NULL};
	struct ropts o = {.max_chans = 4, .connect_timeout_ms = 200};
	run(&o, s);
}

/* ------------------------------------------------------ authentication */

static void auth_go(struct rfx *f)
{
	poison(f);
	rd_many(f, 4, f->dst);
	go(f, 4, 10000);
}

/* The node refused: its reason came back in the reject private data. */
static void auth_refused(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(f->rd[i].res, -EACCES, "read %u: %s", i,
			     strerror(-f->rd[i].res));
	untouched(f);
	cr_assert_geq(H.rejects, 1);
	struct wire_welcome w;
	cr_assert_geq(H.rej_len, 8);
	memcpy(&w, H.rej, 8);
	cr_assert_eq(w.magic, WIRE_MAGIC);
	cr_assert_eq(w.err, -EACCES, "reason %d", w.err);
	struct tp_rdma_stats s = srv_stats(f);
	cr_assert_geq(s.refused, 1);
	cr_assert_eq(s.refused, (uint64_t)H.rejects);
	cr_assert_eq(s.accepted, 0);
	cr_assert_eq(sim_stats().wrs_posted, 0);
	next(f);
}

Test(transport_rdma, auth_wrong_secret)
{
	static const step_fn s[] = {auth_go, auth_refused, NULL};
	struct ropts o = {.max_chans = 2, .separate = true,
			  .srv_secret = "alpha-secret",
			  .cli_secret = "beta-secret"};
	run(&o, s);
}

Test(transport_rdma, auth_client_without_secret)
{
	static const step_fn s[] = {auth_go, auth_refused, NULL};
	struct ropts o = {.max_chans = 2, .separate = true,
			  .srv_secret = "alpha-secret"};
	run(&o, s);
}

/* The node has no secret, so its answer proves nothing: the client closes
 * the queue pair before it posts anything. */
static void auth_unproven(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(f->rd[i].res, -EACCES, "read %u: %s", i,
			     strerror(-f->rd[i].res));
	untouched(f);
	cr_assert_eq(H.rejects, 0);
	cr_assert_geq(srv_stats(f).accepted, 1);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.wrs_posted, 0);
	cr_assert_geq(s.chans_failed, 1);
	cr_assert_eq(sim_stats().wrs_posted, 0);
	next(f);
}

Test(transport_rdma, auth_node_without_secret)
{
	static const step_fn s[] = {auth_go, auth_unproven, NULL};
	struct ropts o = {.max_chans = 2, .separate = true,
			  .cli_secret = "alpha-secret"};
	run(&o, s);
}

static void auth_ok(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_landed(f, i);
	cr_assert_eq(H.rejects, 0);
	cr_assert_eq(srv_stats(f).refused, 0);
	next(f);
}

/* The control: two nodes with the same secret. */
Test(transport_rdma, auth_same_secret)
{
	static const step_fn s[] = {auth_go, auth_ok, NULL};
	struct ropts o = {.max_chans = 2, .separate = true,
			  .srv_secret = "alpha-secret",
			  .cli_secret = "alpha-secret"};
	run(&o, s);
}

/* ------------------------------- a batch that ended never lands later */

static bool all_posted(struct rfx *f)
{
	return cli_stats(f).wrs_posted - f->st0.wrs_posted >= f->n;
}

/* done of a batch expected to end with f->want everywhere: poison the
 * landing memory, let the fabric run past the reads' due time. */
static void done_poison(void *arg, struct tp_read *reads, unsigned n)
{
	struct rfx *f = arg;
	cr_assert_eq(reads, f->rd);
	f->done_calls++;
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(f->rd[i].res, f->want, "read %u: %s", i,
			     strerror(-f->rd[i].res));
	/* They were in flight when the batch ended. */
	cr_assert_geq(cli_stats(f).wrs_posted - f->st0.wrs_posted, n);
	poison(f);
	cr_assert_eq(rsim_silence(f->ep, false), 0);
	next_after(f, 300);
}

static void go_poison(struct rfx *f, unsigned n, unsigned timeout_ms)
{
	rd_many(f, n, f->dst);
	f->n = n;
	f->st0 = cli_stats(f);
	f->sim0 = sim_stats();
	cr_assert_eq(tp_rdma_ops.read_batch(f->tc, f->rd, n, timeout_ms,
					    done_poison, f), 0);
}

static void cxl_go(struct rfx *f)
{
	/* Registered memory: nothing but the QP's end keeps a late read
	 * from landing (a per-batch MR's deregistration would). */
	local_dst(f);
	/* Posted and in flight for 150-200 ms: cancelled long before. */
	cr_assert_eq(rsim_set_delay(f->ep, 150000, 200000), 0);
	f->want = -ECANCELED;
	go_poison(f, 8, 10000);
	wait_for(f, all_posted, "the reads to be posted");
}

static void cxl_cancel(struct rfx *f)
{
	cr_assert_eq(tp_rdma_ops.cancel(f->tc, f), 1);
	cr_assert_eq(f->done_calls, 0, "done ran inside cancel");
	/* done_poison goes on */
}

/* Nothing landed after done: the WRs never ran (dropped with their QP, or
 * flushed by the disconnect just before). */
static void ended_check(struct rfx *f)
{
	cr_assert_eq(f->done_calls, 1);
	untouched(f);
	struct rsim_stats st = sim_stats();
	uint64_t gone = st.wrs_dropped - f->sim0.wrs_dropped +
			st.flushes - f->sim0.flushes;
	cr_assert_geq(gone, f->n, "%llu WRs dropped or flushed",
		      (unsigned long long)gone);
	next(f);
}

Test(transport_rdma, cancelled_batch_never_lands)
{
	static const step_fn s[] = {cxl_go, cxl_cancel, ended_check, NULL};
	struct ropts o = {.max_chans = 2};
	run(&o, s);
}

static void tmo_go(struct rfx *f)
{
	/* Held by the node until done_poison lets it answer again. */
	cr_assert_eq(rsim_silence(f->ep, true), 0);
	f->want = -ETIMEDOUT;
	go_poison(f, 8, 400);
}

static void tmo_check(struct rfx *f)
{
	cr_assert_eq(cli_stats(f).timeouts, 1);
	ended_check(f);
}

Test(transport_rdma, timed_out_batch_never_lands)
{
	static const step_fn s[] = {tmo_go, tmo_check, NULL};
	struct ropts o = {.max_chans = 2};
	run(&o, s);
}

/* ------------------------------------------------------ device limits */

/* A device with a small send queue and few READs in flight: the QPs are
 * made within its limits (the sim refuses anything beyond them), and a
 * batch 8 times the send queue goes through it. */
static void lim_go(struct rfx *f)
{
	rd_many(f, 64, f->dst);
	go(f, 64, 10000);
}

static void lim_check(struct rfx *f)
{
	for (unsigned i = 0; i < 64; i++)
		rd_landed(f, i);
	struct rsim_stats st = sim_stats();
	cr_assert_eq(st.qp_send_wr_max, 8, "a QP asked for %llu send WRs",
		     (unsigned long long)st.qp_send_wr_max);
	cr_assert_eq(st.init_depth_max, 2, "initiator_depth %llu",
		     (unsigned long long)st.init_depth_max);
	cr_assert_eq(st.resp_res_max, 2, "responder_resources %llu",
		     (unsigned long long)st.resp_res_max);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.chans_opened, 1);
	cr_assert_eq(s.chans_failed, 0);
	cr_assert_eq(s.wrs_posted, 64);
	cr_assert_eq(s.post_failures, 0, "posted beyond the send queue");
	next(f);
}

Test(transport_rdma, device_limits_cut_the_queue_pairs)
{
	static const step_fn s[] = {lim_go, lim_check, NULL};
	struct ropts o = {.max_chans = 1,
			  .lim = {.max_qp_wr = 8, .max_cqe = 4096,
				  .max_qp_rd_atom = 4,
				  .max_qp_init_rd_atom = 2}};
	run(&o, s);
}

/* ------------------------------------------------------ device events */

/* The device reports a fatal error of the queue pair the node accepted
 * (and a port event): the node reads both, drops that QP, and its peer's
 * channel closes on the disconnect; the next batch opens another. */
static void ae_warm(struct rfx *f)
{
	rd_many(f, 4, f->dst);
	go(f, 4, 10000);
}

static bool ae_dropped(struct rfx *f)
{
	return srv_stats(f).async_events >= 2 &&
	       cli_stats(f).chans_torn_down >= 1;
}

static void ae_fatal(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_landed(f, i);
	cr_assert_eq(srv_stats(f).accepted, 1);
	cr_assert_eq(cli_stats(f).chans_torn_down, 0);
	cr_assert_eq(rsim_async_port("sim0", IBV_EVENT_GID_CHANGE), 0);
	cr_assert_eq(rsim_async_qp(f->ep, IBV_EVENT_QP_FATAL), 1);
	wait_for(f, ae_dropped, "the node to drop the failed queue pair");
}

static void ae_again(struct rfx *f)
{
	memset(f->dst, 0, (size_t)OPS_MAX * SLOT);
	rd_many(f, 4, f->dst);
	go(f, 4, 10000);
}

static void ae_check(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_landed(f, i);
	cr_assert_eq(srv_stats(f).accepted, 2);
	cr_assert_eq(cli_stats(f).chans_opened, 2);
	cr_assert_eq(srv_stats(f).async_events, 2);
	next(f);
}

Test(transport_rdma, device_event_drops_a_failed_queue_pair)
{
	static const step_fn s[] = {ae_warm, ae_fatal, ae_again, ae_check,
				    NULL};
	struct ropts o = {.max_chans = 1};
	run(&o, s);
}

/* ------------------------------ the per-operation timeout (stuck QPs) */

#define OP_TIMEOUT_MS 200

/* One channel, connected by a first batch; then the sim black-holes it
 * (but not the QPs connected later). The next batch's reads are posted on
 * it and never complete: after op_timeout_ms the channel is closed and
 * the reads go on a new one. The batch's own timeout is far beyond the
 * case's watchdog: only the op timeout can end it in time. */
static void stuck_warm(struct rfx *f)
{
	rd_many(f, 8, f->dst);
	go(f, 8, 10000);
}

static void stuck_go(struct rfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		rd_landed(f, i);
	cr_assert_eq(cli_stats(f).chans_opened, 1);
	cr_assert_eq(rsim_silence_qps(f->ep), 0);
	memset(f->dst, 0, (size_t)OPS_MAX * SLOT);
	rd_many(f, 8, f->dst);
	go(f, 8, 60000);
}

static void stuck_check(struct rfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		rd_landed(f, i);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_geq(s.op_timeouts - f->st0.op_timeouts, 1);
	cr_assert_eq(s.timeouts, 0, "the batch timed out");
	cr_assert_geq(s.retried - f->st0.retried, 8);
	cr_assert_geq(s.chans_opened, 2);
	/* The stuck QP's WRs never ran: dropped with it (or flushed by the
	 * disconnect just before). */
	struct rsim_stats st = sim_stats();
	cr_assert_geq(st.wrs_dropped - f->sim0.wrs_dropped + st.flushes -
		      f->sim0.flushes, 8, "the stuck QP's WRs ran");
	next(f);
}

Test(transport_rdma, op_timeout_moves_reads_off_a_stuck_channel)
{
	static const step_fn s[] = {stuck_warm, stuck_go, stuck_check, NULL};
	struct ropts o = {.max_chans = 1, .op_timeout_ms = OP_TIMEOUT_MS};
	run(&o, s);
}

/* Every QP to the node is black-holed: each read times out on its first
 * channel and on its retry, and ends with -ETIMEDOUT at about twice the
 * op timeout, not at the batch's 60 s. Nothing lands afterwards (the
 * node answers again once done ran: done_poison). */
static void dark_go(struct rfx *f)
{
	cr_assert_eq(tp_rdma_ops.peer_open(f->tc, f->ep, "n1", &f->ph), 0);
	cr_assert_eq(rsim_silence(f->ep, true), 0);
	f->want = -ETIMEDOUT;
	go_poison(f, 8, 60000);
}

static void dark_check(struct rfx *f)
{
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.timeouts, 0, "the batch timed out");
	cr_assert_geq(s.op_timeouts, 2, "%llu op timeouts",
		      (unsigned long long)s.op_timeouts);
	cr_assert_eq(s.retried, 8, "each read is posted once more, once");
	struct tp_peer_info pi;
	tp_rdma_ops.peer_health(f->tc, f->ph, &pi);
	cr_assert_eq(pi.err, -ETIMEDOUT);
	cr_assert_eq(pi.inflight, 0);
	next(f);
}

Test(transport_rdma, op_timeout_twice_ends_the_read)
{
	static const step_fn s[] = {dark_go, ended_check, dark_check, NULL};
	struct ropts o = {.max_chans = 1, .op_timeout_ms = OP_TIMEOUT_MS};
	run(&o, s);
}

/* op_timeout_ms 0: no operation timeout; the batch's own bounds it, and
 * its stuck channel is not replaced. */
static void nooptmo_check(struct rfx *f)
{
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.timeouts, 1);
	cr_assert_eq(s.op_timeouts, 0);
	cr_assert_eq(s.retried, 0);
	cr_assert_eq(s.chans_opened, 1);
	ended_check(f);
}

Test(transport_rdma, op_timeout_off)
{
	static const step_fn s[] = {tmo_go, nooptmo_check, NULL};
	struct ropts o = {.max_chans = 1, .op_timeout_ms = 0};
	run(&o, s);
}

/* ------------------ a local registration withdrawn under the reads */

/* The session module withdraws a client's region (unreg_local) before it
 * swaps the pages out: reads still on their way into it fail and land
 * nothing. */
static void ul_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct rfx *f = arg;
	(void)reads;
	f->done_calls++;
	for (unsigned i = 0; i < n; i++)
		cr_assert_lt(f->rd[i].res, 0, "read %u landed after its "
			     "memory was withdrawn", i);
	poison(f);
	next_after(f, 300);
}

static void ul_go(struct rfx *f)
{
	cr_assert_eq(tp_rdma_ops.reg_local(f->cli, f->dst,
					   (size_t)OPS_MAX * SLOT), 0);
	cr_assert_eq(rsim_set_delay(f->ep, 150000, 200000), 0);
	rd_many(f, 8, f->dst);
	f->n = 8;
	f->st0 = cli_stats(f);
	f->sim0 = sim_stats();
	cr_assert_eq(tp_rdma_ops.read_batch(f->tc, f->rd, 8, LIMIT_MS / 2,
					    ul_done, f), 0);
	wait_for(f, all_posted, "the reads to be posted");
}

static void ul_withdraw(struct rfx *f)
{
	cr_assert_eq(tp_rdma_ops.unreg_local(f->cli, f->dst), 0);
	cr_assert_eq(tp_rdma_ops.unreg_local(f->cli, f->dst), -ENOENT);
	/* no batch registration was made: the reads used the local one */
	cr_assert_eq(cli_stats(f).lazy_mrs, f->st0.lazy_mrs);
}

static void ul_check(struct rfx *f)
{
	cr_assert_eq(f->done_calls, 1);
	untouched(f);
	next(f);
}

Test(transport_rdma, reads_into_withdrawn_local_memory_fail)
{
	static const step_fn s[] = {ul_go, ul_withdraw, ul_check, NULL};
	struct ropts o = {.max_chans = 1};
	run(&o, s);
}

/* --------------------- other batches on a channel an abort closes */

/* Batch A shares the one channel with short batches that time out, one
 * after the other: each timeout closes the channel, A's posted reads go
 * on (they were not at fault, so they keep their one retry), and land
 * once the node answers again. */
static struct tp_read by_rd[1];
static bool by_a_done;

static void by_adone(void *arg, struct tp_read *reads, unsigned n)
{
	(void)arg;
	(void)reads;
	(void)n;
	by_a_done = true;
}

static void by_bdone(void *arg, struct tp_read *reads, unsigned n)
{
	struct rfx *f = arg;
	(void)n;
	cr_assert_eq(reads, by_rd);
	cr_assert_eq(by_rd[0].res, -ETIMEDOUT, "%s",
		     strerror(-by_rd[0].res));
	/* It was posted (in flight) when it timed out: the case's point. */
	rx_timer_stop(f->r, &f->poll);
	cr_assert(all_posted(f), "B timed out before it was posted");
	next(f);
}

static void by_b(struct rfx *f)
{
	cr_assert_not(by_a_done, "the bystander batch ended early");
	memset(by_rd, 0, sizeof(by_rd));
	snprintf(by_rd[0].peer, sizeof(by_rd[0].peer), "%s", f->ep);
	by_rd[0].rkey = f->key;
	by_rd[0].addr = (uintptr_t)f->mem;
	by_rd[0].len = 512;
	by_rd[0].dst = f->dst + (size_t)(OPS_MAX - 1) * SLOT;
	f->st0 = cli_stats(f);
	f->n = 1;
	cr_assert_eq(tp_rdma_ops.read_batch(f->tc, by_rd, 1, 100, by_bdone,
					    f), 0);
}

static void by_go(struct rfx *f)
{
	by_a_done = false;
	cr_assert_eq(rsim_silence(f->ep, true), 0);
	rd_many(f, 16, f->dst);
	f->n = 16;
	f->st0 = cli_stats(f);
	cr_assert_eq(tp_rdma_ops.read_batch(f->tc, f->rd, 16, LIMIT_MS / 2,
					    by_adone, f), 0);
	wait_for(f, all_posted, "A's reads to be posted");
}

/* B's read waits behind A's on the channel: posted once it is back. */
static void by_b_posted(struct rfx *f)
{
	by_b(f);
	wait_for(f, all_posted, "B's read to be posted");
}

static void by_wait_b(struct rfx *f)
{
	(void)f; /* by_bdone moves on */
}

static bool by_a_ended(struct rfx *f)
{
	(void)f;
	return by_a_done;
}

static void by_release(struct rfx *f)
{
	cr_assert_not(by_a_done, "the bystander batch ended early");
	cr_assert_geq(cli_stats(f).chans_torn_down, 2);
	cr_assert_eq(rsim_silence(f->ep, false), 0);
	wait_for(f, by_a_ended, "the bystander batch");
}

static void by_check(struct rfx *f)
{
	for (unsigned i = 0; i < 16; i++)
		rd_landed(f, i);
	next(f);
}

Test(transport_rdma, other_batches_survive_aborts_of_their_channel)
{
	static const step_fn s[] = {by_go, by_b_posted, by_wait_b,
				    by_b_posted, by_wait_b, by_release,
				    by_check, NULL};
	struct ropts o = {.max_chans = 1};
	run(&o, s);
}

/* ----------------------------------------- per-batch registrations */

#define LZ_N 16

static void lz_go(struct rfx *f)
{
	/* Memory given to tp_rdma_reg_local (one more slot of plain memory
	 * behind it). */
	f->loc = malloc((size_t)(LZ_N + 1) * SLOT);
	cr_assert(f->loc);
	cr_assert_eq(tp_rdma_reg_local(f->cli, f->loc, (size_t)LZ_N * SLOT),
		     0);
	rd_many(f, LZ_N, f->loc);
	go(f, LZ_N, 10000);
}

static void lz_local(struct rfx *f)
{
	for (unsigned i = 0; i < LZ_N; i++)
		rd_landed(f, i);
	cr_assert_eq(cli_stats(f).lazy_mrs, f->st0.lazy_mrs,
		     "reads into reg_local memory registered per batch");
	/* Memory inside a region of the node. */
	f->reg2 = malloc(REG_BYTES);
	cr_assert(f->reg2);
	cr_assert_eq(reg(f->cli, f->reg2, &f->key2), 0);
	rd_many(f, LZ_N, f->reg2 + 4096);
	go(f, LZ_N, 10000);
}

static void lz_region(struct rfx *f)
{
	for (unsigned i = 0; i < LZ_N; i++)
		rd_landed(f, i);
	cr_assert_eq(cli_stats(f).lazy_mrs, f->st0.lazy_mrs,
		     "reads into a registered region registered per batch");
	/* Plain memory: registered for the batch, deregistered after. */
	rd_many(f, LZ_N, f->dst);
	go(f, LZ_N, 10000);
}

static void lz_plain(struct rfx *f)
{
	for (unsigned i = 0; i < LZ_N; i++)
		rd_landed(f, i);
	cr_assert_eq(cli_stats(f).lazy_mrs - f->st0.lazy_mrs, LZ_N);
	cr_assert_eq(sim_stats().mrs_live, f->sim0.mrs_live,
		     "a batch's registrations outlived it");
	/* A buffer straddling the end of the reg_local memory is not
	 * covered by it: registered for its batch. */
	rd_set(f, 0, 0, SLOT, f->loc + (LZ_N - 1) * SLOT + 1);
	go(f, 1, 10000);
}

static void lz_straddle(struct rfx *f)
{
	cr_assert_eq(f->rd[0].res, 0, "%s", strerror(-f->rd[0].res));
	cr_assert_eq(tu_check_pattern(f->rd[0].dst, SLOT, 1, 0), -1);
	cr_assert_eq(cli_stats(f).lazy_mrs - f->st0.lazy_mrs, 1);
	next(f);
}

Test(transport_rdma, registered_memory_needs_no_batch_mr)
{
	static const step_fn s[] = {lz_go, lz_local, lz_region, lz_plain,
				    lz_straddle, NULL};
	struct ropts o = {.max_chans = 2};
	run(&o, s);
}

/* ------------------------------------------------ keys and revokes */

/* A key the node never handed out fails at once, before anything is posted,
 * and the channel stays open for the others. */
static void uk_go(struct rfx *f)
{
	poison(f);
	rd_many(f, 8, f->dst);
	f->rd[3].rkey = f->key ^ 0x5a5a5a5au;
	go(f, 8, 10000);
}

static void uk_check(struct rfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		if (i != 3)
			rd_landed(f, i);
	cr_assert_eq(f->rd[3].res, -EFAULT, "%s", strerror(-f->rd[3].res));
	for (unsigned i = 0; i < SLOT; i++)
		cr_assert_eq(f->dst[3 * SLOT + i], POISON);
	struct tp_rdma_stats s = cli_stats(f);
	cr_assert_eq(s.wrs_posted - f->st0.wrs_posted, 7);
	cr_assert_eq(s.wc_errors, 0);
	cr_assert_eq(s.chans_torn_down, 0);
	next(f);
}

Test(transport_rdma, a_key_never_handed_out_fails_before_posting)
{
	static const step_fn s[] = {uk_go, uk_check, NULL};
	struct ropts o = {.max_chans = 1};
	run(&o, s);
}

/* A revoke: fresh rkeys behind the same key, every accepted queue pair
 * closed, reads in flight sent again on new channels and landing whole,
 * the old MR deregistered once its grace ended. */
static uint32_t rk_old[TP_RDMA_RAILS_MAX];
static uint64_t mrs0, accepted0;
static unsigned rv_n;     /* reads held when the revoke comes */
static unsigned rv_qps;   /* queue pairs accepted by then, at least */

static uint32_t rkey_now(struct rfx *f, unsigned rail)
{
	uint32_t rk = 0;
	cr_assert_eq(tp_rdma_node_rail_rkey(f->srv, rail, f->key, &rk), 0);
	return rk;
}

/* The node's listeners (one per rail) hold their WRs, or not. */
static void rv_silence(struct rfx *f, bool on)
{
	for (unsigned k = 0; k < tp_rdma_node_rails(f->srv); k++) {
		char at[64];
		snprintf(at, sizeof(at), "127.0.0.%u%s", k + 1,
			 strrchr(f->ep, ':'));
		cr_assert_eq(rsim_silence(at, on), 0);
	}
}

/* Every rail's rkey for the region, as a peer is handed it now. */
static bool rv_rkeys_new(struct rfx *f)
{
	for (unsigned k = 0; k < tp_rdma_node_rails(f->srv); k++) {
		uint32_t rk = rkey_now(f, k);
		if (rk == rk_old[k] || !rsim_rkey_live(rk))
			return false;
	}
	return true;
}

static bool rv_old_live(void)
{
	for (unsigned k = 0; k < TP_RDMA_RAILS_MAX; k++)
		if (rk_old[k] && rsim_rkey_live(rk_old[k]))
			return true;
	return false;
}

static void rv_warm(struct rfx *f)
{
	/* The region's MR, the client's channel, and the first accept. */
	local_dst(f);
	rd_many(f, 4, f->dst);
	go(f, 4, 10000);
}

/* Revoked, the client connected again, and its reads went on there: each
 * sent again once (with several rails, one may meet another old queue
 * pair of the node first and move once more) and posted. */
static bool revoked(struct rfx *f)
{
	struct tp_rdma_stats s = srv_stats(f), c = cli_stats(f);
	uint64_t again = c.retried - f->st0.retried;
	return s.revokes > 0 && s.accepted > accepted0 &&
	       (f->o.rails > 1 ? again >= rv_n : again == rv_n) &&
	       c.wrs_posted - f->st0.wrs_posted == rv_n + again;
}

/* Every read is posted, on at least rv_qps accepted queue pairs. */
static bool rv_ready(struct rfx *f)
{
	return all_posted(f) && srv_stats(f).accepted >= rv_qps;
}

static void rv_go(struct rfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_landed(f, i);
	cr_assert_geq(srv_stats(f).accepted, 1);
	memset(rk_old, 0, sizeof(rk_old));
	for (unsigned k = 0; k < tp_rdma_node_rails(f->srv); k++) {
		rk_old[k] = rkey_now(f, k);
		cr_assert(rsim_rkey_live(rk_old[k]));
	}
	mrs0 = sim_stats().mrs_live;
	/* The node holds every WR: the revoke meets all rv_n in flight. */
	rv_silence(f, true);
	poison(f);
	rd_many(f, rv_n, f->dst);
	go(f, rv_n, 10000);
	wait_for(f, rv_ready, "every read posted");
}

static void rv_revoke(struct rfx *f)
{
	accepted0 = srv_stats(f).accepted;
	tp_rdma_ops.revoke(f->srv, f->r, 7);
	/* Once per epoch: these change nothing. */
	tp_rdma_ops.revoke(f->srv, f->r, 7);
	tp_rdma_ops.revoke(f->srv, f->r, 3);
	wait_for(f, revoked, "the revoke, and the reads sent again");
}

/* The batch ends (and steps on) once the node answers again. */
static void rv_unsilence(struct rfx *f)
{
	cr_assert_eq(f->done_calls, 1, "the batch ended while held");
	rv_silence(f, false);
}


static void rv_landed(struct rfx *f)
{
	for (unsigned i = 0; i < rv_n; i++)
		rd_landed(f, i);
	struct tp_rdma_stats s = srv_stats(f), c = cli_stats(f);
	cr_assert_eq(s.revokes, 1);
	if (f->o.rails > 1)
		cr_assert_geq(c.retried - f->st0.retried, rv_n);
	else
		cr_assert_eq(c.retried - f->st0.retried, rv_n);
	cr_assert_gt(s.accepted, accepted0, "the client connected again");
	cr_assert_geq(c.chans_torn_down, 1, "the old channel closed");
	cr_assert(rv_rkeys_new(f), "an rkey did not change");
	next(f);
}

static bool old_mr_gone(struct rfx *f)
{
	(void)f;
	return !rv_old_live() && sim_stats().mrs_live == mrs0;
}

static void rv_wait_grace(struct rfx *f)
{
	wait_for(f, old_mr_gone, "the old MR's deregistration");
}

/* Reads after the grace use the new rkey (a channel still holding the old
 * one would fail with a remote access error). */
static void rv_after(struct rfx *f)
{
	poison(f);
	rd_many(f, 16, f->dst);
	go(f, 16, 10000);
}

static void rv_after_check(struct rfx *f)
{
	for (unsigned i = 0; i < 16; i++)
		rd_landed(f, i);
	cr_assert_eq(cli_stats(f).wc_errors - f->st0.wc_errors, 0);
	next(f);
}

static const step_fn rv_steps[] = {rv_warm, rv_go, rv_revoke, rv_unsilence,
				   rv_landed, rv_wait_grace, rv_after,
				   rv_after_check, NULL};

/* A revoke with n reads held on at least qps accepted queue pairs, over
 * rails rails (0: one device). */
static void rv_run(unsigned max_chans, unsigned rails, unsigned n,
		   unsigned qps)
{
	struct ropts o = {.max_chans = max_chans, .revoke_grace_ms = 300,
			  .rails = rails, .srv_secret = "alpha-secret",
			  .cli_secret = "alpha-secret"};
	rv_n = n;
	rv_qps = qps;
	run(&o, rv_steps);
}

Test(transport_rdma, revoke_rotates_rkeys_under_load)
{
	rv_run(2, 0, 64, 1);
}

/* With three rails: every rail's MR of the region is replaced, and the
 * reads held on all three are sent again. */
Test(transport_rdma_rails, a_revoke_rotates_every_rails_rkeys)
{
	rv_run(2, 3, 63, 3);
}

/* More accepted queue pairs than a revoke disconnects in one loop pass
 * (16): the rest go in the passes after, and every held read is sent
 * again. */
Test(transport_rdma, revoke_closes_many_queue_pairs_in_slices)
{
	rv_run(40, 0, 160, 40);
}

/* ---------------------------------------------------------------- rails */

static unsigned rl_n; /* reads of the striped batch */
static uint64_t rl_bytes0[TP_RDMA_RAILS_MAX];
static bool rl_kill;     /* the node's rail 1 dies after the warm-up */

static void rl_warm(struct rfx *f)
{
	/* The first accept (rail 0's) lists the node's other rails. */
	rd_set(f, 0, 0, 4096, f->dst);
	go(f, 1, 5000);
}

static void rl_go(struct rfx *f)
{
	rd_landed(f, 0);
	if (rl_kill) {
		/* The node's rail 1 listens at 127.0.0.2, rail 0's port. */
		char at[64];
		snprintf(at, sizeof(at), "127.0.0.2%s", strrchr(f->ep, ':'));
		cr_assert_eq(rsim_kill(at), 0);
	}
	struct tp_rdma_stats st = cli_stats(f);
	memcpy(rl_bytes0, st.rail_bytes, sizeof(rl_bytes0));
	rd_many(f, rl_n, f->dst);
	go(f, rl_n, 10000);
}

/* Bytes of the batch's reads that went to rail k, if operation i goes
 * on rail i % rails. */
static uint64_t rl_share(unsigned k, unsigned rails)
{
	uint64_t b = 0;
	for (unsigned i = k; i < rl_n; i += rails)
		b += len_of(i);
	return b;
}

static void rl_check(struct rfx *f)
{
	for (unsigned i = 0; i < rl_n; i++)
		rd_landed(f, i);
	struct tp_rdma_stats st = cli_stats(f);
	unsigned rails = PC_MIN(f->o.rails ? f->o.rails : 1,
				f->o.cli_rails ? f->o.cli_rails
					       : PC_MAX(f->o.rails, 1u));
	uint64_t got[TP_RDMA_RAILS_MAX], all = 0;
	for (unsigned k = 0; k < TP_RDMA_RAILS_MAX; k++) {
		got[k] = st.rail_bytes[k] - rl_bytes0[k];
		all += got[k];
	}
	cr_assert_eq(all, st.read_bytes - f->st0.read_bytes);
	if (rl_kill) {
		/* Rail 1 cannot be reached: its share went elsewhere. */
		cr_assert_eq(got[1], 0, "%llu bytes on the dead rail",
			     (unsigned long long)got[1]);
		cr_assert_gt(got[0], 0);
		cr_assert_gt(got[2], 0);
	} else {
		for (unsigned k = 0; k < rails; k++)
			cr_assert_eq(got[k], rl_share(k, rails),
				     "rail %u moved %llu bytes, not %llu", k,
				     (unsigned long long)got[k],
				     (unsigned long long)rl_share(k, rails));
		for (unsigned k = rails; k < TP_RDMA_RAILS_MAX; k++)
			cr_assert_eq(got[k], 0);
	}
	next(f);
}

static const step_fn rl_steps[] = {rl_warm, rl_go, rl_check, NULL};

/* The node's rail 1 at f's port. */
static void rl_rail1(const struct rfx *f, char *at, size_t len)
{
	snprintf(at, len, "127.0.0.2%s", strrchr(f->ep, ':'));
}

static void rl_slow_go(struct rfx *f)
{
	/* Every rail has channels now (the batch before was striped);
	 * rail 1 slows down, then dies with this batch on it. */
	char at[64];
	rl_rail1(f, at, sizeof(at));
	cr_assert_eq(rsim_set_delay(at, 20000, 30000), 0);
	struct tp_rdma_stats st = cli_stats(f);
	memcpy(rl_bytes0, st.rail_bytes, sizeof(rl_bytes0));
	rd_many(f, rl_n, f->dst);
	go(f, rl_n, 10000);
	cr_assert_eq(rsim_kill(at), 0);
}

static void rl_slow_check(struct rfx *f)
{
	/* None failed: rail 1's went on rails 0 and 2 once more. */
	for (unsigned i = 0; i < rl_n; i++)
		rd_landed(f, i);
	struct tp_rdma_stats st = cli_stats(f);
	cr_assert_eq(st.rail_bytes[1], rl_bytes0[1]);
	cr_assert_geq(st.retried - f->st0.retried, rl_n / 3);
	cr_assert_eq(st.rail_bytes[0] - rl_bytes0[0] +
			     st.rail_bytes[2] - rl_bytes0[2],
		     st.read_bytes - f->st0.read_bytes);
	next(f);
}

static const step_fn rl_die_steps[] = {rl_warm, rl_go, rl_check, rl_slow_go,
				       rl_slow_check, NULL};

/* A batch goes over every rail both nodes have, operation i on rail
 * i % n, each rail with its own rkeys. */
Test(transport_rdma_rails, a_batch_is_striped_over_the_rails)
{
	struct ropts o = {.max_chans = 4, .rails = 3, .separate = true,
			  .srv_secret = "rails", .cli_secret = "rails"};
	rl_n = 96;
	rl_kill = false;
	run(&o, rl_steps);
}

/* Nodes with different numbers of rails use the rails both have. */
Test(transport_rdma_rails, the_rails_both_nodes_have)
{
	struct ropts o = {.max_chans = 4, .rails = 3, .cli_rails = 2,
			  .separate = true};
	rl_n = 60;
	rl_kill = false;
	run(&o, rl_steps);
	o = (struct ropts){.max_chans = 4, .rails = 2, .cli_rails = 4,
			   .separate = true};
	run(&o, rl_steps);
	/* A node of one rail (an accept without a rail list). */
	o = (struct ropts){.max_chans = 4, .rails = 1, .cli_rails = 3,
			   .separate = true};
	run(&o, rl_steps);
}

/* A node listening at the wildcard address hears every rail on rail 0's
 * listener: requests come on the device they were sent to. */
Test(transport_rdma_rails, a_wildcard_listener_hears_every_rail)
{
	struct ropts o = {.max_chans = 4, .rails = 3, .separate = true,
			  .host = "0.0.0.0", .srv_secret = "rails",
			  .cli_secret = "rails"};
	rl_n = 96;
	rl_kill = false;
	run(&o, rl_steps);
}

/* A rail of the peer that cannot be reached: its operations go on the
 * other rails, none fails. */
Test(transport_rdma_rails, a_rail_that_cannot_connect)
{
	struct ropts o = {.max_chans = 4, .rails = 3, .separate = true};
	rl_n = 90;
	rl_kill = true;
	run(&o, rl_steps);
	rl_kill = false;
}

/* A rail that stops answering with reads posted on it: they are sent
 * again on the other rails, none fails (on one rail, the peer would be
 * down: every read to it fails, retry_exceeded_fails_the_peer). */
Test(transport_rdma_rails, a_rail_that_dies_mid_batch)
{
	struct ropts o = {.max_chans = 4, .rails = 3, .separate = true};
	rl_n = 60;
	rl_kill = false;
	run(&o, rl_die_steps);
}

/* Each rail's accept lists the others' addresses after the key table: a
 * node of eight IPv4 rails keeps room for 15 regions, one rail 16. */
Test(transport_rdma_rails, the_accept_holds_keys_and_rails)
{
	for (unsigned rails = 1; rails <= 8; rails += 7) {
		cr_assert_eq(rsim_reset(), 0);
		cr_assert_eq(rsim_add_rails(0, rails), 0);
		struct tp_rdma_cfg cfg = {.api = rsim_api(), .ib_port = 1,
					  .gid_index = -1,
					  .devices = rail_list(rails)};
		struct tp_node *tn = NULL;
		cr_assert_eq(tp_rdma_node_new(&cfg, &tn), 0);
		cr_assert_eq(tp_rdma_node_rails(tn), rails);
		struct rx_reactor *r = tu_reactor(NULL);
		uint16_t port;
		cr_assert_eq(tp_rdma_node_listen(tn, r, "127.0.0.1", 0, NULL,
						 &port), 0);
		static uint8_t mem[17][4096];
		uint32_t keys[17];
		unsigned n = 0;
		int ret = 0;
		while (n < 17) {
			struct tp_region g = {.base = (uintptr_t)mem[n],
					      .len = sizeof(mem[n]),
					      .access = TP_ACCESS_READ,
					      .pin = t_pin, .unpin = t_unpin};
			if ((ret = tp_rdma_ops.reg_region(tn, &g, &keys[n])))
				break;
			n++;
		}
		cr_assert_eq(ret, -ENOSPC, "%u rails, %u regions: %s", rails, n,
			     strerror(-ret));
		cr_assert_eq(n, rails == 1 ? 16u : 15u, "%u rails: %u regions",
			     rails, n);
		/* Each rail has its own rkey for a key. */
		uint32_t rk0, rk1;
		cr_assert_eq(tp_rdma_node_rail_rkey(tn, 0, keys[0], &rk0), 0);
		if (rails > 1) {
			cr_assert_eq(tp_rdma_node_rail_rkey(tn, 7, keys[0],
							    &rk1), 0);
			cr_assert_neq(rk0, rk1);
		}
		cr_assert_eq(tp_rdma_node_rail_rkey(tn, rails, keys[0], &rk1),
			     -ENOENT);
		for (unsigned i = 0; i < n; i++)
			cr_assert_eq(tp_rdma_ops.dereg_region(tn, keys[i]), 0);
		tp_rdma_node_unlisten(tn);
		tp_rdma_node_free(tn);
		rx_reactor_destroy(r);
		fabric_clean();
	}
	cr_assert_eq(rsim_reset(), 0);
}
