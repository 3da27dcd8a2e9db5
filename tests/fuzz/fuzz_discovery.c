/*
 * tests/fuzz/fuzz_discovery.c — libFuzzer target for the embedded
 * discovery protocol's messages (modules/discovery_wire.c): the same bytes
 * are read as a member list (discovery.register's and discovery.members'
 * answer), a heartbeat's answer, the [id, meta, head] params of a register
 * or heartbeat, and a "host:port" address. The cursor gets the raw input,
 * not a scanned message: the readers must stay inside any buffer.
 *
 * Invariants (else the target traps): a list read has at most
 * DISC_MEMBERS_MAX members and DISC_MASTERS_MAX masters, each a valid
 * address; a node read has a valid id and a valid or empty meta; an
 * address accepted is host:port with a port 1..65535 and no separator.
 *
 * Build: cmake -DPEERCACHE_FUZZ=ON -DCMAKE_C_COMPILER=clang ...; run:
 * build-fuzz/tests/fuzz/fuzz_discovery -max_total_time=60 WORKDIR
 * tests/fuzz/corpus/discovery (scripts/test.sh does this as a smoke test;
 * tests/fuzz/make_seeds.c writes the corpus).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modules/discovery_wire.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* s is NUL-terminated inside its array and is a valid address. */
static void check_addr(const char *s, bool empty_ok)
{
	size_t n = strnlen(s, DISC_ADDR_MAX);
	char again[DISC_ADDR_MAX];
	check(n < DISC_ADDR_MAX);
	if (n == 0) {
		check(empty_ok);
		return;
	}
	check(disc_addr_ok(s, (uint32_t)n, again) && strcmp(again, s) == 0);
	const char *c = strrchr(s, ':');
	check(c && c != s && !strpbrk(s, ", \t\r\n"));
	long port = strtol(c + 1, NULL, 10);
	check(port >= 1 && port <= 65535);
}

static void list(const uint8_t *data, size_t size)
{
	struct mp_rd r;
	struct disc_list l;
	mp_rd_init(&r, data, size);
	int ret = disc_list_read(r, &l, UINT64_MAX / 2);
	if (ret == 0) {
		check(l.n <= DISC_MEMBERS_MAX && l.nmasters <= DISC_MASTERS_MAX);
		check(l.n == 0 || l.e);
		for (unsigned i = 0; i < l.n; i++) {
			check_addr(l.e[i].id, false);
			check_addr(l.e[i].meta, true);
		}
		for (unsigned i = 0; i < l.nmasters; i++)
			check_addr(l.masters[i], false);
	}
	free(l.e);
}

static void node(const uint8_t *data, size_t size)
{
	struct mp_rd r;
	uint32_t n;
	struct disc_entry e;
	mp_rd_init(&r, data, size);
	if (mp_rd_array(&r, &n) < 0)
		return;
	if (disc_node_read(&r, &e) == 0) {
		check_addr(e.id, false);
		check_addr(e.meta, true);
		check(r.p <= r.end);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mp_rd r;
	struct disc_hb_reply h;
	list(data, size);
	mp_rd_init(&r, data, size);
	(void)disc_hb_reply_read(r, &h);
	node(data, size);
	char out[DISC_ADDR_MAX];
	if (disc_addr_ok((const char *)data, (uint32_t)size, out)) {
		check(size < DISC_ADDR_MAX && memcmp(out, data, size) == 0);
		check_addr(out, false);
	}
	return 0;
}
