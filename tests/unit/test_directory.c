/*
 * tests/unit/test_directory.c — the p2p directory (modules/directory.c)
 * across a multi-member ring, in one process: the node under test (fake
 * transport, rpc server, cluster, directory on one reactor) and two fake
 * owners — RPC servers on 127.0.0.1 of the test's own, on a reactor group
 * of their own, serving dir.get / dir.put / dir.del from a small table
 * (with the conditional delete of docs/protocol.md) and able to freeze
 * (hold every call unanswered).
 *
 * Covers: records land on their owners (replicas included, this node's
 * share in its own shard) with the producer's announcement; lookups fall
 * back to the next replica; conditional unpublish (producer, generation);
 * a frozen owner is skipped and a lookup still ends within its deadline;
 * a membership change (reload) moves ownership and fails calls to the
 * member that left at once; the dir.* server side (who may publish, a
 * producer's restart drops its stale records).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/placement.h"
#include "modules/placement_wire.h"
#include "modules/walk.h"
#include "reactor/group.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "storage/ring.h"
#include "testutil.h"
#include "tests/fake/node_fake.h"

static const struct pc_module *const mods[] = {
	&nf_mod_transport, &pc_mod_rpc_server, &pc_mod_cluster,
	&pc_mod_directory,
};

/* ------------------------------------------------------- fake owners */

#define OWN_RECS 1024
#define OWNERS 2
#define HELD_MAX 64

struct own_rec {
	bool used;
	char key[64];
	struct dir_rec rec;
};

struct owner {
	struct rpc_server *srv;
	uint16_t port;
	char id[64];
	pthread_mutex_t mu;            /* the table and counters */
	struct own_rec recs[OWN_RECS];
	unsigned calls[3];             /* get, put, del */
	unsigned get_keys, get_max;    /* keys dir.get asked: all, most in one */
	char announced[64];            /* dir.put's producer */
	uint64_t inc;
	bool frozen;                   /* reactor thread */
	struct rpc_call *held[HELD_MAX];
	unsigned nheld;                /* written on the reactor, under mu */
};

static struct owner own[OWNERS];
static struct rx_group *own_grp;

static struct owner *owner_of(struct rpc_call *call)
{
	for (unsigned i = 0; i < OWNERS; i++)
		if (own[i].srv == rpc_call_server(call))
			return &own[i];
	cr_assert_fail("a call to no owner");
	return NULL;
}

static struct own_rec *own_find(struct owner *o, const char *k, uint32_t n)
{
	for (unsigned i = 0; i < OWN_RECS; i++)
		if (o->recs[i].used && strlen(o->recs[i].key) == n &&
		    memcmp(o->recs[i].key, k, n) == 0)
			return &o->recs[i];
	return NULL;
}

/* A frozen owner holds the call (answered when it thaws). */
static bool own_hold(struct owner *o, struct rpc_call *call)
{
	if (!o->frozen)
		return false;
	pthread_mutex_lock(&o->mu);
	cr_assert_lt(o->nheld, HELD_MAX);
	o->held[o->nheld++] = call;
	pthread_mutex_unlock(&o->mu);
	return true;
}

/* The calls owner i holds (frozen), from any thread. */
static unsigned own_held(unsigned i)
{
	pthread_mutex_lock(&own[i].mu);
	unsigned n = own[i].nheld;
	pthread_mutex_unlock(&own[i].mu);
	return n;
}

static int rd_cstr(struct mp_rd *p, char *out, size_t cap)
{
	const char *s;
	uint32_t n;
	if (mp_rd_str(p, &s, &n) < 0 || n >= cap)
		return -1;
	memcpy(out, s, n);
	out[n] = '\0';
	return 0;
}

static void o_get(struct rpc_call *call, struct mp_rd *p)
{
	struct owner *o = owner_of(call);
	if (own_hold(o, call))
		return;
	uint32_t n;
	cr_assert_eq(mp_rd_array(p, &n), 0);
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	pthread_mutex_lock(&o->mu);
	o->calls[0]++;
	o->get_keys += n;
	o->get_max = PC_MAX(o->get_max, n);
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		cr_assert_eq(mp_rd_str(p, &k, &kl), 0);
		struct own_rec *e = own_find(o, k, kl);
		if (!e) {
			msgpack_pack_nil(pk);
			continue;
		}
		pl_rec_pack(pk, &e->rec);
	}
	pthread_mutex_unlock(&o->mu);
	rpc_reply_end(call);
}

static void o_put(struct rpc_call *call, struct mp_rd *p)
{
	struct owner *o = owner_of(call);
	if (own_hold(o, call))
		return;
	uint32_t n, two, seven, three;
	unsigned stored = 0;
	cr_assert_eq(mp_rd_array(p, &n), 0);
	pthread_mutex_lock(&o->mu);
	o->calls[1]++;
	for (uint32_t i = 0; i < n; i++) {
		char key[64];
		struct dir_rec r = {.found = true};
		uint64_t rkey, len;
		cr_assert(mp_rd_array(p, &two) == 0 && two == 2);
		cr_assert_eq(rd_cstr(p, key, sizeof(key)), 0);
		cr_assert(mp_rd_array(p, &seven) == 0 && seven == 7);
		cr_assert(rd_cstr(p, r.node, sizeof(r.node)) == 0 &&
			  rd_cstr(p, r.data, sizeof(r.data)) == 0 &&
			  mp_rd_uint(p, &r.addr) == 0 &&
			  mp_rd_uint(p, &rkey) == 0 &&
			  mp_rd_uint(p, &len) == 0 &&
			  mp_rd_uint(p, &r.gen) == 0 &&
			  mp_rd_bool(p, &r.resident) == 0);
		r.rkey = (uint32_t)rkey;
		r.len = (uint32_t)len;
		struct own_rec *e = own_find(o, key, (uint32_t)strlen(key));
		for (unsigned j = 0; !e && j < OWN_RECS; j++)
			if (!o->recs[j].used)
				e = &o->recs[j];
		cr_assert(e, "the fake owner's table is full");
		e->used = true;
		snprintf(e->key, sizeof(e->key), "%s", key);
		e->rec = r;
		stored++;
	}
	cr_assert(mp_rd_array(p, &three) == 0 && three == 3,
		  "dir.put without the producer's announcement");
	char data[64];
	cr_assert(rd_cstr(p, o->announced, sizeof(o->announced)) == 0 &&
		  rd_cstr(p, data, sizeof(data)) == 0 &&
		  mp_rd_uint(p, &o->inc) == 0);
	pthread_mutex_unlock(&o->mu);
	rpc_reply_uint(call, stored);
}

static void o_del(struct rpc_call *call, struct mp_rd *p)
{
	struct owner *o = owner_of(call);
	if (own_hold(o, call))
		return;
	uint32_t n, three;
	cr_assert_eq(mp_rd_array(p, &n), 0);
	bool *ok = calloc(n ? n : 1, sizeof(*ok));
	cr_assert(ok);
	pthread_mutex_lock(&o->mu);
	o->calls[2]++;
	for (uint32_t i = 0; i < n; i++) {
		const char *k;
		uint32_t kl;
		char node[64] = "";
		uint64_t gen;
		cr_assert(mp_rd_array(p, &three) == 0 && three == 3);
		cr_assert_eq(mp_rd_str(p, &k, &kl), 0);
		bool any = mp_peek(p) == MP_T_NIL;
		if (any)
			mp_rd_nil(p);
		else
			cr_assert_eq(rd_cstr(p, node, sizeof(node)), 0);
		cr_assert_eq(mp_rd_uint(p, &gen), 0);
		struct own_rec *e = own_find(o, k, kl);
		ok[i] = e && (any || (strcmp(e->rec.node, node) == 0 &&
				      (gen == 0 || e->rec.gen == gen)));
		if (ok[i])
			e->used = false;
	}
	pthread_mutex_unlock(&o->mu);
	rpc_reply_bools(call, ok, n);
	free(ok);
}

static const struct rpc_method own_methods[] = {
	{"dir.get", o_get, 0, "fake owner"},
	{"dir.put", o_put, 0, "fake owner"},
	{"dir.del", o_del, 0, "fake owner"},
	{NULL, NULL, 0, NULL},
};

static void own_accept(struct rx_listener *l, int fd, void *arg)
{
	struct owner *o = arg;
	rpc_server_accept(o->srv, rx_listener_reactor(l), fd, false);
}

static void own_listen(struct rx_reactor *r, void *arg)
{
	(void)arg;
	for (unsigned i = 0; i < OWNERS; i++) {
		int err;
		struct rx_listener *l = rx_listen_tcp(r, "127.0.0.1", 0, false,
						      64, own_accept, &own[i],
						      &err);
		cr_assert(l, "listen: %d", err);
		own[i].port = rx_listener_port(l);
		snprintf(own[i].id, sizeof(own[i].id), "127.0.0.1:%u",
			 own[i].port);
	}
	nf_done();
}

/* Thaw (answer what was held) or freeze owner i, on its reactor. */
struct freeze { unsigned i; bool on; };

static void own_freeze_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct freeze *f = arg;
	struct owner *o = &own[f->i];
	o->frozen = f->on;
	if (!f->on) {
		pthread_mutex_lock(&o->mu);
		unsigned n = o->nheld;
		o->nheld = 0;
		pthread_mutex_unlock(&o->mu);
		for (unsigned k = 0; k < n; k++)
			rpc_reply_error(o->held[k], RPC_E_UNAVAILABLE,
					"was frozen");
	}
	nf_done();
}

static void own_freeze(unsigned i, bool on)
{
	struct freeze f = {i, on};
	nf_on_group(own_grp, own_freeze_run, &f, 10000);
}

static void owners_start(void)
{
	struct rpc_limits lim = {.max_message_bytes = 1 << 20,
				 .max_elements = 1 << 16, .max_depth = 16,
				 .max_inflight = 256, .max_connections = 64,
				 .max_fds = 0};
	const struct rpc_method *tables[] = {own_methods};
	for (unsigned i = 0; i < OWNERS; i++) {
		memset(&own[i], 0, sizeof(own[i]));
		pthread_mutex_init(&own[i].mu, NULL);
		cr_assert_eq(rpc_server_new(&own[i].srv, &lim, tables, 1, NULL,
					    -1, 1), 0);
	}
	struct rx_params p;
	rx_params_default(&p);
	cr_assert_eq(rx_group_start(&own_grp, 1, &p, NULL), 0);
	nf_on_group(own_grp, own_listen, NULL, 10000);
}

static void owners_stop(void)
{
	for (unsigned i = 0; i < OWNERS; i++)
		own_freeze(i, false);
	rx_group_stop(own_grp);
	rx_group_join(own_grp);
	for (unsigned i = 0; i < OWNERS; i++)
		rpc_server_free(own[i].srv);
}

static bool own_has(unsigned i, const char *key, struct dir_rec *out)
{
	pthread_mutex_lock(&own[i].mu);
	struct own_rec *e = own_find(&own[i], key, (uint32_t)strlen(key));
	if (e && out)
		*out = e->rec;
	pthread_mutex_unlock(&own[i].mu);
	return e != NULL;
}

static void own_drop(unsigned i, const char *key)
{
	pthread_mutex_lock(&own[i].mu);
	struct own_rec *e = own_find(&own[i], key, (uint32_t)strlen(key));
	if (e)
		e->used = false;
	pthread_mutex_unlock(&own[i].mu);
}

/* Records owner i holds. */
static unsigned own_count(unsigned i)
{
	unsigned n = 0;
	pthread_mutex_lock(&own[i].mu);
	for (unsigned j = 0; j < OWN_RECS; j++)
		n += own[i].recs[j].used;
	pthread_mutex_unlock(&own[i].mu);
	return n;
}

static unsigned own_calls(unsigned i, unsigned kind)
{
	pthread_mutex_lock(&own[i].mu);
	unsigned n = own[i].calls[kind];
	pthread_mutex_unlock(&own[i].mu);
	return n;
}

/* ------------------------------------------------- the node under test */

static char self_id[160];

static void setup_t(unsigned replicas, unsigned timeout_ms)
{
	owners_start();
	nf_settings(8);
	nf.s.rpc_port = 0;
	free(nf.s.socket);
	nf.s.socket = strdup("");
	nf.s.directory_replicas = replicas;
	nf.s.rpc_timeout_ms = timeout_ms;
	nf.s.peer_probe_interval_ms = 60000; /* suspect stays suspect */
	nf.s.member_ttl_ms = 300; /* a move's removals wait this long */
	char peers[200];
	snprintf(peers, sizeof(peers), "%s,%s", own[0].id, own[1].id);
	free(nf.s.peers);
	nf.s.peers = strdup(peers);
	nf_start(mods, PC_ARRAY_LEN(mods), NULL);
	const struct svc_cluster *cl = svc_find_cluster(&nf.ctx);
	snprintf(self_id, sizeof(self_id), "%s", cl->self_id);
	/* Ownership follows from the ids (ports are ephemeral): say them. */
	printf("test_directory: node %s, owners %s %s\n", self_id, own[0].id,
	       own[1].id);
	fflush(stdout);
}

static void setup(unsigned replicas)
{
	setup_t(replicas, 1000);
}

static void teardown(void)
{
	nf_stop();
	owners_stop();
}

/* Owners of key in the current ring: 0, 1 (fake owners) or 2 (self). */
struct owners_q {
	const char *key;
	unsigned n, who[4];
	uint64_t epoch;
};

static void owners_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	struct owners_q *q = arg;
	const struct mb_api *mb = svc_find_membership(&nf.ctx);
	struct ring *ring = mb->ring();
	unsigned idx[4];
	q->epoch = mb->epoch();
	q->n = ring_owners(ring, q->key, strlen(q->key),
			   (unsigned)nf.s.directory_replicas, idx);
	for (unsigned i = 0; i < q->n; i++) {
		const char *m = ring_member(ring, idx[i]);
		q->who[i] = strcmp(m, own[0].id) == 0   ? 0
			    : strcmp(m, own[1].id) == 0 ? 1
							: 2;
	}
	nf_done();
}

static struct owners_q owners(const char *key)
{
	struct owners_q q = {.key = key};
	nf_on_reactor(owners_run, &q, 10000);
	return q;
}

/* Placement calls: kind 0 publish, 1 lookup, 2 unpublish, 3 move. */
#define N 64

struct plc {
	int kind;
	unsigned n;
	char kb[N][24];
	const char *k[N];
	size_t kl[N];
	struct dir_rec rec[N];
	bool flags[N];
	const char *node;
	uint64_t gens[N];
	bool use_gens;
	struct ring *from[2]; /* move: the rings placed against */
	unsigned nfrom;
	uint64_t deadline_ns;
	unsigned flags_lookup; /* lookup: PL_LOOKUP_* */
	int ret;
	int calls;
};

static void plc_done(void *arg)
{
	struct plc *c = arg;
	if (++c->calls == 1)
		nf_done();
}

static void plc_run(struct rx_reactor *r, void *arg)
{
	struct plc *c = arg;
	const struct pl_ops *pl = svc_find_placement(&nf.ctx);
	struct dir_keys k = {c->k, c->kl, c->n};
	c->calls = 0;
	if (c->kind == 0)
		c->ret = pl->publish(r, &k, c->rec, c->flags, c->deadline_ns,
				     plc_done, c);
	else if (c->kind == 1)
		c->ret = pl->lookup(r, &k, c->rec, c->flags_lookup,
				    c->deadline_ns, plc_done, c);
	else if (c->kind == 3)
		c->ret = pl->move(r, &k, c->rec, c->flags, c->from, c->nfrom,
				  c->deadline_ns, plc_done, c);
	else
		c->ret = pl->unpublish(r, &k, c->node,
				       c->use_gens ? c->gens : NULL, c->flags,
				       c->deadline_ns, plc_done, c);
	if (c->ret < 0)
		nf_done();
}

static struct plc *plc_new(int kind, const char *prefix, unsigned n)
{
	struct plc *c = calloc(1, sizeof(*c));
	cr_assert(c);
	c->kind = kind;
	c->n = n;
	for (unsigned i = 0; i < n; i++) {
		snprintf(c->kb[i], sizeof(c->kb[i]), "%s-%u", prefix, i);
		c->k[i] = c->kb[i];
		c->kl[i] = strlen(c->kb[i]);
	}
	return c;
}

static void plc_do(struct plc *c)
{
	nf_on_reactor(plc_run, c, 20000);
	cr_assert_eq(c->ret, 0);
	usleep(20000);
	cr_assert_eq(c->calls, 1, "done ran %d times", c->calls);
}

static struct dir_rec rec_of(unsigned i, uint64_t gen)
{
	struct dir_rec r = {.found = true, .resident = true,
			    .addr = 0x10000 + i * 4096, .rkey = 77,
			    .len = 4096, .gen = gen};
	snprintf(r.node, sizeof(r.node), "%s", self_id);
	snprintf(r.data, sizeof(r.data), "127.0.0.1:2");
	return r;
}

/*
 * Call method of this node's directory (over TCP) with params [[key]]
 * (del: [[[key, nil, 0]]]); the reply, to free with rpc_sync_reply_free.
 */
static struct rpc_sync_reply self_call(const char *method, const char *key,
				       bool del)
{
	const struct svc_cluster *cl = svc_find_cluster(&nf.ctx);
	int err;
	struct rpc_sync_opts so;
	rpc_sync_opts_default(&so);
	struct rpc_sync *s = rpc_sync_new(cl->self_id, &so, &err);
	cr_assert(s, "rpc_sync_new: %d", err);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_array(&pk, 1);
	if (del)
		msgpack_pack_array(&pk, 3);
	mp_pack_cstr(&pk, key);
	if (del) {
		msgpack_pack_nil(&pk);
		msgpack_pack_uint64(&pk, 0);
	}
	struct rpc_sync_reply rep;
	cr_assert_eq(rpc_sync_call(s, method, sb.data, sb.size, NULL, 0, 5000,
				   &rep), 0);
	cr_assert_eq(rep.res.err, 0);
	msgpack_sbuffer_destroy(&sb);
	rpc_sync_free(s);
	return rep;
}

/* This node's own shard, through its dir.get. */
static bool self_has(const char *key, uint64_t *gen)
{
	struct rpc_sync_reply rep = self_call("dir.get", key, false);
	uint32_t n, seven;
	cr_assert(mp_rd_array(&rep.res.result, &n) == 0 && n == 1);
	bool found = mp_peek(&rep.res.result) != MP_T_NIL;
	if (found) {
		const char *sv;
		uint32_t sl;
		uint64_t u;
		cr_assert(mp_rd_array(&rep.res.result, &seven) == 0);
		mp_rd_str(&rep.res.result, &sv, &sl);
		mp_rd_str(&rep.res.result, &sv, &sl);
		mp_rd_uint(&rep.res.result, &u);
		mp_rd_uint(&rep.res.result, &u);
		mp_rd_uint(&rep.res.result, &u);
		mp_rd_uint(&rep.res.result, gen);
	}
	rpc_sync_reply_free(&rep);
	return found;
}

/* ---------------------------------------------------------------- tests */

/* N records of this node, keys prefix-i with generations 10 + i,
 * published. */
static struct plc *published(const char *prefix)
{
	struct plc *c = plc_new(0, prefix, N);
	for (unsigned i = 0; i < N; i++)
		c->rec[i] = rec_of(i, 10 + i);
	plc_do(c);
	return c;
}

Test(directory, records_land_on_their_owners_and_lookups_fall_back)
{
	setup(2);
	struct plc *c = published("own");
	unsigned on[3] = {0};
	for (unsigned i = 0; i < N; i++) {
		cr_assert(c->flags[i], "%s not stored", c->kb[i]);
		struct owners_q q = owners(c->kb[i]);
		cr_assert_eq(q.n, 2);
		bool want[3] = {false, false, false};
		for (unsigned a = 0; a < q.n; a++)
			want[q.who[a]] = true;
		uint64_t gen = 0;
		struct dir_rec got;
		for (unsigned o = 0; o < OWNERS; o++) {
			cr_assert_eq(own_has(o, c->kb[i], &got), want[o],
				     "%s on owner %u: %d", c->kb[i], o, !want[o]);
			if (want[o])
				cr_assert(got.gen == 10 + i && got.len == 4096 &&
					  strcmp(got.node, self_id) == 0);
		}
		cr_assert_eq(self_has(c->kb[i], &gen), want[2], "%s here",
			     c->kb[i]);
		if (want[2])
			cr_assert_eq(gen, 10 + i);
		for (unsigned o = 0; o < 3; o++)
			on[o] += want[o];
	}
	/* the ring spreads them: every member owns some */
	cr_assert(on[0] && on[1] && on[2], "%u %u %u", on[0], on[1], on[2]);
	/* one dir.put per owner for the whole batch */
	for (unsigned o = 0; o < OWNERS; o++)
		cr_assert_eq(own_calls(o, 1), 1, "owner %u: %u dir.put calls",
			     o, own_calls(o, 1));
	/* the producer announced itself, with an incarnation */
	for (unsigned o = 0; o < OWNERS; o++) {
		cr_assert_str_eq(own[o].announced, self_id);
		cr_assert_neq(own[o].inc, 0);
	}
	/* a record missing on its first owner is found on the second */
	unsigned dropped = 0;
	for (unsigned i = 0; i < N; i++) {
		struct owners_q q = owners(c->kb[i]);
		if (q.who[0] < OWNERS) {
			own_drop(q.who[0], c->kb[i]);
			dropped++;
		}
	}
	cr_assert_gt(dropped, 0);
	struct plc *l = plc_new(1, "own", N);
	unsigned gets0[OWNERS] = {own_calls(0, 0), own_calls(1, 0)};
	plc_do(l);
	/* a round asks each owner once: at most two rounds here */
	for (unsigned o = 0; o < OWNERS; o++)
		cr_assert_leq(own_calls(o, 0) - gets0[o], 2);
	for (unsigned i = 0; i < N; i++) {
		cr_assert(l->rec[i].found, "%s not found", l->kb[i]);
		cr_assert_eq(l->rec[i].gen, 10 + i);
	}
	struct plc *none = plc_new(1, "nobody", 8);
	plc_do(none);
	for (unsigned i = 0; i < 8; i++)
		cr_assert(!none->rec[i].found);
	free(c);
	free(l);
	free(none);
	teardown();
}

/* Unpublish by (producer, generation) removes only that; by producer any
 * of its generations; the other producer's records stay — on every owner
 * and in this node's shard. */
Test(directory, unpublish_is_conditional_on_producer_and_generation)
{
	setup(2);
	struct plc *c = plc_new(0, "cond", 16);
	for (unsigned i = 0; i < 16; i++)
		c->rec[i] = rec_of(i, 100 + i);
	plc_do(c);
	/* stale generation for even keys, the right one for odd keys */
	struct plc *u = plc_new(2, "cond", 16);
	u->node = self_id;
	u->use_gens = true;
	for (unsigned i = 0; i < 16; i++)
		u->gens[i] = i % 2 ? 100 + i : 99;
	plc_do(u);
	for (unsigned i = 0; i < 16; i++)
		cr_assert_eq(u->flags[i], i % 2 == 1, "%s", u->kb[i]);
	/* another producer's name removes nothing */
	struct plc *v = plc_new(2, "cond", 16);
	v->node = "127.0.0.9:1";
	plc_do(v);
	for (unsigned i = 0; i < 16; i++)
		cr_assert(!v->flags[i]);
	struct plc *l = plc_new(1, "cond", 16);
	plc_do(l);
	for (unsigned i = 0; i < 16; i++) {
		cr_assert_eq(l->rec[i].found, i % 2 == 0, "%s", l->kb[i]);
		struct owners_q q = owners(l->kb[i]);
		for (unsigned a = 0; a < q.n; a++) {
			uint64_t gen;
			bool has = q.who[a] == 2 ? self_has(l->kb[i], &gen)
						 : own_has(q.who[a], l->kb[i],
							   NULL);
			cr_assert_eq(has, i % 2 == 0, "%s on %u", l->kb[i],
				     q.who[a]);
		}
	}
	/* the producer with no generations: any of its records */
	struct plc *w = plc_new(2, "cond", 16);
	w->node = self_id;
	plc_do(w);
	for (unsigned i = 0; i < 16; i++)
		cr_assert_eq(w->flags[i], i % 2 == 0);
	plc_do(l);
	for (unsigned i = 0; i < 16; i++)
		cr_assert(!l->rec[i].found);
	free(c);
	free(u);
	free(v);
	free(w);
	free(l);
	teardown();
}

/* An owner that stops answering: a lookup it owns first still ends within
 * its deadline and finds the replica; publishes store on the others and
 * count; the owner becomes suspect and is not asked again. */
Test(directory, a_frozen_owner_is_skipped_within_the_deadline)
{
	setup(2);
	struct plc *c = plc_new(0, "fz", N);
	for (unsigned i = 0; i < N; i++)
		c->rec[i] = rec_of(i, 5);
	plc_do(c);
	own_freeze(0, true);
	struct plc *l = plc_new(1, "fz", N);
	l->deadline_ns = pc_now_ns() + 3000000000ull;
	plc_do(l);
	cr_assert_lt(pc_now_ns(), l->deadline_ns + 3000000000ull,
		     "the lookup outlived its deadline by over 3 s");
	for (unsigned i = 0; i < N; i++)
		cr_assert(l->rec[i].found, "%s: the replica was not asked",
			  l->kb[i]);
	/* suspect now: nothing more goes to it */
	unsigned before = own_calls(0, 0) + own_calls(0, 1);
	unsigned held = own_held(0);
	struct plc *p = plc_new(0, "fz2", N);
	for (unsigned i = 0; i < N; i++)
		p->rec[i] = rec_of(i, 6);
	plc_do(p);
	for (unsigned i = 0; i < N; i++)
		cr_assert(p->flags[i], "%s not stored", p->kb[i]);
	plc_do(l);
	cr_assert_eq(own_calls(0, 0) + own_calls(0, 1), before);
	cr_assert_eq(own_held(0), held, "the suspect owner was called");
	free(c);
	free(l);
	free(p);
	teardown();
}

/* A membership change (a reload dropping owner 1): the epoch grows, owner
 * 1 owns nothing any more, and a lookup waiting on it (frozen, its call
 * held: seen before the reload) ends at once with the leave event instead
 * of at its timeout (30 s) or deadline (40 s). */
static void lookup_async(struct rx_reactor *r, void *arg)
{
	struct plc *c = arg;
	const struct pl_ops *pl = svc_find_placement(&nf.ctx);
	struct dir_keys k = {c->k, c->kl, c->n};
	c->calls = 0;
	c->ret = pl->lookup(r, &k, c->rec, c->flags_lookup, c->deadline_ns,
			    plc_done, c);
	/* not nf_done: plc_done signals when the lookup ends */
}

static bool owner1_holds_a_call(void *arg)
{
	(void)arg;
	return own_held(1) > 0;
}

Test(directory, a_member_leaving_moves_ownership_and_ends_its_calls)
{
	setup_t(1, 30000); /* a call to a frozen owner would wait 30 s */
	/* keys owned (first) by owner 1 */
	struct plc *l = plc_new(1, "mv", N);
	unsigned n1 = 0;
	for (unsigned i = 0; i < N && n1 < 8; i++)
		if (owners(l->kb[i]).who[0] == 1) {
			snprintf(l->kb[n1], sizeof(l->kb[0]), "mv-%u", i);
			l->kl[n1] = strlen(l->kb[n1]);
			n1++;
		}
	cr_assert_gt(n1, 0);
	l->n = n1;
	uint64_t epoch0 = owners("x").epoch;
	own_freeze(1, true);
	l->deadline_ns = pc_now_ns() + 40000000000ull; /* 40 s */
	uint64_t t0 = pc_now_ns();
	nf_post(nf.grp, lookup_async, l);
	/* the lookup's call is on the frozen owner before it leaves */
	cr_assert(nf_until(owner1_holds_a_call, NULL, 20000),
		  "the lookup never reached owner 1");
	struct pc_settings fresh = nf.s;
	fresh.peers = own[0].id;
	cr_assert_eq(pc_modules_reload(&nf.ctx, &fresh), 0);
	/* plc_done signals: wait for it */
	nf_wait(60000);
	uint64_t ms = (pc_now_ns() - t0) / 1000000u;
	cr_assert_eq(l->ret, 0);
	cr_assert_lt(ms, 10000, "the lookup waited %lu ms for a departed "
		     "owner (its call's timeout is 30 s)", (unsigned long)ms);
	struct owners_q q = owners("x");
	cr_assert_gt(q.epoch, epoch0);
	for (unsigned i = 0; i < N; i++) {
		char k[24];
		snprintf(k, sizeof(k), "mv-%u", i);
		cr_assert_neq(owners(k).who[0], 1, "%s still on the departed "
			      "owner", k);
	}
	free(l);
	teardown();
}

/* The current ring, with a reference the caller drops. */
static void ring_take_run(struct rx_reactor *r, void *arg)
{
	(void)r;
	*(struct ring **)arg = ring_ref(svc_find_membership(&nf.ctx)->ring());
	nf_done();
}

static struct ring *ring_take(void)
{
	struct ring *ring = NULL;
	nf_on_reactor(ring_take_run, &ring, 10000);
	return ring;
}

static void peers_set(char *peers)
{
	struct pc_settings fresh = nf.s;
	fresh.peers = peers;
	cr_assert_eq(pc_modules_reload(&nf.ctx, &fresh), 0);
}

/* Does owner who (0, 1: fakes; 2: self) hold key's record? */
static bool holds(unsigned who, const char *key)
{
	uint64_t gen;
	return who == 2 ? self_has(key, &gen) : own_has(who, key, NULL);
}

/* A condition of the test, polled from the test thread. */
static bool moved_off(void *arg)
{
	struct plc *m = arg;
	for (unsigned i = 0; i < m->n; i++)
		if (m->use_gens && holds(m->gens[i], m->kb[i]))
			return false;
	return true;
}

/*
 * A join (owner 1 comes into a ring of owner 0 and this node): move sends
 * each record to the owner it gained and only there; the owner it lost
 * keeps its record for the grace (member_ttl, 300 ms here: nodes still on
 * the old ring look it up there), then drops it; records whose owner did
 * not change are not sent and stay.
 */
Test(directory, a_move_publishes_at_gained_owners_and_removes_at_lost_ones)
{
	setup(1);
	peers_set(own[0].id);
	struct plc *c = plc_new(0, "mvj", N);
	for (unsigned i = 0; i < N; i++)
		c->rec[i] = rec_of(i, 500 + i);
	plc_do(c);
	unsigned before[N];
	for (unsigned i = 0; i < N; i++) {
		struct owners_q q = owners(c->kb[i]);
		cr_assert_eq(q.n, 1);
		before[i] = q.who[0];
		cr_assert(holds(before[i], c->kb[i]), "%s", c->kb[i]);
	}
	struct ring *old = ring_take();
	unsigned puts1 = own_calls(1, 1), moved = 0;
	char both[200];
	snprintf(both, sizeof(both), "%s,%s", own[0].id, own[1].id);
	peers_set(both);
	struct plc *m = plc_new(3, "mvj", N);
	for (unsigned i = 0; i < N; i++)
		m->rec[i] = c->rec[i];
	m->from[0] = old;
	m->nfrom = 1;
	uint64_t t0 = pc_now_ns();
	plc_do(m);
	/* the lost owners of the moved keys, to watch (gens[] reused) */
	struct plc *w = plc_new(1, "mvj", 0);
	for (unsigned i = 0; i < N; i++) {
		unsigned now = owners(m->kb[i]).who[0];
		cr_assert(m->flags[i], "%s not placed", m->kb[i]);
		cr_assert(holds(now, m->kb[i]), "%s not on its owner",
			  m->kb[i]);
		if (now == before[i]) {
			cr_assert(holds(before[i], m->kb[i]), "%s", m->kb[i]);
			continue;
		}
		moved++;
		cr_assert_eq(now, 1u, "%s moved to a member that was there",
			     m->kb[i]);
		snprintf(w->kb[w->n], sizeof(w->kb[0]), "%s", m->kb[i]);
		w->gens[w->n++] = before[i];
	}
	w->use_gens = true;
	cr_assert_gt(moved, 0u);
	cr_assert_lt(moved, N);
	/* one dir.put to owner 1, with only the moved keys */
	cr_assert_eq(own_calls(1, 1), puts1 + 1);
	cr_assert_eq(own_count(1), moved);
	/* the old owners still answer for them until the grace is over */
	if ((pc_now_ns() - t0) / 1000000u < 200)
		cr_assert(!moved_off(w), "removed before the grace");
	cr_assert(nf_until(moved_off, w, 20000), "the old owners kept their "
		  "records after the grace");
	ring_unref(old);
	free(c);
	free(m);
	free(w);
	teardown();
}

/* The server side: who may dir.put here, and a producer's restart. */
static int put_as(struct rpc_sync *s, const char *key, const char *node,
		  const char *data, uint64_t gen, uint64_t inc, char *code)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_array(&pk, 2);
	mp_pack_cstr(&pk, key);
	msgpack_pack_array(&pk, 7);
	mp_pack_cstr(&pk, node);
	mp_pack_cstr(&pk, data);
	msgpack_pack_uint64(&pk, 0x1000);
	msgpack_pack_uint32(&pk, 1);
	msgpack_pack_uint32(&pk, 4096);
	msgpack_pack_uint64(&pk, gen);
	msgpack_pack_true(&pk);
	msgpack_pack_array(&pk, 3);
	mp_pack_cstr(&pk, node);
	mp_pack_cstr(&pk, data);
	msgpack_pack_uint64(&pk, inc);
	struct rpc_sync_reply rep;
	int ret = rpc_sync_call(s, "dir.put", sb.data, sb.size, NULL, 0, 5000,
				&rep);
	cr_assert_eq(ret, 0);
	ret = rep.res.err;
	snprintf(code, 32, "%s", rep.res.code);
	rpc_sync_reply_free(&rep);
	msgpack_sbuffer_destroy(&sb);
	return ret;
}

static struct rpc_sync *sync_new(void)
{
	int err;
	struct rpc_sync_opts so;
	rpc_sync_opts_default(&so);
	so.max_idle = 1; /* one connection: dir.put binds it */
	struct rpc_sync *s = rpc_sync_new(self_id, &so, &err);
	cr_assert(s, "%d", err);
	return s;
}

Test(directory, dir_put_checks_its_producer_and_drops_a_restarted_ones)
{
	setup(1);
	char code[32];
	struct rpc_sync *s = sync_new();
	/* this node's own name */
	cr_assert_eq(put_as(s, "k", self_id, "127.0.0.1:2", 1, 1, code),
		     -EREMOTEIO);
	cr_assert_str_eq(code, RPC_E_FORBIDDEN);
	/* producer and data endpoint on different hosts */
	cr_assert_eq(put_as(s, "k", "127.0.0.5:1", "127.0.0.6:2", 1, 1, code),
		     -EREMOTEIO);
	cr_assert_str_eq(code, RPC_E_FORBIDDEN);
	/* a producer's records, incarnation 1 (a connection binds to it) */
	cr_assert_eq(put_as(s, "p-0", "127.0.0.5:1", "127.0.0.5:2", 3, 1,
			    code), 0);
	cr_assert_eq(put_as(s, "p-1", "127.0.0.5:1", "127.0.0.5:2", 4, 1,
			    code), 0);
	cr_assert_eq(put_as(s, "q-0", "127.0.0.5:1", "127.0.0.5:2", 4, 7,
			    code), -EREMOTEIO, "one connection, two "
		     "incarnations");
	cr_assert_str_eq(code, RPC_E_FORBIDDEN);
	uint64_t gen;
	cr_assert(self_has("p-0", &gen) && gen == 3);
	cr_assert(!self_has("q-0", &gen));
	rpc_sync_free(s);
	/* the producer restarts (incarnation 2, a new connection): its
	 * records of incarnation 1 are stale and dropped */
	s = sync_new();
	cr_assert_eq(put_as(s, "p-2", "127.0.0.5:1", "127.0.0.5:2", 1, 2,
			    code), 0);
	cr_assert(!self_has("p-0", &gen), "a stale record survived a restart");
	cr_assert(!self_has("p-1", &gen));
	cr_assert(self_has("p-2", &gen) && gen == 1);
	rpc_sync_free(s);
	teardown();
}

/* ------------------------------------ this node's own replica, asked first */

/* Owner i's record of key gets generation gen: a publish this node missed. */
static void own_set_gen(unsigned i, const char *key, uint64_t gen)
{
	pthread_mutex_lock(&own[i].mu);
	struct own_rec *e = own_find(&own[i], key, (uint32_t)strlen(key));
	cr_assert(e, "owner %u has no %s", i, key);
	e->rec.gen = gen;
	pthread_mutex_unlock(&own[i].mu);
}

/* Remove key's record from this node's shard alone (its dir.del). */
static void self_del(const char *key)
{
	struct rpc_sync_reply rep = self_call("dir.del", key, true);
	rpc_sync_reply_free(&rep);
}

/* A lookup of the keys kb[idx[0..n)] of c, with flags. */
static struct plc *plc_of(const struct plc *c, const unsigned *idx,
			  unsigned n, unsigned flags)
{
	struct plc *l = calloc(1, sizeof(*l));
	cr_assert(l);
	l->kind = 1;
	l->n = n;
	l->flags_lookup = flags;
	for (unsigned i = 0; i < n; i++) {
		memcpy(l->kb[i], c->kb[idx[i]], sizeof(l->kb[i]));
		l->k[i] = l->kb[i];
		l->kl[i] = strlen(l->kb[i]);
	}
	plc_do(l);
	return l;
}

Test(directory, a_replica_here_answers_before_the_first_owner_is_asked)
{
	setup(2);
	struct plc *c = published("near");
	/* The keys this node holds the second replica of; their first
	 * owners (fakes) get a newer record this node did not see. */
	unsigned second[N], ns = 0, mine = N;
	for (unsigned i = 0; i < N; i++) {
		cr_assert(c->flags[i], "%s not stored", c->kb[i]);
		struct owners_q q = owners(c->kb[i]);
		cr_assert_eq(q.n, 2);
		if (q.who[0] == 2)
			mine = i;
		if (q.who[1] != 2)
			continue;
		own_set_gen(q.who[0], c->kb[i], 100 + i);
		second[ns++] = i;
	}
	cr_assert_gt(ns, 0, "no key has this node second");
	cr_assert_lt(mine, N, "no key has this node first");

	/* Found here, marked as this node's replica, and no owner asked. */
	unsigned gets0[OWNERS] = {own_calls(0, 0), own_calls(1, 0)};
	struct plc *l = plc_of(c, second, ns, 0);
	for (unsigned o = 0; o < OWNERS; o++)
		cr_assert_eq(own_calls(o, 0), gets0[o], "owner %u was asked",
			     o);
	for (unsigned i = 0; i < ns; i++) {
		cr_assert(l->rec[i].found, "%s not found", l->kb[i]);
		cr_assert(l->rec[i].own_replica, "%s not marked", l->kb[i]);
		cr_assert_eq(l->rec[i].gen, 10 + second[i]);
	}

	/* In ring order the first owner answers, with its newer record. */
	struct plc *o = plc_of(c, second, ns, PL_LOOKUP_IN_ORDER);
	cr_assert_gt(own_calls(0, 0) + own_calls(1, 0), gets0[0] + gets0[1]);
	for (unsigned i = 0; i < ns; i++) {
		cr_assert(o->rec[i].found, "%s not found", o->kb[i]);
		cr_assert(!o->rec[i].own_replica);
		cr_assert_eq(o->rec[i].gen, 100 + second[i]);
	}

	/* No replica here: the first owner is asked next, in the same
	 * round as a key this node owns nothing of that goes to that owner
	 * too — one dir.get for both. */
	self_del(c->kb[second[0]]);
	struct owners_q q0 = owners(c->kb[second[0]]);
	unsigned both[2] = {second[0], N};
	for (unsigned i = 0; i < N && both[1] == N; i++) {
		struct owners_q q = owners(c->kb[i]);
		if (q.who[0] == q0.who[0] && q.who[1] != 2)
			both[1] = i;
	}
	cr_assert_lt(both[1], N, "no key of owner %u alone", q0.who[0]);
	unsigned gets1 = own_calls(q0.who[0], 0);
	struct plc *gone = plc_of(c, both, 2, 0);
	cr_assert_eq(own_calls(q0.who[0], 0) - gets1, 1,
		     "%u dir.get calls to the first owner",
		     own_calls(q0.who[0], 0) - gets1);
	cr_assert(gone->rec[0].found && gone->rec[1].found);
	cr_assert(!gone->rec[0].own_replica && !gone->rec[1].own_replica);
	cr_assert_eq(gone->rec[0].gen, 100 + second[0]);
	cr_assert_eq(gone->rec[1].gen, 10 + both[1]);

	/* A key this node is the first owner of: its own record, as
	 * always, marked as from here; asked elsewhere, the second owner
	 * answers with the newer record this node missed. */
	struct owners_q q = owners(c->kb[mine]);
	own_set_gen(q.who[1], c->kb[mine], 200);
	struct plc *first = plc_of(c, &mine, 1, 0);
	cr_assert(first->rec[0].found);
	cr_assert(first->rec[0].own_replica);
	cr_assert_eq(first->rec[0].gen, 10 + mine);
	struct plc *there = plc_of(c, &mine, 1, PL_LOOKUP_ELSEWHERE);
	cr_assert(there->rec[0].found);
	cr_assert(!there->rec[0].own_replica);
	cr_assert_eq(there->rec[0].gen, 200);
	free(there);
	/* ... and when no other owner knows the key, this node answers. */
	own_drop(q.who[1], c->kb[mine]);
	there = plc_of(c, &mine, 1, PL_LOOKUP_ELSEWHERE);
	cr_assert(there->rec[0].found);
	cr_assert(there->rec[0].own_replica);
	cr_assert_eq(there->rec[0].gen, 10 + mine);
	free(there);
	free(c);
	free(l);
	free(o);
	free(gone);
	free(first);
	teardown();
}

/* A lookup of more keys than one RPC carries (DIR_RPC_KEYS, 2048): each
 * owner is asked in several dir.get calls of at most that many keys, all
 * sent at once, and every key gets its answer. */
struct big_lookup {
	unsigned n;
	char (*kb)[24];
	const char **k;
	size_t *kl;
	struct dir_rec *rec;
	int ret, calls;
};

static void big_lookup_done(void *arg)
{
	struct big_lookup *b = arg;
	if (++b->calls == 1)
		nf_done();
}

static void big_lookup_run(struct rx_reactor *r, void *arg)
{
	struct big_lookup *b = arg;
	const struct pl_ops *pl = svc_find_placement(&nf.ctx);
	struct dir_keys k = {b->k, b->kl, b->n};
	b->ret = pl->lookup(r, &k, b->rec, 0, 0, big_lookup_done, b);
	if (b->ret < 0)
		nf_done();
}

Test(directory, a_lookup_of_many_keys_asks_each_owner_in_bounded_rpcs)
{
	setup_t(2, 5000);
	enum { BIG = 9000 };
	struct big_lookup b = {.n = BIG};
	b.kb = calloc(BIG, sizeof(*b.kb));
	b.k = calloc(BIG, sizeof(*b.k));
	b.kl = calloc(BIG, sizeof(*b.kl));
	b.rec = calloc(BIG, sizeof(*b.rec));
	cr_assert(b.kb && b.k && b.kl && b.rec);
	unsigned owned[OWNERS] = {0};
	for (unsigned i = 0; i < BIG; i++) {
		snprintf(b.kb[i], sizeof(b.kb[i]), "many-%u", i);
		b.k[i] = b.kb[i];
		b.kl[i] = strlen(b.kb[i]);
		b.rec[i].found = true; /* the lookup must clear it */
	}
	/* Every key is absent, so each owner of it is asked (this node's
	 * own replica first, locally). */
	for (unsigned i = 0; i < BIG; i++) {
		struct owners_q q = owners(b.kb[i]);
		for (unsigned a = 0; a < q.n; a++)
			if (q.who[a] < OWNERS)
				owned[q.who[a]]++;
	}
	uint64_t yields = walk_yields_total();
	nf_on_reactor(big_lookup_run, &b, 20000);
	cr_assert_eq(b.ret, 0);
	usleep(20000);
	cr_assert_eq(b.calls, 1, "done ran %d times", b.calls);
	/* Each round's walk over the keys went on over loop passes. */
	yields = walk_yields_total() - yields;
	cr_assert_geq(yields, BIG / 512 - 1, "the rounds' walks stopped %llu "
		      "times for the next pass", (unsigned long long)yields);
	for (unsigned i = 0; i < BIG; i++)
		cr_assert(!b.rec[i].found, "%s found", b.kb[i]);
	for (unsigned o = 0; o < OWNERS; o++) {
		pthread_mutex_lock(&own[o].mu);
		unsigned keys = own[o].get_keys, most = own[o].get_max,
			 calls = own[o].calls[0];
		pthread_mutex_unlock(&own[o].mu);
		cr_assert_eq(keys, owned[o], "owner %u asked %u keys, owns %u",
			     o, keys, owned[o]);
		cr_assert_leq(most, 2048, "owner %u: %u keys in one dir.get", o,
			      most);
		cr_assert_geq(calls, (owned[o] + 2047) / 2048, "owner %u: %u "
			      "calls for %u keys", o, calls, owned[o]);
		cr_assert_gt(owned[o], 2048, "owner %u owns only %u keys", o,
			     owned[o]);
	}
	free(b.kb);
	free(b.k);
	free(b.kl);
	free(b.rec);
	teardown();
}
