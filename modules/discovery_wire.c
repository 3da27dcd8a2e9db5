/*
 * modules/discovery_wire.c — the embedded discovery protocol's decoders
 * (see modules/discovery_wire.h). No state; any thread.
 */
#include "modules/discovery_wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool disc_addr_ok(const char *s, uint32_t len, char *out)
{
	if (len == 0 || len >= DISC_ADDR_MAX || memchr(s, '\0', len))
		return false;
	memcpy(out, s, len);
	out[len] = '\0';
	const char *c = strrchr(out, ':');
	char *end;
	long port = c ? strtol(c + 1, &end, 10) : 0;
	return c && c != out && c[1] && !*end && port > 0 && port <= 65535 &&
	       !strpbrk(out, ", \t\r\n");
}

int disc_list_read(struct mp_rd r, struct disc_list *l, uint64_t now)
{
	uint32_t nk, n;
	const char *k, *s;
	uint32_t kl, sl;
	memset(l, 0, sizeof(*l));
	if (mp_rd_map(&r, &nk) < 0)
		return -EPROTO;
	for (uint32_t i = 0; i < nk; i++) {
		if (mp_rd_str(&r, &k, &kl) < 0)
			return -EPROTO;
		if (mp_str_eq(k, kl, "epoch")) {
			if (mp_rd_uint(&r, &l->epoch) < 0)
				return -EPROTO;
		} else if (mp_str_eq(k, kl, "states")) {
			if (mp_rd_uint(&r, &l->states) < 0)
				return -EPROTO;
		} else if (mp_str_eq(k, kl, "masters")) {
			if (mp_rd_array(&r, &n) < 0)
				return -EPROTO;
			for (uint32_t j = 0; j < n; j++) {
				if (mp_rd_str(&r, &s, &sl) < 0)
					return -EPROTO;
				if (l->nmasters < DISC_MASTERS_MAX &&
				    disc_addr_ok(s, sl, l->masters[l->nmasters]))
					l->nmasters++;
			}
		} else if (mp_str_eq(k, kl, "members")) {
			/* Given twice, the second list would be counted on
			 * from the first one's n, past its array. */
			if (l->e || mp_rd_array(&r, &n) < 0 ||
			    n > DISC_MEMBERS_MAX)
				return -EPROTO;
			if (!(l->e = calloc(n + 1, sizeof(*l->e))))
				return -ENOMEM;
			for (uint32_t j = 0; j < n; j++) {
				struct disc_entry *e = &l->e[l->n];
				uint32_t nf;
				bool ok = true;
				/* A member left out leaves nothing (a meta
				 * copied before it was refused) to the next */
				memset(e, 0, sizeof(*e));
				if (mp_rd_map(&r, &nf) < 0)
					return -EPROTO;
				for (uint32_t f = 0; f < nf; f++) {
					uint64_t u;
					if (mp_rd_str(&r, &k, &kl) < 0)
						return -EPROTO;
					if (mp_str_eq(k, kl, "id"))
						ok &= mp_rd_str(&r, &s, &sl) == 0 &&
						      disc_addr_ok(s, sl, e->id);
					else if (mp_str_eq(k, kl, "meta"))
						ok &= mp_rd_str(&r, &s, &sl) == 0 &&
						      (sl == 0 ||
						       disc_addr_ok(s, sl, e->meta));
					else if (mp_str_eq(k, kl, "head"))
						ok &= mp_rd_bool(&r, &e->head) == 0;
					else if (mp_str_eq(k, kl, "state"))
						ok &= mp_rd_str(&r, &s, &sl) == 0 &&
						      ((e->suspect = mp_str_eq(
								s, sl, "suspect")),
						       true);
					else if (mp_str_eq(k, kl, "age_ms"))
						ok &= mp_rd_uint(&r, &u) == 0 &&
						      ((e->seen_ns = now - u * 1000000),
						       true);
					else
						ok &= mp_skip(&r) == 0;
				}
				if (ok && e->id[0])
					l->n++;
			}
		} else if (mp_skip(&r) < 0) {
			return -EPROTO;
		}
	}
	return 0;
}


int disc_hb_reply_read(struct mp_rd r, struct disc_hb_reply *h)
{
	uint32_t nk, kl;
	const char *k;
	memset(h, 0, sizeof(*h));
	if (mp_rd_map(&r, &nk) < 0)
		return -EPROTO;
	for (uint32_t i = 0; i < nk; i++) {
		int ret;
		if (mp_rd_str(&r, &k, &kl) < 0)
			return -EPROTO;
		if (mp_str_eq(k, kl, "known"))
			ret = mp_rd_bool(&r, &h->known);
		else if (mp_str_eq(k, kl, "warm"))
			ret = mp_rd_bool(&r, &h->warm);
		else if (mp_str_eq(k, kl, "epoch"))
			ret = mp_rd_uint(&r, &h->epoch);
		else if (mp_str_eq(k, kl, "states"))
			ret = mp_rd_uint(&r, &h->states);
		else
			ret = mp_skip(&r);
		if (ret < 0)
			return -EPROTO;
	}
	return 0;
}

int disc_node_read(struct mp_rd *p, struct disc_entry *e)
{
	const char *s;
	uint32_t len;
	memset(e, 0, sizeof(*e));
	if (mp_rd_str(p, &s, &len) < 0 || !disc_addr_ok(s, len, e->id))
		return -EINVAL;
	if (mp_rd_str(p, &s, &len) < 0 ||
	    (len && !disc_addr_ok(s, len, e->meta)))
		return -EINVAL;
	return mp_rd_bool(p, &e->head) < 0 ? -EINVAL : 0;
}
