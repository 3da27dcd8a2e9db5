/*
 * tests/fuzz/fuzz_data.c — libFuzzer target for the TCP data port's
 * decoder: request and response frames (modules/transport_wire.c) and the
 * checks that decide which bytes of a node a request may touch (the region
 * table, modules/transport.c) — the code that reads a peer's bytes.
 *
 * Per input:
 *   - stream: decode requests back to back as a server connection does
 *     (header, then the payload tp_wire_req_payload says follows); each
 *     READ or WRITE is checked against two registered regions (one
 *     read-only, one writable; 4 KiB heap buffers of exactly that size) and,
 *     when accepted, its bytes are really copied out of or into the region,
 *     so ASan traps any range the checks let through that is not inside;
 *     keys and addresses are steered to the registered ones half of the
 *     time so the accepting paths are reached;
 *   - prefixes: a header decoded from fewer bytes than it needs must ask for
 *     more (0), never accept or reject differently from the whole input,
 *     and an accepted header encodes back to the same bytes;
 *     A READ_SEL is served through the region's select hook, whose
 *     pieces come from the selector's bytes (anywhere, any length): the
 *     pieces tp_regs_select lets through are copied out, so ASan traps
 *     one that is not inside the held range, and together they are at
 *     most the range;
 *   - responses: every 24-byte window decodes or is refused, and an
 *     accepted failure never carries bytes.
 * Every pin is released (counted). Any violation traps.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_data -max_total_time=60 WORKDIR tests/fuzz/corpus/data
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "modules/transport.h"
#include "modules/transport_wire.h"

#define REG_BYTES 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool cond)
{
	if (!cond)
		__builtin_trap();
}

struct fz_reg {
	uint8_t *mem;
	uint32_t key;
	long pins;
};

static int fz_pin(void *ctx, uintptr_t addr, uint64_t len, struct tp_pin *pin)
{
	struct fz_reg *g = ctx;
	/* The table must only ever ask for ranges inside the region. */
	check(addr >= (uintptr_t)g->mem && len <= REG_BYTES &&
	      addr - (uintptr_t)g->mem <= REG_BYTES - len);
	memset(pin, 0, sizeof(*pin));
	g->pins++;
	return 0;
}

/* Pieces from the selector: (offset i16, length u16) pairs relative to
 * the range, byte 0 picking the answer — anything, in or out of range. */
static int fz_select(void *ctx, uintptr_t addr, uint64_t len,
		     const uint8_t sel[TP_SEL_BYTES], struct tp_piece *pc,
		     unsigned *n)
{
	(void)ctx;
	(void)len;
	if (sel[0] % 4 == 0)
		return 0;
	if (sel[0] % 4 == 1)
		return -EIO;
	*n = sel[1] % (TP_SEL_PIECES + 2); /* sometimes too many */
	for (unsigned i = 0; i < *n && i < TP_SEL_PIECES; i++) {
		int16_t off;
		uint16_t l;
		memcpy(&off, sel + 2 + i * 4, 2);
		memcpy(&l, sel + 4 + i * 4, 2);
		pc[i] = (struct tp_piece){addr + (uint64_t)(int64_t)off, l};
	}
	return 1;
}

static void fz_unpin(void *ctx, const struct tp_pin *pin)
{
	struct fz_reg *g = ctx;
	(void)pin;
	g->pins--;
}

static struct tp_regs regs;
static struct fz_reg ro, rw;
static uint8_t sink[REG_BYTES];

static void setup(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	tp_regs_init(&regs);
	struct fz_reg *gs[2] = {&ro, &rw};
	for (int i = 0; i < 2; i++) {
		struct fz_reg *g = gs[i];
		g->mem = malloc(REG_BYTES);
		check(g->mem != NULL);
		memset(g->mem, i, REG_BYTES);
		struct tp_region r = {.base = (uintptr_t)g->mem, .len = REG_BYTES,
			.access = i ? TP_ACCESS_READ | TP_ACCESS_WRITE : 0,
			.pin = fz_pin, .unpin = fz_unpin,
			.select = fz_select, .ctx = g};
		check(tp_regs_add(&regs, &r, &g->key) == 0);
	}
}

/* Half of the requests name a registered key and an address near its
 * region, so the accepting paths are reached; the rest stay as sent. */
static void steer(struct tp_req *q)
{
	if (!(q->flags & 1))
		return;
	struct fz_reg *g = q->flags & 2 ? &rw : &ro;
	q->rkey = g->key;
	q->addr = (uintptr_t)g->mem + (uint64_t)(int64_t)(int16_t)q->addr;
}

/* A READ or WRITE as the server would serve it. */
static void serve(struct tp_req *q, const uint8_t *payload, size_t avail)
{
	steer(q);
	unsigned access = q->op == TP_OP_WRITE ? TP_ACCESS_WRITE : TP_ACCESS_READ;
	struct tp_hold h = {0};
	int ret = tp_regs_hold(&regs, q->rkey, q->addr, q->len, access, &h);
	check(ret == 0 || ret == -EFAULT || ret == -EACCES || ret == -EINVAL);
	if (ret < 0)
		return;
	check(q->len > 0 && q->len <= REG_BYTES);
	uint8_t *at = (uint8_t *)(uintptr_t)q->addr;
	if (q->op == TP_OP_WRITE) {
		check(q->rkey == rw.key); /* only the writable region */
		memcpy(at, payload, PC_MIN((size_t)q->len, avail));
	} else if (q->op == TP_OP_READ_SEL && avail == TP_SEL_BYTES) {
		struct tp_piece pc[TP_SEL_PIECES];
		unsigned n = 0;
		int sel = tp_regs_select(&h, q->addr, q->len, payload, pc, &n);
		check(sel == 0 || sel == 1 || sel == -EIO || sel == -EINVAL);
		if (sel == 1) {
			check(n <= TP_SEL_PIECES);
			uint64_t total = 0; /* what the answer promises */
			for (unsigned i = 0; i < n; i++) {
				memcpy(sink, (const void *)pc[i].addr,
				       PC_MIN(pc[i].len, sizeof(sink)));
				total += pc[i].len;
			}
			check(total <= q->len);
		} else if (sel == 0) {
			memcpy(sink, at, q->len);
		}
	} else {
		memcpy(sink, at, q->len);
	}
	tp_regs_release(&h);
}

static void stream(const uint8_t *data, size_t size)
{
	size_t used = 0;
	while (used < size) {
		struct tp_req q;
		ssize_t n = tp_wire_req_decode(data + used, size - used, &q);
		check(n == 0 || n == -EPROTO || n == TP_REQ_BYTES);
		if (n <= 0)
			return;
		/* A header decoded from its exact bytes answers the same; one
		 * byte less asks for more; what decodes encodes back. */
		uint8_t copy[TP_REQ_BYTES];
		memcpy(copy, data + used, TP_REQ_BYTES);
		struct tp_req q2;
		check(tp_wire_req_decode(copy, TP_REQ_BYTES, &q2) == n);
		check(q.op == q2.op && q.flags == q2.flags &&
		      q.rkey == q2.rkey && q.len == q2.len &&
		      q.addr == q2.addr && q.id == q2.id);
		check(tp_wire_req_decode(copy, TP_REQ_BYTES - 1, &q2) == 0);
		uint8_t again[TP_REQ_BYTES];
		tp_wire_req_encode(&q, again);
		check(memcmp(again, copy, TP_REQ_BYTES) == 0);
		if (q.op == TP_OP_WRITE)
			check(q.len > 0 && q.len <= TP_IO_MAX);
		used += TP_REQ_BYTES;
		uint32_t pay = tp_wire_req_payload(&q);
		size_t avail = PC_MIN((size_t)pay, size - used);
		if (q.op == TP_OP_READ || q.op == TP_OP_WRITE ||
		    q.op == TP_OP_READ_SEL)
			serve(&q, data + used, avail);
		used += avail;
	}
}

static void responses(const uint8_t *data, size_t size)
{
	for (size_t off = 0; off + TP_RESP_BYTES <= size && off < 256; off++) {
		struct tp_resp r;
		int ret = tp_wire_resp_decode(data + off, &r);
		check(ret == 0 || ret == -EPROTO);
		if (ret == 0)
			check(r.status <= TP_STATUS_SELECTED &&
			      (r.status >= 0 || r.len == 0));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	stream(data, size);
	responses(data, size);
	check(ro.pins == 0 && rw.pins == 0);
	return 0;
}
