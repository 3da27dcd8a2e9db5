/*
 * modules/slotmap_wire.c — a slot.layout answer read off the wire (see
 * modules/slotmap_wire.h). No state; any thread.
 */
#include "modules/slotmap_wire.h"

#include <errno.h>
#include <string.h>

#include "modules/transport.h"

/* A layout a reader may aim one-sided reads by: classes as
 * slot_layout_plan makes them (sizes in range and ascending, the stride of
 * the size, ways 1..SLOT_WAYS_MAX), each bucket one read, every class's
 * buckets inside the region's bytes. */
static bool layout_sane(const struct sm_layout *l)
{
	if (!l->rkey || !l->base || !l->l.nclasses ||
	    l->l.nclasses > SLOT_CLASSES_MAX)
		return false;
	for (uint32_t c = 0; c < l->l.nclasses; c++) {
		const struct slot_class *k = &l->l.cls[c];
		if (k->max_payload < SLOT_PAYLOAD_MIN ||
		    k->max_payload > SLOT_PAYLOAD_MAX || !k->ways ||
		    k->ways > SLOT_WAYS_MAX || !k->buckets ||
		    k->stride != slot_stride_for(k->max_payload) ||
		    slot_bucket_bytes(k) > TP_IO_MAX || /* one read (u32) */
		    (c && k->max_payload <= l->l.cls[c - 1].max_payload) ||
		    k->buckets > (l->l.bytes - k->offset) /
					 slot_bucket_bytes(k) ||
		    k->offset > l->l.bytes)
			return false;
	}
	return true;
}

int sm_layout_read(struct mp_rd *rd, struct sm_layout *l)
{
	uint32_t n;
	memset(l, 0, sizeof(*l));
	if (mp_rd_map(rd, &n) < 0)
		return -EPROTO;
	for (uint32_t i = 0; i < n; i++) {
		const char *k, *s;
		uint32_t kl, sl, m;
		uint64_t v;
		if (mp_rd_str(rd, &k, &kl) < 0)
			return -EPROTO;
		if (mp_str_eq(k, kl, "node") || mp_str_eq(k, kl, "data")) {
			if (mp_rd_str(rd, &s, &sl) < 0 || sl >= DIR_NODE_MAX)
				return -EPROTO;
			char *d = mp_str_eq(k, kl, "node") ? l->node : l->data;
			memcpy(d, s, sl);
			d[sl] = 0;
		} else if (mp_str_eq(k, kl, "classes")) {
			if (mp_rd_array(rd, &m) < 0 || m == 0 ||
			    m > SLOT_CLASSES_MAX)
				return -EPROTO;
			l->l.nclasses = m;
			for (uint32_t c = 0; c < m; c++) {
				struct slot_class *sc = &l->l.cls[c];
				uint32_t five;
				uint64_t ways;
				if (mp_rd_array(rd, &five) < 0 || five != 5 ||
				    mp_rd_uint(rd, &sc->max_payload) < 0 ||
				    mp_rd_uint(rd, &ways) < 0 ||
				    mp_rd_uint(rd, &sc->buckets) < 0 ||
				    mp_rd_uint(rd, &sc->stride) < 0 ||
				    mp_rd_uint(rd, &sc->offset) < 0 ||
				    ways > SLOT_WAYS_MAX)
					return -EPROTO;
				sc->ways = (uint32_t)ways;
			}
		} else if (mp_rd_uint(rd, &v) == 0) {
			if (mp_str_eq(k, kl, "rkey"))
				l->rkey = (uint32_t)v;
			else if (mp_str_eq(k, kl, "wkey"))
				l->wkey = (uint32_t)v;
			else if (mp_str_eq(k, kl, "base"))
				l->base = v;
			else if (mp_str_eq(k, kl, "bytes"))
				l->l.bytes = v;
			else if (mp_str_eq(k, kl, "epoch"))
				l->epoch = v;
		} else {
			return -EPROTO;
		}
	}
	return layout_sane(l) && l->node[0] && l->data[0] ? 0 : -EPROTO;
}
