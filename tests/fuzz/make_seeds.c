/*
 * tests/fuzz/make_seeds.c — writes the seed corpora of fuzz_discovery,
 * fuzz_etcd, fuzz_disk and fuzz_slot: valid inputs made with the node's
 * own encoders (msgpack-c as the node packs, dl_*_encode, slot_write), so
 * that a format change is one re-run away. Built in the fuzz tree:
 *
 *   build-fuzz/tests/fuzz/make_seeds tests/fuzz/corpus
 *
 * rewrites tests/fuzz/corpus/{discovery,etcd,disk,slot}/seed-*.bin (the
 * same bytes every run; review and commit them). Files other than seed-*
 * (crashes kept as regressions) are left alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checksum.h"
#include "modules/discovery_wire.h"
#include "rpc/mp.h"
#include "storage/disk_log.h"
#include "storage/slot_region.h"

static const char *root;

static void put(const char *target, unsigned i, const void *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", root, target);
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/seed-%02u.bin", root, target, i);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* ---- discovery: what the meta port's answers and params look like */

static void pk_bool(msgpack_packer *pk, bool v)
{
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

struct member {
	const char *id, *meta;
	bool head, suspect;
	uint64_t age_ms;
};

/* As discovery.c's pack_list (with the view's extra keys when view). */
static void pk_list(msgpack_packer *pk, uint64_t epoch, uint64_t states,
		    const char *const *masters, unsigned nm,
		    const struct member *m, unsigned n, bool view)
{
	msgpack_pack_map(pk, view ? 8 : 5);
	mp_pack_cstr(pk, "epoch");
	msgpack_pack_uint64(pk, epoch);
	mp_pack_cstr(pk, "states");
	msgpack_pack_uint64(pk, states);
	mp_pack_cstr(pk, "warm");
	pk_bool(pk, true);
	if (view) {
		mp_pack_cstr(pk, "from");
		mp_pack_cstr(pk, "127.0.0.1:7001");
		mp_pack_cstr(pk, "self");
		mp_pack_cstr(pk, "127.0.0.1:6001");
		mp_pack_cstr(pk, "backend");
		mp_pack_cstr(pk, "embedded");
	}
	mp_pack_cstr(pk, "masters");
	msgpack_pack_array(pk, nm);
	for (unsigned i = 0; i < nm; i++)
		mp_pack_cstr(pk, masters[i]);
	mp_pack_cstr(pk, "members");
	msgpack_pack_array(pk, n);
	for (unsigned i = 0; i < n; i++) {
		msgpack_pack_map(pk, 6);
		mp_pack_cstr(pk, "id");
		mp_pack_cstr(pk, m[i].id);
		mp_pack_cstr(pk, "meta");
		mp_pack_cstr(pk, m[i].meta);
		mp_pack_cstr(pk, "head");
		pk_bool(pk, m[i].head);
		mp_pack_cstr(pk, "role");
		mp_pack_cstr(pk, m[i].head ? "head" : "member");
		mp_pack_cstr(pk, "state");
		mp_pack_cstr(pk, m[i].suspect ? "suspect" : "alive");
		mp_pack_cstr(pk, "age_ms");
		msgpack_pack_uint64(pk, m[i].age_ms);
	}
}

static void discovery(void)
{
	static const struct member m[] = {
		{"127.0.0.1:6001", "127.0.0.1:7001", true, false, 12},
		{"127.0.0.2:6001", "127.0.0.2:7001", false, false, 480},
		{"[::1]:6002", "", false, true, 3100},
		{"node-4.example:6001", "node-4.example:7001", false, false,
		 0}};
	static const char *const masters[] = {"127.0.0.1:7001",
					      "127.0.0.2:7001"};
	msgpack_sbuffer sb;
	msgpack_packer pk;
	unsigned i = 0;
#define SEED(body)                                                           \
	do {                                                                 \
		msgpack_sbuffer_init(&sb);                                   \
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);        \
		body;                                                        \
		put("discovery", i++, sb.data, sb.size);                     \
		msgpack_sbuffer_destroy(&sb);                                \
	} while (0)
	/* discovery.members / .register answers */
	SEED(pk_list(&pk, 7, 2, masters, 2, m, 4, false));
	SEED(pk_list(&pk, 1, 0, masters, 1, m, 1, false));
	SEED(pk_list(&pk, 0, 0, NULL, 0, NULL, 0, false));
	SEED(pk_list(&pk, 42, 9, masters, 2, m + 1, 3, true));
	/* a heartbeat's answer */
	SEED({
		msgpack_pack_map(&pk, 4);
		mp_pack_cstr(&pk, "known");
		pk_bool(&pk, true);
		mp_pack_cstr(&pk, "epoch");
		msgpack_pack_uint64(&pk, 7);
		mp_pack_cstr(&pk, "states");
		msgpack_pack_uint64(&pk, 2);
		mp_pack_cstr(&pk, "warm");
		pk_bool(&pk, false);
	});
	/* register / heartbeat params, deregister's */
	SEED({
		msgpack_pack_array(&pk, 3);
		mp_pack_cstr(&pk, m[1].id);
		mp_pack_cstr(&pk, m[1].meta);
		pk_bool(&pk, false);
	});
	SEED({
		msgpack_pack_array(&pk, 3);
		mp_pack_cstr(&pk, m[2].id);
		mp_pack_cstr(&pk, "");
		pk_bool(&pk, true);
	});
	SEED({
		msgpack_pack_array(&pk, 1);
		mp_pack_cstr(&pk, m[0].id);
	});
	/* a bare address */
	put("discovery", i++, "10.1.2.3:65535", 14);
#undef SEED
}

/* ---- etcd: the gateway's answers (mode byte, step byte, text) */

static void etcd_seed(unsigned i, unsigned mode, const char *text)
{
	size_t n = strlen(text);
	char *b = malloc(n + 2);
	b[0] = (char)mode;
	b[1] = 23; /* chunk pieces of 3 bytes in, 4 out */
	memcpy(b + 2, text, n);
	put("etcd", i, b, n + 2);
	free(b);
}

static void etcd(void)
{
	unsigned i = 0;
	/* lease grant, keepalive, range with two members, watch events,
	 * an error (value: base64 of {"id":"127.0.0.1:6001",...}) */
	etcd_seed(i++, 0, "{\"header\":{\"cluster_id\":\"14841639068965178418\","
		  "\"revision\":\"12\"},\"ID\":\"7587862072\",\"TTL\":\"10\"}");
	etcd_seed(i++, 0, "{\"result\":{\"header\":{\"revision\":\"13\"},"
		  "\"ID\":\"7587862072\",\"TTL\":\"10\"}}");
	etcd_seed(i++, 0, "{\"header\":{\"revision\":\"14\"},\"kvs\":[{\"key\":"
		  "\"L3BlZXJjYWNoZS9tZW1iZXJzLzEyNy4wLjAuMTo2MDAx\","
		  "\"create_revision\":\"5\",\"mod_revision\":\"5\",\"version\":"
		  "\"1\",\"value\":\"eyJpZCI6IjEyNy4wLjAuMTo2MDAxIiwiZGF0YSI6Ij"
		  "EyNy4wLjAuMTo2MTAxIn0=\",\"lease\":\"7587862072\"},{\"key\":"
		  "\"L3BlZXJjYWNoZS9tZW1iZXJzLzEyNy4wLjAuMjo2MDAx\",\"value\":"
		  "\"eyJpZCI6IjEyNy4wLjAuMjo2MDAxIn0=\"}],\"count\":\"2\"}");
	etcd_seed(i++, 0, "{\"result\":{\"header\":{\"revision\":\"15\"},"
		  "\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"L3BlZXJj"
		  "YWNoZS9tZW1iZXJzLzEyNy4wLjAuMjo2MDAx\",\"mod_revision\":"
		  "\"15\"}}],\"canceled\":false,\"compact_revision\":\"3\"}}");
	etcd_seed(i++, 0, "{\"error\":\"etcdserver: requested lease not found"
		  "\",\"code\":5,\"message\":\"etcdserver: requested lease not "
		  "found \\u0041\\n\"}");
	/* HTTP heads: with a length, chunked (as the watch stream comes) */
	etcd_seed(i++, 1, "HTTP/1.1 200 OK\r\nContent-Type: application/json"
		  "\r\nContent-Length: 2\r\n\r\n{}");
	etcd_seed(i++, 1, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		  "Connection: keep-alive\r\n\r\n1a\r\n{\"result\":{\"header\":"
		  "{}}}\r\n3;ext=1\r\n[1]\r\n0\r\nTrailer: x\r\n\r\n");
	etcd_seed(i++, 1, "HTTP/1.0 503 Service Unavailable\r\nConnection: "
		  "close\r\n\r\n");
	/* base64 */
	etcd_seed(i++, 2, "eyJpZCI6IjEyNy4wLjAuMTo2MDAxIn0=");
	etcd_seed(i++, 2, "AAEC/w==");
}

/* ---- disk: region images as the tier writes them (fuzz_disk's runs) */

struct runs {
	uint8_t b[1 << 16];
	size_t n;
};

static void run(struct runs *r, const void *p, size_t n)
{
	r->b[r->n++] = (uint8_t)n;
	r->b[r->n++] = (uint8_t)(n >> 8);
	memcpy(r->b + r->n, p, n);
	r->n += n;
}

static void next_region(struct runs *r)
{
	r->b[r->n++] = 0xff;
	r->b[r->n++] = 0xff;
}

/* A record of key with a payload of len bytes of c, as the tier lays it
 * out (header, key, payload), in runs of at most one block. */
static void record(struct runs *r, const char *key, size_t len, char c,
		   uint64_t gen, uint64_t seq)
{
	size_t klen = strlen(key), n = DL_HDR_BYTES + klen + len;
	uint8_t *b = calloc(1, n);
	memcpy(b + DL_HDR_BYTES, key, klen);
	memset(b + DL_HDR_BYTES + klen, c, len);
	dl_rec_hdr_encode(b, klen, len, gen, seq,
			  pc_page_sum(b + DL_HDR_BYTES + klen, len));
	for (size_t at = 0; at < n; at += DL_BLOCK)
		run(r, b + at, n - at < DL_BLOCK ? n - at : DL_BLOCK);
	free(b);
}

static void disk(void)
{
	/* the store fuzz_disk makes: 4 regions of DL_REGION_MIN */
	struct dl_params p = {.capacity = 4ull * DL_REGION_MIN,
			      .region_bytes = DL_REGION_MIN};
	memcpy(p.store_id, "fuzz-store-id-01", 16);
	struct dlog *d;
	if (dl_new(&d, &p) < 0)
		exit(1);
	static uint8_t block[DL_BLOCK];
	static struct runs r;
	unsigned i = 0;
	/* 1: one region, three records (one two blocks long), checked */
	r.n = 0;
	r.b[r.n++] = 1;
	dl_region_hdr_encode(d, 0, 10, block);
	run(&r, block, sizeof(struct dl_region_hdr));
	record(&r, "page-a", 100, 'a', 1, 11);
	record(&r, "page-b", 5000, 'b', 2, 12);
	record(&r, "page-a", 7, 'A', 3, 13); /* a newer version of page-a */
	put("disk", i++, r.b, r.n);
	/* 2: two regions, a key in both (the newer wins), then appends */
	r.n = 0;
	r.b[r.n++] = 1 | 8;
	dl_region_hdr_encode(d, 0, 20, block);
	run(&r, block, sizeof(struct dl_region_hdr));
	record(&r, "k1", 10, '1', 1, 25);
	record(&r, "k2", 20, '2', 1, 26);
	next_region(&r);
	dl_region_hdr_encode(d, 1, 30, block);
	run(&r, block, sizeof(struct dl_region_hdr));
	record(&r, "k1", 30, 'x', 2, 31);
	put("disk", i++, r.b, r.n);
	/* 3: a leftover record older than its region (ends the scan), and
	 * a damaged payload (dropped), with the checksums left as written */
	r.n = 0;
	r.b[r.n++] = 1;
	dl_region_hdr_encode(d, 0, 50, block);
	run(&r, block, sizeof(struct dl_region_hdr));
	record(&r, "fresh", 64, 'f', 1, 51);
	size_t bad_at = r.n + 2 + DL_HDR_BYTES + 3;
	record(&r, "damaged", 64, 'd', 1, 52);
	r.b[bad_at] ^= 0x40;
	record(&r, "stale", 64, 's', 1, 49);
	record(&r, "after", 64, 'z', 1, 53);
	put("disk", i++, r.b, r.n);
	/* 4: the same with bits 1 and 2: the target fixes every checksum */
	r.b[0] = 1 | 2 | 4 | 8;
	put("disk", i++, r.b, r.n);
	dl_free(d);
}

/* ---- slot: a layout answer, buckets, a selection, owner writes */

static void slot(void)
{
	unsigned i = 0;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	/* mode 0: slot.layout as slotmap.c's m_layout answers */
	const struct slot_class_spec specs[] = {
		{.max_payload = 4096, .ways = 4, .share_pm = 300},
		{.max_payload = 65536, .ways = 2, .share_pm = 700}};
	struct slot_layout l;
	if (slot_layout_plan(&l, 64 << 20, specs, 2, NULL) < 0)
		exit(1);
	msgpack_sbuffer_init(&sb);
	msgpack_sbuffer_write(&sb, "\0", 1); /* the mode byte */
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 8);
	mp_pack_cstr(&pk, "node");
	mp_pack_cstr(&pk, "127.0.0.1:6001");
	mp_pack_cstr(&pk, "data");
	mp_pack_cstr(&pk, "127.0.0.1:6101");
	mp_pack_cstr(&pk, "rkey");
	msgpack_pack_uint32(&pk, 0x1234);
	mp_pack_cstr(&pk, "wkey");
	msgpack_pack_uint32(&pk, 0x5678);
	mp_pack_cstr(&pk, "base");
	msgpack_pack_uint64(&pk, 0x7f0000000000ull);
	mp_pack_cstr(&pk, "bytes");
	msgpack_pack_uint64(&pk, l.bytes);
	mp_pack_cstr(&pk, "epoch");
	msgpack_pack_uint64(&pk, 3);
	mp_pack_cstr(&pk, "classes");
	msgpack_pack_array(&pk, l.nclasses);
	for (uint32_t c = 0; c < l.nclasses; c++) {
		msgpack_pack_array(&pk, 5);
		msgpack_pack_uint64(&pk, l.cls[c].max_payload);
		msgpack_pack_uint32(&pk, l.cls[c].ways);
		msgpack_pack_uint64(&pk, l.cls[c].buckets);
		msgpack_pack_uint64(&pk, l.cls[c].stride);
		msgpack_pack_uint64(&pk, l.cls[c].offset);
	}
	put("slot", i++, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);

	/* modes 1 and 2: real slots of key "k" + 'q' written by slot_write
	 * into a one-class region like fuzz_slot's */
	const struct slot_class_spec one = {.max_payload = 4096, .ways = 4,
					    .buckets = 1};
	if (slot_layout_plan(&l, 1 << 20, &one, 1, NULL) < 0)
		exit(1);
	uint8_t *base = calloc(1, l.bytes);
	struct slot_region *s;
	if (slot_region_new(&s, base, &l) < 0)
		exit(1);
	struct slot_key k, other;
	slot_key_of(&k, "kq", 2);
	slot_key_of(&other, "kr", 2);
	static uint8_t page[4096], b[1 << 16];
	memset(page, 'o', sizeof(page));
	slot_write(s, &other, page, 300);
	memset(page, 'q', sizeof(page));
	slot_write(s, &k, page, 1000);
	const struct slot_class *c = &l.cls[0];
	for (unsigned fl = 0; fl < 2; fl++) {
		size_t n = 0;
		b[n++] = 1;
		b[n++] = fl ? 0x10 : 0; /* ask for the length: 300 (a miss) */
		b[n++] = 'q';
		for (uint32_t w = 0; w < 2; w++) {
			const uint8_t *sl = base + w * c->stride;
			uint64_t len;
			memcpy(&len, sl + 32, 8);
			size_t run_n = SLOT_HDR_BYTES + len;
			b[n++] = (uint8_t)run_n;
			b[n++] = (uint8_t)(run_n >> 8);
			memcpy(b + n, sl, run_n);
			n += run_n;
		}
		b[1] |= 2; /* FIX_TRAILER: the trailer is not in the run */
		put("slot", i++, b, n);
	}
	/* mode 2: the selection the owner sends for key kq */
	struct slot_sel sel;
	uint64_t boff = slot_bucket_off(c, &k);
	if (slot_pick(s, boff, slot_bucket_bytes(c), k.lo, k.hi, &sel) != 1)
		exit(1);
	size_t n = 0;
	b[n++] = 2;
	b[n++] = 0;
	b[n++] = 'q';
	memcpy(b + n, base + sel.slot_off, SLOT_HDR_BYTES + sel.len);
	n += SLOT_HDR_BYTES + sel.len;
	memcpy(b + n, base + sel.slot_off + sel.trailer_off, 8);
	n += 8;
	put("slot", i++, b, n);
	/* mode 3: owner writes — one over a header's length, one over a
	 * payload byte, one a whole zero header */
	n = 0;
	b[n++] = 3;
	uint32_t offs[] = {32, 64 + 10, (uint32_t)c->stride};
	uint16_t lens[] = {8, 1, 64};
	for (unsigned j = 0; j < 3; j++) {
		memcpy(b + n, &offs[j], 4);
		memcpy(b + n + 4, &lens[j], 2);
		n += 6;
		memset(b + n, j == 0 ? 0x20 : 0, lens[j]);
		n += lens[j];
	}
	put("slot", i++, b, n);
	slot_region_free(s);
	free(base);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n",
			argv[0]);
		return 2;
	}
	root = argv[1];
	discovery();
	etcd();
	disk();
	slot();
	return 0;
}
