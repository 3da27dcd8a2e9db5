/*
 * tests/unit/test_transport.c — the transport conformance suite: the same
 * cases against every transport that is built (modules/transport.h).
 *
 * Owns: the fixtures. Each case runs on one reactor (tu_reactor) as a chain
 * of steps: a step starts operations, their done callback checks the
 * results and schedules the next step; the last one stops the reactor. The
 * kinds: "fake" (tests/fake, faults on: latency, jitter, reordering),
 * "tcp" (the real module on 127.0.0.1, a client reading from its own data
 * port), "tcp_auth" (the same with a cluster secret), "rdma" and
 * "rdma_auth" (the RDMA transport on the verbs simulation,
 * tests/fake/rdma_sim.h), "rdma_rails" (the same with a secret, each node
 * on three simulated devices: batches striped over three rails), "mixed" (the transport module as a node with an
 * RDMA device and a secret runs it: RDMA on the simulation beside TCP;
 * the black hole has no RDMA listener and is reached over TCP), "rdma_hw"
 * (on a real device when
 * PEERCACHE_RDMA_TEST_ADDR names its address; skipped with the reason
 * otherwise). A "black hole" peer
 * accepts and never answers: for TCP a listening socket that never accepts
 * (the kernel completes the handshake), for the fake a node that drops
 * everything; killing it is the peer departing.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/settings.h"
#include "common/util.h"
#include "modules/modules.h"
#include "modules/transport.h"
#include "modules/transport_wire.h"
#include "testutil.h"
#include "modules/transport_rdma.h"
#include "modules/transport_tcp.h"
#include "tests/fake/rdma_sim.h"
#include "tests/fake/transport_fake.h"

#define REG_BYTES (1u << 20)
#define OPS_MAX 64
#define SEED 0x5eed

struct tfx;
typedef void (*step_fn)(struct tfx *f);

struct tkind {
	const char *name;
	const char *secret;
	bool mixed; /* the module with RDMA (simulated) beside TCP */
	void (*setup)(struct tfx *f, unsigned max_chans);
	void (*teardown)(struct tfx *f);
	void (*kill_hole)(struct tfx *f);
};

/* A registered buffer with counters its hooks keep. */
struct treg {
	uint8_t *mem;
	uint32_t key;
	int pins, unpins, released;
	int pins_at_release;
};

struct tfx {
	const struct tkind *k;
	const struct tp_ops *ops;
	struct rx_reactor *r;
	struct tp_node *node;      /* serving node (regions) */
	struct tp_client *tc;
	char ep[160];              /* its endpoint */
	char hole[160];            /* the black hole's */
	/* tcp */
	struct pc_settings s;
	struct pc_ctx ctx;
	int hole_fd;
	/* fake */
	struct tp_node *hole_node;
	/* regions: read-only, writable, and one to deregister */
	struct treg ro, rw, tmp;
	/* what reads of the black hole name: ro, or (RDMA, whose client
	 * knows its peers' keys and fails a key it was not given at once) ro's
	 * memory registered on the hole node */
	struct treg hro;
	/* the scenario */
	const step_fn *steps;
	unsigned si;
	struct rx_timer tick;
	struct tp_read rd[OPS_MAX];
	struct tp_write wr[OPS_MAX];
	uint8_t *dst;              /* OPS_MAX x 64 KiB */
	uint8_t hdr[OPS_MAX][16];
	unsigned n;
	int done_calls;
	/* landed hooks (case "landed"): per read */
	struct tland {
		struct tfx *f;
		unsigned i;
		int calls;
		int done_calls_then; /* f->done_calls when it ran */
		bool bytes_ok;       /* every byte in place when it ran */
	} land[OPS_MAX];
	uint64_t t0;
	struct tp_peer *ph;
	int cancel_arg;
};

/* ------------------------------------------------------------- regions */

static int t_pin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	struct treg *g = ctx;
	(void)addr;
	(void)len;
	memset(pin, 0, sizeof(*pin));
	g->pins++;
	return 0;
}

static void t_unpin(void *ctx, const struct tp_pin *pin)
{
	struct treg *g = ctx;
	(void)pin;
	g->unpins++;
}

static void t_released(void *ctx)
{
	struct treg *g = ctx;
	g->released++;
	g->pins_at_release = g->pins - g->unpins;
}

static void reg_make(struct tfx *f, struct treg *g, unsigned access,
		     uint64_t seed)
{
	g->mem = malloc(REG_BYTES);
	cr_assert(g->mem);
	tu_fill_pattern(g->mem, REG_BYTES, seed, 0);
	struct tp_region reg = {.base = (uintptr_t)g->mem, .len = REG_BYTES,
				.access = access, .pin = t_pin,
				.unpin = t_unpin, .released = t_released,
				.ctx = g};
	int ret = f->ops->reg_region(f->node, &reg, &g->key);
	cr_assert_eq(ret, 0, "reg_region: %s", strerror(-ret));
	cr_assert_neq(g->key, 0);
}

/* --------------------------------------------------------------- kinds */

static void fake_setup(struct tfx *f, unsigned max_chans)
{
	static unsigned n;
	snprintf(f->ep, sizeof(f->ep), "fake-%d-%u:1", getpid(), n++);
	snprintf(f->hole, sizeof(f->hole), "fake-hole-%d-%u:1", getpid(), n++);
	cr_assert_eq(tp_fake_node_new(f->ep, &f->node), 0);
	cr_assert_eq(tp_fake_node_new(f->hole, &f->hole_node), 0);
	tp_fake_node_silence(f->hole_node);
	struct tp_fake_opts o = {.latency_us = 200, .jitter_us = 2000,
				 .reorder = true, .max_chans = max_chans,
				 .seed = SEED};
	f->ops = &tp_fake_ops;
	f->tc = tp_fake_client_new(f->r, &o);
	cr_assert(f->tc);
}

static void fake_teardown(struct tfx *f)
{
	tp_fake_client_free(f->tc);
	tp_fake_node_free(f->node);
	tp_fake_node_free(f->hole_node);
}

static void fake_kill_hole(struct tfx *f)
{
	tp_fake_node_kill(f->hole_node);
}

static void tcp_on_stop(struct rx_reactor *r, void *arg)
{
	struct tfx *f = arg;
	pc_mod_transport.stop(r, &f->ctx);
}

static void tcp_setup(struct tfx *f, unsigned max_chans)
{
	char chans[16], err[256];
	snprintf(chans, sizeof(chans), "%u", max_chans);
	char *argv[] = {"test", "--bind", "127.0.0.1", "--data-port", "0",
			"--max-channels-per-peer", chans, "--protocol",
			f->k->mixed ? "rdma" : "tcp",
			"--cluster-secret", (char *)f->k->secret, NULL};
	int argc = f->k->secret ? 11 : 9;
	char *envp[] = {NULL};
	cr_assert_eq(pc_settings_load(&f->s, argc, argv, envp, err,
				      sizeof(err)), 0, "%s", err);
	cr_assert_eq(pc_ctx_init(&f->ctx, &f->s, 1, NULL, 0), 0);
	if (f->k->mixed) {
		/* RDMA on the simulation beside TCP (transport_mixed.h): its
		 * listener takes the data port's number; the black hole has
		 * no RDMA listener, so it is reached over TCP. */
		rsim_reset();
		cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
		tp_tcp_set_verbs(rsim_api());
	}
	int ret = pc_mod_transport.init(&f->ctx);
	cr_assert_eq(ret, 0, "transport init: %s", strerror(-ret));
	ret = pc_mod_transport.start(f->r, &f->ctx);
	cr_assert_eq(ret, 0, "transport start: %s", strerror(-ret));
	cr_assert_eq(rx_reactor_on_stop(f->r, tcp_on_stop, f), 0);
	const struct svc_transport *st = svc_find_transport(&f->ctx);
	cr_assert_not_null(st);
	f->ops = st->ops;
	f->node = st->node;
	f->tc = st->clients[0];
	struct pc_endpoint eps[PC_ENDPOINTS_MAX];
	unsigned n = pc_ctx_endpoints(&f->ctx, eps, PC_ENDPOINTS_MAX);
	for (unsigned i = 0; i < n; i++)
		if (strcmp(eps[i].name, "data") == 0)
			snprintf(f->ep, sizeof(f->ep), "%s", eps[i].addr);
	cr_assert(f->ep[0]);
	/* The black hole: the kernel accepts for it, nobody answers. */
	f->hole_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	cr_assert_eq(bind(f->hole_fd, (struct sockaddr *)&sin, sl), 0);
	cr_assert_eq(listen(f->hole_fd, 64), 0);
	getsockname(f->hole_fd, (struct sockaddr *)&sin, &sl);
	snprintf(f->hole, sizeof(f->hole), "127.0.0.1:%u", ntohs(sin.sin_port));
}

static void tcp_teardown(struct tfx *f)
{
	pc_mod_transport.exit(f->r, &f->ctx);
	pc_mod_transport.fini(&f->ctx);
	if (f->k->mixed) {
		tp_tcp_set_verbs(NULL);
		char left[256];
		cr_assert_eq(rsim_leftovers(left, sizeof(left)), 0, "left: %s",
			     left);
		rsim_reset();
	}
	pc_ctx_fini(&f->ctx);
	pc_settings_free(&f->s);
	if (f->hole_fd >= 0)
		close(f->hole_fd);
}

/* The listening socket goes: the kernel resets the connections it held. */
static void tcp_kill_hole(struct tfx *f)
{
	close(f->hole_fd);
	f->hole_fd = -1;
}

/* RDMA: the transport on the verbs simulation (tests/fake/rdma_sim.h), or
 * on a real device when PEERCACHE_RDMA_TEST_ADDR names an address of one
 * (kind "rdma_hw"). The black hole is a second node that accepts queue
 * pairs and never completes a work request; killing it is the peer dying. */
static void rdma_on_stop(struct rx_reactor *r, void *arg)
{
	struct tfx *f = arg;
	(void)r;
	tp_rdma_client_stop(f->tc);
	tp_rdma_node_unlisten(f->node);
	tp_rdma_node_unlisten(f->hole_node);
}

static void rdma_node(struct tfx *f, const struct tp_rdma_cfg *cfg,
		      const char *host, struct tp_node **tn, char *ep)
{
	int ret = tp_rdma_node_new(cfg, tn);
	cr_assert_eq(ret, 0, "rdma node: %s", strerror(-ret));
	uint16_t port;
	ret = tp_rdma_node_listen(*tn, f->r, host, 0, NULL, &port);
	cr_assert_eq(ret, 0, "rdma listen: %s", strerror(-ret));
	snprintf(ep, 160, "%s:%u", host, port);
}

static void rdma_setup_on(struct tfx *f, unsigned max_chans,
			  const struct rv_api *api, const char *host)
{
	struct tp_rdma_cfg cfg = {.api = api, .ib_port = 1, .gid_index = 0,
				  .max_chans = max_chans,
				  .connect_timeout_ms = 2000,
				  .secret = f->k->secret};
	rdma_node(f, &cfg, host, &f->node, f->ep);
	rdma_node(f, &cfg, host, &f->hole_node, f->hole);
	f->ops = &tp_rdma_ops;
	int err;
	f->tc = tp_rdma_client_new(f->node, f->r, &err);
	cr_assert(f->tc, "rdma client: %s", strerror(-err));
	cr_assert_eq(rx_reactor_on_stop(f->r, rdma_on_stop, f), 0);
}

static void rdma_setup(struct tfx *f, unsigned max_chans)
{
	rsim_reset();
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
	rdma_setup_on(f, max_chans, rsim_api(), "127.0.0.1");
	cr_assert_eq(rsim_silence(f->hole, true), 0);
}

static void rdma_teardown(struct tfx *f)
{
	tp_rdma_client_free(f->tc);
	tp_rdma_node_free(f->hole_node);
	tp_rdma_node_free(f->node);
	if (strncmp(f->k->name, "rdma_hw", 7) == 0)
		return;
	/* Nothing of the fabric is left behind. */
	char left[256];
	cr_assert_eq(rsim_leftovers(left, sizeof(left)), 0, "left: %s", left);
	rsim_reset();
}

static void rdma_kill_hole(struct tfx *f)
{
	cr_assert_eq(rsim_kill(f->hole), 0);
}

/* Three rails: devices sim0..sim2 at 127.0.0.1..3; each node's rail k
 * listens at 127.0.0.(k+1) on its rail 0's port. */
#define RAILS 3

static void rail_addr(const char *ep, unsigned k, char *out, size_t len)
{
	const char *port = strrchr(ep, ':');
	snprintf(out, len, "127.0.0.%u%s", k + 1, port);
}

static void rdma_rails_setup(struct tfx *f, unsigned max_chans)
{
	rsim_reset();
	cr_assert_eq(rsim_add_rails(0, RAILS), 0);
	struct tp_rdma_cfg cfg = {.api = rsim_api(), .ib_port = 1,
				  .gid_index = 0, .max_chans = max_chans,
				  .connect_timeout_ms = 2000,
				  .devices = "sim0,sim1,sim2",
				  .secret = f->k->secret};
	rdma_node(f, &cfg, "127.0.0.1", &f->node, f->ep);
	rdma_node(f, &cfg, "127.0.0.1", &f->hole_node, f->hole);
	cr_assert_eq(tp_rdma_node_rails(f->node), RAILS);
	f->ops = &tp_rdma_ops;
	int err;
	f->tc = tp_rdma_client_new(f->node, f->r, &err);
	cr_assert(f->tc, "rdma client: %s", strerror(-err));
	cr_assert_eq(rx_reactor_on_stop(f->r, rdma_on_stop, f), 0);
	for (unsigned k = 0; k < RAILS; k++) {
		char at[40];
		rail_addr(f->hole, k, at, sizeof(at));
		cr_assert_eq(rsim_silence(at, true), 0);
	}
}

static void rdma_rails_teardown(struct tfx *f)
{
	/* Every rail carried a share of what was read and written. */
	struct tp_rdma_stats st;
	tp_rdma_node_stats(f->node, &st);
	uint64_t all = 0;
	for (unsigned k = 0; k < RAILS; k++)
		all += st.rail_bytes[k];
	cr_assert_eq(all, st.read_bytes + st.write_bytes);
	rdma_teardown(f);
}

static void rdma_rails_kill_hole(struct tfx *f)
{
	for (unsigned k = 0; k < RAILS; k++) {
		char at[40];
		rail_addr(f->hole, k, at, sizeof(at));
		cr_assert_eq(rsim_kill(at), 0);
	}
}

static void rdma_hw_setup(struct tfx *f, unsigned max_chans)
{
	const char *addr = getenv("PEERCACHE_RDMA_TEST_ADDR");
	rdma_setup_on(f, max_chans, &rv_real, addr);
}

/* A real black hole cannot be made from user space without a second
 * host: the hw kind runs the cases that need none. */
static void rdma_hw_kill_hole(struct tfx *f)
{
	(void)f;
}

static void rdma_hw_teardown(struct tfx *f)
{
	rdma_teardown(f);
}

#define KIND(n, sec, mix, pre)                                                 \
	{.name = n, .secret = sec, .mixed = mix, .setup = pre##_setup,         \
	 .teardown = pre##_teardown, .kill_hole = pre##_kill_hole}
static const struct tkind K_FAKE = KIND("fake", NULL, false, fake);
static const struct tkind K_TCP = KIND("tcp", NULL, false, tcp);
static const struct tkind K_TCP_AUTH =
	KIND("tcp_auth", "conformance-secret", false, tcp);
/* RDMA runs only with a secret (transport_select.c), so "mixed" has one. */
static const struct tkind K_MIXED =
	KIND("mixed", "conformance-secret", true, tcp);
static const struct tkind K_RDMA = KIND("rdma", NULL, false, rdma);
static const struct tkind K_RDMA_AUTH =
	KIND("rdma_auth", "conformance-secret", false, rdma);
static const struct tkind K_RDMA_HW = KIND("rdma_hw", NULL, false, rdma_hw);
static const struct tkind K_RDMA_RAILS =
	KIND("rdma_rails", "conformance-secret", false, rdma_rails);

/* ------------------------------------------------------------ scenario */

static void tick(struct rx_reactor *r, struct rx_timer *t)
{
	struct tfx *f = t->arg;
	if (!f->steps[f->si]) {
		rx_reactor_stop(r);
		return;
	}
	f->steps[f->si++](f);
}

static void next(struct tfx *f)
{
	rx_timer_start(f->r, &f->tick, 0, 0);
}

static void next_after(struct tfx *f, unsigned ms)
{
	rx_timer_start(f->r, &f->tick, RX_MS(ms), 0);
}

static void run(const struct tkind *k, unsigned max_chans,
		const step_fn *steps)
{
	struct tfx *f = calloc(1, sizeof(*f));
	cr_assert(f);
	f->k = k;
	f->hole_fd = -1;
	f->r = tu_reactor(NULL);
	f->dst = calloc(OPS_MAX, 64 * 1024);
	cr_assert(f->dst);
	k->setup(f, max_chans);
	reg_make(f, &f->ro, TP_ACCESS_READ, 1);
	reg_make(f, &f->rw, TP_ACCESS_READ | TP_ACCESS_WRITE, 2);
	f->hro = f->ro;
	if (f->ops == &tp_rdma_ops) {
		struct tp_region reg = {.base = (uintptr_t)f->ro.mem,
					.len = REG_BYTES,
					.access = TP_ACCESS_READ,
					.pin = t_pin, .unpin = t_unpin,
					.ctx = &f->hro};
		cr_assert_eq(f->ops->reg_region(f->hole_node, &reg,
						&f->hro.key), 0);
	}
	f->steps = steps;
	rx_timer_init(&f->tick, tick, f);
	next(f);
	tu_run(f->r, 20000);
	cr_assert_eq(f->ops->dereg_region(f->node, f->ro.key), 0);
	cr_assert_eq(f->ops->dereg_region(f->node, f->rw.key), 0);
	k->teardown(f);
	rx_reactor_destroy(f->r);
	/* Every pin was released, and each region exactly once. */
	cr_assert_eq(f->ro.pins, f->ro.unpins);
	cr_assert_eq(f->rw.pins, f->rw.unpins);
	cr_assert_eq(f->ro.released, 1);
	cr_assert_eq(f->rw.released, 1);
	free(f->ro.mem);
	free(f->rw.mem);
	free(f->tmp.mem);
	free(f->dst);
	free(f);
}

static uint8_t *dst_of(struct tfx *f, unsigned i)
{
	return f->dst + (size_t)i * 64 * 1024;
}

/* A read of len bytes at offset off of g into slot i (hdr_len split). */
static void rd_set(struct tfx *f, unsigned i, const char *peer,
		   const struct treg *g, uint64_t off, uint32_t len,
		   uint32_t hdr_len)
{
	struct tp_read *rd = &f->rd[i];
	memset(rd, 0, sizeof(*rd));
	snprintf(rd->peer, sizeof(rd->peer), "%s", peer);
	rd->rkey = g->key;
	rd->addr = (uintptr_t)g->mem + off;
	rd->len = len;
	rd->hdr_len = hdr_len;
	rd->hdr = hdr_len ? f->hdr[i] : NULL;
	rd->dst = dst_of(f, i);
}

/* Did rd (its header, then the rest at dst) get the region's pattern
 * (seed) at off? */
static bool rd_bytes_ok(const struct tp_read *rd, const uint8_t *dst,
			uint64_t seed, uint64_t off)
{
	return tu_check_pattern(rd->hdr ? rd->hdr : dst, rd->hdr_len, seed,
				off) == -1 &&
	       tu_check_pattern(dst, rd->len - rd->hdr_len, seed,
				off + rd->hdr_len) == -1;
}

/* The bytes of read i against the region's pattern (seed) at off. */
static void rd_check(struct tfx *f, unsigned i, uint64_t seed, uint64_t off)
{
	struct tp_read *rd = &f->rd[i];
	cr_assert_eq(rd->res, 0, "%s: read %u: %s", f->k->name, i,
		     strerror(-rd->res));
	cr_assert(rd_bytes_ok(rd, dst_of(f, i), seed, off),
		  "%s: read %u landed wrong bytes", f->k->name, i);
}

static void rdone_next(void *arg, struct tp_read *reads, unsigned n)
{
	struct tfx *f = arg;
	cr_assert_eq(reads, f->rd);
	cr_assert_eq(n, f->n);
	f->done_calls++;
	next(f);
}

static void wdone_next(void *arg, struct tp_write *w, unsigned n)
{
	struct tfx *f = arg;
	cr_assert_eq(w, f->wr);
	cr_assert_eq(n, f->n);
	f->done_calls++;
	next(f);
}

static void go_reads(struct tfx *f, unsigned n, unsigned timeout_ms)
{
	f->n = n;
	f->t0 = pc_now_ns();
	int ret = f->ops->read_batch(f->tc, f->rd, n, timeout_ms, rdone_next, f);
	cr_assert_eq(ret, 0, "read_batch: %s", strerror(-ret));
}

static uint64_t since_ms(const struct tfx *f)
{
	return (pc_now_ns() - f->t0) / 1000000u;
}

/* Offsets of the ordering case: a permutation of 4 KiB-aligned slots. */
static uint64_t perm_off(unsigned i)
{
	return (uint64_t)((i * 37u + 11u) % 200u) * 4096u + i * 8u;
}

/* ---------------------------------------------------- case: batching */

static void batch_go(struct tfx *f)
{
	for (unsigned i = 0; i < OPS_MAX; i++)
		rd_set(f, i, f->ep, &f->ro, perm_off(i), 1000 + i * 97,
		       i % 2 ? 16 : 0);
	go_reads(f, OPS_MAX, 10000);
}

static void batch_check(struct tfx *f)
{
	for (unsigned i = 0; i < OPS_MAX; i++)
		rd_check(f, i, 1, perm_off(i));
	cr_assert_eq(f->done_calls, 1);
	/* A second, larger batch on the channels the first one opened. */
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->ep, &f->ro, i * 65536u, 65536, 0);
	go_reads(f, 8, 10000);
}

static void batch_check2(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		rd_check(f, i, 1, i * 65536u);
	next(f);
}

static const step_fn batching[] = {batch_go, batch_check, batch_check2, NULL};

/* ------------------------------------------------- case: landed hooks */

#define L_N 16

/* Read i's bytes, seen from its landed hook: rd may be a transport's
 * copy, so it is checked through what it names. */
static void t_landed(void *arg, const struct tp_read *rd)
{
	struct tland *l = arg;
	l->calls++;
	l->done_calls_then = l->f->done_calls;
	l->bytes_ok = rd->res == 0 && rd->got == rd->len &&
		      rd->dst == dst_of(l->f, l->i) &&
		      rd_bytes_ok(rd, rd->dst, 1, perm_off(l->i));
}

/* Even reads are fine, odd ones name a wrong key: each fine read's hook
 * runs once, before done, with its bytes in place; a failed read's never. */
static void landed_go(struct tfx *f)
{
	for (unsigned i = 0; i < L_N; i++) {
		rd_set(f, i, f->ep, &f->ro, perm_off(i), 3000 + i * 1000,
		       i % 4 == 0 ? 16 : 0);
		if (i % 2)
			f->rd[i].rkey ^= 0x5a5a5a5a;
		f->land[i] = (struct tland){.f = f, .i = i};
		f->rd[i].landed = t_landed;
		f->rd[i].landed_arg = &f->land[i];
	}
	go_reads(f, L_N, 10000);
}

static void landed_expect(struct tfx *f, int calls)
{
	for (unsigned i = 0; i < L_N; i++) {
		const struct tland *l = &f->land[i];
		if (i % 2) {
			cr_assert_neq(f->rd[i].res, 0);
			cr_assert_eq(l->calls, 0, "%s: read %u failed (%s), yet "
				     "its landed hook ran", f->k->name, i,
				     strerror(-f->rd[i].res));
			continue;
		}
		rd_check(f, i, 1, perm_off(i));
		cr_assert_eq(l->calls, calls, "%s: read %u: landed ran %d "
			     "times, expected %d", f->k->name, i, l->calls,
			     calls);
		cr_assert_eq(l->done_calls_then, f->done_calls - 1,
			     "%s: read %u: landed ran after done", f->k->name,
			     i);
		cr_assert(l->bytes_ok, "%s: read %u: landed ran before its "
			  "bytes were in place", f->k->name, i);
		cr_assert(f->rd[i].landed_ran);
	}
}

static void landed_check(struct tfx *f)
{
	landed_expect(f, 1);
	/* The same reads again, as they are (landed_ran set): a batch runs
	 * each hook afresh. */
	for (unsigned i = 0; i < L_N; i++)
		memset(dst_of(f, i), 0, f->rd[i].len - f->rd[i].hdr_len);
	go_reads(f, L_N, 10000);
}

static void landed_check2(struct tfx *f)
{
	landed_expect(f, 2);
	next(f);
}

static const step_fn landed[] = {landed_go, landed_check, landed_check2,
				 NULL};

/* ------------------------------------------------- case: bounds, keys */

static void bounds_go(struct tfx *f)
{
	rd_set(f, 0, f->ep, &f->ro, 0, 4096, 0);              /* fine */
	rd_set(f, 1, f->ep, &f->ro, 0, 4096, 0);
	f->rd[1].rkey ^= 0x5a5a5a5a;                          /* wrong key */
	rd_set(f, 2, f->ep, &f->ro, 0, 4096, 0);
	f->rd[2].addr -= 4096;                                /* before */
	rd_set(f, 3, f->ep, &f->ro, REG_BYTES - 100, 200, 0); /* across end */
	rd_set(f, 4, f->ep, &f->ro, REG_BYTES, 1, 0);         /* past end */
	rd_set(f, 5, f->ep, &f->ro, 0, 0, 0);                 /* empty */
	rd_set(f, 6, f->ep, &f->rw, 0, 4096, 0);              /* other key */
	rd_set(f, 7, f->ep, &f->ro, REG_BYTES - 4096, 4096, 0); /* last */
	f->rd[8] = f->rd[0];
	f->rd[8].addr = UINT64_MAX - 10;                      /* overflow */
	go_reads(f, 9, 10000);
}

static void bounds_check(struct tfx *f)
{
	rd_check(f, 0, 1, 0);
	cr_assert_eq(f->rd[1].res, -EFAULT, "%s", strerror(-f->rd[1].res));
	cr_assert_eq(f->rd[2].res, -EFAULT);
	cr_assert_eq(f->rd[3].res, -EFAULT);
	cr_assert_eq(f->rd[4].res, -EFAULT);
	cr_assert_eq(f->rd[5].res, -EINVAL);
	rd_check(f, 6, 2, 0);
	rd_check(f, 7, 1, REG_BYTES - 4096);
	cr_assert_eq(f->rd[8].res, -EFAULT);
	/* Writes need a writable region. */
	memset(f->wr, 0, sizeof(f->wr));
	for (unsigned i = 0; i < 2; i++) {
		struct tp_write *w = &f->wr[i];
		snprintf(w->peer, sizeof(w->peer), "%s", f->ep);
		w->rkey = f->ro.key;
		w->addr = (uintptr_t)f->ro.mem;
		w->len = 512;
		w->src = dst_of(f, 0);
	}
	f->wr[1].addr = (uintptr_t)f->ro.mem + REG_BYTES; /* and in bounds */
	f->n = 2;
	cr_assert_eq(f->ops->write_batch(f->tc, f->wr, 2, 10000, wdone_next, f),
		     0);
}

static void bounds_check2(struct tfx *f)
{
	/* One-sided hardware cannot tell a region without the access from a
	 * wrong key: both are a remote access error (transport.h). */
	if (!strncmp(f->k->name, "rdma", 4) || f->k->mixed)
		cr_assert_eq(f->wr[0].res, -EFAULT, "%s",
			     strerror(-f->wr[0].res));
	else
		cr_assert_eq(f->wr[0].res, -EACCES, "%s",
			     strerror(-f->wr[0].res));
	cr_assert_eq(f->wr[1].res, -EFAULT);
	cr_assert_eq(tu_check_pattern(f->ro.mem, REG_BYTES, 1, 0), -1,
		     "a refused write changed the region");
	/* The refused payloads were skipped: the channels still answer. */
	for (unsigned i = 0; i < 4; i++)
		rd_set(f, i, f->ep, &f->ro, 8192 + i * 512u, 512, 0);
	go_reads(f, 4, 10000);
}

static void bounds_check3(struct tfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		rd_check(f, i, 1, 8192 + i * 512u);
	next(f);
}

static const step_fn bounds[] = {bounds_go, bounds_check, bounds_check2,
				 bounds_check3, NULL};

/* ----------------------------------------------------------- case: writes */

#define W_N 16
#define W_LEN 5000

static void writes_go(struct tfx *f)
{
	memset(f->wr, 0, sizeof(f->wr));
	for (unsigned i = 0; i < W_N; i++) {
		struct tp_write *w = &f->wr[i];
		snprintf(w->peer, sizeof(w->peer), "%s", f->ep);
		w->rkey = f->rw.key;
		w->addr = (uintptr_t)f->rw.mem + i * 8192u;
		w->len = W_LEN;
		/* The bytes of seed 9 at the same offsets: header from
		 * hdr[i], the rest from dst. */
		w->hdr_len = i % 2 ? 16 : 0;
		tu_fill_pattern(f->hdr[i], 16, 9, i * 8192u);
		tu_fill_pattern(dst_of(f, i), W_LEN - w->hdr_len, 9,
				i * 8192u + w->hdr_len);
		w->hdr = w->hdr_len ? f->hdr[i] : NULL;
		w->src = dst_of(f, i);
	}
	f->n = W_N;
	cr_assert_eq(f->ops->write_batch(f->tc, f->wr, W_N, 10000, wdone_next,
					 f), 0);
}

static void writes_landed(struct tfx *f)
{
	for (unsigned i = 0; i < W_N; i++) {
		cr_assert_eq(f->wr[i].res, 0, "%s: write %u: %s", f->k->name,
			     i, strerror(-f->wr[i].res));
		cr_assert_eq(tu_check_pattern(f->rw.mem + i * 8192u, W_LEN, 9,
					      i * 8192u), -1);
		/* What lies between stayed as it was. */
		cr_assert_eq(tu_check_pattern(f->rw.mem + i * 8192u + W_LEN,
					      8192 - W_LEN, 2,
					      i * 8192u + W_LEN), -1);
	}
	memset(f->dst, 0, (size_t)OPS_MAX * 64 * 1024);
	for (unsigned i = 0; i < W_N; i++)
		rd_set(f, i, f->ep, &f->rw, i * 8192u, W_LEN, 0);
	go_reads(f, W_N, 10000);
}

#define BIG_OFF (512u * 1024)
#define BIG_LEN (512u * 1024)

static void writes_read_back(struct tfx *f)
{
	for (unsigned i = 0; i < W_N; i++)
		rd_check(f, i, 9, i * 8192u);
	/* One large write: its payload arrives over many receives. */
	uint8_t *src = dst_of(f, 0);
	tu_fill_pattern(src, BIG_LEN, 11, BIG_OFF);
	memset(f->wr, 0, sizeof(f->wr));
	snprintf(f->wr[0].peer, sizeof(f->wr[0].peer), "%s", f->ep);
	f->wr[0].rkey = f->rw.key;
	f->wr[0].addr = (uintptr_t)f->rw.mem + BIG_OFF;
	f->wr[0].len = BIG_LEN;
	f->wr[0].src = src;
	f->n = 1;
	cr_assert_eq(f->ops->write_batch(f->tc, f->wr, 1, 10000, wdone_next,
					 f), 0);
}

static void writes_big_landed(struct tfx *f)
{
	cr_assert_eq(f->wr[0].res, 0, "%s: %s", f->k->name,
		     strerror(-f->wr[0].res));
	cr_assert_eq(tu_check_pattern(f->rw.mem + BIG_OFF, BIG_LEN, 11,
				      BIG_OFF), -1);
	next(f);
}

static const step_fn writes[] = {writes_go, writes_landed, writes_read_back,
				 writes_big_landed, NULL};

/* --------------------------------------------------------- case: timeout */

static void timeout_go(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->hole, &f->hro, 0, 4096, 0);
	go_reads(f, 8, 300);
}

static void timeout_check(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(f->rd[i].res, -ETIMEDOUT, "%s: %s", f->k->name,
			     strerror(-f->rd[i].res));
	cr_assert_geq(since_ms(f), 250);
	cr_assert_eq(f->done_calls, 1);
	/* The real peer still answers in the same client. */
	rd_set(f, 0, f->ep, &f->ro, 4096, 4096, 0);
	go_reads(f, 1, 10000);
}

static void check_one(struct tfx *f)
{
	rd_check(f, 0, 1, 4096);
	next(f);
}

static const step_fn timeouts[] = {timeout_go, timeout_check, check_one,
				   NULL};

/* ------------------------------------------------------ case: peer loss */

static void loss_go(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->hole, &f->hro, 0, 4096, 0);
	rd_set(f, 8, f->ep, &f->ro, 8192, 4096, 0); /* a live one too */
	go_reads(f, 9, 15000);
	/* The peer departs mid-batch. */
	f->k->kill_hole(f);
}

static void loss_check(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++) {
		cr_assert_lt(f->rd[i].res, 0);
		cr_assert_neq(f->rd[i].res, -ETIMEDOUT, "%s: waited for the "
			      "timeout instead of failing", f->k->name);
	}
	rd_check(f, 8, 1, 8192);
	/* Long before the 15 s timeout (generous: ASan, slow machines). */
	cr_assert_lt(since_ms(f), 10000);
	next(f);
}

static const step_fn peer_loss[] = {loss_go, loss_check, NULL};

/* peer_close of a handle: its operations end with the error given. */
static void close_go(struct tfx *f)
{
	cr_assert_eq(f->ops->peer_open(f->tc, f->hole, "hole-node", &f->ph), 0);
	for (unsigned i = 0; i < 8; i++) {
		rd_set(f, i, "", &f->hro, 0, 4096, 0);
		f->rd[i].ph = f->ph;
	}
	go_reads(f, 8, 15000);
	struct tp_peer_info info;
	f->ops->peer_health(f->tc, f->ph, &info);
	cr_assert_eq(info.inflight, 8);
	cr_assert_eq(info.refs, 1);
	next_after(f, 50);
}

static void close_now(struct tfx *f)
{
	cr_assert_eq(f->done_calls, 0);
	f->ops->peer_close(f->tc, f->ph, -EHOSTDOWN);
	/* done runs from the reactor, never inside peer_close */
	cr_assert_eq(f->done_calls, 0);
}

static void close_check(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(f->rd[i].res, -EHOSTDOWN, "%s: %s", f->k->name,
			     strerror(-f->rd[i].res));
	cr_assert_lt(since_ms(f), 10000);
	/* fail_node on a live peer by ring id: the same, by node name. */
	for (unsigned i = 0; i < 4; i++) {
		rd_set(f, i, f->hole, &f->hro, 0, 4096, 0);
		f->rd[i].node = "hole-node";
	}
	go_reads(f, 4, 15000);
	f->ops->fail_node(f->tc, "hole-node", -ECONNABORTED);
}

static void fail_node_check(struct tfx *f)
{
	for (unsigned i = 0; i < 4; i++)
		cr_assert_eq(f->rd[i].res, -ECONNABORTED, "%s: %s",
			     f->k->name, strerror(-f->rd[i].res));
	next(f);
}

static const step_fn peer_close[] = {close_go, close_now, close_check,
				     fail_node_check, NULL};

/* ---------------------------------- case: deregistration during reads */

static void dereg_go(struct tfx *f)
{
	reg_make(f, &f->tmp, TP_ACCESS_READ, 3);
	for (unsigned i = 0; i < 32; i++)
		rd_set(f, i, f->ep, &f->tmp, i * 32768u, 32768, 0);
	go_reads(f, 32, 10000);
	/* Withdrawn while every read is in flight. */
	cr_assert_eq(f->ops->dereg_region(f->node, f->tmp.key), 0);
	cr_assert_eq(f->ops->dereg_region(f->node, f->tmp.key), -ENOENT);
}

static void dereg_check(struct tfx *f)
{
	unsigned ok = 0;
	for (unsigned i = 0; i < 32; i++) {
		if (f->rd[i].res == 0) {
			rd_check(f, i, 3, i * 32768u);
			ok++;
		} else {
			cr_assert_eq(f->rd[i].res, -EFAULT, "%s: %s",
				     f->k->name, strerror(-f->rd[i].res));
		}
	}
	cr_log_info("%s: %u of 32 reads were served before the "
		    "deregistration", f->k->name, ok);
	/* Released exactly once, and only with no pin left. */
	cr_assert_eq(f->tmp.released, 1);
	cr_assert_eq(f->tmp.pins_at_release, 0);
	cr_assert_eq(f->tmp.pins, f->tmp.unpins);
	/* The key names nothing now. */
	rd_set(f, 0, f->ep, &f->tmp, 0, 4096, 0);
	go_reads(f, 1, 10000);
}

static void dereg_after(struct tfx *f)
{
	cr_assert_eq(f->rd[0].res, -EFAULT);
	next(f);
}

static const step_fn dereg[] = {dereg_go, dereg_check, dereg_after, NULL};

/* -------------------------------------------------- case: selected reads */

/* The selector's first byte tells the test region's select hook what to
 * answer; the hook counts its calls. */
enum {
	SEL_TWO = 1, SEL_NONE, SEL_WHOLE, SEL_FAIL, SEL_OUTSIDE, SEL_SHORT,
	SEL_OVER
};
static int sel_calls;

static int t_select(void *ctx, uintptr_t addr, uint64_t len,
		    const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pc,
		    unsigned *n)
{
	(void)ctx;
	sel_calls++;
	switch (sel[0]) {
	case SEL_TWO: /* 50 bytes at 100, then 8 at 1000 */
		pc[0] = (struct tp_piece){addr + 100, 50};
		pc[1] = (struct tp_piece){addr + 1000, 8};
		*n = 2;
		return 1;
	case SEL_NONE:
		*n = 0;
		return 1;
	case SEL_FAIL:
		return -EIO;
	case SEL_OUTSIDE: /* one byte past the range: never sent */
		pc[0] = (struct tp_piece){addr + len - 4, 5};
		*n = 1;
		return 1;
	case SEL_SHORT: /* 8 bytes, fewer than the read's hdr_len */
		pc[0] = (struct tp_piece){addr + 64, 8};
		*n = 1;
		return 1;
	case SEL_OVER: /* each piece inside, together more than the range */
		pc[0] = (struct tp_piece){addr, 3000};
		pc[1] = (struct tp_piece){addr + 1000, 3000};
		*n = 2;
		return 1;
	default: /* SEL_WHOLE */
		return 0;
	}
}

static void sel_set(struct tfx *f, unsigned i, uint8_t mode, uint32_t hdr_len)
{
	rd_set(f, i, f->ep, &f->tmp, 4096, 4096, hdr_len);
	f->rd[i].select = mode != 0;
	f->rd[i].sel[0] = mode;
}

static void sel_go(struct tfx *f)
{
	f->tmp.mem = malloc(REG_BYTES);
	cr_assert(f->tmp.mem);
	tu_fill_pattern(f->tmp.mem, REG_BYTES, 4, 0);
	struct tp_region reg = {.base = (uintptr_t)f->tmp.mem,
				.len = REG_BYTES, .pin = t_pin,
				.unpin = t_unpin, .released = t_released,
				.select = t_select, .ctx = &f->tmp};
	cr_assert_eq(f->ops->reg_region(f->node, &reg, &f->tmp.key), 0);
	sel_calls = 0;
	sel_set(f, 0, SEL_TWO, 0);
	sel_set(f, 1, SEL_NONE, 0);
	sel_set(f, 2, SEL_WHOLE, 0);
	sel_set(f, 3, SEL_FAIL, 0);
	sel_set(f, 4, SEL_OUTSIDE, 0);
	sel_set(f, 5, SEL_TWO, 16); /* split: 16 to hdr, 42 to dst */
	sel_set(f, 6, SEL_SHORT, 16);
	sel_set(f, 7, 0, 0);        /* a plain read: the hook is not asked */
	sel_set(f, 8, SEL_TWO, 0);  /* after all that, still in step */
	sel_set(f, 9, SEL_OVER, 0);
	go_reads(f, 10, 10000);
}

static void sel_check(struct tfx *f)
{
	struct tp_read *rd = f->rd;
	if (!strcmp(f->k->name, "fake") || !strncmp(f->k->name, "rdma", 4) ||
	    f->k->mixed) {
		/* One-sided: the hook is never asked, every read (even
		 * those the hook would fail) brings the whole range. */
		cr_assert_eq(sel_calls, 0);
		for (unsigned i = 0; i < 10; i++) {
			rd_check(f, i, 4, 4096);
			cr_assert_eq(rd[i].got, 4096);
			cr_assert(!rd[i].narrowed);
		}
	} else {
		cr_assert_eq(sel_calls, 9, "%d", sel_calls);
		uint8_t *d = dst_of(f, 0);
		cr_assert_eq(rd[0].res, 0, "%s", strerror(-rd[0].res));
		cr_assert(rd[0].narrowed);
		cr_assert_eq(rd[0].got, 58);
		cr_assert_eq(tu_check_pattern(d, 50, 4, 4096 + 100), -1);
		cr_assert_eq(tu_check_pattern(d + 50, 8, 4, 4096 + 1000), -1);
		cr_assert_eq(rd[1].res, 0);
		cr_assert(rd[1].narrowed);
		cr_assert_eq(rd[1].got, 0);
		rd_check(f, 2, 4, 4096);
		cr_assert(!rd[2].narrowed);
		cr_assert_eq(rd[2].got, 4096);
		cr_assert_eq(rd[3].res, -EIO, "%s", strerror(-rd[3].res));
		cr_assert_eq(rd[4].res, -EINVAL, "%s", strerror(-rd[4].res));
		cr_assert_eq(rd[5].res, 0);
		cr_assert(rd[5].narrowed && rd[5].got == 58);
		cr_assert_eq(tu_check_pattern(f->hdr[5], 16, 4, 4096 + 100),
			     -1);
		cr_assert_eq(tu_check_pattern(dst_of(f, 5), 34, 4,
					      4096 + 116), -1);
		cr_assert_eq(tu_check_pattern(dst_of(f, 5) + 34, 8, 4,
					      4096 + 1000), -1);
		cr_assert_eq(rd[6].res, 0);
		cr_assert(rd[6].narrowed && rd[6].got == 8);
		cr_assert_eq(tu_check_pattern(f->hdr[6], 8, 4, 4096 + 64), -1);
		rd_check(f, 7, 4, 4096);
		cr_assert(!rd[7].narrowed && rd[7].got == 4096);
		cr_assert(rd[8].narrowed && rd[8].got == 58);
		cr_assert_eq(tu_check_pattern(dst_of(f, 8), 50, 4, 4096 + 100),
			     -1);
		/* a selection larger than the range is refused by the node,
		 * not sent for the reader to drop with its channel */
		cr_assert_eq(rd[9].res, -EINVAL, "%s", strerror(-rd[9].res));
	}
	cr_assert_eq(f->ops->dereg_region(f->node, f->tmp.key), 0);
	next(f);
}

static void sel_after(struct tfx *f)
{
	cr_assert_eq(f->tmp.released, 1);
	cr_assert_eq(f->tmp.pins, f->tmp.unpins);
	next(f);
}

static const step_fn selected[] = {sel_go, sel_check, sel_after, NULL};

/* ----------------------------------------------------- case: cancellation */

/* Cancelled batches carry &f->cancel_arg, so that cancel names them only. */
static void cancel_done(void *arg, struct tp_read *reads, unsigned n)
{
	struct tfx *f = (struct tfx *)((char *)arg -
				       offsetof(struct tfx, cancel_arg));
	(void)reads;
	(void)n;
	f->done_calls++;
	next(f);
}

static void cancel_go(struct tfx *f)
{
	/* Reads that would never finish. */
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->hole, &f->hro, 0, 4096, 0);
	f->n = 8;
	f->t0 = pc_now_ns();
	cr_assert_eq(f->ops->read_batch(f->tc, f->rd, 8, 15000, cancel_done,
					&f->cancel_arg), 0);
	next_after(f, 50);
}

static void cancel_now(struct tfx *f)
{
	cr_assert_eq(f->ops->cancel(f->tc, &f->cancel_arg), 1);
	cr_assert_eq(f->done_calls, 0, "done ran inside cancel");
	cr_assert_eq(f->ops->cancel(f->tc, &f->cancel_arg), 0);
}

static void cancel_check(struct tfx *f)
{
	cr_assert_eq(f->done_calls, 1);
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(f->rd[i].res, -ECANCELED, "%s: %s", f->k->name,
			     strerror(-f->rd[i].res));
	cr_assert_lt(since_ms(f), 10000);
	/* Warm the channels to the live peer... */
	rd_set(f, 0, f->ep, &f->ro, 0, 4096, 0);
	go_reads(f, 1, 10000);
}

static void cancel_sent(struct tfx *f)
{
	rd_check(f, 0, 1, 0);
	/* ...then cancel large reads right after they were sent: their
	 * answers must be dropped, never land, and not confuse the channel. */
	for (unsigned i = 0; i < 16; i++)
		rd_set(f, i, f->ep, &f->ro, i * 65536u, 65536, 0);
	memset(f->dst, 0xee, (size_t)16 * 65536);
	f->n = 16;
	cr_assert_eq(f->ops->read_batch(f->tc, f->rd, 16, 10000, cancel_done,
					&f->cancel_arg), 0);
	cr_assert_eq(f->ops->cancel(f->tc, &f->cancel_arg), 1);
}

static void cancel_sent_check(struct tfx *f)
{
	cr_assert_eq(f->done_calls, 3); /* with the warm-up batch */
	for (unsigned i = 0; i < 16; i++)
		cr_assert(f->rd[i].res == -ECANCELED || f->rd[i].res == 0,
			  "%s: %s", f->k->name, strerror(-f->rd[i].res));
	/* Nothing lands after done: poison and look again later. */
	memset(f->dst, 0xee, (size_t)16 * 65536);
	next_after(f, 100);
}

static void cancel_followup(struct tfx *f)
{
	for (size_t i = 0; i < (size_t)16 * 65536; i++)
		cr_assert_eq(f->dst[i], 0xee, "a cancelled read landed late");
	for (unsigned i = 0; i < 16; i++)
		rd_set(f, i, f->ep, &f->ro, 4096 + i * 65536u, 60000, 16);
	go_reads(f, 16, 10000);
}

static void cancel_followup_check(struct tfx *f)
{
	for (unsigned i = 0; i < 16; i++)
		rd_check(f, i, 1, 4096 + i * 65536u);
	next(f);
}

static const step_fn cancel[] = {cancel_go, cancel_now, cancel_check,
				  cancel_sent, cancel_sent_check,
				  cancel_followup, cancel_followup_check, NULL};

/* ------------------------------------------------------- case: channel cap */

#define CAP 3

static void cap_go(struct tfx *f)
{
	for (unsigned i = 0; i < 48; i++)
		rd_set(f, i, f->ep, &f->ro, i * 16384u, 16384, 0);
	go_reads(f, 48, 10000);
	cr_assert_eq(f->ops->peer_open(f->tc, f->ep, NULL, &f->ph), 0);
	struct tp_peer_info info;
	f->ops->peer_health(f->tc, f->ph, &info);
	cr_assert_eq(info.channels, CAP, "%s: %u channels, cap %u",
		     f->k->name, info.channels, CAP);
	cr_assert_eq(info.inflight, 48);
}

static void cap_check(struct tfx *f)
{
	for (unsigned i = 0; i < 48; i++)
		rd_check(f, i, 1, i * 16384u);
	struct tp_peer_info info;
	cr_assert_eq(f->ops->peer_health(f->tc, f->ph, &info), TP_PEER_UP);
	cr_assert_leq(info.channels, CAP);
	cr_assert_eq(info.inflight, 0);
	f->ops->peer_close(f->tc, f->ph, 0);
	next(f);
}

static const step_fn chan_cap[] = {cap_go, cap_check, NULL};

/* ------------------------------------------ the fake's faults (fake only) */

static void fault_set(struct tfx *f, struct tp_fake_opts o)
{
	o.seed = SEED;
	tp_fake_client_set(f->tc, &o);
}

static void faults_errors(struct tfx *f)
{
	fault_set(f, (struct tp_fake_opts){.error_pct = 100,
					   .error_errno = -EREMOTEIO});
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->ep, &f->ro, i * 4096u, 4096, 0);
	go_reads(f, 8, 10000);
}

static void faults_partial(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++)
		cr_assert_eq(f->rd[i].res, -EREMOTEIO);
	fault_set(f, (struct tp_fake_opts){.partial_pct = 100});
	memset(f->dst, 0, 8 * 4096);
	for (unsigned i = 0; i < 8; i++)
		rd_set(f, i, f->ep, &f->ro, i * 4096u, 4096, 0);
	go_reads(f, 8, 10000);
}

static void faults_drops(struct tfx *f)
{
	for (unsigned i = 0; i < 8; i++) {
		cr_assert_eq(f->rd[i].res, -EIO);
		/* Half arrived, the rest never did. */
		cr_assert_eq(tu_check_pattern(dst_of(f, i), 2048, 1,
					      i * 4096u), -1);
		cr_assert_eq(dst_of(f, i)[2048], 0);
	}
	fault_set(f, (struct tp_fake_opts){.drop_pct = 50, .latency_us = 100});
	for (unsigned i = 0; i < 32; i++)
		rd_set(f, i, f->ep, &f->ro, i * 4096u, 4096, 0);
	go_reads(f, 32, 300);
}

static void faults_check(struct tfx *f)
{
	unsigned ok = 0, lost = 0;
	for (unsigned i = 0; i < 32; i++) {
		if (f->rd[i].res == 0) {
			rd_check(f, i, 1, i * 4096u);
			ok++;
		} else {
			cr_assert_eq(f->rd[i].res, -ETIMEDOUT);
			lost++;
		}
	}
	cr_assert(ok > 0 && lost > 0, "%u served, %u dropped", ok, lost);
	/* In order on one channel without reorder: latency adds up. */
	fault_set(f, (struct tp_fake_opts){.latency_us = 20000,
					   .max_chans = 1});
	for (unsigned i = 0; i < 5; i++)
		rd_set(f, i, f->ep, &f->ro, i * 4096u, 4096, 0);
	go_reads(f, 5, 10000);
}

static void faults_latency(struct tfx *f)
{
	for (unsigned i = 0; i < 5; i++)
		rd_check(f, i, 1, i * 4096u);
	cr_assert_geq(since_ms(f), 90, "5 x 20 ms on one channel took %llu ms",
		      (unsigned long long)since_ms(f));
	next(f);
}

static const step_fn faults[] = {faults_errors, faults_partial, faults_drops,
				 faults_check, faults_latency, NULL};

Test(transport_fake, injected_errors_partial_reads_drops_and_latency)
{
	run(&K_FAKE, 16, faults);
}

/* ------------------------------- the TCP data port, byte by byte (tcp only) */

struct raw {
	struct tfx *f;
	pthread_t th;
	int write_status;   /* the answer to the WRITE, or 1: none */
	bool closed;        /* the node closed the connection after it */
};

static uint16_t port_of(const char *ep)
{
	return (uint16_t)atoi(strrchr(ep, ':') + 1);
}

static void raw_back(struct rx_reactor *r, void *arg)
{
	(void)r;
	next(arg);
}

/* A peer that sends a WRITE as its first request: with a secret it is not
 * authenticated (-EACCES, closed); without one, a WRITE of 0 bytes is a
 * protocol error (closed without an answer). */
static void *raw_main(void *arg)
{
	struct raw *w = arg;
	struct tfx *f = w->f;
	int fd = tu_connect(port_of(f->ep));
	uint8_t msg[32 + 16];
	struct tp_req q = {TP_OP_WRITE, 0, f->rw.key, f->k->secret ? 16 : 0,
			   (uintptr_t)f->rw.mem, 7};
	tp_wire_req_encode(&q, msg);
	memset(msg + 32, 0xab, 16);
	size_t len = f->k->secret ? sizeof(msg) : 32;
	w->write_status = 1;
	if (send(fd, msg, len, MSG_NOSIGNAL) == (ssize_t)len) {
		uint8_t resp[TP_RESP_BYTES];
		struct tp_resp r;
		if (recv(fd, resp, sizeof(resp), MSG_WAITALL) == sizeof(resp) &&
		    tp_wire_resp_decode(resp, &r) == 0 && r.id == 7)
			w->write_status = r.status;
		char c;
		w->closed = recv(fd, &c, 1, 0) <= 0;
	}
	close(fd);
	rx_post(f->r, raw_back, f);
	return NULL;
}

static struct raw raw_state;

static void raw_go(struct tfx *f)
{
	raw_state = (struct raw){.f = f};
	cr_assert_eq(pthread_create(&raw_state.th, NULL, raw_main, &raw_state),
		     0);
}

static void raw_check(struct tfx *f)
{
	pthread_join(raw_state.th, NULL);
	if (f->k->secret)
		cr_assert_eq(raw_state.write_status, -EACCES, "%d",
			     raw_state.write_status);
	else
		cr_assert_eq(raw_state.write_status, 1, "answered a WRITE of "
			     "0 bytes");
	cr_assert(raw_state.closed, "the connection stayed open");
	cr_assert_eq(tu_check_pattern(f->rw.mem, REG_BYTES, 2, 0), -1,
		     "the refused write changed the region");
	next(f);
}

static const step_fn raw_write[] = {raw_go, raw_check, NULL};

Test(transport_tcp_auth, a_write_before_authentication_is_refused_and_closed)
{
	run(&K_TCP_AUTH, 16, raw_write);
}

Test(transport_tcp, a_write_of_zero_bytes_closes_the_connection)
{
	run(&K_TCP, 16, raw_write);
}

/* ------------------------------------------------------------- the matrix */

/* The real-device kind runs when PEERCACHE_RDMA_TEST_ADDR names an address
 * of an RDMA device of this host (docs/rdma.md); cases that need a black
 * hole (hole) need a second host and stay skipped. */
static void rdma_hw_run(unsigned chans, const step_fn *steps, bool hole)
{
	char why[200];
	struct tp_rdma_cfg cfg = {.api = &rv_real, .ib_port = 1,
				  .gid_index = 0};
	int n = tp_rdma_probe(&cfg, why, sizeof(why));
	const char *addr = getenv("PEERCACHE_RDMA_TEST_ADDR");
	if (n == 0)
		cr_skip_test("rdma_hw: no usable RDMA device here (%s)", why);
	if (!addr || !*addr)
		cr_skip_test("rdma_hw: %s; set PEERCACHE_RDMA_TEST_ADDR to its "
			     "IP address to run this case on it", why);
	if (hole)
		cr_skip_test("rdma_hw: this case needs an unresponsive peer");
	run(&K_RDMA_HW, chans, steps);
}

#define CASE_(name, steps, chans, hole)                                       \
	Test(transport_fake, name) { run(&K_FAKE, chans, steps); }            \
	Test(transport_tcp, name) { run(&K_TCP, chans, steps); }              \
	Test(transport_tcp_auth, name) { run(&K_TCP_AUTH, chans, steps); }    \
	Test(transport_rdma, name) { run(&K_RDMA, chans, steps); }            \
	Test(transport_rdma_auth, name) { run(&K_RDMA_AUTH, chans, steps); }  \
	Test(transport_rdma_rails, name) { run(&K_RDMA_RAILS, chans, steps); }\
	Test(transport_mixed, name) { run(&K_MIXED, chans, steps); }          \
	Test(transport_rdma_hw, name) { rdma_hw_run(chans, steps, hole); }
#define CASE(name, steps, chans) CASE_(name, steps, chans, false)
#define CASE_HOLE(name, steps, chans) CASE_(name, steps, chans, true)

CASE(batching_and_ordering, batching, 16)
CASE(bounds_and_key_checks, bounds, 16)
CASE(landed_hooks_run_once_before_done, landed, 16)
CASE(writes_land_and_read_back, writes, 16)
CASE_HOLE(timeouts, timeouts, 16)
CASE_HOLE(peer_loss_mid_batch, peer_loss, 16)
CASE_HOLE(peer_close_and_fail_node, peer_close, 16)
CASE(deregistration_while_reads_are_in_flight, dereg, 16)
CASE(selected_reads_narrowed_or_whole, selected, 16)
CASE_HOLE(cancellation, cancel, 16)
CASE(channel_cap, chan_cap, CAP)
