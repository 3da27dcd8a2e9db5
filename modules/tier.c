/*
 * modules/tier.c — tier_none, the tier of a node without a lower tier (see
 * modules/tier.h).
 *
 * Owns: no state. Threading: any. It keeps nothing: every offered page is
 * refused (kv unpublishes its record) and there is never anything to
 * promote.
 */
#include <errno.h>

#include "modules/tier.h"

static int none_offer(const struct tier_page *pg)
{
	(void)pg;
	return -ENOTSUP;
}

static int none_promote(struct rx_reactor *r, const char *key, size_t klen,
			const struct dir_rec *rec,
			void (*done)(void *arg, int res), void *arg)
{
	(void)r;
	(void)key;
	(void)klen;
	(void)rec;
	(void)done;
	(void)arg;
	return -ENOENT;
}

static int none_promote_remote(struct rx_reactor *r, const char *key,
			       size_t klen, const struct dir_rec *rec,
			       uint64_t deadline_ns,
			       void (*done)(void *arg, int res,
					    const struct dir_rec *fresh),
			       void *arg)
{
	(void)r;
	(void)key;
	(void)klen;
	(void)rec;
	(void)deadline_ns;
	(void)done;
	(void)arg;
	return -ENOTSUP;
}

static void none_committed(const struct tier_page *pg, uint64_t len)
{
	(void)pg;
	(void)len;
}

static bool none_holds(const char *key, size_t klen)
{
	(void)key;
	(void)klen;
	return false;
}

static void none_drop(const char *key, size_t klen)
{
	(void)key;
	(void)klen;
}

static int none_scan(uint64_t *cursor, unsigned max,
		     void (*fn)(void *arg, const struct tier_page *pg,
				uint64_t len),
		     void *arg)
{
	(void)cursor;
	(void)max;
	(void)fn;
	(void)arg;
	return 0;
}

const struct tier_ops tier_none = {
	.name = "none",
	.offer = none_offer,
	.promote = none_promote,
	.promote_remote = none_promote_remote,
	.committed = none_committed,
	.holds = none_holds,
	.drop = none_drop,
	.scan = none_scan,
};
