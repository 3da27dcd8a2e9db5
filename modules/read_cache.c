/*
 * modules/read_cache.c — the directory read cache (see read_cache.h).
 *
 * Layout: a power-of-two number of stripes (at most 64, at most max), each
 * with its own lock, hash chains and LRU list, and an equal share of max
 * (so the whole never holds more than max). A key's stripe is picked by the
 * top bits of its XXH3-64, its chain by the low ones. Invariants, per
 * stripe and under its lock: n entries, n <= cap; every entry is on exactly
 * one chain and on the LRU list; an entry whose epoch is not the cache's or
 * whose time is up is never returned (it is removed when met).
 */
#include "modules/read_cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/util.h"

#define RC_STRIPES_MAX 64

struct rc_ent {
	struct rc_ent *hnext;       /* chain */
	struct rc_ent *prev, *next; /* LRU: most recent first */
	uint64_t h;
	uint64_t expires;
	uint64_t epoch;
	struct dir_rec rec;
	uint16_t klen, kcap;
	char key[];
};

struct rc_stripe {
	pthread_mutex_t mu;
	struct rc_ent **chain;
	uint64_t mask;             /* chains - 1 */
	struct rc_ent *first, *last;
	uint64_t n, cap;
	uint64_t hits, misses, evicted;
} __attribute__((aligned(64)));

struct read_cache {
	uint64_t ttl;
	uint64_t epoch; /* atomic */
	unsigned shift; /* a key's stripe: h >> shift */
	unsigned nstripes;
	struct rc_stripe s[];
};

static uint64_t next_pow2(uint64_t v)
{
	uint64_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

int rc_new(struct read_cache **out, uint64_t max, uint64_t ttl_ns)
{
	*out = NULL;
	if (max == 0)
		return -EINVAL;
	unsigned ns = 1;
	while (ns * 2 <= RC_STRIPES_MAX && ns * 2 <= max)
		ns *= 2;
	struct read_cache *c = calloc(1, sizeof(*c) + ns * sizeof(c->s[0]));
	if (!c)
		return -ENOMEM;
	c->ttl = ttl_ns;
	c->nstripes = ns;
	c->shift = 64;
	for (unsigned b = ns; b > 1; b >>= 1)
		c->shift--;
	for (unsigned i = 0; i < ns; i++) {
		struct rc_stripe *s = &c->s[i];
		s->cap = max / ns;
		uint64_t chains = next_pow2(s->cap);
		s->mask = chains - 1;
		pthread_mutex_init(&s->mu, NULL);
		if (!(s->chain = calloc(chains, sizeof(*s->chain)))) {
			c->nstripes = i + 1;
			rc_free(c);
			return -ENOMEM;
		}
	}
	*out = c;
	return 0;
}

void rc_free(struct read_cache *c)
{
	if (!c)
		return;
	for (unsigned i = 0; i < c->nstripes; i++) {
		struct rc_stripe *s = &c->s[i];
		for (struct rc_ent *e = s->first, *next; e; e = next) {
			next = e->next;
			free(e);
		}
		free(s->chain);
		pthread_mutex_destroy(&s->mu);
	}
	free(c);
}

static struct rc_stripe *stripe_of(struct read_cache *c, uint64_t h)
{
	return &c->s[c->shift >= 64 ? 0 : h >> c->shift];
}

static struct rc_ent **find(struct rc_stripe *s, uint64_t h, const char *key,
			    size_t klen)
{
	struct rc_ent **at = &s->chain[h & s->mask];
	for (; *at; at = &(*at)->hnext) {
		struct rc_ent *e = *at;
		if (e->h == h && e->klen == klen &&
		    memcmp(e->key, key, klen) == 0)
			break;
	}
	return at;
}

static void lru_unlink(struct rc_stripe *s, struct rc_ent *e)
{
	*(e->prev ? &e->prev->next : &s->first) = e->next;
	*(e->next ? &e->next->prev : &s->last) = e->prev;
	e->prev = e->next = NULL;
}

static void lru_front(struct rc_stripe *s, struct rc_ent *e)
{
	e->prev = NULL;
	e->next = s->first;
	*(s->first ? &s->first->prev : &s->last) = e;
	s->first = e;
}

/* Take e (at *at on its chain) out of the stripe; the caller frees it. */
static void unlink_ent(struct rc_stripe *s, struct rc_ent **at)
{
	struct rc_ent *e = *at;
	*at = e->hnext;
	lru_unlink(s, e);
	s->n--;
}

static bool live(struct read_cache *c, const struct rc_ent *e, uint64_t now)
{
	return e->epoch == __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE) &&
	       now < e->expires;
}

bool rc_get(struct read_cache *c, const char *key, size_t klen, uint64_t now,
	    struct dir_rec *out)
{
	uint64_t h = XXH3_64bits(key, klen);
	struct rc_stripe *s = stripe_of(c, h);
	pthread_mutex_lock(&s->mu);
	struct rc_ent **at = find(s, h, key, klen);
	struct rc_ent *e = *at;
	bool hit = e && live(c, e, now);
	if (hit) {
		*out = e->rec;
		lru_unlink(s, e);
		lru_front(s, e);
		s->hits++;
	} else {
		if (e)
			unlink_ent(s, at);
		s->misses++;
	}
	pthread_mutex_unlock(&s->mu);
	if (e && !hit)
		free(e);
	return hit;
}

void rc_put(struct read_cache *c, const char *key, size_t klen,
	    const struct dir_rec *rec, uint64_t now)
{
	if (klen == 0 || klen > DIR_KEY_MAX || !rec->found || !rec->resident)
		return;
	uint64_t h = XXH3_64bits(key, klen);
	struct rc_stripe *s = stripe_of(c, h);
	pthread_mutex_lock(&s->mu);
	struct rc_ent **at = find(s, h, key, klen);
	struct rc_ent *e = *at;
	if (e) {
		unlink_ent(s, at); /* refreshed below, at the front */
	} else if (s->n >= s->cap && s->last) {
		/* The least recently used goes; its memory may serve. */
		e = s->last;
		if (live(c, e, now))
			s->evicted++;
		unlink_ent(s, find(s, e->h, e->key, e->klen));
		if (e->kcap < klen) {
			free(e);
			e = NULL;
		}
	}
	if (!e) {
		/* Rounded up, so that the memory serves longer keys later. */
		size_t kcap = PC_MIN((klen + 63) & ~(size_t)63, DIR_KEY_MAX);
		if (!(e = malloc(sizeof(*e) + kcap))) {
			pthread_mutex_unlock(&s->mu);
			return;
		}
		e->kcap = (uint16_t)kcap;
	}
	e->h = h;
	e->klen = (uint16_t)klen;
	memcpy(e->key, key, klen);
	e->rec = *rec;
	e->rec.own_replica = false; /* how a lookup found it, not the record */
	e->epoch = __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE);
	e->expires = now + c->ttl;
	at = &s->chain[h & s->mask];
	e->hnext = *at;
	*at = e;
	lru_front(s, e);
	s->n++;
	PC_DASSERT(s->n <= s->cap);
	pthread_mutex_unlock(&s->mu);
}

void rc_forget(struct read_cache *c, const char *key, size_t klen,
	       const char *node, uint64_t gen)
{
	uint64_t h = XXH3_64bits(key, klen);
	struct rc_stripe *s = stripe_of(c, h);
	pthread_mutex_lock(&s->mu);
	struct rc_ent **at = find(s, h, key, klen);
	struct rc_ent *e = *at;
	if (e && (!node || (strcmp(e->rec.node, node) == 0 &&
			    e->rec.gen == gen)))
		unlink_ent(s, at);
	else
		e = NULL;
	pthread_mutex_unlock(&s->mu);
	free(e);
}

void rc_clear(struct read_cache *c)
{
	__atomic_add_fetch(&c->epoch, 1, __ATOMIC_ACQ_REL);
}

void rc_stats(struct read_cache *c, struct rc_stats *st)
{
	memset(st, 0, sizeof(*st));
	for (unsigned i = 0; i < c->nstripes; i++) {
		struct rc_stripe *s = &c->s[i];
		pthread_mutex_lock(&s->mu);
		st->entries += s->n;
		st->hits += s->hits;
		st->misses += s->misses;
		st->evicted += s->evicted;
		pthread_mutex_unlock(&s->mu);
	}
}
