/*
 * tests/unit/test_rdma_sim.c — the RDMA simulation's own semantics
 * (tests/fake/rdma_sim.h), so the transport's tests can trust it.
 *
 * Owns: nothing global. Each test resets the fabric at start and end and
 * drives the table (rsim_api) from its own thread only: waiting for an
 * rdma_cm event polls the channel's fd, waiting for a completion polls the
 * CQ, both with a deadline. Teardowns prove nothing leaked (live counters
 * at zero).
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/fake/rdma_sim.h"

#define WAIT_MS 5000
#define BUF 65536

static const struct rv_api *V;

static uint64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void fabric(void)
{
	V = rsim_api();
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_eq(rsim_add_device("sim0", IBV_PORT_ACTIVE), 0);
}

static bool readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1;
}

/* The next rdma_cm event of ch, which must be want (acked by the caller). */
static struct rdma_cm_event *wait_cm(struct rdma_event_channel *ch,
				     enum rdma_cm_event_type want)
{
	cr_assert(readable(ch->fd, WAIT_MS), "no rdma_cm event (wanted %s)",
		  rdma_event_str(want));
	struct rdma_cm_event *ev = NULL;
	cr_assert_eq(V->get_cm_event(ch, &ev), 0);
	cr_assert_eq(ev->event, want, "got %s, wanted %s",
		     rdma_event_str(ev->event), rdma_event_str(want));
	return ev;
}

static void wait_ack(struct rdma_event_channel *ch,
		     enum rdma_cm_event_type want)
{
	cr_assert_eq(V->ack_cm_event(wait_cm(ch, want)), 0);
}

/* The next completion of cq. */
static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	uint64_t end = ms_now() + WAIT_MS;
	int n;
	while ((n = V->poll_cq(cq, 1, &wc)) == 0 && ms_now() < end)
		usleep(50);
	cr_assert_eq(n, 1, "no completion");
	return wc;
}

static void wait_done(uint64_t wrs_done)
{
	struct rsim_stats st;
	uint64_t end = ms_now() + WAIT_MS;
	do {
		rsim_stats(&st);
		if (st.wrs_done >= wrs_done)
			return;
		usleep(100);
	} while (ms_now() < end);
	cr_assert_fail("only %llu of %llu WRs done",
		       (unsigned long long)st.wrs_done,
		       (unsigned long long)wrs_done);
}

struct side {
	struct rdma_event_channel *ech;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
};

struct pair {
	struct side c, s;      /* client, accepted server id */
	struct rdma_cm_id *lid; /* listener (on s.ech) */
	struct ibv_pd *spd;    /* the server's PD (listener's context) */
	char addr[32];
	struct sockaddr_in sin;
	int lctx;              /* the listener's context pointer target */
};

static void side_qp(struct side *sd, struct ibv_pd *pd, unsigned max_wr,
		    int cqe)
{
	sd->pd = pd;
	sd->cch = V->create_comp_channel(sd->id->verbs);
	cr_assert(sd->cch);
	sd->cq = V->create_cq(sd->id->verbs, cqe, sd, sd->cch, 0);
	cr_assert(sd->cq);
	struct ibv_qp_init_attr a = {
		.send_cq = sd->cq,
		.recv_cq = sd->cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = max_wr, .max_send_sge = 4,
			.max_recv_wr = 1, .max_recv_sge = 1},
	};
	cr_assert_eq(V->create_qp(sd->id, pd, &a), 0, "create_qp: %s",
		     strerror(errno));
	cr_assert_eq(sd->id->qp->pd, pd);
	cr_assert_eq(sd->id->qp->context, sd->id->verbs);
}

static void listen_on(struct pair *p)
{
	p->s.ech = V->create_event_channel();
	cr_assert(p->s.ech);
	cr_assert_eq(V->create_id(p->s.ech, &p->lid, &p->lctx, RDMA_PS_TCP), 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(V->bind_addr(p->lid, (struct sockaddr *)&a), 0);
	cr_assert_eq(V->listen(p->lid, 8), 0);
	uint16_t port = ntohs(V->get_src_port(p->lid));
	cr_assert_neq(port, 0);
	a.sin_port = htons(port);
	p->sin = a;
	snprintf(p->addr, sizeof(p->addr), "127.0.0.1:%u", port);
	p->spd = V->alloc_pd(p->lid->verbs);
	cr_assert(p->spd);
}

/* Client: resolve, QP, connect with pdata. */
static void client_connect(struct pair *p, unsigned max_wr, int cqe,
			   const char *pdata)
{
	p->c.ech = V->create_event_channel();
	cr_assert(p->c.ech);
	cr_assert_eq(V->create_id(p->c.ech, &p->c.id, p, RDMA_PS_TCP), 0);
	cr_assert_eq(V->resolve_addr(p->c.id, NULL, (struct sockaddr *)&p->sin,
				     1000), 0);
	wait_ack(p->c.ech, RDMA_CM_EVENT_ADDR_RESOLVED);
	cr_assert(p->c.id->verbs);
	cr_assert_eq(V->resolve_route(p->c.id, 1000), 0);
	wait_ack(p->c.ech, RDMA_CM_EVENT_ROUTE_RESOLVED);
	side_qp(&p->c, V->alloc_pd(p->c.id->verbs), max_wr, cqe);
	struct rdma_conn_param cp = {
		.private_data = pdata,
		.private_data_len = pdata ? (uint8_t)(strlen(pdata) + 1) : 0,
	};
	cr_assert_eq(V->connect(p->c.id, &cp), 0);
}

/* Server: take the request (checked), QP on it. */
static void server_request(struct pair *p, unsigned max_wr, int cqe,
			   const char *want_pdata)
{
	struct rdma_cm_event *ev = wait_cm(p->s.ech,
					   RDMA_CM_EVENT_CONNECT_REQUEST);
	cr_assert_eq(ev->listen_id, p->lid);
	cr_assert_neq(ev->id, p->lid);
	cr_assert_eq(ev->id->context, &p->lctx);
	cr_assert_eq(ev->id->verbs, p->lid->verbs);
	cr_assert_eq(ev->id->channel, p->s.ech);
	cr_assert_eq(ev->param.conn.private_data_len, strlen(want_pdata) + 1);
	cr_assert_str_eq(ev->param.conn.private_data, want_pdata);
	p->s.id = ev->id;
	/* the listener and the new id both hold the unacked event */
	cr_assert_eq(V->destroy_id(p->lid), -1);
	cr_assert_eq(errno, EBUSY);
	cr_assert_eq(V->ack_cm_event(ev), 0);
	side_qp(&p->s, p->spd, max_wr, cqe);
}

static void connect_pair(struct pair *p, unsigned max_wr, int cqe)
{
	memset(p, 0, sizeof(*p));
	listen_on(p);
	client_connect(p, max_wr, cqe, "hello from client");
	server_request(p, max_wr, cqe, "hello from client");
	const char reply[] = "welcome";
	struct rdma_conn_param cp = {.private_data = reply,
				     .private_data_len = sizeof(reply)};
	cr_assert_eq(V->accept(p->s.id, &cp), 0);
	struct rdma_cm_event *ev = wait_cm(p->c.ech,
					   RDMA_CM_EVENT_ESTABLISHED);
	cr_assert_eq(ev->id, p->c.id);
	cr_assert_eq(ev->param.conn.private_data_len, sizeof(reply));
	cr_assert_str_eq(ev->param.conn.private_data, reply);
	cr_assert_eq(V->ack_cm_event(ev), 0);
	wait_ack(p->s.ech, RDMA_CM_EVENT_ESTABLISHED);
}

static void side_free(struct side *sd, bool pd)
{
	if (sd->id) {
		V->destroy_qp(sd->id);
		cr_assert_eq(V->destroy_id(sd->id), 0, "destroy_id: %s",
			     strerror(errno));
	}
	if (sd->cq) {
		struct ibv_wc wc[16];
		while (V->poll_cq(sd->cq, 16, wc) > 0)
			;
		cr_assert_eq(V->destroy_cq(sd->cq), 0);
	}
	if (sd->cch)
		cr_assert_eq(V->destroy_comp_channel(sd->cch), 0);
	if (pd && sd->pd)
		cr_assert_eq(V->dealloc_pd(sd->pd), 0);
}

/* Orderly teardown (the events still queued are dropped with their ids);
 * afterwards nothing is live. */
static void pair_free(struct pair *p)
{
	side_free(&p->c, true);
	side_free(&p->s, false);
	cr_assert_eq(V->destroy_id(p->lid), 0);
	cr_assert_eq(V->dealloc_pd(p->spd), 0);
	V->destroy_event_channel(p->c.ech);
	V->destroy_event_channel(p->s.ech);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_eq(st.qps_live + st.mrs_live + st.ids_live + st.pds_live +
			     st.cqs_live + st.comp_channels_live +
			     st.event_channels_live + st.events_unacked +
			     st.cq_events_unacked, 0,
		     "leak: qps %llu mrs %llu ids %llu",
		     (unsigned long long)st.qps_live,
		     (unsigned long long)st.mrs_live,
		     (unsigned long long)st.ids_live);
}

static void fill(uint8_t *b, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id,
		bool signaled, struct ibv_sge *sge, int nsge, void *raddr,
		uint32_t rkey)
{
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = sge,
		.num_sge = nsge,
		.opcode = op,
		.send_flags = signaled ? IBV_SEND_SIGNALED : 0,
		.wr.rdma = {.remote_addr = (uint64_t)(uintptr_t)raddr,
			    .rkey = rkey},
	}, *bad = NULL;
	return V->post_send(qp, &wr, &bad);
}

#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
	    IBV_ACCESS_REMOTE_WRITE)

Test(rdma_sim, read_and_write_land_the_bytes)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	fill(rem, BUF, 3);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	cr_assert(rmr && lmr);
	cr_assert_neq(rmr->rkey, 0);
	cr_assert_neq(rmr->rkey, lmr->rkey);
	cr_assert_eq(rmr->addr, rem);
	cr_assert_eq(rmr->length, BUF);
	cr_assert_eq(rmr->pd, p.spd);
	/* READ rem[100, 100+3000) into two pieces of loc */
	struct ibv_sge sg[2] = {
		{.addr = (uintptr_t)loc + 8000, .length = 1000, .lkey = lmr->lkey},
		{.addr = (uintptr_t)loc, .length = 2000, .lkey = lmr->lkey},
	};
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 7, true, sg, 2,
			  rem + 100, rmr->rkey), 0);
	struct ibv_wc wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.status, IBV_WC_SUCCESS);
	cr_assert_eq(wc.wr_id, 7);
	cr_assert_eq(wc.opcode, IBV_WC_RDMA_READ);
	cr_assert_eq(wc.byte_len, 3000);
	cr_assert_eq(wc.qp_num, p.c.id->qp->qp_num);
	cr_assert_eq(memcmp(loc + 8000, rem + 100, 1000), 0);
	cr_assert_eq(memcmp(loc, rem + 1100, 2000), 0);
	/* WRITE loc[0, 4096) to rem + 30000 */
	fill(loc, 4096, 99);
	struct ibv_sge w = {.addr = (uintptr_t)loc, .length = 4096,
			    .lkey = lmr->lkey};
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_WRITE, 8, true, &w, 1,
			  rem + 30000, rmr->rkey), 0);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.status, IBV_WC_SUCCESS);
	cr_assert_eq(wc.opcode, IBV_WC_RDMA_WRITE);
	cr_assert_eq(memcmp(rem + 30000, loc, 4096), 0);
	/* the server reads from the client too (both directions work) */
	struct ibv_mr *cmr = V->reg_mr(p.c.pd, loc + 32768, 4096, RW);
	struct ibv_mr *smr = V->reg_mr(p.spd, rem, 4096, IBV_ACCESS_LOCAL_WRITE);
	fill(loc + 32768, 4096, 42);
	struct ibv_sge s = {.addr = (uintptr_t)rem, .length = 4096,
			    .lkey = smr->lkey};
	cr_assert_eq(post(p.s.id->qp, IBV_WR_RDMA_READ, 9, true, &s, 1,
			  loc + 32768, cmr->rkey), 0);
	cr_assert_eq(wait_wc(p.s.cq).status, IBV_WC_SUCCESS);
	cr_assert_eq(memcmp(rem, loc + 32768, 4096), 0);
	cr_assert_eq(V->dereg_mr(rmr), 0);
	cr_assert_eq(V->dereg_mr(lmr), 0);
	cr_assert_eq(V->dereg_mr(cmr), 0);
	cr_assert_eq(V->dereg_mr(smr), 0);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, unsignaled_success_is_silent_failure_is_not_then_flush)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 512,
			     .lkey = lmr->lkey};
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 1, false, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 2, true, &sg, 1, rem,
			  rmr->rkey), 0);
	struct ibv_wc wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 2, "the unsignaled success made a completion");
	cr_assert_eq(V->poll_cq(p.c.cq, 1, &wc), 0);
	/* an unsignaled failure completes, and what follows flushes */
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 3, false, &sg, 1, rem,
			  rmr->rkey + 1), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 4, false, &sg, 1, rem,
			  rmr->rkey), 0);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 3);
	cr_assert_eq(wc.status, IBV_WC_REM_ACCESS_ERR);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 4);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	/* posted after the error: accepted, flushed */
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 5, false, &sg, 1, rem,
			  rmr->rkey), 0);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 5);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_eq(st.flushes, 2);
	cr_assert_eq(st.wrs_posted, 5);
	cr_assert_eq(st.wrs_done, 5);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

enum bad_kind { BAD_RKEY, BAD_BOUNDS, BAD_ACCESS, BAD_DEREG, BAD_LKEY };

static enum ibv_wc_status one_bad(enum bad_kind k)
{
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF,
				       k == BAD_ACCESS ? IBV_ACCESS_REMOTE_READ
						       : RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	uint32_t rkey = rmr->rkey;
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 4096,
			     .lkey = k == BAD_LKEY ? lmr->lkey + 1 : lmr->lkey};
	uint8_t *raddr = k == BAD_BOUNDS ? rem + BUF - 4095 : rem;
	if (k == BAD_RKEY)
		rkey ^= 0x5a5a;
	if (k == BAD_DEREG) {
		cr_assert_eq(V->dereg_mr(rmr), 0);
		rmr = NULL;
	}
	fill(rem, BUF, 1);
	cr_assert_eq(post(p.c.id->qp,
			  k == BAD_ACCESS ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
			  1, true, &sg, 1, raddr, rkey), 0);
	struct ibv_wc wc = wait_wc(p.c.cq);
	/* nothing moved */
	uint8_t zero[4096] = {0}, pat[BUF];
	fill(pat, BUF, 1);
	cr_assert_eq(memcmp(loc, zero, sizeof(zero)), 0);
	cr_assert_eq(memcmp(rem, pat, BUF), 0);
	if (rmr)
		V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	return wc.status;
}

Test(rdma_sim, remote_access_errors)
{
	fabric();
	cr_assert_eq(one_bad(BAD_RKEY), IBV_WC_REM_ACCESS_ERR);
	cr_assert_eq(one_bad(BAD_BOUNDS), IBV_WC_REM_ACCESS_ERR);
	cr_assert_eq(one_bad(BAD_ACCESS), IBV_WC_REM_ACCESS_ERR);
	cr_assert_eq(one_bad(BAD_DEREG), IBV_WC_REM_ACCESS_ERR);
	cr_assert_eq(one_bad(BAD_LKEY), IBV_WC_LOC_PROT_ERR);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, completion_channel_arm_event_disarm)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 64,
			     .lkey = lmr->lkey};
	struct ibv_cq *cq;
	void *cctx;
	/* not armed: the completion makes no event */
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 1, true, &sg, 1, rem,
			  rmr->rkey), 0);
	wait_wc(p.c.cq);
	cr_assert_not(readable(p.c.cch->fd, 0));
	cr_assert_eq(V->get_cq_event(p.c.cch, &cq, &cctx), -1);
	cr_assert_eq(errno, EAGAIN);
	/* armed: exactly one event for two completions */
	cr_assert_eq(V->req_notify_cq(p.c.cq, 0), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 2, true, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 3, true, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert(readable(p.c.cch->fd, WAIT_MS));
	cr_assert_eq(V->get_cq_event(p.c.cch, &cq, &cctx), 0);
	cr_assert_eq(cq, p.c.cq);
	cr_assert_eq(cctx, &p.c);
	cr_assert_eq(wait_wc(p.c.cq).wr_id, 2);
	cr_assert_eq(wait_wc(p.c.cq).wr_id, 3);
	cr_assert_not(readable(p.c.cch->fd, 0));
	cr_assert_eq(V->get_cq_event(p.c.cch, &cq, &cctx), -1);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_eq(st.cq_events, 1);
	cr_assert_eq(st.cq_events_unacked, 1);
	/* an unacked event holds the CQ */
	V->destroy_qp(p.c.id);
	cr_assert_eq(V->destroy_cq(p.c.cq), -1);
	cr_assert_eq(errno, EBUSY);
	V->ack_cq_events(p.c.cq, 1);
	/* re-armed: the next completion makes the next event */
	cr_assert_eq(V->req_notify_cq(p.s.cq, 0), 0);
	struct ibv_mr *cmr = V->reg_mr(p.c.pd, loc, 64, RW);
	struct ibv_mr *smr = V->reg_mr(p.spd, rem, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge ss = {.addr = (uintptr_t)rem, .length = 64,
			     .lkey = smr->lkey};
	/* the client QP is gone: the server's WR retries out */
	cr_assert_eq(post(p.s.id->qp, IBV_WR_RDMA_READ, 4, true, &ss, 1, loc,
			  cmr->rkey), 0);
	cr_assert(readable(p.s.cch->fd, WAIT_MS));
	cr_assert_eq(V->get_cq_event(p.s.cch, &cq, &cctx), 0);
	V->ack_cq_events(cq, 1);
	struct ibv_wc wc = wait_wc(p.s.cq);
	cr_assert_eq(wc.status, IBV_WC_RETRY_EXC_ERR);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	V->dereg_mr(cmr);
	V->dereg_mr(smr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, cm_reject_unreachable_disconnect)
{
	fabric();
	/* reject with private data */
	struct pair p;
	memset(&p, 0, sizeof(p));
	listen_on(&p);
	client_connect(&p, 4, 16, "let me in");
	server_request(&p, 4, 16, "let me in");
	const char no[] = "go away";
	cr_assert_eq(V->reject(p.s.id, no, sizeof(no)), 0);
	struct rdma_cm_event *ev = wait_cm(p.c.ech, RDMA_CM_EVENT_REJECTED);
	cr_assert_eq(ev->status, RSIM_REJ_CONSUMER);
	cr_assert_eq(ev->param.conn.private_data_len, sizeof(no));
	cr_assert_str_eq(ev->param.conn.private_data, no);
	/* an unacked event holds its id */
	V->destroy_qp(p.c.id);
	cr_assert_eq(V->destroy_id(p.c.id), -1);
	cr_assert_eq(errno, EBUSY);
	cr_assert_eq(V->ack_cm_event(ev), 0);
	pair_free(&p);

	/* nobody listening */
	memset(&p, 0, sizeof(p));
	listen_on(&p);
	cr_assert_eq(V->destroy_id(p.lid), 0);
	p.lid = NULL;
	client_connect(&p, 4, 16, "anyone?");
	ev = wait_cm(p.c.ech, RDMA_CM_EVENT_REJECTED);
	cr_assert_eq(ev->status, RSIM_REJ_NO_LISTENER);
	cr_assert_eq(V->ack_cm_event(ev), 0);
	side_free(&p.c, true);
	cr_assert_eq(V->dealloc_pd(p.spd), 0);
	V->destroy_event_channel(p.c.ech);
	V->destroy_event_channel(p.s.ech);

	/* too much private data */
	memset(&p, 0, sizeof(p));
	listen_on(&p);
	char big[58];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	p.c.ech = V->create_event_channel();
	cr_assert_eq(V->create_id(p.c.ech, &p.c.id, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(V->resolve_addr(p.c.id, NULL, (struct sockaddr *)&p.sin,
				     1000), 0);
	wait_ack(p.c.ech, RDMA_CM_EVENT_ADDR_RESOLVED);
	cr_assert_eq(V->resolve_route(p.c.id, 1000), 0);
	wait_ack(p.c.ech, RDMA_CM_EVENT_ROUTE_RESOLVED);
	side_qp(&p.c, V->alloc_pd(p.c.id->verbs), 4, 16);
	struct rdma_conn_param cp = {.private_data = big,
				     .private_data_len = sizeof(big)};
	cr_assert_eq(V->connect(p.c.id, &cp), -1);
	cr_assert_eq(errno, EINVAL);
	pair_free(&p);

	/* disconnect: both sides, once, and the QPs flush */
	connect_pair(&p, 4, 16);
	cr_assert_eq(V->disconnect(p.c.id), 0);
	wait_ack(p.c.ech, RDMA_CM_EVENT_DISCONNECTED);
	wait_ack(p.s.ech, RDMA_CM_EVENT_DISCONNECTED);
	cr_assert_eq(V->disconnect(p.s.id), 0);
	uint8_t buf[64];
	struct ibv_mr *m = V->reg_mr(p.c.pd, buf, sizeof(buf), RW);
	struct ibv_sge sg = {.addr = (uintptr_t)buf, .length = 64,
			     .lkey = m->lkey};
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_WRITE, 1, false, &sg, 1, buf,
			  m->rkey), 0);
	cr_assert_eq(wait_wc(p.c.cq).status, IBV_WC_WR_FLUSH_ERR);
	cr_assert_not(readable(p.c.ech->fd, 0));
	cr_assert_not(readable(p.s.ech->fd, 0));
	V->dereg_mr(m);
	pair_free(&p);

	/* destroying a connected id disconnects its peer */
	connect_pair(&p, 4, 16);
	V->destroy_qp(p.s.id);
	cr_assert_eq(V->destroy_id(p.s.id), 0);
	p.s.id = NULL;
	wait_ack(p.c.ech, RDMA_CM_EVENT_DISCONNECTED);
	pair_free(&p);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, kill_retries_out_and_disconnects)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 64,
			     .lkey = lmr->lkey};
	cr_assert_eq(rsim_silence(p.addr, true), 0);
	for (uint64_t i = 1; i <= 3; i++)
		cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, i, i == 3, &sg,
				  1, rem, rmr->rkey), 0);
	cr_assert_eq(rsim_kill(p.addr), 0);
	struct ibv_wc wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 1);
	cr_assert_eq(wc.status, IBV_WC_RETRY_EXC_ERR);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.wr_id, 3);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	wait_ack(p.c.ech, RDMA_CM_EVENT_DISCONNECTED);
	wait_ack(p.s.ech, RDMA_CM_EVENT_DISCONNECTED);
	/* the listener is gone */
	struct pair q = {0};
	q.sin = p.sin;
	q.spd = NULL;
	client_connect(&q, 4, 16, "still there?");
	struct rdma_cm_event *ev = wait_cm(q.c.ech, RDMA_CM_EVENT_REJECTED);
	cr_assert_eq(ev->status, RSIM_REJ_NO_LISTENER);
	V->ack_cm_event(ev);
	side_free(&q.c, true);
	V->destroy_event_channel(q.c.ech);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, silence_holds_fail_next_fails)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	fill(rem, BUF, 5);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 64,
			     .lkey = lmr->lkey};
	cr_assert_eq(rsim_silence(p.addr, true), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 1, true, &sg, 1, rem,
			  rmr->rkey), 0);
	usleep(30000); /* a held WR must stay held: nothing to wait for */
	struct ibv_wc wc;
	cr_assert_eq(V->poll_cq(p.c.cq, 1, &wc), 0);
	cr_assert_eq(loc[0], 0);
	cr_assert_eq(rsim_silence(p.addr, false), 0);
	wc = wait_wc(p.c.cq);
	cr_assert_eq(wc.status, IBV_WC_SUCCESS);
	cr_assert_eq(memcmp(loc, rem, 64), 0);
	cr_assert_eq(rsim_fail_next(p.addr, 1, IBV_WC_REM_OP_ERR), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 2, false, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 3, true, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert_eq(wait_wc(p.c.cq).status, IBV_WC_REM_OP_ERR);
	cr_assert_eq(wait_wc(p.c.cq).status, IBV_WC_WR_FLUSH_ERR);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, silence_cm_answers_nothing)
{
	fabric();
	struct pair p;
	memset(&p, 0, sizeof(p));
	listen_on(&p);
	cr_assert_eq(rsim_silence_cm(p.addr, true), 0);
	client_connect(&p, 4, 16, "hello?");
	usleep(20000); /* nothing may arrive: nothing to wait for */
	cr_assert_not(readable(p.c.ech->fd, 0));
	cr_assert_not(readable(p.s.ech->fd, 0));
	pair_free(&p);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, destroy_qp_stops_the_worker)
{
	fabric();
	struct pair p;
	connect_pair(&p, 512, 1024);
	uint8_t *rem = calloc(1, BUF), *loc = malloc(BUF);
	fill(loc, BUF, 9);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	cr_assert_eq(rsim_set_delay(p.addr, 0, 0), 0);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = BUF,
			     .lkey = lmr->lkey};
	for (uint64_t i = 0; i < 256; i++)
		cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_WRITE, i, true, &sg,
				  1, rem, rmr->rkey), 0);
	V->destroy_qp(p.c.id);
	struct rsim_stats a, b;
	rsim_stats(&a);
	cr_assert_eq(a.wrs_done + a.wrs_dropped, a.wrs_posted);
	/* its memory may go now: ASan sees any later touch */
	cr_assert_eq(V->dereg_mr(lmr), 0);
	free(loc);
	memset(rem, 0, BUF);
	usleep(20000);
	rsim_stats(&b);
	cr_assert_eq(b.wrs_done, a.wrs_done);
	for (size_t i = 0; i < BUF; i++)
		cr_assert_eq(rem[i], 0, "written after destroy_qp");
	/* no completions after it: all are already in the CQ */
	struct ibv_wc wc[256];
	cr_assert_eq(V->poll_cq(p.c.cq, 256, wc), (int)a.wrs_done);
	V->dereg_mr(rmr);
	pair_free(&p);
	free(rem);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, send_queue_slots)
{
	fabric();
	struct pair p;
	connect_pair(&p, 4, 64);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 64,
			     .lkey = lmr->lkey};
	struct ibv_send_wr wr[6], *bad = NULL;
	for (int i = 0; i < 6; i++)
		wr[i] = (struct ibv_send_wr){
			.wr_id = (uint64_t)i, .sg_list = &sg, .num_sge = 1,
			.opcode = IBV_WR_RDMA_READ,
			.send_flags = i == 3 ? IBV_SEND_SIGNALED : 0,
			.wr.rdma = {.remote_addr = (uintptr_t)rem,
				    .rkey = rmr->rkey},
			.next = i < 5 ? &wr[i + 1] : NULL,
		};
	cr_assert_eq(V->post_send(p.c.id->qp, wr, &bad), ENOMEM);
	cr_assert_eq(bad, &wr[4]);
	/* done but not polled: the slots stay taken */
	wait_done(4);
	cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, 9, true, &sg, 1, rem,
			  rmr->rkey), ENOMEM);
	/* polling the signaled one frees its slot and the older ones */
	cr_assert_eq(wait_wc(p.c.cq).wr_id, 3);
	bad = NULL;
	wr[3].next = NULL;
	cr_assert_eq(V->post_send(p.c.id->qp, wr, &bad), 0);
	/* a QP never connected refuses */
	struct ibv_send_wr one = wr[0];
	one.next = NULL;
	struct rdma_cm_id *id;
	cr_assert_eq(V->create_id(p.c.ech, &id, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(V->resolve_addr(id, NULL, (struct sockaddr *)&p.sin, 100),
		     0);
	wait_ack(p.c.ech, RDMA_CM_EVENT_ADDR_RESOLVED);
	struct ibv_qp_init_attr a = {.send_cq = p.c.cq, .recv_cq = p.c.cq,
				     .qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 4, .max_send_sge = 1}};
	cr_assert_eq(V->create_qp(id, p.c.pd, &a), 0);
	cr_assert_eq(V->post_send(id->qp, &one, &bad), EINVAL);
	cr_assert_eq(bad, &one);
	/* a PD of another context cannot make a QP for this id */
	struct ibv_device **l = V->get_device_list(NULL);
	struct ibv_context *ctx = V->open_device(l[0]);
	V->free_device_list(l);
	struct ibv_pd *pd2 = V->alloc_pd(ctx);
	struct rdma_cm_id *id2;
	cr_assert_eq(V->create_id(p.c.ech, &id2, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(V->resolve_addr(id2, NULL, (struct sockaddr *)&p.sin, 100),
		     0);
	wait_ack(p.c.ech, RDMA_CM_EVENT_ADDR_RESOLVED);
	cr_assert_eq(V->create_qp(id2, pd2, &a), -1);
	cr_assert_eq(V->destroy_id(id2), 0);
	cr_assert_eq(V->dealloc_pd(pd2), 0);
	cr_assert_eq(V->close_device(ctx), 0);
	V->destroy_qp(id);
	cr_assert_eq(V->destroy_id(id), 0);
	wait_done(8);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, cq_overflow_counts)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 2);
	uint8_t *rem = malloc(BUF), *loc = calloc(1, BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_mr *lmr = V->reg_mr(p.c.pd, loc, BUF, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sg = {.addr = (uintptr_t)loc, .length = 64,
			     .lkey = lmr->lkey};
	for (uint64_t i = 0; i < 4; i++)
		cr_assert_eq(post(p.c.id->qp, IBV_WR_RDMA_READ, i, true, &sg, 1,
				  rem, rmr->rkey), 0);
	wait_done(4);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_geq(st.cq_overflows, 1);
	V->dereg_mr(rmr);
	V->dereg_mr(lmr);
	pair_free(&p);
	free(rem);
	free(loc);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, devices_ports_and_addresses)
{
	V = rsim_api();
	cr_assert_eq(rsim_reset(), 0);
	cr_assert_str_eq(V->name, "sim");
	int n = -1;
	struct ibv_device **l = V->get_device_list(&n);
	cr_assert(l);
	cr_assert_eq(n, 0);
	cr_assert_null(l[0]);
	V->free_device_list(l);
	/* no device: resolve_addr reports ADDR_ERROR, bind fails */
	struct rdma_event_channel *ech = V->create_event_channel();
	struct rdma_cm_id *id;
	cr_assert_eq(V->create_id(ech, &id, NULL, RDMA_PS_TCP), 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(4791)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(V->bind_addr(id, (struct sockaddr *)&a), -1);
	cr_assert_eq(errno, ENODEV);
	cr_assert_eq(V->resolve_addr(id, NULL, (struct sockaddr *)&a, 100), 0);
	cr_assert(readable(ech->fd, WAIT_MS));
	struct rdma_cm_event *ev;
	cr_assert_eq(V->get_cm_event(ech, &ev), 0);
	cr_assert_eq(ev->event, RDMA_CM_EVENT_ADDR_ERROR);
	V->ack_cm_event(ev);
	cr_assert_eq(V->get_cm_event(ech, &ev), -1);
	cr_assert_eq(errno, EAGAIN);
	cr_assert_eq(V->destroy_id(id), 0);

	cr_assert_eq(rsim_add_device("down0", IBV_PORT_DOWN), 0);
	cr_assert_eq(rsim_add_device("up1", IBV_PORT_ACTIVE), 0);
	cr_assert_eq(rsim_add_device("up1", IBV_PORT_ACTIVE), -EEXIST);
	l = V->get_device_list(&n);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(V->get_device_name(l[1]), "up1");
	struct ibv_context *c0 = V->open_device(l[0]);
	struct ibv_context *c1 = V->open_device(l[1]);
	V->free_device_list(l);
	struct ibv_port_attr pa;
	cr_assert_eq(V->query_port(c0, 1, &pa), 0);
	cr_assert_eq(pa.state, IBV_PORT_DOWN);
	cr_assert_eq(V->query_port(c1, 1, &pa), 0);
	cr_assert_eq(pa.state, IBV_PORT_ACTIVE);
	cr_assert_eq(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
	cr_assert_eq(pa.active_mtu, IBV_MTU_4096);
	union ibv_gid g0, g1, z = {0};
	cr_assert_eq(V->query_gid(c1, 1, 0, &g0), 0);
	cr_assert_eq(V->query_gid(c1, 1, 15, &g1), 0);
	cr_assert_neq(memcmp(&g0, &z, sizeof(z)), 0);
	cr_assert_neq(memcmp(&g0, &g1, sizeof(z)), 0);
	cr_assert_eq(V->query_gid(c1, 1, 16, &g1), -1);
	cr_assert_eq(errno, EINVAL);
	cr_assert_eq(V->close_device(c0), 0);
	cr_assert_eq(V->close_device(c1), 0);

	/* the first active device; a bound address is taken */
	struct rdma_cm_id *b1, *b2;
	cr_assert_eq(V->create_id(ech, &b1, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(V->create_id(ech, &b2, NULL, RDMA_PS_TCP), 0);
	a.sin_port = 0;
	cr_assert_eq(V->bind_addr(b1, (struct sockaddr *)&a), 0);
	cr_assert_str_eq(b1->verbs->device->name, "up1");
	a.sin_port = V->get_src_port(b1);
	cr_assert_neq(a.sin_port, 0);
	cr_assert_eq(V->bind_addr(b2, (struct sockaddr *)&a), -1);
	cr_assert_eq(errno, EADDRINUSE);
	cr_assert_eq(V->destroy_id(b1), 0);
	cr_assert_eq(V->destroy_id(b2), 0);
	V->destroy_event_channel(ech);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_eq(st.ids_live + st.event_channels_live + st.contexts_open, 0);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, device_limits_and_async_events)
{
	fabric();
	int n = 0;
	struct ibv_context **l = V->get_devices(&n);
	cr_assert_eq(n, 1);
	struct ibv_context *ctx = l[0];
	struct ibv_device_attr da;
	cr_assert_eq(V->query_device(ctx, &da), 0);
	cr_assert_eq(da.max_qp_wr, 16384);
	cr_assert_eq(da.max_sge, 16);
	cr_assert_eq(da.max_qp_init_rd_atom, 16);
	struct rsim_limits lim = {.max_qp_wr = 8, .max_qp_init_rd_atom = 2};
	cr_assert_eq(rsim_set_limits("sim0", &lim), 0);
	cr_assert_eq(rsim_set_limits("sim9", &lim), -ENODEV);
	cr_assert_eq(V->query_device(ctx, &da), 0);
	cr_assert_eq(da.max_qp_wr, 8);
	cr_assert_eq(da.max_sge, 16, "a 0 field keeps its value");
	cr_assert_eq(da.max_qp_init_rd_atom, 2);
	struct pair p;
	connect_pair(&p, 8, 64);

	/* Nothing yet: EAGAIN, the fd is not readable. */
	struct ibv_async_event ev;
	cr_assert_eq(V->get_async_event(ctx, &ev), -1);
	cr_assert_eq(errno, EAGAIN);
	cr_assert_not(readable(ctx->async_fd, 0));
	/* A port event; PORT_ERR takes the port down. */
	cr_assert_eq(rsim_async_port("sim0", IBV_EVENT_PORT_ERR), 0);
	cr_assert(readable(ctx->async_fd, 0));
	cr_assert_eq(V->get_async_event(ctx, &ev), 0);
	cr_assert_eq(ev.event_type, IBV_EVENT_PORT_ERR);
	cr_assert_eq(ev.element.port_num, 1);
	V->ack_async_event(&ev);
	struct ibv_port_attr pa;
	cr_assert_eq(V->query_port(ctx, 1, &pa), 0);
	cr_assert_eq(pa.state, IBV_PORT_DOWN);
	/* A QP event hits the accepted side only. */
	cr_assert_eq(rsim_async_qp(p.addr, IBV_EVENT_QP_FATAL), 1);
	cr_assert_eq(V->get_async_event(ctx, &ev), 0);
	cr_assert_eq(ev.event_type, IBV_EVENT_QP_FATAL);
	cr_assert_eq(ev.element.qp, p.s.id->qp);
	struct rsim_stats st;
	rsim_stats(&st);
	cr_assert_eq(st.async_events_unacked, 1);
	V->ack_async_event(&ev);
	cr_assert_not(readable(ctx->async_fd, 0));
	/* One not got yet goes with its QP. */
	cr_assert_eq(rsim_async_qp(p.addr, IBV_EVENT_QP_REQ_ERR), 1);
	cr_assert(readable(ctx->async_fd, 0));
	pair_free(&p);
	cr_assert_not(readable(ctx->async_fd, 0));
	cr_assert_eq(V->get_async_event(ctx, &ev), -1);
	rsim_stats(&st);
	cr_assert_eq(st.async_events_unacked, 0);
	V->free_devices(l);
	cr_assert_eq(rsim_reset(), 0);
}

Test(rdma_sim, reset_leaves_nothing)
{
	fabric();
	struct pair p;
	connect_pair(&p, 16, 64);
	uint8_t *rem = malloc(BUF);
	struct ibv_mr *rmr = V->reg_mr(p.spd, rem, BUF, RW);
	struct ibv_sge sg = {.addr = (uintptr_t)rem, .length = 64,
			     .lkey = rmr->lkey};
	cr_assert_eq(rsim_silence(p.addr, true), 0);
	cr_assert_eq(post(p.s.id->qp, IBV_WR_RDMA_READ, 1, true, &sg, 1, rem,
			  rmr->rkey), 0);
	cr_assert_eq(V->disconnect(p.c.id), 0);
	struct rdma_cm_event *ev = wait_cm(p.c.ech,
					   RDMA_CM_EVENT_DISCONNECTED);
	(void)ev; /* left unacked on purpose */
	cr_assert_eq(rsim_reset(), 0);
	struct rsim_stats st, zero;
	memset(&zero, 0, sizeof(zero));
	rsim_stats(&st);
	cr_assert_eq(memcmp(&st, &zero, sizeof(st)), 0);
	free(rem);
	/* and reset on an empty fabric is fine */
	cr_assert_eq(rsim_reset(), 0);
}
