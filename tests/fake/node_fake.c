/*
 * tests/fake/node_fake.c — one node's module stack in a test process with
 * the fake transport, and fake members (node_fake.h).
 *
 * Owns: the node (nf), the fake transport module's state (its fake node and
 * per-reactor clients), the wait for nf_done and the tests' seed. Threading: the module runs
 * its lifecycle like any module (init/fini main, start/exit per reactor);
 * the wait is a mutex and a condition variable. Failures here abort the
 * test process (Criterion reports the crash): these are set-up errors.
 */
#include "tests/fake/node_fake.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "modules/services.h"
#include "reactor/group.h"
#include "storage/pool.h"

struct nf_node nf;

static struct {
	struct svc_transport svc;
	struct tp_fake_opts fo;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void nf_fail(const char *what, int err)
{
	fprintf(stderr, "node_fake: %s failed (%d)\n", what, err);
	abort();
}

/* ------------------------------------------------- the transport module */

static int fm_init(struct pc_ctx *ctx)
{
	char ep[200];
	const struct pc_settings *s = ctx->cfg;
	/* The data endpoint the cluster module announces (no port is
	 * bound: data_port 0 stands for port 2). */
	snprintf(ep, sizeof(ep), "%s:%lld",
		 *s->advertise_host ? s->advertise_host : s->bind,
		 s->data_port ? (long long)s->data_port : 2LL);
	h.svc.ops = &tp_fake_ops;
	h.svc.clients = calloc(ctx->threads, sizeof(*h.svc.clients));
	if (!h.svc.clients)
		return -ENOMEM;
	int ret = tp_fake_node_new(ep, &h.svc.node);
	if (ret < 0)
		return ret;
	pc_ctx_publish(ctx, "data", ep);
	return svc_publish_transport(ctx, "transport", &h.svc);
}

static int fm_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	struct tp_client *tc = tp_fake_client_new(r, &h.fo);
	h.svc.clients[rx_reactor_id(r)] = tc;
	return tc ? 0 : -ENOMEM;
}

static void fm_stop(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	struct tp_client *tc = h.svc.clients[rx_reactor_id(r)];
	if (tc)
		tp_fake_client_stop(tc);
}

static void fm_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	struct tp_client **tc = &h.svc.clients[rx_reactor_id(r)];
	if (*tc)
		tp_fake_client_free(*tc);
	*tc = NULL;
}

static void fm_fini(struct pc_ctx *ctx)
{
	svc_withdraw_transport(ctx);
	if (h.svc.node)
		tp_fake_node_free(h.svc.node);
	free(h.svc.clients);
	h.svc.node = NULL;
	h.svc.clients = NULL;
}

struct tp_node *nf_node(void)
{
	return h.svc.node;
}

const struct pc_module nf_mod_transport = {
	.name = "transport",
	.init = fm_init,
	.start = fm_start,
	.stop = fm_stop,
	.exit = fm_exit,
	.fini = fm_fini,
};

struct tp_client *nf_client(void)
{
	return h.svc.clients[0];
}

static void set_faults_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	tp_fake_client_set(nf_client(), arg);
	nf_done();
}

void nf_set_faults(const struct tp_fake_opts *fo)
{
	nf_on_reactor(set_faults_run, (void *)fo, 10000);
}

unsigned nf_inflight(void)
{
	struct tp_client **cs = h.svc.clients;
	struct tp_client *tc = cs ? __atomic_load_n(&cs[0], __ATOMIC_ACQUIRE)
				  : NULL;
	return tc ? tp_fake_client_inflight(tc) : 0;
}

bool nf_until(bool (*cond)(void *arg), void *arg, unsigned limit_ms)
{
	uint64_t end = pc_now_ns() + (uint64_t)limit_ms * 1000000u;
	for (;;) {
		if (cond(arg))
			return true;
		if (pc_now_ns() >= end)
			return false;
		struct timespec ts = {0, 1000000L};
		nanosleep(&ts, NULL);
	}
}

uint64_t nf_seed(const char *who, uint64_t dflt)
{
	const char *e = getenv("PC_TEST_SEED");
	uint64_t seed = e ? strtoull(e, NULL, 0) : dflt;
	if (!seed)
		seed = 1;
	printf("%s: seed %#llx (PC_TEST_SEED)\n", who,
	       (unsigned long long)seed);
	fflush(stdout);
	return seed;
}

/* --------------------------------------------------------------- the node */

void nf_settings(unsigned pool_mb)
{
	char err[256];
	int ret = pc_settings_defaults(&nf.s, err, sizeof(err));
	if (ret < 0)
		nf_fail(err, ret);
	nf.s.threads = 1;
	nf.s.data_port = 0;
	nf.s.pool_size = (uint64_t)pool_mb << 20;
	nf.s.pool_prefault = false;
}

void nf_start(const struct pc_module *const *mods, unsigned n,
	      const struct tp_fake_opts *fo)
{
	static const struct tp_fake_opts none;
	h.fo = fo ? *fo : none;
	int ret = pc_ctx_init(&nf.ctx, &nf.s, (unsigned)nf.s.threads, mods, n);
	if (ret < 0)
		nf_fail("pc_ctx_init", ret);
	/* The ring id names this node; an rpc_server module (when in mods)
	 * publishes the real address. */
	pc_ctx_publish(&nf.ctx, "rpc", "127.0.0.1:1");
	if ((ret = pc_modules_init(&nf.ctx)) < 0)
		nf_fail("pc_modules_init", ret);
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks gh;
	pc_modules_group_hooks(&nf.ctx, &gh);
	if ((ret = rx_group_start(&nf.grp, (unsigned)nf.s.threads, &p, &gh)) < 0)
		nf_fail("rx_group_start", ret);
	/* As the server's main does: membership events reach the reactors
	 * through ctx->group. */
	__atomic_store_n(&nf.ctx.group, nf.grp, __ATOMIC_RELEASE);
	__atomic_store_n(&nf.ctx.state, PC_NODE_READY, __ATOMIC_RELEASE);
}

void nf_stop(void)
{
	__atomic_store_n(&nf.ctx.state, PC_NODE_STOPPING, __ATOMIC_RELEASE);
	__atomic_store_n(&nf.ctx.group, NULL, __ATOMIC_RELEASE);
	rx_group_stop(nf.grp);
	rx_group_join(nf.grp);
	pc_modules_fini(&nf.ctx);
	pc_ctx_fini(&nf.ctx);
	pc_settings_free(&nf.s);
}

void nf_done(void)
{
	pthread_mutex_lock(&h.mu);
	h.done = true;
	pthread_cond_signal(&h.cv);
	pthread_mutex_unlock(&h.mu);
}

void nf_post(struct rx_group *grp, void (*fn)(struct rx_reactor *r, void *arg),
	     void *arg)
{
	pthread_mutex_lock(&h.mu);
	h.done = false;
	pthread_mutex_unlock(&h.mu);
	int ret = rx_group_post(grp, 0, fn, arg);
	if (ret < 0)
		nf_fail("rx_group_post", ret);
}

void nf_wait(unsigned limit_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += limit_ms / 1000;
	ts.tv_nsec += (long)(limit_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&h.mu);
	int ret = 0;
	while (!h.done && ret == 0)
		ret = pthread_cond_timedwait(&h.cv, &h.mu, &ts);
	bool done = h.done;
	pthread_mutex_unlock(&h.mu);
	if (!done)
		nf_fail("a call on the reactor did not complete in time", 0);
}

void nf_on_group(struct rx_group *grp,
		 void (*fn)(struct rx_reactor *r, void *arg), void *arg,
		 unsigned limit_ms)
{
	nf_post(grp, fn, arg);
	nf_wait(limit_ms);
}

void nf_on_reactor(void (*fn)(struct rx_reactor *r, void *arg), void *arg,
		   unsigned limit_ms)
{
	nf_on_group(nf.grp, fn, arg, limit_ms);
}

/* ------------------------------------------------------------- members */

static int m_pin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	struct pool_ref ref;
	_Static_assert(sizeof(ref) <= sizeof(*pin), "a pool_ref fits a tp_pin");
	int ret = pool_pin_addr(ctx, addr, len, &ref);
	memset(pin, 0, sizeof(*pin));
	memcpy(pin, &ref, sizeof(ref));
	return ret;
}

static void m_unpin(void *ctx, const struct tp_pin *pin)
{
	struct pool_ref ref;
	memcpy(&ref, pin, sizeof(ref));
	pool_unpin(ctx, &ref);
}

void nf_member_new(struct nf_member *m, const char *id, const char *data,
		   unsigned pool_mb)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->id, sizeof(m->id), "%s", id);
	snprintf(m->data, sizeof(m->data), "%s", data);
	struct pool_opts po = {.size = (size_t)pool_mb << 20};
	int ret = pool_new(&m->pool, &po);
	if (ret < 0)
		nf_fail("pool_new", ret);
	if ((ret = tp_fake_node_new(data, &m->tn)) < 0)
		nf_fail("tp_fake_node_new", ret);
	uint8_t *base;
	size_t len;
	pool_region(m->pool, &base, &len);
	struct tp_region reg = {.base = (uintptr_t)base, .len = len,
				.access = TP_ACCESS_READ, .pin = m_pin,
				.unpin = m_unpin, .ctx = m->pool};
	if ((ret = tp_fake_ops.reg_region(m->tn, &reg, &m->rkey)) < 0)
		nf_fail("reg_region", ret);
}

void nf_member_free(struct nf_member *m)
{
	tp_fake_node_free(m->tn); /* deregisters its pool */
	pool_free(m->pool);
	memset(m, 0, sizeof(*m));
}

void nf_member_put(struct nf_member *m, const char *key, const void *val,
		   uint64_t len, struct dir_rec *rec)
{
	struct pool_ref ref;
	uint8_t *dst;
	size_t klen = strlen(key);
	int ret = pool_reserve(m->pool, key, klen, len, &ref, &dst);
	if (ret < 0)
		nf_fail("pool_reserve", ret);
	memcpy(dst, val, len);
	uint64_t gen;
	uintptr_t addr;
	if ((ret = pool_commit(m->pool, &ref, true, &gen, &addr)) < 0)
		nf_fail("pool_commit", ret);
	*rec = (struct dir_rec){.found = true, .resident = true, .addr = addr,
				.rkey = m->rkey, .len = (uint32_t)len,
				.gen = gen};
	snprintf(rec->node, sizeof(rec->node), "%s", m->id);
	snprintf(rec->data, sizeof(rec->data), "%s", m->data);
}

struct mpub {
	const char *key;
	size_t klen;
	struct dir_rec rec;
	bool ok;
	int ret;
};

static void mpub_done(void *arg)
{
	(void)arg;
	nf_done();
}

static void mpub_run(struct rx_reactor *r, void *arg)
{
	struct mpub *p = arg;
	const struct pl_ops *pl = svc_find_placement(&nf.ctx);
	struct dir_keys k = {&p->key, &p->klen, 1};
	p->ret = pl ? pl->publish(r, &k, &p->rec, &p->ok, 0, mpub_done, p)
		    : -ENOENT;
	if (p->ret < 0)
		nf_done();
}

void nf_publish(const char *key, const struct dir_rec *rec)
{
	struct mpub p = {.key = key, .klen = strlen(key), .rec = *rec};
	nf_on_reactor(mpub_run, &p, 10000);
	if (p.ret < 0)
		nf_fail("placement publish", p.ret);
	if (!p.ok)
		nf_fail("placement publish (not stored)", -EIO);
}

void nf_member_publish(struct nf_member *m, const char *key, const void *val,
		       uint64_t len, struct dir_rec *rec)
{
	struct dir_rec r;
	nf_member_put(m, key, val, len, &r);
	nf_publish(key, &r);
	if (rec)
		*rec = r;
}
