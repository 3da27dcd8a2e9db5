/*
 * bench/p2p_bench.h — what the two halves of pc-p2p-bench share: the limits,
 * the options, the run (struct bench), a worker with its batches in flight,
 * and the calls between p2p_bench.c (options, the workers' loop, the report,
 * main) and p2p_targets.c (connections, wire formats, setup, each target's
 * issue and complete, the tcp sink).
 *
 * Owns: no state but the declaration of wire_err. struct bench is filled on the
 * main thread before any worker starts and only read after; a struct worker
 * and its slots belong to the worker's thread while it runs.
 *
 * Invariants: the limits below bound every option and buffer (see the head
 * of p2p_bench.c); an item's framing fits in ITEM_TAIL_OFF bytes, asserted in
 * p2p_targets.c next to the data port's wire structs.
 */
#ifndef PC_BENCH_P2P_BENCH_H
#define PC_BENCH_P2P_BENCH_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "lg_hist.h"
#include "p2p_wire.h"
#include "common/util.h"

#define THREADS_MAX 64u
#define PIPELINE_MAX 64u
#define BATCH_MAX 1024u
#define MEMBERS_MAX 16u          /* ring members and data endpoints */
#define KEY_BYTES_MAX 48u
#define KEYS_MAX (4u << 20)
#define VALUE_BYTES_MIN 16u      /* room for the two 8-byte stamps */
#define VALUE_BYTES_MAX (64ull << 20)
#define SETUP_MSG_BYTES (48u << 20) /* one setup request: under the node's
				     * rpc_max_message_bytes (64 MiB) */
#define SETUP_CALL_KEYS 1024u
#define DIR_CHUNK_KEYS 4096u     /* keys per dir.get while learning records */
#define DST_BYTES_MAX (4ull << 30) /* destination memory over all workers */
#define ITEM_HDR_BYTES 128u      /* framing bytes of one item: head + tail */
#define ITEM_TAIL_OFF 120u       /* where an item's trailing "\r\n" goes */
#define SERVE_BUF_BYTES (4u << 20)
#define SERVE_ASK_MAX (1ull << 32)

/* ------------------------------------------------------------ options ---- */

enum target_id { T_P2P, T_REDIS, T_MEMCACHED, T_TCP, T_DIR, T_KVGET };

struct opts {
	enum target_id target;
	const char *target_name;
	const char *host;
	uint16_t port;
	unsigned threads;
	unsigned batch;
	unsigned pipeline;
	uint64_t value_bytes;
	unsigned keys;
	double duration_s;
	double warmup_s;
	unsigned timeout_ms;
	bool lookup;     /* p2p: dir.get per batch (false: records cached) */
	bool setup;      /* store the values first */
	bool run;        /* then measure */
	bool json;
	bool serve_tcp;
	const char *prefix;
	uint64_t seed;
	uint16_t held_port; /* kvget: only keys this node's slots hold (0: all) */
	unsigned server_pid; /* its CPU time in the window is reported (0: none) */
};

/* --------------------------------------------------- keys and values ---- */

struct addr {
	char text[64];  /* "host:port" as the node wrote it */
	char host[INET_ADDRSTRLEN];
	uint16_t port;
};

/* Where a page lives, from dir.get. */
struct rec {
	uint64_t addr;
	uint64_t gen;
	uint32_t rkey;
	uint32_t len;
	uint8_t peer;   /* index into bench.peers */
	uint8_t owner;  /* index into bench.members: who answered */
	bool found;
};

struct bench {
	struct opts o;
	unsigned nkeys;
	char (*name)[KEY_BYTES_MAX];
	uint8_t *name_len;
	struct rec *recs;                   /* p2p, dir */
	bool *held;                         /* kvget --held-by: per key */
	struct addr members[MEMBERS_MAX];   /* RPC endpoints of the ring */
	unsigned nmembers;
	struct addr peers[MEMBERS_MAX];     /* data endpoints */
	unsigned npeers;
	/* Keys the batches draw from: dir draws each batch from one owner's
	 * keys (one call per batch); the other targets from pool 0, all keys. */
	unsigned *pool[MEMBERS_MAX];
	unsigned npool[MEMBERS_MAX];
	unsigned npools;
	uint64_t t_measure, t_end;          /* the measured window, ns */
	double setup_s;
};

/* ------------------------------------------------ setup (p2p_setup.c) ---- */

/* Names the b->nkeys keys PREFIX:value_bytes:k (b->name, b->name_len). */
void setup_keys_make(struct bench *b);
/* Does p hold key k's value (its stamp in the first and last 8 bytes)? */
bool setup_value_ok(const struct bench *b, const uint8_t *p, unsigned k);
/* Reads one dir.get record [node, data, addr, rkey, len, gen, resident];
 * a data endpoint not yet in b->peers is added when may_add, else fails. */
int setup_rec_read(struct bench *b, struct wire_rd *r, struct rec *out,
		   bool may_add);

/* Each stores every key's value on the server c is connected to:
 * setup_p2p with kv.set on the node (p2p, dir), setup_text with SET
 * (redis true) or set (memcached). */
int setup_p2p(struct bench *b, struct wire_conn *c);
int setup_text(struct bench *b, struct wire_conn *c, bool redis);
/* Learns the members from seed, then every key's record and owner (p2p, dir). */
int setup_learn_records(struct bench *b, struct wire_conn *seed);
/* kvget --held-by: which keys the node at o->held_port holds in its slots
 * (slot.probe, slotmap mode), into b->held. */
int setup_learn_held(struct bench *b);
/* Fills b->pool, the key pools batches draw from. */
int setup_pools_make(struct bench *b);

/* ------------------------------------------------------------ workers ---- */

/* One batch in flight. */
struct slot {
	unsigned *keys;      /* batch keys */
	struct rec *recs;    /* p2p: the records the reads use */
	uint8_t *hdr;        /* ITEM_HDR_BYTES of framing per item, + tail */
	uint8_t *dst;        /* batch x value_bytes: payloads land here */
	uint64_t t_issue;
	uint64_t id_base;    /* p2p: data request id of item 0 */
	uint32_t msgid;      /* dir, kvget */
};

struct worker {
	struct bench *b;
	unsigned idx;
	pthread_t th;
	struct wire_conn rpc[MEMBERS_MAX];  /* p2p, dir: one per member */
	struct wire_conn data[MEMBERS_MAX]; /* p2p: one per data endpoint */
	struct wire_conn srv;               /* redis, memcached, tcp, kvget */
	struct slot *slots;
	unsigned fifo[PIPELINE_MAX];    /* slots in flight, oldest first */
	unsigned nfifo;
	unsigned *perm[MEMBERS_MAX];    /* per pool: partial Fisher-Yates state */
	struct wire_buf req;
	struct iovec *iov;              /* 3 per item + 1 */
	char size_text[40];             /* "$N\r\n" (redis), " 0 N\r\n" (memcached),
					 * a value's bin header (kvget) */
	size_t size_text_len;
	uint64_t rng;
	uint64_t seq;                   /* next data request id */
	uint32_t msgid;
	unsigned next_pool;
	struct lg_hist hist;
	uint64_t batches, items, bytes;
	/* Its measured interval: the window, or for a target slower than the
	 * window, from the issue to the completion of its one counted batch. */
	uint64_t t_from, t_last;
	int rc;
	char err[512];
};

/* ------------------------------------------ targets (p2p_targets.c) ---- */

/*
 * Each target's two halves of a batch, put in the loop's table by
 * p2p_bench.c: issue picks the slot's keys and sends its requests; complete
 * receives a reply on the connection of the oldest batch in flight and sets
 * *done to the batch it completed. Both return 0 or -errno with wire_err set.
 */
int target_p2p_issue(struct worker *w, struct slot *s);
int target_p2p_complete(struct worker *w, struct slot *s, struct slot **done);
int target_redis_issue(struct worker *w, struct slot *s);
int target_mc_issue(struct worker *w, struct slot *s);
int target_text_complete(struct worker *w, struct slot *s, struct slot **done);
int target_tcp_issue(struct worker *w, struct slot *s);
int target_tcp_complete(struct worker *w, struct slot *s, struct slot **done);
int target_dir_issue(struct worker *w, struct slot *s);
int target_dir_complete(struct worker *w, struct slot *oldest,
			struct slot **done);
int target_kvget_issue(struct worker *w, struct slot *s);
/* A value's MessagePack bin header (into out, 5 bytes at most); its length. */
size_t target_kvget_bin_head(char *out, uint64_t value_bytes);
int target_kvget_complete(struct worker *w, struct slot *s, struct slot **done);

/* -------------------------------------------- the tcp sink (p2p_sink.c) ---- */

/* --serve-tcp: listens on o->host:o->port and serves until killed; returns
 * only on a failure, with wire_err set. */
int sink_serve_tcp(const struct opts *o);

#endif /* PC_BENCH_P2P_BENCH_H */
