/*
 * modules/slotmap_wire.h — what a reader in slotmap mode learns from an
 * owner's slot.layout answer (docs/slotmap.md): where the owner's slot
 * region is, under which keys, and how it is cut — read and checked by a
 * pure function, so that a layout that would aim a read outside the
 * region, or at a bucket no read can hold, is never used.
 *
 * Owns: struct sm_layout and its decoder; no state. Threading: any (the
 * reactors of slotmap_kv.c). Fuzzed by tests/fuzz/fuzz_slot.c.
 */
#ifndef PC_MODULES_SLOTMAP_WIRE_H
#define PC_MODULES_SLOTMAP_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include "modules/placement.h"
#include "rpc/mp.h"
#include "storage/slot_region.h"

/* What an owner announces with slot.layout: where its region is, under
 * which keys, and how it is cut. */
struct sm_layout {
	bool valid;
	char node[DIR_NODE_MAX]; /* its ring id */
	char data[DIR_NODE_MAX]; /* its data endpoint */
	uint32_t rkey, wkey;     /* read and write keys of the region */
	uint64_t base;
	uint64_t epoch;          /* the owner's membership epoch then */
	struct slot_layout l;
};

/* Read a slot.layout answer {node, data, rkey, wkey, base, bytes, epoch,
 * classes: [[max_payload, ways, buckets, stride, offset]...]} into l
 * (zeroed first; valid stays false, the caller sets it). 0, or -EPROTO
 * when it is malformed or not sane: no node or data, no rkey or base, a
 * class out of range, out of order or with a stride not its size's, a
 * bucket larger than one read, or buckets past the region's bytes. */
int sm_layout_read(struct mp_rd *rd, struct sm_layout *l);

#endif /* PC_MODULES_SLOTMAP_WIRE_H */
