/*
 * modules/rdma_verbs.c — the verbs table (rdma_verbs.h) over the real
 * libibverbs and librdmacm.
 *
 * Owns: nothing; each entry forwards to the library (several verbs are
 * inline functions in verbs.h, hence the wrappers).
 */
#include "modules/rdma_verbs.h"

#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad)
{
	return ibv_post_send(qp, wr, bad);
}

static int real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, n, wc);
}

static int real_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

static int real_query_port(struct ibv_context *ctx, uint8_t port,
			   struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

static int real_query_device(struct ibv_context *ctx,
			     struct ibv_device_attr *attr)
{
	return ibv_query_device(ctx, attr);
}

static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
				  int access)
{
	return ibv_reg_mr(pd, addr, len, access);
}

static uint16_t real_get_src_port(struct rdma_cm_id *id)
{
	return rdma_get_src_port(id);
}

static void real_destroy_event_channel(struct rdma_event_channel *ch)
{
	rdma_destroy_event_channel(ch);
}

/* The first address of family on network device name (IPv6 link-local
 * ones skipped): 0, ENOENT or getifaddrs' errno. */
static int ifaddr_of(const char *name, int family,
		     struct sockaddr_storage *out)
{
	struct ifaddrs *all;
	if (getifaddrs(&all))
		return errno;
	int ret = ENOENT;
	for (struct ifaddrs *a = all; a && ret; a = a->ifa_next) {
		if (!a->ifa_addr || a->ifa_addr->sa_family != family ||
		    strcmp(a->ifa_name, name))
			continue;
		size_t len = sizeof(struct sockaddr_in);
		if (family == AF_INET6) {
			const struct sockaddr_in6 *in6 =
				(const void *)a->ifa_addr;
			if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr))
				continue;
			len = sizeof(*in6);
		}
		memset(out, 0, sizeof(*out));
		memcpy(out, a->ifa_addr, len);
		ret = 0;
	}
	freeifaddrs(all);
	return ret;
}

/* One line of file path, without its newline: true if there was one. */
static bool read_line(const char *path, char *out, size_t len)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	bool ok = fgets(out, (int)len, f) != NULL;
	fclose(f);
	if (ok)
		out[strcspn(out, "\n")] = '\0';
	return ok && *out;
}

int rv_netdev_addr(const char *sysfs, const char *dev, unsigned port,
		   int family, struct sockaddr_storage *out)
{
	char path[PATH_MAX], name[64];
	int ret = ENOENT;
	if (!dev || !*dev || strchr(dev, '/'))
		return EINVAL;
	/* RoCE: each GID's network device (unused entries cannot be
	 * read; the table ends where the files do). */
	for (unsigned i = 0; i < 256 && ret; i++) {
		snprintf(path, sizeof(path),
			 "%s/class/infiniband/%s/ports/%u/gid_attrs/ndevs/%u",
			 sysfs, dev, port, i);
		errno = 0;
		if (read_line(path, name, sizeof(name)))
			ret = ifaddr_of(name, family, out);
		else if (errno == ENOENT)
			break;
	}
	if (!ret)
		return 0;
	/* IPoIB: the device's own network interfaces. */
	snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/net",
		 sysfs, dev);
	DIR *d = opendir(path);
	for (struct dirent *e; d && ret && (e = readdir(d));)
		if (e->d_name[0] != '.')
			ret = ifaddr_of(e->d_name, family, out);
	if (d)
		closedir(d);
	return ret;
}

static int real_device_addr(struct ibv_context *ctx, uint8_t port,
			    int family, struct sockaddr_storage *out)
{
	return rv_netdev_addr("/sys", ibv_get_device_name(ctx->device), port,
			      family, out);
}

const struct rv_api rv_real = {
	.name = "verbs",
	.get_devices = rdma_get_devices,
	.free_devices = rdma_free_devices,
	.get_device_list = ibv_get_device_list,
	.free_device_list = ibv_free_device_list,
	.get_device_name = ibv_get_device_name,
	.open_device = ibv_open_device,
	.close_device = ibv_close_device,
	.query_port = real_query_port,
	.query_gid = ibv_query_gid,
	.query_device = real_query_device,
	.get_async_event = ibv_get_async_event,
	.ack_async_event = ibv_ack_async_event,
	.alloc_pd = ibv_alloc_pd,
	.dealloc_pd = ibv_dealloc_pd,
	.reg_mr = real_reg_mr,
	.dereg_mr = ibv_dereg_mr,
	.create_comp_channel = ibv_create_comp_channel,
	.destroy_comp_channel = ibv_destroy_comp_channel,
	.create_cq = ibv_create_cq,
	.destroy_cq = ibv_destroy_cq,
	.req_notify_cq = real_req_notify_cq,
	.get_cq_event = ibv_get_cq_event,
	.ack_cq_events = ibv_ack_cq_events,
	.poll_cq = real_poll_cq,
	.post_send = real_post_send,
	.modify_qp = ibv_modify_qp,
	.create_event_channel = rdma_create_event_channel,
	.destroy_event_channel = real_destroy_event_channel,
	.create_id = rdma_create_id,
	.destroy_id = rdma_destroy_id,
	.bind_addr = rdma_bind_addr,
	.listen = rdma_listen,
	.resolve_addr = rdma_resolve_addr,
	.resolve_route = rdma_resolve_route,
	.create_qp = rdma_create_qp,
	.destroy_qp = rdma_destroy_qp,
	.connect = rdma_connect,
	.accept = rdma_accept,
	.reject = rdma_reject,
	.disconnect = rdma_disconnect,
	.get_cm_event = rdma_get_cm_event,
	.ack_cm_event = rdma_ack_cm_event,
	.get_src_port = real_get_src_port,
	.device_addr = real_device_addr,
};
