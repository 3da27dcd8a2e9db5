/*
 * modules/transport_select.c — which data transport a node runs
 * (protocol = auto | tcp | rdma).
 *
 * Owns: the decision, and the RDMA settings' translation into the RDMA
 * transport's configuration. Main thread, once at start. "auto" runs RDMA
 * (with TCP beside it for peers without RDMA) when a usable device exists
 * and a cluster_secret is set, and TCP otherwise, and says which in one
 * log line; "rdma" without a usable device or without a secret is a
 * start-up error; "tcp" looks for no device.
 */
#include <errno.h>

#include "common/log.h"
#include "common/settings.h"
#include "modules/transport.h"
#include "modules/transport_rdma.h"

#define LOG_MOD "transport"

void tp_rdma_cfg_of(const struct pc_settings *s, const struct rv_api *api,
		    struct tp_rdma_cfg *cfg)
{
	*cfg = (struct tp_rdma_cfg){
		.api = api,
		.device = s->device_name,
		.devices = s->device_names,
		.ib_port = (unsigned)s->ib_port,
		.gid_index = (int)s->gid_index,
		.max_chans = (unsigned)s->max_channels_per_peer,
		.connect_timeout_ms = (unsigned)PC_MIN(s->rpc_timeout_ms, 5000),
		.max_accepted = (unsigned)s->data_max_connections,
		.secret = *s->cluster_secret ? s->cluster_secret : NULL,
		.op_timeout_ms = (unsigned)s->rdma_op_timeout_ms,
	};
}

int tp_select(const struct pc_settings *s, const struct rv_api *api)
{
	if (s->protocol == PC_PROTO_TCP)
		return PC_PROTO_TCP;
	struct tp_rdma_cfg cfg;
	tp_rdma_cfg_of(s, api, &cfg);
	char why[200];
	int n = tp_rdma_probe(&cfg, why, sizeof(why));
	if (n > 0 && !cfg.secret) {
		/* Without a secret only this user may reach the node (the TCP
		 * ports check the peer's credentials); rdma_cm tells nothing
		 * of who connects, so RDMA needs the secret's proof. */
		if (s->protocol == PC_PROTO_RDMA) {
			PC_LOGE(LOG_MOD, "protocol=rdma: %s, but RDMA needs a "
				"cluster_secret (rdma_cm cannot tell who "
				"connects); set one, or protocol = auto or tcp",
				why);
			return -EACCES;
		}
		PC_LOGI(LOG_MOD, "protocol=auto: %s, but RDMA needs a "
			"cluster_secret (rdma_cm cannot tell who connects); "
			"data moves over TCP", why);
		return PC_PROTO_TCP;
	}
	if (n > 0) {
		PC_LOGI(LOG_MOD, "protocol=%s: %s; data moves over RDMA (TCP "
			"for peers without it)",
			s->protocol == PC_PROTO_AUTO ? "auto" : "rdma", why);
		return PC_PROTO_RDMA;
	}
	if (s->protocol == PC_PROTO_RDMA) {
		PC_LOGE(LOG_MOD, "protocol=rdma: no usable RDMA device (%s); "
			"set protocol = auto or tcp to run over TCP", why);
		return -ENODEV;
	}
	PC_LOGI(LOG_MOD, "protocol=auto: no usable RDMA device (%s); data "
		"moves over TCP", why);
	return PC_PROTO_TCP;
}
