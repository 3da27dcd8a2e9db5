/*
 * tests/fake/node_fake.h — one node's module stack in a test process, on
 * its own reactor group, with the fake transport (transport_fake.h) as its
 * "transport" service, and "remote" members whose pages the fake transport
 * serves.
 *
 * Owns: the node (settings, ctx, group), the module that publishes the fake
 * transport (nf_mod_transport: a fake node for this one's regions, a fake
 * client per reactor), and fake members (struct nf_member: a pool of their
 * own, registered with a fake node of their own, and the directory record
 * of each page they hold). Modules keep their state in file globals, so a
 * process holds one node; other members exist as far as the data path sees
 * them (their records and their bytes).
 *
 * Threading: nf_start / nf_stop / nf_on_reactor run on the test's thread;
 * the function nf_on_reactor posts runs on reactor 0 and must call nf_done
 * (from there or from a callback it started) once it is finished.
 */
#ifndef PC_TESTS_FAKE_NODE_FAKE_H
#define PC_TESTS_FAKE_NODE_FAKE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/settings.h"
#include "modules/module.h"
#include "modules/placement.h"
#include "reactor/reactor.h"
#include "tests/fake/transport_fake.h"

/* Publishes the fake transport as the "transport" service; put it first
 * in the module list, where the real transport module would be. */
extern const struct pc_module nf_mod_transport;

struct nf_node {
	struct pc_settings s;
	struct pc_ctx ctx;
	struct rx_group *grp;
};

extern struct nf_node nf;

/*
 * Settings with a one-reactor node on 127.0.0.1 and no listeners or
 * prefault; the test may change them between nf_settings and nf_start.
 */
void nf_settings(unsigned pool_mb);
/* Start mods (the fake transport's client options: fo, may be NULL). */
void nf_start(const struct pc_module *const *mods, unsigned n,
	      const struct tp_fake_opts *fo);
void nf_stop(void);

/* Run fn on reactor 0 and wait (at most limit_ms) for nf_done. */
void nf_on_reactor(void (*fn)(struct rx_reactor *r, void *arg), void *arg,
		   unsigned limit_ms);
void nf_done(void);
/* The same in pieces, on reactor 0 of any group: post (the wait starts
 * over), then wait for nf_done. */
struct rx_group;
void nf_post(struct rx_group *grp, void (*fn)(struct rx_reactor *r, void *arg),
	     void *arg);
void nf_wait(unsigned limit_ms);
void nf_on_group(struct rx_group *grp,
		 void (*fn)(struct rx_reactor *r, void *arg), void *arg,
		 unsigned limit_ms);

/* The fake client of reactor 0 (its faults; reactor 0's thread only). */
struct tp_client *nf_client(void);
/* The fake transport's node of this node (its regions, its local
 * registrations: tp_fake_node_locals). */
struct tp_node *nf_node(void);
/* Its faults from now on (from the test's thread). */
void nf_set_faults(const struct tp_fake_opts *fo);
/* Its operations in flight (tp_fake_client_inflight), from any thread. */
unsigned nf_inflight(void);

/* Poll cond (from the test's thread, every ms or so) until it holds or
 * limit_ms passed; returns whether it held. */
bool nf_until(bool (*cond)(void *arg), void *arg, unsigned limit_ms);

/* The seed of a test's fault dice: PC_TEST_SEED if set, else dflt; printed
 * (as "who: seed 0x..") so a failing run can be repeated. Never 0. */
uint64_t nf_seed(const char *who, uint64_t dflt);

/* Another member: its pool and its data endpoint on the fake transport. */
struct nf_member {
	char id[64];       /* ring id "127.0.0.x:p" */
	char data[64];     /* data endpoint */
	struct pool *pool;
	struct tp_node *tn;
	uint32_t rkey;
};

/* A member named id (data endpoint data) with a pool of pool_mb MiB. */
void nf_member_new(struct nf_member *m, const char *id, const char *data,
		   unsigned pool_mb);
void nf_member_free(struct nf_member *m);
/* Store a page in m's pool; *rec gets the record that names it. */
void nf_member_put(struct nf_member *m, const char *key, const void *val,
		   uint64_t len, struct dir_rec *rec);
/* Publish rec under key in this node's directory (through its placement
 * service, on reactor 0); the node must run a directory. */
void nf_publish(const char *key, const struct dir_rec *rec);
/* nf_member_put, and nf_publish of its record; rec may be NULL. */
void nf_member_publish(struct nf_member *m, const char *key, const void *val,
		       uint64_t len, struct dir_rec *rec);

#endif /* PC_TESTS_FAKE_NODE_FAKE_H */
