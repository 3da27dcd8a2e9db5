/*
 * tests/unit/test_discovery_wire.c — the embedded discovery protocol's
 * decoders (modules/discovery_wire.c) on the inputs the fuzz target
 * (tests/fuzz/fuzz_discovery.c) found wrong, and a well-formed list.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "modules/discovery_wire.h"
#include "rpc/mp.h"

static void member(msgpack_packer *pk, const char *id, const char *meta)
{
	msgpack_pack_map(pk, 3);
	mp_pack_cstr(pk, "id");
	mp_pack_cstr(pk, id);
	mp_pack_cstr(pk, "meta");
	mp_pack_cstr(pk, meta);
	mp_pack_cstr(pk, "head");
	msgpack_pack_false(pk);
}

static void begin(msgpack_sbuffer *sb, msgpack_packer *pk)
{
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

static int read_list(msgpack_sbuffer *sb, struct disc_list *l)
{
	struct mp_rd r;
	mp_rd_init(&r, sb->data, sb->size);
	return disc_list_read(r, l, 1000000000ull);
}

Test(discovery_wire, a_list_reads_its_valid_members_and_masters)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	begin(&sb, &pk);
	msgpack_pack_map(&pk, 3);
	mp_pack_cstr(&pk, "epoch");
	msgpack_pack_uint64(&pk, 9);
	mp_pack_cstr(&pk, "masters");
	msgpack_pack_array(&pk, 2);
	mp_pack_cstr(&pk, "127.0.0.1:7001");
	mp_pack_cstr(&pk, "no-port");
	mp_pack_cstr(&pk, "members");
	msgpack_pack_array(&pk, 3);
	member(&pk, "127.0.0.1:6001", "127.0.0.1:7001");
	member(&pk, "bad id", "");
	member(&pk, "127.0.0.2:6001", "");
	struct disc_list l;
	cr_assert_eq(read_list(&sb, &l), 0);
	cr_assert_eq(l.epoch, 9);
	cr_assert_eq(l.nmasters, 1);
	cr_assert_str_eq(l.masters[0], "127.0.0.1:7001");
	cr_assert_eq(l.n, 2);
	cr_assert_str_eq(l.e[0].id, "127.0.0.1:6001");
	cr_assert_str_eq(l.e[1].id, "127.0.0.2:6001");
	free(l.e);
	msgpack_sbuffer_destroy(&sb);
}

/* A member whose meta is refused is left out, and the next member (whose
 * meta is "": not copied) does not inherit the refused bytes. */
Test(discovery_wire, a_refused_meta_never_reaches_the_next_member)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	begin(&sb, &pk);
	msgpack_pack_map(&pk, 1);
	mp_pack_cstr(&pk, "members");
	msgpack_pack_array(&pk, 2);
	member(&pk, "127.0.0.2:6001", "209.0.0.2\xcf" "7001");
	member(&pk, "[::1]:6002", "");
	struct disc_list l;
	cr_assert_eq(read_list(&sb, &l), 0);
	cr_assert_eq(l.n, 1);
	cr_assert_str_eq(l.e[0].id, "[::1]:6002");
	cr_assert_str_eq(l.e[0].meta, "", "meta '%s'", l.e[0].meta);
	free(l.e);
	msgpack_sbuffer_destroy(&sb);
}

/* "members" twice: the second list must not be counted on from the
 * first's members (it wrote past its array). */
Test(discovery_wire, members_given_twice_are_refused)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	begin(&sb, &pk);
	msgpack_pack_map(&pk, 2);
	mp_pack_cstr(&pk, "members");
	msgpack_pack_array(&pk, 3);
	for (int i = 0; i < 3; i++) {
		char id[32];
		snprintf(id, sizeof(id), "127.0.0.%d:6001", i + 1);
		member(&pk, id, "");
	}
	mp_pack_cstr(&pk, "members");
	msgpack_pack_array(&pk, 1);
	member(&pk, "127.0.0.9:6001", "");
	struct disc_list l;
	cr_assert_eq(read_list(&sb, &l), -EPROTO);
	free(l.e);
	msgpack_sbuffer_destroy(&sb);
}

Test(discovery_wire, node_params_and_heartbeat_answers)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	begin(&sb, &pk);
	mp_pack_cstr(&pk, "127.0.0.1:6001");
	mp_pack_cstr(&pk, "");
	msgpack_pack_true(&pk);
	struct mp_rd r;
	struct disc_entry e;
	mp_rd_init(&r, sb.data, sb.size);
	cr_assert_eq(disc_node_read(&r, &e), 0);
	cr_assert_str_eq(e.id, "127.0.0.1:6001");
	cr_assert(e.head && !e.meta[0]);
	mp_rd_init(&r, sb.data, sb.size - 1); /* head cut off */
	cr_assert_eq(disc_node_read(&r, &e), -EINVAL);
	msgpack_sbuffer_clear(&sb);
	msgpack_pack_map(&pk, 2);
	mp_pack_cstr(&pk, "known");
	msgpack_pack_true(&pk);
	mp_pack_cstr(&pk, "epoch");
	mp_pack_cstr(&pk, "not a number");
	struct disc_hb_reply h;
	mp_rd_init(&r, sb.data, sb.size);
	cr_assert_eq(disc_hb_reply_read(r, &h), -EPROTO);
	char out[DISC_ADDR_MAX];
	cr_assert(disc_addr_ok("h:1", 3, out));
	cr_assert(!disc_addr_ok("h:0", 3, out));
	cr_assert(!disc_addr_ok("h:65536", 7, out));
	cr_assert(!disc_addr_ok(":80", 3, out));
	cr_assert(!disc_addr_ok("a,b:80", 6, out));
	msgpack_sbuffer_destroy(&sb);
}
