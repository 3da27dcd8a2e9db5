/*
 * modules/rdma_verbs.h — the verbs and rdma_cm calls the RDMA transport
 * makes, as one table of function pointers.
 *
 * Owns: nothing but the table's shape. rdma_verbs.c fills it with the real
 * libibverbs / librdmacm calls (rv_real); tests fill it with an in-process
 * simulation of devices, queue pairs and connection managers
 * (tests/fake/rdma_sim.h). The transport never calls libibverbs or
 * librdmacm directly, so its own logic — channel pool, batching and
 * selective signaling, CQ drain and re-arm, error and timeout paths,
 * fallback — runs in tests without hardware.
 *
 * The objects are the libraries' own structs (struct ibv_context,
 * ibv_pd, ibv_mr, ibv_cq, ibv_qp, ibv_comp_channel, rdma_event_channel,
 * rdma_cm_id, rdma_cm_event). Besides calling the table, the transport
 * reads only these fields of them: ibv_context.device (its name through
 * get_device_name), ibv_context.async_fd, ibv_mr.lkey / .rkey,
 * ibv_qp.qp_num, ibv_comp_channel.fd, rdma_event_channel.fd,
 * rdma_cm_id.verbs / .qp / .context / .route.addr.src_addr (the address a
 * connect request came to), rdma_cm_event.event / .id / .listen_id /
 * .status / .param.conn.private_data / .param.conn.private_data_len, every
 * field of struct ibv_wc, and struct ibv_async_event's event_type and
 * element (qp, port_num). An implementation must keep those true; it may leave the
 * rest zero.
 *
 * Semantics an implementation must keep (they are the hardware's, and the
 * transport depends on them):
 *  - post_send: send WRs complete in order per QP; a WR without
 *    IBV_SEND_SIGNALED makes no completion when it succeeds, but one when it
 *    fails; after a failure the QP is in the error state and every WR still
 *    queued or posted later completes with IBV_WC_WR_FLUSH_ERR (signaled or
 *    not). A READ or WRITE naming an rkey the peer does not have, or bytes
 *    outside its MR, or without the access, fails with
 *    IBV_WC_REM_ACCESS_ERR. A peer that does not answer makes
 *    IBV_WC_RETRY_EXC_ERR after the transport's retries (seconds).
 *  - completion channel: req_notify_cq arms the CQ for one event; the next
 *    completion added to an armed CQ makes the channel's fd readable and
 *    disarms it; completions added while it is not armed make no event
 *    (so: get the event, ack it, re-arm, then drain — or lose wake-ups).
 *    get_cq_event on a non-blocking channel with no event fails with
 *    errno EAGAIN. destroy_cq needs every event of the CQ acked.
 *  - rdma_cm: every call that starts a step (resolve_addr, resolve_route,
 *    connect, accept, disconnect) reports its end as an event on the id's
 *    channel; get_cm_event on a non-blocking channel with none fails with
 *    EAGAIN; each event must be acked, and ids cannot be destroyed while
 *    one of their events is unacked. A connect request arrives on the
 *    listener's channel with a new id (event->id) and listen_id set.
 *  - dereg_mr: once it returns, no remote access through the MR's rkey
 *    succeeds. destroy_qp: once it returns, the QP moves no more bytes.
 *
 * Errors follow the libraries: NULL or -1 with errno, except post_send,
 * req_notify_cq, modify_qp, query_port and query_device, which return an
 * errno value, and poll_cq, which returns the completions found or a
 * negative value.
 */
#ifndef PC_MODULES_RDMA_VERBS_H
#define PC_MODULES_RDMA_VERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct rv_api {
	const char *name; /* "verbs" (the real libraries), "sim" */

	/* devices: rdma_cm's contexts (rdma_get_devices) are the ones its ids
	 * use (id->verbs), so PDs, MRs and CQs are made on those. */
	struct ibv_context **(*get_devices)(int *num);
	void (*free_devices)(struct ibv_context **list);
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_port)(struct ibv_context *ctx, uint8_t port,
			  struct ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index,
			 union ibv_gid *gid);
	/* The device's limits (max_qp_wr, max_sge, max_sge_rd, max_cqe,
	 * max_qp_rd_atom, max_qp_init_rd_atom are the ones read); QPs, CQs
	 * and connect/accept parameters beyond them fail with EINVAL. */
	int (*query_device)(struct ibv_context *ctx,
			    struct ibv_device_attr *attr);
	/* Asynchronous events of ctx (port changes, fatal QP errors), read
	 * from ctx->async_fd: get fails with EAGAIN when the fd is
	 * non-blocking and none waits; each event got must be acked (a QP is
	 * destroyed only once its events are). */
	int (*get_async_event)(struct ibv_context *ctx,
			       struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);

	/* protection domains and memory regions */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len,
				 int access);
	int (*dereg_mr)(struct ibv_mr *mr);

	/* completion queues and their channels */
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *c);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *ch,
				    int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq,
			    void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);

	/* queue pairs */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int mask);

	/* rdma_cm */
	struct rdma_event_channel *(*create_event_channel)(void);
	void (*destroy_event_channel)(struct rdma_event_channel *ch);
	int (*create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id,
			 void *context, enum rdma_port_space ps);
	int (*destroy_id)(struct rdma_cm_id *id);
	int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
	int (*listen)(struct rdma_cm_id *id, int backlog);
	int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src,
			    struct sockaddr *dst, int timeout_ms);
	int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
	int (*create_qp)(struct rdma_cm_id *id, struct ibv_pd *pd,
			 struct ibv_qp_init_attr *attr);
	void (*destroy_qp)(struct rdma_cm_id *id);
	int (*connect)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*accept)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*reject)(struct rdma_cm_id *id, const void *private_data,
		      uint8_t private_data_len);
	int (*disconnect)(struct rdma_cm_id *id);
	int (*get_cm_event)(struct rdma_event_channel *ch,
			    struct rdma_cm_event **event);
	int (*ack_cm_event)(struct rdma_cm_event *event);
	/* The local port an id is bound to, in network byte order
	 * (rdma_get_src_port). */
	uint16_t (*get_src_port)(struct rdma_cm_id *id);

	/* An address of family (AF_INET, AF_INET6) on the network device of
	 * ctx's port (port 0 in *out): where the device's rail listens and
	 * connects from. 0 or an errno value (ENOENT: none). */
	int (*device_addr)(struct ibv_context *ctx, uint8_t port, int family,
			   struct sockaddr_storage *out);
};

/* The real libibverbs and librdmacm. */
extern const struct rv_api rv_real;

/*
 * rv_real's device_addr, with the sysfs root as a parameter (tests point it
 * at a tree of their own): the network devices of device dev's port are
 * read from <sysfs>/class/infiniband/<dev>/ports/<port>/gid_attrs/ndevs/<i>
 * (RoCE) or the entries of <sysfs>/class/infiniband/<dev>/device/net
 * (IPoIB), and the first address of family on one of them (getifaddrs; IPv6 link-local
 * ones skipped) is the answer. 0 or an errno value.
 */
int rv_netdev_addr(const char *sysfs, const char *dev, unsigned port,
		   int family, struct sockaddr_storage *out);

#endif /* PC_MODULES_RDMA_VERBS_H */
