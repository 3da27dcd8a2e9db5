/*
 * common/settings.h — every setting of peercached, in one table.
 *
 * Owns: struct pc_settings (the effective configuration) and its key table:
 * names, types, defaults, bounds and help, kept with the original PeerCache's
 * key names (DESIGN §11). Threading: loaded on the main thread before any
 * reactor starts, read-only afterwards.
 *
 * Adding a setting: add a field here and a row in settings.c; it becomes a
 * config-file key, a --flag and a PEERCACHE_* variable at once.
 */
#ifndef PC_COMMON_SETTINGS_H
#define PC_COMMON_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>

#include "compat.h"
#include "config.h"

enum pc_mode { PC_MODE_P2P = 0, PC_MODE_SLOTMAP = 1 };
enum pc_protocol { PC_PROTO_AUTO = 0, PC_PROTO_TCP = 1, PC_PROTO_RDMA = 2 };
enum pc_disc_backend { PC_DISC_EMBEDDED = 0, PC_DISC_ETCD = 1 };

/* One size class of the slotmap's slot region, as the settings give it
 * (pc_settings_validate derives them; storage/slot_region.h lays them
 * out). Exactly one of buckets and share_pm is non-zero. */
#define PC_SLOT_CLASSES_MAX 8
struct pc_slot_class {
	uint64_t max_payload; /* largest page the class holds, bytes */
	uint32_t ways;        /* slots per bucket, 1..64 */
	uint64_t buckets;     /* a bucket count, or 0: from share_pm */
	uint32_t share_pm;    /* of the region's bytes, per mille; 0 with
			       * buckets */
};

struct pc_settings {
	/* node */
	char *node_id;
	int mode;                 /* enum pc_mode */
	int64_t threads;          /* 0 = one per online CPU */
	char *bind;
	char *advertise_host;
	int64_t rpc_port;
	int64_t data_port;
	int64_t meta_port;
	char *socket;
	char *cluster_secret;
	char *cluster_secret_file;
	char *peers;
	char *discovery_addr;
	int protocol;             /* enum pc_protocol */
	char *device_name;        /* RDMA device; "": the first usable */
	char *device_names;       /* RDMA devices, one rail each (comma
				   * list; overrides device_name) */
	int64_t ib_port;
	int64_t gid_index;        /* -1: rdma_cm picks the GID */
	int64_t rdma_op_timeout_ms; /* a stuck RDMA channel; 0: off */
	/* placement */
	int64_t vnodes;
	int64_t directory_replicas;
	int64_t max_channels_per_peer;
	int64_t max_masters;
	uint64_t heartbeat_interval_ms;
	uint64_t member_ttl_ms;
	int discovery_backend;    /* enum pc_disc_backend */
	char *etcd_endpoints;
	char *etcd_prefix;
	uint64_t pool_size;
	bool pool_prefault;
	bool page_checksums;
	uint64_t slot_max_page_bytes;
	int64_t slot_ways;
	int64_t slot_num_buckets;
	char *slot_classes;       /* "auto" or SIZE:WAYS:SHARE,... */
	/* not settings: the slot region's classes, derived from the four
	 * slot_* keys by pc_settings_validate (in the order given) */
	struct pc_slot_class slot_cls[PC_SLOT_CLASSES_MAX];
	unsigned slot_ncls;
	/* metrics */
	bool metrics_enabled;
	bool metrics_dashboard;
	int64_t metrics_port;
	char *metrics_bind;
	/* disk tier */
	bool disk_enabled;
	char *disk_path;
	uint64_t disk_size;
	uint64_t disk_region_size;
	uint64_t disk_queue_max;
	/* logging */
	int log_level;            /* enum pc_log_level */
	uint64_t stats_log_interval_ms;
	/* rpc */
	uint64_t rpc_max_message_bytes;
	int64_t rpc_max_elements;
	int64_t rpc_max_depth;
	int64_t rpc_max_connections;
	int64_t rpc_max_inflight;
	uint64_t rpc_timeout_ms;
	/* rpc connection classes, deadlines, memory budget */
	int64_t rpc_max_preauth_connections;
	int64_t rpc_max_local_connections;
	int64_t rpc_max_connections_per_host;
	uint64_t rpc_preauth_max_bytes;
	uint64_t rpc_max_buffered_bytes;
	uint64_t rpc_max_reply_bytes;
	uint64_t rpc_handshake_timeout_ms;
	uint64_t rpc_message_timeout_ms;
	uint64_t rpc_idle_timeout_ms;
	uint64_t rpc_write_stall_timeout_ms;
	int64_t metrics_max_connections;
	int64_t metrics_max_connections_per_host;
	uint64_t request_deadline_ms;    /* one page call's whole budget */
	uint64_t peer_probe_interval_ms; /* probes of suspect peers */
	/* data-port connections */
	int64_t data_max_connections;
	int64_t data_max_preauth_connections;
	uint64_t data_max_buffered_bytes;
	char *socket_group;
	/* reactor */
	int64_t reactor_sq_entries;
	int64_t reactor_ops_max;
	int64_t reactor_buf_count;
	uint64_t reactor_buf_bytes;
	uint64_t conn_out_max;
	uint64_t shutdown_grace_ms;
	/* local clients on every core (issue 11) */
	int64_t reactor_stall_threshold_us;
	bool reactor_stall_cpu_clock;
	int64_t reactor_nice;
	int64_t reactor_idle_poll_us;
	uint64_t session_slice_bytes;
	uint64_t copy_slice_bytes;
	int64_t slice_pass_max_us;
	bool session_prefault;
	/* request memory (kv) */
	uint64_t kv_staging_max;
	/* directory shard */
	uint64_t directory_max_bytes;
	/* directory read cache */
	uint64_t directory_read_cache_ttl_ms;
	int64_t directory_read_cache_entries;
	/* not a setting: the original's keys staged while loading (compat.h);
	 * NULL outside pc_settings_load */
	struct pc_compat *compat;
};

extern const struct pc_cfg_table pc_settings_table;

/* Fill s with the built-in defaults (never fails for a correct table). */
int pc_settings_defaults(struct pc_settings *s, char *err, size_t errlen);

/*
 * Load settings for a program: defaults, then the file named by --config (or
 * PEERCACHE_CONFIG), then PEERCACHE_* variables, then the command line; the
 * original PeerCache's key names are accepted in all three (compat.h).
 * Returns 0, or -EINVAL with one error line in err.
 */
int pc_settings_load(struct pc_settings *s, int argc, char *const *argv,
		     char *const *envp, char *err, size_t errlen);

/* Cross-key checks and "not supported yet" refusals, after loading; fills
 * the derived fields (slot_cls, slot_ncls). */
int pc_settings_validate(struct pc_settings *s, char *err, size_t errlen);

/* Log one warning per setting that was changed from its default but has no
 * effect with the others (slot_* outside slotmap mode; slot_max_page_bytes
 * and slot_ways beside an explicit slot_classes list). */
void pc_settings_warn_inactive(const struct pc_settings *s);

/* True when host is a loopback address (127.0.0.0/8, ::1, "localhost"). */
bool pc_host_is_loopback(const char *host);
/* Membership comes from discovery (embedded or etcd), not static peers. */
bool pc_settings_discovery_on(const struct pc_settings *s);

void pc_settings_free(struct pc_settings *s);

#endif /* PC_COMMON_SETTINGS_H */
