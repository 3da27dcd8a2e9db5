/*
 * modules/transport.c — what every transport shares: the region table and
 * the argument checks of one operation (transport.h).
 *
 * Owns: struct tp_regs (the batch bookkeeping is transport_batch.c). No
 * reactor calls here, so the fuzz target links this file alone. Threading: any thread; one mutex per table, held
 * for a lookup (a few compares) and never across a pin hook or a callback.
 * Invariants: a key is non-zero and unique among live entries; an entry
 * lives while the table or an operation holds it (refs), and its released
 * hook runs exactly once, after it left the table and the last hold ended.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/sha256.h"
#include "common/util.h"
#include "modules/transport.h"

struct tp_reg_entry {
	struct tp_region r;
	struct tp_regs *t;
	uint32_t key;
	uint32_t refs; /* the table's one, plus one per hold; under lock */
};

void tp_regs_init(struct tp_regs *t)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
}

/* Drop one reference; the last one runs the released hook. */
static void entry_put(struct tp_reg_entry *e)
{
	struct tp_regs *t = e->t;
	pthread_mutex_lock(&t->lock);
	bool last = --e->refs == 0;
	pthread_mutex_unlock(&t->lock);
	if (!last)
		return;
	if (e->r.released)
		e->r.released(e->r.ctx);
	free(e);
}

void tp_regs_fini(struct tp_regs *t)
{
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		if (t->e[i])
			tp_regs_remove(t, t->e[i]->key);
	pthread_mutex_destroy(&t->lock);
}

static bool key_used(const struct tp_regs *t, uint32_t key)
{
	for (unsigned i = 0; i < TP_REGIONS_MAX; i++)
		if (t->e[i] && t->e[i]->key == key)
			return true;
	return false;
}

int tp_regs_add(struct tp_regs *t, const struct tp_region *region,
		uint32_t *key)
{
	*key = 0;
	return tp_regs_add_key(t, region, key);
}

int tp_region_check(const struct tp_region *region)
{
	if (!region->len || !region->pin || !region->unpin ||
	    region->base + region->len < region->base ||
	    (region->access & ~(unsigned)(TP_ACCESS_READ | TP_ACCESS_WRITE)))
		return -EINVAL;
	return 0;
}

int tp_regs_add_key(struct tp_regs *t, const struct tp_region *region,
		    uint32_t *key)
{
	if (tp_region_check(region))
		return -EINVAL;
	struct tp_reg_entry *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->r = *region;
	if (!e->r.access)
		e->r.access = TP_ACCESS_READ;
	e->refs = 1;
	e->t = t;
	e->key = *key;
	pthread_mutex_lock(&t->lock);
	int slot = -1;
	for (unsigned i = 0; i < TP_REGIONS_MAX && slot < 0; i++)
		if (!t->e[i])
			slot = (int)i;
	/* A random key: a peer cannot guess another region's, and a key
	 * withdrawn is not handed out again soon (2^-32 a draw). */
	int ret = slot < 0 ? -ENOSPC : 0;
	if (!ret && e->key && key_used(t, e->key))
		ret = -EEXIST; /* a key chosen by the caller */
	while (!ret && (!e->key || key_used(t, e->key)))
		if (pc_random_bytes(&e->key, sizeof(e->key)) < 0)
			ret = -EIO;
	if (!ret) {
		t->e[slot] = e;
		*key = e->key;
	}
	pthread_mutex_unlock(&t->lock);
	if (ret)
		free(e);
	return ret;
}

int tp_regs_remove(struct tp_regs *t, uint32_t key)
{
	struct tp_reg_entry *e = NULL;
	pthread_mutex_lock(&t->lock);
	for (unsigned i = 0; i < TP_REGIONS_MAX && !e; i++)
		if (t->e[i] && t->e[i]->key == key) {
			e = t->e[i];
			t->e[i] = NULL;
		}
	pthread_mutex_unlock(&t->lock);
	if (!e)
		return -ENOENT;
	entry_put(e);
	return 0;
}

int tp_regs_hold(struct tp_regs *t, uint32_t key, uint64_t addr,
		 uint64_t len, unsigned access, struct tp_hold *h)
{
	if (len == 0)
		return -EINVAL;
	struct tp_reg_entry *e = NULL;
	int ret = -EFAULT;
	pthread_mutex_lock(&t->lock);
	for (unsigned i = 0; i < TP_REGIONS_MAX && !e; i++)
		if (t->e[i] && t->e[i]->key == key)
			e = t->e[i];
	if (e) {
		const struct tp_region *r = &e->r;
		/* Overflow-safe: addr >= base and len <= what is left. */
		if (addr < r->base || addr - r->base > r->len ||
		    len > r->len - (addr - r->base))
			ret = -EFAULT;
		else if ((r->access & access) != access)
			ret = -EACCES;
		else {
			ret = 0;
			e->refs++;
		}
	}
	pthread_mutex_unlock(&t->lock);
	if (ret)
		return ret;
	ret = e->r.pin(e->r.ctx, (uintptr_t)addr, len, &h->pin);
	if (ret < 0) {
		entry_put(e);
		return ret;
	}
	h->e = e;
	return 0;
}

void tp_regs_release(struct tp_hold *h)
{
	struct tp_reg_entry *e = h->e;
	if (!e)
		return;
	h->e = NULL;
	e->r.unpin(e->r.ctx, &h->pin);
	entry_put(e);
}

int tp_regs_select(const struct tp_hold *h, uint64_t addr, uint64_t len,
		   const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pieces,
		   unsigned *n)
{
	const struct tp_region *r = &h->e->r;
	*n = 0;
	if (!r->select)
		return 0;
	int ret = r->select(r->ctx, (uintptr_t)addr, len, sel, pieces, n);
	if (ret <= 0)
		return ret;
	/* The hook's pieces must lie inside the held range: never send a
	 * byte the reader did not name; and together they are at most the
	 * range (the answer's promise, which a reader holds it to). */
	if (*n > TP_SEL_PIECES)
		return -EINVAL;
	uint64_t total = 0;
	for (unsigned i = 0; i < *n; i++) {
		if (pieces[i].addr < addr || pieces[i].len > len ||
		    pieces[i].addr - addr > len - pieces[i].len)
			return -EINVAL;
		total += pieces[i].len; /* each <= len: no overflow */
	}
	return total > len ? -EINVAL : 1;
}

int tp_io_check(uint32_t len, uint32_t hdr_len, const void *hdr,
		const void *buf)
{
	if (len == 0 || len > TP_IO_MAX || hdr_len > len ||
	    (hdr_len && !hdr) || (len > hdr_len && !buf))
		return -EINVAL;
	return 0;
}
