/*
 * modules/directory.c — the p2p directory (module "directory"): this node's
 * shard of records, the dir.* RPC methods that serve it, and the client
 * side (lookup with replica fallback, publish, unpublish): p2p's placement
 * (modules/placement.h), offered to other modules as the "placement"
 * service (modules/services.h) when mode = p2p.
 *
 * Owns: the shard — DIR_STRIPES hash tables of records, each behind its own
 * mutex held only for a table operation (no I/O, no callback under it), each
 * within directory_max_bytes / DIR_STRIPES (oldest evicted first) — the
 * incarnations producers announced (a small lossy cache), and one RPC client
 * per reactor for talking to other owners. Threads: any reactor serves
 * dir.* and runs client batches; a batch lives on the reactor that started
 * it.
 *
 * Replicas: a record goes to the first directory_replicas owners of its key.
 * A lookup asks the first owner; a key it does not know, or an owner that
 * does not answer, is asked of the next owner, round after round, until
 * found or every owner was asked (the original only fell back on errors).
 * A node that is one of a key's owners looks in its own replica first (no
 * round trip; own_order), and marks what it finds there
 * (dir_rec.own_replica) so that a reader whose read of it fails asks the
 * other owners first (PL_LOOKUP_ELSEWHERE).
 * Deletes are conditional on (producer, generation), so a late delete for an
 * evicted page never removes a newer record of the same key.
 *
 * Who may publish: dir.put carries [node, data, incarnation] of its caller;
 * every record must name that producer, whose host must be the TCP source
 * address (any from loopback), and a connection publishes for one producer
 * and incarnation only (bound on its first dir.put). Unix-socket clients
 * may not dir.put, nor may anyone for this node itself. A key another live
 * producer (a ring member) holds keeps its record. A producer announcing a
 * new incarnation has restarted: its records of earlier ones are dropped
 * from every stripe at once (at most once a second per producer).
 *
 * Frozen owners (the "health" service): an owner that does not answer a dir.*
 * call is reported and becomes suspect; while it is, lookups skip it (the
 * next replica is asked at once; none left: a miss), and publishes and
 * removes leave it out (a record stored on one live owner counts; the
 * suspect owner misses that record, or keeps an older one, until it is
 * published again — a reader that asks it first falls back on "not found";
 * the node itself, answering again, takes its own replica first, and kv
 * asks the others when a record from there does not read: a stale record
 * only ever leads to a validated read or a miss). Every job has a
 * deadline (the caller's, or rpc_timeout): a lookup round that could still
 * fall back gets half of what is left, so a first owner that freezes leaves
 * time for the next one; no round outlives the deadline.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/arena.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/settings.h"
#include "common/sha256.h"
#include "modules/directory.h"
#include "modules/membership.h"
#include "modules/modules.h"
#include "modules/peer_health.h"
#include "modules/placement_wire.h"
#include "modules/walk.h"
#include "reactor/stall.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "storage/ring.h"

#define LOG_MOD "directory"
#define DIR_STRIPES 64
#define DIR_BATCH_MAX 65536   /* keys in one call */
#define DIR_RPC_KEYS 2048     /* keys in one RPC a job sends an owner */
#define DIR_REPLICAS_MAX 8
#define DIR_PRODUCERS 4096    /* incarnations remembered (direct-mapped) */

/* ------------------------------------------------------------------ shard */

/*
 * A record carries its producer's id and data endpoint itself (after the
 * key), so nothing outlives the records: there is no table of names to
 * fill. Each stripe keeps its records in age order (a put moves a record to
 * the newest end) and at most g.stripe_max bytes of them; a put into a full
 * stripe evicts from the oldest end.
 */
struct srec {
	struct srec *next;          /* hash chain */
	struct srec *older, *newer; /* the stripe's age list */
	uint64_t h;
	uint64_t addr;
	uint64_t gen;
	uint64_t inc;               /* producer's incarnation; 0 = unknown */
	uint32_t len;
	uint32_t rkey;
	uint16_t klen;
	uint8_t nlen, dlen;         /* producer id, data endpoint (< 160) */
	bool resident;
	char key[];                 /* key, then "node\0data\0" */
};

struct stripe {
	pthread_mutex_t lock;
	struct srec **tab;
	uint32_t mask;
	uint32_t count;
	uint64_t bytes;             /* rec_cost() of its records */
	struct srec *oldest, *newest;
};

/* The incarnation a producer last announced here (a cache: a producer
 * forgotten through a collision only loses restart detection). */
struct prod {
	char node[DIR_NODE_MAX];
	uint64_t inc;
	uint64_t swept_ns;          /* last drop of its records (pc_now_ns) */
};

/* A restart drops a producer's records once per this, at most: a drop
 * walks the whole shard, and a caller flipping incarnations on new
 * connections must not make it do so in a loop. */
#define DIR_SWEEP_GAP_NS 1000000000ull

static struct {
	struct pc_ctx *ctx;
	const struct svc_cluster *cl;     /* services: who we are, the ring */
	const struct ph_api *health;      /* services: suspect peers, or NULL */
	const struct mb_api *mb;          /* services: ring, events, or NULL */
	struct stripe stripes[DIR_STRIPES];
	uint64_t stripe_max;          /* directory_max_bytes / DIR_STRIPES */
	uint64_t incarnation;         /* this node's, random at start */
	pthread_mutex_t prods_lock;
	struct prod *prods;           /* DIR_PRODUCERS slots */
	unsigned replicas;
	unsigned timeout_ms;
	struct rpc_client **clients;  /* per reactor */
	uint64_t records;             /* atomic */
	uint64_t bytes;               /* atomic: sum of the stripes' bytes */
	met_id lookups, lookup_hits, fallbacks, puts, removes, skipped;
	met_id own_hits;
	met_id evicted, stale_dropped, put_refused, moved_away;
	unsigned move_grace_ms;       /* member_ttl: see struct move */
	uint64_t last_sweep_ns;       /* atomic: the last restart sweep */
} g;

static uint64_t key_hash(const char *k, size_t n)
{
	return XXH3_64bits(k, n);
}

static const char *rec_node(const struct srec *r)
{
	return r->key + r->klen;
}

static const char *rec_data(const struct srec *r)
{
	return r->key + r->klen + r->nlen + 1;
}

/* What a record costs: itself, its strings and its chain slot. */
static uint64_t rec_cost(const struct srec *r)
{
	return sizeof(*r) + r->klen + r->nlen + r->dlen + 2u + sizeof(void *);
}

static struct stripe *stripe_of(uint64_t h)
{
	return &g.stripes[h % DIR_STRIPES];
}

static struct srec **slot_of(struct stripe *s, uint64_t h, const char *key,
			     size_t klen)
{
	struct srec **pp = &s->tab[(h / DIR_STRIPES) & s->mask];
	while (*pp && !((*pp)->h == h && (*pp)->klen == klen &&
			memcmp((*pp)->key, key, klen) == 0))
		pp = &(*pp)->next;
	return pp;
}

static void stripe_grow(struct stripe *s)
{
	uint32_t nmask = s->mask * 2 + 1;
	struct srec **nt = calloc((size_t)nmask + 1, sizeof(*nt));
	if (!nt)
		return; /* keep the longer chains; still correct */
	for (uint32_t i = 0; i <= s->mask; i++) {
		while (s->tab[i]) {
			struct srec *r = s->tab[i];
			s->tab[i] = r->next;
			struct srec **head = &nt[(r->h / DIR_STRIPES) & nmask];
			r->next = *head;
			*head = r;
		}
	}
	free(s->tab);
	/* Atomic: bucket_prefetch reads them without the lock. */
	__atomic_store_n(&s->tab, nt, __ATOMIC_RELAXED);
	__atomic_store_n(&s->mask, nmask, __ATOMIC_RELAXED);
}

static void age_unlink(struct stripe *s, struct srec *r)
{
	if (r->older)
		r->older->newer = r->newer;
	else
		s->oldest = r->newer;
	if (r->newer)
		r->newer->older = r->older;
	else
		s->newest = r->older;
	r->older = r->newer = NULL;
}

static void age_push(struct stripe *s, struct srec *r)
{
	r->newer = NULL;
	r->older = s->newest;
	if (s->newest)
		s->newest->newer = r;
	else
		s->oldest = r;
	s->newest = r;
}

/* Take r out of s (lock held); the caller frees it and settles totals. */
static void stripe_remove(struct stripe *s, struct srec *r)
{
	struct srec **pp = slot_of(s, r->h, r->key, r->klen);
	PC_ASSERT(*pp == r);
	*pp = r->next;
	age_unlink(s, r);
	s->count--;
	s->bytes -= rec_cost(r);
}

/* Free a list of removed records (linked through next); settle totals. */
static void recs_free(struct srec *list)
{
	uint64_t n = 0, bytes = 0;
	while (list) {
		struct srec *r = list;
		list = r->next;
		n++;
		bytes += rec_cost(r);
		free(r);
	}
	__atomic_sub_fetch(&g.records, n, __ATOMIC_RELAXED);
	__atomic_sub_fetch(&g.bytes, bytes, __ATOMIC_RELAXED);
}

/*
 * Store a record of incarnation inc. The latest put of a key wins, whoever
 * made it: a record another producer left behind (its delete was lost, it
 * evicted the page while an owner was suspect) must not keep a key a live
 * producer now holds unreadable. Readers validate what they read, so a
 * record pointing at bytes that are not the page is a miss, never wrong
 * bytes; and only trusted callers may put (docs/security.md).
 */
static int shard_store(const char *key, size_t klen, const struct dir_rec *rec,
		       uint64_t inc)
{
	size_t nlen = strnlen(rec->node, DIR_NODE_MAX);
	size_t dlen = strnlen(rec->data, DIR_NODE_MAX);
	if (klen == 0 || klen > DIR_KEY_MAX || nlen == 0 ||
	    nlen >= DIR_NODE_MAX || dlen == 0 || dlen >= DIR_NODE_MAX)
		return -EINVAL;
	struct srec *n = malloc(sizeof(*n) + klen + nlen + dlen + 2);
	if (!n)
		return -ENOMEM;
	uint64_t h = key_hash(key, klen);
	*n = (struct srec){.h = h, .addr = rec->addr, .gen = rec->gen,
			   .inc = inc, .len = rec->len, .rkey = rec->rkey,
			   .klen = (uint16_t)klen, .nlen = (uint8_t)nlen,
			   .dlen = (uint8_t)dlen, .resident = rec->resident};
	memcpy(n->key, key, klen);
	memcpy(n->key + klen, rec->node, nlen + 1);
	memcpy(n->key + klen + nlen + 1, rec->data, dlen + 1);
	uint64_t cost = rec_cost(n);
	struct stripe *s = stripe_of(h);
	struct srec *gone = NULL; /* replaced and evicted records */
	unsigned evicted = 0;
	pthread_mutex_lock(&s->lock);
	struct srec **pp = slot_of(s, h, key, klen);
	struct srec *old = *pp;
	if (old) {
		n->next = old->next;
		*pp = n;
		age_unlink(s, old);
		s->bytes -= rec_cost(old);
		old->next = NULL;
		gone = old;
	} else {
		n->next = NULL;
		*pp = n;
		/* At most one record per bucket on average: each record
		 * walked past in a chain is one more cache miss. */
		if (++s->count > s->mask + 1)
			stripe_grow(s);
	}
	age_push(s, n);
	s->bytes += cost;
	while (s->bytes > g.stripe_max && s->oldest != n) {
		struct srec *v = s->oldest;
		stripe_remove(s, v);
		v->next = gone;
		gone = v;
		evicted++;
	}
	/* Postconditions: the key now has exactly the new record, and the
	 * stripe is within its bound unless the new record alone exceeds it. */
	PC_DASSERT(*slot_of(s, h, key, klen) == n);
	PC_ASSERT(s->bytes <= g.stripe_max || (s->oldest == n && s->newest == n));
	pthread_mutex_unlock(&s->lock);
	__atomic_add_fetch(&g.records, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&g.bytes, cost, __ATOMIC_RELAXED);
	recs_free(gone);
	if (evicted) {
		met_add(g.evicted, evicted);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "directory stripe full (%llu "
			  "bytes, directory_max_bytes / %d): evicted its oldest "
			  "records", (unsigned long long)g.stripe_max,
			  DIR_STRIPES);
	}
	return 0;
}

/* This node's own records (local publishes). */
static int shard_put(const char *key, size_t klen, const struct dir_rec *rec)
{
	return shard_store(key, klen, rec, g.incarnation);
}

static bool shard_get(const char *key, size_t klen, struct dir_rec *out)
{
	uint64_t h = key_hash(key, klen);
	struct stripe *s = stripe_of(h);
	pthread_mutex_lock(&s->lock);
	struct srec *r = *slot_of(s, h, key, klen);
	if (r) {
		out->found = true;
		out->addr = r->addr;
		out->gen = r->gen;
		out->len = r->len;
		out->rkey = r->rkey;
		out->resident = r->resident;
		memcpy(out->node, rec_node(r), r->nlen + 1u);
		memcpy(out->data, rec_data(r), r->dlen + 1u);
	}
	pthread_mutex_unlock(&s->lock);
	return r != NULL;
}

/*
 * Batched lookups hide memory latency: a shard of many records lives mostly
 * outside the caches, and one lookup is two dependent misses (the bucket,
 * then the record), which cost more than everything else a dir.get does per
 * key. So a batch walks its keys in three stages DIR_AHEAD keys apart:
 * prefetch key i's bucket; DIR_AHEAD keys later, prefetch the record the
 * bucket points to; DIR_AHEAD keys later again, look i up — by then both
 * lines are usually in cache, and up to 2 * DIR_AHEAD misses are in flight.
 */
#define DIR_AHEAD 8

/* Stage 1, without the lock: tab and mask are read atomically (stripe_grow
 * stores them so); a pair mixed across a grow only prefetches a useless
 * address, and a prefetch never faults nor reads for the program. */
static void bucket_prefetch(uint64_t h)
{
	struct stripe *s = stripe_of(h);
	uintptr_t tab = (uintptr_t)__atomic_load_n(&s->tab, __ATOMIC_RELAXED);
	uint32_t mask = __atomic_load_n(&s->mask, __ATOMIC_RELAXED);
	__builtin_prefetch((const void *)(tab + ((h / DIR_STRIPES) & mask) *
				 sizeof(struct srec *)));
}

/* Stage 2, under the stripe lock (the chain may change): the first record
 * of the bucket, its header and the start of its key. */
static void chain_prefetch(uint64_t h)
{
	struct stripe *s = stripe_of(h);
	pthread_mutex_lock(&s->lock);
	const struct srec *r = s->tab[(h / DIR_STRIPES) & s->mask];
	if (r) {
		__builtin_prefetch(r);
		__builtin_prefetch((const char *)r + 64);
	}
	pthread_mutex_unlock(&s->lock);
}

/* A record as dir.get sends it: [node, data, addr, rkey, len, gen,
 * resident], each in its smallest MessagePack form (what pack_rec makes). */
#define DIR_REC_WIRE_MAX (1 + 2 * (2 + DIR_NODE_MAX) + 9 + 5 + 5 + 9 + 1)

static uint8_t *enc_uint(uint8_t *p, uint64_t v)
{
	unsigned n;
	if (v < 0x80) {
		*p++ = (uint8_t)v;
		return p;
	}
	if (v <= 0xff) {
		*p++ = 0xcc;
		n = 1;
	} else if (v <= 0xffff) {
		*p++ = 0xcd;
		n = 2;
	} else if (v <= 0xffffffffu) {
		*p++ = 0xce;
		n = 4;
	} else {
		*p++ = 0xcf;
		n = 8;
	}
	while (n--)
		*p++ = (uint8_t)(v >> (8 * n));
	return p;
}

static uint8_t *enc_str(uint8_t *p, const char *str, unsigned n)
{
	PC_DASSERT(n < 256);
	if (n < 32) {
		*p++ = (uint8_t)(0xa0 | n);
	} else {
		*p++ = 0xd9;
		*p++ = (uint8_t)n;
	}
	memcpy(p, str, n);
	return p + n;
}

/* Encode r into out (DIR_REC_WIRE_MAX bytes): the bytes written. Pure
 * memory work, so it may run under the stripe lock. */
static size_t rec_encode(const struct srec *r, uint8_t *out)
{
	uint8_t *p = out;
	*p++ = 0x97; /* fixarray of 7 */
	p = enc_str(p, rec_node(r), r->nlen);
	p = enc_str(p, rec_data(r), r->dlen);
	p = enc_uint(p, r->addr);
	p = enc_uint(p, r->rkey);
	p = enc_uint(p, r->len);
	p = enc_uint(p, r->gen);
	*p++ = r->resident ? 0xc3 : 0xc2;
	PC_DASSERT((size_t)(p - out) <= DIR_REC_WIRE_MAX);
	return (size_t)(p - out);
}

/*
 * Look up n keys (hashes h[]), in order, packing each record (or nil) into
 * pk. A record is encoded under its stripe lock straight from the shard (no
 * copy through struct dir_rec) and leaves as one write: about a tenth of
 * the packer calls pack_rec makes.
 */
static void shard_get_batch(const char *const *keys, const size_t *klens,
			    const uint64_t *h, uint32_t n, msgpack_packer *pk)
{
	uint8_t wire[DIR_REC_WIRE_MAX];
	for (uint32_t i = 0; i < n + 2 * DIR_AHEAD; i++) {
		if (i < n)
			bucket_prefetch(h[i]);
		if (i >= DIR_AHEAD && i - DIR_AHEAD < n)
			chain_prefetch(h[i - DIR_AHEAD]);
		if (i < 2 * DIR_AHEAD || i - 2 * DIR_AHEAD >= n)
			continue;
		uint32_t k = i - 2 * DIR_AHEAD;
		struct stripe *s = stripe_of(h[k]);
		size_t len = 0;
		pthread_mutex_lock(&s->lock);
		const struct srec *r = *slot_of(s, h[k], keys[k], klens[k]);
		if (r)
			len = rec_encode(r, wire);
		pthread_mutex_unlock(&s->lock);
		if (len)
			mp_pack_raw(pk, wire, len);
		else
			msgpack_pack_nil(pk);
	}
}

/* Delete when (node, gen) match; node NULL deletes whatever is there. */
static bool shard_del(const char *key, size_t klen, const char *node,
		      uint64_t gen)
{
	uint64_t h = key_hash(key, klen);
	struct stripe *s = stripe_of(h);
	pthread_mutex_lock(&s->lock);
	struct srec *r = *slot_of(s, h, key, klen);
	bool match = r && (!node || (strcmp(rec_node(r), node) == 0 &&
				     (gen == 0 || r->gen == gen)));
	if (match) {
		/* Never wrong: a conditional delete removes only a record of
		 * its producer and, when given, of that generation. */
		PC_DASSERT(!node || (strcmp(rec_node(r), node) == 0 &&
				     (gen == 0 || r->gen == gen)));
		stripe_remove(s, r);
		r->next = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	if (match)
		recs_free(r);
	return match;
}

/*
 * A sweep walks every record: at most one per DIR_SWEEP_GAP_NS for the whole
 * node, whatever producer names callers announce, so announcing new names
 * cannot keep reactors walking the shard. A restart whose sweep is skipped
 * leaves its old records to be evicted or missed (validated misses).
 */
static bool sweep_allowed(void)
{
	uint64_t now = pc_now_ns();
	uint64_t last = __atomic_load_n(&g.last_sweep_ns, __ATOMIC_RELAXED);
	return (last == 0 || now - last >= DIR_SWEEP_GAP_NS) &&
	       __atomic_compare_exchange_n(&g.last_sweep_ns, &last, now, false,
					   __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* Drop node's records of any incarnation but inc (it restarted). */
static unsigned shard_drop_stale(const char *node, uint64_t inc)
{
	unsigned dropped = 0;
	for (unsigned i = 0; i < DIR_STRIPES; i++) {
		struct stripe *s = &g.stripes[i];
		struct srec *gone = NULL;
		pthread_mutex_lock(&s->lock);
		for (struct srec *r = s->oldest, *nx; r; r = nx) {
			nx = r->newer;
			if (r->inc == inc || strcmp(rec_node(r), node) != 0)
				continue;
			stripe_remove(s, r);
			r->next = gone;
			gone = r;
			dropped++;
		}
		pthread_mutex_unlock(&s->lock);
		recs_free(gone);
	}
	return dropped;
}

/*
 * node announces incarnation inc (non-zero). True when it had announced
 * another one here before: it restarted, and its older records must go
 * (unless they went less than DIR_SWEEP_GAP_NS ago: then they stay until
 * evicted or missed).
 */
static bool prod_announce(const char *node, uint64_t inc)
{
	struct prod *p = &g.prods[key_hash(node, strlen(node)) % DIR_PRODUCERS];
	uint64_t now = pc_now_ns();
	pthread_mutex_lock(&g.prods_lock);
	bool same = strcmp(p->node, node) == 0;
	bool restarted = same && p->inc != inc &&
			 now - p->swept_ns >= DIR_SWEEP_GAP_NS;
	if (!same)
		p->swept_ns = 0;
	if (restarted)
		p->swept_ns = now;
	snprintf(p->node, sizeof(p->node), "%s", node);
	p->inc = inc;
	pthread_mutex_unlock(&g.prods_lock);
	return restarted;
}

/* --------------------------------------------------------- dir.* methods */

/* The keys of one dir.get: pointers into the request, their hashes. */
struct get_keys {
	const char **keys;
	size_t *klens;
	uint64_t *h;
};

/* Read [key, ...] (the first param) into gk, hashed (one allocation, at
 * gk->keys; free it). */
static int read_keys(struct mp_rd *p, struct get_keys *gk, uint32_t *n)
{
	if (mp_rd_array(p, n) < 0 || *n > DIR_BATCH_MAX)
		return -EINVAL;
	size_t m = *n ? *n : 1;
	void *mem = malloc(m * (sizeof(*gk->keys) + sizeof(*gk->klens) +
				sizeof(*gk->h)));
	if (!mem)
		return -ENOMEM;
	gk->h = mem;
	gk->klens = (size_t *)(gk->h + m);
	gk->keys = (const char **)(gk->klens + m);
	for (uint32_t i = 0; i < *n; i++) {
		uint32_t len;
		if (mp_rd_str(p, &gk->keys[i], &len) < 0 || len == 0 ||
		    len > DIR_KEY_MAX) {
			free(mem);
			return -EINVAL;
		}
		gk->klens[i] = len;
		gk->h[i] = key_hash(gk->keys[i], len);
	}
	return 0;
}

/* ------------------------------------------------- who may publish what */

/* The host of "host:port" (the part before the last ':'), or -EINVAL. */
static int host_of(const char *id, char *out, size_t cap)
{
	const char *colon = strrchr(id, ':');
	if (!colon || colon == id || !colon[1] || (size_t)(colon - id) >= cap)
		return -EINVAL;
	memcpy(out, id, (size_t)(colon - id));
	out[colon - id] = '\0';
	return 0;
}

/* A numeric address as bytes (IPv4-mapped IPv6 as IPv4): 4, 16 or 0. */
static size_t addr_bytes(const char *s, unsigned char out[16])
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0,
						 0, 0, 0xff, 0xff};
	if (inet_pton(AF_INET, s, out) == 1)
		return 4;
	if (inet_pton(AF_INET6, s, out) != 1)
		return 0;
	if (memcmp(out, mapped, sizeof(mapped)) != 0)
		return 16;
	memmove(out, out + 12, 4);
	return 4;
}

/* Two numeric addresses are the same. */
static bool same_addr(const char *a, const char *b)
{
	unsigned char x[16], y[16];
	size_t lx = addr_bytes(a, x), ly = addr_bytes(b, y);
	return lx && lx == ly && memcmp(x, y, lx) == 0;
}

static bool is_loopback(const char *host)
{
	return pc_host_is_loopback(host) ||
	       (strncmp(host, "::ffff:", 7) == 0 &&
		pc_host_is_loopback(host + 7));
}

/*
 * May this connection publish records of producer node (data endpoint
 * data)? Only nodes over TCP; the producer id and data endpoint name one
 * host, and that host is the connection's source address unless the
 * connection comes from loopback. 0, or -EPERM with the reason in why.
 */
static int producer_check(struct rpc_call *call, const char *node,
			  const char *data, char *why, size_t cap)
{
	char nh[DIR_NODE_MAX], dh[DIR_NODE_MAX], src[64];
	if (rpc_call_is_local(call)) {
		snprintf(why, cap, "dir.put is for nodes: Unix-socket clients "
			 "may not publish directory records");
		return -EPERM;
	}
	if (strcmp(node, g.cl->self_id) == 0) {
		snprintf(why, cap, "'%s' is this node, which stores its own "
			 "records without dir.put", node);
		return -EPERM;
	}
	if (host_of(node, nh, sizeof(nh)) < 0 ||
	    host_of(data, dh, sizeof(dh)) < 0 || strcmp(nh, dh) != 0) {
		snprintf(why, cap, "producer '%s' and data endpoint '%s' must "
			 "be host:port on one host", node, data);
		return -EPERM;
	}
	if (host_of(rpc_call_peer(call), src, sizeof(src)) < 0)
		src[0] = '\0';
	if (!is_loopback(src) && !same_addr(src, nh)) {
		snprintf(why, cap, "producer '%s' is not this connection's "
			 "address %s: a node publishes only its own records",
			 node, src);
		return -EPERM;
	}
	return 0;
}

/* What a connection that called dir.put publishes for (one producer, one
 * incarnation). Only dir.put sets TCP connections' module data (sessions,
 * the other user, are Unix-socket only). */
struct dir_conn {
	uint64_t inc;
	char node[DIR_NODE_MAX];
};

/* Bind the connection to (node, inc) on its first dir.put; later puts must
 * name the same. 0, or -EPERM with the reason in why. */
static int conn_bind(struct rpc_call *call, const char *node, uint64_t inc,
		     char *why, size_t cap)
{
	struct dir_conn *b = rpc_call_conn_data(call);
	if (b) {
		if (strcmp(b->node, node) == 0 && b->inc == inc)
			return 0;
		snprintf(why, cap, "this connection publishes for '%s' "
			 "(incarnation %llu), not '%s' (incarnation %llu)",
			 b->node, (unsigned long long)b->inc, node,
			 (unsigned long long)inc);
		return -EPERM;
	}
	if (!(b = calloc(1, sizeof(*b)))) {
		snprintf(why, cap, "out of memory");
		return -ENOMEM;
	}
	snprintf(b->node, sizeof(b->node), "%s", node);
	b->inc = inc;
	rpc_call_set_conn_data(call, b, free);
	return 0;
}

/* Read one [key, record] entry. */
static int read_entry(struct mp_rd *p, const char **key, uint32_t *klen,
		      struct dir_rec *r)
{
	uint32_t two;
	if (mp_rd_array(p, &two) < 0 || two != 2 ||
	    mp_rd_str(p, key, klen) < 0 || *klen == 0 ||
	    *klen > DIR_KEY_MAX || pl_rec_read(p, r) < 0)
		return -EINVAL;
	return 0;
}

/*
 * dir.put [[key, rec], ...], [node, data, incarnation]
 *   -> stored count
 * The second parameter announces the producer; every record must name it.
 * Without it (the old format) the first record's producer stands for all,
 * at incarnation 0 (never a restart). The whole call is checked before
 * anything is stored.
 */
static void m_put(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n, stored = 0;
	struct mp_rd ents = *p;
	struct dir_rec who = {0};
	uint64_t inc = 0;
	char why[400];
	if (mp_rd_array(p, &n) < 0 || n > DIR_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [[key, record]"
				", ...] (at most %d), [node, data, "
				"incarnation]", DIR_BATCH_MAX);
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		const char *key;
		uint32_t klen;
		struct dir_rec r;
		if (read_entry(p, &key, &klen, &r) < 0) {
			rpc_reply_error(call, RPC_E_BAD_PARAMS, "entry %u: "
					"expected [key, [node, data, addr, rkey,"
					" len, gen, resident]]", i);
			return;
		}
		if (i == 0)
			who = r;
	}
	uint32_t three;
	bool announced = mp_peek(p) != MP_T_END;
	if (announced &&
	    (mp_rd_array(p, &three) < 0 || three != 3 ||
	     pl_str_read(p, who.node, sizeof(who.node)) < 0 ||
	     pl_str_read(p, who.data, sizeof(who.data)) < 0 ||
	     mp_rd_uint(p, &inc) < 0 || mp_peek(p) != MP_T_END)) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "second parameter: "
				"expected [node, data, incarnation]");
		return;
	}
	if (!announced && n == 0) {
		rpc_reply_uint(call, 0);
		return;
	}
	int ret = producer_check(call, who.node, who.data, why, sizeof(why));
	/* Every record names the producer. */
	struct mp_rd q = ents;
	mp_rd_array(&q, &n);
	for (uint32_t i = 0; i < n && ret == 0; i++) {
		const char *key;
		uint32_t klen;
		struct dir_rec r;
		read_entry(&q, &key, &klen, &r); /* checked above */
		bool other = strcmp(r.node, who.node) != 0;
		if (other || strcmp(r.data, who.data) != 0) {
			snprintf(why, sizeof(why), "entry %u names %s '%s', "
				 "not the caller's '%s'", i,
				 other ? "producer" : "data endpoint",
				 other ? r.node : r.data,
				 other ? who.node : who.data);
			ret = -EPERM;
		}
	}
	if (ret == 0)
		ret = conn_bind(call, who.node, inc, why, sizeof(why));
	if (ret < 0) {
		met_inc(g.put_refused);
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "%s: dir.put refused: %s",
			  rpc_call_peer(call), why);
		rpc_reply_error(call, ret == -EPERM ? RPC_E_FORBIDDEN
						    : RPC_E_BUSY, "%s", why);
		return;
	}
	if (inc && prod_announce(who.node, inc) && sweep_allowed()) {
		unsigned dropped = shard_drop_stale(who.node, inc);
		met_add(g.stale_dropped, dropped);
		PC_LOG_RL(PC_LOG_INFO, LOG_MOD, "producer %s restarted "
			  "(incarnation %llu): dropped %u records of its "
			  "earlier incarnations", who.node,
			  (unsigned long long)inc, dropped);
	}
	q = ents;
	mp_rd_array(&q, &n);
	for (uint32_t i = 0; i < n; i++) {
		const char *key;
		uint32_t klen;
		struct dir_rec r;
		read_entry(&q, &key, &klen, &r);
		stored += shard_store(key, klen, &r, inc) == 0;
	}
	rpc_reply_uint(call, stored);
}

/* dir.get [[key, ...]] -> [record | nil, ...] */
static void m_get(struct rpc_call *call, struct mp_rd *p)
{
	struct get_keys gk;
	uint32_t n;
	if (read_keys(p, &gk, &n) < 0) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [[key, ...]] "
				"(keys of 1..%d bytes)", DIR_KEY_MAX);
		return;
	}
	msgpack_packer *pk = rpc_reply_begin(call);
	msgpack_pack_array(pk, n);
	shard_get_batch(gk.keys, gk.klens, gk.h, n, pk);
	rpc_reply_end(call);
	free(gk.h);
}

/* dir.del [[key, node | nil, gen], ...] -> [bool, ...] */
static void m_del(struct rpc_call *call, struct mp_rd *p)
{
	uint32_t n;
	if (mp_rd_array(p, &n) < 0 || n > DIR_BATCH_MAX) {
		rpc_reply_error(call, RPC_E_BAD_PARAMS, "expected [[key, node|nil"
				", gen], ...]");
		return;
	}
	bool *res = calloc(n ? n : 1, sizeof(bool));
	if (!res) {
		rpc_reply_error(call, RPC_E_BUSY, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t three, klen;
		const char *key;
		char node[DIR_NODE_MAX];
		uint64_t gen;
		bool any = false;
		if (mp_rd_array(p, &three) < 0 || three != 3 ||
		    mp_rd_str(p, &key, &klen) < 0 || klen == 0 ||
		    klen > DIR_KEY_MAX ||
		    (!(any = mp_rd_try_nil(p)) &&
		     pl_str_read(p, node, sizeof(node)) < 0) ||
		    mp_rd_uint(p, &gen) < 0) {
			free(res);
			rpc_reply_error(call, RPC_E_BAD_PARAMS, "entry %u: "
					"expected [key, node|nil, gen]", i);
			return;
		}
		res[i] = shard_del(key, klen, any ? NULL : node, gen);
	}
	rpc_reply_bools(call, res, n);
	free(res);
}

static const struct rpc_method dir_methods[] = {
	{"dir.put", m_put, 0,
	 "store the caller's records: [[key, [node, data, addr, rkey, len, "
	 "gen, resident]], ...], [node, data, incarnation] -> stored count"},
	{"dir.get", m_get, 0, "[[key, ...]] -> [record | nil, ...]"},
	{"dir.del", m_del, 0,
	 "[[key, node | nil, gen], ...] -> [deleted, ...] (conditional)"},
	{NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------ the client */

enum job_kind { JOB_LOOKUP, JOB_PUBLISH, JOB_REMOVE };

struct job;

/* One RPC to one owner for some keys of a job. */
struct job_rpc {
	struct job *job;
	unsigned n;
	unsigned owner; /* ring member asked */
	unsigned timeout_ms;
	unsigned idx[]; /* key indexes carried */
};

struct job {
	enum job_kind kind;
	struct rx_reactor *r;
	struct ring *ring;   /* a reference: the ring the owners came from */
	unsigned nkeys;
	char **keys;
	size_t *klens;
	unsigned (*owners)[DIR_REPLICAS_MAX];
	unsigned *nowners;
	unsigned *attempt;   /* lookup: next owner to ask */
	bool *done_key;      /* lookup: resolved */
	bool *own_first;     /* lookup: this node, not the key's first owner,
			      * asks its own replica first (own_order) */
	struct dir_rec *recs;
	bool *flags;         /* publish: ok; remove: existed */
	char *node;          /* remove: producer (NULL = any) */
	uint64_t *gens;
	unsigned outstanding;
	uint64_t deadline_ns; /* pc_now_ns() after which no round starts */
	unsigned members;    /* ring size when the job began */
	unsigned *count;     /* per round: keys for each member */
	unsigned *tgt;       /* per lookup round: the member each key asks */
	pl_done_fn done;
	void *arg;
	struct rx_timer timer; /* delivers an all-local job asynchronously */
	/* the round's walk over the keys, in slices (modules/walk.h) */
	unsigned walk_k;     /* next key of the round */
	unsigned self;       /* this node's place in the ring (or past it) */
	bool more_after;     /* lookup: a key could still fall back */
	struct rx_timer walk; /* resumes the round's walk in the next pass */
};

static void job_free(struct job *j)
{
	rx_timer_stop(j->r, &j->timer);
	rx_timer_stop(j->r, &j->walk);
	ring_unref(j->ring);
	free(j); /* the arena: keys, arrays, node and gens with it */
}

static void job_round(struct job *j);

static const char *const job_methods[] = {"dir.get", "dir.put", "dir.del"};

/* Is ring member o suspect (not answering)? Skipped ones are counted. */
static bool owner_suspect_now(struct job *j, unsigned o)
{
	const struct ph_api *h = g.health;
	return h && h->suspect(ring_member(j->ring, o));
}

static bool owner_suspect(struct job *j, unsigned o)
{
	if (!owner_suspect_now(j, o))
		return false;
	met_inc(g.skipped);
	return true;
}

/* Does key k have another owner to ask over the network after the one it
 * asks now? (This node's own shard costs no time.) */
static bool remote_after(const struct job *j, unsigned k, unsigned self)
{
	for (unsigned a = j->attempt[k] + 1; a < j->nowners[k]; a++)
		if (j->owners[k][a] != self)
			return true;
	return false;
}

static void job_finish(struct job *j)
{
	if (j->done)
		j->done(j->arg);
	job_free(j);
}

static void job_timer(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	job_finish(t->arg);
}

/* One RPC of a round came back (or failed). */
static void job_rpc_done(void *arg, const struct rpc_result *res)
{
	struct job_rpc *jr = arg;
	struct job *j = jr->job;
	struct mp_rd r = res->result;
	uint32_t n;
	bool ok = res->err == 0 && (j->kind == JOB_PUBLISH ||
				    (mp_rd_array(&r, &n) == 0 && n == jr->n));
	if (!ok && res->err && res->err != -ESHUTDOWN) { /* not: we stop */
		char why[200];
		PC_LOG_RL(PC_LOG_WARN, LOG_MOD, "a directory owner did not "
			  "answer: %s", rpc_result_str(res, why, sizeof(why)));
		if (g.health && ph_evidence(res->err, jr->timeout_ms))
			g.health->failed(ring_member(j->ring, jr->owner),
					 res->err, job_methods[j->kind]);
	}
	for (unsigned i = 0; i < jr->n; i++) {
		unsigned k = jr->idx[i];
		if (j->kind == JOB_PUBLISH) {
			uint64_t stored = 0;
			struct mp_rd rr = res->result;
			/* The owner stores all or reports fewer: then do not
			 * claim any of them. */
			if (res->err == 0 && mp_rd_uint(&rr, &stored) == 0 &&
			    stored == jr->n)
				j->flags[k] = true;
			continue;
		}
		if (j->kind == JOB_REMOVE) {
			bool b = false;
			if (ok && mp_rd_bool(&r, &b) == 0 && b && j->flags)
				j->flags[k] = true;
			continue;
		}
		/* lookup */
		if (ok && mp_peek(&r) != MP_T_NIL &&
		    pl_rec_read(&r, &j->recs[k]) == 0)
			j->done_key[k] = true;
		else if (ok)
			mp_skip(&r);
		if (!j->done_key[k])
			met_inc(g.fallbacks);
		j->attempt[k]++;
	}
	free(jr);
	PC_ASSERT(j->outstanding > 0);
	if (--j->outstanding == 0) {
		if (j->kind == JOB_LOOKUP)
			job_round(j); /* next replicas: what is missing */
		else
			job_finish(j);
	}
}

static void pack_call_params(struct job *j, msgpack_packer *pk,
			     const unsigned *idx, unsigned n)
{
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		unsigned k = idx[i];
		if (j->kind == JOB_LOOKUP) {
			msgpack_pack_str(pk, j->klens[k]);
			msgpack_pack_str_body(pk, j->keys[k], j->klens[k]);
		} else if (j->kind == JOB_PUBLISH) {
			msgpack_pack_array(pk, 2);
			msgpack_pack_str(pk, j->klens[k]);
			msgpack_pack_str_body(pk, j->keys[k], j->klens[k]);
			pl_rec_pack(pk, &j->recs[k]);
		} else {
			msgpack_pack_array(pk, 3);
			msgpack_pack_str(pk, j->klens[k]);
			msgpack_pack_str_body(pk, j->keys[k], j->klens[k]);
			if (j->node)
				mp_pack_cstr(pk, j->node);
			else
				msgpack_pack_nil(pk);
			msgpack_pack_uint64(pk, j->gens ? j->gens[k] : 0);
		}
	}
}

/* dir.put's second parameter: who publishes, in which incarnation. */
static void pack_announce(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 3);
	mp_pack_cstr(pk, g.cl->self_id);
	mp_pack_cstr(pk, g.cl->self_data);
	msgpack_pack_uint64(pk, g.incarnation);
}

/* Work for key k on the local shard, done at once. */
static void job_local(struct job *j, unsigned k)
{
	if (j->kind == JOB_LOOKUP) {
		/* Asked out of ring order (own_order): a miss here goes on
		 * to the first owner, which is no fallback. */
		bool first = j->own_first[k] && j->attempt[k] == 0;
		if (shard_get(j->keys[k], j->klens[k], &j->recs[k])) {
			j->done_key[k] = true;
			j->recs[k].own_replica = true;
			if (first)
				met_inc(g.own_hits);
		} else if (!first) {
			met_inc(g.fallbacks);
		}
		j->attempt[k]++;
	} else if (j->kind == JOB_PUBLISH) {
		PC_DASSERT(j->recs[k].found && j->recs[k].gen != 0);
		if (shard_put(j->keys[k], j->klens[k], &j->recs[k]) == 0)
			j->flags[k] = true;
	} else if (shard_del(j->keys[k], j->klens[k], j->node,
			     j->gens ? j->gens[k] : 0) && j->flags) {
		j->flags[k] = true;
	}
}

/*
 * A job with nothing in flight is finished: done runs on the next loop pass,
 * from the job's zero-delay timer (which never fails to arm), so never
 * inside the placement call that started it.
 */
static void job_deliver(struct job *j)
{
	rx_timer_start(j->r, &j->timer, 0, 0);
}

static void job_round_walk(struct job *j, bool resumed);
static void job_round_send(struct job *j);

static void job_walk_fired(struct rx_reactor *r, struct rx_timer *t)
{
	(void)r;
	rx_stall_tag("directory round");
	job_round_walk(PC_CONTAINER_OF(t, struct job, walk), true);
}

/*
 * Send one round: lookup asks each unresolved key's next owner; publish and
 * remove ask every owner at once. Keys for this node are done locally; the
 * others go as one RPC per owner. The keys are walked in slices of loop
 * passes (modules/walk.h), the RPCs sent once all are. A job's first round
 * starts inside the placement call that made it; its done never runs there
 * (job_deliver).
 */
static void job_round(struct job *j)
{
	if (pc_now_ns() >= j->deadline_ns) { /* out of time: what we have */
		job_deliver(j);
		return;
	}
	unsigned members = ring_size(j->ring);
	/* count[] was sized at job_new: the job keeps the ring it began
	 * with for its whole life, so its size cannot change. */
	PC_ASSERT(members == j->members);
	j->self = (unsigned)ring_find(j->ring, g.cl->self_id);
	unsigned *count = j->count;
	memset(count, 0, members * sizeof(*count));
	j->more_after = false;
	j->walk_k = 0;
	/* publish, remove: which owners are suspect is decided once for the
	 * round (other threads flip the flags meanwhile), so that count[o]
	 * is exactly the number of keys the RPC to o carries. */
	if (j->kind != JOB_LOOKUP)
		for (unsigned o = 0; o < members; o++)
			if (o != j->self && owner_suspect_now(j, o))
				count[o] = UINT_MAX;
	job_round_walk(j, false);
}

/* The round's keys from j->walk_k on: local work now, the owner each key
 * asks (lookup: tgt[], UINT32_MAX for none) counted for the RPCs. */
static void job_round_walk(struct job *j, bool resumed)
{
	unsigned self = j->self, *count = j->count, *tgt = j->tgt;
	unsigned here = walk_here(resumed);
	for (; j->walk_k < j->nkeys; j->walk_k++) {
		if (!walk_take(j->r, &here)) {
			walk_later(j->r, &j->walk, job_walk_fired);
			return;
		}
		unsigned k = j->walk_k;
		if (j->kind == JOB_LOOKUP) {
			tgt[k] = UINT32_MAX;
			/* Suspect owners are passed over, and a miss in this
			 * node's own shard goes on at once: the key's next
			 * replica is asked in this round. */
			while (!j->done_key[k] && j->attempt[k] < j->nowners[k]) {
				unsigned o = j->owners[k][j->attempt[k]];
				if (o == self) {
					job_local(j, k); /* attempt[k]++ */
				} else if (owner_suspect(j, o)) {
					j->attempt[k]++;
				} else {
					tgt[k] = o;
					count[o]++;
					j->more_after |= remote_after(j, k, self);
					break;
				}
			}
			continue;
		}
		for (unsigned a = 0; a < j->nowners[k]; a++) {
			unsigned o = j->owners[k][a];
			if (o == self)
				job_local(j, k);
			else if (count[o] == UINT_MAX)
				met_inc(g.skipped); /* suspect: passed over */
			else
				count[o]++;
		}
	}
	job_round_send(j);
}

/* Does key k ask owner o in this round (lookup: its target, tgt[k])? */
static bool job_asks(const struct job *j, unsigned k, unsigned o,
		     const unsigned *tgt)
{
	if (j->kind == JOB_LOOKUP)
		return tgt[k] == o;
	for (unsigned a = 0; a < j->nowners[k]; a++)
		if (j->owners[k][a] == o)
			return true;
	return false;
}

/* The round's keys are walked: the RPCs to the owners with keys to ask. */
static void job_round_send(struct job *j)
{
	unsigned members = j->members, *count = j->count, *tgt = j->tgt;
	uint64_t now = pc_now_ns();
	bool more_after = j->more_after;
	for (unsigned o = 0; j->kind != JOB_LOOKUP && o < members; o++)
		if (count[o] == UINT_MAX)
			count[o] = 0;
	bool remote = false;
	for (unsigned o = 0; o < members; o++)
		remote |= count[o] > 0;
	if (!remote) {
		/* Every key is settled: a lookup's keys not found here went on
		 * to their next owners in the loop above. */
		job_deliver(j); /* never inside the call */
		return;
	}
	if (now >= j->deadline_ns) { /* the walk took what was left */
		job_deliver(j);
		return;
	}
	struct rpc_client *cl = g.clients[rx_reactor_id(j->r)];
	/* This round's share of the deadline: half of what is left when an
	 * owner that does not answer could still be replaced by the next. */
	uint64_t left_ms = (j->deadline_ns - now) / 1000000u;
	if (more_after)
		left_ms /= 2;
	unsigned timeout_ms = (unsigned)PC_MAX(PC_MIN(left_ms,
						      (uint64_t)g.timeout_ms),
					       (uint64_t)1);
	/* An owner's keys go in RPCs of at most DIR_RPC_KEYS, all sent at
	 * once: the owner serves each in its own callback. */
	for (unsigned o = 0; o < members; o++) {
		unsigned k = 0;
		for (unsigned left = count[o]; left > 0;) {
			unsigned want = PC_MIN(left, (unsigned)DIR_RPC_KEYS);
			left -= want;
			struct job_rpc *jr = malloc(sizeof(*jr) +
						    want * sizeof(jr->idx[0]));
			if (!jr)
				break; /* this owner's other keys: not asked */
			jr->job = j;
			jr->n = 0;
			jr->owner = o;
			jr->timeout_ms = timeout_ms;
			for (; k < j->nkeys && jr->n < want; k++)
				if (job_asks(j, k, o, tgt))
					jr->idx[jr->n++] = k;
			struct rpc_req *q = rpc_req_new(
				cl, ring_member(j->ring, o),
				job_methods[j->kind],
				j->kind == JOB_PUBLISH ? 2 : 1, timeout_ms,
				job_rpc_done, jr);
			if (!q) {
				free(jr);
				continue;
			}
			pack_call_params(j, rpc_req_packer(q), jr->idx, jr->n);
			if (j->kind == JOB_PUBLISH)
				pack_announce(rpc_req_packer(q));
			j->outstanding++;
			rpc_req_send(q);
		}
	}
	if (j->outstanding == 0) /* every RPC failed to start */
		job_deliver(j);
}

/*
 * A job's arrays, key copies, producer name and generations, laid out in
 * one arena (common/arena.h): both passes take the same sizes.
 */
static struct job *job_layout(struct pc_arena *a, const struct dir_keys *k,
			      unsigned members, const char *node,
			      const uint64_t *gens)
{
	unsigned n = k->n;
	struct job *j = pc_arena_take(a, sizeof(*j));
	char **keys = pc_arena_take(a, n * sizeof(*keys));
	size_t *klens = pc_arena_take(a, n * sizeof(*klens));
	unsigned (*owners)[DIR_REPLICAS_MAX] =
		pc_arena_take(a, n * sizeof(*owners));
	unsigned *nowners = pc_arena_take(a, n * sizeof(*nowners));
	unsigned *attempt = pc_arena_take(a, n * sizeof(*attempt));
	bool *done_key = pc_arena_take(a, n * sizeof(*done_key));
	bool *own_first = pc_arena_take(a, n * sizeof(*own_first));
	unsigned *count = pc_arena_take(a, (members ? members : 1) *
					       sizeof(*count));
	unsigned *tgt = pc_arena_take(a, n * sizeof(*tgt));
	uint64_t *gcopy = gens ? pc_arena_take(a, n * sizeof(*gcopy)) : NULL;
	char *ncopy = node ? pc_arena_take(a, strlen(node) + 1) : NULL;
	for (unsigned i = 0; i < n; i++) {
		char *c = pc_arena_take(a, k->klens[i]);
		if (c) {
			memcpy(c, k->keys[i], k->klens[i]);
			keys[i] = c;
			klens[i] = k->klens[i];
		}
	}
	if (!j)
		return NULL; /* planning */
	if (gcopy)
		memcpy(gcopy, gens, n * sizeof(*gcopy));
	if (ncopy)
		memcpy(ncopy, node, strlen(node) + 1);
	*j = (struct job){.nkeys = n, .keys = keys, .klens = klens,
			  .owners = owners, .nowners = nowners,
			  .attempt = attempt, .done_key = done_key,
			  .own_first = own_first,
			  .members = members, .count = count, .tgt = tgt,
			  .gens = gcopy, .node = ncopy};
	return j;
}

/* The current ring (valid for the rest of this callback), or NULL. */
static struct ring *ring_now(void)
{
	return g.mb ? g.mb->ring() : NULL;
}

static struct job *job_new(enum job_kind kind, struct rx_reactor *r,
			   struct ring *ring, const struct dir_keys *k,
			   const char *node, const uint64_t *gens,
			   uint64_t deadline_ns, pl_done_fn done, void *arg)
{
	if (!ring || k->n == 0 || k->n > DIR_BATCH_MAX)
		return NULL;
	for (unsigned i = 0; i < k->n; i++)
		if (k->klens[i] == 0 || k->klens[i] > DIR_KEY_MAX)
			return NULL;
	struct pc_arena a;
	pc_arena_plan(&a);
	job_layout(&a, k, ring_size(ring), node, gens);
	if (!pc_arena_alloc(&a))
		return NULL;
	struct job *j = job_layout(&a, k, ring_size(ring), node, gens);
	j->kind = kind;
	j->r = r;
	j->ring = ring_ref(ring); /* the job outlives this callback */
	j->done = done;
	j->arg = arg;
	j->deadline_ns = deadline_ns ? deadline_ns
				     : pc_now_ns() + RX_MS(g.timeout_ms);
	rx_timer_init(&j->timer, job_timer, j);
	for (unsigned i = 0; i < k->n; i++) {
		j->nowners[i] = ring_owners(ring, k->keys[i], k->klens[i],
					    g.replicas, j->owners[i]);
		PC_ASSERT(j->nowners[i] <= DIR_REPLICAS_MAX);
	}
	return j;
}

/*
 * A lookup not bound to ring order. By default, for each key this node owns
 * a replica of, this node goes first (the others keep their order behind
 * it): its replica is the record every owner was sent, so a hit costs no
 * round trip, and a miss asks the next owner in the same round. A publish
 * this node missed (it did not answer in time) leaves this replica older
 * than the others', whatever the order: dir_rec.own_replica marks every
 * record from here, and a reader whose read of one fails asks again with
 * last set (PL_LOOKUP_ELSEWHERE, kv): this node goes last, after the other
 * owners, and still answers when none of them knows the key.
 */
static void own_order(struct job *j, bool last)
{
	int self = ring_find(j->ring, g.cl->self_id);
	if (self < 0)
		return;
	for (unsigned k = 0; k < j->nkeys; k++) {
		unsigned *o = j->owners[k], n = j->nowners[k];
		for (unsigned a = 0; a < n; a++) {
			if (o[a] != (unsigned)self)
				continue;
			if (last) {
				memmove(o + a, o + a + 1,
					(n - a - 1) * sizeof(*o));
				o[n - 1] = (unsigned)self;
			} else if (a > 0) {
				memmove(o + 1, o, a * sizeof(*o));
				o[0] = (unsigned)self;
				j->own_first[k] = true;
			}
			break;
		}
	}
}

static int api_lookup(struct rx_reactor *r, const struct dir_keys *k,
		      struct dir_rec *recs, unsigned flags,
		      uint64_t deadline_ns, pl_done_fn done, void *arg)
{
	struct job *j = job_new(JOB_LOOKUP, r, ring_now(), k, NULL, NULL,
				deadline_ns, done, arg);
	if (!j)
		return -EINVAL;
	if (flags & PL_LOOKUP_ELSEWHERE)
		own_order(j, true);
	else if (!(flags & PL_LOOKUP_IN_ORDER))
		own_order(j, false);
	memset(recs, 0, k->n * sizeof(*recs));
	j->recs = recs;
	met_add(g.lookups, k->n);
	job_round(j);
	return 0;
}

static int api_publish(struct rx_reactor *r, const struct dir_keys *k,
		       const struct dir_rec *recs, bool *ok,
		       uint64_t deadline_ns, pl_done_fn done, void *arg)
{
	struct job *j = job_new(JOB_PUBLISH, r, ring_now(), k, NULL, NULL,
				deadline_ns, done, arg);
	if (!j)
		return -EINVAL;
	memset(ok, 0, k->n * sizeof(*ok));
	j->recs = (struct dir_rec *)(uintptr_t)recs;
	j->flags = ok;
	met_add(g.puts, k->n);
	job_round(j);
	return 0;
}

static int api_remove(struct rx_reactor *r, const struct dir_keys *k,
		      const char *node, const uint64_t *gens, bool *existed,
		      uint64_t deadline_ns, pl_done_fn done, void *arg)
{
	/* Generations name one producer's pages: never without it. */
	PC_ASSERT(!gens || node);
	struct job *j = job_new(JOB_REMOVE, r, ring_now(), k, node, gens,
				deadline_ns, done, arg);
	if (!j)
		return -EINVAL;
	if (existed)
		memset(existed, 0, k->n * sizeof(*existed));
	j->flags = existed;
	met_add(g.removes, k->n);
	job_round(j);
	return 0;
}

/*
 * A move (pl_ops.move): a publish job to the gained owners; when it is
 * done the caller hears of it, and a remove job to the lost owners, for
 * the keys whose publish worked, starts MOVE_GRACE later. Nodes adopt a
 * new membership at different times (a heartbeat apart with discovery, as
 * an operator goes with set_peers): until a node has, it looks keys up at
 * their old owners, which keep the records that long. Both jobs are built
 * inside the call against one ring. A key that gained more than one owner
 * keeps its old owners' records (its publish counts as done when any new
 * owner stored it; stale records only cost memory).
 *
 * Delayed removals wait on their reactor's list; the directory's exit
 * frees those that never started.
 */
struct move {
	struct job *rem;
	bool *ok;
	pl_done_fn done;
	void *arg;
	struct rx_timer grace;
	struct move *next, **prev; /* the reactor's delayed removals */
	bool *existed;      /* per key: an old owner dropped a record */
	uint8_t ngained[];  /* per key: owners the publish asked; then
			     * existed, in the same allocation */
};

static _Thread_local struct move *t_moves; /* waiting for their grace */

static void move_unlink(struct move *m)
{
	if (!m->prev)
		return;
	*m->prev = m->next;
	if (m->next)
		m->next->prev = m->prev;
	m->prev = NULL;
}

static void move_removed(void *arg)
{
	struct move *m = arg;
	struct job *rem = m->rem;
	unsigned removed = 0;
	for (unsigned k = 0; k < rem->nkeys; k++)
		removed += rem->flags[k];
	met_add(g.moved_away, removed);
	free(m);
}

static void move_grace(struct rx_reactor *r, struct rx_timer *t)
{
	struct move *m = t->arg;
	move_unlink(m);
	if (rx_reactor_stopping(r)) {
		job_free(m->rem);
		free(m);
		return;
	}
	m->rem->deadline_ns = pc_now_ns() + RX_MS(g.timeout_ms);
	job_round(m->rem);
}

static void move_published(void *arg)
{
	struct move *m = arg;
	struct job *rem = m->rem;
	bool any = false;
	unsigned removes = 0;
	for (unsigned k = 0; k < rem->nkeys; k++) {
		if (!m->ngained[k])
			m->ok[k] = true; /* nothing to send: it is there */
		if (!m->ok[k] || m->ngained[k] > 1)
			rem->nowners[k] = 0; /* keep the old owners' record */
		any |= rem->nowners[k] > 0;
		removes += rem->nowners[k] > 0;
	}
	if (m->done)
		m->done(m->arg); /* ok is final; the removal goes on alone */
	m->done = NULL;
	m->ok = NULL;
	if (!any || rx_reactor_stopping(rem->r)) {
		job_free(rem);
		free(m);
		return;
	}
	met_add(g.removes, removes);
	rx_timer_init(&m->grace, move_grace, m);
	m->next = t_moves;
	m->prev = &t_moves;
	if (t_moves)
		t_moves->prev = &m->next;
	t_moves = m;
	if (rx_timer_start(rem->r, &m->grace, RX_MS(g.move_grace_ms), 0) < 0)
		move_grace(rem->r, &m->grace); /* no timer: remove now */
}

/* The directory's exit on this reactor: delayed removals are dropped. */
static void moves_drop(struct rx_reactor *r)
{
	while (t_moves) {
		struct move *m = t_moves;
		rx_timer_stop(r, &m->grace);
		move_unlink(m);
		job_free(m->rem);
		free(m);
	}
}

static int api_move(struct rx_reactor *r, const struct dir_keys *k,
		    const struct dir_rec *recs, bool *ok,
		    struct ring *const *from, unsigned nfrom,
		    uint64_t deadline_ns, pl_done_fn done, void *arg)
{
	if (k->n == 0 || k->n > DIR_BATCH_MAX)
		return -EINVAL;
	uint64_t *gens = malloc(k->n * sizeof(*gens));
	struct move *m = calloc(1, sizeof(*m) + k->n * (sizeof(m->ngained[0]) +
							 sizeof(bool)));
	struct job *pub = NULL, *rem = NULL;
	int ret = -ENOMEM;
	if (!gens || !m)
		goto fail;
	m->existed = (bool *)(m->ngained + k->n);
	for (unsigned i = 0; i < k->n; i++) {
		PC_DASSERT(recs[i].found && recs[i].gen != 0);
		gens[i] = recs[i].gen;
	}
	struct ring *ring = ring_now(); /* one ring for both jobs */
	pub = job_new(JOB_PUBLISH, r, ring, k, NULL, NULL, deadline_ns,
		      move_published, m);
	rem = job_new(JOB_REMOVE, r, ring, k, g.cl->self_id, gens, 0,
		      move_removed, m);
	free(gens);
	gens = NULL;
	if (!pub || !rem) {
		ret = -EINVAL; /* a bad key, or no ring yet */
		goto fail;
	}
	PC_ASSERT(pub->ring == rem->ring);
	/* job_new gave both the current owners; keep the moved ones */
	for (unsigned i = 0; i < k->n; i++) {
		uint64_t point = ring_key_point(k->keys[i], k->klens[i]);
		ring_owner_moves(ring, from, nfrom, point, g.replicas,
				 pub->owners[i], &pub->nowners[i],
				 rem->owners[i], &rem->nowners[i],
				 DIR_REPLICAS_MAX);
		m->ngained[i] = (uint8_t)pub->nowners[i];
	}
	memset(ok, 0, k->n * sizeof(*ok));
	pub->recs = (struct dir_rec *)(uintptr_t)recs;
	pub->flags = ok;
	rem->flags = m->existed;
	m->rem = rem;
	m->ok = ok;
	m->done = done;
	m->arg = arg;
	met_add(g.puts, k->n);
	job_round(pub);
	return 0;
fail:
	free(gens);
	if (pub)
		job_free(pub);
	if (rem)
		job_free(rem);
	free(m);
	return ret;
}

/* Is the page here: the record names this node as its producer. */
static bool api_is_here(const struct dir_rec *rec)
{
	return rec->found && strcmp(rec->node, g.cl->self_id) == 0;
}

static const struct pl_ops api = {
	.mode = "p2p",
	.lookup = api_lookup,
	.publish = api_publish,
	.unpublish = api_remove,
	.move = api_move,
	.is_here = api_is_here,
};

/* ------------------------------------------------------------- lifecycle */

static double records_fn(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.records, __ATOMIC_RELAXED);
}

static double bytes_fn(void *arg)
{
	(void)arg;
	return (double)__atomic_load_n(&g.bytes, __ATOMIC_RELAXED);
}

/* A peer became suspect or left: its calls from this reactor fail now
 * (lookups go on to the next replica) instead of each waiting for its
 * timeout. */
static void on_peer_gone(struct rx_reactor *r, enum mb_event ev,
			 const char *peer, uint64_t epoch, void *arg)
{
	(void)ev;
	(void)epoch;
	(void)arg;
	struct rpc_client *cl = g.clients[rx_reactor_id(r)];
	if (cl)
		rpc_client_fail_endpoint(cl, peer, -EHOSTDOWN);
}

static int d_init(struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	memset(&g, 0, sizeof(g));
	g.ctx = ctx;
	if (!(g.cl = svc_need_cluster(ctx, "directory")))
		return -ENOENT;
	g.health = svc_find_health(ctx);
	g.mb = svc_find_membership(ctx);
	g.replicas = (unsigned)PC_MIN(s->directory_replicas,
				      (int64_t)DIR_REPLICAS_MAX);
	g.timeout_ms = (unsigned)s->rpc_timeout_ms;
	g.move_grace_ms = (unsigned)s->member_ttl_ms;
	g.stripe_max = s->directory_max_bytes / DIR_STRIPES;
	/* Random and non-zero: a restart is a new incarnation to the owners
	 * of this node's records. */
	do {
		if (pc_random_bytes(&g.incarnation, sizeof(g.incarnation)) < 0)
			return -EIO;
	} while (g.incarnation == 0);
	pthread_mutex_init(&g.prods_lock, NULL);
	g.prods = calloc(DIR_PRODUCERS, sizeof(*g.prods));
	if (!g.prods)
		return -ENOMEM;
	for (unsigned i = 0; i < DIR_STRIPES; i++) {
		struct stripe *st = &g.stripes[i];
		pthread_mutex_init(&st->lock, NULL);
		st->mask = 255;
		st->tab = calloc(st->mask + 1, sizeof(*st->tab));
		if (!st->tab)
			return -ENOMEM;
	}
	g.clients = calloc(ctx->threads, sizeof(*g.clients));
	if (!g.clients)
		return -ENOMEM;
	/* p2p's placement; another mode brings its own (settings refuse
	 * the modes not built). */
	int ret = s->mode == PC_MODE_P2P
			  ? svc_publish_placement(ctx, "directory", &api)
			  : 0;
	if (ret < 0)
		return ret;
	if (g.mb && g.mb->subscribe(MB_ON(MB_SUSPECT) | MB_ON(MB_LEAVE),
				    on_peer_gone, NULL) < 0)
		return -ENOSPC;
	met_register_fn("peercache_directory_records",
			"records in this node's directory shard", NULL,
			records_fn, NULL);
	met_register_fn("peercache_directory_bytes",
			"memory held by this node's directory shard (at most "
			"directory_max_bytes)", NULL, bytes_fn, NULL);
	static const struct {
		met_id *id;
		const char *name, *help;
	} bounds[] = {
		{&g.evicted, "peercache_directory_evictions_total",
		 "records evicted (oldest first) to keep the shard within "
		 "directory_max_bytes"},
		{&g.stale_dropped, "peercache_directory_stale_dropped_total",
		 "records dropped because their producer restarted (announced "
		 "a new incarnation)"},
		{&g.put_refused, "peercache_directory_put_refused_total",
		 "dir.put calls refused: records of another producer than the "
		 "caller"},
	};
	for (size_t i = 0; i < PC_ARRAY_LEN(bounds); i++)
		*bounds[i].id = met_register(MET_COUNTER, bounds[i].name,
					     bounds[i].help, NULL);
	g.lookups = met_register(MET_COUNTER,
				 "peercache_directory_lookups_total",
				 "keys looked up by this node", NULL);
	g.fallbacks = met_register(MET_COUNTER,
				   "peercache_directory_fallbacks_total",
				   "lookups that went on to the next replica",
				   NULL);
	g.own_hits = met_register(MET_COUNTER,
				  "peercache_directory_own_replica_hits_total",
				  "keys this node found in its own replica "
				  "without asking their first owner", NULL);
	g.puts = met_register(MET_COUNTER, "peercache_directory_publishes_total",
			      "records published by this node", NULL);
	g.removes = met_register(MET_COUNTER,
				 "peercache_directory_removes_total",
				 "records removed by this node", NULL);
	g.moved_away = met_register(MET_COUNTER,
				    "peercache_directory_moved_away_total",
				    "records of this node's pages removed from "
				    "owners that lost them after a membership "
				    "change (a grace after the move)", NULL);
	g.skipped = met_register(MET_COUNTER,
				 "peercache_directory_suspect_skips_total",
				 "directory calls not sent to an owner because "
				 "it is suspect (did not answer)", NULL);
	return 0;
}

static int d_start(struct rx_reactor *r, struct pc_ctx *ctx)
{
	const struct pc_settings *s = ctx->cfg;
	struct rpc_client_opts o;
	rpc_client_opts_default(&o);
	o.secret = s->cluster_secret;
	o.max_message_bytes = s->rpc_max_message_bytes;
	o.conns_per_endpoint = 2;
	g.clients[rx_reactor_id(r)] = rpc_client_new(r, &o);
	return g.clients[rx_reactor_id(r)] ? 0 : -ENOMEM;
}

static void d_exit(struct rx_reactor *r, struct pc_ctx *ctx)
{
	(void)ctx;
	unsigned id = rx_reactor_id(r);
	if (g.clients && g.clients[id]) {
		rpc_client_free(g.clients[id]);
		g.clients[id] = NULL;
	}
	moves_drop(r); /* after the client: its failed calls may add some */
}

static void d_fini(struct pc_ctx *ctx)
{
	if (svc_find_placement(ctx) == &api)
		svc_withdraw_placement(ctx);
	for (unsigned i = 0; i < DIR_STRIPES; i++) {
		struct stripe *st = &g.stripes[i];
		for (uint32_t b = 0; st->tab && b <= st->mask; b++)
			while (st->tab[b]) {
				struct srec *r = st->tab[b];
				st->tab[b] = r->next;
				free(r);
			}
		free(st->tab);
		pthread_mutex_destroy(&st->lock);
	}
	free(g.prods);
	pthread_mutex_destroy(&g.prods_lock);
	free(g.clients);
	memset(&g, 0, sizeof(g));
}

const struct pc_module pc_mod_directory = {
	.name = "directory",
	.init = d_init,
	.start = d_start,
	.exit = d_exit,
	.fini = d_fini,
	.rpc_methods = dir_methods,
};
