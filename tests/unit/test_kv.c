/*
 * tests/unit/test_kv.c — the kv module and p2p placement (the directory) in
 * one process, on one reactor: the real transport, cluster, directory and
 * kv modules of a single-node ring (every record is stored and looked up
 * on this node; no page crosses the network, so no transport fake is
 * needed). Covers the kv API (publish, fetch, get with its staging limits,
 * exists, remove), the placement interface (publish, lookup, conditional
 * unpublish, is_here), the tier hooks with no tier (evictions unpublish,
 * non-resident records miss), the call arena, and kv, the disk tier and
 * republish staying idle outside p2p mode.
 *
 * Each test drives the node from the test thread: every API call is posted
 * to the reactor and the test waits for its callback.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "common/arena.h"
#include "common/settings.h"
#include "common/util.h"
#include "modules/kv.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "modules/walk.h"
#include "reactor/group.h"
#include "modules/module.h"
#include "testutil.h"

static const struct pc_module *const mods[] = {
	&pc_mod_transport, &pc_mod_cluster, &pc_mod_directory, &pc_mod_kv,
};

static struct {
	struct pc_settings s;
	struct pc_ctx ctx;
	struct rx_group *grp;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} t;

/* Start a one-reactor node with a pool of pool_mb MiB and these peers
 * (NULL: none), whose calls end within deadline_ms (0: the default). */
static void node_start_with(unsigned pool_mb, const char *peers,
			    uint64_t deadline_ms)
{
	char err[256];
	cr_assert_eq(pc_settings_defaults(&t.s, err, sizeof(err)), 0, "%s", err);
	if (peers) {
		free(t.s.peers);
		t.s.peers = strdup(peers);
	}
	if (deadline_ms)
		t.s.request_deadline_ms = deadline_ms;
	t.s.threads = 1;
	t.s.data_port = 0;
	t.s.pool_size = (uint64_t)pool_mb << 20;
	t.s.pool_prefault = false;
	pthread_mutex_init(&t.mu, NULL);
	pthread_cond_init(&t.cv, NULL);
	cr_assert_eq(pc_ctx_init(&t.ctx, &t.s, 1, mods, PC_ARRAY_LEN(mods)), 0);
	/* No RPC listener here: the ring id only names this node. */
	pc_ctx_publish(&t.ctx, "rpc", "127.0.0.1:1");
	cr_assert_eq(pc_modules_init(&t.ctx), 0);
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h;
	pc_modules_group_hooks(&t.ctx, &h);
	cr_assert_eq(rx_group_start(&t.grp, 1, &p, &h), 0);
}

static void node_start(unsigned pool_mb)
{
	node_start_with(pool_mb, NULL, 0);
}

static void node_stop(void)
{
	rx_group_stop(t.grp);
	rx_group_join(t.grp);
	pc_modules_fini(&t.ctx);
	pc_ctx_fini(&t.ctx);
	pc_settings_free(&t.s);
}

static void signal_done(void)
{
	pthread_mutex_lock(&t.mu);
	t.done = true;
	pthread_cond_signal(&t.cv);
	pthread_mutex_unlock(&t.mu);
}

/* Run fn on the reactor; wait (at most 10 s) until it calls signal_done. */
static void on_reactor(void (*fn)(struct rx_reactor *r, void *arg), void *arg)
{
	t.done = false;
	cr_assert_eq(rx_group_post(t.grp, 0, fn, arg), 0);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&t.mu);
	int ret = 0;
	while (!t.done && ret == 0)
		ret = pthread_cond_timedwait(&t.cv, &t.mu, &ts);
	pthread_mutex_unlock(&t.mu);
	cr_assert(t.done, "the call did not complete");
}

/* ------------------------------------------------------------ kv calls */

#define N_MAX 64

struct op {
	int kind; /* 0 publish, 1 fetch, 2 get, 3 exists, 4 remove */
	struct kv_item it[N_MAX];
	unsigned n;
	uint64_t stage_max;
	int ret;
	bool ok[N_MAX];
	unsigned count;
	/* get */
	uint64_t len[N_MAX];
	uint8_t data[N_MAX][8192];
	int refused;
	bool in_call;
	bool cb_ran;
};

/* A callback ran: signal now, or (inside the call) when the call returns,
 * so the test never frees o while op_run still writes it. */
static void op_complete(struct op *o)
{
	o->cb_ran = true;
	if (!o->in_call)
		signal_done();
}

static void op_bools(void *arg, const bool *ok, unsigned n)
{
	struct op *o = arg;
	memcpy(o->ok, ok, n * sizeof(*ok));
	op_complete(o);
}

static void op_count(void *arg, unsigned count)
{
	struct op *o = arg;
	o->count = count;
	op_complete(o);
}

static void op_got(void *arg, const struct kv_got *got)
{
	struct op *o = arg;
	o->refused = got->refused;
	for (unsigned i = 0; i < got->n; i++) {
		o->ok[i] = got->ok[i];
		if (got->ok[i]) {
			o->len[i] = got->len[i];
			memcpy(o->data[i], got->data[i], got->len[i]);
		}
	}
	op_complete(o);
}

static void op_run(struct rx_reactor *r, void *arg)
{
	struct op *o = arg;
	const struct kv_api *kv = svc_find_kv(&t.ctx);
	o->in_call = true;
	o->cb_ran = false;
	switch (o->kind) {
	case 0:
		o->ret = kv->publish(r, o->it, o->n, KV_SRC_NOW, NULL, op_bools, o);
		break;
	case 1:
		o->ret = kv->fetch(r, o->it, o->n, false, op_bools, o);
		break;
	case 2:
		o->ret = kv->get(r, o->it, o->n, o->stage_max, op_got, o);
		break;
	case 3:
		o->ret = kv->exists(r, o->it, o->n, op_count, o);
		break;
	default:
		o->ret = kv->remove(r, o->it, o->n, op_bools, o);
	}
	o->in_call = false;
	if (o->ret < 0 || o->cb_ran)
		signal_done();
}

static char keys[N_MAX][32];
static uint8_t vals[N_MAX][8192];

static struct op *op_new(int kind, unsigned n, const char *prefix)
{
	struct op *o = calloc(1, sizeof(*o));
	cr_assert(o);
	o->kind = kind;
	o->n = n;
	o->stage_max = UINT64_MAX;
	for (unsigned i = 0; i < n; i++) {
		snprintf(keys[i], sizeof(keys[i]), "%s-%u", prefix, i);
		size_t len = 1000 + 100 * i;
		tu_fill_pattern(vals[i], len, i, 0);
		o->it[i] = (struct kv_item){keys[i], strlen(keys[i]), vals[i],
					    len};
	}
	return o;
}

static struct op *op_do(int kind, unsigned n, const char *prefix)
{
	struct op *o = op_new(kind, n, prefix);
	on_reactor(op_run, o);
	return o;
}

Test(kv, set_get_fetch_exists_remove_through_the_api)
{
	node_start(64);
	struct op *o = op_do(0, 8, "k");
	cr_assert_eq(o->ret, 0);
	for (unsigned i = 0; i < 8; i++)
		cr_assert(o->ok[i], "set %u", i);
	free(o);

	o = op_do(2, 8, "k"); /* staged: local hits */
	cr_assert_eq(o->ret, 0);
	cr_assert_eq(o->refused, 0);
	for (unsigned i = 0; i < 8; i++) {
		cr_assert(o->ok[i]);
		cr_assert_eq(o->len[i], 1000 + 100 * i);
		cr_assert_eq(tu_check_pattern(o->data[i], o->len[i], i, 0), -1);
	}
	free(o);

	/* fetch into the caller's buffers; item 3 asks for the wrong size */
	o = op_new(1, 8, "k");
	static uint8_t dst[8][8192];
	for (unsigned i = 0; i < 8; i++) {
		o->it[i].data = dst[i];
		if (i == 3)
			o->it[i].len++;
	}
	on_reactor(op_run, o);
	cr_assert_eq(o->ret, 0);
	for (unsigned i = 0; i < 8; i++) {
		cr_assert_eq(o->ok[i], i != 3, "fetch %u", i);
		if (i != 3)
			cr_assert_eq(tu_check_pattern(dst[i], o->it[i].len, i, 0),
				     -1);
	}
	free(o);

	o = op_do(3, 8, "k");
	cr_assert_eq(o->count, 8);
	free(o);

	o = op_new(4, 2, "k"); /* remove k-0, k-1 */
	on_reactor(op_run, o);
	cr_assert(o->ok[0] && o->ok[1]);
	free(o);

	o = op_do(3, 8, "k"); /* k-0 is gone: no leading key exists */
	cr_assert_eq(o->count, 0);
	free(o);

	o = op_do(2, 8, "k");
	cr_assert(!o->ok[0] && !o->ok[1] && o->ok[2] && o->ok[7]);
	free(o);
	node_stop();
}

Test(kv, invalid_batches_start_nothing)
{
	node_start(16);
	struct op *o = op_new(2, 1, "x");
	o->it[0].klen = 0;
	on_reactor(op_run, o);
	cr_assert_eq(o->ret, -EINVAL);
	o->it[0].klen = 600; /* over DIR_KEY_MAX */
	on_reactor(op_run, o);
	cr_assert_eq(o->ret, -EINVAL);
	o->it[0].klen = 3;
	o->kind = 1; /* fetch without a destination */
	o->it[0].data = NULL;
	on_reactor(op_run, o);
	cr_assert_eq(o->ret, -EINVAL);
	o->kind = 0;
	o->n = 0;
	on_reactor(op_run, o);
	cr_assert_eq(o->ret, -EINVAL);
	free(o);
	node_stop();
}

/* hold (bytes > 0) or release (-bytes) on the reactor: after what ran
 * before it there finished (a call frees its staging after its callback). */
struct hold_op {
	int64_t bytes;
	int ret;
};

static void hold_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct hold_op *h = arg;
	const struct kv_api *kv = svc_find_kv(&t.ctx);
	if (h->bytes > 0)
		h->ret = kv->hold((uint64_t)h->bytes);
	else
		kv->release((uint64_t)-h->bytes);
	signal_done();
}

static int hold(int64_t bytes)
{
	struct hold_op h = {bytes, 0};
	on_reactor(hold_run, &h);
	return h.ret;
}

Test(kv, get_refuses_pages_over_its_stage_max_and_the_node_budget)
{
	node_start(16);
	struct op *o = op_do(0, 4, "s");
	free(o);
	o = op_new(2, 4, "s");
	o->stage_max = 2500; /* pages are 1000, 1100, 1200, 1300 bytes */
	on_reactor(op_run, o);
	cr_assert_eq(o->refused, -E2BIG);
	free(o);
	/* The node's budget: what is held is not available to a get. */
	int64_t max = (int64_t)t.s.kv_staging_max;
	cr_assert_eq(hold(max + 1), -EBUSY);
	cr_assert_eq(hold(max - 2000), 0);
	o = op_do(2, 4, "s");
	cr_assert_eq(o->refused, -EBUSY);
	free(o);
	hold(-(max - 2000));
	o = op_do(2, 4, "s");
	cr_assert_eq(o->refused, 0);
	cr_assert(o->ok[0] && o->ok[3]);
	free(o);
	node_stop();
}

/* A get whose callback takes the staging over (as kv.get's reply does):
 * the pages stay valid after it returns, until given back on the reactor;
 * given back, the reactor's next get stages into the same memory. */
#define BIG_PAGES 4
#define BIG_LEN (1u << 20)

struct take_op {
	struct kv_item it[BIG_PAGES];
	char key[BIG_PAGES][16];
	uint8_t *val[BIG_PAGES];
	int ret;
	bool publish; /* big_run: publish, else get */
	enum kv_src src; /* publish's */
	bool ok[BIG_PAGES], had_stage, cb_ran, in_call;
	bool freed_ran, freed_first; /* publish's freed ran (before done) */

	const uint8_t *data[BIG_PAGES];
	struct pc_block_set taken;
	long faults0, faults; /* the reactor thread's, over a get */
};

/* Minor page faults of the calling thread so far. */
static long thread_faults(void)
{
	struct rusage ru;
	getrusage(RUSAGE_THREAD, &ru);
	return ru.ru_minflt;
}

/* publish reads the sources no more: they are the caller's again (what
 * it writes now must not reach the pool). */
static void op_freed_big(void *arg)
{
	struct take_op *o = arg;
	o->freed_ran = true;
	o->freed_first = !o->cb_ran;
	for (unsigned i = 0; i < BIG_PAGES; i++)
		tu_fill_pattern(o->val[i], BIG_LEN, 700 + i, 0);
}

static void op_bools_big(void *arg, const bool *ok, unsigned n)
{
	struct take_op *o = arg;
	memcpy(o->ok, ok, n * sizeof(*ok));
	o->cb_ran = true;
	if (!o->in_call)
		signal_done();
}

static void take_got(void *arg, const struct kv_got *got)
{
	struct take_op *o = arg;
	for (unsigned i = 0; i < got->n; i++) {
		o->ok[i] = got->ok[i] && got->len[i] == BIG_LEN;
		o->data[i] = got->data[i];
	}
	o->faults = thread_faults() - o->faults0;
	o->had_stage = got->stage != NULL;
	if (got->stage) {
		o->taken = *got->stage;
		*got->stage = (struct pc_block_set){0};
	}
	o->cb_ran = true;
	if (!o->in_call)
		signal_done();
}

/* The op's publish (o->publish) or get (taking the staging over). */
static void big_run(struct rx_reactor *r, void *arg)
{
	struct take_op *o = arg;
	const struct kv_api *kv = svc_find_kv(&t.ctx);
	o->in_call = true;
	o->cb_ran = false;
	o->freed_ran = false;
	o->faults0 = thread_faults();
	o->ret = o->publish ? kv->publish(r, o->it, BIG_PAGES, o->src,
					  op_freed_big, op_bools_big, o)
			    : kv->get(r, o->it, BIG_PAGES, UINT64_MAX, take_got,
				      o);
	o->in_call = false;
	/* What the sources hold from now on: copied or not yet? (Unless
	 * publish gave them back already.) */
	if (o->publish && o->ret == 0 && !o->freed_ran)
		for (unsigned i = 0; i < BIG_PAGES; i++)
			tu_fill_pattern(o->val[i], BIG_LEN, 900 + i, 0);
	if (o->ret < 0 || o->cb_ran)
		signal_done();
}

/* An op of BIG_PAGES keys prefix-i, each with a value of pattern seed + i. */
static struct take_op *take_op_new(const char *prefix, uint64_t seed)
{
	struct take_op *o = calloc(1, sizeof(*o));
	cr_assert(o);
	for (unsigned i = 0; i < BIG_PAGES; i++) {
		snprintf(o->key[i], sizeof(o->key[i]), "%s-%u", prefix, i);
		o->val[i] = malloc(BIG_LEN);
		cr_assert(o->val[i]);
		tu_fill_pattern(o->val[i], BIG_LEN, seed + i, 0);
		o->it[i] = (struct kv_item){o->key[i], strlen(o->key[i]),
					    o->val[i], BIG_LEN};
	}
	return o;
}

/* Stores o's pages (sources as src says); every one must be stored. */
static void big_set(struct take_op *o, enum kv_src src)
{
	o->publish = true;
	o->src = src;
	on_reactor(big_run, o);
	cr_assert_eq(o->ret, 0);
	for (unsigned i = 0; i < BIG_PAGES; i++)
		cr_assert(o->ok[i], "set %u", i);
}

static void give_back(struct rx_reactor *r, void *arg)
{
	(void)r;
	pc_block_set_put(arg);
	signal_done();
}

/* big_run gets o's pages; each must be page i of pattern seed + i. */
static void check_pages(struct take_op *o, uint64_t seed, const char *what)
{
	o->publish = false;
	on_reactor(big_run, o);
	for (unsigned i = 0; i < BIG_PAGES; i++) {
		cr_assert(o->ok[i], "%s: get %u", what, i);
		cr_assert_eq(tu_check_pattern(o->data[i], BIG_LEN, seed + i, 0),
			     -1, "%s: page %u", what, i);
	}
	on_reactor(give_back, &o->taken);
}

static void take_op_free(struct take_op *o)
{
	for (unsigned i = 0; i < BIG_PAGES; i++)
		free(o->val[i]);
	free(o);
}

Test(kv, a_get_hands_its_staging_over_and_the_reactor_reuses_it)
{
	node_start(64);
	struct take_op *o = take_op_new("big", 100);
	big_set(o, KV_SRC_NOW);

	o->publish = false;
	on_reactor(big_run, o);
	/* 4 MiB of this node's pages: copied into staging in slices, which
	 * get tells its caller (kv.get then holds the client's input). */
	cr_assert_eq(o->ret, 1, "a get of %u MiB copied in the call",
		     BIG_PAGES * BIG_LEN >> 20);
	cr_assert(o->had_stage, "a get names the blocks its pages are in");
	uint8_t *block = o->taken.b[0].p;
	cr_assert_not_null(block, "local pages: one block");
	for (unsigned i = 0; i < BIG_PAGES; i++) {
		cr_assert(o->ok[i], "get %u", i);
		cr_assert(o->data[i] >= block &&
			  o->data[i] + BIG_LEN <= block + o->taken.b[0].cap,
			  "page %u is in the block taken", i);
		/* read after the callback returned: still the page */
		cr_assert_eq(tu_check_pattern(o->data[i], BIG_LEN, 100 + i, 0),
			     -1, "page %u changed after its get", i);
	}
	on_reactor(give_back, &o->taken);
	cr_assert_null(o->taken.b[0].p);

	/* The next get on this reactor stages into the block given back. */
	on_reactor(big_run, o);
	cr_assert_eq(o->taken.b[0].p, block, "a fresh block, not the warm one");
	for (unsigned i = 0; i < BIG_PAGES; i++)
		cr_assert_eq(tu_check_pattern(o->data[i], BIG_LEN, 100 + i, 0),
			     -1, "page %u, second get", i);
	on_reactor(give_back, &o->taken);
	take_op_free(o);
	node_stop();
}

/* Staging nobody wrote yet (the reactor's warm blocks have none to fit) is
 * faulted in on the offload thread before the pages land in it: the
 * reactor took 1,024 faults staging 4 MiB in small pages itself (128 of
 * them per 512 KiB copy slice), a stall per slice in a VM. The sanitizers'
 * shadow of the block (its first reads) is the reactor's either way. */
Test(kv, a_get_into_fresh_staging_has_it_faulted_in_off_the_reactor)
{
	node_start(64);
	struct take_op *o = take_op_new("fresh", 300);
	big_set(o, KV_SRC_NOW);
	check_pages(o, 300, "fresh staging");
	cr_assert_eq(o->ret, 1, "resumed after the call");
	cr_assert_lt(o->faults, 512, "%ld page faults on the reactor staging "
		     "%u MiB", o->faults, BIG_PAGES * BIG_LEN >> 20);
	take_op_free(o);
	node_stop();
}

/* Sources kept valid until done (a kept kv.set request): copied and summed
 * into the pool in slices over loop passes, after publish returned (big_run
 * rewrites the sources once it has: the last pages stored are the new
 * bytes). Sources valid during the call only: copied before it returns. */
Test(kv, a_set_of_kept_sources_is_copied_in_slices_after_the_call)
{
	node_start(64);
	struct take_op *o = take_op_new("kept", 300);
	big_set(o, KV_SRC_KEPT);
	/* The last page was copied after the call: the bytes written then. */
	o->publish = false;
	on_reactor(big_run, o);
	unsigned last = BIG_PAGES - 1;
	cr_assert(o->ok[last]);
	cr_assert_eq(tu_check_pattern(o->data[last], BIG_LEN, 900 + last, 0),
		     -1, "%u MiB copied in the call", BIG_PAGES * BIG_LEN >> 20);
	on_reactor(give_back, &o->taken);

	for (unsigned i = 0; i < BIG_PAGES; i++) {
		snprintf(o->key[i], sizeof(o->key[i]), "now-%u", i);
		o->it[i].klen = strlen(o->key[i]);
	}
	for (unsigned i = 0; i < BIG_PAGES; i++)
		tu_fill_pattern(o->val[i], BIG_LEN, 300 + i, 0);
	big_set(o, KV_SRC_NOW);
	check_pages(o, 300, "copied in the call");
	take_op_free(o);
	node_stop();
}

/* A set whose records wait on a peer that never answers (its deadline,
 * 1 s here): publish hands the kept sources back once the pages are in the
 * pool (a kept kv.set request then goes, and its connection reads on),
 * not when the records' publication ends. */
Test(kv, a_set_frees_its_sources_once_copied_while_its_records_wait)
{
	/* A peer that accepts (the kernel does) and never reads. */
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	cr_assert(ls >= 0);
	cr_assert_eq(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(ls, 16), 0);
	cr_assert_eq(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
	char peers[64];
	snprintf(peers, sizeof(peers), "127.0.0.1:%u", ntohs(sa.sin_port));
	node_start_with(64, peers, 1000);

	struct take_op *o = take_op_new("freed", 500);
	uint64_t t0 = pc_now_ns();
	big_set(o, KV_SRC_KEPT);
	uint64_t ms = (pc_now_ns() - t0) / 1000000u;
	cr_assert(o->freed_ran, "the sources were held until done (%lu ms)",
		  (unsigned long)ms);
	cr_assert(o->freed_first, "freed ran after done");
	/* Freed once the last page was copied: it holds what the sources
	 * held after the call (big_run), not what they held after freed. */
	o->publish = false;
	on_reactor(big_run, o);
	unsigned last = BIG_PAGES - 1;
	cr_assert(o->ok[last]);
	cr_assert_eq(tu_check_pattern(o->data[last], BIG_LEN, 900 + last, 0),
		     -1, "the sources were freed before their copy ended");
	on_reactor(give_back, &o->taken);
	take_op_free(o);
	node_stop();
	close(ls);
}

/* ----------------------------------------------------------- placement */

struct pl_op {
	int kind; /* 0 publish, 1 lookup, 2 unpublish */
	struct dir_rec rec[4];
	bool flags[4];
	const char *key[4];
	size_t klen[4];
	unsigned n;
	const char *node;
	uint64_t gens[4];
	int ret;
};

static void pl_done(void *arg)
{
	(void)arg;
	signal_done();
}

static void pl_run(struct rx_reactor *r, void *arg)
{
	struct pl_op *o = arg;
	const struct pl_ops *pl = svc_find_placement(&t.ctx);
	struct dir_keys k = {o->key, o->klen, o->n};
	if (o->kind == 0)
		o->ret = pl->publish(r, &k, o->rec, o->flags, 0, pl_done, o);
	else if (o->kind == 1)
		o->ret = pl->lookup(r, &k, o->rec, 0, 0, pl_done, o);
	else
		o->ret = pl->unpublish(r, &k, o->node, o->gens, o->flags, 0,
				       pl_done, o);
	if (o->ret < 0)
		signal_done();
}

static struct dir_rec foreign_rec(uint64_t gen, bool resident)
{
	struct dir_rec r = {.found = true, .resident = resident,
			    .addr = 0x1000, .rkey = 7, .len = 4096,
			    .gen = gen};
	snprintf(r.node, sizeof(r.node), "127.0.0.9:31999");
	snprintf(r.data, sizeof(r.data), "127.0.0.9:32000");
	return r;
}

static struct dir_rec pl_lookup1(const char *key)
{
	struct pl_op o = {.kind = 1, .key = {key}, .klen = {strlen(key)},
			  .n = 1};
	on_reactor(pl_run, &o);
	cr_assert_eq(o.ret, 0);
	return o.rec[0];
}

Test(placement, p2p_publish_lookup_and_conditional_unpublish)
{
	node_start(16);
	const struct pl_ops *pl = svc_find_placement(&t.ctx);
	cr_assert_not_null(pl);
	cr_assert_str_eq(pl->mode, "p2p");
	struct pl_op o = {.kind = 0, .key = {"pk"}, .klen = {2}, .n = 1};
	o.rec[0] = foreign_rec(5, true);
	on_reactor(pl_run, &o);
	cr_assert_eq(o.ret, 0);
	cr_assert(o.flags[0]);

	struct dir_rec r = pl_lookup1("pk");
	cr_assert(r.found && r.resident);
	cr_assert_eq(r.gen, 5);
	cr_assert_eq(r.len, 4096);
	cr_assert_str_eq(r.node, "127.0.0.9:31999");
	cr_assert(!pl->is_here(&r));
	cr_assert(!pl_lookup1("absent").found);

	/* Another generation, or another producer: the record stays. */
	struct pl_op u = {.kind = 2, .key = {"pk"}, .klen = {2}, .n = 1,
			  .node = "127.0.0.9:31999", .gens = {4}};
	on_reactor(pl_run, &u);
	cr_assert(!u.flags[0]);
	u.node = "127.0.0.8:31999";
	u.gens[0] = 5;
	on_reactor(pl_run, &u);
	cr_assert(!u.flags[0]);
	cr_assert(pl_lookup1("pk").found);
	/* Its producer's generation removes it. */
	u.node = "127.0.0.9:31999";
	on_reactor(pl_run, &u);
	cr_assert(u.flags[0]);
	cr_assert(!pl_lookup1("pk").found);
	node_stop();
}

/* A batch of B keys through the interface (kind as in struct pl_op). */
enum { B = 128 };

struct pl_batch {
	int kind;
	char kb[B][16];
	const char *kp[B];
	size_t kl[B];
	struct dir_rec recs[B];
	bool flags[B];
	const char *node;
	int ret;
};

static void pl_batch_run(struct rx_reactor *r, void *arg)
{
	struct pl_batch *b = arg;
	const struct pl_ops *pl = svc_find_placement(&t.ctx);
	struct dir_keys k = {b->kp, b->kl, B};
	if (b->kind == 0)
		b->ret = pl->publish(r, &k, b->recs, b->flags, 0, pl_done, b);
	else if (b->kind == 1)
		b->ret = pl->lookup(r, &k, b->recs, 0, 0, pl_done, b);
	else
		b->ret = pl->unpublish(r, &k, b->node, NULL, b->flags, 0,
				       pl_done, b);
	if (b->ret < 0)
		signal_done();
}

static void pl_batch(struct pl_batch *b, int kind, const char *node)
{
	b->kind = kind;
	b->node = node;
	for (unsigned i = 0; i < B; i++) {
		snprintf(b->kb[i], sizeof(b->kb[i]), "b-%u", i);
		b->kp[i] = b->kb[i];
		b->kl[i] = strlen(b->kb[i]);
	}
	on_reactor(pl_batch_run, b);
	cr_assert_eq(b->ret, 0);
}

/* Records come back at their own index; unpublish of a producer with no
 * generations removes any of its records, and with no producer whatever
 * record is there. */
Test(placement, batches_keep_their_order_and_unpublish_by_producer)
{
	node_start(16);
	struct pl_batch *b = calloc(1, sizeof(*b));
	cr_assert(b);
	for (unsigned i = 0; i < B; i++) {
		b->recs[i] = foreign_rec(100 + i, true);
		if (i % 3 == 0) /* another producer's */
			snprintf(b->recs[i].node, sizeof(b->recs[i].node),
				 "127.0.0.7:31999");
	}
	pl_batch(b, 0, NULL);
	for (unsigned i = 0; i < B; i++)
		cr_assert(b->flags[i]);
	memset(b->recs, 0, sizeof(b->recs));
	pl_batch(b, 1, NULL);
	for (unsigned i = 0; i < B; i++) {
		cr_assert(b->recs[i].found, "key %u", i);
		cr_assert_eq(b->recs[i].gen, 100 + i);
	}
	pl_batch(b, 2, "127.0.0.9:31999"); /* any generation of that one */
	for (unsigned i = 0; i < B; i++)
		cr_assert_eq(b->flags[i], i % 3 != 0, "key %u", i);
	pl_batch(b, 1, NULL);
	for (unsigned i = 0; i < B; i++)
		cr_assert_eq(b->recs[i].found, i % 3 == 0, "key %u", i);
	pl_batch(b, 2, NULL); /* whatever is there */
	for (unsigned i = 0; i < B; i++)
		cr_assert_eq(b->flags[i], i % 3 == 0, "key %u", i);
	pl_batch(b, 1, NULL);
	for (unsigned i = 0; i < B; i++)
		cr_assert(!b->recs[i].found);
	free(b);
	node_stop();
}

Test(placement, records_of_this_node_are_here_and_non_resident_ones_miss)
{
	node_start(16);
	const struct pl_ops *pl = svc_find_placement(&t.ctx);
	struct op *o = op_do(0, 1, "own");
	cr_assert(o->ok[0]);
	free(o);
	struct dir_rec r = pl_lookup1("own-0");
	cr_assert(r.found && r.resident && pl->is_here(&r));

	/* A page a lower tier would hold: with no tier, a get misses and
	 * exists does not count it — for this node's and another's. */
	struct pl_op p = {.kind = 0, .key = {"cold-0", "cold-1"},
			  .klen = {6, 6}, .n = 2};
	p.rec[0] = r;
	p.rec[0].resident = false;
	p.rec[1] = foreign_rec(9, false);
	on_reactor(pl_run, &p);
	cr_assert(p.flags[0] && p.flags[1]);
	o = op_new(2, 2, "cold");
	on_reactor(op_run, o);
	cr_assert(!o->ok[0] && !o->ok[1]);
	free(o);
	o = op_do(3, 2, "cold");
	cr_assert_eq(o->count, 0);
	free(o);
	node_stop();
}

/* Evictions with no tier unpublish the evicted generation's record. */
Test(placement, evicted_pages_are_unpublished)
{
	node_start(1); /* 1 MiB: 8 KiB-class pages evict soon */
	bool gone = false;
	for (unsigned round = 0; round < 8 && !gone; round++) {
		char prefix[16];
		snprintf(prefix, sizeof(prefix), "ev%u", round);
		struct op *o = op_do(0, N_MAX, prefix);
		if (round == 0) { /* the page and its record exist at first */
			cr_assert(o->ok[0]);
			cr_assert(pl_lookup1("ev0-0").found);
		}
		free(o);
		/* The unpublish queue flushes on the next loop turn(s). */
		for (unsigned tries = 0; tries < 50 && !gone; tries++) {
			gone = !pl_lookup1("ev0-0").found;
			if (!gone)
				usleep(20000);
		}
	}
	cr_assert(gone, "the record of an evicted page stayed");
	node_stop();
}

/* ------------------------------------------------- large batches */

/*
 * A call of many keys walks them in slices of loop passes (kv.c's
 * walk_take: at most 512 keys a pass over all calls): exists and get of
 * 3,000 pages found here answer after several passes, not inside the
 * call, with every count and byte as one walk would give.
 */
#define WALK_N 3000

struct walk_op {
	int kind; /* 0 publish, 2 get, 3 exists, 4 remove, 5 publish kept */
	struct rx_reactor *r;
	struct kv_item it[WALK_N];
	char key[WALK_N][24];
	uint8_t val[WALK_N][16];
	unsigned n;
	int ret;
	bool in_call, cb_ran;
	unsigned count, found, right;
	uint64_t iters0, iters; /* loop passes from the call to its answer */
};

static void walk_complete(struct walk_op *o)
{
	o->cb_ran = true;
	o->iters = rx_reactor_stats(o->r)->loop_iterations - o->iters0;
	if (!o->in_call)
		signal_done();
}

static void walk_bools(void *arg, const bool *ok, unsigned n)
{
	struct walk_op *o = arg;
	o->found = 0;
	for (unsigned i = 0; i < n; i++)
		o->found += ok[i];
	walk_complete(o);
}

static void walk_count(void *arg, unsigned count)
{
	struct walk_op *o = arg;
	o->count = count;
	walk_complete(o);
}

static void walk_got(void *arg, const struct kv_got *got)
{
	struct walk_op *o = arg;
	o->found = o->right = 0;
	for (unsigned i = 0; i < got->n; i++) {
		o->found += got->ok[i];
		o->right += got->ok[i] && got->len[i] == sizeof(o->val[i]) &&
			    memcmp(got->data[i], o->val[i],
				   sizeof(o->val[i])) == 0;
	}
	walk_complete(o);
}

static void walk_run(struct rx_reactor *r, void *arg)
{
	struct walk_op *o = arg;
	const struct kv_api *kv = svc_find_kv(&t.ctx);
	o->r = r;
	o->in_call = true;
	o->cb_ran = false;
	o->iters0 = rx_reactor_stats(r)->loop_iterations;
	if (o->kind == 0 || o->kind == 5)
		o->ret = kv->publish(r, o->it, o->n,
				     o->kind == 0 ? KV_SRC_NOW : KV_SRC_KEPT,
				     NULL, walk_bools, o);
	else if (o->kind == 2)
		o->ret = kv->get(r, o->it, o->n, UINT64_MAX, walk_got, o);
	else if (o->kind == 3)
		o->ret = kv->exists(r, o->it, o->n, walk_count, o);
	else
		o->ret = kv->remove(r, o->it, o->n, walk_bools, o);
	o->in_call = false;
	if (o->ret < 0 || o->cb_ran)
		signal_done();
}

/* A call of kind on keys [from, from + n) of the WALK_N pages. */
static struct walk_op *walk_do(int kind, unsigned from, unsigned n)
{
	struct walk_op *o = calloc(1, sizeof(*o));
	cr_assert(o);
	o->kind = kind;
	o->n = n;
	for (unsigned i = 0; i < n; i++) {
		snprintf(o->key[i], sizeof(o->key[i]), "walk-%u", from + i);
		tu_fill_pattern(o->val[i], sizeof(o->val[i]), from + i, 0);
		o->it[i] = (struct kv_item){o->key[i], strlen(o->key[i]),
					    o->val[i], sizeof(o->val[i])};
	}
	on_reactor(walk_run, o);
	cr_assert_geq(o->ret, 0, "kind %d: %d", kind, o->ret);
	return o;
}

/* Records of another node's pages for keys walk-<from>.. (placement
 * publish, as that node's set would), each stored here. */
struct walk_pub {
	char (*kb)[24];
	const char **k;
	size_t *kl;
	struct dir_rec *rec;
	bool *ok;
	unsigned n;
	int ret;
};

static void walk_pub_run(struct rx_reactor *r, void *arg)
{
	struct walk_pub *b = arg;
	const struct pl_ops *pl = svc_find_placement(&t.ctx);
	struct dir_keys k = {b->k, b->kl, b->n};
	b->ret = pl->publish(r, &k, b->rec, b->ok, 0, pl_done, b);
	if (b->ret < 0)
		signal_done();
}

static struct walk_pub *walk_pub_foreign(unsigned from, unsigned n)
{
	struct walk_pub *b = calloc(1, sizeof(*b));
	cr_assert(b);
	b->n = n;
	b->kb = calloc(n, sizeof(*b->kb));
	b->k = calloc(n, sizeof(*b->k));
	b->kl = calloc(n, sizeof(*b->kl));
	b->rec = calloc(n, sizeof(*b->rec));
	b->ok = calloc(n, sizeof(*b->ok));
	cr_assert(b->kb && b->k && b->kl && b->rec && b->ok);
	for (unsigned i = 0; i < n; i++) {
		snprintf(b->kb[i], sizeof(b->kb[i]), "walk-%u", from + i);
		b->k[i] = b->kb[i];
		b->kl[i] = strlen(b->kb[i]);
		b->rec[i] = foreign_rec(1 + i, true);
	}
	on_reactor(walk_pub_run, b);
	cr_assert_eq(b->ret, 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert(b->ok[i], "record %u not stored", i);
	return b;
}

static void walk_pub_free(struct walk_pub *b)
{
	free(b->kb);
	free(b->k);
	free(b->kl);
	free(b->rec);
	free(b->ok);
	free(b);
}

Test(kv, a_call_of_many_keys_walks_them_over_several_loop_passes)
{
	node_start(64);
	struct walk_op *o = walk_do(0, 0, WALK_N);
	cr_assert_eq(o->found, WALK_N, "stored %u", o->found);
	free(o);

	/* The same pages again from kept sources (node memory, as a kv.set
	 * request): all here already, so kv's walk and the directory round's
	 * are the passes, each over all the keys. */
	uint64_t yields = walk_yields_total();
	o = walk_do(5, 0, WALK_N);
	cr_assert_eq(o->found, WALK_N, "published again %u", o->found);
	yields = walk_yields_total() - yields;
	cr_assert_geq(yields, 2 * (WALK_N / 512), "the set's walks stopped "
		      "%llu times", (unsigned long long)yields);
	free(o);

	o = walk_do(3, 0, WALK_N);
	cr_assert_eq(o->count, WALK_N);
	cr_assert_eq(o->ret, 0);
	cr_assert_geq(o->iters, WALK_N / 512, "exists of %u keys answered "
		      "after %llu passes", WALK_N, (unsigned long long)o->iters);
	free(o);

	o = walk_do(2, 0, WALK_N);
	cr_assert_eq(o->ret, 1, "get went on after the call");
	cr_assert_eq(o->found, WALK_N);
	cr_assert_eq(o->right, WALK_N, "every page's bytes");
	cr_assert_geq(o->iters, WALK_N / 512, "get of %u keys answered after "
		      "%llu passes", WALK_N, (unsigned long long)o->iters);
	free(o);

	/* Pages not here: nothing to copy, so the passes are the pins'
	 * walk's alone. */
	o = walk_do(2, WALK_N, WALK_N);
	cr_assert_eq(o->found, 0);
	cr_assert_geq(o->iters, WALK_N / 512, "get of %u absent keys answered "
		      "after %llu passes", WALK_N, (unsigned long long)o->iters);
	free(o);

	/* A key missing past the first slices: exists counts up to it, get
	 * misses it alone. */
	o = walk_do(4, 2100, 1);
	cr_assert_eq(o->found, 1);
	free(o);
	o = walk_do(3, 0, WALK_N);
	cr_assert_eq(o->count, 2100);
	free(o);
	o = walk_do(2, 0, WALK_N);
	cr_assert_eq(o->found, WALK_N - 1);
	cr_assert_eq(o->right, WALK_N - 1);
	free(o);

	/* A small call is not sliced: exists answers inside the call. */
	o = walk_do(3, 0, 100);
	cr_assert_eq(o->count, 100);
	cr_assert_eq(o->iters, 0, "100 keys took %llu passes",
		     (unsigned long long)o->iters);
	free(o);

	/* Another node's pages (records only, none here): exists counts
	 * the records it looked up in slices too. */
	struct walk_pub *pb = walk_pub_foreign(100000, WALK_N);
	yields = walk_yields_total();
	o = walk_do(3, 100000, WALK_N);
	cr_assert_eq(o->count, WALK_N, "counted %u", o->count);
	yields = walk_yields_total() - yields;
	cr_assert_geq(yields, 2 * (WALK_N / 512), "the lookup's and the "
		      "count's walks stopped %llu times",
		      (unsigned long long)yields);
	free(o);
	walk_pub_free(pb);

	/* A delete of them all: its pages here, then their records, each
	 * walked in slices. */
	yields = walk_yields_total();
	o = walk_do(4, 0, WALK_N);
	cr_assert_eq(o->found, WALK_N - 1, "deleted %u", o->found);
	yields = walk_yields_total() - yields;
	cr_assert_geq(yields, 2 * (WALK_N / 512), "the delete's walks stopped "
		      "%llu times", (unsigned long long)yields);
	free(o);
	o = walk_do(3, 0, WALK_N);
	cr_assert_eq(o->count, 0);
	free(o);
	node_stop();
}

/* ------------------------------------------------------- other modes */

static void loop_runs(struct rx_reactor *r, void *arg)
{
	(void)r;
	(void)arg;
	signal_done();
}

/* Outside p2p (slotmap: its own module is the "kv" service), kv, the disk
 * tier and republish do nothing: init publishes no pool, kv, tier or
 * placement (so nothing fails for the lack of them), and start, stop,
 * exit and fini cope with that. */
Test(kv, other_modes_leave_pages_to_their_own_module)
{
	static const struct pc_module *const stack[] = {
		&pc_mod_transport, &pc_mod_cluster, &pc_mod_directory,
		&pc_mod_kv, &pc_mod_disk, &pc_mod_republish,
	};
	char err[256];
	cr_assert_eq(pc_settings_defaults(&t.s, err, sizeof(err)), 0, "%s", err);
	t.s.mode = PC_MODE_SLOTMAP;
	t.s.threads = 1;
	t.s.data_port = 0;
	t.s.pool_prefault = false;
	pthread_mutex_init(&t.mu, NULL);
	pthread_cond_init(&t.cv, NULL);
	cr_assert_eq(pc_ctx_init(&t.ctx, &t.s, 1, stack, PC_ARRAY_LEN(stack)),
		     0);
	pc_ctx_publish(&t.ctx, "rpc", "127.0.0.1:1");
	cr_assert_eq(pc_modules_init(&t.ctx), 0);
	cr_assert_null(svc_find_kv(&t.ctx));
	cr_assert_null(svc_find_pool(&t.ctx));
	cr_assert_null(svc_find_tier(&t.ctx));
	cr_assert_null(svc_find_placement(&t.ctx));
	struct rx_params p;
	rx_params_default(&p);
	struct rx_group_hooks h;
	pc_modules_group_hooks(&t.ctx, &h);
	cr_assert_eq(rx_group_start(&t.grp, 1, &p, &h), 0);
	on_reactor(loop_runs, NULL); /* every start hook ran */
	node_stop();
}

/* ---------------------------------------------------------------- arena */

Test(arena, plan_then_carve_in_one_allocation)
{
	struct pc_arena a;
	pc_arena_plan(&a);
	cr_assert_null(pc_arena_take(&a, 3));
	cr_assert_null(pc_arena_take(&a, 0));
	cr_assert_null(pc_arena_take(&a, 100));
	void *base = pc_arena_alloc(&a);
	cr_assert_not_null(base);
	uint8_t *x = pc_arena_take(&a, 3);
	uint8_t *y = pc_arena_take(&a, 0);
	uint8_t *z = pc_arena_take(&a, 100);
	cr_assert_eq(x, base);
	cr_assert_eq((uintptr_t)y % PC_ARENA_ALIGN, 0);
	cr_assert_eq((uintptr_t)z % PC_ARENA_ALIGN, 0);
	cr_assert(z >= x + 3 && z + 100 <= (uint8_t *)base + a.cap);
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(z[i], 0);
	free(base);
}
