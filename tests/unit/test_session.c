/*
 * tests/unit/test_session.c — local sessions (modules/session.c and its
 * decoder, session_req.c) driven in one process: a node (fake transport,
 * cluster, directory, kv, rpc server, session on one reactor) serves its
 * Unix socket; the test thread is the client, with a memfd region passed by
 * SCM_RIGHTS and requests written by hand (so one can be left unanswered
 * while the region is given up). Remote pages come from another member
 * through the fake transport (tests/fake/node_fake.h), with latency.
 *
 * Covers: register (limits, bad descriptors, duplicates), set and get in
 * steps (session_slice_bytes) with local and remote pages byte-exact, a
 * region unregistered or a client gone while a get's remote pages are on
 * their way (the pages never land in the client's memory; the node does
 * not crash or leak), and malformed requests answered with errors while
 * the connection keeps working.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/util.h"
#include "modules/modules.h"
#include "rpc/mp.h"
#include "testutil.h"
#include "tests/fake/node_fake.h"

static const struct pc_module *const mods[] = {
	&nf_mod_transport, &pc_mod_rpc_server, &pc_mod_cluster,
	&pc_mod_directory, &pc_mod_kv, &pc_mod_session,
};

#define REGION (2u << 20)

static struct nf_member m1;
static char sock_path[108];

/* ------------------------------------------------------ a raw client */

struct cli {
	int fd;
	uint32_t msgid;
	msgpack_unpacker up;
};

static void cli_open(struct cli *c)
{
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(c->fd, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	cr_assert_eq(connect(c->fd, (struct sockaddr *)&a, sizeof(a)), 0,
		     "connect %s: %s", sock_path, strerror(errno));
	c->msgid = 1;
	cr_assert(msgpack_unpacker_init(&c->up, 1 << 16));
}

static void cli_close(struct cli *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	msgpack_unpacker_destroy(&c->up);
}

/* Send [0, msgid, method, params] (params: packed array bytes), with fd
 * (or -1). Returns the msgid. */
static uint32_t cli_send(struct cli *c, const char *method,
			 const msgpack_sbuffer *params, int fd)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	uint32_t id = c->msgid++;
	msgpack_pack_array(&pk, 4);
	msgpack_pack_uint32(&pk, 0);
	msgpack_pack_uint32(&pk, id);
	msgpack_pack_str(&pk, strlen(method));
	msgpack_pack_str_body(&pk, method, strlen(method));
	msgpack_sbuffer_write(&sb, params->data, params->size);
	struct iovec iov = {sb.data, sb.size};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	cr_assert_eq(sendmsg(c->fd, &mh, 0), (ssize_t)sb.size);
	msgpack_sbuffer_destroy(&sb);
	return id;
}

/* One reply: its msgid, error (nil: false) and result, copied out. */
struct reply {
	uint32_t id;
	bool error;
	char err[200];
	bool is_array, bools[64];
	unsigned n;
	bool b;   /* a bool result */
	bool map; /* a map result (register) */
};

static void cli_recv(struct cli *c, struct reply *r)
{
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	for (;;) {
		if (msgpack_unpacker_next(&c->up, &u) == MSGPACK_UNPACK_SUCCESS)
			break;
		struct pollfd p = {c->fd, POLLIN, 0};
		cr_assert_eq(poll(&p, 1, 10000), 1, "no reply within 10 s");
		cr_assert(msgpack_unpacker_reserve_buffer(&c->up, 1 << 16));
		ssize_t n = read(c->fd, msgpack_unpacker_buffer(&c->up),
				 msgpack_unpacker_buffer_capacity(&c->up));
		cr_assert_gt(n, 0, "the node closed the connection");
		msgpack_unpacker_buffer_consumed(&c->up, (size_t)n);
	}
	msgpack_object o = u.data;
	cr_assert(o.type == MSGPACK_OBJECT_ARRAY && o.via.array.size == 4);
	memset(r, 0, sizeof(*r));
	r->id = (uint32_t)o.via.array.ptr[1].via.u64;
	msgpack_object e = o.via.array.ptr[2], res = o.via.array.ptr[3];
	r->error = e.type != MSGPACK_OBJECT_NIL;
	if (r->error)
		msgpack_object_print_buffer(r->err, sizeof(r->err), e);
	if (res.type == MSGPACK_OBJECT_ARRAY) {
		r->is_array = true;
		r->n = res.via.array.size;
		for (unsigned i = 0; i < r->n && i < 64; i++)
			r->bools[i] = res.via.array.ptr[i].type ==
					      MSGPACK_OBJECT_BOOLEAN &&
				      res.via.array.ptr[i].via.boolean;
	} else if (res.type == MSGPACK_OBJECT_BOOLEAN) {
		r->b = res.via.boolean;
	} else if (res.type == MSGPACK_OBJECT_MAP) {
		r->map = true;
	}
	msgpack_unpacked_destroy(&u);
}

static void cli_call(struct cli *c, const char *method,
		     const msgpack_sbuffer *params, int fd, struct reply *r)
{
	uint32_t id = cli_send(c, method, params, fd);
	cli_recv(c, r);
	cr_assert_eq(r->id, id);
}

/* Params builders. */
static msgpack_packer *pk_begin(msgpack_sbuffer *sb)
{
	static msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	return &pk;
}

static void pk_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

/* [region_id, size] */
static void reg_params(msgpack_sbuffer *sb, uint64_t id, uint64_t size)
{
	msgpack_packer *pk = pk_begin(sb);
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint64(pk, id);
	msgpack_pack_uint64(pk, size);
}

struct mv_item {
	const char *key;
	uint64_t off, len;
};

/* [region_id, [[key, off, len], ...]] */
static void move_params(msgpack_sbuffer *sb, uint64_t id,
			const struct mv_item *it, unsigned n)
{
	msgpack_packer *pk = pk_begin(sb);
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint64(pk, id);
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		msgpack_pack_array(pk, 3);
		pk_str(pk, it[i].key);
		msgpack_pack_uint64(pk, it[i].off);
		msgpack_pack_uint64(pk, it[i].len);
	}
}

static int memfd_new(size_t size, uint8_t **map)
{
	int fd = memfd_create("pc-test-session", MFD_CLOEXEC);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)size), 0);
	*map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_neq(*map, MAP_FAILED);
	return fd;
}

static void region_register(struct cli *c, uint64_t id, int fd,
			    uint64_t size)
{
	msgpack_sbuffer sb;
	reg_params(&sb, id, size);
	struct reply r;
	cli_call(c, "session.register", &sb, fd, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error, "register: %s", r.err);
	cr_assert(r.map);
}

/* ------------------------------------------------------------- set-up */

/* key (len bytes of pattern seed) held by m1, its record published here */
static void remote_put(const char *key, uint64_t len, uint64_t seed)
{
	uint8_t *buf = malloc(len);
	cr_assert(buf);
	tu_fill_pattern(buf, len, seed, 0);
	nf_member_publish(&m1, key, buf, len, NULL);
	free(buf);
}

/* The fake transport's reads in flight: at least *want (on their way),
 * or none (every read ended: landed, failed or cancelled). */
static bool reads_at_least(void *arg)
{
	return nf_inflight() >= *(unsigned *)arg;
}

static bool reads_none(void *arg)
{
	(void)arg;
	return nf_inflight() == 0;
}

static uint64_t seed_of(void)
{
	return nf_seed("test_session", 0x5e55);
}

static void setup(unsigned remote_latency_us)
{
	nf_settings(32);
	snprintf(sock_path, sizeof(sock_path), "/tmp/pc-test-session-%d.sock",
		 (int)getpid());
	free(nf.s.socket);
	nf.s.socket = strdup(sock_path);
	nf.s.rpc_port = 0;
	nf.s.session_slice_bytes = 64 << 10; /* several steps per move */
	/* remote reads of up to 1.25 s (latency + jitter) fit in both */
	nf.s.rpc_timeout_ms = 5000;
	nf.s.request_deadline_ms = 5000;
	struct tp_fake_opts fo = {.latency_us = remote_latency_us,
				  .jitter_us = remote_latency_us / 4,
				  .reorder = true, .seed = seed_of()};
	nf_start(mods, PC_ARRAY_LEN(mods), &fo);
	nf_member_new(&m1, "127.0.0.2:31999", "127.0.0.2:32000", 16);
}

static void teardown(void)
{
	nf_stop();
	nf_member_free(&m1);
	unlink(sock_path);
}

/* ----------------------------------------------------------------- tests */

Test(session, set_and_get_in_steps_with_local_and_remote_pages)
{
	setup(2000);
	struct cli c;
	cli_open(&c);
	uint8_t *mem;
	int fd = memfd_new(REGION, &mem);
	region_register(&c, 7, fd, REGION);
	/* 12 local pages of 40 KiB (steps of 64 KiB: one or two each) */
	enum { NL = 12, NR = 10, PL = 40 << 10, PR = 24 << 10 };
	struct mv_item it[NL + NR];
	char keys[NL + NR][24];
	for (unsigned i = 0; i < NL; i++) {
		snprintf(keys[i], sizeof(keys[i]), "loc-%u", i);
		it[i] = (struct mv_item){keys[i], (uint64_t)i * PL, PL};
		tu_fill_pattern(mem + it[i].off, PL, 100 + i, 0);
	}
	msgpack_sbuffer sb;
	struct reply r;
	move_params(&sb, 7, it, NL);
	cli_call(&c, "session.set", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error, "set: %s", r.err);
	cr_assert_eq(r.n, NL);
	for (unsigned i = 0; i < NL; i++)
		cr_assert(r.bools[i], "set %u", i);
	for (unsigned i = 0; i < NR; i++) {
		snprintf(keys[NL + i], sizeof(keys[0]), "rem-%u", i);
		remote_put(keys[NL + i], PR, 200 + i);
	}
	/* get all of them into the second half, and one key nobody has */
	memset(mem, 0xee, REGION);
	for (unsigned i = 0; i < NL + NR; i++)
		it[i] = (struct mv_item){keys[i], REGION / 2 + (uint64_t)i * PL,
					 i < NL ? PL : PR};
	struct mv_item all[NL + NR + 1];
	memcpy(all, it, sizeof(it));
	all[NL + NR] = (struct mv_item){"nobody", 0, 4096};
	move_params(&sb, 7, all, NL + NR + 1);
	cli_call(&c, "session.get", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error, "get: %s", r.err);
	cr_assert_eq(r.n, NL + NR + 1);
	for (unsigned i = 0; i < NL + NR; i++) {
		cr_assert(r.bools[i], "get %s", keys[i]);
		uint64_t seed = i < NL ? 100 + i : 200 + (i - NL);
		cr_assert_eq(tu_check_pattern(mem + it[i].off, it[i].len, seed,
					      0), -1, "%s: wrong bytes", keys[i]);
	}
	cr_assert(!r.bools[NL + NR]);
	/* the missed page's slot is untouched */
	for (unsigned b = 0; b < 4096; b++)
		cr_assert_eq(mem[b], 0xee);
	cli_close(&c);
	close(fd);
	munmap(mem, REGION);
	teardown();
}

/*
 * The client gives the region up while a get's remote pages are on their
 * way (1 s of fake latency, so the test sees them under way even on a
 * slow host): by unregistering it (the get answers every
 * page false) and by closing the connection. Either way nothing lands in
 * the client's memory afterwards, and the node keeps serving.
 */
static bool no_locals(void *arg)
{
	(void)arg;
	return tp_fake_node_locals(nf_node()) == 0;
}

Test(session, a_region_given_up_mid_get_gets_no_late_bytes)
{
	setup(1000000);
	enum { NR = 6, PR = 16 << 10 };
	char keys[NR][24];
	struct mv_item it[NR];
	for (unsigned i = 0; i < NR; i++) {
		snprintf(keys[i], sizeof(keys[i]), "late-%u", i);
		remote_put(keys[i], PR, 300 + i);
		it[i] = (struct mv_item){keys[i], (uint64_t)i * PR, PR};
	}
	for (int how = 0; how < 2; how++) {
		struct cli c;
		cli_open(&c);
		uint8_t *mem;
		int fd = memfd_new(REGION, &mem);
		region_register(&c, 1, fd, REGION);
		/* Registered with the transport, so that reads (RDMA) land
		 * in it without a registration per batch. */
		cr_assert_eq(tp_fake_node_locals(nf_node()), 1);
		memset(mem, 0xee, REGION);
		msgpack_sbuffer sb;
		move_params(&sb, 1, it, NR);
		uint32_t get_id = cli_send(&c, "session.get", &sb, -1);
		msgpack_sbuffer_destroy(&sb);
		/* every page's read is on its way (both steps of the move) */
		unsigned want = NR;
		cr_assert(nf_until(reads_at_least, &want, 20000),
			  "%u of %u reads were sent (how %d)", nf_inflight(),
			  want, how);
		if (how == 0) {
			msgpack_packer *pk = pk_begin(&sb);
			msgpack_pack_array(pk, 1);
			msgpack_pack_uint64(pk, 1);
			uint32_t un_id = cli_send(&c, "session.unregister", &sb,
						  -1);
			msgpack_sbuffer_destroy(&sb);
			struct reply r1, r2;
			cli_recv(&c, &r1);
			cli_recv(&c, &r2);
			struct reply *ru = r1.id == un_id ? &r1 : &r2;
			struct reply *rg = r1.id == get_id ? &r1 : &r2;
			cr_assert_eq(ru->id, un_id);
			cr_assert_eq(rg->id, get_id);
			cr_assert(!ru->error && ru->b, "unregister: %s",
				  ru->err);
			cr_assert(!rg->error, "get: %s", rg->err);
			for (unsigned i = 0; i < NR; i++)
				cr_assert(!rg->bools[i],
					  "a page of a given-up region was "
					  "reported found");
			/* Withdrawn from the transport before its pages
			 * were swapped: late RDMA reads fail, not land. */
			cr_assert_eq(tp_fake_node_locals(nf_node()), 0);
		}
		cli_close(&c); /* how 1: the client leaves mid-get */
		/* every late read has landed (in node memory) or ended */
		cr_assert(nf_until(reads_none, NULL, 20000),
			  "%u reads still on their way after 20 s (how %d)",
			  nf_inflight(), how);
		for (size_t b = 0; b < REGION; b++)
			cr_assert_eq(mem[b], 0xee, "byte %zu of a given-up "
				     "region was written (how %d)", b, how);
		cr_assert(nf_until(no_locals, NULL, 20000),
			  "the region is still registered with the transport "
			  "(how %d)", how);
		close(fd);
		munmap(mem, REGION);
	}
	/* the node still serves a new client */
	struct cli c;
	cli_open(&c);
	uint8_t *mem;
	int fd = memfd_new(REGION, &mem);
	region_register(&c, 2, fd, REGION);
	msgpack_sbuffer sb;
	move_params(&sb, 2, it, NR);
	struct reply r;
	cli_call(&c, "session.get", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	for (unsigned i = 0; i < NR; i++) {
		cr_assert(r.bools[i]);
		cr_assert_eq(tu_check_pattern(mem + it[i].off, PR, 300 + i, 0),
			     -1);
	}
	cli_close(&c);
	close(fd);
	munmap(mem, REGION);
	teardown();
}

/* Bad requests get error replies, and the connection goes on working. */
Test(session, limits_and_malformed_requests_are_answered_cleanly)
{
	setup(100);
	struct cli c;
	cli_open(&c);
	uint8_t *mem;
	int fd = memfd_new(REGION, &mem);
	msgpack_sbuffer sb;
	struct reply r;
	struct {
		const char *method;
		int kind; /* how the params are built, below */
		bool with_fd;
		const char *why;
	} bad[] = {
		{"session.register", 0, false, "no descriptor"},
		{"session.register", 1, true, "a file smaller than the size"},
		{"session.register", 2, true, "size 0"},
		{"session.register", 3, true, "not [id, size]"},
		{"session.set", 4, false, "an unknown region"},
		{"session.get", 5, false, "an item past the region's end"},
		{"session.get", 6, false, "an item of length 0"},
		{"session.set", 7, false, "an empty key"},
		{"session.get", 8, false, "no items"},
		{"session.get", 9, false, "offset + len overflows"},
		{"session.set", 10, false, "a key over SESS_KEY_MAX"},
		{"session.register", 11, true, "a pipe, not shared memory"},
	};
	/* a registered region for the move cases */
	region_register(&c, 3, fd, REGION);
	char big[600];
	memset(big, 'k', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	int pfd[2];
	cr_assert_eq(pipe(pfd), 0);
	for (size_t i = 0; i < PC_ARRAY_LEN(bad); i++) {
		struct mv_item one = {"k", 0, 4096};
		int send_fd = bad[i].with_fd ? fd : -1;
		switch (bad[i].kind) {
		case 0: reg_params(&sb, 9, 4096); break;
		case 1: reg_params(&sb, 9, (uint64_t)REGION * 4); break;
		case 2: reg_params(&sb, 9, 0); break;
		case 3: {
			msgpack_packer *pk = pk_begin(&sb);
			msgpack_pack_array(pk, 1);
			pk_str(pk, "nine");
			break;
		}
		case 4: move_params(&sb, 99, &one, 1); break;
		case 5: one.off = REGION - 100; move_params(&sb, 3, &one, 1);
			break;
		case 6: one.len = 0; move_params(&sb, 3, &one, 1); break;
		case 7: one.key = ""; move_params(&sb, 3, &one, 1); break;
		case 8: move_params(&sb, 3, &one, 0); break;
		case 9: one.off = UINT64_MAX - 10; move_params(&sb, 3, &one, 1);
			break;
		case 10: one.key = big; move_params(&sb, 3, &one, 1); break;
		default:
			reg_params(&sb, 9, 4096);
			send_fd = pfd[0];
		}
		cli_call(&c, bad[i].method, &sb, send_fd, &r);
		msgpack_sbuffer_destroy(&sb);
		cr_assert(r.error, "%s with %s was accepted", bad[i].method,
			  bad[i].why);
		cr_assert(strstr(r.err, "bad_params"), "%s (%s): %s",
			  bad[i].method, bad[i].why, r.err);
	}
	close(pfd[0]);
	close(pfd[1]);
	/* the same region id twice */
	reg_params(&sb, 3, 4096);
	cli_call(&c, "session.register", &sb, fd, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(r.error && strstr(r.err, "already"), "%s", r.err);
	/* unregistering what is not there is false, not an error */
	msgpack_packer *pk = pk_begin(&sb);
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, 12345);
	cli_call(&c, "session.unregister", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error && !r.b);
	/* at most 64 regions per session */
	unsigned ok = 1, refused = 0;
	for (uint64_t id = 100; id < 100 + 70; id++) {
		reg_params(&sb, id, 4096);
		cli_call(&c, "session.register", &sb, fd, &r);
		msgpack_sbuffer_destroy(&sb);
		ok += !r.error;
		refused += r.error && strstr(r.err, "at most") != NULL;
	}
	cr_assert_eq(ok, 64, "%u regions accepted", ok);
	cr_assert_eq(refused, 70 - 63);
	/* and the connection still moves pages */
	struct mv_item one = {"after", 0, 4096};
	tu_fill_pattern(mem, 4096, 77, 0);
	move_params(&sb, 3, &one, 1);
	cli_call(&c, "session.set", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error && r.n == 1 && r.bools[0], "%s", r.err);
	memset(mem, 0, 4096);
	move_params(&sb, 3, &one, 1);
	cli_call(&c, "session.get", &sb, -1, &r);
	msgpack_sbuffer_destroy(&sb);
	cr_assert(!r.error && r.bools[0]);
	cr_assert_eq(tu_check_pattern(mem, 4096, 77, 0), -1);
	cli_close(&c);
	close(fd);
	munmap(mem, REGION);
	teardown();
}

/* Remote pages with errors and partial reads on the way: a page reported
 * found is byte-exact in the region; the others are reported missing. */
Test(session, remote_pages_under_faults_are_exact_or_missing)
{
	setup(200);
	enum { NR = 16, PR = 20 << 10, ROUNDS = 3 };
	char keys[NR][24];
	struct mv_item it[NR];
	for (unsigned i = 0; i < NR; i++) {
		snprintf(keys[i], sizeof(keys[i]), "flt-%u", i);
		remote_put(keys[i], PR, 400 + i);
		it[i] = (struct mv_item){keys[i], (uint64_t)i * PR, PR};
	}
	struct tp_fake_opts fo = {.latency_us = 200, .jitter_us = 400,
				  .reorder = true, .error_pct = 30,
				  .partial_pct = 30, .seed = seed_of()};
	nf_set_faults(&fo);
	struct cli c;
	cli_open(&c);
	uint8_t *mem;
	int fd = memfd_new(REGION, &mem);
	region_register(&c, 4, fd, REGION);
	unsigned hits = 0, misses = 0;
	for (unsigned round = 0; round < ROUNDS; round++) {
		memset(mem, 0, REGION);
		msgpack_sbuffer sb;
		struct reply r;
		move_params(&sb, 4, it, NR);
		cli_call(&c, "session.get", &sb, -1, &r);
		msgpack_sbuffer_destroy(&sb);
		cr_assert(!r.error && r.n == NR, "%s", r.err);
		for (unsigned i = 0; i < NR; i++) {
			if (!r.bools[i]) {
				misses++;
				continue;
			}
			hits++;
			cr_assert_eq(tu_check_pattern(mem + it[i].off, PR,
						      400 + i, 0), -1,
				     "%s: reported found with wrong bytes",
				     keys[i]);
		}
	}
	cr_assert_gt(hits, 0);
	cr_assert_gt(misses, 0, "the faults did not fault");
	cli_close(&c);
	close(fd);
	munmap(mem, REGION);
	teardown();
}

/*
 * A client leaves (closes its connection) right after sending a large set:
 * whatever the node stored of it is the client's bytes, never a page
 * copied after its region was swapped for node memory. Another client
 * then finds each page exact or missing.
 */
Test(session, a_client_gone_mid_set_stores_exact_pages_or_none)
{
	setup(100);
	enum { NP = 40, PS = 48 << 10 };
	char keys[NP][24];
	struct mv_item it[NP];
	for (unsigned round = 0; round < 3; round++) {
		struct cli c;
		cli_open(&c);
		uint8_t *mem;
		int fd = memfd_new(REGION, &mem);
		region_register(&c, 5, fd, REGION);
		for (unsigned i = 0; i < NP; i++) {
			snprintf(keys[i], sizeof(keys[i]), "gone%u-%u", round,
				 i);
			it[i] = (struct mv_item){keys[i], (uint64_t)i * PS, PS};
			tu_fill_pattern(mem + it[i].off, PS, 500 + i, 0);
		}
		msgpack_sbuffer sb;
		move_params(&sb, 5, it, NP);
		cli_send(&c, "session.set", &sb, -1);
		msgpack_sbuffer_destroy(&sb);
		if (round)
			usleep(round * 1000);
		cli_close(&c);
		close(fd);
		munmap(mem, REGION);
		usleep(200000); /* the node notices and ends the move */
		cli_open(&c);
		fd = memfd_new(REGION, &mem);
		region_register(&c, 6, fd, REGION);
		memset(mem, 0, REGION);
		struct reply r;
		move_params(&sb, 6, it, NP);
		cli_call(&c, "session.get", &sb, -1, &r);
		msgpack_sbuffer_destroy(&sb);
		cr_assert(!r.error && r.n == NP, "%s", r.err);
		unsigned found = 0;
		for (unsigned i = 0; i < NP; i++) {
			if (!r.bools[i])
				continue;
			found++;
			cr_assert_eq(tu_check_pattern(mem + it[i].off, PS,
						      500 + i, 0), -1,
				     "%s was stored with bytes that are not "
				     "the client's", keys[i]);
		}
		printf("test_session: round %u: %u of %u pages stored before "
		       "the client left\n", round, found, NP);
		cli_close(&c);
		close(fd);
		munmap(mem, REGION);
	}
	teardown();
}
