/*
 * tests/unit/test_kv_remote.c — the kv module's remote path on the fake
 * transport: one node (transport fake, cluster, directory, kv on one
 * reactor) and two other members whose pages live in pools of their own,
 * served by fake nodes (tests/fake/node_fake.h). Their records are put into
 * this node's directory through placement, so kv get and fetch of those
 * keys look them up and read them through the transport.
 *
 * What is checked, with faults on (latency, jitter, reordering, drops,
 * errors, partial reads, a member departing, the node stopping mid-read):
 * never wrong (a page is the right bytes, or a miss — never other bytes),
 * each call's callback runs exactly once, the node's staging budget is
 * all back when calls ended, and no member's page stays pinned. Faults come from a seeded generator; the seed
 * is printed (PC_TEST_SEED overrides it).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "modules/kv.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "storage/pool.h"
#include "storage/ring.h"
#include "testutil.h"
#include "tests/fake/node_fake.h"

static const struct pc_module *const mods[] = {
	&nf_mod_transport, &pc_mod_cluster, &pc_mod_directory, &pc_mod_kv,
};

#define N_MAX 48
#define PAGE_MAX 12288

static struct nf_member m1, m2;

/* ----------------------------------------------------------- the oracle */

/* The content of key's version ver: len and bytes follow from both. */
static uint64_t key_seed(const char *key, unsigned ver)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *p = key; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	return h + ver;
}

static uint64_t page_len(const char *key, unsigned ver)
{
	return 512 + key_seed(key, ver) % (PAGE_MAX - 512);
}

static void page_make(const char *key, unsigned ver, uint8_t *buf,
		      uint64_t *len)
{
	*len = page_len(key, ver);
	tu_fill_pattern(buf, *len, key_seed(key, ver), 0);
}

/* --------------------------------------------------------------- calls */

/* One kv call run on the reactor: kind 0 publish, 1 fetch, 2 get,
 * 3 exists, 4 remove. */
struct call {
	int kind;
	unsigned n;
	char key[N_MAX][40];
	struct kv_item it[N_MAX];
	uint8_t src[N_MAX][PAGE_MAX];  /* publish: sources; fetch: dests */
	int ret;
	int calls;                     /* callbacks that ran */
	unsigned count;                /* exists */
	bool ok[N_MAX];
	uint64_t len[N_MAX];
	uint8_t got[N_MAX][PAGE_MAX];  /* get: copies of what was staged */
	struct rx_timer after;         /* see call_run */
	void (*midway)(struct rx_reactor *r, struct call *c);
	unsigned midway_ms;
	struct rx_timer mid;
	bool in_call;                  /* call_run is inside the kv call */
	bool ended_inside;             /* ... and the callback ran there */
};

/* The test thread may free c once nf_done ran: a callback that runs inside
 * the kv call (allowed: a local or cached answer) leaves nf_done to
 * call_run, which still writes c after the call returns. */
static void call_end(struct call *c)
{
	if (++c->calls != 1)
		return;
	if (c->in_call)
		c->ended_inside = true;
	else
		nf_done();
}

static void c_bools(void *arg, const bool *ok, unsigned n)
{
	struct call *c = arg;
	memcpy(c->ok, ok, n * sizeof(*ok));
	call_end(c);
}

static void c_got(void *arg, const struct kv_got *got)
{
	struct call *c = arg;
	for (unsigned i = 0; i < got->n; i++) {
		c->ok[i] = got->ok[i];
		if (!got->ok[i])
			continue;
		c->len[i] = got->len[i];
		cr_assert_leq(got->len[i], PAGE_MAX);
		memcpy(c->got[i], got->data[i], got->len[i]);
	}
	call_end(c);
}

static void c_count(void *arg, unsigned count)
{
	struct call *c = arg;
	c->count = count;
	call_end(c);
}

static void c_mid(struct rx_reactor *r, struct rx_timer *t)
{
	struct call *c = t->arg;
	c->midway(r, c);
}

static void call_run(struct rx_reactor *r, void *arg)
{
	struct call *c = arg;
	const struct kv_api *kv = svc_find_kv(&nf.ctx);
	c->calls = 0;
	c->in_call = true;
	c->ended_inside = false;
	if (c->kind == 0)
		c->ret = kv->publish(r, c->it, c->n, KV_SRC_NOW, NULL, c_bools, c);
	else if (c->kind == 1)
		c->ret = kv->fetch(r, c->it, c->n, false, c_bools, c);
	else if (c->kind == 2)
		c->ret = kv->get(r, c->it, c->n, UINT64_MAX, c_got, c);
	else if (c->kind == 3)
		c->ret = kv->exists(r, c->it, c->n, c_count, c);
	else
		c->ret = kv->remove(r, c->it, c->n, c_bools, c);
	c->in_call = false;
	if (c->ret < 0 || c->ended_inside) {
		nf_done();
		return;
	}
	if (c->midway) {
		rx_timer_init(&c->mid, c_mid, c);
		rx_timer_start(r, &c->mid, RX_MS(c->midway_ms), 0);
	}
}

static struct call *call_new(int kind)
{
	struct call *c = calloc(1, sizeof(*c));
	cr_assert(c);
	c->kind = kind;
	return c;
}

static void call_add(struct call *c, const char *key, unsigned ver)
{
	unsigned i = c->n++;
	cr_assert_leq(c->n, N_MAX);
	snprintf(c->key[i], sizeof(c->key[i]), "%s", key);
	uint64_t len = page_len(key, ver);
	if (c->kind == 0)
		page_make(key, ver, c->src[i], &len);
	bool dst = c->kind <= 1;
	c->it[i] = (struct kv_item){c->key[i], strlen(c->key[i]),
				    dst ? c->src[i] : NULL, dst ? len : 0};
}

static void call_do(struct call *c, unsigned limit_ms)
{
	nf_on_reactor(call_run, c, limit_ms);
	cr_assert_eq(c->ret, 0, "the call did not start: %d", c->ret);
}

/* The page call i returned (when ok) is key's version ver, byte for
 * byte. Returns whether it was ok. */
static bool call_check(struct call *c, unsigned i, unsigned ver)
{
	if (!c->ok[i])
		return false;
	uint64_t want = page_len(c->key[i], ver);
	const uint8_t *b = c->kind == 2 ? c->got[i] : c->src[i];
	if (c->kind == 2)
		cr_assert_eq(c->len[i], want, "%s: %lu bytes, not %lu",
			     c->key[i], (unsigned long)c->len[i],
			     (unsigned long)want);
	cr_assert_eq(tu_check_pattern(b, want, key_seed(c->key[i], ver), 0),
		     -1, "%s: wrong bytes", c->key[i]);
	return true;
}

/* A callback never runs twice: wait a little after the call returned, on
 * the reactor, and look again. */
static void noop_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	(void)arg;
	nf_done();
}

static void assert_once(struct call *c)
{
	usleep(30000);
	nf_on_reactor(noop_run, NULL, 10000);
	cr_assert_eq(c->calls, 1, "the callback ran %d times", c->calls);
}

/* Every staged byte is back: the whole budget can be held. */
struct hold { int ret; };

static void hold_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct hold *h = arg;
	const struct kv_api *kv = svc_find_kv(&nf.ctx);
	h->ret = kv->hold(nf.s.kv_staging_max);
	if (h->ret == 0)
		kv->release(nf.s.kv_staging_max);
	nf_done();
}

static void assert_budget_back(void)
{
	struct hold h = {1};
	nf_on_reactor(hold_run, &h, 10000);
	cr_assert_eq(h.ret, 0, "staging still held after every call ended");
}

/* ---------------------------------------------------------- placement */

/* key's version ver into member m, and its record into the directory. */
static struct dir_rec remote_put(struct nf_member *m, const char *key,
				 unsigned ver)
{
	static uint8_t buf[PAGE_MAX];
	uint64_t len;
	struct dir_rec rec;
	page_make(key, ver, buf, &len);
	nf_member_publish(m, key, buf, len, &rec);
	return rec;
}

/* ---------------------------------------------------------------- setup */

static uint64_t seed_of(void)
{
	return nf_seed("test_kv_remote", 0x6b7652);
}

static void setup_peers(const struct tp_fake_opts *fo, const char *peers)
{
	nf_settings(16);
	if (peers) {
		free(nf.s.peers);
		nf.s.peers = strdup(peers);
		nf.s.directory_replicas = 1;
	}
	nf.s.rpc_timeout_ms = 300;      /* a dropped read ends within it */
	nf.s.request_deadline_ms = 3000;
	nf.s.kv_staging_max = 4u << 20;
	if (peers) { /* reads wait for their answer (30 s), or an event */
		nf.s.rpc_timeout_ms = 40000;
		nf.s.request_deadline_ms = 45000;
	}
	nf_start(mods, PC_ARRAY_LEN(mods), fo);
	nf_member_new(&m1, "127.0.0.2:31999", "127.0.0.2:32000", 8);
	nf_member_new(&m2, "127.0.0.3:31999", "127.0.0.3:32000", 8);
}

static void setup(const struct tp_fake_opts *fo)
{
	setup_peers(fo, NULL);
}

/* Once the node stopped, no transfer holds a member's page any more. */
static void teardown(void)
{
	nf_stop();
	struct nf_member *ms[] = {&m1, &m2};
	for (unsigned i = 0; i < 2; i++) {
		struct pool_stats st;
		pool_stats(ms[i]->pool, &st);
		cr_assert_eq(st.pinned, 0, "%s: %lu pages still pinned",
			     ms[i]->id, (unsigned long)st.pinned);
		cr_assert_eq(pool_audit(ms[i]->pool), 0);
		nf_member_free(ms[i]);
	}
}

/* ---------------------------------------------------------------- tests */

Test(kv_remote, pages_of_other_members_arrive_through_the_transport)
{
	struct tp_fake_opts fo = {.latency_us = 200, .jitter_us = 300,
				  .reorder = true, .max_chans = 2,
				  .seed = seed_of()};
	setup(&fo);
	/* 8 local pages (published by kv), 10 on each member */
	struct call *pub = call_new(0);
	char key[40];
	for (unsigned i = 0; i < 8; i++) {
		snprintf(key, sizeof(key), "local-%u", i);
		call_add(pub, key, 0);
	}
	call_do(pub, 10000);
	for (unsigned i = 0; i < 8; i++)
		cr_assert(pub->ok[i]);
	free(pub);
	for (unsigned i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "m1-%u", i);
		remote_put(&m1, key, 0);
		snprintf(key, sizeof(key), "m2-%u", i);
		remote_put(&m2, key, 0);
	}
	for (int kind = 1; kind <= 2; kind++) {
		struct call *c = call_new(kind);
		for (unsigned i = 0; i < 10; i++) {
			snprintf(key, sizeof(key), "m1-%u", i);
			call_add(c, key, 0);
			snprintf(key, sizeof(key), "m2-%u", i);
			call_add(c, key, 0);
			if (i < 8) {
				snprintf(key, sizeof(key), "local-%u", i);
				call_add(c, key, 0);
			}
		}
		call_add(c, "nowhere", 0);
		call_do(c, 10000);
		for (unsigned i = 0; i + 1 < c->n; i++)
			cr_assert(call_check(c, i, 0), "%s missed", c->key[i]);
		cr_assert(!c->ok[c->n - 1]);
		assert_once(c);
		free(c);
	}
	assert_budget_back();
	teardown();
}

/*
 * Records that do not describe the bytes they point at: every one is a
 * miss. A replaced page (its old record's entry is dead), a record naming
 * another key's page, the wrong generation, a longer or shorter length, a
 * wrong key, an address outside every page.
 */
Test(kv_remote, records_that_lie_are_misses_never_other_bytes)
{
	setup(NULL);
	struct dir_rec a = remote_put(&m1, "a", 0);
	struct dir_rec b = remote_put(&m1, "b", 0);
	(void)b;
	/* a replaced: its old record goes under "a-old" */
	struct dir_rec a_old = a;
	remote_put(&m1, "a", 1);
	struct dir_rec lie[6];
	for (unsigned i = 0; i < 6; i++)
		lie[i] = a_old;
	lie[1] = b;                 /* "l1" names b's page */
	lie[2] = remote_put(&m1, "c", 0);
	lie[2].gen++;               /* wrong generation */
	lie[3] = remote_put(&m1, "d", 0);
	lie[3].len -= 8;            /* shorter */
	lie[4] = remote_put(&m1, "e", 0);
	lie[4].len += 64;           /* longer than the entry */
	lie[5] = remote_put(&m1, "f", 0);
	lie[5].rkey ^= 0x5a5a;      /* a key the member never gave */
	const char *names[6] = {"a-old", "l1", "l2", "l3", "l4", "l5"};
	for (unsigned i = 0; i < 6; i++)
		nf_publish(names[i], &lie[i]);
	/* the old record under its own key, too */
	nf_publish("a", &a_old);
	for (int kind = 1; kind <= 2; kind++) {
		struct call *c = call_new(kind);
		for (unsigned i = 0; i < 6; i++)
			call_add(c, names[i], 0);
		call_add(c, "a", 1);
		call_do(c, 10000);
		for (unsigned i = 0; i < c->n; i++)
			cr_assert(!c->ok[i], "%s: a lying record gave bytes",
				  c->key[i]);
		assert_once(c);
		free(c);
	}
	assert_budget_back();
	teardown();
}

/* A page whose payload changed after it was published (its header still
 * right) fails its checksum: a miss, never those bytes, whichever way it
 * is read (checked as its bytes land, modules/kv.c fetch_landed). */
Test(kv_remote, a_page_whose_bytes_changed_is_a_miss)
{
	setup(NULL);
	struct dir_rec good = remote_put(&m1, "good", 0);
	struct dir_rec bad = remote_put(&m2, "bad", 0);
	(void)good;
	uint8_t *payload = (uint8_t *)(uintptr_t)bad.addr + POOL_HDR_BYTES;
	payload[bad.len / 2] ^= 0x10;
	for (int kind = 1; kind <= 2; kind++) {
		struct call *c = call_new(kind);
		call_add(c, "good", 0);
		call_add(c, "bad", 0);
		call_do(c, 10000);
		cr_assert(call_check(c, 0, 0), "good: kind %d missed", kind);
		cr_assert(!c->ok[1], "bad: kind %d gave bytes that changed",
			  kind);
		assert_once(c);
		free(c);
	}
	/* put back, the same page reads again */
	payload[bad.len / 2] ^= 0x10;
	struct call *c = call_new(2);
	call_add(c, "bad", 0);
	call_do(c, 10000);
	cr_assert(call_check(c, 0, 0), "bad, mended: missed");
	free(c);
	assert_budget_back();
	teardown();
}

/*
 * Faults drawn per round from the seed: latency and jitter, reordering,
 * drops (the read's timeout ends them), errors, partial reads, a low
 * channel cap. Pages are re-put meanwhile (new versions). Whatever a call
 * returns is the current version or a miss; callbacks run once; the
 * budget comes back; and with the faults off again everything is read.
 */
Test(kv_remote, faults_give_misses_never_wrong_bytes)
{
	uint64_t seed = seed_of();
	struct tp_fake_opts fo = {.seed = seed};
	setup(&fo);
	enum { KEYS = 24, ROUNDS = 24 };
	unsigned ver[KEYS] = {0};
	char key[40];
	for (unsigned k = 0; k < KEYS; k++) {
		snprintf(key, sizeof(key), "f-%u", k);
		remote_put(k % 2 ? &m2 : &m1, key, 0);
	}
	uint64_t x = seed;
	unsigned hits = 0, misses = 0;
	for (unsigned round = 0; round < ROUNDS; round++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t d = x >> 11;
		fo = (struct tp_fake_opts){
			.latency_us = (unsigned)(d % 400),
			.jitter_us = (unsigned)((d >> 9) % 600),
			.drop_pct = (unsigned)((d >> 19) % 4 == 0 ? 10 : 0),
			.error_pct = (unsigned)((d >> 21) % 3 == 0 ? 20 : 0),
			.error_errno = (d >> 23) % 2 ? -EIO : -ECONNRESET,
			.partial_pct = (unsigned)((d >> 24) % 3 == 0 ? 25 : 0),
			.reorder = (d >> 26) % 2,
			.max_chans = 1 + (unsigned)((d >> 27) % 4),
			.seed = seed + round};
		nf_set_faults(&fo);
		/* a few pages get a new version first */
		unsigned k0 = (unsigned)((d >> 30) % KEYS);
		for (unsigned k = k0; k < k0 + 3 && k < KEYS; k++) {
			snprintf(key, sizeof(key), "f-%u", k);
			remote_put(k % 2 ? &m2 : &m1, key, ++ver[k]);
		}
		struct call *c = call_new(1 + (int)(round % 2));
		for (unsigned k = 0; k < KEYS; k++) {
			snprintf(key, sizeof(key), "f-%u", k);
			call_add(c, key, ver[k]);
		}
		call_do(c, 20000);
		for (unsigned k = 0; k < KEYS; k++) {
			if (call_check(c, k, ver[k]))
				hits++;
			else
				misses++;
		}
		assert_once(c);
		free(c);
		assert_budget_back();
	}
	printf("test_kv_remote: %u hits, %u misses under faults\n", hits,
	       misses);
	cr_assert_gt(hits, 0);
	cr_assert_gt(misses, 0, "the faults did not fault");
	/* faults off: every page is there */
	fo = (struct tp_fake_opts){.seed = seed};
	nf_set_faults(&fo);
	struct call *c = call_new(2);
	for (unsigned k = 0; k < KEYS; k++) {
		snprintf(key, sizeof(key), "f-%u", k);
		call_add(c, key, ver[k]);
	}
	call_do(c, 10000);
	for (unsigned k = 0; k < KEYS; k++)
		cr_assert(call_check(c, k, ver[k]), "%s missed", c->key[k]);
	free(c);
	teardown();
}

/* A member departs while its pages are on their way (the membership's
 * leave event fails them on the transport): its pages miss, the other
 * member's arrive, the call ends once, well before the read timeout. */
static void depart_m1(struct rx_reactor *r, struct call *c)
{
	(void)r;
	(void)c;
	tp_fake_ops.fail_node(nf_client(), m1.id, -EHOSTDOWN);
}

Test(kv_remote, a_member_departing_mid_read_fails_only_its_pages)
{
	struct tp_fake_opts fo = {.latency_us = 150000, .max_chans = 1,
				  .seed = seed_of()};
	setup(&fo);
	char key[40];
	for (unsigned i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "x1-%u", i);
		remote_put(&m1, key, 0);
		snprintf(key, sizeof(key), "x2-%u", i);
		remote_put(&m2, key, 0);
	}
	for (int kind = 1; kind <= 2; kind++) {
		struct call *c = call_new(kind);
		for (unsigned i = 0; i < 4; i++) {
			snprintf(key, sizeof(key), "x1-%u", i);
			call_add(c, key, 0);
		}
		c->midway = depart_m1;
		c->midway_ms = 20;
		call_do(c, 10000);
		for (unsigned i = 0; i < 4; i++)
			cr_assert(!c->ok[i], "%s arrived from a departed member",
				  c->key[i]);
		assert_once(c);
		free(c);
	}
	/* m2 is unaffected */
	fo.latency_us = 100;
	nf_set_faults(&fo);
	struct call *c = call_new(2);
	for (unsigned i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "x2-%u", i);
		call_add(c, key, 0);
	}
	call_do(c, 10000);
	for (unsigned i = 0; i < 4; i++)
		cr_assert(call_check(c, i, 0));
	free(c);
	assert_budget_back();
	teardown();
}

/* A member killed outright (its data endpoint resets) and one that never
 * answers: misses, within the read timeout, and the budget comes back. */
Test(kv_remote, a_dead_or_silent_member_is_a_miss_within_the_timeout)
{
	setup(NULL);
	remote_put(&m1, "dead-0", 0);
	remote_put(&m2, "silent-0", 0);
	tp_fake_node_kill(m1.tn);
	tp_fake_node_silence(m2.tn);
	struct call *c = call_new(2);
	call_add(c, "dead-0", 0);
	call_add(c, "silent-0", 0);
	uint64_t t0 = pc_now_ns();
	call_do(c, 10000);
	uint64_t ms = (pc_now_ns() - t0) / 1000000u;
	cr_assert(!c->ok[0] && !c->ok[1]);
	/* generous: the read timeout is 300 ms */
	cr_assert_lt(ms, 5000, "took %lu ms", (unsigned long)ms);
	assert_once(c);
	free(c);
	assert_budget_back();
	teardown();
}

/* The node stops while reads are in flight: each call's callback runs
 * once (with misses), nothing leaks (ASan), the fake client ends with no
 * batch left. */
static struct call *stopping;

static void start_then_flag(struct rx_reactor *r, void *arg)
{
	struct call *c = arg;
	const struct kv_api *kv = svc_find_kv(&nf.ctx);
	c->calls = 0;
	c->ret = kv->get(r, c->it, c->n, UINT64_MAX, c_got, c);
	nf_done(); /* started: the test stops the node now */
}

Test(kv_remote, stopping_the_node_mid_read_ends_every_call_once)
{
	struct tp_fake_opts fo = {.latency_us = 2000000, .seed = seed_of()};
	setup(&fo);
	remote_put(&m1, "slow-0", 0);
	remote_put(&m1, "slow-1", 0);
	stopping = call_new(2);
	call_add(stopping, "slow-0", 0);
	call_add(stopping, "slow-1", 0);
	nf_on_reactor(start_then_flag, stopping, 10000);
	cr_assert_eq(stopping->ret, 0);
	teardown();
	cr_assert_eq(stopping->calls, 1, "the callback ran %d times",
		      stopping->calls);
	free(stopping);
}

/* Is this node key's owner in the current ring? */
struct own_q {
	const char *key;
	bool self;
};

static void own_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct own_q *q = arg;
	const struct mb_api *mb = svc_find_membership(&nf.ctx);
	const struct svc_cluster *cl = svc_find_cluster(&nf.ctx);
	struct ring *ring = mb->ring();
	unsigned o;
	cr_assert_eq(ring_owners(ring, q->key, strlen(q->key), 1, &o), 1);
	q->self = strcmp(ring_member(ring, o), cl->self_id) == 0;
	nf_done();
}

static bool reads_sent(void *arg)
{
	return nf_inflight() >= *(unsigned *)arg;
}

/*
 * m1 is a ring member (its directory shard is never asked: the keys are
 * this node's to own). A reload drops it from the ring while its pages are
 * on their way: the leave event fails the reads at once (kv's subscriber),
 * and from then on its pages are misses without a read.
 */
Test(kv_remote, a_member_leaving_the_ring_mid_read_fails_its_reads_at_once)
{
	struct tp_fake_opts fo = {.latency_us = 100, .seed = seed_of()};
	setup_peers(&fo, "127.0.0.2:31999");
	char names[6][40];
	unsigned n = 0;
	for (unsigned i = 0; i < 200 && n < 6; i++) {
		struct own_q q = {names[n], false};
		snprintf(names[n], sizeof(names[n]), "ring-%u", i);
		nf_on_reactor(own_run, &q, 10000);
		if (q.self)
			remote_put(&m1, names[n++], 0);
	}
	cr_assert_eq(n, 6);
	/* the reads take 30 s, their timeout 40 s, the call's deadline 45 s:
	 * only the leave event ends them within 10 s */
	fo.latency_us = 30000000;
	nf_set_faults(&fo);
	struct call *c = call_new(2);
	for (unsigned i = 0; i < n; i++)
		call_add(c, names[i], 0);
	uint64_t t0 = pc_now_ns();
	nf_post(nf.grp, call_run, c);
	/* every read is on its way before the member leaves */
	cr_assert(nf_until(reads_sent, &n, 20000),
		  "%u of %u reads were sent", nf_inflight(), n);
	struct pc_settings fresh = nf.s;
	fresh.peers = "";
	cr_assert_eq(pc_modules_reload(&nf.ctx, &fresh), 0);
	nf_wait(60000);
	uint64_t ms = (pc_now_ns() - t0) / 1000000u;
	cr_assert_eq(c->ret, 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert(!c->ok[i]);
	cr_assert_lt(ms, 10000, "the reads waited %lu ms for a departed "
		     "member (their latency is 30 s)", (unsigned long)ms);
	cr_assert_eq(nf_inflight(), 0, "reads to a departed member still on "
		     "their way");
	assert_once(c);
	free(c);
	/* departed: a miss without a read, even with the member fast again */
	fo.latency_us = 100;
	nf_set_faults(&fo);
	c = call_new(2);
	call_add(c, names[0], 0);
	call_do(c, 10000);
	cr_assert(!c->ok[0], "a departed member's page was read");
	free(c);
	assert_budget_back();
	teardown();
}

/* exists counts the leading keys whose records name a live producer (the
 * pages themselves are not read); remove withdraws the records of other
 * members' pages too, and their gets miss afterwards. */
Test(kv_remote, exists_and_remove_cover_other_members_pages)
{
	setup(NULL);
	remote_put(&m1, "e-0", 0);
	remote_put(&m2, "e-1", 0);
	remote_put(&m1, "e-3", 0);
	struct call *c = call_new(3);
	call_add(c, "e-0", 0);
	call_add(c, "e-1", 0);
	call_add(c, "e-2", 0); /* nobody has it: the count stops here */
	call_add(c, "e-3", 0);
	call_do(c, 10000);
	cr_assert_eq(c->count, 2);
	assert_once(c);
	free(c);
	c = call_new(4);
	call_add(c, "e-1", 0);
	call_add(c, "e-2", 0);
	call_do(c, 10000);
	cr_assert(c->ok[0] && !c->ok[1], "remove: %d %d", c->ok[0], c->ok[1]);
	free(c);
	c = call_new(2);
	call_add(c, "e-0", 0);
	call_add(c, "e-1", 0);
	call_add(c, "e-3", 0);
	call_do(c, 10000);
	cr_assert(call_check(c, 0, 0) && !c->ok[1] && call_check(c, 2, 0));
	free(c);
	c = call_new(3);
	call_add(c, "e-0", 0);
	call_add(c, "e-1", 0);
	call_do(c, 10000);
	cr_assert_eq(c->count, 1);
	free(c);
	assert_budget_back();
	teardown();
}

/* ------------------------------------------------------ the read cache */

/* Withdraw key's records from this node's directory (placement), as if
 * the directory had lost them: only a read cache can still find them. */
struct unpub {
	const char *key;
};

static void unpub_done(void *arg)
{
	(void)arg;
	nf_done();
}

static void unpub_run(struct rx_reactor *r, void *arg)
{
	struct unpub *u = arg;
	const struct pl_ops *pl = svc_find_placement(&nf.ctx);
	size_t len = strlen(u->key);
	struct dir_keys k = {&u->key, &len, 1};
	if (pl->unpublish(r, &k, NULL, NULL, NULL, 0, unpub_done, NULL) < 0)
		nf_done();
}

static void dir_forget(const char *key)
{
	struct unpub u = {key};
	nf_on_reactor(unpub_run, &u, 10000);
}

/* One call of kind over keys[0, n) (version ver each); returns it. */
static struct call *call_keys(int kind, const char *const *keys, unsigned n,
			      unsigned ver)
{
	struct call *c = call_new(kind);
	for (unsigned i = 0; i < n; i++)
		call_add(c, keys[i], ver);
	call_do(c, 10000);
	return c;
}

/*
 * directory_read_cache_ttl: a get learns records, and later gets and
 * exists of those keys need no lookup (here: the directory no longer has
 * them, and they still hit). A cached record whose page was replaced or
 * deleted since does not read (its header says so), and the key is looked
 * up again in the same call: the new version, or a miss; never the old
 * bytes. A remove through this node forgets the key.
 */
Test(kv_remote, the_read_cache_skips_lookups_and_never_serves_old_pages)
{
	nf_settings(16);
	nf.s.directory_read_cache_ttl_ms = 60000;
	nf_start(mods, PC_ARRAY_LEN(mods), NULL);
	nf_member_new(&m1, "127.0.0.2:31999", "127.0.0.2:32000", 8);
	nf_member_new(&m2, "127.0.0.3:31999", "127.0.0.3:32000", 8);
	static const char *const keys[] = {"rc-0", "rc-1", "rc-2", "rc-3",
					   "rc-4", "rc-5"};
	enum { N = PC_ARRAY_LEN(keys) };
	for (unsigned i = 0; i < N; i++)
		remote_put(i % 2 ? &m2 : &m1, keys[i], 0);
	for (int kind = 1; kind <= 2; kind++) { /* fetch, then get */
		struct call *c = call_keys(kind, keys, N, 0);
		for (unsigned i = 0; i < N; i++)
			cr_assert(call_check(c, i, 0), "%s missed", keys[i]);
		free(c);
	}
	for (unsigned i = 0; i < N; i++)
		dir_forget(keys[i]);
	struct call *c = call_keys(2, keys, N, 0);
	for (unsigned i = 0; i < N; i++)
		cr_assert(call_check(c, i, 0), "%s: the cache did not answer",
			  keys[i]);
	free(c);
	c = call_keys(3, keys, N, 0);
	cr_assert_eq(c->count, N);
	free(c);
	/* rc-0 and rc-3 replaced on their producers (the directory has the
	 * new records; the new pages are a byte longer); rc-2's page deleted
	 * there; rc-4 removed through this node (its page stays on m1, and
	 * is no longer found). */
	remote_put(&m1, "rc-0", 1);
	remote_put(&m2, "rc-3", 1);
	cr_assert_eq(pool_delete(m1.pool, "rc-2", 4), 0);
	c = call_new(4);
	call_add(c, "rc-4", 0);
	call_do(c, 10000);
	free(c);
	/* A get (any length: the stale record's read fails, the key is
	 * looked up again; last, so that its place ends the staging block
	 * and a page written past it is seen by ASan), and a fetch of the
	 * new length (the stale record is not used). */
	static const char *const changed[] = {"rc-0", "rc-3"};
	for (int kind = 2; kind >= 1; kind--) {
		c = call_new(kind);
		call_add(c, "rc-2", 0);
		call_add(c, "rc-4", 0);
		call_add(c, "rc-1", 0);
		call_add(c, changed[kind - 1], 1);
		call_do(c, 10000);
		cr_assert(!c->ok[0], "rc-2: a deleted page was served");
		cr_assert(!c->ok[1], "rc-4: removed, still served");
		cr_assert(call_check(c, 2, 0));
		cr_assert(call_check(c, 3, 1), "%s: not the new version",
			  changed[kind - 1]);
		assert_once(c);
		free(c);
	}
	assert_budget_back();
	teardown();
}

/* The cache of a node with this ttl, m1 a ring member. */
static void setup_cache(unsigned ttl_ms)
{
	nf_settings(16);
	nf.s.directory_read_cache_ttl_ms = ttl_ms;
	free(nf.s.peers);
	nf.s.peers = strdup("127.0.0.2:31999");
	nf.s.directory_replicas = 1;
	nf_start(mods, PC_ARRAY_LEN(mods), NULL);
	nf_member_new(&m1, "127.0.0.2:31999", "127.0.0.2:32000", 8);
	nf_member_new(&m2, "127.0.0.3:31999", "127.0.0.3:32000", 8);
}

/* Put key on m2, read it once (the cache learns its record), then take
 * its record out of the directory. */
static void learn_then_forget(const char *key)
{
	remote_put(&m2, key, 0);
	struct call *c = call_keys(2, &key, 1, 0);
	cr_assert(call_check(c, 0, 0), "%s missed", key);
	free(c);
	dir_forget(key);
}

/* A cached record lives directory_read_cache_ttl. */
Test(kv_remote, the_read_cache_forgets_after_its_ttl)
{
	setup_cache(1000);
	const char *key = "t-0";
	learn_then_forget(key);
	struct call *c = call_keys(2, &key, 1, 0);
	cr_assert(call_check(c, 0, 0), "t-0: the cache did not answer");
	free(c);
	usleep(1200000);
	c = call_keys(2, &key, 1, 0);
	cr_assert(!c->ok[0], "a record outlived its ttl");
	free(c);
	teardown();
}

/* A member leaving the ring empties the cache (a departure changes the
 * producers' RDMA keys, docs/security.md). */
Test(kv_remote, the_read_cache_is_emptied_when_a_member_leaves)
{
	setup_cache(60000);
	const char *key = "l-0";
	learn_then_forget(key);
	struct call *c = call_keys(2, &key, 1, 0);
	cr_assert(call_check(c, 0, 0), "l-0: the cache did not answer");
	free(c);
	struct pc_settings fresh = nf.s;
	fresh.peers = "";
	cr_assert_eq(pc_modules_reload(&nf.ctx, &fresh), 0);
	c = call_keys(2, &key, 1, 0);
	cr_assert(!c->ok[0], "the cache outlived a member's departure");
	free(c);
	teardown();
}
